//! One store contract, two backends: every scenario here runs against the SQLite `store`
//! (two `Store`s on one file) and against `PgLog` (two `PgLog`s on one database of a
//! throwaway PostgreSQL the test starts itself — installed when missing; a cluster that
//! cannot start fails the test, it never skips).
//!
//! Then what only PostgreSQL has: its migrations, its append-only trigger, a tampered event
//! found by `verify`, and a `COMMIT` whose answer is lost, resolved by its commit id.

#[path = "../../tests/it/support.rs"]
#[allow(dead_code)] // The store's own test builders: this suite uses some of them.
mod support;

use engine::canonical::fingerprint;
use engine::clock::ManualClock;
use engine::event::{Cause, Event, IntentDefinition, IntentKey, RunId, RunLimits, StoredEvent, StreamId};
use engine::executor::{Executor, RunEnd, RunRequest, Runtime};
use engine::lease::{LeaseGrant, LeaseOwner, LeaseUse, Lessee};
use engine::ledger::{Action, Command, IntentSpec, IntentStatus, Ledger, Refusal, RejectCode, Reply, RunStart};
use engine::log::{EventLog, LogError};
use engine::memory::MemoryProvider;
use engine::provider::EffectKind;
use serde_json::json;
use std::num::NonZeroUsize;
use std::sync::Arc;
use store_postgres::proxy::{Cut, Heal, Proxy};
use store_postgres::{PgLog, PgReader};
use support::{capability, charge, intent_of, key, limits, start, start_and_reserve, start_attempt, succeed};

/// Reads a log the way checkers do.
trait Checks {
    /// The whole-log fold, every event checked.
    fn ledger(&self) -> Ledger;
    /// `verify`: `Err` with the report when anything mismatches.
    fn verify(&self) -> Result<(), String>;
    /// One stream's events.
    fn stream(&self, stream: &StreamId) -> Vec<StoredEvent>;
}

/// Two handles on one fresh log — two workers — and its checks.
struct Pair {
    a: Arc<dyn EventLog>,
    b: Arc<dyn EventLog>,
    checks: Box<dyn Checks>,
    clock: Arc<ManualClock>,
    _keep: Option<tempfile::TempDir>,
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

struct SqliteChecks(std::path::PathBuf);

impl Checks for SqliteChecks {
    fn ledger(&self) -> Ledger {
        store::Reader::open(&self.0).expect("a reader").ledger().expect("the log folds")
    }
    fn verify(&self) -> Result<(), String> {
        let report = store::Reader::open(&self.0).expect("a reader").verify().expect("verify reads");
        if report.is_ok() { Ok(()) } else { Err(report.to_string()) }
    }
    fn stream(&self, stream: &StreamId) -> Vec<StoredEvent> {
        store::Reader::open(&self.0).expect("a reader").stream(stream).expect("the stream reads")
    }
}

struct PgChecks(String);

impl PgChecks {
    fn reader(&self) -> PgReader {
        PgReader::open(&self.0).expect("a reader connects")
    }
}

impl Checks for PgChecks {
    fn ledger(&self) -> Ledger {
        self.reader().ledger().expect("the log folds")
    }
    fn verify(&self) -> Result<(), String> {
        let report = self.reader().verify().expect("verify reads");
        if report.is_ok() { Ok(()) } else { Err(format!("{report}: {:?}", report.mismatches)) }
    }
    fn stream(&self, stream: &StreamId) -> Vec<StoredEvent> {
        self.reader().stream(stream).expect("the stream reads")
    }
}

/// A database of the test binary's one throwaway cluster.
fn pg_url(label: &str) -> String {
    let cluster = match store_postgres::cluster::shared() {
        Ok(cluster) => cluster,
        Err(error) => panic!("the PostgreSQL suite needs a server: {error}"),
    };
    cluster.database(label).unwrap_or_else(|error| panic!("{error}"))
}

/// A fresh database `label` with a proxy of its own in front of the server: the direct URL,
/// the proxy, and the URL through it.
fn behind_proxy(label: &str) -> (String, Proxy, String) {
    let direct = pg_url(label);
    let port = store_postgres::cluster::shared().unwrap_or_else(|error| panic!("{error}")).port();
    let proxy = Proxy::start(([127, 0, 0, 1], port).into()).expect("the proxy listens");
    let through = direct.replace(&format!(":{port}/"), &format!(":{}/", proxy.port()));
    (direct, proxy, through)
}

fn pg_open(url: &str, clock: &Arc<ManualClock>) -> PgLog {
    PgLog::open(url, store_postgres::Options::default(), clock.clone()).expect("the postgres log opens")
}

impl Backend {
    fn open(self, label: &str) -> Pair {
        let clock = Arc::new(ManualClock::new(start()));
        match self {
            Self::Sqlite => {
                let dir = tempfile::tempdir().expect("a temp dir");
                let path = dir.path().join("keel.db");
                let open = || store::Store::open(&path, store::Options::default(), clock.clone()).expect("opens");
                let (a, b) = (open(), open());
                Pair { a: Arc::new(a), b: Arc::new(b), checks: Box::new(SqliteChecks(path)), clock, _keep: Some(dir) }
            }
            Self::Postgres => {
                let url = pg_url(label);
                let (a, b) = (pg_open(&url, &clock), pg_open(&url, &clock));
                Pair { a: Arc::new(a), b: Arc::new(b), checks: Box::new(PgChecks(url)), clock, _keep: None }
            }
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("a runtime")
}

/// Every scenario, once per backend.
macro_rules! conformance {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[test] fn $scenario() { super::$scenario(super::Backend::Sqlite) })*
        }
        mod postgres {
            $(#[test] fn $scenario() { super::$scenario(super::Backend::Postgres) })*
        }
    };
}

conformance!(
    two_workers_reserving_one_key_make_exactly_one_reservation,
    concurrent_refunds_never_exceed_the_charge_per_currency,
    a_stale_token_is_fenced_but_its_definitive_answer_is_recorded,
    a_takeover_after_expiry_makes_in_flight_attempts_unknown_never_resent,
    a_charge_and_its_refund_run_end_to_end_through_the_executor,
    late_answers_racing_a_takeover_make_one_history_never_a_fork,
);

fn two_workers_reserving_one_key_make_exactly_one_reservation(backend: Backend) {
    const KEYS: usize = 12;
    let pair = backend.open("reserve_race");
    runtime().block_on(async {
        for k in 0..KEYS {
            let id = format!("race-{k:03}");
            let (run_a, run_b) = (format!("run-a-{k}"), format!("run-b-{k}"));
            let (a, b) = tokio::join!(
                pair.a.execute(start_and_reserve(&run_a, charge(&id, 100))),
                pair.b.execute(start_and_reserve(&run_b, charge(&id, 100))),
            );
            let ((a_intent, a_fresh), (b_intent, b_fresh)) = (intent_of(a), intent_of(b));
            assert!(a_fresh != b_fresh, "{backend:?}: exactly one reservation of {id} wins");
            let winner = if a_fresh { &run_a } else { &run_b };
            assert_eq!(a_intent.run_id.as_str(), winner, "{backend:?}: the loser sees the winner's reservation");
            assert_eq!(b_intent.run_id.as_str(), winner);
        }
    });
    let ledger = pair.checks.ledger();
    assert_eq!(ledger.intents().len(), KEYS);
    for k in 0..KEYS {
        let reserved = pair.checks.stream(&key(&format!("race-{k:03}")).stream());
        assert_eq!(reserved.len(), 1, "{backend:?}: one IntentReserved per key, never two");
    }
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

/// A refund of `amount_minor` in `currency` on charge `charge_id`'s order.
fn refund(id: &str, charge_id: &str, amount_minor: i64, currency: &str) -> IntentSpec {
    let order_id = format!("order-{charge_id}");
    let payload = json!({"order_id": order_id, "amount_minor": amount_minor, "currency": currency});
    IntentSpec {
        definition: IntentDefinition {
            key: IntentKey::new(EffectKind::Refund, "t1", id),
            kind: EffectKind::Refund,
            tenant: "t1".to_owned(),
            intent_id: id.to_owned(),
            order_id,
            business_ref: id.to_owned(),
            fingerprint: fingerprint(&payload),
            amount_minor,
            currency: currency.to_owned(),
            payload,
            tool: None,
        },
        capability: capability(),
        approval_required: false,
    }
}

fn concurrent_refunds_never_exceed_the_charge_per_currency(backend: Backend) {
    const REFUNDS: usize = 10;
    let pair = backend.open("refund_race");
    let rt = runtime();
    rt.block_on(async {
        intent_of(pair.a.execute(start_and_reserve("run-charge", charge("paid", 1_000))).await);
        intent_of(pair.a.execute(start_attempt("run-charge", "paid")).await);
        let (charged, _) = intent_of(pair.b.execute(succeed("paid", 1, 1_000)).await);
        assert_eq!(charged.status, IntentStatus::Validated);
        // Ten refunds of 300 from two workers at once: three fit in 1 000, never a fourth.
        let tries = (0..REFUNDS).map(|n| {
            let log = if n % 2 == 0 { pair.a.clone() } else { pair.b.clone() };
            let command =
                start_and_reserve(&format!("run-refund-{n}"), refund(&format!("refund-{n}"), "paid", 300, "EUR"));
            tokio::spawn(async move { log.execute(command).await })
        });
        let mut accepted = 0;
        for attempt in tries.collect::<Vec<_>>() {
            match attempt.await.expect("no panic") {
                Ok(Reply::Intent { fresh: true, .. }) => accepted += 1,
                Err(LogError::Refused(Refusal::Rejected { code: RejectCode::InvariantViolated, .. })) => {}
                other => panic!("{backend:?}: a refund is reserved or refused for the invariant, got {other:?}"),
            }
        }
        assert_eq!(accepted, 3, "{backend:?}: 3 × 300 fit in the 1 000 charged, a fourth does not");
        let usd = pair.b.execute(start_and_reserve("run-usd", refund("refund-usd", "paid", 100, "USD"))).await;
        assert!(
            matches!(usd, Err(LogError::Refused(Refusal::Rejected { code: RejectCode::InvalidArguments, .. }))),
            "{backend:?}: a refund in another currency than the charge's is refused: {usd:?}"
        );
    });
    let ledger = pair.checks.ledger();
    assert_eq!(ledger.order_refunds_committed_minor("t1", "order-paid", "EUR"), 900);
    assert_eq!(ledger.order_refunds_committed_minor("t1", "order-paid", "USD"), 0, "the refused one wrote nothing");
    assert!(pair.checks.stream(&IntentKey::new(EffectKind::Refund, "t1", "refund-usd").stream()).is_empty());
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

/// Run `run_id` started by `owner` with a charge `id` reserved, its attempt written ahead
/// under the starter's token 1.
async fn leased_attempt(log: &Arc<dyn EventLog>, run_id: &str, id: &str, owner: &LeaseOwner) {
    let mut reserve = start_and_reserve(run_id, charge(id, 500));
    if let Some(start) = reserve.start_run.as_mut() {
        start.owner = Some(owner.clone());
    }
    intent_of(log.execute(reserve).await);
    let grant = LeaseGrant { run_id: RunId::new(run_id), token: 1 };
    let attempt = start_attempt(run_id, id).under(LeaseUse::Hold(grant));
    assert_eq!(intent_of(log.execute(attempt).await).0.status, IntentStatus::Attempting);
}

fn a_stale_token_is_fenced_but_its_definitive_answer_is_recorded(backend: Backend) {
    let pair = backend.open("fencing");
    let (first, second) = (LeaseOwner::named("first"), LeaseOwner::named("second"));
    let run_id = RunId::new("run-fenced");
    runtime().block_on(async {
        leased_attempt(&pair.a, "run-fenced", "fenced", &first).await;
        let claim =
            || Command::new(Cause::command("test"), Action::ClaimRun { run_id: run_id.clone(), owner: second.clone() });
        assert!(
            matches!(pair.b.execute(claim()).await, Err(LogError::Refused(Refusal::LeaseHeld { .. }))),
            "{backend:?}: a live hold is not taken"
        );
        pair.clock.advance_ms(i64::try_from(engine::limits::LEASE_TTL_DEFAULT_MS).expect("small") + 1);
        match pair.b.execute(claim()).await {
            Ok(Reply::Claimed(grant)) => assert_eq!(grant.token, 2, "{backend:?}: the next token"),
            other => panic!("{backend:?}: an expired hold is claimed, got {other:?}"),
        }
        // The first worker wakes up: its write for the run is refused…
        let stale = LeaseUse::Hold(LeaseGrant { run_id: run_id.clone(), token: 1 });
        let step = Command::new(
            Cause::command("test").for_run(&run_id),
            Action::RecordStep { run_id: run_id.clone(), position: 1, name: "late".to_owned(), output: json!(1) },
        )
        .under(stale);
        match pair.a.execute(step).await {
            Err(LogError::Refused(Refusal::Fenced { presented, current, .. })) => {
                assert_eq!((presented, current), (Some(1), 2), "{backend:?}");
            }
            other => panic!("{backend:?}: a stale token is fenced, got {other:?}"),
        }
        // …but the provider's definitive answer it brings is evidence, recorded.
        let (answered, _) = intent_of(pair.a.execute(succeed("fenced", 1, 500)).await);
        assert_eq!(answered.status, IntentStatus::Validated, "{backend:?}: the answer is never dropped");
    });
    let steps = pair.checks.stream(&run_id.stream());
    assert!(
        !steps.iter().any(|e| matches!(&e.event, Event::StepRecorded { name, .. } if name == "late")),
        "{backend:?}: the fenced write wrote nothing"
    );
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

fn a_takeover_after_expiry_makes_in_flight_attempts_unknown_never_resent(backend: Backend) {
    let pair = backend.open("takeover");
    let (dead, taker) = (LeaseOwner::named("dead"), LeaseOwner::named("taker"));
    runtime().block_on(async {
        leased_attempt(&pair.a, "run-dead", "inflight", &dead).await;
        let recover = || Command::new(Cause::recovery(), Action::Recover { owner: taker.clone(), run: None });
        match pair.b.execute(recover()).await {
            Ok(Reply::Recovered(recovery)) => {
                assert!(recovery.recovered.is_empty(), "{backend:?}: a live hold is left to its holder");
                assert_eq!(recovery.held_elsewhere.len(), 1);
            }
            other => panic!("{backend:?}: recovery answers, got {other:?}"),
        }
        pair.clock.advance_ms(i64::try_from(engine::limits::LEASE_TTL_DEFAULT_MS).expect("small") + 1);
        // Both workers recover at once: exactly one interrupted fact, never a fork.
        let (one, two) = tokio::join!(pair.a.execute(recover()), pair.b.execute(recover()));
        let recovered: usize = [one, two]
            .into_iter()
            .map(|reply| match reply {
                Ok(Reply::Recovered(recovery)) => recovery.recovered.len(),
                other => panic!("{backend:?}: recovery answers, got {other:?}"),
            })
            .sum();
        assert_eq!(recovered, 1, "{backend:?}: one of the two recoveries records the crash");
    });
    let events = pair.checks.stream(&key("inflight").stream());
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(&e.event)).count();
    assert_eq!(count(|e| matches!(e, Event::AttemptStarted { .. })), 1, "{backend:?}: never resent");
    assert_eq!(count(|e| matches!(e, Event::OutcomeUnknown { .. })), 1, "{backend:?}: unknown exactly once");
    let ledger = pair.checks.ledger();
    let intent = ledger.intent(&key("inflight")).expect("reserved");
    assert_eq!(intent.status, IntentStatus::OutcomeUnknown, "{backend:?}: reconciled next, not resent");
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

fn late_answers_racing_a_takeover_make_one_history_never_a_fork(backend: Backend) {
    const INTENTS: usize = 8;
    let pair = backend.open("late_vs_takeover");
    let (dead, taker) = (LeaseOwner::named("dead"), LeaseOwner::named("taker"));
    let ids: Vec<String> = (0..INTENTS).map(|n| format!("late-{n:02}")).collect();
    runtime().block_on(async {
        for (n, id) in ids.iter().enumerate() {
            leased_attempt(&pair.a, &format!("run-late-{n}"), id, &dead).await;
        }
        pair.clock.advance_ms(i64::try_from(engine::limits::LEASE_TTL_DEFAULT_MS).expect("small") + 1);
        // The presumed-dead worker's answers arrive while the other worker recovers its runs.
        let answers = ids.iter().map(|id| {
            let log = pair.a.clone();
            let command = succeed(id, 1, 500);
            tokio::spawn(async move { log.execute(command).await })
        });
        let answers: Vec<_> = answers.collect();
        let recover = Command::new(Cause::recovery(), Action::Recover { owner: taker.clone(), run: None });
        let recovered = pair.b.execute(recover).await;
        assert!(matches!(recovered, Ok(Reply::Recovered(_))), "{backend:?}: {recovered:?}");
        for answer in answers {
            match answer.await.expect("no panic") {
                Ok(_) | Err(LogError::Refused(_)) => {}
                Err(other) => panic!("{backend:?}: an answer is recorded or refused, never lost: {other}"),
            }
        }
    });
    for id in &ids {
        let events = pair.checks.stream(&key(id).stream());
        let started = events.iter().filter(|e| matches!(e.event, Event::AttemptStarted { .. })).count();
        assert_eq!(started, 1, "{backend:?}: {id} never resent");
        let answered = events.iter().any(|e| {
            matches!(
                e.event,
                Event::IntentValidated { .. } | Event::LateAnswerRecorded { .. } | Event::ReconciliationResolved { .. }
            )
        });
        assert!(answered, "{backend:?}: {id}: the definitive answer is recorded whichever came first: {events:?}");
    }
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

const TENANT: &str = "3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10";

fn request(run_id: &str) -> RunRequest {
    RunRequest {
        run_id: RunId::new(run_id),
        limits: RunLimits { cost_minor_max: None, ..limits() },
        deadline_ms: 600_000,
        cause: Cause::command("conformance"),
    }
}

fn a_charge_and_its_refund_run_end_to_end_through_the_executor(backend: Backend) {
    let pair = backend.open("executor");
    let provider = Arc::new(MemoryProvider::new(capability()));
    let executor = |log: &Arc<dyn EventLog>, name: &str| {
        let runtime = Runtime {
            log: log.clone(),
            provider: provider.clone(),
            clock: pair.clock.clone(),
            lessee: Lessee::new(LeaseOwner::named(name)),
        };
        Executor::new(runtime, workflows::builtin(None))
    };
    let (first, second) = (executor(&pair.a, "first"), executor(&pair.b, "second"));
    runtime().block_on(async {
        let charge = json!({"tenant_id": TENANT, "intent_id": "e2e_charge_0001", "order_id": "order_e2e",
                            "amount_minor": 2_500, "currency": "EUR", "payment_method_token": "pm_card_visa_4242424242"});
        let charged = first.start("charge", &charge, request("run-e2e-charge")).await.expect("an outcome");
        assert_eq!(charged.status, RunEnd::Finished(engine::event::RunStatus::Completed), "{backend:?}: {charged:?}");
        let refund = json!({"tenant_id": TENANT, "intent_id": "e2e_refund_0001", "order_id": "order_e2e",
                            "amount_minor": 1_000, "currency": "EUR"});
        let refunded = second.start("refund", &refund, request("run-e2e-refund")).await.expect("an outcome");
        assert_eq!(refunded.status, RunEnd::Finished(engine::event::RunStatus::Completed), "{backend:?}: {refunded:?}");
        let again = first.start("charge", &charge, request("run-e2e-again")).await.expect("an outcome");
        assert!(again.written, "{backend:?}: the second run journals the shared intent");
    });
    assert_eq!(provider.effect_count(), 2, "{backend:?}: one charge and one refund, the repeated charge deduplicated");
    let ledger = pair.checks.ledger();
    assert_eq!(ledger.order_charged_minor(TENANT, "order_e2e", "EUR"), 2_500);
    pair.checks.verify().unwrap_or_else(|report| panic!("{backend:?}: {report}"));
}

// ---- PostgreSQL only -------------------------------------------------------------------

/// How many sessions wait for an advisory lock in the database at `url`, once `n` do (or the
/// cluster's bounded wait ran out).
fn wait_for_lock_waiters(url: &str, n: i64) -> i64 {
    store_postgres::cluster::wait_for_lock_waiters(url, n).unwrap_or_else(|e| panic!("reads pg_locks: {e}"))
}

fn admin(url: &str) -> ::postgres::Client {
    ::postgres::Client::connect(url, ::postgres::NoTls).expect("a superuser connection")
}

#[test]
fn postgres_migrations_are_versioned_applied_once_and_refuse_a_newer_schema() {
    let url = pg_url("migrations");
    let clock = Arc::new(ManualClock::new(start()));
    let log = pg_open(&url, &clock);
    let mut client = admin(&url);
    assert_eq!(store_postgres::schema::version(&mut client).expect("reads"), store_postgres::schema::SCHEMA_VERSION);
    log.shutdown();
    // Opening again applies nothing (a second CREATE TABLE would fail).
    pg_open(&url, &clock).shutdown();
    client.execute("UPDATE keel_meta SET schema_version = schema_version + 1", &[]).expect("bumps");
    match PgLog::open(&url, store_postgres::Options::default(), clock) {
        Err(store_postgres::Error::SchemaTooNew { found, supported }) => assert_eq!(found, supported + 1),
        Err(other) => panic!("a newer schema is refused, got {other}"),
        Ok(_) => panic!("a newer schema is refused, it opened"),
    }
}

#[test]
fn postgres_refuses_bad_options_and_payloads_writing_nothing() {
    let url = pg_url("bad_input");
    let clock = Arc::new(ManualClock::new(start()));
    let zero = store_postgres::Options { writers: 0, ..Default::default() };
    assert!(matches!(PgLog::open(&url, zero, clock.clone()), Err(store_postgres::Error::Options(_))));
    let log = pg_open(&url, &clock);
    let big = json!("x".repeat(engine::limits::EVENT_PAYLOAD_MAX_BYTES));
    let mut start_run = start_and_reserve("run-big", charge("big", 100));
    start_run.start_run = Some(RunStart { input: big, ..support::run_start("run-big") });
    let refused = runtime().block_on(log.execute(start_run));
    assert!(matches!(refused, Err(LogError::Refused(Refusal::PayloadTooLarge { .. }))), "{refused:?}");
    let events: i64 = admin(&url).query_one("SELECT count(*) FROM events", &[]).expect("counts").get(0);
    let commits: i64 = admin(&url).query_one("SELECT count(*) FROM commits", &[]).expect("counts").get(0);
    assert_eq!((events, commits), (0, 0), "a refusal writes nothing, not even a commit id");
}

#[test]
fn postgres_events_are_append_only_and_a_tampered_event_is_reported_by_verify() {
    let url = pg_url("tamper");
    let clock = Arc::new(ManualClock::new(start()));
    let log = pg_open(&url, &clock);
    runtime().block_on(async {
        intent_of(log.execute(start_and_reserve("run-t", charge("tampered", 100))).await);
        intent_of(log.execute(start_attempt("run-t", "tampered")).await);
    });
    let mut client = admin(&url);
    let refused = client.execute("UPDATE events SET payload = payload", &[]);
    assert!(refused.is_err(), "the trigger refuses an UPDATE");
    assert!(client.execute("DELETE FROM events", &[]).is_err(), "and a DELETE");
    assert!(PgReader::open(&url).expect("reader").verify().expect("reads").is_ok());
    // A superuser can switch the trigger off; verify still sees it.
    let stream = key("tampered").stream();
    client
        .batch_execute(&format!(
            "ALTER TABLE events DISABLE TRIGGER events_append_only; \
             UPDATE events SET payload = replace(payload, '100', '999') WHERE stream = '{stream}' AND stream_seq = 1; \
             ALTER TABLE events ENABLE TRIGGER events_append_only;"
        ))
        .expect("tampers");
    let seq: i64 = client
        .query_one("SELECT seq FROM events WHERE stream = $1 AND stream_seq = 1", &[&stream.as_str()])
        .expect("reads")
        .get(0);
    let report = PgReader::open(&url).expect("reader").verify().expect("reads");
    assert!(!report.is_ok());
    match report.first_mismatch() {
        Some(store_postgres::Mismatch::Event { seq: found, stream: on, detail }) => {
            assert_eq!((*found, on.as_str()), (u64::try_from(seq).expect("positive"), stream.as_str()));
            assert!(detail.contains("hash mismatch"), "{detail}");
        }
        other => panic!("the tampered event is named, got {other:?}"),
    }
    assert_eq!(report.mismatch_count, 1, "only the event, not its row: {:?}", report.mismatches);
    // An indexed column that contradicts its row's state misleads range reads: named too.
    client
        .batch_execute(&format!(
            "ALTER TABLE events DISABLE TRIGGER events_append_only; \
             UPDATE events SET payload = replace(payload, '999', '100') WHERE stream = '{stream}'; \
             ALTER TABLE events ENABLE TRIGGER events_append_only; \
             UPDATE intents SET status = 'reserved' WHERE key = '{}';",
            key("tampered").as_str()
        ))
        .expect("restores the event, tampers with a column");
    let report = PgReader::open(&url).expect("reader").verify().expect("reads");
    assert!(
        report
            .mismatches
            .iter()
            .any(|m| matches!(m, store_postgres::Mismatch::Intent { detail, .. } if detail.contains("column status"))),
        "{report}: {:?}",
        report.mismatches
    );
    // Removing a stream's last event is caught by the cross-check with its row.
    client
        .batch_execute(&format!(
            "ALTER TABLE events DISABLE TRIGGER events_append_only; \
             DELETE FROM events WHERE stream = '{stream}' AND stream_seq = 2; \
             ALTER TABLE events ENABLE TRIGGER events_append_only; \
             UPDATE intents SET status = 'attempting' WHERE key = '{}';",
            key("tampered").as_str()
        ))
        .expect("truncates the stream");
    let report = PgReader::open(&url).expect("reader").verify().expect("reads");
    assert!(
        matches!(report.first_mismatch(), Some(store_postgres::Mismatch::Intent { detail, .. }) if detail.contains("folds 2 events")),
        "{report}: {:?}",
        report.mismatches
    );
}

#[test]
fn postgres_verify_pages_find_every_tampering_across_their_boundaries_with_the_same_report() {
    let url = pg_url("tamper_paged");
    let clock = Arc::new(ManualClock::new(start()));
    let log = pg_open(&url, &clock);
    let ids: Vec<String> = (0..7).map(|n| format!("paged-{n}")).collect();
    runtime().block_on(async {
        for id in &ids {
            intent_of(log.execute(start_and_reserve(&format!("run-{id}"), charge(id, 100))).await);
            intent_of(log.execute(start_attempt(&format!("run-{id}"), id)).await);
        }
    });
    log.shutdown();
    let clean = PgReader::open(&url).expect("reader").verify().expect("reads");
    assert!(clean.is_ok(), "{clean}");
    // An event, a run's row, and an intent and a run whose rows were moved to keys of no
    // stream: each a missing row and a row without events, found on different pages.
    let (event_on, run_row) = (key(&ids[1]).stream(), RunId::new("run-paged-3"));
    admin(&url)
        .batch_execute(&format!(
            "ALTER TABLE events DISABLE TRIGGER events_append_only; \
             UPDATE events SET payload = replace(payload, '100', '999') WHERE stream = '{event_on}' AND stream_seq = 1; \
             ALTER TABLE events ENABLE TRIGGER events_append_only; \
             UPDATE runs SET stream_len = stream_len + 1 WHERE run_id = '{run_row}'; \
             UPDATE intents SET key = key || '-moved' WHERE key = '{}'; \
             UPDATE runs SET run_id = run_id || '-moved' WHERE run_id = 'run-paged-6';",
            key(&ids[4]).as_str()
        ))
        .expect("tampers");
    let whole = PgReader::open(&url).expect("reader").verify().expect("reads");
    assert_eq!(whole.mismatch_count, 6, "{:#?}", whole.mismatches);
    assert_eq!((whole.streams, whole.intent_rows, whole.run_rows), (14, 7, 7), "{whole}");
    for page in [1, 2, 3] {
        let paged = PgReader::open(&url)
            .expect("reader")
            .with_verify_page(std::num::NonZeroUsize::new(page).expect("not zero"))
            .verify()
            .expect("reads");
        assert_eq!(paged, whole, "pages of {page} report as one page does");
    }
    let found = |wanted: &dyn Fn(&store_postgres::Mismatch) -> bool| whole.mismatches.iter().any(wanted);
    assert!(found(
        &|m| matches!(m, store_postgres::Mismatch::Event { detail, .. } if detail.contains("hash mismatch"))
    ));
    assert!(found(
        &|m| matches!(m, store_postgres::Mismatch::Run { run_id, detail } if run_id == "run-paged-3" && detail.contains("folds"))
    ));
    for moved in [key(&ids[4]).as_str().to_owned(), "run-paged-6".to_owned()] {
        let named = |m: &store_postgres::Mismatch| match m {
            store_postgres::Mismatch::Intent { key, detail }
            | store_postgres::Mismatch::Run { run_id: key, detail } => (key.clone(), detail.clone()),
            store_postgres::Mismatch::Event { .. } => (String::new(), String::new()),
        };
        assert!(
            found(&|m| named(m) == (moved.clone(), "missing: the stream has events but no row".to_owned())),
            "{moved}"
        );
        let ghost = format!("{moved}-moved");
        assert!(found(&|m| named(m) == (ghost.clone(), "a row without events".to_owned())), "{ghost}");
    }
}

#[test]
fn postgres_intents_and_runs_are_listed_whole_across_page_boundaries() {
    let url = pg_url("list_paged");
    let clock = Arc::new(ManualClock::new(start()));
    let log = pg_open(&url, &clock);
    let ids: Vec<String> = (0..7).map(|n| format!("listed-{n}")).collect();
    runtime().block_on(async {
        for (n, id) in ids.iter().enumerate() {
            intent_of(log.execute(start_and_reserve(&format!("run-{id}"), charge(id, 100))).await);
            if n % 2 == 0 {
                intent_of(log.execute(start_attempt(&format!("run-{id}"), id)).await);
            }
        }
    });
    log.shutdown();
    let listed = |page: usize, status: Option<IntentStatus>| {
        let mut reader = PgReader::open(&url).expect("reader").with_list_page(NonZeroUsize::new(page).expect("not 0"));
        let mut keys = Vec::new();
        let handed =
            reader.each_intent(status, &mut |intent| keys.push(intent.key().as_str().to_owned())).expect("reads");
        assert_eq!(handed, keys.len() as u64);
        keys
    };
    let runs = |page: usize| {
        let mut reader = PgReader::open(&url).expect("reader").with_list_page(NonZeroUsize::new(page).expect("not 0"));
        let mut found = Vec::new();
        reader
            .each_run(false, &mut |run, intents| {
                let keys: Vec<String> = intents.iter().map(|i| i.key().as_str().to_owned()).collect();
                found.push((run.run_id.as_str().to_owned(), keys));
            })
            .expect("reads");
        found
    };
    let every: Vec<String> = ids.iter().map(|id| key(id).as_str().to_owned()).collect();
    let attempting: Vec<String> = every.iter().step_by(2).cloned().collect();
    let reserved: Vec<String> = every.iter().skip(1).step_by(2).cloned().collect();
    let each_run: Vec<(String, Vec<String>)> =
        ids.iter().zip(&every).map(|(id, key)| (format!("run-{id}"), vec![key.clone()])).collect();
    for page in [1, 2, 3, 7, 8, 500] {
        assert_eq!(listed(page, None), every, "pages of {page}: every intent once, in key order");
        assert_eq!(listed(page, Some(IntentStatus::Attempting)), attempting, "pages of {page}");
        assert_eq!(listed(page, Some(IntentStatus::Reserved)), reserved, "pages of {page}");
        assert!(listed(page, Some(IntentStatus::Validated)).is_empty(), "pages of {page}");
        assert_eq!(runs(page), each_run, "pages of {page}: every run once, with its intent");
    }
    let (run, intents) =
        PgReader::open(&url).expect("reader").run_state(&RunId::new("run-listed-3")).expect("reads").expect("a run");
    assert_eq!((run.run_id.as_str(), intents.len()), ("run-listed-3", 1));
    assert!(PgReader::open(&url).expect("reader").run_state(&RunId::new("run-none")).expect("reads").is_none());
}

#[test]
fn postgres_a_recovery_that_raced_an_answer_on_a_range_read_runs_again_never_forks() {
    let url = pg_url("stale_range");
    let clock = Arc::new(ManualClock::new(start()));
    let (answering, recovering) = (pg_open(&url, &clock), pg_open(&url, &clock));
    let rt = runtime();
    let answering_log: Arc<dyn EventLog> = Arc::new(answering.clone());
    rt.block_on(leased_attempt(&answering_log, "run-raced", "raced", &LeaseOwner::named("dead")));
    clock.advance_ms(i64::try_from(engine::limits::LEASE_TTL_DEFAULT_MS).expect("small") + 1);
    // Hold the run's lock: the recovery reads the in-flight intent (a range read, no lock),
    // then stops at the run's lock…
    let mut holder = admin(&url);
    let run_lock = store_postgres::stream_lock_key(&RunId::new("run-raced").stream());
    holder.execute("SELECT pg_advisory_lock($1)", &[&run_lock]).expect("holds the run's lock");
    let recover = Command::new(Cause::recovery(), Action::Recover { owner: LeaseOwner::named("taker"), run: None });
    let recovery = {
        let log = recovering.clone();
        rt.spawn(async move { log.execute(recover).await })
    };
    assert_eq!(wait_for_lock_waiters(&url, 1), 1, "the recovery waits at the run's lock");
    // …while the attempt's answer commits on the intent's stream.
    let (answered, _) = intent_of(rt.block_on(answering.execute(succeed("raced", 1, 500))));
    assert_eq!(answered.status, IntentStatus::Validated);
    holder.execute("SELECT pg_advisory_unlock($1)", &[&run_lock]).expect("releases");
    match rt.block_on(recovery).expect("no panic") {
        Ok(Reply::Recovered(recovery)) => {
            assert!(recovery.recovered.is_empty(), "run again, it finds nothing in flight: {recovery:?}");
        }
        other => panic!("the recovery answers, got {other:?}"),
    }
    assert!(recovering.stats().retries >= 1, "its first attempt collided and ran again: {:?}", recovering.stats());
    let events = PgChecks(url.clone()).stream(&key("raced").stream());
    assert!(
        !events.iter().any(|e| matches!(e.event, Event::OutcomeUnknown { .. })),
        "no crash recorded over the answer"
    );
    PgChecks(url).verify().unwrap_or_else(|report| panic!("{report}"));
}

// ---- A COMMIT whose answer is lost ------------------------------------------------------

#[test]
fn postgres_a_cut_connection_before_during_or_after_commit_leaves_exactly_one_set_of_events() {
    let (direct, proxy, through) = behind_proxy("lost_commit");
    let clock = Arc::new(ManualClock::new(start()));
    let options = store_postgres::Options { writers: 1, ..Default::default() };
    let log = PgLog::open(&through, options, clock).expect("opens through the proxy");
    let rt = runtime();
    // Committed, answer lost: the lookup finds the id and the reply is answered.
    proxy.arm(Cut::AfterCommit { wait_ms: 200 });
    let (intent, fresh) = intent_of(rt.block_on(log.execute(start_and_reserve("run-lost-1", charge("lost-1", 100)))));
    assert!(fresh && intent.status == IntentStatus::Reserved);
    assert_eq!(log.stats().resolved_commits, 1, "the lost answer was resolved by the commit id");
    // Never committed: the lookup finds nothing and the command runs again.
    proxy.arm(Cut::BeforeCommit);
    let (_, fresh) = intent_of(rt.block_on(log.execute(start_and_reserve("run-lost-2", charge("lost-2", 100)))));
    assert!(fresh, "run again, it reserves");
    let stats = log.stats();
    assert_eq!(stats.resolved_commits, 1, "nothing committed the second time: not resolved as committed");
    assert!(stats.retries >= 1, "{stats:?}");
    // Cut inside the transaction, before its COMMIT: the server rolls back, it runs again.
    proxy.arm(Cut::MidTransaction { skip: 1 });
    let (_, fresh) = intent_of(rt.block_on(log.execute(start_and_reserve("run-lost-3", charge("lost-3", 100)))));
    assert!(fresh, "run again, it reserves");
    assert_eq!(log.stats().resolved_commits, 1, "a cut before COMMIT is never looked up as a commit");
    assert!(log.stats().retries > stats.retries, "{:?}", log.stats());
    let cuts = proxy.cuts();
    assert_eq!((cuts.after_commit, cuts.before_commit, cuts.mid_transaction), (1, 1, 1), "{cuts:?}");
    let checks = PgChecks(direct);
    for id in ["lost-1", "lost-2", "lost-3"] {
        let events = checks.stream(&key(id).stream());
        assert_eq!(events.len(), 1, "{id}: exactly one IntentReserved");
    }
    for run in ["run-lost-1", "run-lost-2", "run-lost-3"] {
        let started = checks.stream(&RunId::new(run).stream());
        assert_eq!(started.iter().filter(|e| matches!(e.event, Event::RunStarted { .. })).count(), 1);
    }
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn postgres_a_connection_cut_while_a_log_opens_is_connected_again_not_fatal() {
    let (direct, proxy, through) = behind_proxy("open_cut");
    let clock = Arc::new(ManualClock::new(start()));
    // The first open migrates: cut inside that transaction, then at its COMMIT; a later open
    // (nothing to migrate, the same transaction) after its COMMIT.
    for (n, cut) in
        [Cut::MidTransaction { skip: 2 }, Cut::BeforeCommit, Cut::AfterCommit { wait_ms: 20 }].into_iter().enumerate()
    {
        proxy.arm(cut);
        let options = store_postgres::Options { writers: 2, ..Default::default() };
        let log = PgLog::open(&through, options, clock.clone()).unwrap_or_else(|e| panic!("{cut:?}: {e}"));
        assert!(!proxy.is_armed(), "{cut:?} was made");
        let run = format!("run-open-{n}");
        let (intent, fresh) =
            intent_of(runtime().block_on(log.execute(start_and_reserve(&run, charge(&format!("open-{n}"), 100)))));
        assert!(fresh && intent.status == IntentStatus::Reserved, "{cut:?}");
        log.shutdown();
    }
    let cuts = proxy.cuts();
    assert_eq!((cuts.mid_transaction, cuts.before_commit, cuts.after_commit), (1, 1, 1), "{cuts:?}");
    PgChecks(direct).verify().unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn postgres_a_partition_holds_a_command_whole_then_it_goes_on_or_connects_again() {
    let (direct, proxy, through) = behind_proxy("partition");
    let clock = Arc::new(ManualClock::new(start()));
    let options = store_postgres::Options { writers: 1, ..Default::default() };
    let log = PgLog::open(&through, options, clock).expect("opens through the proxy");
    let rt = runtime();
    let checks = PgChecks(direct);
    for (n, heal) in [Heal::Resume, Heal::Close].into_iter().enumerate() {
        // Far longer than the test: only the heal ends it.
        proxy.arm(Cut::Partition { ms: 600_000, heal });
        let id = format!("partitioned-{n}");
        let answer = {
            let (log, command) = (log.clone(), start_and_reserve(&format!("run-partitioned-{n}"), charge(&id, 100)));
            rt.spawn(async move { log.execute(command).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while proxy.held() == 0 {
            assert!(std::time::Instant::now() < deadline, "{heal:?}: the command's connection reaches the partition");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(checks.stream(&key(&id).stream()).is_empty(), "{heal:?}: held before its transaction began");
        proxy.heal();
        let (intent, fresh) = intent_of(rt.block_on(answer).expect("no panic"));
        assert!(fresh && intent.status == IntentStatus::Reserved, "{heal:?}");
        assert_eq!(checks.stream(&key(&id).stream()).len(), 1, "{heal:?}: one IntentReserved");
        assert_eq!(proxy.held(), 0, "{heal:?}: nothing is held once healed");
    }
    assert_eq!(proxy.cuts().partitions, 2, "{:?}", proxy.cuts());
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn postgres_a_lost_commit_whose_lookup_loses_its_connection_too_connects_again_and_resolves() {
    let (direct, proxy, through) = behind_proxy("lost_lookup");
    let clock = Arc::new(ManualClock::new(start()));
    let options = store_postgres::Options { writers: 1, ..Default::default() };
    let log = PgLog::open(&through, options, clock).expect("opens through the proxy");
    let rt = runtime();
    // The COMMIT goes through, its answer never does; the connection closes 3 s later, and
    // the lookup's new connection is partitioned away, then closed.
    proxy.arm(Cut::AfterCommit { wait_ms: 3_000 });
    let answer = {
        let (log, command) = (log.clone(), start_and_reserve("run-lost-lookup", charge("lost-lookup", 100)));
        rt.spawn(async move { log.execute(command).await })
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    until("the COMMIT is forwarded", &|| proxy.cuts().after_commit == 1);
    proxy.arm(Cut::Partition { ms: 600_000, heal: Heal::Close });
    until("the lookup's connection is held", &|| proxy.held() > 0);
    proxy.heal();
    let (intent, fresh) = intent_of(rt.block_on(answer).expect("no panic"));
    assert!(fresh && intent.status == IntentStatus::Reserved, "answered as committed: {intent:?}");
    assert_eq!(log.stats().resolved_commits, 1, "resolved by the commit id: {:?}", log.stats());
    let checks = PgChecks(direct);
    assert_eq!(checks.stream(&key("lost-lookup").stream()).len(), 1, "one IntentReserved");
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}

// ---- Group commit: commands taken together, one COMMIT ------------------------------------

/// A test's hold on the lock of a run's stream (a session lock on a connection of its own):
/// a command that reads that run waits at it.
struct Holds {
    holder: ::postgres::Client,
    url: String,
}

impl Holds {
    fn new(url: &str) -> Self {
        Self { holder: admin(url), url: url.to_owned() }
    }

    fn hold(&mut self, run_id: &str) {
        let lock = store_postgres::stream_lock_key(&RunId::new(run_id).stream());
        self.holder.execute("SELECT pg_advisory_lock($1)", &[&lock]).expect("holds the run's lock");
    }

    fn release(&mut self, run_id: &str) {
        let lock = store_postgres::stream_lock_key(&RunId::new(run_id).stream());
        self.holder.execute("SELECT pg_advisory_unlock($1)", &[&lock]).expect("releases the run's lock");
    }

    /// Returns once a command waits at one of the held locks.
    fn until_one_waits(&mut self) {
        assert_eq!(wait_for_lock_waiters(&self.url, 1), 1, "a command waits at a held lock");
    }
}

type Answer<'a> = engine::provider::BoxFuture<'a, Result<Reply, LogError>>;

/// Hands `command` to `log`'s writers and returns the pending answer: polled once, it is in
/// their channel.
fn queue(log: &PgLog, command: Command) -> Answer<'_> {
    let mut answer = log.execute(command);
    let polled = answer.as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
    assert!(polled.is_pending(), "the one writer is busy: the command waits in its channel");
    answer
}

/// Runs `batch` (its first command reads run `first_run`) as one batch of `log`'s one
/// writer: a gate command holds the writer while the batch is queued behind it; once the gate
/// is answered the writer takes the whole queue and stops at `first_run`'s lock, where
/// `arm` runs before it is let go. Each command's answer, in order.
fn run_batch(
    log: &PgLog,
    url: &str,
    gate: &str,
    first_run: &str,
    batch: Vec<Command>,
    arm: impl FnOnce(),
) -> Vec<Result<Reply, LogError>> {
    let rt = runtime();
    let mut holds = Holds::new(url);
    let gate_run = format!("run-{gate}");
    holds.hold(&gate_run);
    holds.hold(first_run);
    let gated = queue(log, start_and_reserve(&gate_run, charge(gate, 100)));
    holds.until_one_waits();
    let answers: Vec<Answer<'_>> = batch.into_iter().map(|command| queue(log, command)).collect();
    holds.release(&gate_run);
    assert!(intent_of(rt.block_on(gated)).1, "the gate reserves, alone in its transaction");
    holds.until_one_waits();
    arm();
    holds.release(first_run);
    answers.into_iter().map(|answer| rt.block_on(answer)).collect()
}

fn one_writer(url: &str) -> PgLog {
    let options = store_postgres::Options { writers: 1, ..Default::default() };
    PgLog::open(url, options, Arc::new(ManualClock::new(start()))).expect("the postgres log opens")
}

/// An outcome for an intent nobody reserved: refused after reading (and locking) it.
fn refused_outcome() -> Command {
    succeed("never-reserved", 1, 100)
}

#[test]
fn postgres_a_refused_or_failing_command_in_a_batch_is_undone_alone_and_the_others_commit() {
    let url = pg_url("batch_refused");
    let log = one_writer(&url);
    // The server refuses to write the row of intent "boom": its command fails after its events
    // were inserted, so only its savepoint's rollback keeps them out of the log.
    admin(&url)
        .batch_execute(
            "CREATE FUNCTION keel_test_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.key LIKE '%boom%' THEN RAISE EXCEPTION 'the test refuses intent boom'; END IF; RETURN NEW; \
             END $$; \
             CREATE TRIGGER keel_test_boom BEFORE INSERT OR UPDATE ON intents FOR EACH ROW EXECUTE FUNCTION keel_test_boom()",
        )
        .expect("creates the trigger");
    let batch = vec![
        start_and_reserve("run-b1", charge("b1", 100)),
        refused_outcome(),
        start_and_reserve("run-boom", charge("boom", 100)),
        start_and_reserve("run-b4", charge("b4", 100)),
    ];
    let mut answers = run_batch(&log, &url, "gate", "run-b1", batch, || {}).into_iter();
    let mut next = || answers.next().expect("four answers");
    assert!(intent_of(next()).1, "the first reserves");
    let refused = next();
    assert!(matches!(refused, Err(LogError::Refused(_))), "the second is refused: {refused:?}");
    let failed = next();
    assert!(
        matches!(&failed, Err(LogError::Unavailable { maybe_committed: false, .. })),
        "the third fails, not committed: {failed:?}"
    );
    assert!(intent_of(next()).1, "the last reserves after them");
    let stats = log.stats();
    assert_eq!((stats.commands, stats.commits), (5, 2), "the gate alone, then one COMMIT for four: {stats:?}");
    let checks = PgChecks(url);
    for id in ["gate", "b1", "b4"] {
        assert_eq!(checks.stream(&key(id).stream()).len(), 1, "{id}: reserved once");
    }
    assert!(checks.stream(&key("never-reserved").stream()).is_empty(), "the refused one wrote nothing");
    assert!(checks.stream(&key("boom").stream()).is_empty(), "the failed one's events were rolled back");
    assert!(checks.stream(&RunId::new("run-boom").stream()).is_empty(), "its run's too");
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn postgres_commands_on_one_entity_in_a_batch_decide_in_order_each_over_the_one_before() {
    let url = pg_url("batch_order");
    let log = one_writer(&url);
    // Each but the first is refused unless it sees what the one before it wrote.
    let batch = vec![start_and_reserve("run-o", charge("o", 100)), start_attempt("run-o", "o"), succeed("o", 1, 100)];
    let answers = run_batch(&log, &url, "gate", "run-o", batch, || {});
    let statuses: Vec<IntentStatus> = answers.into_iter().map(|answer| intent_of(answer).0.status).collect();
    assert_eq!(statuses, [IntentStatus::Reserved, IntentStatus::Attempting, IntentStatus::Validated]);
    let stats = log.stats();
    assert_eq!((stats.commands, stats.commits), (4, 2), "one COMMIT for the three: {stats:?}");
    let checks = PgChecks(url);
    let types: Vec<&str> = checks.stream(&key("o").stream()).iter().map(|e| e.event.type_name()).collect();
    assert_eq!(types.len(), 3, "one event per command, in order: {types:?}");
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}

#[test]
fn postgres_a_batch_whose_commit_answer_is_lost_is_all_answered_or_all_run_again() {
    let (direct, proxy, through) = behind_proxy("batch_lost_commit");
    let log = one_writer(&through);
    let batch = |n: u32| {
        vec![
            start_and_reserve(&format!("run-l{n}-a"), charge(&format!("l{n}-a"), 100)),
            refused_outcome(),
            start_and_reserve(&format!("run-l{n}-b"), charge(&format!("l{n}-b"), 100)),
        ]
    };
    let check = |n: u32, answers: Vec<Result<Reply, LogError>>| {
        let mut answers = answers.into_iter();
        assert!(intent_of(answers.next().expect("three answers")).1, "batch {n}: the first reserves");
        let refused = answers.next().expect("three answers");
        assert!(matches!(refused, Err(LogError::Refused(_))), "batch {n}: refused: {refused:?}");
        assert!(intent_of(answers.next().expect("three answers")).1, "batch {n}: the last reserves");
    };
    // Committed, answer lost: the batch's one commit id is found and every reply answered.
    let answers = run_batch(&log, &direct, "gate-1", "run-l1-a", batch(1), || {
        proxy.arm(Cut::AfterCommit { wait_ms: 200 });
    });
    check(1, answers);
    let stats = log.stats();
    assert_eq!((stats.resolved_commits, stats.retries), (1, 0), "resolved as committed, nothing run again: {stats:?}");
    // Never committed: the id is not found and the whole batch runs again, its refusal too.
    let answers = run_batch(&log, &direct, "gate-2", "run-l2-a", batch(2), || proxy.arm(Cut::BeforeCommit));
    check(2, answers);
    let stats = log.stats();
    assert_eq!(stats.resolved_commits, 1, "the second was not committed: {stats:?}");
    assert_eq!(stats.retries, 3, "its three commands ran again: {stats:?}");
    let cuts = proxy.cuts();
    assert_eq!((cuts.after_commit, cuts.before_commit), (1, 1), "{cuts:?}");
    let checks = PgChecks(direct);
    for id in ["gate-1", "l1-a", "l1-b", "gate-2", "l2-a", "l2-b"] {
        assert_eq!(checks.stream(&key(id).stream()).len(), 1, "{id}: exactly one IntentReserved");
    }
    checks.verify().unwrap_or_else(|report| panic!("{report}"));
}
