//! The `charge` workflow: one payment intent, seed 004's contract.
//!
//! Owns input validation (tenant UUID, intent id 12–120 chars, order id, positive integer
//! `amount_minor`, EUR/USD/XOF, payment method token ≥ 20 chars, unknown fields refused), the
//! per-charge policy maximum, and the fingerprint payload. The payment method token never
//! reaches the log: the stored input and the fingerprint carry its SHA-256 only, and the
//! clear token lives in the invocation's secrets.

use crate::input::{Fields, intent_request};
use engine::canonical::sha256_hex;
use engine::executor::{Context, Prepared, Rejection, Workflow, WorkflowEnd, WorkflowError, end_with};
use engine::ledger::RejectCode;
use engine::limits::PAYMENT_METHOD_TOKEN_MIN_CHARS;
use engine::provider::{BoxFuture, EffectKind, Secret};
use serde_json::Value;
use std::collections::BTreeMap;

/// The fields a charge accepts.
pub const FIELDS: [&str; 6] =
    ["tenant_id", "intent_id", "order_id", "amount_minor", "currency", "payment_method_token"];

/// The name of the secret holding the payment method token.
const PAYMENT_METHOD: &str = "payment_method";

/// The charge workflow, with its policy.
#[derive(Clone, Debug, Default)]
pub struct Charge {
    /// Largest amount one charge may take, in minor units (`None`: no policy maximum).
    pub max_amount_minor: Option<i64>,
}

impl Workflow for Charge {
    fn name(&self) -> &'static str {
        "charge"
    }

    fn prepare(&self, raw: &Value) -> Result<Prepared, Rejection> {
        let mut fields = Fields::new(raw, &FIELDS);
        let mut stored = fields.effect();
        let token = fields.string("payment_method_token", PAYMENT_METHOD_TOKEN_MIN_CHARS, 4096);
        fields.finish().map_err(|details| Rejection { code: RejectCode::InvalidArguments, details })?;
        let amount_minor = stored["amount_minor"].as_i64().unwrap_or_default();
        if let Some(max) = self.max_amount_minor
            && amount_minor > max
        {
            return Err(Rejection {
                code: RejectCode::PolicyDenied,
                details: vec![format!("amount_minor {amount_minor} is above the per-charge maximum of {max}")],
            });
        }
        Ok(Prepared {
            stored_input: {
                stored.insert("payment_method_sha256".to_owned(), Value::String(sha256_hex(token.as_bytes())));
                Value::Object(stored)
            },
            secrets: BTreeMap::from([(PAYMENT_METHOD.to_owned(), Secret::new(token))]),
        })
    }

    fn run<'a>(&'a self, ctx: &'a mut Context, input: Value) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let request =
                intent_request(EffectKind::Charge, &input, &["payment_method_sha256"], ctx.secret(PAYMENT_METHOD));
            let outcome = ctx.intent(request).await?;
            end_with(&outcome)
        })
    }
}
