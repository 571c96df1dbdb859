//! The payment provider simulator (`keel-provider-sim`), a crate of its own under `adapters/`.
//!
//! Owns a Stripe-like HTTP server on 127.0.0.1 with its own durable SQLite state, the seeded
//! fault plan it plays, and the `keel-provider-sim` command line. It exists so that Keel's
//! exactly-once machinery can be tested against a provider that behaves like a real one —
//! idempotency keys, a lookup endpoint, eventual consistency, lost answers — and whose effects
//! can be counted afterwards. It must never be linked into the engine's decisions: it is the
//! other side of a process boundary, reached only over HTTP (tests start it in-process with
//! [`Server::start`] purely to save a process spawn).
//!
//! Its main types: [`Server`] (started from a [`Config`], in this process), [`Process`] (the
//! same server in a child process), [`FaultPlan`] (what it injects, see [`faults`]),
//! [`EffectRecord`] (what it did, from [`list_effects`]), [`Rng`] (the seeded generator its
//! fault plans and Keel's crash schedules draw from), and [`cli_main`], the whole
//! `keel-provider-sim` binary.
//!
//! ```no_run
//! use provider_sim::{Config, FaultPlan, Server, list_effects};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = Config::new("/tmp/sim.db");
//! config.faults = FaultPlan::from_json(r#"{"rules": [{"operation": "charge", "fault": "decline", "times": 1}]}"#)?;
//! let server = Server::start(config).await?;
//! println!("point `keel --provider {}` at it", server.base_url());
//! server.shutdown().await?;
//! assert!(list_effects("/tmp/sim.db".as_ref())?.is_empty(), "a decline is no effect");
//! # Ok(())
//! # }
//! ```
//!
//! # HTTP API
//!
//! | Request | Answer |
//! |---|---|
//! | `POST /v1/charges` `{"amount", "currency", "payment_method", "metadata": {"order_id", "intent_id", "tenant"}}` + `Idempotency-Key` | 200 `{"id": "ch_…", "object": "charge", "amount", "currency", "status": "succeeded", "created", "metadata"}` |
//! | `POST /v1/refunds` `{"amount", "currency", "metadata": {…}}` + `Idempotency-Key` | 200 `{"id": "re_…", "object": "refund", …}` |
//! | same key, same parameters (SHA-256 of the canonical body) | the stored answer, byte for byte, same status; no new effect |
//! | same key, other parameters | 400 `idempotency_error` / `idempotency_key_reused` |
//! | same key while the first request is still being answered | 409 `idempotency_error` / `request_in_progress` |
//! | missing `Idempotency-Key`, malformed body (a repeated key included), an amount outside 1..=`engine::limits::AMOUNT_MINOR_MAX` | 400 `invalid_request_error` (nothing stored) |
//! | `GET /v1/effects/{percent-encoded key}` | 200 the effect's object, or 404 `not_found`; 501 `not_supported` with `--no-lookup` |
//! | `GET /v1/effects` | 200 `{"object": "list", "data": [effect records]}` |
//! | any of the above with a W3C `traceparent` header | the same answer; a charge or refund that makes an effect records the header beside it (`EffectRecord::traceparent`; a malformed one is ignored, as a provider would) |
//! | `GET /health` | 200 |
//! | **Stripe's subset** (what `adapters::stripe` sends; every `/v1` route below needs `Authorization: Bearer sk_test_…` or `rk_test_…`, else 401 `invalid_request_error`) | |
//! | `POST /v1/payment_intents` form: `amount`, `currency`, `payment_method`, `payment_method_types[]`, `confirm=true`, `off_session`, `metadata[…]` + `Idempotency-Key` | 200 a PaymentIntent `pi_…` in `succeeded` (no payment method echoed); 402 `card_error`/`card_declined` with a `decline_code` and the PaymentIntent in `requires_payment_method` for the `decline` fault and Stripe's declining test methods (`pm_card_chargeDeclined…`, `pm_card_visa_chargeDeclined…`) |
//! | `POST /v1/refunds` form: `payment_intent`, `amount`, `metadata[…]` + `Idempotency-Key` | 200 a Refund `re_…` in `succeeded`, in its PaymentIntent's currency; a `failed` Refund (`failure_reason: declined`, no effect) for the `decline` fault; 400 `resource_missing` (no such PaymentIntent), `charge_already_refunded` or `amount_too_large` (more than it has left; nothing stored, the key left free) |
//! | same key, same parameters (sorted form pairs and the route) | the stored answer with `Idempotent-Replayed: true` |
//! | same key, other parameters / while the first is being answered | 400 / 409 `idempotency_error` |
//! | an unknown or repeated parameter, a missing one, `confirm` not `true` | 400 `invalid_request_error` (`parameter_unknown`, `parameter_invalid`, `parameter_missing`) |
//! | `GET /v1/payment_intents/search?query=metadata['FIELD']:'VALUE'&limit=N` | 200 `{"object": "search_result", "data", "has_more"}`, newest first; lookup faults apply (`lookup_lies`: empty; `lookup_absent_for_ms`: younger ones missing; `lookup_unavailable`: 503); 501 with `--no-lookup`; any other query 400 |
//! | `GET /v1/refunds?limit=N` | 200 `{"object": "list", "data", "has_more"}`, the most recent refunds; the same faults |
//! | every answer | a `Request-Id`; `Stripe-Should-Retry: true` on 409, 429 and 5xx |
//!
//! Errors have the shape `{"error": {"type", "code", "message"}}`.
//!
//! # Guarantees and limits
//!
//! - The idempotency record and its effect are committed in one SQLite transaction (WAL,
//!   `synchronous=FULL`): there is never a key without its effect or an effect without its key.
//! - The key is required on every charge and refund (unlike Stripe, where it is optional), so
//!   every effect row can be counted per key.
//! - With `idempotency: false` every request makes a new effect; the key is still stored on the
//!   effect row, and a lookup answers the oldest effect for the key.
//! - Keys are kept forever: the simulator has no key window.
//! - The payment method is hashed with the request for key comparison and otherwise never
//!   stored, echoed or logged.
//! - Request bodies are limited by axum's default body limit (2 MiB); a charge is a few
//!   hundred bytes.
//! - Held answers (`slow`, `timeout_after_effect`) are not limited in number: each holds one
//!   connection and one task, which a test suite bounds by its own concurrency.
//! - Faults: see [`faults`] for the plan format and the order in which rules fire.

mod cli;
mod db;
pub mod faults;
mod http;
pub mod process;
pub mod rng;
mod stripe;

pub use cli::{cli_main, cli_main_from};
pub use engine::provider::EffectKind;
pub use faults::{FaultPlan, PlanError};
pub use process::Process;
pub use rng::Rng;

use serde::Serialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;

/// Operational errors of the simulator (outcomes of requests are HTTP answers, not errors).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database file could not be opened.
    #[error("cannot open simulator database {path}: {source}")]
    Open {
        /// The path asked for.
        path: String,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// A database operation failed.
    #[error("simulator database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored row breaks the schema's promises.
    #[error("simulator database is corrupt: {0}")]
    Corrupt(String),
    /// The fault plan was refused.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The listening socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("simulator server failed: {0}")]
    Serve(std::io::Error),
    /// The transaction holding a batch of claims failed; every claim in it is answered
    /// with this (nothing of the batch was committed).
    #[error("simulator database: a batch of claims failed: {0}")]
    Batch(String),
    /// A background task died (a panic in the simulator: a bug).
    #[error("simulator task failed: {0}")]
    Task(String),
}

/// How to run a simulator.
#[derive(Clone, Debug)]
pub struct Config {
    /// The SQLite file holding the simulator's state; created if missing.
    pub db_path: PathBuf,
    /// Where to listen. Default `127.0.0.1:0` (an ephemeral port).
    pub addr: SocketAddr,
    /// The faults to inject. Default: none.
    pub faults: FaultPlan,
    /// Honour `Idempotency-Key`. Default true; false models a provider without deduplication.
    pub idempotency: bool,
    /// Serve `GET /v1/effects/{key}`. Default true; false answers 501.
    pub lookup: bool,
}

impl Config {
    /// A simulator on an ephemeral 127.0.0.1 port, with idempotency and lookup, and no faults.
    pub fn new(db_path: impl Into<PathBuf>) -> Self {
        Self {
            db_path: db_path.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            faults: FaultPlan::none(),
            idempotency: true,
            lookup: true,
        }
    }
}

/// One effect the simulator performed, as stored and as listed by `effects --json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EffectRecord {
    /// The provider's id: `pi_…` (a PaymentIntent) or `re_…` (a Refund).
    pub id: String,
    /// The key the request carried.
    pub idempotency_key: String,
    /// Charge or refund.
    pub kind: EffectKind,
    /// Amount in minor units.
    pub amount_minor: i64,
    /// ISO 4217 code, lower case as Stripe keeps it (a refund's is its PaymentIntent's).
    pub currency: String,
    /// `metadata[keel_order_id]` (empty without it).
    pub order_id: String,
    /// `metadata[keel_intent_id]` (empty without it).
    pub intent_id: String,
    /// `metadata[keel_tenant]` (empty without it).
    pub tenant: String,
    /// For a refund, the PaymentIntent it gives money back on.
    pub payment_intent: Option<String>,
    /// The request's metadata, as Stripe keeps it (searched by a charge lookup).
    pub metadata: BTreeMap<String, String>,
    /// When the effect was committed, RFC 3339 UTC with milliseconds.
    pub created_at: String,
    /// The same instant in Unix milliseconds (drives the consistency window).
    pub created_at_ms: i64,
    /// The W3C `traceparent` the request that made the effect carried, when it carried a
    /// well-formed one: the caller's span, so the effect can be found in the caller's trace.
    pub traceparent: Option<String>,
}

impl EffectRecord {
    /// The object the HTTP API answers for this effect (the charge or refund).
    pub(crate) fn api_object(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.id,
            "object": self.kind.as_str(),
            "amount": self.amount_minor,
            "currency": self.currency,
            "status": "succeeded",
            "created": self.created_at_ms.div_euclid(1000),
            "metadata": {
                "order_id": self.order_id,
                "intent_id": self.intent_id,
                "tenant": self.tenant,
            },
        })
    }
}

/// Every effect in the simulator database at `db_path`, in commit order. Safe to call while
/// a simulator is serving that file.
pub fn list_effects(db_path: &Path) -> Result<Vec<EffectRecord>, Error> {
    db::Db::open_existing(db_path)?.effects()
}

/// A running simulator. Dropping it without [`Server::shutdown`] leaves the server task
/// running until its runtime stops.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Opens the database (recovering in-flight records), binds `config.addr` and starts
    /// serving on the current tokio runtime. Returns once the socket is listening, so the
    /// address can be used at once.
    pub async fn start(config: Config) -> Result<Self, Error> {
        let (db, recovered) = db::Db::open(&config.db_path)?;
        if recovered > 0 {
            tracing::info!(recovered, "completed idempotency records left in flight by a previous run");
        }
        let listener = tokio::net::TcpListener::bind(config.addr)
            .await
            .map_err(|source| Error::Bind { addr: config.addr, source })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind { addr: config.addr, source })?;
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = http::State::new(Arc::new(db), &config, shutdown_rx.clone());
        let router = http::router(state);
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    // An error means the sender is gone, which is also a reason to stop.
                    let _ = stop.wait_for(|stopping| *stopping).await;
                })
                .await
        });
        tracing::info!(%addr, "provider simulator listening");
        Ok(Self { addr, shutdown, task })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the base URL clients use.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, cuts every held answer short (answering it at once), waits for open
    /// requests to finish and returns. The database is closed once the last request is done.
    pub async fn shutdown(self) -> Result<(), Error> {
        // The receiver lives in the server task; if it is already gone there is nothing to stop.
        let _ = self.shutdown.send(true);
        match self.task.await {
            Ok(result) => result.map_err(Error::Serve),
            Err(join) => Err(Error::Task(join.to_string())),
        }
    }
}
