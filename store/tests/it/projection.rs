//! The `intents` projection as `keel intents` shows it: a validated intent's row names how it
//! was validated (`provider`, `reconciled`) and the provider's reference. (The equivalence
//! suite compares rows with `IntentRow::from_intent` itself, so it cannot see the words.)

use crate::support::{Fixture, charge, key, outcome, start_and_reserve, start_attempt, succeed};
use engine::event::{Cause, RunId};
use engine::ledger::{Action, Command};
use engine::provider::{CallOutcome, Evidence, LookupOutcome, UnknownReason};

/// `id`'s row: its status, source and reference.
fn row(fixture: &Fixture, id: &str) -> (String, Option<String>, Option<String>) {
    let rows = fixture.store.reader().expect("a reader").intents(None).expect("intents");
    let row = rows.into_iter().find(|r| r.key == key(id).as_str()).expect("the intent's row");
    (row.status, row.source, row.provider_ref)
}

#[test]
fn a_validated_intents_row_says_whether_the_provider_or_a_lookup_proved_it() {
    let fixture = Fixture::new();
    let store = &fixture.store;
    store.execute_blocking(start_and_reserve("run-1", charge("answered", 100))).expect("reserved");
    store.execute_blocking(start_attempt("run-1", "answered")).expect("started");
    store.execute_blocking(succeed("answered", 1, 100)).expect("validated");
    assert_eq!(row(&fixture, "answered"), ("validated".into(), Some("provider".into()), Some("ch_answered".into())));

    store.execute_blocking(start_and_reserve("run-2", charge("looked_up", 100))).expect("reserved");
    store.execute_blocking(start_attempt("run-2", "looked_up")).expect("started");
    let lost = CallOutcome::Unknown { reason: UnknownReason::Timeout, detail: "lost".into() };
    store.execute_blocking(outcome("looked_up", 1, lost)).expect("unknown");
    let reconcile = Action::StartReconciliation { key: key("looked_up"), force: true, run_id: RunId::new("run-2") };
    store.execute_blocking(Command::new(Cause::command("test"), reconcile)).expect("reconciling");
    let evidence = Evidence { provider_ref: "ch_found".into(), amount_minor: 100, currency: "EUR".into() };
    let lookup =
        Action::RecordLookup { key: key("looked_up"), reconciliation: 1, outcome: LookupOutcome::Found(evidence) };
    store.execute_blocking(Command::new(Cause::command("test"), lookup)).expect("found");
    assert_eq!(row(&fixture, "looked_up"), ("validated".into(), Some("reconciled".into()), Some("ch_found".into())));
}
