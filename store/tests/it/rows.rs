//! The entity rows' indexed reads, as the decisions and the reader use them: an order's
//! intents (what a refund is held to), a run's row by its id.

use crate::support::{Fixture, charge, intent_of, key, start_and_reserve, start_attempt, succeed};
use engine::event::{IntentKey, RunId};
use engine::ledger::{Refusal, RejectCode};
use engine::log::LogError;
use engine::provider::EffectKind;

/// A refund of `amount_minor` EUR, intent `id`, of charge `charge_id`'s order.
fn refund_of(charge_id: &str, id: &str, amount_minor: i64) -> engine::ledger::IntentSpec {
    let mut spec = charge(charge_id, amount_minor);
    spec.definition.key = IntentKey::new(EffectKind::Refund, "t1", id);
    spec.definition.kind = EffectKind::Refund;
    spec.definition.intent_id = id.to_owned();
    spec
}

#[test]
fn a_refund_is_held_to_what_its_order_was_charged_and_the_order_lists_both() {
    let fixture = Fixture::new();
    let store = &fixture.store;
    store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    store.execute_blocking(start_attempt("run-1", "intent-000001")).expect("attempt");
    store.execute_blocking(succeed("intent-000001", 1, 100)).expect("validated");

    let (refund, fresh) =
        intent_of(store.execute_blocking(start_and_reserve("run-2", refund_of("intent-000001", "refund-1", 60))));
    assert!(fresh, "60 of the 100 charged: {refund:?}");
    let beyond = store.execute_blocking(start_and_reserve("run-3", refund_of("intent-000001", "refund-2", 50)));
    match beyond {
        Err(LogError::Refused(Refusal::Rejected { code, .. })) => assert_eq!(code, RejectCode::InvariantViolated),
        other => panic!("60 + 50 refunded of 100 charged must be refused, got {other:?}"),
    }

    let listed = fixture.store.reader().expect("a reader").order_intents("t1", "order-intent-000001").expect("read");
    let keys: Vec<&str> = listed.iter().map(|intent| intent.key().as_str()).collect();
    assert_eq!(keys, [key("intent-000001").as_str(), "refund:t1:refund-1"], "in reservation order");
}

#[test]
fn a_runs_row_is_read_by_its_id() {
    let fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    let reader = fixture.store.reader().expect("a reader");
    let row = reader.run(&RunId::new("run-1")).expect("read").expect("run-1's row");
    assert_eq!((row.run_id.as_str(), row.status.as_str()), ("run-1", "running"));
    let (run, intents) = reader.run_state(&RunId::new("run-1")).expect("read").expect("run-1's state");
    assert_eq!(run.journal_len, 1);
    assert_eq!(intents.len(), 1);
    assert_eq!(reader.run_entity(&RunId::new("run-1")).expect("read"), Some(run));
}
