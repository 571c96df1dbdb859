//! Flow control toward a provider (`--provider-rate-per-s`): two tenants, one submitting
//! twenty times what the other does, through `keel serve` against a simulator declared to take
//! N requests a second. Counted at the simulator: no second holds more than N requests; the
//! small tenant's charges wait a turn or two, not the big tenant's whole batch; nothing is lost.

use crate::cli::{start_sim, temp};
use crate::serve::{OTHER_TENANT, Serve, bearer, charge_body, create_key};
use std::time::{Duration, Instant};
use testkit::sample::TENANT;

/// The provider's declared rate.
const RATE_PER_S: usize = 5;
/// The big tenant's charges, and the small one's: twenty times fewer.
const BIG: usize = 40;
const SMALL: usize = 2;

#[test]
fn a_rate_limited_provider_never_sees_more_than_its_rate_and_a_small_tenant_is_not_starved() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let big = bearer(&create_key(&db, TENANT, "submit", "big-svc"));
    let small = bearer(&create_key(&db, OTHER_TENANT, "submit", "small-svc"));
    let serve = Serve::start(&db, &sim, &["--provider-rate-per-s", &RATE_PER_S.to_string()]);
    let charge = |auth: &str, id: String| {
        let started = Instant::now();
        let headers = [("Authorization", auth), ("Idempotency-Key", id.as_str()), ("Content-Type", "application/json")];
        let (status, _, answer) =
            serve.call("POST", "/v1/charges", &headers, Some(&charge_body(&format!("o_{id}"), 1000)));
        assert_eq!((status, answer["status"].as_str()), (200, Some("validated")), "{id}: {answer}");
        started.elapsed()
    };
    let (big_waits, small_waits) = std::thread::scope(|scope| {
        let big_runs: Vec<_> = (0..BIG)
            .map(|n| {
                let id = format!("flow_big_{n:04}_charge");
                let (charge, big) = (&charge, &big);
                scope.spawn(move || charge(big, id))
            })
            .collect();
        // The big batch is queued first; then the small tenant's charges arrive.
        std::thread::sleep(Duration::from_millis(500));
        let small_runs: Vec<_> = (0..SMALL)
            .map(|n| {
                let id = format!("flow_small_{n:04}_charge");
                let (charge, small) = (&charge, &small);
                scope.spawn(move || charge(small, id))
            })
            .collect();
        let waits = |runs: Vec<std::thread::ScopedJoinHandle<'_, Duration>>| -> Vec<Duration> {
            runs.into_iter().map(|run| run.join().expect("a charge thread")).collect()
        };
        (waits(big_runs), waits(small_runs))
    });

    let mut sent: Vec<i64> = provider_sim::list_effects(&dir.path().join("sim.db"))
        .expect("the simulator's effects")
        .iter()
        .map(|effect| effect.created_at_ms)
        .collect();
    assert_eq!(sent.len(), BIG + SMALL, "every charge made exactly one effect, none lost");
    sent.sort_unstable();
    for (n, at) in sent.iter().enumerate() {
        let within_a_second = sent[n..].iter().take_while(|later| **later < at + 1_000).count();
        assert!(within_a_second <= RATE_PER_S, "{within_a_second} requests in the second from {at}: {sent:?}");
    }
    // The small tenant waits for a turn of the big one per charge, not for the big batch: its
    // slowest charge is bounded by a few spacings, the big batch's last by its whole length.
    let spacing = Duration::from_secs_f64(1.0 / RATE_PER_S as f64);
    let small_slowest = small_waits.iter().max().copied().unwrap_or_default();
    let big_slowest = big_waits.iter().max().copied().unwrap_or_default();
    assert!(small_slowest <= spacing * (2 * SMALL as u32 + 4), "the small tenant waited {small_slowest:?}");
    assert!(big_slowest >= spacing * (BIG as u32 - 1), "the big batch was paced: {big_slowest:?}");
}

#[test]
fn a_rate_that_is_no_rate_is_refused_before_anything_is_written() {
    let (dir, db) = temp();
    let sim = start_sim(dir.path(), None);
    let too_high = (engine::limits::PROVIDER_RATE_PER_S_MAX + 1).to_string();
    for rate in ["0", "-1", "many", too_high.as_str()] {
        let flag = format!("--provider-rate-per-s={rate}");
        let mut args = vec!["--provider", sim.url(), flag.as_str()];
        args.extend(crate::cli::charge_args("flow_bad_rate_charge", "1000"));
        let (code, out, _) = crate::agent::keel_raw(&db, &args, &[]);
        assert_eq!(code, 64, "{rate}: {out}");
        assert!(out.contains("--provider-rate-per-s"), "{rate}: {out}");
        assert!(!db.exists(), "{rate}: nothing is written");
    }
}
