//! Rows as `store/FORMAT.md` lays them out. A compact event's payload leaves out what its
//! stream's name says ("What a compact payload leaves out"), and only when the name can be
//! split back into it; an intent's row leaves out its definition, which its reservation holds
//! ("Entity rows"). Either way a reader gets the whole back.

use crate::support::{Fixture, charge, contains, key, start_and_reserve};
use engine::event::{Event, IntentKey};
use engine::provider::EffectKind;

/// Reserves a charge of `tenant`'s `intent_id` and returns the stored payload of its
/// `IntentReserved` (seq 3, after its run's start and journal link) and the event read back.
fn reserved(tenant: &str, intent_id: &str) -> (Vec<u8>, Event) {
    let fixture = Fixture::new();
    let mut spec = charge("o1", 100);
    spec.definition.key = IntentKey::new(EffectKind::Charge, tenant, intent_id);
    spec.definition.tenant = tenant.to_owned();
    spec.definition.intent_id = intent_id.to_owned();
    fixture.store.execute_blocking(start_and_reserve("run-1", spec)).expect("reserved");
    let stored: Vec<u8> = fixture
        .raw()
        .query_row("SELECT payload FROM events WHERE seq = 3", [], |row| row.get(0))
        .expect("the reservation's row");
    let mut events = fixture.store.reader().expect("a reader").events_since(2).expect("the events read back");
    (stored, events.remove(0).event)
}

/// The tenant and intent id an `IntentReserved` carries.
fn names(event: &Event) -> (&str, &str) {
    match event {
        Event::IntentReserved { intent, .. } => (intent.tenant.as_str(), intent.intent_id.as_str()),
        other => panic!("expected the reservation, got {other:?}"),
    }
}

#[test]
fn a_reservation_leaves_out_the_tenant_and_intent_id_its_stream_names_and_reads_back_whole() {
    let (stored, event) = reserved("tenant-plain", "intent-plain");
    assert!(!contains(&stored, b"tenant-plain"), "the tenant is in the stream's name");
    assert!(!contains(&stored, b"intent-plain"), "the intent id is in the stream's name");
    assert_eq!(names(&event), ("tenant-plain", "intent-plain"));
}

#[test]
fn a_tenant_holding_a_colon_is_kept_in_the_payload_because_the_key_cannot_be_split_back() {
    let (stored, event) = reserved("tenant:colon", "intent-colon");
    assert!(contains(&stored, b"tenant:colon"), "split at its first two ':' the key would say tenant 'tenant'");
    assert_eq!(names(&event), ("tenant:colon", "intent-colon"));
}

#[test]
fn an_intents_row_leaves_out_the_definition_its_reservation_holds() {
    let fixture = Fixture::new();
    fixture.store.execute_blocking(start_and_reserve("run-1", charge("intent-000001", 100))).expect("reserved");
    let state: Vec<u8> =
        fixture.raw().query_row("SELECT state FROM intents", [], |row| row.get(0)).expect("the intent's row");
    // The order id is the definition's `order_id`, its `business_ref` and inside its `payload`.
    assert!(!contains(&state, b"order-intent-000001"), "the definition is stored once, in the reservation");
    let row = fixture.store.reader().expect("a reader").intent(&key("intent-000001")).expect("read").expect("a row");
    assert_eq!((row.order_id.as_str(), row.amount_minor), ("order-intent-000001", 100));
}
