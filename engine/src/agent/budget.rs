//! The limits an agent run starts with, and the price table its cost is measured with.
//!
//! Owns [`AgentLimits`] (every dimension of SPEC "Budgets" the agent harness enforces) and
//! [`PriceTable`]. Both are written into `AgentRunStarted`, so the run's bounds are facts
//! in its journal: a restart folds them back and never refills a budget. The counters
//! themselves live in [`super::AgentState`]; the checks are in the guard and the loop.

use crate::limits;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Every bound of one agent run. Deserialising a partial JSON object fills the rest with the
/// defaults of `engine::limits`, which is how `--limits` overrides work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentLimits {
    /// Model calls, each reserved before it is sent (a failed call still counts).
    pub model_calls_max: u32,
    /// Tool attempts admitted by the guard, failed ones included.
    pub tool_calls_max: u32,
    /// Per-tool attempt caps, by tool name (absent: only the total applies).
    pub tool_calls_per_tool_max: BTreeMap<String, u32>,
    /// Admitted attempts per canonical signature.
    pub repeats_per_signature_max: u32,
    /// Input tokens over the run, from the vendors' `usage` (absent: unbounded).
    pub input_tokens_max: Option<u64>,
    /// Output tokens over the run (absent: unbounded).
    pub output_tokens_max: Option<u64>,
    /// Model cost over the run, integer minor units (absent: unbounded).
    pub cost_minor_max: Option<i64>,
    /// Deadline from run start; fixed as an absolute instant in `AgentRunStarted`.
    pub deadline_ms: u64,
    /// Unknown tools and malformed or schema-invalid arguments the model may correct.
    pub schema_corrections_max: u32,
    /// Consecutive turns whose tool calls made no progress.
    pub no_progress_iterations_max: u32,
    /// Output-token cap sent with each call.
    pub output_tokens_per_call: u32,
    /// How long an effect call may wait for a human decision, from the moment the run
    /// suspends on it. The wait is outside the run's working time (the deadline moves by it);
    /// past it the run stops `deadline_exceeded` and the intent is released. `None` — runs
    /// recorded before the bound existed — means the default: the field is left out of their
    /// stored form, so their hash chain still checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_wait_ms: Option<u64>,
    /// Prices per model, to measure cost.
    pub prices: PriceTable,
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            model_calls_max: limits::AGENT_MODEL_CALLS_DEFAULT,
            tool_calls_max: limits::AGENT_TOOL_CALLS_DEFAULT,
            tool_calls_per_tool_max: BTreeMap::new(),
            repeats_per_signature_max: limits::AGENT_REPEATS_PER_SIGNATURE_DEFAULT,
            input_tokens_max: None,
            output_tokens_max: None,
            cost_minor_max: None,
            deadline_ms: limits::AGENT_DEADLINE_DEFAULT_MS,
            schema_corrections_max: limits::AGENT_SCHEMA_CORRECTIONS_DEFAULT,
            no_progress_iterations_max: limits::AGENT_NO_PROGRESS_ITERATIONS_DEFAULT,
            output_tokens_per_call: limits::AGENT_OUTPUT_TOKENS_PER_CALL_DEFAULT,
            approval_wait_ms: Some(limits::AGENT_APPROVAL_WAIT_DEFAULT_MS),
            prices: PriceTable::default(),
        }
    }
}

impl AgentLimits {
    /// How long an effect call may wait for a human decision.
    pub fn approval_wait_ms(&self) -> u64 {
        self.approval_wait_ms.unwrap_or(limits::AGENT_APPROVAL_WAIT_DEFAULT_MS)
    }

    /// Applies a JSON object of overrides (the CLI's `--limits`) on top of `self`: only the
    /// keys present change. Unknown keys are refused, so a typo cannot silently be ignored.
    pub fn overridden_by(&self, overrides: &serde_json::Value) -> Result<Self, serde_json::Error> {
        let mut base = serde_json::to_value(self)?;
        if let (Some(base_map), Some(over_map)) = (base.as_object_mut(), overrides.as_object()) {
            for (key, value) in over_map {
                base_map.insert(key.clone(), value.clone());
            }
        } else if !overrides.is_object() {
            return Err(serde::de::Error::custom("limits overrides must be a JSON object"));
        }
        serde_json::from_value(base)
    }
}

/// The price of one model, in integer minor units per million tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Minor units per million input tokens.
    pub input_minor_per_mtok: i64,
    /// Minor units per million output tokens.
    pub output_minor_per_mtok: i64,
}

/// Prices by model name. A model's answer is priced by the `model` field of the answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PriceTable(pub BTreeMap<String, ModelPrice>);

impl PriceTable {
    /// The cost of one call, rounded up so cost is never under-counted; `None` when the model
    /// has no price (the loop then stops `cost_budget` if a cost limit is set, since an
    /// unpriced call cannot be bounded).
    pub fn cost_minor(&self, model: &str, input_tokens: u64, output_tokens: u64) -> Option<i64> {
        let price = self.0.get(model)?;
        let part = |tokens: u64, per_mtok: i64| -> i64 {
            let numerator = i128::from(tokens) * i128::from(per_mtok.max(0));
            let rounded_up = (numerator + 999_999) / 1_000_000;
            i64::try_from(rounded_up).unwrap_or(i64::MAX)
        };
        Some(
            part(input_tokens, price.input_minor_per_mtok)
                .saturating_add(part(output_tokens, price.output_minor_per_mtok)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_seed_003() {
        let limits = AgentLimits::default();
        assert_eq!(limits.model_calls_max, 6);
        assert_eq!(limits.tool_calls_max, 4);
        assert_eq!(limits.repeats_per_signature_max, 1);
        assert_eq!(limits.deadline_ms, 120_000);
    }

    #[test]
    fn overrides_change_only_named_keys_and_refuse_typos() {
        let base = AgentLimits::default();
        let limits = base.overridden_by(&json!({"model_calls_max": 1})).expect("valid override");
        assert_eq!(limits.model_calls_max, 1);
        assert_eq!(limits.tool_calls_max, base.tool_calls_max);
        assert!(base.overridden_by(&json!({"model_call_max": 1})).is_err());
        assert!(base.overridden_by(&json!([1])).is_err());
    }

    #[test]
    fn cost_rounds_up_and_unknown_models_have_no_price() {
        let mut table = PriceTable::default();
        table.0.insert("m".into(), ModelPrice { input_minor_per_mtok: 300, output_minor_per_mtok: 1_500 });
        assert_eq!(table.cost_minor("m", 1_000_000, 0), Some(300));
        assert_eq!(table.cost_minor("m", 1, 1), Some(2));
        assert_eq!(table.cost_minor("m", 0, 0), Some(0));
        assert_eq!(table.cost_minor("other", 1, 1), None);
    }
}
