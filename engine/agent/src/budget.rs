//! The limits an agent run starts with, the price table its cost is measured with, and what
//! that measure says.
//!
//! Owns [`AgentLimits`] (every dimension of SPEC "Budgets" the agent harness enforces),
//! [`PriceTable`] and [`ModelCost`]. The first two are written into `AgentRunStarted`, so the
//! run's bounds are facts in its journal: a restart folds them back and never refills a
//! budget. The counters themselves live in [`super::AgentState`]; the checks are in the
//! guard and the loop. A cost it cannot measure is never reported as a number: an answer
//! from a model without a price makes the run's cost unknown, not 0.

use engine::limits;
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
    /// Input tokens over the run, from the vendors' `usage`. Bounded by default
    /// (`AGENT_INPUT_TOKENS_DEFAULT`); `None` only in runs recorded before the default existed.
    pub input_tokens_max: Option<u64>,
    /// Output tokens over the run. Bounded by default (`AGENT_OUTPUT_TOKENS_DEFAULT`).
    pub output_tokens_max: Option<u64>,
    /// Model cost over the run, integer minor units. A run given `prices` is bounded by
    /// default (`AGENT_COST_DEFAULT_MINOR`); without prices a cost cannot be measured and the
    /// token budgets bound the run (absent: no cost limit).
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
    /// Sub-agents the run may start, each carving its budgets out of the run's. `None` —
    /// runs recorded before delegations existed — means the default, and is left out of the
    /// stored form so their hash chain still checks; a sub-agent's own is `Some(0)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegations_max: Option<u32>,
    /// Money the run's effect tools may move, minor units, within the spine run's own money
    /// budget (which bounds every intent the run reserves, its sub-agents' included). A
    /// sub-agent's is carved: what its [`crate::Delegation`] asks for, clamped to what the
    /// spine run has left when it starts; a call past it is refused before its intent is
    /// reserved, counted from the journal (`ToolCallReserved.money_minor`). `None` — a run
    /// asking none, or recorded before the cap existed — means no cap beyond the spine run's,
    /// and is left out of the stored form so old hash chains still check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub money_minor_max: Option<i64>,
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
            input_tokens_max: Some(limits::AGENT_INPUT_TOKENS_DEFAULT),
            output_tokens_max: Some(limits::AGENT_OUTPUT_TOKENS_DEFAULT),
            cost_minor_max: None,
            deadline_ms: limits::AGENT_DEADLINE_DEFAULT_MS,
            schema_corrections_max: limits::AGENT_SCHEMA_CORRECTIONS_DEFAULT,
            no_progress_iterations_max: limits::AGENT_NO_PROGRESS_ITERATIONS_DEFAULT,
            output_tokens_per_call: limits::AGENT_OUTPUT_TOKENS_PER_CALL_DEFAULT,
            approval_wait_ms: Some(limits::AGENT_APPROVAL_WAIT_DEFAULT_MS),
            delegations_max: Some(limits::AGENT_DELEGATIONS_DEFAULT),
            money_minor_max: None,
            prices: PriceTable::default(),
        }
    }
}

impl AgentLimits {
    /// How long an effect call may wait for a human decision.
    pub fn approval_wait_ms(&self) -> u64 {
        self.approval_wait_ms.unwrap_or(limits::AGENT_APPROVAL_WAIT_DEFAULT_MS)
    }

    /// How many sub-agents the run may start.
    pub fn delegations_max(&self) -> u32 {
        self.delegations_max.unwrap_or(limits::AGENT_DELEGATIONS_DEFAULT)
    }

    /// Applies a JSON object of overrides (the CLI's `--limits`) on top of `self`: only the
    /// keys present change. Unknown keys are refused, so a typo cannot silently be ignored;
    /// the result is [`validated`](Self::validate), so every bound stays within its maximum.
    pub fn overridden_by(&self, overrides: &serde_json::Value) -> Result<Self, LimitsError> {
        let over_map = overrides.as_object().ok_or(LimitsError::NotAnObject)?;
        let mut base = serde_json::to_value(self).expect("AgentLimits serializes: plain data with string keys");
        for (key, value) in over_map {
            if let Some(base_map) = base.as_object_mut() {
                base_map.insert(key.clone(), value.clone());
            }
            // One key at a time, so the error names the key that does not fit.
            engine::canonical::decode::<Self>(base.clone())
                .map_err(|e| LimitsError::Invalid { field: key.clone(), detail: e.to_string() })?;
        }
        let mut limits: Self = engine::canonical::decode(base)
            .map_err(|e| LimitsError::Invalid { field: "limits".into(), detail: e.to_string() })?;
        // A run given prices can measure its cost: it is bounded in cost by default too.
        if !limits.prices.0.is_empty() && limits.cost_minor_max.is_none() && !over_map.contains_key("cost_minor_max") {
            limits.cost_minor_max = Some(limits::AGENT_COST_DEFAULT_MINOR);
        }
        limits.validate()?;
        Ok(limits)
    }

    /// Checks every bound against its documented range in `engine::limits`: a run never
    /// starts with a bound so large that its arithmetic (a deadline instant, a cost sum) could
    /// overflow, or so small that it means nothing (a call that may write no token).
    pub fn validate(&self) -> Result<(), LimitsError> {
        use limits::*;
        within("model_calls_max", self.model_calls_max.into(), 0, AGENT_MODEL_CALLS_MAX.into())?;
        within("tool_calls_max", self.tool_calls_max.into(), 0, AGENT_TOOL_CALLS_MAX.into())?;
        entries("tool_calls_per_tool_max", self.tool_calls_per_tool_max.keys())?;
        for (tool, max) in &self.tool_calls_per_tool_max {
            within(&format!("tool_calls_per_tool_max.{tool}"), (*max).into(), 0, AGENT_TOOL_CALLS_MAX.into())?;
        }
        within("repeats_per_signature_max", self.repeats_per_signature_max.into(), 1, AGENT_TOOL_CALLS_MAX.into())?;
        for (field, max) in [("input_tokens_max", self.input_tokens_max), ("output_tokens_max", self.output_tokens_max)]
        {
            // Every new run is bounded in tokens: `null` would unbound it.
            let max = max.ok_or_else(|| LimitsError::OutOfRange {
                field: field.to_owned(),
                value: "null".to_owned(),
                range: format!("0..={AGENT_TOKENS_MAX} (a run is never unbounded)"),
            })?;
            within(field, max, 0, AGENT_TOKENS_MAX)?;
        }
        match self.cost_minor_max {
            Some(max) => within_i64("cost_minor_max", max, AGENT_COST_MINOR_MAX)?,
            // Without prices a cost cannot be measured (the token budgets bound the run); with
            // them, `null` would unbound it.
            None if !self.prices.0.is_empty() => {
                return Err(LimitsError::OutOfRange {
                    field: "cost_minor_max".to_owned(),
                    value: "null".to_owned(),
                    range: format!("0..={AGENT_COST_MINOR_MAX} (a priced run is never unbounded in cost)"),
                });
            }
            None => {}
        }
        if let Some(max) = self.money_minor_max {
            within_i64("money_minor_max", max, AMOUNT_MINOR_MAX)?;
        }
        within("deadline_ms", self.deadline_ms, 0, AGENT_DEADLINE_MAX_MS)?;
        let corrections = self.schema_corrections_max.into();
        within("schema_corrections_max", corrections, 0, AGENT_SCHEMA_CORRECTIONS_MAX.into())?;
        let iterations = self.no_progress_iterations_max.into();
        within("no_progress_iterations_max", iterations, 1, AGENT_MODEL_CALLS_MAX.into())?;
        within("delegations_max", self.delegations_max().into(), 0, AGENT_DELEGATIONS_MAX.into())?;
        let per_call = self.output_tokens_per_call.into();
        within("output_tokens_per_call", per_call, 1, AGENT_OUTPUT_TOKENS_PER_CALL_MAX.into())?;
        entries("prices", self.prices.0.keys())?;
        for (model, price) in &self.prices.0 {
            within_i64(
                &format!("prices.{model}.input_minor_per_mtok"),
                price.input_minor_per_mtok,
                AGENT_PRICE_PER_MTOK_MAX,
            )?;
            within_i64(
                &format!("prices.{model}.output_minor_per_mtok"),
                price.output_minor_per_mtok,
                AGENT_PRICE_PER_MTOK_MAX,
            )?;
        }
        Ok(())
    }
}

fn within(field: &str, value: u64, min: u64, max: u64) -> Result<(), LimitsError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(LimitsError::OutOfRange { field: field.to_owned(), value: value.to_string(), range: format!("{min}..={max}") })
}

fn within_i64(field: &str, value: i64, max: i64) -> Result<(), LimitsError> {
    if (0..=max).contains(&value) {
        return Ok(());
    }
    Err(LimitsError::OutOfRange { field: field.to_owned(), value: value.to_string(), range: format!("0..={max}") })
}

/// A per-name map (tools, models) holds few entries with short names: it is written into
/// `AgentRunStarted`, which must fit one event.
fn entries<'a>(field: &str, names: impl ExactSizeIterator<Item = &'a String>) -> Result<(), LimitsError> {
    let count = names.len();
    within(&format!("{field} (entries)"), count as u64, 0, limits::AGENT_LIMIT_ENTRIES_MAX as u64)?;
    for name in names {
        let chars = name.chars().count();
        if chars == 0 || chars > limits::AGENT_LIMIT_NAME_MAX_CHARS {
            return Err(LimitsError::OutOfRange {
                field: field.to_owned(),
                value: format!("a name of {chars} characters"),
                range: format!("1..={} characters", limits::AGENT_LIMIT_NAME_MAX_CHARS),
            });
        }
    }
    Ok(())
}

/// What an agent run (its sub-agents included) spent on its models, as far as it can be
/// measured: the sum of its answers' prices, or unknown once an answer came from a model the
/// price table does not hold (no table, or a model absent from it). Serialised as
/// `{"cost_minor": 30, "unpriced_answers": 0}` or `{"cost_minor": null, "unpriced_answers": 2}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ModelCost {
    /// Minor units; `None` when some answer had no price: unknown, never 0.
    pub cost_minor: Option<i64>,
    /// Answers from a model without a price.
    pub unpriced_answers: u32,
}

impl std::fmt::Display for ModelCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cost_minor {
            Some(cost) => write!(f, "{cost} minor units"),
            None => {
                write!(f, "unknown ({} without a price)", crate::run_loop::count_of(self.unpriced_answers, "answer"))
            }
        }
    }
}

/// Why limits were refused (the CLI's `--limits`, or a library caller's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// The overrides are not a JSON object.
    #[error("limits overrides must be a JSON object")]
    NotAnObject,
    /// A key that does not exist, or a value of the wrong type.
    #[error("{field}: {detail}")]
    Invalid {
        /// The key.
        field: String,
        /// The decoder's reason.
        detail: String,
    },
    /// A value outside its documented range (`engine::limits`).
    #[error("{field} = {value} is out of range ({range})")]
    OutOfRange {
        /// The key (with the tool or model, for per-name limits).
        field: String,
        /// The value refused.
        value: String,
        /// The range accepted.
        range: String,
    },
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

    /// The most a call of `input_tokens` in and `output_tokens` out can cost at any price of
    /// the table: what a call is reserved at before the model that answers is known. `None`
    /// for an empty table (such a call cannot be bounded).
    pub fn ceiling_minor(&self, input_tokens: u64, output_tokens: u64) -> Option<i64> {
        self.0.keys().filter_map(|model| self.cost_minor(model, input_tokens, output_tokens)).max()
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
    fn every_dimension_is_bounded_by_default_and_a_priced_run_in_cost_too() {
        let base = AgentLimits::default();
        assert_eq!(base.input_tokens_max, Some(limits::AGENT_INPUT_TOKENS_DEFAULT));
        assert_eq!(base.output_tokens_max, Some(limits::AGENT_OUTPUT_TOKENS_DEFAULT));
        let price = json!({"m": {"input_minor_per_mtok": 300, "output_minor_per_mtok": 1500}});
        let priced = base.overridden_by(&json!({"prices": price})).expect("valid");
        assert_eq!(priced.cost_minor_max, Some(limits::AGENT_COST_DEFAULT_MINOR), "bounded without a flag");
        let named = base.overridden_by(&json!({"prices": price, "cost_minor_max": 7})).expect("valid");
        assert_eq!(named.cost_minor_max, Some(7), "a named cost limit is the caller's");
        for unbounded in [json!({"prices": price, "cost_minor_max": null}), json!({"input_tokens_max": null})] {
            assert!(base.overridden_by(&unbounded).is_err(), "{unbounded}: a caller cannot unbound a run");
        }
    }

    #[test]
    fn every_bound_has_a_range_and_an_error_names_its_key() {
        let base = AgentLimits::default();
        assert_eq!(base.validate(), Ok(()), "the defaults are in range");
        for (overrides, field) in [
            (json!({"deadline_ms": u64::MAX}), "deadline_ms"),
            (json!({"model_calls_max": -1}), "model_calls_max"),
            (json!({"cost_minor_max": -1}), "cost_minor_max"),
            (json!({"output_tokens_per_call": 0}), "output_tokens_per_call"),
            (json!({"tool_calls_per_tool_max": {"": 1}}), "tool_calls_per_tool_max"),
        ] {
            let error = base.overridden_by(&overrides).expect_err("out of range").to_string();
            assert!(error.starts_with(field), "{overrides}: {error}");
        }
    }

    #[test]
    fn cost_rounds_up_and_unknown_models_have_no_price() {
        let mut table = PriceTable::default();
        table.0.insert("m".into(), ModelPrice { input_minor_per_mtok: 300, output_minor_per_mtok: 1_500 });
        assert_eq!(table.cost_minor("m", 1_000_000, 0), Some(300));
        assert_eq!(table.cost_minor("m", 1, 1), Some(2));
        assert_eq!(table.cost_minor("m", 0, 0), Some(0));
        assert_eq!(table.cost_minor("other", 1, 1), None);
        table.0.insert("dear".into(), ModelPrice { input_minor_per_mtok: 3_000, output_minor_per_mtok: 0 });
        assert_eq!(table.ceiling_minor(1_000_000, 0), Some(3_000), "the dearest price bounds a call");
        assert_eq!(PriceTable::default().ceiling_minor(1, 1), None);
    }
}
