//! Strict validation of workflow inputs (seed 004's contract).
//!
//! Owns [`Fields`], a reader over a JSON object that collects every problem as
//! `field: message` instead of stopping at the first, and refuses unknown fields, and
//! [`EffectInput`], the typed fields every single-effect workflow shares, and
//! [`check_policy`], the operator's rules they are all held to. It never
//! coerces: a string is not a number, `49.5` is not an amount in minor units. The one
//! normalisation is the wire's own: a currency code is case-insensitive, so `eur` is `EUR`.
//!
//! Identifiers (intent ids, order ids) travel to the provider in headers and metadata, so
//! they are visible ASCII only: a control character, a zero-width space or an accented letter
//! would be accepted here and fail there, leaving an effect of unknown outcome.

use engine::event::{SignalName, is_uuid};
use engine::executor::{IntentRequest, Rejection};
use engine::ledger::RejectCode;
use engine::limits::{INTENT_ID_MAX_CHARS, INTENT_ID_MIN_CHARS, ORDER_ID_MAX_CHARS, PAYMENT_METHOD_TOKEN_MAX_CHARS};
use engine::money::{Currency, check_amount};
use engine::policy::Rules;
use engine::provider::{EffectKind, Secret};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Currencies the provider accepts.
pub const CURRENCIES: [&str; 3] = ["EUR", "USD", "XOF"];

/// A currency code as every door reads it — a charge's or a refund's input, the operator's
/// policy: one of [`CURRENCIES`], in any case.
///
/// # Errors
///
/// Why it is not one, naming the code and the supported ones.
pub fn supported_currency(text: &str) -> Result<Currency, String> {
    match Currency::parse(text) {
        Ok(code) if CURRENCIES.contains(&code.as_str()) => Ok(code),
        _ => Err(format!("unsupported currency {text:?} (supported: {})", CURRENCIES.join(", "))),
    }
}

/// A strict reader over one JSON object.
pub struct Fields<'a> {
    object: Option<&'a Map<String, Value>>,
    problems: Vec<String>,
}

impl<'a> Fields<'a> {
    /// Starts reading `raw`, which must be an object whose keys are all in `allowed`.
    pub fn new(raw: &'a Value, allowed: &[&str]) -> Self {
        let mut problems = Vec::new();
        let object = raw.as_object();
        match object {
            None => problems.push("input: must be a JSON object".to_owned()),
            Some(map) => {
                let mut unknown: Vec<&String> = map.keys().filter(|k| !allowed.contains(&k.as_str())).collect();
                unknown.sort();
                problems.extend(
                    unknown.into_iter().map(|k| format!("{k}: unknown field (allowed: {})", allowed.join(", "))),
                );
            }
        }
        Self { object, problems }
    }

    fn get(&mut self, name: &str) -> Option<&'a Value> {
        let value = self.object?.get(name);
        if value.is_none() {
            self.problems.push(format!("{name}: required"));
        }
        value
    }

    /// A string between `min` and `max` characters.
    pub fn string(&mut self, name: &str, min: usize, max: usize) -> String {
        match self.get(name) {
            Some(Value::String(s)) => {
                let chars = s.chars().count();
                if chars < min {
                    self.problems.push(format!("{name}: must be at least {min} characters (got {chars})"));
                } else if chars > max {
                    self.problems.push(format!("{name}: must be at most {max} characters (got {chars})"));
                }
                s.clone()
            }
            Some(_) => {
                self.problems.push(format!("{name}: must be a string"));
                String::new()
            }
            None => String::new(),
        }
    }

    /// A payment method id in Stripe's format: `pm_` then one or more ASCII letters, digits or
    /// `_`, at most [`PAYMENT_METHOD_TOKEN_MAX_CHARS`] in all — a real id (`pm_1Nq…`) or a test
    /// one (`pm_card_visa`) as is. Whitespace, control and non-ASCII characters are refused;
    /// the message never quotes the token, a secret.
    pub fn payment_method(&mut self, name: &str) -> String {
        let value = self.string(name, 1, PAYMENT_METHOD_TOKEN_MAX_CHARS);
        let given = self.object.and_then(|o| o.get(name)).is_some_and(Value::is_string);
        let shaped = value
            .strip_prefix("pm_")
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let sized = (1..=PAYMENT_METHOD_TOKEN_MAX_CHARS).contains(&value.chars().count());
        if given && sized && !shaped {
            self.problems.push(format!(
                "{name}: must be a Stripe PaymentMethod id: pm_ then letters, digits or _ (a real id or a test one)"
            ));
        }
        value
    }

    /// A tenant id: a UUID in its 8-4-4-4-12 hex form.
    pub fn uuid(&mut self, name: &str) -> String {
        let value = self.string(name, 0, usize::MAX);
        if self.object.and_then(|o| o.get(name)).is_some_and(Value::is_string) && !is_uuid(&value) {
            self.problems.push(format!("{name}: must be a UUID (8-4-4-4-12 hex digits)"));
        }
        value.to_ascii_lowercase()
    }

    /// An identifier of `min` to `max` characters, each visible ASCII (no space, no control,
    /// invisible or non-ASCII character).
    pub fn identifier(&mut self, name: &str, min: usize, max: usize) -> String {
        let value = self.string(name, min, max);
        if let Some(bad) = value.chars().find(|c| !c.is_ascii_graphic()) {
            self.problems
                .push(format!("{name}: must be visible ASCII characters only (found {:?}, U+{:04X})", bad, bad as u32));
        }
        value
    }

    /// An intent id of 12 to 120 visible ASCII characters.
    pub fn intent_id(&mut self, name: &str) -> String {
        self.identifier(name, INTENT_ID_MIN_CHARS, INTENT_ID_MAX_CHARS)
    }

    /// A positive amount in integer minor units, at most `engine::limits::AMOUNT_MINOR_MAX`.
    pub fn amount_minor(&mut self, name: &str) -> i64 {
        match self.get(name) {
            Some(Value::Number(n)) => match n.as_i64() {
                Some(amount) => match check_amount(amount) {
                    Ok(amount) => amount,
                    Err(e) => {
                        self.problems.push(format!("{name}: must be a positive integer of minor units: {e}"));
                        0
                    }
                },
                None if n.is_u64() => {
                    self.problems
                        .push(format!("{name}: {n} is above the maximum of {}", engine::limits::AMOUNT_MINOR_MAX));
                    0
                }
                None => {
                    self.problems.push(format!("{name}: must be an integer number of minor units (got {n})"));
                    0
                }
            },
            Some(_) => {
                self.problems.push(format!("{name}: must be a positive integer (minor units)"));
                0
            }
            None => 0,
        }
    }

    /// One of [`CURRENCIES`], in any case ([`supported_currency`]); returned upper case.
    pub fn currency(&mut self, name: &str) -> String {
        let value = self.string(name, 0, usize::MAX);
        let present = self.object.and_then(|o| o.get(name)).is_some_and(Value::is_string);
        match supported_currency(&value) {
            Ok(code) => code.into_string(),
            Err(why) => {
                if present {
                    self.problems.push(format!("{name}: {why}"));
                }
                value
            }
        }
    }

    /// The five fields every single-effect input has (tenant UUID, intent id, order id,
    /// amount, currency), read in that order, problems collected.
    pub fn effect(&mut self) -> EffectInput {
        EffectInput {
            tenant_id: self.uuid("tenant_id"),
            intent_id: self.intent_id("intent_id"),
            order_id: self.identifier("order_id", 1, ORDER_ID_MAX_CHARS),
            amount_minor: self.amount_minor("amount_minor"),
            currency: self.currency("currency"),
        }
    }

    /// An optional signal name ([`SignalName`]); `None` when absent.
    pub fn optional_signal_name(&mut self, name: &str) -> Option<SignalName> {
        match self.object?.get(name)? {
            Value::String(text) => match SignalName::parse(text) {
                Ok(signal) => Some(signal),
                Err(why) => {
                    self.problems.push(format!("{name}: {why}"));
                    None
                }
            },
            _ => {
                self.problems.push(format!("{name}: must be a string"));
                None
            }
        }
    }

    /// An optional duration in ms, from 1 to `max`; `None` when absent.
    pub fn optional_ms(&mut self, name: &str, max: u64) -> Option<u64> {
        match self.object?.get(name)?.as_u64() {
            Some(ms) if (1..=max).contains(&ms) => Some(ms),
            _ => {
                self.problems.push(format!("{name}: must be an integer number of ms from 1 to {max}"));
                None
            }
        }
    }

    /// Every problem found, or `Ok` when there are none.
    pub fn finish(self) -> Result<(), Vec<String>> {
        if self.problems.is_empty() { Ok(()) } else { Err(self.problems) }
    }
}

/// Refuses (`policy_denied`) an effect the operator's rules do not allow: above the maximum
/// amount, or in a currency outside the allowed ones. No rules: nothing to check.
///
/// # Errors
///
/// The rejection, saying which rule and what it allows.
pub fn check_policy(effect: &EffectInput, rules: Option<&Rules>) -> Result<(), Rejection> {
    match rules.and_then(|rules| rules.denies(effect.amount_minor, &effect.currency)) {
        None => Ok(()),
        Some(why) => Err(Rejection { code: RejectCode::PolicyDenied, details: vec![why] }),
    }
}

/// Reads the tenant of a single-effect input as the workflows will (a lower-case UUID), to
/// pick the operator's rules for it before the run starts; `None` when the input has no
/// valid tenant (the run is then rejected `invalid_arguments` by the workflow itself).
pub fn tenant_of(raw: &Value) -> Option<String> {
    let mut fields = Fields::new(raw, &["tenant_id"]);
    let tenant = fields.uuid("tenant_id");
    is_uuid(&tenant).then_some(tenant)
}

/// What every single-effect input holds once validated: stored as this object in
/// `RunStarted`, decoded back into it on replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectInput {
    /// The tenant, a lower-case UUID.
    pub tenant_id: String,
    /// The caller's intent id.
    pub intent_id: String,
    /// The order.
    pub order_id: String,
    /// The amount, in minor units.
    pub amount_minor: i64,
    /// The currency, upper case.
    pub currency: String,
}

impl EffectInput {
    /// The intent a single-effect workflow asks for: the business reference is the order,
    /// and the fingerprint covers `order_id`, `amount_minor`, `currency` and `extra` (named
    /// fields the effect also depends on, already hashed if secret).
    pub fn intent_request(
        &self,
        kind: EffectKind,
        extra: Map<String, Value>,
        payment_method: Option<Secret>,
    ) -> IntentRequest {
        let mut payload = extra;
        payload.insert("order_id".to_owned(), Value::String(self.order_id.clone()));
        payload.insert("amount_minor".to_owned(), Value::from(self.amount_minor));
        payload.insert("currency".to_owned(), Value::String(self.currency.clone()));
        IntentRequest {
            kind,
            tenant: self.tenant_id.clone(),
            intent_id: self.intent_id.clone(),
            order_id: self.order_id.clone(),
            business_ref: self.order_id.clone(),
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            payload: Value::Object(payload),
            payment_method,
            tool: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn collects_every_problem_and_refuses_unknown_fields() {
        let raw = json!({"tenant_id": "nope", "amount_minor": -5, "currency": "GBP", "extra": 1});
        let mut fields = Fields::new(&raw, &["tenant_id", "amount_minor", "currency", "intent_id"]);
        fields.uuid("tenant_id");
        fields.amount_minor("amount_minor");
        fields.currency("currency");
        fields.intent_id("intent_id");
        let problems = fields.finish().expect_err("the input is bad in four ways");
        assert!(problems.iter().any(|p| p.starts_with("extra: unknown field")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("tenant_id: must be a UUID")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("amount_minor: must be a positive integer")), "{problems:?}");
        assert!(problems.iter().any(|p| p.starts_with("currency: unsupported currency")), "{problems:?}");
        assert!(problems.iter().any(|p| p == "intent_id: required"), "{problems:?}");
    }

    #[test]
    fn fractional_amounts_and_numeric_strings_are_not_minor_units() {
        for bad in [json!({"a": 49.5}), json!({"a": "4900"}), json!({"a": 0})] {
            let mut fields = Fields::new(&bad, &["a"]);
            fields.amount_minor("a");
            assert!(fields.finish().is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn stripe_payment_method_ids_pass_as_they_are_and_garbage_does_not() {
        let check = |token: &str| {
            let raw = json!({"t": token});
            let mut fields = Fields::new(&raw, &["t"]);
            fields.payment_method("t");
            fields.finish()
        };
        for good in ["pm_card_visa", "pm_card_visa_chargeDeclined", "pm_1NqLiJLkdIwHu7ixUEgbFdYF", "pm_x"] {
            assert!(check(good).is_ok(), "{good} is a Stripe PaymentMethod id");
        }
        let long = format!("pm_{}", "a".repeat(PAYMENT_METHOD_TOKEN_MAX_CHARS));
        for bad in [
            "",
            " ",
            "pm_",
            "pm_card visa",
            " pm_card_visa",
            "pm_card_visa\n",
            "pm_card\u{0}",
            "pm_cärd",
            "card_visa",
            "tok_visa",
            long.as_str(),
        ] {
            let problems = check(bad).expect_err("garbage is refused");
            assert!(problems.iter().all(|p| p.starts_with("t: ")), "{problems:?}");
            assert!(
                bad.len() < 5 || problems.iter().all(|p| !p.contains(bad)),
                "a secret is never quoted: {problems:?}"
            );
        }
        let raw = json!({"t": 42});
        let mut fields = Fields::new(&raw, &["t"]);
        fields.payment_method("t");
        assert_eq!(fields.finish().expect_err("a number is no id"), vec!["t: must be a string".to_owned()]);
    }

    #[test]
    fn uuid_shape_is_checked() {
        assert!(is_uuid("3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d10"));
        assert!(!is_uuid("3f1c2a9e7b1d4c1e9a510f8e2b6c4d10"));
        assert!(!is_uuid("3f1c2a9e-7b1d-4c1e-9a51-0f8e2b6c4d1z"));
    }
}
