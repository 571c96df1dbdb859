//! The payment provider contract, as the engine sees it.
//!
//! Owns [`PaymentProvider`], the capability a provider declares ([`Capability`]), the request
//! the engine sends ([`EffectRequest`]) and the typed outcomes it gets back. An outcome is
//! data, never an `Err`: a provider that declines, times out or vanishes yields a
//! [`CallOutcome`]. Implementations live in the `adapters` crate; this module does no I/O.
//!
//! # The one rule implementations must keep
//!
//! Report [`CallOutcome::Unknown`] whenever the request may have left the process and no
//! definitive answer came back. Only a business decline or a request proven never sent
//! ([`CallOutcome::NotSent`]) means "no effect".

use serde::{Deserialize, Serialize};
use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future: the engine's traits are object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a provider can do for exactly-once, declared by its adapter.
///
/// The tier decides what Keel may do after an unknown outcome:
/// - `dedup_by_key && lookup` — reconcile by lookup, resend with the same key when proven absent;
/// - `lookup` alone — reconcile, resend only when proven absent past `consistency_window_ms`;
/// - `dedup_by_key` alone — resend with the same key inside `key_window_ms` (the provider
///   answers the original result if the effect happened);
/// - neither — never resend automatically: escalate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The provider deduplicates requests carrying the same idempotency key.
    pub dedup_by_key: bool,
    /// The provider can look an effect up by its idempotency key.
    pub lookup: bool,
    /// How long the provider keeps idempotency keys (Stripe: at least 24 h). Past it a resend
    /// with the same key is no longer deduplicated, so Keel refuses it.
    pub key_window_ms: u64,
    /// How long after an effect a lookup may still answer "absent" (eventual consistency).
    pub consistency_window_ms: u64,
    /// How long one request to the provider may take before Keel gives up on its answer (the
    /// adapter's whole-request timeout). Until it has passed since a send, that request may
    /// still reach the provider and act. `0` in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request_timeout_ms: u64,
}

/// Whether a stored duration is the default `0` (not written, so old payloads keep their bytes).
fn is_zero(ms: &u64) -> bool {
    *ms == 0
}

impl Capability {
    /// The capability tier as a short stable name: `dedup+lookup`, `lookup`, `dedup`, `none`.
    pub fn tier(&self) -> &'static str {
        match (self.dedup_by_key, self.lookup) {
            (true, true) => "dedup+lookup",
            (false, true) => "lookup",
            (true, false) => "dedup",
            (false, false) => "none",
        }
    }
}

/// The kind of effect a provider performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EffectKind {
    /// Take money from a payment method.
    Charge,
    /// Give money back on a charged order.
    Refund,
}

impl EffectKind {
    /// Whether the provider needs the payment method to act: a charge takes money from one,
    /// a refund returns it along the original charge.
    pub fn needs_payment_method(&self) -> bool {
        *self == Self::Charge
    }

    /// The operation name used in intent keys: `charge` or `refund`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }
}

/// A secret kept in memory only: its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The clear value, for the one place that must send it (the adapter's request body).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of this secret, as is or as JSON escapes it, replaced by
    /// [`REDACTED`]: what a peer echoed back (an error body quoting the key, a detail quoting
    /// the request) is made safe before it is stored or logged. The secret is looked for in
    /// the text as a JSON reader would decode it too, so a peer that spells it with escapes
    /// (`\u0070m_card…` for `pm_card…`) does not hide it: where the decoded text holds it, the
    /// decoded text, scrubbed, is what comes back. An excerpt cut in the middle of the secret
    /// loses the piece too: a text that ends with the secret's first
    /// [`crate::limits::SECRET_PIECE_MIN_CHARS`] characters or more, or starts with its last ones.
    ///
    /// ```
    /// use engine::provider::Secret;
    /// let key = Secret::new("sk-123456");
    /// assert_eq!(key.scrub("bad key sk-123456!"), "bad key [redacted]!");
    /// assert_eq!(key.scrub("cut at sk-123"), "cut at [redacted]");
    /// assert_eq!(key.scrub(r#"{"echo":"\u0073k-123456"}"#), r#"{"echo":"[redacted]"}"#);
    /// ```
    pub fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() {
            return text.to_owned();
        }
        let scrubbed = self.scrub_spelled(text);
        let decoded = decode_json_escapes(&scrubbed);
        if decoded == scrubbed {
            return scrubbed;
        }
        let decoded_scrubbed = self.scrub_spelled(&decoded);
        if decoded_scrubbed == decoded { scrubbed } else { decoded_scrubbed }
    }

    /// [`Secret::scrub`] on the text as it is spelled.
    fn scrub_spelled(&self, text: &str) -> String {
        let escaped = serde_json::to_string(&self.0).expect("serializing a &str to JSON cannot fail");
        let escaped = &escaped[1..escaped.len() - 1];
        let mut out = text.replace(&self.0, REDACTED);
        if escaped != self.0 {
            out = out.replace(escaped, REDACTED);
        }
        let pieces = |from_start: bool| {
            (1..self.0.len())
                .rev()
                .filter(|&cut| self.0.is_char_boundary(cut))
                .map(move |cut| if from_start { &self.0[..cut] } else { &self.0[cut..] })
                .filter(|piece| piece.chars().count() >= crate::limits::SECRET_PIECE_MIN_CHARS)
        };
        if let Some(head) = pieces(true).find(|head| out.ends_with(head)) {
            out.truncate(out.len() - head.len());
            out.push_str(REDACTED);
        }
        if let Some(tail) = pieces(false).find(|tail| out.starts_with(tail)) {
            out.replace_range(..tail.len(), REDACTED);
        }
        out
    }

    /// Scrubs every string of `value`, object keys included. Parsing JSON first decodes any
    /// escape a peer may have used (`\u002d` for `-`), so no spelling of the secret survives.
    pub fn scrub_json(&self, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(text) => *text = self.scrub(text),
            Value::Array(items) => items.iter_mut().for_each(|item| self.scrub_json(item)),
            Value::Object(map) => {
                let entries = std::mem::take(map);
                for (key, mut item) in entries {
                    self.scrub_json(&mut item);
                    map.insert(self.scrub(&key), item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

/// `text` with the JSON escapes that can spell a visible character decoded: `\uXXXX` (a
/// surrogate pair as one character) and `\/`. An escape that decodes to a control character,
/// or that is not a whole escape, stays as it is — but one cut off by the end of the text (an
/// excerpt that stops at `\u00`) is dropped, so what precedes it is the decoded text's end.
fn decode_json_escapes(text: &str) -> String {
    fn hex4(rest: &str) -> Option<u32> {
        let digits = rest.get(..4)?;
        if digits.bytes().all(|b| b.is_ascii_hexdigit()) { u32::from_str_radix(digits, 16).ok() } else { None }
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        let cut_off = escape.len() < 6
            && escape.bytes().skip(1).enumerate().all(|(i, b)| if i == 0 { b == b'u' } else { b.is_ascii_hexdigit() });
        if cut_off {
            return out;
        }
        let (decoded, used) = match escape.as_bytes().get(1) {
            Some(b'/') => (Some('/'), 2),
            Some(b'u') => match hex4(&escape[2..]) {
                Some(high @ 0xD800..=0xDBFF) => {
                    let low = escape.get(6..8).filter(|u| *u == "\\u").and_then(|_| hex4(&escape[8..]));
                    match low {
                        Some(low @ 0xDC00..=0xDFFF) => {
                            (char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)), 12)
                        }
                        _ => (None, 1),
                    }
                }
                Some(code) => (char::from_u32(code), 6),
                None => (None, 1),
            },
            _ => (None, 1),
        };
        match decoded.filter(|c| !c.is_control()) {
            Some(c) => {
                out.push(c);
                rest = &escape[used..];
            }
            None => {
                out.push('\\');
                rest = &escape[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// What [`Secret::scrub`] leaves where a secret was.
pub const REDACTED: &str = "[redacted]";

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// One request for an effect. Every attempt of an intent sends the same `idempotency_key`:
/// the intent key, never regenerated.
#[derive(Clone, Debug)]
pub struct EffectRequest {
    /// Charge or refund.
    pub kind: EffectKind,
    /// The intent key, sent as the provider's idempotency key.
    pub idempotency_key: String,
    /// The tenant the effect belongs to.
    pub tenant: String,
    /// The caller's intent id.
    pub intent_id: String,
    /// The order the effect is for.
    pub order_id: String,
    /// Amount in integer minor units, always positive.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// The payment method (charges only). Never stored, never logged.
    pub payment_method: Option<Secret>,
    /// Lowercase hex SHA-256 of the intent's effect-defining payload: a provider that keeps
    /// metadata can record it beside the key, so an effect found later can be told apart from
    /// one made for another payload under the same key.
    pub fingerprint: String,
    /// For a refund: the provider's reference of the charge it gives money back on (that
    /// charge's evidence), when the order has exactly one validated charge in the refund's
    /// currency. `None` for a charge, and for a refund whose order has no single such charge.
    pub charge_ref: Option<String>,
    /// The most this request may take, in ms: its run's time left when it is sent. An adapter
    /// gives up at the smaller of this and its own request timeout, and reports the outcome
    /// unknown (`timeout`). `None`: its own timeout alone.
    pub timeout_ms: Option<u64>,
}

/// What proves an effect happened at the provider.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// The provider's own id for the effect (e.g. `ch_…`, `re_…`).
    pub provider_ref: String,
    /// The amount the provider says it moved.
    pub amount_minor: i64,
    /// The currency the provider says it used.
    pub currency: String,
}

/// Why an outcome is unknown: the request may have left and no definitive answer came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownReason {
    /// No answer within the adapter's timeout.
    Timeout,
    /// The connection dropped after the request may have been sent.
    ConnectionLost,
    /// The provider answered 5xx / unavailable: it may still have acted.
    ProviderUnavailable,
    /// The answer could not be understood.
    Protocol,
    /// The process died with the attempt in flight (recorded by recovery).
    Crash,
    /// The caller stopped waiting for the answer (an interrupt, a deadline) with the attempt
    /// in flight.
    Interrupted,
}

impl UnknownReason {
    /// Stable snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::ConnectionLost => "connection_lost",
            Self::ProviderUnavailable => "provider_unavailable",
            Self::Protocol => "protocol",
            Self::Crash => "crash",
            Self::Interrupted => "interrupted",
        }
    }
}

/// The outcome of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider confirmed the effect.
    Succeeded(Evidence),
    /// The provider's definitive "no": no effect happened (e.g. card declined).
    Declined {
        /// The provider's decline code, e.g. `card_declined`.
        code: String,
    },
    /// The request was proven never sent (e.g. connection refused): no effect.
    NotSent {
        /// What stopped it.
        detail: String,
    },
    /// The effect may or may not have happened.
    Unknown {
        /// Why the answer is missing.
        reason: UnknownReason,
        /// Human detail for the log (never secrets).
        detail: String,
    },
}

impl CallOutcome {
    /// The outcome with `secret` scrubbed from every text a provider may have echoed it in.
    pub fn scrubbed(self, secret: &Secret) -> Self {
        match self {
            Self::Succeeded(evidence) => Self::Succeeded(Evidence {
                provider_ref: secret.scrub(&evidence.provider_ref),
                currency: secret.scrub(&evidence.currency),
                ..evidence
            }),
            Self::Declined { code } => Self::Declined { code: secret.scrub(&code) },
            Self::NotSent { detail } => Self::NotSent { detail: secret.scrub(&detail) },
            Self::Unknown { reason, detail } => Self::Unknown { reason, detail: secret.scrub(&detail) },
        }
    }
}

/// The outcome of a lookup by idempotency key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupOutcome {
    /// An effect with this key exists.
    Found(Evidence),
    /// The provider says no effect with this key exists (which may be premature: see
    /// [`Capability::consistency_window_ms`]).
    Absent,
    /// The lookup could not be answered.
    Unavailable {
        /// Human detail for the log.
        detail: String,
    },
}

/// A payment provider as the engine drives it.
pub trait PaymentProvider: Send + Sync {
    /// What this provider can do for exactly-once.
    fn capability(&self) -> Capability;

    /// Performs one attempt. Must send `request.idempotency_key` as the idempotency key
    /// when the provider supports one.
    fn execute<'a>(&'a self, request: &'a EffectRequest) -> BoxFuture<'a, CallOutcome>;

    /// Looks an effect up by its idempotency key. Only called when `capability().lookup`.
    fn lookup<'a>(&'a self, kind: EffectKind, idempotency_key: &'a str) -> BoxFuture<'a, LookupOutcome>;
}

#[cfg(test)]
mod tests {
    use super::{REDACTED, Secret};

    #[test]
    fn a_secret_spelled_with_json_escapes_is_scrubbed_after_decoding() {
        let token = Secret::new("pm_card_visa_4242424242");
        let echoed = [
            r#"HTTP 400: {"error":{"message":"bad \u0070m_card_visa_4242424242"}}"#,
            r#"{"m":"pm\u005fcard\u005fvisa\u005f4242424242"}"#,
            r#"{"m":"pm_card_visa\/4242424242"}"#,
            r#"{"m":"\u0070\u006d_card_visa_4242424242"}"#,
        ];
        for text in echoed.iter().take(2).chain(echoed.iter().skip(3)) {
            let scrubbed = token.scrub(text);
            assert!(scrubbed.contains(REDACTED), "{text} -> {scrubbed}");
            assert!(!scrubbed.contains("4242424242"), "{text} -> {scrubbed}");
        }
        // `\/` is a slash, not an underscore: that text does not hold the token.
        assert_eq!(token.scrub(echoed[2]), echoed[2]);
    }

    #[test]
    fn an_excerpt_cut_inside_an_escaped_secret_loses_the_piece() {
        let token = Secret::new("pm_card_visa_4242424242");
        let scrubbed = token.scrub(r#"HTTP 500: {"echo":"\u0070m_card_vi"#);
        assert!(scrubbed.ends_with(REDACTED), "{scrubbed}");
        assert!(!scrubbed.contains("card_vi"), "{scrubbed}");
        let every: String = "pm_card_visa".chars().map(|c| format!("\\u{:04x}", u32::from(c))).collect();
        for cut in 1..6 {
            let scrubbed = token.scrub(&format!("HTTP 500: {}", &every[..every.len() - cut]));
            assert!(scrubbed.ends_with(REDACTED), "cut {cut}: {scrubbed}");
        }
    }

    #[test]
    fn escapes_that_hide_nothing_are_left_as_they_are() {
        let token = Secret::new("sk_live_abcdef");
        for text in [r#"{"a":"caf\u00e9"}"#, r#"\u001b[31m"#, r#"\ud83d\ude00 and \ud83d alone"#, r#"\uZZZZ"#, "\\"] {
            assert_eq!(token.scrub(text), text);
        }
        let emoji = Secret::new("key😀key");
        assert_eq!(emoji.scrub(r#"x key\ud83d\ude00key y"#), format!("x {REDACTED} y"));
    }
}
