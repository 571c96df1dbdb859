//! The payment provider simulator (`keel-provider-sim`), a crate of its own under `adapters/`.
//!
//! Owns an HTTP server on 127.0.0.1 speaking the subset of Stripe's API Keel uses, with its
//! own durable SQLite state, the seeded fault plan it plays, and the `keel-provider-sim`
//! command line. It exists so that Keel's exactly-once machinery can be tested against a
//! provider that behaves like Stripe — idempotency keys and replays, a search that lags, lost
//! answers — plus faults Stripe will not play on demand, and whose effects can be counted
//! afterwards. It must never be linked into the engine's decisions: it is the
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
//! The subset of Stripe's API that Keel's Stripe client (`adapters::stripe`) sends and reads,
//! answered as Stripe answers it, plus the simulator's own `GET /v1/effects` and `GET /health`.
//! Every Stripe route needs `Authorization: Bearer sk_test_…` (or `rk_test_…`); without one,
//! or with a live key, it answers 401 `invalid_request_error`.
//!
//! | Request | Answer |
//! |---|---|
//! | `POST /v1/payment_intents` form: `amount`, `currency`, `payment_method`, `payment_method_types[]`, `confirm=true`, `off_session`, `metadata[…]` + `Idempotency-Key` | 200 a PaymentIntent `pi_…` in `succeeded` (no payment method echoed); 402 `card_error`/`card_declined` with a `decline_code` and the PaymentIntent in `requires_payment_method` for the `decline` fault (`generic_decline`) and Stripe's declining test methods (`pm_card_chargeDeclined…`, `pm_card_visa_chargeDeclined…`) |
//! | `POST /v1/refunds` form: `payment_intent`, `amount`, `metadata[…]` + `Idempotency-Key` | 200 a Refund `re_…` in `succeeded`, in its PaymentIntent's currency; a `failed` Refund (`failure_reason: declined`, no effect) for the `decline` fault; 400 `resource_missing` (no such PaymentIntent), `charge_already_refunded` or `amount_too_large` (more than it has left; nothing stored, the key left free) |
//! | same key, same parameters (the sorted form pairs and the route) | the stored answer, byte for byte, same status, with `Idempotent-Replayed: true`; no new effect, the replay counted on the effect (`EffectRecord::replays`) |
//! | same key, other parameters | 400 `idempotency_error` / `idempotency_key_reused` |
//! | same key while the first request is still being answered | 409 `idempotency_error` / `idempotency_key_in_use` |
//! | missing `Idempotency-Key`; an unknown, repeated (other than `name[]`) or missing parameter; `confirm` not `true`; an amount outside 1..=`engine::limits::AMOUNT_MINOR_MAX` | 400 `invalid_request_error` (nothing stored) |
//! | `GET /v1/payment_intents/search?query=metadata['FIELD']:'VALUE'&limit=N` | 200 `{"object": "search_result", "url", "data", "has_more"}`, newest first; the lookup faults apply (`lookup_lies`: empty; `lookup_absent_for_ms`: the younger ones missing; `lookup_unavailable`: 503); 501 with `--no-lookup`; any other query 400 |
//! | `GET /v1/refunds?limit=N` | 200 `{"object": "list", "url", "data", "has_more"}`, the most recent refunds first; the same faults, the same 501 |
//! | any of the above with a W3C `traceparent` header | the same answer; a charge or refund that makes an effect records the header beside it (`EffectRecord::traceparent`; a malformed one is ignored, as a provider would) |
//! | every answer | a `Request-Id`; `Stripe-Should-Retry: true` on 409, 429 and 5xx |
//! | `GET /v1/effects` (the simulator's own) | 200 `{"object": "list", "data": [effect records]}` |
//! | `GET /health` | 200 |
//!
//! Errors have Stripe's shape `{"error": {"type", "code", "param"?, "message"}}`.
//!
//! # Guarantees and limits
//!
//! - The idempotency record and its effect are committed in one SQLite transaction (WAL,
//!   `synchronous=FULL`): there is never a key without its effect or an effect without its key.
//! - The key is required on every charge and refund (unlike Stripe, where it is optional), so
//!   every effect row can be counted per key.
//! - With `idempotency: false` every request makes a new effect; the key is still stored on the
//!   effect row, and a search under the key finds every one of them.
//! - Keys are kept forever: the simulator has no key window.
//! - The payment method is hashed with the request for key comparison and otherwise never
//!   stored, echoed or logged (Stripe echoes its id; the simulator does not).
//! - A declined PaymentIntent or failed Refund is answered but not kept as an object: a search
//!   or list never shows it (Stripe's would, unpaid; Keel reads that as absent all the same).
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
    /// Serve lookups (`GET /v1/payment_intents/search`, `GET /v1/refunds`). Default true;
    /// false answers 501.
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
    /// How many later requests under its key were answered its stored answer
    /// (`Idempotent-Replayed: true`); 0 without idempotency.
    pub replays: u64,
    /// When the effect was committed, RFC 3339 UTC with milliseconds.
    pub created_at: String,
    /// The same instant in Unix milliseconds (drives the consistency window).
    pub created_at_ms: i64,
    /// The W3C `traceparent` the request that made the effect carried, when it carried a
    /// well-formed one: the caller's span, so the effect can be found in the caller's trace.
    pub traceparent: Option<String>,
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
