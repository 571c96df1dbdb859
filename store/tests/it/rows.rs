//! The entity rows' indexed reads, as the decisions and the reader use them: an order's
//! intents (what a refund is held to), a run's row by its id, and one tenant's intents, their
//! counts by status and its runs, page by page (what `keel serve` answers a tenant's key).

use crate::support::{Fixture, charge, intent_of, key, start_and_reserve, start_attempt, succeed};
use engine::event::{Cause, IntentKey, RunId, RunStatus};
use engine::ledger::{Action, Command, IntentSpec, IntentStatus, Refusal, RejectCode};
use engine::log::LogError;
use engine::provider::EffectKind;
use store::RunState;

/// A refund of `amount_minor` EUR, intent `id`, of charge `charge_id`'s order.
fn refund_of(charge_id: &str, id: &str, amount_minor: i64) -> IntentSpec {
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

/// A charge of `amount_minor` EUR for `tenant`'s intent `id`.
fn charge_of(tenant: &str, id: &str, amount_minor: i64) -> IntentSpec {
    let mut spec = charge(id, amount_minor);
    spec.definition.key = IntentKey::new(EffectKind::Charge, tenant, id);
    spec.definition.tenant = tenant.to_owned();
    spec
}

/// Tenant t1's intents (two charges, one validated, and a refund of it, in runs 1–3) beside
/// those of t2 (run 4), of t1x, whose name t1 begins (run 5), and of a run that reserved for
/// both t1 and t2 (run 6), which is neither's; run 1 is finished.
fn tenants() -> Fixture {
    let fixture = Fixture::new();
    let store = &fixture.store;
    let reserve = |run: &str, spec: IntentSpec| {
        assert!(intent_of(store.execute_blocking(start_and_reserve(run, spec))).1, "{run} reserved");
    };
    reserve("run-1", charge_of("t1", "intent-000001", 100));
    store.execute_blocking(start_attempt("run-1", "intent-000001")).expect("attempt");
    store.execute_blocking(succeed("intent-000001", 1, 100)).expect("validated");
    reserve("run-2", charge_of("t1", "intent-000002", 200));
    reserve("run-3", refund_of("intent-000001", "refund-1", 60));
    reserve("run-4", charge_of("t2", "intent-000004", 400));
    reserve("run-5", charge_of("t1x", "intent-000005", 500));
    reserve("run-6", charge_of("t1", "intent-000006", 600));
    let second = Action::Reserve {
        run_id: RunId::new("run-6"),
        position: 1,
        spec: charge_of("t2", "intent-000007", 700),
        start_attempt: false,
    };
    assert!(
        intent_of(store.execute_blocking(Command::new(Cause::command("test").for_run(&RunId::new("run-6")), second))).1
    );
    let finish = Action::FinishRun { run_id: RunId::new("run-1"), status: RunStatus::Completed, detail: None };
    store.execute_blocking(Command::new(Cause::command("test"), finish)).expect("finished");
    fixture
}

#[test]
fn a_tenants_intents_are_listed_in_key_order_by_page_and_by_status() {
    let fixture = tenants();
    let reader = fixture.store.reader().expect("a reader");
    let page = |status, after: Option<&IntentKey>, limit| -> Vec<String> {
        reader.intents_page("t1", status, after, limit).expect("a page").into_iter().map(|row| row.key).collect()
    };
    let all = ["charge:t1:intent-000001", "charge:t1:intent-000002", "charge:t1:intent-000006", "refund:t1:refund-1"];
    assert_eq!(page(None, None, 10), all, "charges, then refunds; not t2's, not t1x's");
    assert_eq!(page(None, None, 2), all[..2]);
    assert_eq!(page(None, Some(&IntentKey::new(EffectKind::Charge, "t1", "intent-000002")), 10), all[2..]);
    assert_eq!(page(Some(IntentStatus::Validated), None, 10), all[..1]);
    let counts = reader.intent_counts("t1").expect("counts");
    assert_eq!(counts, [(IntentStatus::Reserved, 3), (IntentStatus::Validated, 1)]);
}

#[test]
fn a_tenants_runs_are_those_that_reserved_only_its_intents_listed_by_page_and_by_state() {
    let fixture = tenants();
    let reader = fixture.store.reader().expect("a reader");
    let page = |state, after: Option<&str>, limit| -> Vec<String> {
        let after = after.map(RunId::new);
        reader
            .runs_page("t1", state, after.as_ref(), limit)
            .expect("a page")
            .into_iter()
            .map(|row| row.run_id)
            .collect()
    };
    assert_eq!(page(None, None, 10), ["run-1", "run-2", "run-3"], "not run-6, which reserved for t2 too");
    assert_eq!(page(None, None, 2), ["run-1", "run-2"]);
    assert_eq!(page(None, Some("run-1"), 10), ["run-2", "run-3"]);
    assert_eq!(page(Some(RunState::Running), None, 1), ["run-2"], "the limit counts the runs kept");
    assert_eq!(page(Some(RunState::Finished(RunStatus::Completed)), None, 10), ["run-1"]);
}

#[test]
fn runs_are_matched_by_state_through_the_unfinished_ones_or_all() {
    let fixture = tenants();
    let reader = fixture.store.reader().expect("a reader");
    let matching = |state| -> Vec<String> {
        let filter = store::RunFilter { state, ..store::RunFilter::default() };
        reader.runs_matching(&filter).expect("runs").into_iter().map(|row| row.run_id).collect()
    };
    assert_eq!(matching(Some(RunState::Running)), ["run-2", "run-3", "run-4", "run-5", "run-6"]);
    assert_eq!(matching(None), ["run-1", "run-2", "run-3", "run-4", "run-5", "run-6"]);
}
