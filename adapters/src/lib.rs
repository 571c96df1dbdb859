//! Everything in Keel that crosses a process boundary.
//!
//! - [`provider_http`]: [`provider_http::HttpProvider`], the engine's
//!   [`engine::provider::PaymentProvider`] over a Stripe-like HTTP API, with the exact mapping
//!   from HTTP answers and transport failures to outcomes.
//! - [`stripe`]: [`stripe::StripeProvider`], the same trait on Stripe's own API (PaymentIntents
//!   and Refunds, form-encoded, the [`stripe::SecretKey`] as Bearer), sharing that plumbing.
//! - [`model`]: the agent harness's [`agent::ModelTransport`]s — the Anthropic Messages and
//!   OpenAI Chat Completions clients over HTTP(S), [`model::scripted::ScriptedTransport`]
//!   replaying transcripts in those wire formats, and [`model::TokioTimer`].
//!
//! The provider simulator these clients are tested against, `keel-provider-sim`, is a crate
//! of its own (`adapters/provider-sim/`, crate `provider_sim`): the other side of the boundary.
//!
//! This crate must never make a decision the engine owns (retrying, reconciling, releasing
//! money): adapters report what happened, as data.
//!
//! # Example
//!
//! ```no_run
//! use adapters::provider_http::{HttpProvider, HttpProviderConfig};
//! use provider_sim::{Config, Server};
//! use engine::provider::{CallOutcome, EffectKind, EffectRequest, PaymentProvider, Secret};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::start(Config::new("/tmp/sim.db")).await?;
//! let provider = HttpProvider::new(HttpProviderConfig::new(server.base_url()))?;
//! let request = EffectRequest {
//!     kind: EffectKind::Charge,
//!     idempotency_key: "charge:acme:intent_1".into(),
//!     tenant: "acme".into(),
//!     intent_id: "intent_1".into(),
//!     order_id: "order_1842".into(),
//!     amount_minor: 4900,
//!     currency: "EUR".into(),
//!     payment_method: Some(Secret::new("pm_card_visa")),
//!     fingerprint: "0".repeat(64),
//!     charge_ref: None,
//!     timeout_ms: None,
//! };
//! let outcome = provider.execute(&request).await;
//! assert!(matches!(outcome, CallOutcome::Succeeded(_)));
//! server.shutdown().await?;
//! # Ok(())
//! # }
//! ```

pub mod model;
pub mod provider_http;
pub mod stripe;
