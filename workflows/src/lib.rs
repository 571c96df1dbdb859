//! Keel's built-in workflows, written against the engine's API only.
//!
//! - [`charge::Charge`] — take a payment for an order (seed 004's input contract, the
//!   operator's policy, the token never stored in clear).
//! - [`refund::Refund`] — give money back on a charged order, never beyond what was charged.
//! - [`support_agent`] — seed 002's support agent: its refunds go through the same intent
//!   lifecycle, bound to the ticket's own order, approved by a human above a threshold.
//!
//! A workflow validates and splits its input in `prepare` (a rejection writes nothing), then
//! runs in a journaled [`engine::executor::Context`]:
//!
//! ```
//! use engine::executor::Workflow;
//! use serde_json::json;
//! let charge = workflows::charge::Charge::default();
//! let rejected = charge.prepare(&json!({"amount_minor": -1})).unwrap_err();
//! assert_eq!(rejected.code.as_str(), "invalid_arguments");
//! ```
pub mod charge;
pub mod input;
pub mod refund;
pub mod support_agent;
pub mod ticket_review;

use engine::executor::Registered;

/// Every built-in workflow, held to `rules` (the operator's policy for the invocation's tenant
/// and operation, flags applied); `None` for paths that only resume what was admitted.
pub fn builtin(rules: Option<engine::policy::Rules>) -> Vec<Registered> {
    vec![Registered::new(charge::Charge { rules: rules.clone() }), Registered::new(refund::Refund { rules })]
}
