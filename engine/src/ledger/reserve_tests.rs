//! Reservation at the ledger's boundary, as a table: the intents an order and a run already
//! hold (each reserved by its own run, then validated, declined or left in flight), one more
//! reservation, and what [`decide`] makes of it — the events appended, by type, or the
//! rejection code that writes nothing. Every check of `decide::reserve` has a row on each
//! side of its boundary; the loop below is the only code.

use super::tests::nine_am;
use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, Event, IntentDefinition, IntentKey, RunId, RunLimits};
use crate::limits;
use crate::memory::MemoryLog;
use crate::money::Currency;
use crate::policy::{Governing, PolicyStamp, Rules};
use crate::provider::{CallOutcome, Capability, EffectKind, Evidence};
use std::sync::Arc;

const TENANT: &str = "0b9c7d2e-51aa-4f0e-8d3c-2a6f1e9b7c44";
const OTHER_TENANT: &str = "9e8d7c6b-5a49-4382-9170-6f5e4d3c2b1a";

/// How a prior intent stands when the row's reservation comes.
#[derive(Clone, Copy)]
enum Settled {
    /// Its first attempt is in flight.
    InFlight,
    /// The provider confirmed it.
    Validated,
    /// The provider declined it.
    Declined,
}

/// One intent: who reserves it, for what.
#[derive(Clone)]
struct Proposal {
    kind: EffectKind,
    tenant: &'static str,
    intent_id: &'static str,
    order: &'static str,
    amount_minor: i64,
    currency: &'static str,
    /// The run reserving it (a run reserving its first intent starts with it).
    run: &'static str,
    limits: RunLimits,
    /// The run's deadline, from the row's instant.
    deadline_ms: u64,
    /// Something else in the payload: same key, another fingerprint.
    note: &'static str,
    /// The policy in force where the reservation is sent.
    policy: Option<Governing>,
}

fn charge(intent_id: &'static str, order: &'static str, amount_minor: i64) -> Proposal {
    Proposal {
        kind: EffectKind::Charge,
        tenant: TENANT,
        intent_id,
        order,
        amount_minor,
        currency: "EUR",
        run: intent_id,
        limits: RunLimits::default(),
        deadline_ms: 3_600_000,
        note: "",
        policy: None,
    }
}

fn refund(intent_id: &'static str, order: &'static str, amount_minor: i64) -> Proposal {
    Proposal { kind: EffectKind::Refund, ..charge(intent_id, order, amount_minor) }
}

impl Proposal {
    fn in_run(self, run: &'static str) -> Self {
        Self { run, ..self }
    }

    fn in_currency(self, currency: &'static str) -> Self {
        Self { currency, ..self }
    }

    fn limited(self, limits: RunLimits) -> Self {
        Self { limits, ..self }
    }

    fn governed_by(self, policy: Governing) -> Self {
        Self { policy: Some(policy), ..self }
    }

    fn key(&self) -> IntentKey {
        IntentKey::new(self.kind, self.tenant, self.intent_id)
    }

    /// A charge's business reference is its order; a refund has its own.
    fn business_ref(&self) -> &'static str {
        match self.kind {
            EffectKind::Charge => self.order,
            EffectKind::Refund => self.intent_id,
        }
    }

    fn command(&self, log: &MemoryLog, now: chrono::DateTime<chrono::Utc>) -> Command {
        let payload = serde_json::json!({
            "order_id": self.order, "amount_minor": self.amount_minor, "currency": self.currency, "note": self.note,
        });
        let definition = IntentDefinition {
            key: self.key(),
            kind: self.kind,
            tenant: self.tenant.into(),
            intent_id: self.intent_id.into(),
            order_id: self.order.into(),
            business_ref: self.business_ref().into(),
            fingerprint: crate::canonical::fingerprint(&payload),
            amount_minor: self.amount_minor,
            currency: self.currency.into(),
            payload,
            tool: None,
        };
        let spec = IntentSpec { definition, capability: stripe(), approval_required: false };
        let run_id = RunId::new(self.run);
        let ledger = log.ledger();
        let existing = ledger.run(&run_id);
        let position = existing.map_or(0, |run| run.journal_len);
        let start = existing.is_none().then(|| RunStart {
            run_id: run_id.clone(),
            workflow: self.kind.as_str().into(),
            input: serde_json::json!({}),
            deadline_at: now + chrono::Duration::milliseconds(i64::try_from(self.deadline_ms).expect("small")),
            limits: self.limits.clone(),
            versions: Default::default(),
            owner: None,
        });
        let reserve = Action::Reserve { run_id: run_id.clone(), position, spec, start_attempt: true };
        Command::new(Cause::command("test").for_run(&run_id), reserve).starting(start).governed_by(self.policy.clone())
    }
}

/// A policy stamp of `version`.
fn stamp(version: &str) -> PolicyStamp {
    PolicyStamp { version: version.to_owned(), sha256: "ab".repeat(32) }
}

/// Rules that allow what the rows move.
fn loose() -> Rules {
    Rules {
        max_amount_minor: 1_000_000,
        approval_threshold_minor: None,
        run_budget_minor: 1_000_000,
        currencies: None,
        irreversible_without_approval: false,
    }
}

/// `rules` as a policy newer than the run's (which records none, or `v1`).
fn newer(rules: Rules) -> Governing {
    Governing { rules, stamp: stamp("v2"), approval_lowered: false }
}

fn stripe() -> Capability {
    Capability {
        dedup_by_key: true,
        lookup: true,
        key_window_ms: 86_400_000,
        consistency_window_ms: 0,
        request_timeout_ms: 0,
    }
}

/// What the reservation must come to.
enum Expect {
    /// These events, in order.
    Appends(&'static [&'static str]),
    /// Rejected with this code; nothing appended.
    Rejected(RejectCode),
}

struct Row {
    name: &'static str,
    given: Vec<(Proposal, Settled)>,
    proposal: Proposal,
    expect: Expect,
}

const NEW: &[&str] = &["RunStarted", "StepRecorded", "IntentReserved", "AttemptStarted"];

fn rows() -> Vec<Row> {
    use Expect::{Appends, Rejected};
    use RejectCode::{
        BudgetExhausted, IntentPayloadMismatch, InvalidArguments, InvariantViolated, PolicyDenied, ReferencePending,
    };
    use Settled::{Declined, InFlight, Validated};
    let paid = |amount| (charge("c1", "o1", amount), Validated);
    let budget = |max| RunLimits { cost_minor_max: Some(max), ..RunLimits::default() };
    let threshold = |at| RunLimits { approval_threshold_minor: Some(at), ..RunLimits::default() };
    vec![
        Row {
            name: "a new charge: the run starts with it and its first attempt is written ahead",
            given: vec![],
            proposal: charge("c1", "o1", 4_900),
            expect: Appends(NEW),
        },
        Row {
            name: "an amount of zero",
            given: vec![],
            proposal: charge("c1", "o1", 0),
            expect: Rejected(InvalidArguments),
        },
        Row {
            name: "an amount at the maximum, in a run whose budget covers it",
            given: vec![],
            proposal: charge("c1", "o1", limits::AMOUNT_MINOR_MAX).limited(budget(limits::AMOUNT_MINOR_MAX)),
            expect: Appends(NEW),
        },
        Row {
            name: "an amount at the maximum, in a run with the default budget",
            given: vec![],
            proposal: charge("c1", "o1", limits::AMOUNT_MINOR_MAX),
            expect: Rejected(BudgetExhausted),
        },
        Row {
            name: "an amount one above the maximum, whatever the budget",
            given: vec![],
            proposal: charge("c1", "o1", limits::AMOUNT_MINOR_MAX + 1).limited(budget(i64::MAX)),
            expect: Rejected(InvalidArguments),
        },
        Row {
            name: "a currency not in upper case",
            given: vec![],
            proposal: charge("c1", "o1", 4_900).in_currency("eur"),
            expect: Rejected(InvalidArguments),
        },
        Row {
            name: "a run that moves EUR asked to move USD too",
            given: vec![(charge("c1", "o1", 100), InFlight)],
            proposal: charge("c2", "o2", 100).in_currency("USD").in_run("c1"),
            expect: Rejected(InvalidArguments),
        },
        Row {
            name: "a run's second intent in its currency: linked, reserved, sent",
            given: vec![(charge("c1", "o1", 100), InFlight)],
            proposal: charge("c2", "o2", 100).in_run("c1"),
            expect: Appends(&["StepRecorded", "IntentReserved", "AttemptStarted"]),
        },
        Row {
            name: "a run past its deadline",
            given: vec![],
            proposal: Proposal { deadline_ms: 0, ..charge("c1", "o1", 100) },
            expect: Rejected(BudgetExhausted),
        },
        Row {
            name: "a second charge key for an order whose charge is in flight",
            given: vec![(charge("c1", "o1", 4_900), InFlight)],
            proposal: charge("c2", "o1", 4_900),
            expect: Rejected(ReferencePending),
        },
        Row {
            name: "a second charge key for an order whose charge was declined",
            given: vec![(charge("c1", "o1", 4_900), Declined)],
            proposal: charge("c2", "o1", 4_900),
            expect: Appends(NEW),
        },
        Row {
            name: "another tenant's order of the same name does not block",
            given: vec![(Proposal { tenant: OTHER_TENANT, ..charge("c1", "o1", 4_900) }, InFlight)],
            proposal: charge("c2", "o1", 4_900),
            expect: Appends(NEW),
        },
        Row {
            name: "a refund of the whole charge",
            given: vec![paid(4_900)],
            proposal: refund("r1", "o1", 4_900),
            expect: Appends(NEW),
        },
        Row {
            name: "a refund one above the charge",
            given: vec![paid(4_900)],
            proposal: refund("r1", "o1", 4_901),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a second refund that fills the charge exactly",
            given: vec![paid(4_900), (refund("r1", "o1", 4_000), InFlight)],
            proposal: refund("r2", "o1", 900),
            expect: Appends(NEW),
        },
        Row {
            name: "a second refund one above what is left (the first still in flight counts)",
            given: vec![paid(4_900), (refund("r1", "o1", 4_000), InFlight)],
            proposal: refund("r2", "o1", 901),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a declined refund gives its amount back",
            given: vec![paid(4_900), (refund("r1", "o1", 4_000), Declined)],
            proposal: refund("r2", "o1", 4_900),
            expect: Appends(NEW),
        },
        Row {
            name: "a refund of a charge still in flight: nothing is charged yet",
            given: vec![(charge("c1", "o1", 4_900), InFlight)],
            proposal: refund("r1", "o1", 1),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a refund of a declined charge",
            given: vec![(charge("c1", "o1", 4_900), Declined)],
            proposal: refund("r1", "o1", 1),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a refund in another currency than its order's charge",
            given: vec![paid(4_900)],
            proposal: refund("r1", "o1", 100).in_currency("USD"),
            expect: Rejected(InvalidArguments),
        },
        Row {
            name: "a refund of an order charged in two currencies, in the second",
            given: vec![paid(4_900), (charge("c2", "o1", 700).in_currency("USD"), Validated)],
            proposal: refund("r1", "o1", 700).in_currency("USD"),
            expect: Appends(NEW),
        },
        Row {
            name: "a refund in the second currency above what was charged in it",
            given: vec![paid(4_900), (charge("c2", "o1", 700).in_currency("USD"), Validated)],
            proposal: refund("r1", "o1", 701).in_currency("USD"),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a refund of another order",
            given: vec![paid(4_900)],
            proposal: refund("r1", "o2", 100),
            expect: Rejected(InvariantViolated),
        },
        Row {
            name: "a run's budget spent exactly",
            given: vec![(charge("c1", "o1", 600).limited(budget(1_000)), InFlight)],
            proposal: charge("c2", "o2", 400).in_run("c1"),
            expect: Appends(&["StepRecorded", "IntentReserved", "AttemptStarted"]),
        },
        Row {
            name: "a run's budget overspent by one",
            given: vec![(charge("c1", "o1", 600).limited(budget(1_000)), InFlight)],
            proposal: charge("c2", "o2", 401).in_run("c1"),
            expect: Rejected(BudgetExhausted),
        },
        Row {
            name: "a declined intent's money is back in its run's budget",
            given: vec![(charge("c1", "o1", 600).limited(budget(1_000)), Declined)],
            proposal: charge("c2", "o2", 1_000).in_run("c1"),
            expect: Appends(&["StepRecorded", "IntentReserved", "AttemptStarted"]),
        },
        Row {
            name: "an amount at the approval threshold is sent",
            given: vec![],
            proposal: charge("c1", "o1", 5_000).limited(threshold(5_000)),
            expect: Appends(NEW),
        },
        Row {
            name: "an amount above the approval threshold waits for a human",
            given: vec![],
            proposal: charge("c1", "o1", 5_001).limited(threshold(5_000)),
            expect: Appends(&["RunStarted", "StepRecorded", "IntentReserved"]),
        },
        Row {
            name: "a newer policy's lower maximum holds the run too",
            given: vec![],
            proposal: charge("c1", "o1", 3_001).governed_by(newer(Rules { max_amount_minor: 3_000, ..loose() })),
            expect: Rejected(PolicyDenied),
        },
        Row {
            name: "a newer policy's currencies hold the run too",
            given: vec![],
            proposal: charge("c1", "o1", 100).governed_by(newer(Rules {
                currencies: Some([Currency::parse("USD").expect("a code")].into()),
                ..loose()
            })),
            expect: Rejected(PolicyDenied),
        },
        Row {
            name: "a newer policy's lower budget holds the run too",
            given: vec![],
            proposal: charge("c1", "o1", 2_001).governed_by(newer(Rules { run_budget_minor: 2_000, ..loose() })),
            expect: Rejected(BudgetExhausted),
        },
        Row {
            name: "a newer policy's threshold holds the run too: the amount waits for a human",
            given: vec![],
            proposal: charge("c1", "o1", 1_001)
                .governed_by(newer(Rules { approval_threshold_minor: Some(1_000), ..loose() })),
            expect: Appends(&["RunStarted", "StepRecorded", "IntentReserved"]),
        },
        Row {
            name: "a newer, looser policy does not lift the run's own threshold",
            given: vec![],
            proposal: charge("c1", "o1", 5_001).limited(threshold(5_000)).governed_by(newer(loose())),
            expect: Appends(&["RunStarted", "StepRecorded", "IntentReserved"]),
        },
        Row {
            name: "a newer, looser policy does not lift the run's own budget",
            given: vec![],
            proposal: charge("c1", "o1", 2_001).limited(budget(2_000)).governed_by(newer(loose())),
            expect: Rejected(BudgetExhausted),
        },
        Row {
            name: "the run's own policy adds nothing to what the run recorded",
            given: vec![],
            proposal: charge("c1", "o1", 3_001)
                .limited(RunLimits { policy: Some(stamp("v1")), ..RunLimits::default() })
                .governed_by(Governing {
                    rules: Rules { max_amount_minor: 3_000, ..loose() },
                    stamp: stamp("v1"),
                    approval_lowered: false,
                }),
            expect: Appends(NEW),
        },
        Row {
            name: "the same key and payload, validated, from another run: linked and a repetition prevented",
            given: vec![paid(4_900)],
            proposal: charge("c1", "o1", 4_900).in_run("again"),
            expect: Appends(&["RunStarted", "StepRecorded", "IntentDeduplicated"]),
        },
        Row {
            name: "the same key and payload, in flight, from another run: linked, a resend refused, nothing sent",
            given: vec![(charge("c1", "o1", 4_900), InFlight)],
            proposal: charge("c1", "o1", 4_900).in_run("again"),
            expect: Appends(&["RunStarted", "StepRecorded", "ResendRefused"]),
        },
        Row {
            name: "the same key and payload, declined, from another run: linked, a resend refused",
            given: vec![(charge("c1", "o1", 4_900), Declined)],
            proposal: charge("c1", "o1", 4_900).in_run("again"),
            expect: Appends(&["RunStarted", "StepRecorded", "ResendRefused"]),
        },
        Row {
            name: "the same key and payload, declined, from its own run: nothing written",
            given: vec![(charge("c1", "o1", 4_900), Declined)],
            proposal: charge("c1", "o1", 4_900),
            expect: Appends(&[]),
        },
        Row {
            name: "the same key and payload, in flight, from its own run: nothing written",
            given: vec![(charge("c1", "o1", 4_900), InFlight)],
            proposal: charge("c1", "o1", 4_900),
            expect: Appends(&[]),
        },
        Row {
            name: "the same key with another payload",
            given: vec![paid(4_900)],
            proposal: Proposal { note: "changed", ..charge("c1", "o1", 4_900).in_run("again") },
            expect: Rejected(IntentPayloadMismatch),
        },
        Row {
            name: "the same intent id under another tenant is another intent",
            given: vec![paid(4_900)],
            proposal: Proposal { tenant: OTHER_TENANT, ..charge("c1", "o1", 4_900).in_run("again") },
            expect: Appends(NEW),
        },
    ]
}

/// Plays `given` into a log at nine o'clock: each proposal reserved, then settled.
fn history(given: &[(Proposal, Settled)]) -> MemoryLog {
    let log = MemoryLog::new(Arc::new(ManualClock::new(nine_am())));
    for (proposal, settled) in given {
        log.execute_now(&proposal.command(&log, nine_am()))
            .unwrap_or_else(|e| panic!("history: {} refused: {e}", proposal.intent_id));
        let outcome = match settled {
            Settled::InFlight => continue,
            Settled::Validated => CallOutcome::Succeeded(Evidence {
                provider_ref: format!("ch_{}", proposal.intent_id),
                amount_minor: proposal.amount_minor,
                currency: proposal.currency.into(),
            }),
            Settled::Declined => CallOutcome::Declined { code: "card_declined".into() },
        };
        let record = Action::RecordOutcome { key: proposal.key(), attempt: 1, outcome };
        log.execute_now(&Command::new(Cause::command("test"), record))
            .unwrap_or_else(|e| panic!("history: {}'s outcome refused: {e}", proposal.intent_id));
    }
    log
}

#[test]
fn each_reservation_appends_what_the_table_says_or_is_rejected_with_nothing_written() {
    for row in rows() {
        let log = history(&row.given);
        let before = log.events().len();
        let replied = log.execute_now(&row.proposal.command(&log, nine_am()));
        let appended: Vec<&str> = log.events()[before..].iter().map(|stored| stored.event.type_name()).collect();
        match (&row.expect, replied) {
            (Expect::Appends(types), Ok(_)) => assert_eq!(&appended, types, "{}", row.name),
            (Expect::Rejected(code), Err(crate::log::LogError::Refused(Refusal::Rejected { code: got, detail }))) => {
                assert_eq!(&got, code, "{}: {detail}", row.name);
                assert!(appended.is_empty(), "{}: a rejection writes nothing, appended {appended:?}", row.name);
            }
            (expected, replied) => panic!(
                "{}: expected {}, the log answered {replied:?} after appending {appended:?}",
                row.name,
                match expected {
                    Expect::Appends(types) => format!("{types:?}"),
                    Expect::Rejected(code) => code.as_str().to_owned(),
                }
            ),
        }
    }
}

/// The events a reservation appends are the ones the pure decision made.
#[test]
fn the_log_appends_exactly_what_decide_decided() {
    let log = history(&[(charge("c1", "o1", 4_900), Settled::Validated)]);
    let command = refund("r1", "o1", 4_900).command(&log, nine_am());
    let decision = decide(&log.ledger(), &super::boundary_tests::NoLeases, &command, nine_am()).expect("accepted");
    let before = log.events().len();
    log.execute_now(&command).expect("accepted");
    let appended: Vec<Event> = log.events()[before..].iter().map(|stored| stored.event.clone()).collect();
    assert_eq!(appended, decision.events);
}

/// The run a reservation writes into: open (not finished), at its next journal position, and
/// either known or started by this very command.
#[test]
fn a_reservation_goes_only_into_an_open_run_at_its_next_position() {
    let refusal = |log: &MemoryLog, command: &Command| match log.execute_now(command) {
        Err(crate::log::LogError::Refused(refusal)) => {
            format!("{refusal:?}").split([' ', '(', '{']).next().map(str::to_owned)
        }
        other => panic!("refused, got {other:?}"),
    };
    // A finished run takes nothing more.
    let log = history(&[(charge("c1", "o1", 100), Settled::Validated)]);
    let finish =
        Action::FinishRun { run_id: RunId::new("c1"), status: crate::event::RunStatus::Completed, detail: None };
    log.execute_now(&Command::new(Cause::command("test"), finish)).expect("finished");
    let late = charge("c2", "o2", 100).in_run("c1").command(&log, nine_am());
    assert_eq!(refusal(&log, &late).as_deref(), Some("RunFinished"));
    // Not the run's next journal position.
    let log = history(&[(charge("c1", "o1", 100), Settled::InFlight)]);
    let mut skipped = charge("c2", "o2", 100).in_run("c1").command(&log, nine_am());
    if let Action::Reserve { position, .. } = &mut skipped.action {
        *position += 1;
    }
    assert_eq!(refusal(&log, &skipped).as_deref(), Some("JournalPosition"));
    // A run neither known nor started by this command.
    let log = history(&[]);
    let mut stray = charge("c1", "o1", 100).command(&log, nine_am());
    if let Some(start) = stray.start_run.as_mut() {
        start.run_id = RunId::new("another-run");
    }
    assert_eq!(refusal(&log, &stray).as_deref(), Some("UnknownRun"));
    assert!(log.events().is_empty(), "nothing written");
}

/// A reservation whose approval the policy in force lowered records that policy's stamp, under
/// the run's own policy too; one it did not lower records none.
#[test]
fn a_lowered_approval_is_recorded_with_the_policy_that_lowered_it() {
    let own = RunLimits { policy: Some(stamp("v1")), ..RunLimits::default() };
    let lowering = Rules { irreversible_without_approval: true, ..loose() };
    let governing = Governing { rules: lowering, stamp: stamp("v1"), approval_lowered: false };
    for (name, governing, recorded) in
        [("lowered", governing.clone().lowering_approval(), Some(stamp("v1"))), ("not lowered", governing, None)]
    {
        let log = history(&[]);
        let proposal = charge("c1", "o1", 4_900).limited(own.clone()).governed_by(governing);
        log.execute_now(&proposal.command(&log, nine_am())).expect("reserved");
        let lowered_by = log.events().into_iter().find_map(|stored| match stored.event {
            Event::IntentReserved { approval_lowered_by, .. } => Some(approval_lowered_by),
            _ => None,
        });
        assert_eq!(lowered_by, Some(recorded), "{name}");
    }
}
