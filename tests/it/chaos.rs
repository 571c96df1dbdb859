//! Chaos on PostgreSQL through the real binary: `keel soak --store postgres://…` on the
//! suite's throwaway cluster (installed when missing; one that cannot start fails the test,
//! never skips). Four `keel worker` processes, two submitters a round sending the same keys,
//! a simulator playing every fault kind, workers SIGKILLed and restarted or SIGSTOPped past
//! their lease, and the soak's own TCP proxy cutting connections mid-transaction, instead of
//! `COMMIT` and after it, and partitioning a worker away past its lease; then the heal and every
//! invariant (the fenced workers' late answers counted, kept as evidence). Seeded, a fresh
//! seed each run: a failure names its seed, and `KEEL_SEED=N` replays its schedule, workload
//! and faults (where a kill lands within a child still depends on the machine).

use serde_json::Value;
use std::process::Command;

/// Enough SIGKILLs for every cut kind, worker kills and a stall, in seconds on two cores.
const KILLS: &str = "30";

#[test]
fn four_workers_on_postgres_keep_every_invariant_through_kills_stalls_and_cut_connections() {
    let seed: u64 = match std::env::var("KEEL_SEED") {
        Ok(seed) => seed.parse().unwrap_or_else(|_| panic!("KEEL_SEED={seed} is not a number")),
        Err(_) => u64::from(uuid::Uuid::new_v4().as_fields().0),
    };
    let cluster = store_postgres::cluster::shared().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("a temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--json", "soak", "--kills", KILLS, "--seed", &seed.to_string(), "--dir"])
        .arg(dir.path())
        // The server's administrative database: the soak runs in a fresh one beside it.
        .env("KEEL_STORE", cluster.admin_url())
        .env_remove("KEEL_DB")
        .env_remove("KEEL_FAILPOINT")
        .env_remove("KEEL_VAULT_KEY")
        .output()
        .expect("keel soak runs");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    let files = if output.status.success() { dir.path().to_owned() } else { dir.keep() };
    let replay = format!("seed {seed}: replay with KEEL_SEED={seed}; files in {}", files.display());
    let context = format!("{replay}\n{report:#}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{context}");
    assert_eq!((report["store"].as_str(), report["seed"].as_u64()), (Some("postgres"), Some(seed)), "{context}");
    assert!(report["kills"].as_u64().is_some_and(|k| k >= 30), "{context}");
    // The chaos happened: a test whose faults never fired proves nothing.
    for moment in ["mid_transaction", "before_commit", "after_commit", "partitions"] {
        assert!(report["proxy_cuts"][moment].as_u64().is_some_and(|n| n > 0), "no cut {moment}: {context}");
    }
    assert!(report["fenced_late_answers"].as_u64().is_some(), "the late answers kept are counted: {context}");
    for happened in ["recovery_kills", "stalls", "crash_unknowns", "effects"] {
        assert!(report[happened].as_u64().is_some_and(|n| n > 0), "no {happened}: {context}");
    }
    for counter in [
        "double_effects",
        "lost_answers",
        "refund_overdraws",
        "unreconciled",
        "unresolved",
        "verify_failures",
        "blind_resends",
        "write_ahead_violations",
        "budget_refills",
        "evidence_mismatches",
        "key_mismatches",
        "worker_exits",
    ] {
        assert_eq!(report[counter], 0, "{counter}: {context}");
    }
}
