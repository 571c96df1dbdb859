//! Durability: effects and stored answers survive a restart on the same database, and records
//! left in flight by a killed simulator are completed on start.

use crate::support::{NO_FAULTS, Sim, charge};
use engine::provider::{CallOutcome, EffectKind, LookupOutcome, PaymentProvider, UnknownReason};

#[tokio::test]
async fn effects_and_answers_survive_a_restart() {
    let sim = Sim::start(r#"{"rules": [{"operation": "charge", "fault": "decline", "times": 1}]}"#).await;
    let provider = sim.provider();
    let declined = charge("r_0001", 4900);
    let charged = charge("r_0002", 1500);
    assert!(matches!(provider.execute(&declined).await, CallOutcome::Declined { .. }));
    let first = provider.execute(&charged).await;
    assert!(matches!(first, CallOutcome::Succeeded(_)), "{first:?}");
    let before = sim.effects();
    let (dir, db) = sim.stop().await;

    let sim = Sim::restart(dir, db, NO_FAULTS).await;
    let provider = sim.provider();
    assert_eq!(sim.effects(), before);
    assert_eq!(provider.execute(&charged).await, first, "the stored success is replayed");
    assert_eq!(
        provider.execute(&declined).await,
        CallOutcome::Declined { code: "generic_decline".into() },
        "the stored decline is replayed even without the fault"
    );
    assert!(matches!(provider.lookup(EffectKind::Charge, &charged.idempotency_key).await, LookupOutcome::Found(_)));
    let changed = engine::provider::EffectRequest { amount_minor: 1, ..charged.clone() };
    assert!(matches!(provider.execute(&changed).await, CallOutcome::Unknown { reason: UnknownReason::Protocol, .. }));
    assert_eq!(sim.effects().len(), 1);
}

#[tokio::test]
async fn records_left_in_flight_are_completed_on_start() {
    let sim = Sim::start(NO_FAULTS).await;
    let provider = sim.provider();
    let request = charge("r_0003", 4900);
    let first = provider.execute(&request).await;
    let (dir, db) = sim.stop().await;

    // What a simulator killed during a hold leaves behind: the effect and its answer committed,
    // the record still in flight.
    {
        let conn = rusqlite::Connection::open(&db).unwrap_or_else(|e| panic!("the db opens: {e}"));
        let changed = conn
            .execute("UPDATE idempotency SET state = 'in_flight' WHERE key = ?1", [&request.idempotency_key])
            .unwrap_or_else(|e| panic!("the record can be reset: {e}"));
        assert_eq!(changed, 1);
    }

    let sim = Sim::restart(dir, db, NO_FAULTS).await;
    let provider = sim.provider();
    assert_eq!(provider.execute(&request).await, first, "completed, not stuck at 409");
    assert_eq!(sim.effects().len(), 1);
}
