//! Keel's crash-replay test kit: prove Keel's promises for *your* workflow.
//!
//! Owns [`Kit`], a harness that runs your [`Workflow`]s against the provider simulator
//! (`provider_sim`, in process, over real HTTP) and a real SQLite event log, under a
//! **seeded schedule** of crashes at every event boundary ([`engine::failpoints::Point`]) and
//! provider faults — every fault kind the simulator knows (`provider_sim::faults::Fault::ALL`:
//! failures before the effect, 5xx, timeouts after it, slow answers on both sides of the
//! request timeout, declines, lagging, lying or unavailable lookups) at a provider of a drawn
//! capability tier ([`Tier`]: with or without idempotency, with or without lookup); restarts
//! after every crash (a second crash may hit the recovery itself); heals
//! the provider; runs reconciliation passes; and then checks Keel's invariants over the log
//! and the simulator's own count of effects ([`invariants`]). A failing seed is printed and
//! replayed with `KEEL_SEED=<seed>`. Your agents run in the same schedule ([`agents`],
//! [`Kit::agent`]; see "Your agent" below). [`sample`] holds the tenant and card token that
//! Keel's own suites, the README and `keel demo` share.
//!
//! By default a crash is a panic raised by the armed failpoint — in the executor's task or in
//! the store's writer thread — after which the kit drops every handle and reopens the log from
//! the file, so the next process sees exactly the committed prefix. With
//! [`Kit::killing`] it is a real SIGKILL: every submission and every recovery runs in a child
//! process (your test binary re-executed on the one test you name, whose `kit.run()` plays the
//! child's part and exits), killed after a seeded delay or the moment it reports reaching a
//! seeded failpoint. Give it the test's path as `cargo test` prints it:
//!
//! ```text
//! #[test]
//! fn invoices_under_real_kills() {
//!     let kit = testkit::Kit::new(vec![Registered::new(PayInvoice)])
//!         .submit("pay_invoice", json!({"invoice": "inv_2041", "cents": 12_000, "card": "pm_card_visa_4242"}))
//!         .killing("billing::invoices_under_real_kills");
//!     kit.run().unwrap_or_else(|failure| panic!("{failure}"));
//! }
//! ```
//!
//! A failing seed prints itself, its report and how to replay it:
//!
//! ```text
//! testkit: seed 5 failed: 1 invariant violation(s) — replay with KEEL_SEED=5
//! $ KEEL_SEED=5 cargo test --test it -- billing::invoices_under_real_kills
//! ```
//!
//! # Example
//!
//! A workflow of your own — here, paying a supplier invoice — checked under 2 seeds:
//!
//! ```
//! use engine::executor::{Context, IntentRequest, Prepared, Registered, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with};
//! use engine::ledger::RejectCode;
//! use engine::provider::{BoxFuture, EffectKind, Secret};
//! use serde::{Deserialize, Serialize};
//! use serde_json::{Value, json};
//!
//! struct PayInvoice;
//!
//! /// What a caller submits: the invoice, and the card to pay it with.
//! #[derive(Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Submitted { invoice: String, cents: i64, card: String }
//!
//! /// What is stored (the card is a secret of the invocation, never stored).
//! #[derive(Serialize, Deserialize)]
//! struct Invoice { invoice: String, cents: i64 }
//!
//! impl Workflow for PayInvoice {
//!     type Input = Invoice;
//!     fn name(&self) -> &'static str { "pay_invoice" }
//!     fn prepare(&self, raw: &Value) -> Result<Prepared<Invoice>, Rejection> {
//!         let Submitted { invoice, cents, card } = Submitted::deserialize(raw)
//!             .map_err(|e| Rejection { code: RejectCode::InvalidArguments, details: vec![e.to_string()] })?;
//!         Ok(Prepared { input: Invoice { invoice, cents }, secrets: [("card".to_owned(), Secret::new(card))].into() })
//!     }
//!     fn run<'a>(&'a self, ctx: &'a mut Context, input: Invoice) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
//!         Box::pin(async move {
//!             let outcome = ctx.intent(IntentRequest {
//!                 kind: EffectKind::Charge,
//!                 tenant: "acme".to_owned(),
//!                 intent_id: format!("pay_{}", input.invoice),
//!                 order_id: input.invoice.clone(),
//!                 business_ref: input.invoice.clone(),
//!                 amount_minor: input.cents,
//!                 currency: "EUR".to_owned(),
//!                 payload: json!({"invoice": input.invoice, "cents": input.cents}),
//!                 payment_method: ctx.secret("card"),
//!                 tool: None,
//!             }).await?;
//!             end_with(&outcome)
//!         })
//!     }
//! }
//!
//! let kit = testkit::Kit::new(vec![Registered::new(PayInvoice)])
//!     .submit("pay_invoice", json!({"invoice": "inv_2041", "cents": 12_000, "card": "pm_card_visa_4242"}))
//!     .submit("pay_invoice", json!({"invoice": "inv_2042", "cents": 800, "card": "pm_card_visa_4242"}))
//!     .mismatch(|input| { let mut other = input.clone(); other["cents"] = json!(1); other })
//!     .seeds(7, 2);
//! let reports = kit.run().expect("every invariant holds; a failure names the seed to replay");
//! assert!(reports.iter().all(|r| r.report.is_ok()));
//! ```
//!
//! # Your agent
//!
//! An agent of yours — its tools registered in an [`agent::Registry`], its prompt, its limits
//! — runs in the kit with a scripted transcript of the model's answers ([`Agent`],
//! [`Kit::agent`]): started, crashed at its journal's commits (or SIGKILLed, with
//! [`Kit::killing`]) while its effect tools charge through the intent lifecycle under every
//! provider fault, resumed after each restart as `keel resume` would. Besides the invariants
//! above — no double effect, no refund over its charge, budgets never refilled (the model
//! calls, tool calls, tokens and model cost its journal's header allows, the spine's money,
//! attempts and time), `verify` clean — the kit checks two promises of the agent harness:
//! every model answer the journal recorded was asked of the transport exactly once, except
//! one lost with a process that died before recording it ([`agents::check_requests`]); and a
//! replayed effect call keeps its intent key (a run's tool never reserves more intents than
//! the guard admitted calls of it).
//!
//! A user's own "pay an invoice" agent — `read_invoice`, and `pay_invoice`, which charges the
//! invoice through an [`agent::IntentGate`] with the card the host binds
//! ([`Agent::paying_with`]). This is `tests/pay_invoice/agent.rs`, which `tests/pay_invoice.rs`
//! also runs under real SIGKILLs, and against its broken twin (a key drawn per process: seed
//! 59 pays the invoice twice, and the kit says so).
//!
//! ```
#![doc = include_str!("../tests/pay_invoice/agent.rs")]
//! let kit = testkit::Kit::new(Vec::new()).agent(pay_invoice_agent(Keys::FromTheRun)).seeds(1, 2);
//! let reports = kit.run().expect("every invariant holds; a failure names the seed to replay");
//! assert!(reports.iter().all(|r| r.report.effects <= 1));
//! ```

pub mod agents;
pub mod invariants;
mod kill;
pub mod sample;

use adapters::stripe::{LOOPBACK_TEST_KEY, SecretKey, StripeConfig, StripeProvider, local_capability};
pub use agents::{Agent, AgentHost};
use chrono::{TimeZone, Utc};
use engine::clock::{Clock as _, ManualClock};
use engine::event::{Cause, RunId, RunLimits};
use engine::executor::{Executor, Registered, RunOutcome, RunRequest, Runtime};
use engine::failpoints::{Failpoints, Point};
use engine::lease::{LeaseOwner, Lessee, SoleSurvivor};
use engine::provider::PaymentProvider;
pub use invariants::{Effect, Report};
use kill::{Kill, Part};
use provider_sim::faults::Fault;
use provider_sim::{Config, FaultPlan, Rng, Server};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable that replays one seed: `KEEL_SEED=1234 cargo test …`.
pub const SEED_ENV: &str = "KEEL_SEED";

/// The longest seeded delay before a child is SIGKILLed, in ms: a child re-executes the test
/// binary, opens the log and runs one submission in tens of milliseconds, so kills land
/// before, during and after its attempts.
const KILL_DELAY_MAX_MS: u64 = 400;

/// The provider's per-request timeout inside the kit: short, so a held answer (a timeout
/// after the effect) costs little wall time.
pub const REQUEST_TIMEOUT_MS: u64 = 250;

/// The consistency window the kit's provider declares, and the simulator plays on every
/// lookup (a lookup of a younger effect answers "absent").
pub const CONSISTENCY_WINDOW_MS: u64 = 100;

/// The provider's capability tier (SPEC, "Provider capability"): whether it honours
/// `Idempotency-Key` and whether it can look an effect up. The simulator plays it, and the
/// provider client declares it, so Keel acts on the truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tier {
    /// The provider deduplicates on the idempotency key.
    pub idempotency: bool,
    /// The provider answers lookups by key.
    pub lookup: bool,
}

impl Tier {
    /// Its short name, as `Capability::tier` spells it.
    pub fn name(self) -> &'static str {
        engine::provider::Capability { dedup_by_key: self.idempotency, lookup: self.lookup, ..local_capability() }
            .tier()
    }
}

/// One request the kit submits: a workflow name and its raw input (secrets included: the
/// kit re-submits it, as a caller would after an ambiguous answer).
#[derive(Clone, Debug)]
pub struct Submission {
    /// The workflow's registered name.
    pub workflow: String,
    /// Its raw input.
    pub input: Value,
}

type Mutate = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// One item of the workload: a workflow's request, or a user's agent run.
#[derive(Clone)]
enum Work {
    Workflow(Submission),
    Agent(Box<Agent>),
}

/// The run id of the kit's agent number `index` (one run per agent, per seed).
fn agent_run_id(index: usize) -> String {
    format!("testkit-agent-{index}")
}

/// The spine's limits the kit gives a run unless told otherwise.
fn default_limits() -> RunLimits {
    // The spine's defaults for attempts and reconciliations per intent; no run-level bound
    // the kit's schedules would have to budget for.
    RunLimits { cost_minor_max: None, network_retries_max: None, reconciliations_max: None, ..RunLimits::default() }
}

/// The harness. Build it with [`Kit::new`], add [`Kit::submit`]s, run with [`Kit::run`].
#[derive(Clone)]
pub struct Kit {
    workflows: Vec<Registered>,
    submissions: Vec<Work>,
    mismatch: Option<Mutate>,
    first_seed: u64,
    seeds: u64,
    crash_probability: f64,
    fault_probability: f64,
    reconciliation_passes: u32,
    limits: RunLimits,
    tier: Option<Tier>,
    killing: Option<String>,
}

/// What one seed did and what the checks found.
#[derive(Clone, Debug, Serialize)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Crashes injected (including crashes during recovery), real kills included.
    pub crashes: u64,
    /// Of which were SIGKILLs of a child process ([`Kit::killing`]).
    pub kills: u64,
    /// Of which crashed a recovery.
    pub recovery_crashes: u64,
    /// Crash points that fired, by name.
    pub points: Vec<&'static str>,
    /// Mismatch probes made.
    pub mismatch_probes: u64,
    /// The provider tier played (`dedup+lookup`, `lookup`, `dedup`, `none`).
    pub tier: &'static str,
    /// The fault kinds the plan drew, by name.
    pub faults: Vec<&'static str>,
    /// The invariants.
    pub report: Report,
}

/// A seed whose run broke an invariant, or could not run.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The seed to replay with `KEEL_SEED`.
    pub seed: u64,
    /// What went wrong.
    pub message: String,
    /// The invariants, when the run got that far (boxed: a failure is rare and large).
    pub report: Option<Box<SeedReport>>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} failed: {} — replay with {SEED_ENV}={}", self.seed, self.message, self.seed)?;
        if let Some(report) = &self.report {
            write!(f, "\n{}", serde_json::to_string_pretty(report).unwrap_or_default())?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

impl Kit {
    /// A kit over your workflows, with 4 seeds from 1, a crash armed in half the submissions and a
    /// provider fault in about 1 of 5 requests, and 6 reconciliation passes after healing.
    pub fn new(workflows: Vec<Registered>) -> Self {
        Self {
            workflows,
            submissions: Vec::new(),
            mismatch: None,
            first_seed: 1,
            seeds: 4,
            crash_probability: 0.5,
            fault_probability: 0.2,
            reconciliation_passes: 6,
            tier: None,
            killing: None,
            limits: default_limits(),
        }
    }

    /// Adds a request to the workload. The schedule submits each one once or twice (a
    /// duplicate must be deduplicated), in a seeded order.
    pub fn submit(mut self, workflow: &str, input: Value) -> Self {
        self.submissions.push(Work::Workflow(Submission { workflow: workflow.to_owned(), input }));
        self
    }

    /// Adds a user's agent to the workload: the schedule starts its one run once or twice
    /// (a second start resumes it) among the submissions, crashes it at seeded moments and
    /// resumes it after every restart, as `keel resume` would. Besides the invariants, the
    /// kit counts what its transport was asked ([`agents::check_requests`]): no recorded
    /// model call is asked again.
    pub fn agent(mut self, agent: Agent) -> Self {
        self.submissions.push(Work::Agent(Box::new(agent)));
        self
    }

    /// How to change a request's effect-defining payload (same key): the kit probes that such
    /// a request is rejected and writes nothing (invariant 7).
    pub fn mismatch(mut self, mutate: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        self.mismatch = Some(Arc::new(mutate));
        self
    }

    /// Runs `count` seeds from `first`.
    pub fn seeds(mut self, first: u64, count: u64) -> Self {
        self.first_seed = first;
        self.seeds = count;
        self
    }

    /// Probability that a submission is crashed at a random event boundary.
    pub fn crash_probability(mut self, p: f64) -> Self {
        self.crash_probability = p;
        self
    }

    /// Probability of each provider fault rule (before healing).
    pub fn fault_probability(mut self, p: f64) -> Self {
        self.fault_probability = p;
        self
    }

    /// Reconciliation passes allowed after healing before an unknown outcome counts as left
    /// unreconciled (invariant 9).
    pub fn reconciliation_passes(mut self, passes: u32) -> Self {
        self.reconciliation_passes = passes;
        self
    }

    /// Plays this provider tier in every seed (by default each seed draws one: without
    /// idempotency one seed in four, without lookup one in five).
    pub fn tier(mut self, tier: Tier) -> Self {
        self.tier = Some(tier);
        self
    }

    /// Runs every submission, and every recovery after a kill, in a child process that the
    /// kit SIGKILLs at seeded moments — after a seeded delay, or the moment the child reports
    /// it reached a seeded failpoint — instead of panicking at failpoints in this process.
    ///
    /// A child is this test binary re-executed (`std::env::current_exe()`) on the one test
    /// `test` names, exactly as libtest spells it (`module::test_name`, the path the test
    /// output prints). That test builds the same kit and calls [`Kit::run`], which finds the
    /// child's order in its environment (`KEEL_KIT_CHILD`), opens the same SQLite log, plays
    /// its part and exits the process; so the test must build the kit the same way every time
    /// and call `run` before anything else that matters. A name that does not run the test
    /// is reported, never taken for a pass.
    pub fn killing(mut self, test: &str) -> Self {
        self.killing = Some(test.to_owned());
        self
    }

    /// The limits of every run.
    pub fn limits(mut self, limits: RunLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Runs every seed — or only `KEEL_SEED` when set — and stops at the first failure, which
    /// it prints to stderr with the seed to replay.
    ///
    /// # Errors
    ///
    /// The first failing seed.
    pub fn run(&self) -> Result<Vec<SeedReport>, Failure> {
        if let Some(order) = kill::order_from_env() {
            kill::serve(self, order);
        }
        let seeds: Vec<u64> = match std::env::var(SEED_ENV).ok().and_then(|s| s.trim().parse().ok()) {
            Some(seed) => vec![seed],
            None => (self.first_seed..self.first_seed + self.seeds).collect(),
        };
        let mut reports = Vec::new();
        for seed in seeds {
            match self.run_seed(seed) {
                Ok(report) => reports.push(report),
                Err(failure) => {
                    eprintln!("testkit: {failure}");
                    return Err(failure);
                }
            }
        }
        Ok(reports)
    }

    /// Runs one seed.
    ///
    /// # Errors
    ///
    /// When an invariant broke (the report is attached) or the run itself failed.
    pub fn run_seed(&self, seed: u64) -> Result<SeedReport, Failure> {
        let fail = |message: String| Failure { seed, message, report: None };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| fail(format!("cannot start a runtime: {e}")))?;
        let dir = tempfile::tempdir().map_err(|e| fail(format!("cannot create a temp dir: {e}")))?;
        let result = runtime.block_on(SeedRun::new(self, seed, dir.path()).run());
        match result {
            Ok(report) if report.report.is_ok() => Ok(report),
            Ok(report) => Err(Failure {
                seed,
                message: format!("{} invariant violation(s)", report.report.violations()),
                report: Some(Box::new(report)),
            }),
            Err(message) => Err(fail(message)),
        }
    }
}

/// One seed's run.
struct SeedRun<'k> {
    kit: &'k Kit,
    seed: u64,
    rng: Rng,
    clock: Arc<ManualClock>,
    keel_db: PathBuf,
    sim_db: PathBuf,
    runs: u64,
    /// Executors opened so far: each is a "process" with its own lease owner.
    processes: u64,
    /// The provider tier this seed plays, and where the simulator listens.
    tier: Tier,
    sim_url: String,
    /// Where every process appends what its agents' transport was asked.
    requests: PathBuf,
    /// The processes that crashed or were killed: their last model answer may be lost.
    died: BTreeSet<u64>,
    out: SeedReport,
}

/// What a step came to.
enum Step<T> {
    Done(T),
    Crashed,
}

impl<'k> SeedRun<'k> {
    fn new(kit: &'k Kit, seed: u64, dir: &Path) -> Self {
        let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("a valid instant");
        Self {
            kit,
            seed,
            rng: Rng::new(seed),
            clock: Arc::new(ManualClock::new(start)),
            keel_db: dir.join("keel.db"),
            sim_db: dir.join("provider-sim.db"),
            runs: 0,
            processes: 0,
            tier: Tier { idempotency: true, lookup: true },
            sim_url: String::new(),
            requests: dir.join("model-requests.jsonl"),
            died: BTreeSet::new(),
            out: SeedReport {
                seed,
                crashes: 0,
                kills: 0,
                recovery_crashes: 0,
                points: Vec::new(),
                mismatch_probes: 0,
                tier: "",
                faults: Vec::new(),
                report: Report::default(),
            },
        }
    }

    /// Draws the provider this seed plays: its tier (unless the kit fixes it) and a fault
    /// plan over every fault kind the simulator knows.
    fn provider(&mut self) -> Result<(Tier, FaultPlan), String> {
        let tier =
            self.kit.tier.unwrap_or_else(|| Tier { idempotency: self.rng.chance(0.75), lookup: self.rng.chance(0.8) });
        let p = self.kit.fault_probability;
        let mut rules = Vec::new();
        let mut window = None;
        for fault in Fault::ALL {
            // Exhaustive on purpose: a fault kind the simulator learns does not compile here
            // until the schedule draws it.
            let (operation, ms) = match fault {
                Fault::FailBeforeEffect | Fault::Unavailable | Fault::LookupUnavailable => ("any", None),
                Fault::TimeoutAfterEffect { .. } => ("any", Some(REQUEST_TIMEOUT_MS * 2)),
                // Slow answers land on both sides of the request timeout: some are awaited,
                // some arrive after Keel stopped waiting (an unknown outcome to reconcile).
                Fault::Slow { .. } => ("any", Some(REQUEST_TIMEOUT_MS / 5 + self.rng.below(REQUEST_TIMEOUT_MS * 2))),
                Fault::Decline => ("charge", None),
                // The declared consistency window, on every lookup: the last rule, so that
                // the others still fire.
                Fault::LookupAbsentForMs { .. } => {
                    window = Some(json!({"operation": "lookup", "fault": fault.name(), "ms": CONSISTENCY_WINDOW_MS}));
                    self.out.faults.push(fault.name());
                    continue;
                }
                // SPEC, tier (b): without deduplication a resend follows a proven absence, and
                // the proof is the lookup's word; a lookup that lies is outside what Keel can
                // promise for such a provider, so it is drawn only where a key deduplicates.
                Fault::LookupLies if !tier.idempotency => continue,
                Fault::LookupLies => ("lookup", None),
            };
            if self.rng.chance(0.7) {
                let mut rule = json!({"operation": operation, "fault": fault.name(), "probability": p / 2.0});
                if let Some(ms) = ms {
                    rule["ms"] = json!(ms);
                }
                rules.push(rule);
                self.out.faults.push(fault.name());
            }
        }
        rules.extend(window);
        let plan = FaultPlan::from_json(&json!({"seed": self.seed, "rules": rules}).to_string());
        Ok((tier, plan.map_err(|e| e.to_string())?))
    }

    async fn run(mut self) -> Result<SeedReport, String> {
        let (tier, plan) = self.provider()?;
        (self.tier, self.out.tier) = (tier, tier.name());
        let mut sim = start_sim(&self.sim_db, plan, tier).await?;
        self.sim_url = sim.base_url();
        let provider = provider_at(&self.sim_url, tier)?;
        if self.kit.killing.is_some() {
            // The log exists before the first child, so the parent can read it between kills.
            shut(self.executor(&provider, Failpoints::disarmed())?.1);
        }

        // The workload: every submission once or twice, in a seeded order.
        let mut schedule: Vec<usize> = Vec::new();
        for index in 0..self.kit.submissions.len() {
            schedule.push(index);
            if self.rng.chance(0.4) {
                schedule.push(index);
            }
        }
        for i in (1..schedule.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            schedule.swap(i, j);
        }
        let kit = self.kit;
        for index in schedule {
            self.clock.advance_ms(self.rng.below(3_000) as i64);
            if let Some(test) = &kit.killing {
                self.runs += 1;
                let run_id = format!("testkit-{}-{}", self.seed, self.runs);
                let may_kill = self.rng.chance(kit.crash_probability);
                if self.in_child(test, Part::Start { submission: index, run_id }, may_kill).await? {
                    self.restart_in_children(test).await?;
                }
            } else {
                let crash = self.rng.chance(kit.crash_probability);
                let step = match &kit.submissions[index] {
                    Work::Workflow(submission) => {
                        let crash = crash.then(|| self.pick_point(&RUN_POINTS, 2));
                        self.start(&provider, submission, crash).await?.crashed()
                    }
                    Work::Agent(agent) => {
                        let crash = crash.then(|| self.pick_point(&AGENT_POINTS, AGENT_COMMITS));
                        self.start_agent(&provider, index, agent, crash).await?
                    }
                };
                if step {
                    self.restart(&provider).await?;
                }
            }
            if let Work::Workflow(submission) = &kit.submissions[index]
                && kit.mismatch.is_some()
                && self.rng.chance(0.3)
            {
                self.probe_mismatch(&provider, submission).await?;
            }
        }

        // Heal the provider, then let Keel finish what it may.
        sim.shutdown().await.map_err(|e| format!("simulator shutdown: {e}"))?;
        sim = start_sim(&self.sim_db, FaultPlan::none(), tier).await?;
        let provider = provider_at(&sim.base_url(), tier)?;
        for _ in 0..self.kit.reconciliation_passes {
            self.clock.advance_ms(120_000);
            let (executor, store) = self.executor(&provider, Failpoints::disarmed())?;
            let recorder = self.recorder();
            let recovered = recover(kit, &executor, &self.clock, &recorder).await;
            shut(store);
            recovered?;
            for (index, work) in kit.submissions.iter().enumerate() {
                let crashed = match work {
                    Work::Workflow(submission) => self.start(&provider, submission, None).await?.crashed(),
                    Work::Agent(agent) => self.start_agent(&provider, index, agent, None).await?,
                };
                if crashed {
                    return Err("a run crashed with no failpoint armed".to_owned());
                }
            }
            let report = invariants::check_files(&self.keel_db, &self.sim_db).map_err(|e| e.to_string())?;
            if report.unreconciled == 0 {
                break;
            }
        }
        sim.shutdown().await.map_err(|e| format!("simulator shutdown: {e}"))?;
        let mut report = invariants::check_files(&self.keel_db, &self.sim_db).map_err(|e| e.to_string())?;
        let journals = agents::journals(&self.keel_db)?;
        agents::check_requests(&agents::requests(&self.requests)?, &journals, &self.died, &mut report);
        report.mismatch_writes = self.out.report.mismatch_writes;
        report.details.append(&mut self.out.report.details);
        self.out.report = report;
        Ok(self.out)
    }

    /// One of `points`, to fire on one of its first `hits` passes.
    fn pick_point(&mut self, points: &[Point], hits: u64) -> (Point, u32) {
        let point = points[self.rng.below(points.len() as u64) as usize];
        (point, 1 + self.rng.below(hits) as u32)
    }

    /// This process's request recorder (the last process opened).
    fn recorder(&self) -> agents::Recorder {
        agents::Recorder { file: self.requests.clone(), process: self.processes }
    }

    /// A new "process" on the same files: its own store, executor and lease owner.
    fn executor(
        &mut self,
        provider: &Arc<dyn PaymentProvider>,
        failpoints: Failpoints,
    ) -> Result<(Executor, store::Store), String> {
        self.processes += 1;
        open_process(self.kit, &self.keel_db, self.clock.clone(), provider, failpoints, self.processes)
    }

    /// Runs `part` in a child process, SIGKILLed at a seeded moment when `may_kill`: after a
    /// seeded delay, or the moment it reaches a seeded failpoint. True when it was killed.
    async fn in_child(&mut self, test: &str, part: Part, may_kill: bool) -> Result<bool, String> {
        let recovering = matches!(part, Part::Recover);
        let (points, hits): (&[Point], u64) = match &part {
            Part::Recover => (&RECOVERY_POINTS, 2),
            Part::Start { submission, .. } => match self.kit.submissions.get(*submission) {
                Some(Work::Agent(_)) => (&AGENT_POINTS, AGENT_COMMITS),
                _ => (&RUN_POINTS, 2),
            },
        };
        let (kill, point) = match (may_kill, self.rng.chance(0.5)) {
            (false, _) => (Kill::Never, None),
            (true, true) => (Kill::After(self.rng.below(KILL_DELAY_MAX_MS)), None),
            (true, false) => (Kill::AtPoint, Some(self.pick_point(points, hits))),
        };
        self.processes += 1;
        let order = kill::Order {
            keel_db: self.keel_db.clone(),
            provider_url: self.sim_url.clone(),
            tier: self.tier,
            now: self.clock.now(),
            process: self.processes,
            requests: self.requests.clone(),
            point: point.map(|(point, nth)| (point.name().to_owned(), nth)),
            part,
        };
        let test = test.to_owned();
        let supervised = tokio::task::spawn_blocking(move || kill::supervise(&test, &order, kill)).await;
        let killed = supervised.map_err(|e| format!("the child's supervisor panicked: {e}"))??;
        // The child's clock moved on its own (its timers and backoffs): the next process
        // starts no earlier than the last event it wrote.
        let reader = store::Reader::open(&self.keel_db).map_err(|e| e.to_string())?;
        if let Some(last) = reader.events_since(0).map_err(|e| e.to_string())?.last() {
            self.clock.advance_ms((last.at - self.clock.now()).num_milliseconds().max(0));
        }
        if killed {
            self.died.insert(self.processes);
            self.out.kills += 1;
            self.note_crash(point, recovering);
        }
        Ok(killed)
    }

    /// After a kill: recovery in a child, which may itself be killed (then again).
    async fn restart_in_children(&mut self, test: &str) -> Result<(), String> {
        for round in 0..4 {
            let may_kill = round < 3 && self.rng.chance(0.3);
            if !self.in_child(test, Part::Recover, may_kill).await? {
                return Ok(());
            }
        }
        Err("recovery was killed four times in a row with no kill left armed".to_owned())
    }

    fn armed(&mut self, crash: Option<(Point, u32)>) -> (Failpoints, Arc<AtomicBool>) {
        let fired = Arc::new(AtomicBool::new(false));
        let failpoints = match crash {
            None => Failpoints::disarmed(),
            Some((point, nth)) => {
                let flag = Arc::clone(&fired);
                Failpoints::armed(
                    point,
                    nth,
                    Arc::new(move |point| {
                        flag.store(true, Ordering::SeqCst);
                        panic!("testkit: crash at failpoint {point}");
                    }),
                )
            }
        };
        (failpoints, fired)
    }

    async fn start(
        &mut self,
        provider: &Arc<dyn PaymentProvider>,
        submission: &Submission,
        crash: Option<(Point, u32)>,
    ) -> Result<Step<RunOutcome>, String> {
        let (failpoints, fired) = self.armed(crash);
        let (executor, store) = self.executor(provider, failpoints)?;
        self.runs += 1;
        let request = RunRequest {
            run_id: RunId::new(format!("testkit-{}-{}", self.seed, self.runs)),
            limits: self.kit.limits.clone(),
            deadline_ms: engine::limits::RUN_DEADLINE_DEFAULT_MS,
            cause: Cause::command("testkit"),
        };
        let (workflow, input) = (submission.workflow.clone(), submission.input.clone());
        let task = tokio::spawn(async move { executor.start(&workflow, &input, request).await });
        let result = task.await;
        shut(store);
        if fired.load(Ordering::SeqCst) {
            self.died.insert(self.processes);
            self.note_crash(crash, false);
            return Ok(Step::Crashed);
        }
        match result {
            Ok(Ok(outcome)) => Ok(Step::Done(outcome)),
            Ok(Err(error)) => Err(format!("run of {} failed: {error}", submission.workflow)),
            Err(join) => Err(format!("run of {} panicked: {join}", submission.workflow)),
        }
    }

    /// Starts or resumes the run of the kit's agent number `index` in a new "process",
    /// crashed at `crash` when armed. True when it crashed.
    async fn start_agent(
        &mut self,
        provider: &Arc<dyn PaymentProvider>,
        index: usize,
        agent: &Agent,
        crash: Option<(Point, u32)>,
    ) -> Result<bool, String> {
        let (failpoints, fired) = self.armed(crash);
        let (executor, store) = self.executor(provider, failpoints)?;
        let (agent, clock, recorder) = (agent.clone(), Arc::clone(&self.clock), self.recorder());
        let runtime = executor.runtime().clone();
        let task = tokio::spawn(async move {
            agents::drive(&agent, &runtime, &clock, &agent_run_id(index), &recorder, true).await
        });
        let result = task.await;
        shut(store);
        if fired.load(Ordering::SeqCst) {
            self.died.insert(self.processes);
            self.note_crash(crash, false);
            return Ok(true);
        }
        match result {
            Ok(Ok(())) => Ok(false),
            Ok(Err(error)) => Err(error),
            Err(join) => Err(format!("agent run {} panicked: {join}", agent_run_id(index))),
        }
    }

    fn note_crash(&mut self, crash: Option<(Point, u32)>, recovering: bool) {
        self.out.crashes += 1;
        if recovering {
            self.out.recovery_crashes += 1;
        }
        if let Some((point, _)) = crash
            && !self.out.points.contains(&point.name())
        {
            self.out.points.push(point.name());
        }
    }

    /// Restarts after a crash: recovery, which may itself crash (then restart again).
    async fn restart(&mut self, provider: &Arc<dyn PaymentProvider>) -> Result<(), String> {
        for round in 0..4 {
            let crash = (round < 3 && self.rng.chance(0.3)).then(|| self.pick_point(&RECOVERY_POINTS, 2));
            let (failpoints, fired) = self.armed(crash);
            let (executor, store) = self.executor(provider, failpoints)?;
            let (kit, clock, recorder) = (self.kit.clone(), Arc::clone(&self.clock), self.recorder());
            let task = tokio::spawn(async move { recover(&kit, &executor, &clock, &recorder).await });
            let result = task.await;
            shut(store);
            if fired.load(Ordering::SeqCst) {
                self.died.insert(self.processes);
                self.note_crash(crash, true);
                continue;
            }
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(format!("recovery failed: {error}")),
                Err(join) => Err(format!("recovery panicked: {join}")),
            };
        }
        Err("recovery crashed four times in a row with no failpoint left armed".to_owned())
    }

    async fn probe_mismatch(
        &mut self,
        provider: &Arc<dyn PaymentProvider>,
        submission: &Submission,
    ) -> Result<(), String> {
        let Some(mutate) = self.kit.mismatch.clone() else { return Ok(()) };
        let before = events(&self.keel_db)?;
        let changed = Submission { workflow: submission.workflow.clone(), input: mutate(&submission.input) };
        let Step::Done(outcome) = self.start(provider, &changed, None).await? else {
            return Err("a mismatch probe crashed with no failpoint armed".to_owned());
        };
        self.out.mismatch_probes += 1;
        let after = events(&self.keel_db)?;
        // Only a key already reserved must refuse the change; a first proposal is just new.
        let reserved = outcome.output.get("code").and_then(Value::as_str) == Some("intent_payload_mismatch");
        if reserved && (outcome.written || after != before) {
            self.out.report.mismatch_writes += 1;
            self.out.report.note(format!("a payload mismatch wrote {} event(s)", after - before));
        }
        // Otherwise the mutated request was the first proposal of a key the schedule had not
        // reached yet: a legitimate intent, which the final check covers like any other.
        Ok(())
    }
}

/// Points a running workflow may crash at.
const RUN_POINTS: [Point; 7] = [
    Point::AfterReservation,
    Point::AfterAttemptStarted,
    Point::AfterProviderAnswer,
    Point::AfterReconciliationStarted,
    Point::AfterLookup,
    Point::InBatchBeforeCommit,
    Point::AfterCommitBeforeAnswer,
];

/// Points an agent run may crash at: its journal's commits (its effects' driver is not on
/// the failpoints' paths), on one of its first [`AGENT_COMMITS`].
const AGENT_POINTS: [Point; 2] = [Point::InBatchBeforeCommit, Point::AfterCommitBeforeAnswer];

/// How many commits of an agent run a crash is drawn among.
const AGENT_COMMITS: u64 = 16;

/// Points a recovery may crash at.
const RECOVERY_POINTS: [Point; 6] = [
    Point::AfterRecover,
    Point::AfterReconciliationStarted,
    Point::AfterLookup,
    Point::AfterAttemptStarted,
    Point::InBatchBeforeCommit,
    Point::AfterCommitBeforeAnswer,
];

impl<T> Step<T> {
    fn crashed(&self) -> bool {
        matches!(self, Step::Crashed)
    }
}

/// What a restarted process does: recover and resume the workflows' runs, then resume every
/// agent run of the kit that has started (the executor leaves those to their host).
async fn recover(
    kit: &Kit,
    executor: &Executor,
    clock: &Arc<ManualClock>,
    recorder: &agents::Recorder,
) -> Result<(), String> {
    executor.recover_and_resume(Cause::command("testkit resume")).await.map_err(|e| e.to_string())?;
    for (index, work) in kit.submissions.iter().enumerate() {
        if let Work::Agent(agent) = work {
            agents::drive(agent, executor.runtime(), clock, &agent_run_id(index), recorder, false).await?;
        }
    }
    Ok(())
}

fn shut(store: store::Store) {
    // After a crash the writer may have panicked (a failpoint inside a batch): that is the
    // crash itself, not a finding.
    let _ = store.shutdown();
}

fn events(db: &Path) -> Result<u64, String> {
    let reader = store::Reader::open(db).map_err(|e| e.to_string())?;
    Ok(reader.events_since(0).map_err(|e| e.to_string())?.len() as u64)
}

/// A new "process" on the kit's files — its own store, executor and lease owner number
/// `process`. Every earlier one crashed, was killed or stopped, so the probe proves their
/// leases' holders dead.
fn open_process(
    kit: &Kit,
    keel_db: &Path,
    clock: Arc<ManualClock>,
    provider: &Arc<dyn PaymentProvider>,
    failpoints: Failpoints,
    process: u64,
) -> Result<(Executor, store::Store), String> {
    let owner = LeaseOwner::named(&format!("kit-process-{process}"));
    let options = store::Options {
        durability: store::Durability::Normal,
        failpoints: failpoints.clone(),
        owner_probe: Arc::new(SoleSurvivor(owner.clone())),
        ..Default::default()
    };
    let store = store::Store::open(keel_db, options, clock.clone()).map_err(|e| e.to_string())?;
    let runtime =
        Runtime { log: Arc::new(store.clone()), provider: provider.clone(), clock, lessee: Lessee::new(owner) };
    Ok((Executor::new(runtime, kit.workflows.clone()).with_failpoints(failpoints), store))
}

async fn start_sim(db: &Path, faults: FaultPlan, tier: Tier) -> Result<Server, String> {
    let config = Config { faults, idempotency: tier.idempotency, lookup: tier.lookup, ..Config::new(db) };
    Server::start(config).await.map_err(|e| format!("simulator: {e}"))
}

fn provider_at(base_url: &str, tier: Tier) -> Result<Arc<dyn PaymentProvider>, String> {
    let capability = engine::provider::Capability {
        dedup_by_key: tier.idempotency,
        lookup: tier.lookup,
        consistency_window_ms: CONSISTENCY_WINDOW_MS,
        ..local_capability()
    };
    let key = Arc::new(SecretKey::parse(LOOPBACK_TEST_KEY).map_err(|e| e.to_string())?);
    let config =
        StripeConfig { capability, request_timeout_ms: REQUEST_TIMEOUT_MS, ..StripeConfig::new(base_url, key) };
    Ok(Arc::new(StripeProvider::new(config).map_err(|e| e.to_string())?))
}
