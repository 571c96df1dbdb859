//! Shared set-up: a simulator on an ephemeral port with its own temporary database, and a
//! provider (Keel's Stripe client, with a test key) pointed at it with short timeouts so that
//! the suite runs in seconds.

use adapters::stripe::{SecretKey, StripeConfig, StripeProvider};
use adapters::transport::CurrentTrace;
use engine::provider::{EffectKind, EffectRequest, Secret};
use provider_sim::{Config, EffectRecord, FaultPlan, Server, list_effects};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The client's request timeout in tests: long enough for loopback, short enough that a
/// `timeout_after_effect` test does not wait long.
pub const CLIENT_TIMEOUT_MS: u64 = 300;

// The suite's speed depends on it: a slip here would make every timeout test slow.
const _: () = assert!(CLIENT_TIMEOUT_MS <= 500);

/// A running simulator and the directory that holds its database.
pub struct Sim {
    pub server: Server,
    pub db: PathBuf,
    /// Kept alive so the database outlives the test body; deleted on drop.
    pub dir: tempfile::TempDir,
}

impl Sim {
    pub async fn start(plan: &str) -> Self {
        Self::start_with(plan, |_| {}).await
    }

    pub async fn start_with(plan: &str, tweak: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory can be made: {e}"));
        let db = dir.path().join("sim.db");
        let mut config = Config::new(&db);
        config.faults = FaultPlan::from_json(plan).unwrap_or_else(|e| panic!("test plan must be valid: {e}"));
        tweak(&mut config);
        let server = Server::start(config).await.unwrap_or_else(|e| panic!("simulator starts: {e}"));
        Self { server, db, dir }
    }

    /// Starts another simulator on the same database (after `shutdown`).
    pub async fn restart(dir: tempfile::TempDir, db: PathBuf, plan: &str) -> Self {
        let mut config = Config::new(&db);
        config.faults = FaultPlan::from_json(plan).unwrap_or_else(|e| panic!("test plan must be valid: {e}"));
        let server = Server::start(config).await.unwrap_or_else(|e| panic!("simulator restarts: {e}"));
        Self { server, db, dir }
    }

    pub fn provider(&self) -> StripeProvider {
        self.provider_with_timeout(CLIENT_TIMEOUT_MS)
    }

    pub fn provider_with_timeout(&self, request_timeout_ms: u64) -> StripeProvider {
        provider_at(&self.server.base_url(), request_timeout_ms, None)
    }

    pub fn effects(&self) -> Vec<EffectRecord> {
        list_effects(&self.db).unwrap_or_else(|e| panic!("effects can be listed: {e}"))
    }

    pub fn effects_for(&self, key: &str) -> usize {
        self.effects().iter().filter(|e| e.idempotency_key == key).count()
    }

    /// Waits until the simulator has committed an effect for `key`: the signal that a held
    /// request is past its commit.
    pub async fn until_effect(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.effects_for(key) == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no effect for {key} within 5 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn stop(self) -> (tempfile::TempDir, PathBuf) {
        self.server.shutdown().await.unwrap_or_else(|e| panic!("simulator stops cleanly: {e}"));
        (self.dir, self.db)
    }
}

/// Any test key: the simulator accepts every `sk_test_…`.
pub const TEST_KEY: &str = "sk_test_keel_simulator";

/// Keel's Stripe client pointed at the simulator.
pub fn provider_at(base_url: &str, request_timeout_ms: u64, current_trace: Option<CurrentTrace>) -> StripeProvider {
    let key = Arc::new(SecretKey::parse(TEST_KEY).unwrap_or_else(|e| panic!("a test key parses: {e}")));
    let mut config = StripeConfig::new(base_url, key);
    config.connect_timeout_ms = 200;
    config.request_timeout_ms = request_timeout_ms;
    config.current_trace = current_trace;
    StripeProvider::new(config).unwrap_or_else(|e| panic!("provider config is valid: {e}"))
}

/// A charge whose key has the shape Keel uses: `operation:uuid:intent`.
pub fn charge(intent: &str, amount_minor: i64) -> EffectRequest {
    EffectRequest {
        kind: EffectKind::Charge,
        idempotency_key: format!("charge:3f1c2a4e-9b7d-4c1e-8a2f-5d6e7f809a1b:{intent}"),
        tenant: "acme".into(),
        intent_id: intent.into(),
        order_id: format!("order_{intent}"),
        amount_minor,
        currency: "EUR".into(),
        payment_method: Some(Secret::new("pm_card_visa")),
        fingerprint: "0".repeat(64),
        charge_ref: None,
        timeout_ms: None,
    }
}

/// A refund of `amount_minor` on the PaymentIntent `of` (a charge's evidence).
pub fn refund(intent: &str, amount_minor: i64, of: &str) -> EffectRequest {
    EffectRequest {
        kind: EffectKind::Refund,
        idempotency_key: format!("refund:acme:{intent}"),
        payment_method: None,
        charge_ref: Some(of.to_owned()),
        timeout_ms: None,
        ..charge(intent, amount_minor)
    }
}

pub const NO_FAULTS: &str = r#"{"rules": []}"#;
