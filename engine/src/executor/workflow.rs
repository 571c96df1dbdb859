//! The workflow API: what a workflow author writes against.
//!
//! Owns [`Workflow`] (validate a raw input into a typed one, then run over a
//! [`Context`]), [`Prepared`], [`Rejection`], [`WorkflowEnd`], [`IntentRequest`] and
//! [`end_with`], plus [`Registered`], the form in which the executor holds workflows of
//! different input types. A workflow's input is a Rust value from `prepare` on: it is
//! stored as JSON in `RunStarted` and decoded back into the same type on replay, never read
//! back field by field. This module never touches the log.

use super::WorkflowError;
use super::context::Context;
use super::outcome::{IntentOutcome, OutcomeStatus};
use crate::event::RunStatus;
use crate::ledger::{IntentStatus, RejectCode};
use crate::provider::{BoxFuture, EffectKind, Secret};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A journaled workflow: an async function over a [`Context`], with a typed input.
pub trait Workflow: Send + Sync + 'static {
    /// The validated input: stored as JSON when the run starts (secrets replaced by their
    /// hashes), decoded back into this type when the run is replayed.
    type Input: Serialize + DeserializeOwned + Send + Sync;

    /// The registered name (stored in `RunStarted`).
    fn name(&self) -> &'static str;

    /// Validates a raw input and splits off its secrets. A rejection writes nothing.
    ///
    /// # Errors
    ///
    /// The [`Rejection`] listing every problem found.
    fn prepare(&self, raw: &Value) -> Result<Prepared<Self::Input>, Rejection>;

    /// Runs (or replays) the workflow.
    fn run<'a>(&'a self, ctx: &'a mut Context, input: Self::Input)
    -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>>;
}

/// A prepared workflow input: the typed input, and the secrets kept in memory.
#[derive(Clone, Debug)]
pub struct Prepared<I> {
    /// The validated input (secrets as hashes): what is stored and what `run` receives.
    pub input: I,
    /// Secrets for this invocation only, by name.
    pub secrets: BTreeMap<String, Secret>,
}

impl<I> Prepared<I> {
    /// An input without secrets.
    pub fn plain(input: I) -> Self {
        Self { input, secrets: BTreeMap::new() }
    }
}

/// A proposal refused before anything was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// Why.
    pub code: RejectCode,
    /// Details, one per problem.
    pub details: Vec<String>,
}

/// How a workflow ended, in its own words.
#[derive(Clone, Debug)]
pub struct WorkflowEnd {
    /// The run's final status.
    pub status: RunStatus,
    /// What the workflow returns to its caller.
    pub output: Value,
    /// The intent the run ended on, for a single-effect workflow.
    pub intent: Option<IntentOutcome>,
}

/// What the caller asks of an intent.
#[derive(Clone, Debug)]
pub struct IntentRequest {
    /// Charge or refund.
    pub kind: EffectKind,
    /// Tenant.
    pub tenant: String,
    /// The caller's intent id.
    pub intent_id: String,
    /// The order.
    pub order_id: String,
    /// The business reference a second key may not use while this one is pending.
    pub business_ref: String,
    /// Amount, minor units.
    pub amount_minor: i64,
    /// Currency.
    pub currency: String,
    /// The effect-defining payload (secrets hashed); its canonical hash is the fingerprint.
    pub payload: Value,
    /// The payment method, when the effect needs one.
    pub payment_method: Option<Secret>,
    /// The agent tool proposing it, recorded on the intent (`keel metrics --by tool`); `None`
    /// for a workflow's own intent.
    pub tool: Option<String>,
}

/// Maps an intent's outcome to the end of a single-intent workflow: an intent awaiting
/// approval suspends the run (it continues once approved and re-submitted).
///
/// # Errors
///
/// [`WorkflowError::Suspended`] while the intent awaits approval.
pub fn end_with(outcome: &IntentOutcome) -> Result<WorkflowEnd, WorkflowError> {
    if outcome.status == OutcomeStatus::Intent(IntentStatus::AwaitingApproval) {
        let key = &outcome.intent_key;
        let reason =
            format!("intent {key} awaits approval: `keel approve {key} --by NAME`, then re-submit the same request");
        let mut waiting = outcome.clone();
        waiting.details = vec![reason.clone()];
        return Err(WorkflowError::Suspended { reason, intent: Some(Box::new(waiting)) });
    }
    Ok(WorkflowEnd { status: outcome.run_status(), output: outcome_json(outcome)?, intent: Some(outcome.clone()) })
}

/// An outcome as a workflow's output.
pub(crate) fn outcome_json(outcome: &IntentOutcome) -> Result<Value, WorkflowError> {
    serde_json::to_value(outcome)
        .map_err(|e| WorkflowError::Failed(format!("an intent outcome does not serialise: {e}")))
}

/// A workflow as the executor holds it: its input erased to the stored JSON.
#[derive(Clone)]
pub struct Registered(Arc<dyn Erased>);

impl Registered {
    /// Registers `workflow`.
    pub fn new<W: Workflow>(workflow: W) -> Self {
        Self(Arc::new(workflow))
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Validates `raw`: the input as stored, and the secrets.
    pub(crate) fn prepare(&self, raw: &Value) -> Result<Prepared<Value>, Rejection> {
        self.0.prepare_stored(raw)
    }

    /// Runs the workflow on a stored input, decoding it into the workflow's own type first.
    pub(crate) fn run<'a>(
        &'a self,
        ctx: &'a mut Context,
        stored: Value,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        self.0.run_stored(ctx, stored)
    }
}

/// [`Workflow`] with its input type erased (object-safe).
trait Erased: Send + Sync {
    fn name(&self) -> &'static str;
    fn prepare_stored(&self, raw: &Value) -> Result<Prepared<Value>, Rejection>;
    fn run_stored<'a>(
        &'a self,
        ctx: &'a mut Context,
        stored: Value,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>>;
}

impl<W: Workflow> Erased for W {
    fn name(&self) -> &'static str {
        Workflow::name(self)
    }

    fn prepare_stored(&self, raw: &Value) -> Result<Prepared<Value>, Rejection> {
        let Prepared { input, secrets } = self.prepare(raw)?;
        let input = serde_json::to_value(&input).map_err(|e| Rejection {
            code: RejectCode::InvalidArguments,
            details: vec![format!("the validated input does not serialise: {e}")],
        })?;
        Ok(Prepared { input, secrets })
    }

    fn run_stored<'a>(
        &'a self,
        ctx: &'a mut Context,
        stored: Value,
    ) -> BoxFuture<'a, Result<WorkflowEnd, WorkflowError>> {
        Box::pin(async move {
            let input = serde_json::from_value(stored).map_err(|e| WorkflowError::StoredInput(e.to_string()))?;
            self.run(ctx, input).await
        })
    }
}
