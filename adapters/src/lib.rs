//! Everything in Keel that crosses a process boundary.
//!
//! - [`stripe`]: [`stripe::StripeProvider`], the engine's [`engine::provider::PaymentProvider`]
//!   on Stripe's API (PaymentIntents and Refunds, form-encoded, the [`stripe::SecretKey`] as
//!   Bearer), with the exact mapping from Stripe's answers to outcomes. It is the one wire
//!   format Keel speaks to a payment provider, the simulator included.
//! - [`transport`]: the HTTP plumbing it stands on — the client and its timeouts, the W3C
//!   trace context, and transport failures read as outcomes.
//! - [`model`]: the agent harness's [`agent::ModelTransport`]s — the Anthropic Messages and
//!   OpenAI Chat Completions clients over HTTP(S), [`model::scripted::ScriptedTransport`]
//!   replaying transcripts in those wire formats, and [`model::TokioTimer`].
//!
//! The provider simulator these clients are tested against, `keel-provider-sim`, is a crate
//! of its own (`adapters/provider-sim/`, crate `provider_sim`): the other side of the boundary,
//! speaking the same subset of Stripe's API.
//!
//! This crate must never make a decision the engine owns (retrying, reconciling, releasing
//! money): adapters report what happened, as data.
//!
//! # Example
//!
//! ```no_run
//! use adapters::stripe::{LOOPBACK_TEST_KEY, SecretKey, StripeConfig, StripeProvider};
//! use provider_sim::{Config, Server};
//! use engine::provider::{CallOutcome, EffectKind, EffectRequest, PaymentProvider, Secret};
//! use std::sync::Arc;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let server = Server::start(Config::new("/tmp/sim.db")).await?;
//! let key = Arc::new(SecretKey::parse(LOOPBACK_TEST_KEY)?);
//! let provider = StripeProvider::new(StripeConfig::new(server.base_url(), key))?;
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

pub mod flow;
pub mod model;
pub mod stripe;
pub mod transport;
