//! The simulator's seeded fault plan.
//!
//! Owns the plan format ([`FaultPlan`]), its validation ([`PlanError`], which always names the
//! rule index at fault) and the deterministic decision of which fault, if any, applies to one
//! request ([`FaultState::decide`]). It must never touch the database or the network and never
//! read a clock: given the same plan and the same order of requests it returns the same faults.
//!
//! # Format
//!
//! ```json
//! {"seed": 7, "rules": [
//!   {"operation": "charge", "fault": "timeout_after_effect", "times": 1, "ms": 2000},
//!   {"operation": "any", "fault": "unavailable", "probability": 0.1},
//!   {"operation": "lookup", "fault": "lookup_absent_for_ms", "ms": 1500}
//! ]}
//! ```
//!
//! - `seed` (optional, default 0): seeds the PRNG that `probability` rules draw from.
//! - `operation`: `charge`, `refund`, `lookup` or `any`.
//! - `fault`: one of the [`Fault`] names below. Effect faults (`fail_before_effect`,
//!   `timeout_after_effect`, `unavailable`, `decline`, `slow`) apply to charges and refunds;
//!   lookup faults (`lookup_absent_for_ms`, `lookup_lies`, `lookup_unavailable`) apply to
//!   lookups. A rule whose `operation` can never meet its fault (`lookup` + `decline`) is
//!   refused; `any` matches whichever operations the fault applies to.
//! - `times` (integer ≥ 1) or `probability` (a number in `[0, 1]`): exactly one of them.
//!   `lookup_absent_for_ms` alone may have neither, meaning "every lookup".
//! - `ms`: only for `timeout_after_effect` (how long the answer is held, default 30000),
//!   `slow` (the delay before answering, default 1000) and `lookup_absent_for_ms` (the
//!   consistency window, required).
//!
//! Unknown fields are refused, so a misspelt `probabilty` is an error rather than a rule that
//! silently fires every time.
//!
//! # Decision order
//!
//! For each request the rules are checked in file order. A rule whose operation and fault do
//! not match the request is skipped without any side effect. A matching `times` rule fires
//! while it has firings left and is spent after `times` firings. A matching `probability` rule
//! draws exactly one number from the PRNG and fires when the draw is below `probability`. The
//! first rule that fires decides the request; later rules are neither checked nor counted.
//!
//! `lookup_absent_for_ms` follows the same rule: when it fires for a lookup, that lookup
//! misses the objects younger than `ms` and shows the others (the firing is
//! spent either way). With neither `times` nor `probability` it fires on every lookup, which
//! is the usual way to model an eventually consistent provider.

use crate::rng::Rng;
use serde::Deserialize;
use std::path::Path;

/// The default hold of `timeout_after_effect`: longer than any sane client timeout.
pub const TIMEOUT_AFTER_EFFECT_DEFAULT_MS: u64 = 30_000;

/// The default delay of `slow`.
pub const SLOW_DEFAULT_MS: u64 = 1_000;

/// Why a fault plan was refused. Every rule-level error names the rule's index (from 0).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The plan file could not be read.
    #[error("cannot read fault plan {path}: {source}")]
    Io {
        /// The file that was asked for.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The plan is not strict JSON: not JSON at all, or an object that repeats a key (which
    /// would silently keep the last value), or nested too deep.
    #[error("fault plan is not strict JSON: {0}")]
    Strict(engine::canonical::StrictJsonError),
    /// The plan is not JSON of the expected shape (outside any single rule).
    #[error("fault plan is not valid JSON of the form {{\"seed\": N, \"rules\": [...]}}: {0}")]
    Json(serde_json::Error),
    /// One rule does not have the expected shape (unknown field, wrong type, missing field).
    #[error("fault plan rule {index}: {message}")]
    RuleShape {
        /// The rule's index in `rules`, from 0.
        index: usize,
        /// What is wrong, from the JSON reader.
        message: String,
    },
    /// The `fault` name is not one the simulator knows.
    #[error("fault plan rule {index}: unknown fault {name:?} (expected one of {})", Fault::NAMES.join(", "))]
    UnknownFault {
        /// The rule's index.
        index: usize,
        /// The name found.
        name: String,
    },
    /// The `operation` name is not one the simulator knows.
    #[error("fault plan rule {index}: unknown operation {name:?} (expected charge, refund, lookup or any)")]
    UnknownOperation {
        /// The rule's index.
        index: usize,
        /// The name found.
        name: String,
    },
    /// The fault can never apply to the operation (e.g. `decline` on `lookup`).
    #[error("fault plan rule {index}: fault {fault} never applies to operation {operation}")]
    FaultNotForOperation {
        /// The rule's index.
        index: usize,
        /// The fault's name.
        fault: &'static str,
        /// The operation's name.
        operation: &'static str,
    },
    /// Both `times` and `probability` were given.
    #[error("fault plan rule {index}: give either \"times\" or \"probability\", not both")]
    BothTimesAndProbability {
        /// The rule's index.
        index: usize,
    },
    /// Neither `times` nor `probability` was given for a fault that needs one.
    #[error("fault plan rule {index}: fault {fault} needs \"times\" (>= 1) or \"probability\" (in [0, 1])")]
    NeitherTimesNorProbability {
        /// The rule's index.
        index: usize,
        /// The fault's name.
        fault: &'static str,
    },
    /// `probability` is outside `[0, 1]` or not a number.
    #[error("fault plan rule {index}: probability {value} is outside [0, 1]")]
    ProbabilityOutOfRange {
        /// The rule's index.
        index: usize,
        /// The value found.
        value: f64,
    },
    /// `times` is zero, which would be a rule that never fires.
    #[error("fault plan rule {index}: times must be at least 1")]
    ZeroTimes {
        /// The rule's index.
        index: usize,
    },
    /// `ms` was given for a fault it means nothing to.
    #[error("fault plan rule {index}: \"ms\" has no meaning for fault {fault}")]
    MsNotAllowed {
        /// The rule's index.
        index: usize,
        /// The fault's name.
        fault: &'static str,
    },
    /// `ms` is missing where it has no sensible default.
    #[error("fault plan rule {index}: fault {fault} needs \"ms\" (the window in milliseconds)")]
    MsRequired {
        /// The rule's index.
        index: usize,
        /// The fault's name.
        fault: &'static str,
    },
}

/// The operation a request performs, as fault rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/payment_intents`.
    Charge,
    /// `POST /v1/refunds`.
    Refund,
    /// `GET /v1/payment_intents/search` or `GET /v1/refunds`.
    Lookup,
}

/// Which operations a rule targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Only(Operation),
    Any,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Self::Only(Operation::Charge) => "charge",
            Self::Only(Operation::Refund) => "refund",
            Self::Only(Operation::Lookup) => "lookup",
            Self::Any => "any",
        }
    }
}

/// One fault the simulator can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer 500 `api_error`; no effect, no idempotency record.
    FailBeforeEffect,
    /// Commit the effect and its idempotency record, then hold the answer for `ms`.
    TimeoutAfterEffect {
        /// How long the answer is held.
        ms: u64,
    },
    /// Answer 503; no effect.
    Unavailable,
    /// Answer 402 `card_declined`; no effect; the idempotency record keeps the decline.
    Decline,
    /// Commit the effect, wait `ms`, then answer normally.
    Slow {
        /// The delay before answering.
        ms: u64,
    },
    /// A lookup misses the objects younger than `ms` (Stripe's search lag).
    LookupAbsentForMs {
        /// The consistency window.
        ms: u64,
    },
    /// A lookup finds nothing although the objects exist.
    LookupLies,
    /// A lookup answers 503.
    LookupUnavailable,
}

impl Fault {
    /// Every fault name the plan accepts, in documentation order.
    pub const NAMES: [&'static str; 8] = [
        "fail_before_effect",
        "timeout_after_effect",
        "unavailable",
        "decline",
        "slow",
        "lookup_absent_for_ms",
        "lookup_lies",
        "lookup_unavailable",
    ];

    /// One of every fault, with its default `ms`: what a schedule that must draw every kind
    /// iterates (the test kit matches on each exhaustively, so a new kind added here does not
    /// compile there until it is drawn).
    pub const ALL: [Fault; 8] = [
        Self::FailBeforeEffect,
        Self::TimeoutAfterEffect { ms: TIMEOUT_AFTER_EFFECT_DEFAULT_MS },
        Self::Unavailable,
        Self::Decline,
        Self::Slow { ms: SLOW_DEFAULT_MS },
        Self::LookupAbsentForMs { ms: SLOW_DEFAULT_MS },
        Self::LookupLies,
        Self::LookupUnavailable,
    ];

    /// The fault's name in plans.
    pub fn name(&self) -> &'static str {
        match self {
            Self::FailBeforeEffect => "fail_before_effect",
            Self::TimeoutAfterEffect { .. } => "timeout_after_effect",
            Self::Unavailable => "unavailable",
            Self::Decline => "decline",
            Self::Slow { .. } => "slow",
            Self::LookupAbsentForMs { .. } => "lookup_absent_for_ms",
            Self::LookupLies => "lookup_lies",
            Self::LookupUnavailable => "lookup_unavailable",
        }
    }

    /// Whether the fault concerns lookups (as opposed to charges and refunds).
    fn is_lookup_fault(&self) -> bool {
        matches!(self, Self::LookupAbsentForMs { .. } | Self::LookupLies | Self::LookupUnavailable)
    }

    fn applies_to(&self, operation: Operation) -> bool {
        self.is_lookup_fault() == (operation == Operation::Lookup)
    }
}

/// When a rule fires.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Firing {
    /// On the next `remaining` matching requests.
    Times { remaining: u64 },
    /// On each matching request with this probability.
    Probability(f64),
    /// On every matching request.
    Always,
}

/// One validated rule.
#[derive(Clone, Debug, PartialEq)]
struct Rule {
    target: Target,
    fault: Fault,
    firing: Firing,
}

/// A validated fault plan. Build it with [`FaultPlan::from_json`] or [`FaultPlan::load`].
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FaultPlan {
    seed: u64,
    rules: Vec<Rule>,
}

/// The plan as written, before validation. Rules stay raw JSON so that each error can name
/// the rule's index.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default)]
    seed: u64,
    rules: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    operation: String,
    fault: String,
    times: Option<u64>,
    probability: Option<f64>,
    ms: Option<u64>,
}

impl FaultPlan {
    /// A plan with no rules: no faults.
    pub fn none() -> Self {
        Self::default()
    }

    /// Reads and validates a plan file.
    pub fn load(path: &Path) -> Result<Self, PlanError> {
        let text = std::fs::File::open(path)
            .and_then(|file| engine::limits::read_text_at_most(file, engine::limits::FAULT_PLAN_FILE_MAX_BYTES))
            .map_err(|source| PlanError::Io { path: path.display().to_string(), source })?;
        Self::from_json(&text)
    }

    /// Parses and validates a plan.
    pub fn from_json(text: &str) -> Result<Self, PlanError> {
        let value = engine::canonical::parse_strict(text).map_err(PlanError::Strict)?;
        let raw: RawPlan = engine::canonical::decode(value).map_err(PlanError::Json)?;
        let rules = raw
            .rules
            .into_iter()
            .enumerate()
            .map(|(index, value)| validate_rule(index, value))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { seed: raw.seed, rules })
    }

    /// The PRNG seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// How many rules the plan has.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

fn validate_rule(index: usize, value: serde_json::Value) -> Result<Rule, PlanError> {
    let raw: RawRule =
        engine::canonical::decode(value).map_err(|e| PlanError::RuleShape { index, message: e.to_string() })?;
    let target = match raw.operation.as_str() {
        "charge" => Target::Only(Operation::Charge),
        "refund" => Target::Only(Operation::Refund),
        "lookup" => Target::Only(Operation::Lookup),
        "any" => Target::Any,
        other => {
            return Err(PlanError::UnknownOperation { index, name: other.to_owned() });
        }
    };
    // `ms` is checked per fault so that a meaningless `ms` is an error, not ignored.
    let ms_or = |fault: &'static str, default: Option<u64>| -> Result<u64, PlanError> {
        raw.ms.or(default).ok_or(PlanError::MsRequired { index, fault })
    };
    let no_ms = |fault: &'static str| -> Result<(), PlanError> {
        match raw.ms {
            Some(_) => Err(PlanError::MsNotAllowed { index, fault }),
            None => Ok(()),
        }
    };
    let fault = match raw.fault.as_str() {
        "fail_before_effect" => no_ms("fail_before_effect").map(|()| Fault::FailBeforeEffect)?,
        "timeout_after_effect" => {
            Fault::TimeoutAfterEffect { ms: ms_or("timeout_after_effect", Some(TIMEOUT_AFTER_EFFECT_DEFAULT_MS))? }
        }
        "unavailable" => no_ms("unavailable").map(|()| Fault::Unavailable)?,
        "decline" => no_ms("decline").map(|()| Fault::Decline)?,
        "slow" => Fault::Slow { ms: ms_or("slow", Some(SLOW_DEFAULT_MS))? },
        "lookup_absent_for_ms" => Fault::LookupAbsentForMs { ms: ms_or("lookup_absent_for_ms", None)? },
        "lookup_lies" => no_ms("lookup_lies").map(|()| Fault::LookupLies)?,
        "lookup_unavailable" => no_ms("lookup_unavailable").map(|()| Fault::LookupUnavailable)?,
        other => {
            return Err(PlanError::UnknownFault { index, name: other.to_owned() });
        }
    };
    if let Target::Only(operation) = target
        && !fault.applies_to(operation)
    {
        return Err(PlanError::FaultNotForOperation { index, fault: fault.name(), operation: target.name() });
    }
    let firing = match (raw.times, raw.probability) {
        (Some(_), Some(_)) => return Err(PlanError::BothTimesAndProbability { index }),
        (Some(0), None) => return Err(PlanError::ZeroTimes { index }),
        (Some(times), None) => Firing::Times { remaining: times },
        (None, Some(p)) if !(0.0..=1.0).contains(&p) => {
            return Err(PlanError::ProbabilityOutOfRange { index, value: p });
        }
        (None, Some(p)) => Firing::Probability(p),
        (None, None) if matches!(fault, Fault::LookupAbsentForMs { .. }) => Firing::Always,
        (None, None) => {
            return Err(PlanError::NeitherTimesNorProbability { index, fault: fault.name() });
        }
    };
    Ok(Rule { target, fault, firing })
}

/// A plan being played: the rules' remaining firings and the PRNG. One per server; callers
/// serialise access so that decisions follow request arrival order.
#[derive(Clone, Debug)]
pub struct FaultState {
    rules: Vec<Rule>,
    prng: Rng,
}

impl FaultState {
    /// Starts playing `plan` from its first request.
    pub fn new(plan: &FaultPlan) -> Self {
        Self { rules: plan.rules.clone(), prng: Rng::from_state(plan.seed) }
    }

    /// The fault for the next request of `operation`, if any; see the module doc for the
    /// order in which rules are checked and counted.
    pub fn decide(&mut self, operation: Operation) -> Option<Fault> {
        for rule in &mut self.rules {
            let matches = match rule.target {
                Target::Only(op) => op == operation,
                Target::Any => true,
            } && rule.fault.applies_to(operation);
            if !matches {
                continue;
            }
            let fires = match &mut rule.firing {
                Firing::Times { remaining } if *remaining > 0 => {
                    *remaining -= 1;
                    true
                }
                Firing::Times { .. } => false,
                Firing::Probability(p) => self.prng.chance(*p),
                Firing::Always => true,
            };
            if fires {
                return Some(rule.fault);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match FaultPlan::from_json(text) {
            Ok(plan) => panic!("plan {text} should be refused, got {plan:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn all_holds_every_named_fault_once_in_documentation_order() {
        assert_eq!(Fault::ALL.map(|fault| fault.name()), Fault::NAMES);
    }

    #[test]
    fn bad_json_is_refused() {
        let e = err("{\"seed\": 1, \"rules\": [");
        assert!(e.contains("not valid JSON"), "{e}");
    }

    #[test]
    fn unknown_top_level_field_is_refused() {
        let e = err(r#"{"seed": 1, "rulez": []}"#);
        assert!(e.contains("rulez"), "{e}");
    }

    #[test]
    fn unknown_fault_names_the_rule() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"slow","times":1},
                          {"operation":"charge","fault":"explode","times":1}]}"#);
        assert!(e.contains("rule 1"), "{e}");
        assert!(e.contains("unknown fault \"explode\""), "{e}");
    }

    #[test]
    fn unknown_operation_names_the_rule() {
        let e = err(r#"{"rules": [{"operation":"payout","fault":"slow","times":1}]}"#);
        assert!(e.contains("rule 0: unknown operation \"payout\""), "{e}");
    }

    #[test]
    fn misspelt_field_is_refused() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","probabilty":0.5}]}"#);
        assert!(e.contains("rule 0"), "{e}");
        assert!(e.contains("probabilty"), "{e}");
    }

    #[test]
    fn probability_outside_unit_interval_is_refused() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","probability":1.5}]}"#);
        assert!(e.contains("rule 0: probability 1.5 is outside [0, 1]"), "{e}");
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","probability":-0.1}]}"#);
        assert!(e.contains("rule 0: probability -0.1"), "{e}");
    }

    #[test]
    fn both_times_and_probability_are_refused() {
        let e = err(r#"{"rules": [{"operation":"any","fault":"unavailable","times":1,"probability":0.5}]}"#);
        assert!(e.contains("rule 0: give either"), "{e}");
    }

    #[test]
    fn neither_times_nor_probability_is_refused_for_effect_faults() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline"}]}"#);
        assert!(e.contains("rule 0: fault decline needs \"times\""), "{e}");
    }

    #[test]
    fn zero_times_is_refused() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","times":0}]}"#);
        assert!(e.contains("rule 0: times must be at least 1"), "{e}");
    }

    #[test]
    fn fault_on_wrong_operation_is_refused() {
        let e = err(r#"{"rules": [{"operation":"lookup","fault":"decline","times":1}]}"#);
        assert!(e.contains("rule 0: fault decline never applies to operation lookup"), "{e}");
        let e = err(r#"{"rules": [{"operation":"refund","fault":"lookup_lies","times":1}]}"#);
        assert!(e.contains("never applies to operation refund"), "{e}");
    }

    #[test]
    fn ms_where_meaningless_is_refused() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","times":1,"ms":5}]}"#);
        assert!(e.contains("rule 0: \"ms\" has no meaning for fault decline"), "{e}");
    }

    #[test]
    fn consistency_window_needs_ms() {
        let e = err(r#"{"rules": [{"operation":"lookup","fault":"lookup_absent_for_ms"}]}"#);
        assert!(e.contains("rule 0: fault lookup_absent_for_ms needs \"ms\""), "{e}");
    }

    #[test]
    fn wrong_type_names_the_rule() {
        let e = err(r#"{"rules": [{"operation":"charge","fault":"decline","times":"once"}]}"#);
        assert!(e.contains("rule 0"), "{e}");
    }

    #[test]
    fn defaults_are_applied() -> Result<(), PlanError> {
        let plan = FaultPlan::from_json(
            r#"{"rules": [{"operation":"charge","fault":"timeout_after_effect","times":1},
                          {"operation":"any","fault":"slow","times":1},
                          {"operation":"lookup","fault":"lookup_absent_for_ms","ms":10}]}"#,
        )?;
        assert_eq!(plan.seed(), 0);
        let mut state = FaultState::new(&plan);
        assert_eq!(state.decide(Operation::Charge), Some(Fault::TimeoutAfterEffect { ms: 30_000 }));
        assert_eq!(state.decide(Operation::Charge), Some(Fault::Slow { ms: 1_000 }));
        assert_eq!(state.decide(Operation::Charge), None);
        assert_eq!(state.decide(Operation::Lookup), Some(Fault::LookupAbsentForMs { ms: 10 }));
        assert_eq!(state.decide(Operation::Lookup), Some(Fault::LookupAbsentForMs { ms: 10 }));
        Ok(())
    }

    #[test]
    fn times_rules_are_spent_in_order_and_skip_other_operations() -> Result<(), PlanError> {
        let plan = FaultPlan::from_json(
            r#"{"rules": [{"operation":"refund","fault":"decline","times":1},
                          {"operation":"any","fault":"unavailable","times":2},
                          {"operation":"any","fault":"lookup_unavailable","times":1}]}"#,
        )?;
        let mut state = FaultState::new(&plan);
        assert_eq!(state.decide(Operation::Lookup), Some(Fault::LookupUnavailable));
        assert_eq!(state.decide(Operation::Charge), Some(Fault::Unavailable));
        assert_eq!(state.decide(Operation::Refund), Some(Fault::Decline));
        assert_eq!(state.decide(Operation::Refund), Some(Fault::Unavailable));
        assert_eq!(state.decide(Operation::Refund), None);
        assert_eq!(state.decide(Operation::Lookup), None);
        Ok(())
    }

    #[test]
    fn probability_rules_are_deterministic_for_a_seed() -> Result<(), PlanError> {
        let text = |seed: u64| {
            format!(r#"{{"seed": {seed}, "rules": [{{"operation":"any","fault":"unavailable","probability":0.5}}]}}"#)
        };
        let run = |seed: u64| -> Result<Vec<bool>, PlanError> {
            let mut state = FaultState::new(&FaultPlan::from_json(&text(seed))?);
            Ok((0..64).map(|_| state.decide(Operation::Charge).is_some()).collect())
        };
        let a = run(42)?;
        assert_eq!(a, run(42)?, "same seed, same faults");
        assert_ne!(a, run(43)?, "another seed gives another sequence");
        let fired = a.iter().filter(|f| **f).count();
        assert!((16..=48).contains(&fired), "p=0.5 over 64 draws fired {fired} times");
        Ok(())
    }

    #[test]
    fn probability_bounds_are_exact() -> Result<(), PlanError> {
        let plan = FaultPlan::from_json(
            r#"{"seed": 9, "rules": [{"operation":"charge","fault":"decline","probability":0},
                                     {"operation":"charge","fault":"unavailable","probability":1}]}"#,
        )?;
        let mut state = FaultState::new(&plan);
        for _ in 0..100 {
            assert_eq!(state.decide(Operation::Charge), Some(Fault::Unavailable));
        }
        Ok(())
    }
}
