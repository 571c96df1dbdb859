//! The simulator's wire format: the subset of Stripe's API that Keel's Stripe client
//! (`adapters::stripe`) sends and reads, answered as Stripe answers it.
//!
//! Owns the form parameters of `POST /v1/payment_intents` and `POST /v1/refunds` (parsed into
//! typed values, unknown or repeated parameters refused as Stripe refuses them), the search
//! query grammar the simulator understands, the API key check, Stripe's test payment methods
//! that decline, and the JSON of every object and error the simulator answers. It must never
//! touch the database, the fault plan or the network, and never keep or echo a payment method.

use crate::{EffectKind, EffectRecord};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Objects a search or list page holds when the request names no `limit`: Stripe's default.
pub(crate) const PAGE_LIMIT_DEFAULT: usize = 10;

/// The largest `limit` a search or list accepts: Stripe's bound (a larger one is a 400).
pub(crate) const PAGE_LIMIT_MAX: usize = 100;

/// A refused request: the HTTP status and Stripe's error object.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: u16,
    pub body: Value,
}

impl Refusal {
    /// A 400 `invalid_request_error`, naming the parameter at fault when there is one.
    pub(crate) fn invalid(code: &str, param: Option<&str>, message: impl Into<String>) -> Self {
        Self { status: 400, body: error("invalid_request_error", code, param, &message.into()) }
    }
}

/// Stripe's error shape: `{"error": {"type", "code", "param"?, "message"}}`, of type
/// `api_error`, `card_error`, `idempotency_error` or `invalid_request_error`.
pub(crate) fn error(kind: &str, code: &str, param: Option<&str>, message: &str) -> Value {
    let mut error = json!({"type": kind, "code": code, "message": message});
    if let (Some(param), Some(fields)) = (param, error.as_object_mut()) {
        fields.insert("param".to_owned(), param.into());
    }
    json!({ "error": error })
}

/// Whether an `Authorization` header carries a test key: `Bearer sk_test_…` or `Bearer
/// rk_test_…`. A live key is refused like a missing one: the simulator is never a place to
/// send one.
pub(crate) fn is_test_key(authorization: Option<&str>) -> bool {
    let key = authorization.and_then(|value| value.strip_prefix("Bearer ")).unwrap_or_default();
    let rest = key.strip_prefix("sk_test_").or_else(|| key.strip_prefix("rk_test_")).unwrap_or_default();
    !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The form of a request, as ordered pairs; each scalar parameter read at most once.
struct Form {
    pairs: Vec<(String, String)>,
}

impl Form {
    fn parse(body: &[u8]) -> Self {
        Self { pairs: form_urlencoded::parse(body).map(|(k, v)| (k.into_owned(), v.into_owned())).collect() }
    }

    /// Refuses any parameter `allowed` does not accept (Stripe's `parameter_unknown`), and
    /// any repeated one that is not a list (`name[]`): a repeated scalar says two things.
    fn check(&self, allowed: impl Fn(&str) -> bool) -> Result<(), Refusal> {
        let mut seen = std::collections::BTreeSet::new();
        for (name, _) in &self.pairs {
            if !allowed(name) {
                return Err(Refusal::invalid(
                    "parameter_unknown",
                    Some(name),
                    format!("Received unknown parameter: {name}"),
                ));
            }
            if !name.ends_with("[]") && !seen.insert(name.as_str()) {
                return Err(Refusal::invalid(
                    "parameter_invalid",
                    Some(name),
                    format!("the parameter {name} is given twice"),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn required(&self, name: &str) -> Result<&str, Refusal> {
        self.get(name).filter(|value| !value.is_empty()).ok_or_else(|| {
            Refusal::invalid("parameter_missing", Some(name), format!("Missing required param: {name}."))
        })
    }

    fn amount(&self) -> Result<i64, Refusal> {
        let text = self.required("amount")?;
        let invalid = |why: String| Refusal::invalid("parameter_invalid_integer", Some("amount"), why);
        let amount = text.parse::<i64>().map_err(|_| invalid(format!("Invalid integer: {text}")))?;
        engine::money::check_amount(amount).map_err(|e| invalid(format!("amount: {e}")))
    }

    /// `metadata[NAME]` parameters, by name.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.pairs
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("metadata[")?.strip_suffix(']')?.to_owned(), v.clone())))
            .collect()
    }

    /// The hash Stripe compares a replay's parameters with: the pairs sorted, so that the
    /// order a client writes them in does not matter, with the operation, so that a key
    /// reused on the other endpoint is a reuse.
    fn fingerprint(&self, kind: EffectKind) -> String {
        let mut pairs = self.pairs.clone();
        pairs.sort();
        engine::canonical::fingerprint(&json!({"operation": kind.as_str(), "parameters": pairs}))
    }
}

fn is_metadata(name: &str) -> bool {
    name.strip_prefix("metadata[").and_then(|rest| rest.strip_suffix(']')).is_some_and(|key| !key.is_empty())
}

/// A validated `POST /v1/payment_intents`.
pub(crate) struct ChargeParams {
    pub amount: i64,
    /// Lower case, as Stripe keeps it.
    pub currency: String,
    /// Checked, hashed with the request, then dropped: never kept or echoed.
    pub decline: Option<&'static str>,
    pub metadata: BTreeMap<String, String>,
    pub fingerprint: String,
}

/// A validated `POST /v1/refunds`.
pub(crate) struct RefundParams {
    /// The PaymentIntent refunded.
    pub payment_intent: String,
    pub amount: i64,
    pub metadata: BTreeMap<String, String>,
    pub fingerprint: String,
}

/// Reads a charge's form. The simulator only creates PaymentIntents that are confirmed at
/// once (`confirm=true`), as Keel sends them.
pub(crate) fn charge_params(body: &[u8]) -> Result<ChargeParams, Refusal> {
    let form = Form::parse(body);
    form.check(|name| {
        matches!(name, "amount" | "currency" | "payment_method" | "payment_method_types[]" | "confirm" | "off_session")
            || is_metadata(name)
    })?;
    let amount = form.amount()?;
    let currency = form.required("currency")?;
    if engine::money::Currency::parse(currency).is_err() {
        return Err(Refusal::invalid("parameter_invalid", Some("currency"), format!("Invalid currency: {currency}")));
    }
    let method = form.required("payment_method")?;
    if form.get("confirm") != Some("true") {
        return Err(Refusal::invalid(
            "parameter_invalid",
            Some("confirm"),
            "the simulator only creates PaymentIntents confirmed at once (confirm=true)",
        ));
    }
    Ok(ChargeParams {
        amount,
        currency: currency.to_ascii_lowercase(),
        decline: test_decline(method),
        metadata: form.metadata(),
        fingerprint: form.fingerprint(EffectKind::Charge),
    })
}

/// Reads a refund's form.
pub(crate) fn refund_params(body: &[u8]) -> Result<RefundParams, Refusal> {
    let form = Form::parse(body);
    form.check(|name| matches!(name, "payment_intent" | "amount") || is_metadata(name))?;
    Ok(RefundParams {
        payment_intent: form.required("payment_intent")?.to_owned(),
        amount: form.amount()?,
        metadata: form.metadata(),
        fingerprint: form.fingerprint(EffectKind::Refund),
    })
}

/// The `decline_code` of Stripe's test payment methods that decline, or `None` for a method
/// that pays (every other one: the simulator has no cards to check).
fn test_decline(method: &str) -> Option<&'static str> {
    let kind =
        method.strip_prefix("pm_card_visa_chargeDeclined").or_else(|| method.strip_prefix("pm_card_chargeDeclined"))?;
    Some(match kind {
        "" => "generic_decline",
        "InsufficientFunds" => "insufficient_funds",
        "LostCard" => "lost_card",
        "StolenCard" => "stolen_card",
        "ExpiredCard" => "expired_card",
        "IncorrectCvc" => "incorrect_cvc",
        "ProcessingError" => "processing_error",
        "Fraudulent" => "fraudulent",
        _ => "generic_decline",
    })
}

/// Stripe's 402 for a declined confirmation: a `card_error` naming the PaymentIntent, left in
/// `requires_payment_method` with the error as its `last_payment_error`.
pub(crate) fn declined(decline_code: &str, params: &ChargeParams, id: &str, created_s: i64) -> Value {
    let error = json!({
        "type": "card_error",
        "code": "card_declined",
        "decline_code": decline_code,
        "message": "Your card was declined.",
    });
    let mut body = json!({"error": error.clone()});
    let intent = json!({
        "id": id,
        "object": "payment_intent",
        "amount": params.amount,
        "amount_received": 0,
        "currency": params.currency,
        "status": "requires_payment_method",
        "created": created_s,
        "metadata": params.metadata,
        "last_payment_error": error,
    });
    if let Some(fields) = body.get_mut("error").and_then(Value::as_object_mut) {
        fields.insert("payment_intent".to_owned(), intent);
    }
    body
}

/// The object Stripe answers for an effect: a succeeded PaymentIntent (`pi_…`) or Refund
/// (`re_…`), without the payment method.
pub(crate) fn object(effect: &EffectRecord) -> Value {
    let created = effect.created_at_ms.div_euclid(1000);
    match effect.kind {
        EffectKind::Charge => json!({
            "id": effect.id,
            "object": "payment_intent",
            "amount": effect.amount_minor,
            "amount_received": effect.amount_minor,
            "currency": effect.currency,
            "status": "succeeded",
            "confirmation_method": "automatic",
            "capture_method": "automatic",
            "payment_method_types": ["card"],
            "created": created,
            "livemode": false,
            "metadata": effect.metadata,
        }),
        EffectKind::Refund => json!({
            "id": effect.id,
            "object": "refund",
            "amount": effect.amount_minor,
            "currency": effect.currency,
            "status": "succeeded",
            "payment_intent": effect.payment_intent,
            "reason": null,
            "created": created,
            "metadata": effect.metadata,
        }),
    }
}

/// The metadata search the simulator understands: `metadata['FIELD']:'VALUE'`, both single
/// quoted with `\` escaping `\` and `'` (the one clause Keel's client sends). Anything else is
/// refused: the simulator must not answer a query it did not read.
pub(crate) fn search_query(query: &str) -> Result<(String, String), Refusal> {
    let bad = || {
        Refusal::invalid("parameter_invalid", Some("query"), format!("the simulator cannot read the query {query:?}"))
    };
    let rest = query.trim().strip_prefix("metadata[").ok_or_else(bad)?;
    let (field, rest) = quoted(rest).ok_or_else(bad)?;
    let rest = rest.strip_prefix("]:").ok_or_else(bad)?;
    let (value, rest) = quoted(rest).ok_or_else(bad)?;
    if !rest.trim().is_empty() {
        return Err(bad());
    }
    Ok((field, value))
}

/// A single-quoted literal at the start of `text` and what follows it.
fn quoted(text: &str) -> Option<(String, &str)> {
    let mut chars = text.strip_prefix('\'')?.char_indices();
    let mut value = String::new();
    while let Some((_, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '\'' => {
                let rest = chars.as_str();
                return Some((value, rest));
            }
            other => value.push(other),
        }
    }
    None
}

/// A page of a list (`object: list`) or a search (`object: search_result`).
pub(crate) fn page(object: &str, url: &str, data: &[EffectRecord], has_more: bool) -> Value {
    json!({
        "object": object,
        "url": url,
        "has_more": has_more,
        "data": data.iter().map(self::object).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_query_is_one_quoted_metadata_clause() {
        assert_eq!(
            search_query(r"metadata['keel_intent_key']:'charge:t:it\'s\\'").ok(),
            Some(("keel_intent_key".to_owned(), r"charge:t:it's\".to_owned()))
        );
        for bad in ["status:'succeeded'", "metadata['k']:'v' AND x", "metadata['k':'v'", "metadata['k']:'v"] {
            assert!(search_query(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_test_keys_are_accepted() {
        assert!(is_test_key(Some("Bearer sk_test_abc123")));
        assert!(is_test_key(Some("Bearer rk_test_abc")));
        for bad in
            [None, Some("Bearer sk_live_abc"), Some("sk_test_abc"), Some("Bearer sk_test_"), Some("Bearer sk_test_a b")]
        {
            assert!(!is_test_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn unknown_and_repeated_parameters_are_refused() {
        let ok = b"amount=100&currency=eur&payment_method=pm_card_visa&payment_method_types[]=card&confirm=true&metadata[keel_intent_key]=k";
        assert!(charge_params(ok).is_ok());
        let repeated = b"amount=100&amount=999999&currency=eur&payment_method=pm_card_visa&confirm=true";
        assert!(charge_params(repeated).is_err());
        let unknown = b"amount=100&currency=eur&payment_method=pm_card_visa&confirm=true&capture_method=manual";
        assert!(charge_params(unknown).is_err());
        let unconfirmed = b"amount=100&currency=eur&payment_method=pm_card_visa";
        assert!(charge_params(unconfirmed).is_err());
    }

    #[test]
    fn the_fingerprint_ignores_the_order_of_parameters() {
        let a =
            charge_params(b"amount=100&currency=eur&payment_method=pm_card_visa&confirm=true").map(|p| p.fingerprint);
        let b =
            charge_params(b"confirm=true&payment_method=pm_card_visa&currency=eur&amount=100").map(|p| p.fingerprint);
        assert_eq!(a.ok(), b.ok());
    }

    #[test]
    fn stripe_test_methods_decline_with_their_code() {
        assert_eq!(test_decline("pm_card_chargeDeclined"), Some("generic_decline"));
        assert_eq!(test_decline("pm_card_visa_chargeDeclined"), Some("generic_decline"));
        assert_eq!(test_decline("pm_card_visa_chargeDeclinedInsufficientFunds"), Some("insufficient_funds"));
        assert_eq!(test_decline("pm_card_visa"), None);
    }
}
