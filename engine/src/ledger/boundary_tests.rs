//! The ledger's boundary as a table: a history (commands already decided, time moved on),
//! one more command at that instant, and what [`decide`] makes of it — the events it
//! appends (by type) and the [`Next`] step its reply carries, or the refusal that writes
//! nothing. Each row is data; the loop below is the only code.

use super::tests::{evidence, key, nine_am, reserve, run, tier, variant};
use super::*;
use crate::clock::ManualClock;
use crate::event::{Cause, Event, RunId, RunLimits};
use crate::lease::{LeaseOwner, LeaseRow, LeaseView, Liveness};
use crate::limits;
use crate::memory::MemoryLog;
use crate::provider::{CallOutcome, Capability, Evidence, LookupOutcome, UnknownReason};
use std::sync::Arc;

/// One step of a history.
#[derive(Clone)]
enum Given {
    /// The charge reserved (the run started with it), its first attempt written ahead or not.
    Reserved { capability: Capability, limits: RunLimits, start_attempt: bool },
    /// What attempt `n` came to.
    Outcome(u32, CallOutcome),
    /// Reconciliation started (due or forced).
    ReconciliationStarted,
    /// What the lookup of reconciliation `n` answered.
    Lookup(u32, LookupOutcome),
    /// The next attempt started (the resend a proven absence, or a key, allows).
    Resent,
    /// The clock moves on.
    Later(u64),
}

/// What the command must come to.
enum Expect {
    /// These events, in order, and a reply naming the intent with this next step.
    Appends(&'static [&'static str], Next),
    /// Refused with this variant of [`Refusal`]; nothing appended.
    Refused(&'static str),
}

struct Row {
    name: &'static str,
    given: Vec<Given>,
    command: Action,
    expect: Expect,
}

fn charge() -> Given {
    Given::Reserved { capability: tier(true, true), limits: RunLimits::default(), start_attempt: true }
}

fn reserved_with(capability: Capability) -> Given {
    Given::Reserved { capability, limits: RunLimits::default(), start_attempt: true }
}

/// A Stripe-like provider whose requests may take `request_timeout_ms`.
fn slow(request_timeout_ms: u64) -> Capability {
    Capability { request_timeout_ms, ..tier(true, true) }
}

/// An unknown outcome whose first lookup could not answer, its second one due.
fn second_lookup_due(limits: RunLimits) -> Vec<Given> {
    vec![
        Given::Reserved { capability: tier(true, true), limits, start_attempt: true },
        Given::Outcome(1, timeout()),
        past_backoff(),
        Given::ReconciliationStarted,
        Given::Lookup(1, LookupOutcome::Unavailable { detail: "503".into() }),
        Given::Later(limits::reconcile_backoff_ms(2) + 1),
    ]
}

fn timeout() -> CallOutcome {
    CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "no answer in time".into() }
}

/// Past the first reconciliation's backoff.
fn past_backoff() -> Given {
    Given::Later(limits::reconcile_backoff_ms(1) + 1)
}

fn start_attempt() -> Action {
    Action::StartAttempt { key: key(), run_id: run() }
}

fn start_reconciliation() -> Action {
    Action::StartReconciliation { key: key(), force: false, run_id: run() }
}

fn record_outcome(attempt: u32, outcome: CallOutcome) -> Action {
    Action::RecordOutcome { key: key(), attempt, outcome }
}

fn record_lookup(reconciliation: u32, outcome: LookupOutcome) -> Action {
    Action::RecordLookup { key: key(), reconciliation, outcome }
}

/// The abandonment window of the table's rows.
const WINDOW_MS: u64 = 60_000;

fn abandon() -> Action {
    Action::Abandon { key: key(), run_id: run(), window_ms: WINDOW_MS }
}

fn not_sent() -> CallOutcome {
    CallOutcome::NotSent { detail: "connection refused".into() }
}

/// A charge allowed one reconciliation whose lookup could not answer: escalated, and nothing
/// proves its effect absent.
fn escalated_unproven() -> Vec<Given> {
    let limits = RunLimits { reconciliations_per_intent_max: 1, ..RunLimits::default() };
    vec![
        Given::Reserved { capability: tier(true, true), limits, start_attempt: true },
        Given::Outcome(1, timeout()),
        past_backoff(),
        Given::ReconciliationStarted,
        Given::Lookup(1, LookupOutcome::Unavailable { detail: "503".into() }),
    ]
}

fn rows() -> Vec<Row> {
    use Expect::{Appends, Refused};
    let unknown = || vec![charge(), Given::Outcome(1, timeout())];
    let reconciling = || {
        let mut given = unknown();
        given.extend([past_backoff(), Given::ReconciliationStarted]);
        given
    };
    vec![
        Row {
            name: "a second attempt while the first is in flight",
            given: vec![charge()],
            command: start_attempt(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "an outcome for an attempt never started",
            given: vec![charge()],
            command: record_outcome(2, timeout()),
            expect: Refused("NoSuchAttempt"),
        },
        Row {
            name: "the provider confirms the attempt",
            given: vec![charge()],
            command: record_outcome(1, CallOutcome::Succeeded(evidence("ch_1"))),
            expect: Appends(&["IntentValidated"], Next::Done),
        },
        Row {
            name: "the provider confirms another amount: not evidence, the outcome is unknown",
            given: vec![charge()],
            command: record_outcome(1, CallOutcome::Succeeded(Evidence { amount_minor: 1, ..evidence("ch_1") })),
            expect: Appends(
                &["OutcomeUnknown"],
                Next::WaitUntil {
                    until: nine_am() + chrono::Duration::milliseconds(limits::reconcile_backoff_ms(1) as i64),
                },
            ),
        },
        Row {
            name: "a timeout: unknown, reconciled after the backoff",
            given: vec![charge()],
            command: record_outcome(1, timeout()),
            expect: Appends(
                &["OutcomeUnknown"],
                Next::WaitUntil {
                    until: nine_am() + chrono::Duration::milliseconds(limits::reconcile_backoff_ms(1) as i64),
                },
            ),
        },
        Row {
            name: "a timeout at a provider with neither keys nor lookups: escalated at once",
            given: vec![reserved_with(tier(false, false))],
            command: record_outcome(1, timeout()),
            expect: Appends(&["OutcomeUnknown", "IntentEscalated"], Next::Done),
        },
        Row {
            name: "the request never left: the intent is ready again, after a backoff",
            given: vec![charge()],
            command: record_outcome(1, CallOutcome::NotSent { detail: "connection refused".into() }),
            expect: Appends(&["AttemptNotSent"], Next::Attempt { backoff_ms: limits::network_retry_backoff_ms(1) }),
        },
        Row {
            name: "a reconciliation before it is due",
            given: unknown(),
            command: start_reconciliation(),
            expect: Refused("NotDue"),
        },
        Row {
            name: "a resend while the outcome is unknown",
            given: {
                let mut given = unknown();
                given.push(past_backoff());
                given
            },
            command: start_attempt(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "a reconciliation once due",
            given: {
                let mut given = unknown();
                given.push(past_backoff());
                given
            },
            command: start_reconciliation(),
            expect: Appends(&["ReconciliationStarted"], Next::LookUp { reconciliation: 1 }),
        },
        Row {
            name: "a reconciliation at a provider without lookups",
            given: vec![reserved_with(tier(true, false)), Given::Outcome(1, timeout()), past_backoff()],
            command: start_reconciliation(),
            expect: Refused("NoLookup"),
        },
        Row {
            name: "keys but no lookups: the resend with the same key is the reconciliation",
            given: vec![reserved_with(tier(true, false)), Given::Outcome(1, timeout()), past_backoff()],
            command: start_attempt(),
            expect: Appends(&["AttemptStarted"], Next::Send { attempt: 2 }),
        },
        Row {
            name: "the lookup finds the effect",
            given: reconciling(),
            command: record_lookup(1, LookupOutcome::Found(evidence("ch_1"))),
            expect: Appends(&["ReconciliationResolved", "IntentValidated"], Next::Done),
        },
        Row {
            name: "the lookup proves the effect absent: a resend may be asked for",
            given: reconciling(),
            command: record_lookup(1, LookupOutcome::Absent),
            expect: Appends(&["ReconciliationResolved"], Next::Attempt { backoff_ms: 0 }),
        },
        Row {
            name: "proven absent with every attempt spent: escalated",
            given: {
                let limits = RunLimits { attempts_per_intent_max: 1, ..RunLimits::default() };
                let mut given = vec![
                    Given::Reserved { capability: tier(true, true), limits, start_attempt: true },
                    Given::Outcome(1, timeout()),
                ];
                given.extend([past_backoff(), Given::ReconciliationStarted]);
                given
            },
            command: record_lookup(1, LookupOutcome::Absent),
            expect: Appends(&["ReconciliationResolved", "IntentEscalated"], Next::Done),
        },
        Row {
            name: "keys but no lookups, every attempt spent: the resend that would reconcile escalates instead",
            given: vec![
                Given::Reserved {
                    capability: tier(true, false),
                    limits: RunLimits { attempts_per_intent_max: 1, ..RunLimits::default() },
                    start_attempt: true,
                },
                Given::Outcome(1, timeout()),
                past_backoff(),
            ],
            command: start_attempt(),
            expect: Appends(&["IntentEscalated"], Next::Done),
        },
        Row {
            name: "a resend's answer lost too: its reconciliation waits the second backoff",
            given: {
                let mut given = reconciling();
                given.extend([Given::Lookup(1, LookupOutcome::Absent), Given::Resent]);
                given
            },
            command: record_outcome(2, timeout()),
            expect: Appends(
                &["OutcomeUnknown"],
                Next::WaitUntil {
                    until: nine_am()
                        + chrono::Duration::milliseconds(
                            (limits::reconcile_backoff_ms(1) + 1 + limits::reconcile_backoff_ms(2)) as i64,
                        ),
                },
            ),
        },
        Row {
            name: "the resend after a proven absence, with the same key",
            given: {
                let mut given = reconciling();
                given.push(Given::Lookup(1, LookupOutcome::Absent));
                given
            },
            command: start_attempt(),
            expect: Appends(&["AttemptStarted"], Next::Send { attempt: 2 }),
        },
        Row {
            name: "the lookup could not answer: another reconciliation, later",
            given: {
                let mut given = reconciling();
                given.push(Given::Lookup(1, LookupOutcome::Unavailable { detail: "503".into() }));
                given
            },
            command: start_reconciliation(),
            expect: Refused("NotDue"),
        },
        Row {
            name: "a lookup answer for a reconciliation not started",
            given: reconciling(),
            command: record_lookup(2, LookupOutcome::Absent),
            expect: Refused("NoSuchLookup"),
        },
        Row {
            name: "an attempt too close to the deadline to reconcile after it: released, never sent",
            given: vec![
                Given::Reserved { capability: tier(true, true), limits: RunLimits::default(), start_attempt: false },
                Given::Later(3_600_000 - limits::reconciliation_reserve_ms(0, 1) + 1),
            ],
            command: start_attempt(),
            expect: Appends(&["IntentReleased"], Next::Done),
        },
        Row {
            name: "the reserve is the provider's request timeout plus the first backoff: exactly that is enough",
            given: vec![
                Given::Reserved { capability: slow(5_000), limits: RunLimits::default(), start_attempt: false },
                Given::Later(3_600_000 - 6_000),
            ],
            command: start_attempt(),
            expect: Appends(&["AttemptStarted"], Next::Send { attempt: 1 }),
        },
        Row {
            name: "a 5 s request timeout with 5.999 s left: released, its money and order freed",
            given: vec![
                Given::Reserved { capability: slow(5_000), limits: RunLimits::default(), start_attempt: false },
                Given::Later(3_600_000 - 5_999),
            ],
            command: start_attempt(),
            expect: Appends(&["IntentReleased"], Next::Done),
        },
        Row {
            name: "a resend after one reconciliation reserves the second backoff: exactly that is enough",
            given: {
                let mut given = reconciling();
                given.extend([
                    Given::Lookup(1, LookupOutcome::Absent),
                    Given::Later(
                        3_600_000 - (limits::reconcile_backoff_ms(1) + 1) - limits::reconciliation_reserve_ms(0, 2),
                    ),
                ]);
                given
            },
            command: start_attempt(),
            expect: Appends(&["AttemptStarted"], Next::Send { attempt: 2 }),
        },
        Row {
            name: "a resend after one reconciliation, a millisecond short of the second backoff: released",
            given: {
                let mut given = reconciling();
                given.extend([
                    Given::Lookup(1, LookupOutcome::Absent),
                    Given::Later(
                        3_600_000 - (limits::reconcile_backoff_ms(1) + 1) - limits::reconciliation_reserve_ms(0, 2) + 1,
                    ),
                ]);
                given
            },
            command: start_attempt(),
            expect: Appends(&["IntentReleased"], Next::Done),
        },
        Row {
            name: "an operator's forced lookup of an escalation nothing proved: started",
            given: escalated_unproven(),
            command: Action::StartReconciliation { key: key(), force: true, run_id: run() },
            expect: Appends(&["ReconciliationStarted"], Next::LookUp { reconciliation: 2 }),
        },
        Row {
            name: "an escalation whose effect is proven absent is not looked up again, even forced",
            given: {
                let limits = RunLimits { attempts_per_intent_max: 1, ..RunLimits::default() };
                let mut given = vec![
                    Given::Reserved { capability: tier(true, true), limits, start_attempt: true },
                    Given::Outcome(1, timeout()),
                ];
                given.extend([past_backoff(), Given::ReconciliationStarted, Given::Lookup(1, LookupOutcome::Absent)]);
                given
            },
            command: Action::StartReconciliation { key: key(), force: true, run_id: run() },
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "an escalation is looked up again only when an operator forces it",
            given: escalated_unproven(),
            command: start_reconciliation(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "a network retry past the run's own budget: refused, the intent stays reserved",
            given: vec![
                Given::Reserved {
                    capability: tier(true, true),
                    limits: RunLimits { network_retries_max: Some(0), ..RunLimits::default() },
                    start_attempt: true,
                },
                Given::Outcome(1, CallOutcome::NotSent { detail: "connection refused".into() }),
            ],
            command: start_attempt(),
            expect: Refused("NetworkRetriesSpent"),
        },
        Row {
            name: "the run's reconciliation budget spent: the unknown intent escalates, naming it",
            given: second_lookup_due(RunLimits { reconciliations_max: Some(1), ..RunLimits::default() }),
            command: start_reconciliation(),
            expect: Appends(&["IntentEscalated"], Next::Done),
        },
        Row {
            name: "within the run's reconciliation budget: the second lookup starts",
            given: second_lookup_due(RunLimits::default()),
            command: start_reconciliation(),
            expect: Appends(&["ReconciliationStarted"], Next::LookUp { reconciliation: 2 }),
        },
        Row {
            name: "a resend by key of an unknown outcome without the time: refused, the money stays held",
            given: vec![
                reserved_with(Capability { lookup: false, ..slow(5_000) }),
                Given::Outcome(1, timeout()),
                Given::Later(3_600_000 - 5_999),
            ],
            command: start_attempt(),
            expect: Refused("DeadlineReserve"),
        },
        Row {
            name: "a reserved intent's first attempt",
            given: vec![Given::Reserved {
                capability: tier(true, true),
                limits: RunLimits::default(),
                start_attempt: false,
            }],
            command: start_attempt(),
            expect: Appends(&["AttemptStarted"], Next::Send { attempt: 1 }),
        },
        Row {
            name: "a cancellation while an attempt is in flight",
            given: vec![charge()],
            command: Action::Cancel { key: key(), by: "ana".into(), reason: "customer asked".into() },
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "a cancellation before anything was sent",
            given: vec![Given::Reserved {
                capability: tier(true, true),
                limits: RunLimits::default(),
                start_attempt: false,
            }],
            command: Action::Cancel { key: key(), by: "ana".into(), reason: "customer asked".into() },
            expect: Appends(&["IntentCancelled"], Next::Done),
        },
        Row {
            name: "abandoning a charge whose attempt is in flight",
            given: vec![charge(), Given::Later(WINDOW_MS)],
            command: abandon(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "abandoning a never-sent charge a millisecond before its window closes",
            given: vec![charge(), Given::Outcome(1, not_sent()), Given::Later(WINDOW_MS - 1)],
            command: abandon(),
            expect: Refused("WaitingWindowOpen"),
        },
        Row {
            name: "a never-sent charge nobody re-submitted: abandoned when its window closes",
            given: vec![charge(), Given::Outcome(1, not_sent()), Given::Later(WINDOW_MS)],
            command: abandon(),
            expect: Appends(&["IntentAbandoned"], Next::Done),
        },
        Row {
            name: "a charge reserved and never attempted: its window counts from its run's start",
            given: vec![
                Given::Reserved { capability: tier(true, true), limits: RunLimits::default(), start_attempt: false },
                Given::Later(WINDOW_MS),
            ],
            command: abandon(),
            expect: Appends(&["IntentAbandoned"], Next::Done),
        },
        Row {
            name: "a charge proven absent nobody re-submitted: abandoned",
            given: {
                let mut given = reconciling();
                given.extend([Given::Lookup(1, LookupOutcome::Absent), Given::Later(WINDOW_MS)]);
                given
            },
            command: abandon(),
            expect: Appends(&["IntentAbandoned"], Next::Done),
        },
        Row {
            name: "an unknown charge only a resend could reconcile (keys, no lookup): escalated, never abandoned",
            given: vec![reserved_with(tier(true, false)), Given::Outcome(1, timeout()), Given::Later(WINDOW_MS)],
            command: abandon(),
            expect: Appends(&["IntentEscalated"], Next::Done),
        },
        Row {
            name: "an unknown charge with a lookup is reconciled, not abandoned",
            given: vec![charge(), Given::Outcome(1, timeout()), Given::Later(WINDOW_MS)],
            command: abandon(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "a validated charge is never abandoned",
            given: vec![charge(), Given::Outcome(1, CallOutcome::Succeeded(evidence("ch_1"))), Given::Later(WINDOW_MS)],
            command: abandon(),
            expect: Refused("WrongStatus"),
        },
        Row {
            name: "an abandonment window past any date",
            given: vec![charge(), Given::Outcome(1, not_sent())],
            command: Action::Abandon { key: key(), run_id: run(), window_ms: u64::MAX },
            expect: Refused("DurationOutOfRange"),
        },
        Row {
            name: "a read of the intent in flight",
            given: vec![charge()],
            command: Action::Observe { key: key() },
            expect: Appends(&[], Next::InFlight),
        },
    ]
}

/// No run is leased: the table is about the intent lifecycle, fencing has its own tests.
pub(super) struct NoLeases;

impl LeaseView for NoLeases {
    fn holder(&self, _run_id: &crate::event::RunId) -> Option<LeaseRow> {
        None
    }

    fn liveness(&self, _owner: &LeaseOwner) -> Liveness {
        Liveness::Unknown
    }

    fn ttl_ms(&self) -> u64 {
        limits::LEASE_TTL_DEFAULT_MS
    }
}

/// Plays `given` into a log; returns the log and the instant it ends at.
fn history(given: &[Given]) -> (MemoryLog, chrono::DateTime<chrono::Utc>) {
    let clock = Arc::new(ManualClock::new(nine_am()));
    let log = MemoryLog::new(clock.clone());
    let cause = || Cause::command("test").for_run(&run());
    for step in given {
        let command = match step {
            Given::Reserved { capability, limits, start_attempt } => {
                reserve(*capability, limits.clone(), *start_attempt)
            }
            Given::Outcome(attempt, outcome) => Command::new(cause(), record_outcome(*attempt, outcome.clone())),
            Given::ReconciliationStarted => Command::new(cause(), start_reconciliation()),
            Given::Lookup(n, outcome) => Command::new(cause(), record_lookup(*n, outcome.clone())),
            Given::Resent => Command::new(cause(), start_attempt()),
            Given::Later(ms) => {
                clock.advance_ms(i64::try_from(*ms).expect("a table's delay fits in i64"));
                continue;
            }
        };
        log.execute_now(&command).unwrap_or_else(|e| panic!("history step refused: {e}"));
    }
    let now = crate::clock::Clock::now(&*clock);
    (log, now)
}

#[test]
fn each_command_appends_what_the_table_says_or_is_refused_with_nothing_written() {
    for row in rows() {
        let (log, now) = history(&row.given);
        let command = Command::new(Cause::command("test").for_run(&run()), row.command.clone());
        let decided = decide(&log.ledger(), &NoLeases, &command, now);
        let before = log.events().len();
        let replied = log.execute_now(&command);
        let appended: Vec<Event> = log.events()[before..].iter().map(|stored| stored.event.clone()).collect();
        match (&row.expect, decided, replied) {
            (Expect::Appends(types, next), Ok(decision), Ok(reply)) => {
                let names: Vec<&str> = decision.events.iter().map(Event::type_name).collect();
                assert_eq!(&names, types, "{}", row.name);
                assert_eq!(appended, decision.events, "{}: the log appends what the decision says", row.name);
                match reply {
                    Reply::Intent { next: got, .. } => assert_eq!(&got, next, "{}", row.name),
                    other => panic!("{}: a reply naming the intent, got {}", row.name, other.kind()),
                }
            }
            (Expect::Refused(expected), Err(refusal), Err(_)) => {
                assert_eq!(&variant(&refusal), expected, "{}", row.name);
                assert!(appended.is_empty(), "{}: a refusal writes nothing", row.name);
            }
            (expected, decided, replied) => panic!(
                "{}: expected {}, decided {decided:?}, the log answered {replied:?}",
                row.name,
                match expected {
                    Expect::Appends(types, _) => format!("{types:?}"),
                    Expect::Refused(variant) => (*variant).to_owned(),
                }
            ),
        }
    }
}

/// An abandonment says whether the charge ever may have reached the provider: never, for one
/// proven never sent; once, for one proven absent after it was sent.
#[test]
fn an_abandoned_charge_says_whether_it_was_ever_sent() {
    let never_sent = |given: &[Given]| {
        let (log, now) = history(given);
        let command = Command::new(Cause::command("test").for_run(&run()), abandon());
        let decision = decide(&log.ledger(), &NoLeases, &command, now).expect("abandoned");
        match decision.events.as_slice() {
            [Event::IntentAbandoned { never_sent, window_ms, .. }] => {
                assert_eq!(*window_ms, WINDOW_MS);
                *never_sent
            }
            other => panic!("one IntentAbandoned, got {other:?}"),
        }
    };
    assert!(never_sent(&[charge(), Given::Outcome(1, not_sent()), Given::Later(WINDOW_MS)]));
    let mut proven_absent = vec![charge(), Given::Outcome(1, timeout()), past_backoff(), Given::ReconciliationStarted];
    proven_absent.extend([Given::Lookup(1, LookupOutcome::Absent), Given::Later(WINDOW_MS)]);
    assert!(!never_sent(&proven_absent));
}

/// Recovery records an attempt left in flight as unknown (crash) — reconciled later where the
/// provider keys or looks effects up, escalated at once where it does neither — and touches
/// only the run it was asked to recover.
#[test]
fn recovery_marks_what_was_in_flight_and_only_for_the_run_asked() {
    let recover = |capability: Capability, only: Option<RunId>| {
        let (log, now) = history(&[reserved_with(capability)]);
        let command =
            Command::new(Cause::recovery(), Action::Recover { owner: LeaseOwner::named("recovery"), run: only });
        let decision = decide(&log.ledger(), &NoLeases, &command, now).expect("recovers");
        decision.events.iter().map(Event::type_name).collect::<Vec<_>>()
    };
    assert_eq!(recover(tier(true, false), None), ["OutcomeUnknown"], "keys but no lookup: a resend by key reconciles");
    assert_eq!(recover(tier(false, true), None), ["OutcomeUnknown"], "a lookup reconciles");
    assert_eq!(recover(tier(false, false), None), ["OutcomeUnknown", "IntentEscalated"]);
    assert_eq!(recover(tier(true, true), Some(run())), ["OutcomeUnknown"], "the run asked");
    assert_eq!(recover(tier(true, true), Some(RunId::new("run-2"))), Vec::<&str>::new(), "another run's");
}

/// Controlled facts: a message that declares something is admitted as one event; a question
/// declares nothing and writes nothing (no turn taken).
#[test]
fn a_message_that_declares_nothing_writes_nothing() {
    use crate::facts::{ConversationId, declarations};
    let (log, now) = history(&[]);
    let conversation = ConversationId::parse("boundary-conversation").expect("a valid id");
    let apply = |message: &str| {
        let action = Action::ApplyFacts {
            conversation: conversation.clone(),
            ticket: None,
            message: message.to_owned(),
            candidates: declarations(message),
        };
        let decision =
            decide(&log.ledger(), &NoLeases, &Command::new(Cause::command("test"), action), now).expect("admitted");
        decision.events.iter().map(Event::type_name).collect::<Vec<_>>()
    };
    assert_eq!(apply("module=Reporting; database=PostgreSQL"), ["FactsAdmitted"]);
    assert_eq!(apply("Which module is slow?"), Vec::<&str>::new());
}
