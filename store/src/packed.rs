//! Packed values: JSON values in a compact, exactly reversible binary form.
//!
//! Owns [`encode`] and [`decode`]. A payload or an entity state is a `serde_json::Value`;
//! packed, its object keys that Keel itself writes become one byte (an index into [`KEYS`]),
//! integers become varints, and three kinds of strings that fill Keel's rows — 64-digit
//! lowercase hex digests, lowercase UUIDs and RFC 3339 UTC instants — become 32, 16 and about
//! 10 bytes. `decode(encode(v)) == v` for every value: a string is packed in a short form only
//! when unpacking gives back exactly the same text, so the hash chain (computed over the
//! canonical JSON of the value, `store/FORMAT.md`) is untouched by the packing.
//!
//! The byte layout is part of the stored format (`store/FORMAT.md`, "Packed values"): tags
//! and [`KEYS`] are append-only, never renumbered.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Map, Number, Value};

/// Object keys packed as one index. Append-only: a key's index is stored in every row that
/// uses it. Keys not listed are written inline, so a new field needs no change here.
pub(crate) const KEYS: [&str; 96] = [
    "type",
    "run_id",
    "key",
    "attempt",
    "intent",
    "kind",
    "tenant",
    "intent_id",
    "order_id",
    "business_ref",
    "fingerprint",
    "amount_minor",
    "currency",
    "payload",
    "capability",
    "dedup_by_key",
    "lookup",
    "key_window_ms",
    "consistency_window_ms",
    "request_timeout_ms",
    "attempts_max",
    "reconciliations_max",
    "approval_required",
    "workflow",
    "input",
    "deadline_at",
    "limits",
    "cost_minor_max",
    "attempts_per_intent_max",
    "reconciliations_per_intent_max",
    "approval_threshold_minor",
    "position",
    "name",
    "output",
    "fire_at",
    "status",
    "detail",
    "source",
    "evidence",
    "provider_ref",
    "code",
    "reason",
    "reconcile_after",
    "reconciliation",
    "after",
    "next",
    "absence_proven",
    "by",
    "expires_at",
    "closes_at",
    "landed",
    "check",
    "verdict",
    "provider_says",
    "answer",
    "event",
    "payment_method_sha256",
    "tenant_id",
    "attempts",
    "reconciliations",
    "first_sent_at",
    "last_sent_at",
    "unknown_reason",
    "decline_code",
    "approval",
    "note",
    "duplicates_suppressed",
    "not_sent",
    "latest_not_sent",
    "latest_attempt_run",
    "in_flight_run",
    "late_answers",
    "approval_closes_at",
    "last_seq",
    "started_at",
    "journal_len",
    "agent_entries",
    "network_retries",
    "call",
    "hold",
    "input_tokens",
    "output_tokens",
    "cost_minor",
    "response",
    "usage",
    "text",
    "tool",
    "tool_call_id",
    "arguments",
    "result",
    "script",
    "transport",
    "transcript",
    "scenario",
    "actor",
    "owner",
];

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const UINT: u8 = 3;
const NEGINT: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const HEX32: u8 = 7;
const UUID: u8 = 8;
const TIME: u8 = 9;
const ARRAY: u8 = 10;
const OBJECT: u8 = 11;

/// Packs `value`.
pub(crate) fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    put_value(&mut out, value);
    out
}

/// Unpacks bytes written by [`encode`]; `Err` says what is malformed.
pub(crate) fn decode(bytes: &[u8]) -> Result<Value, String> {
    let mut reader = Reader { bytes, at: 0 };
    let value = reader.value(0)?;
    if reader.at != bytes.len() {
        return Err(format!("{} trailing bytes after the value", bytes.len() - reader.at));
    }
    Ok(value)
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    put_varint(out, n as u64);
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Number(n) => put_number(out, n),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => {
            out.push(ARRAY);
            put_len(out, items.len());
            items.iter().for_each(|item| put_value(out, item));
        }
        Value::Object(map) => {
            out.push(OBJECT);
            put_len(out, map.len());
            for (key, item) in map {
                match KEYS.iter().position(|k| k == key) {
                    Some(index) => put_len(out, index),
                    None => {
                        put_len(out, KEYS.len() + key.len());
                        out.extend_from_slice(key.as_bytes());
                    }
                }
                put_value(out, item);
            }
        }
    }
}

fn put_number(out: &mut Vec<u8>, n: &Number) {
    if let Some(u) = n.as_u64() {
        out.push(UINT);
        put_varint(out, u);
    } else if let Some(i) = n.as_i64() {
        // Negative: store -(i + 1), which fits u64 for every negative i64.
        out.push(NEGINT);
        put_varint(out, !(i as u64));
    } else {
        out.push(FLOAT);
        let f = n.as_f64().expect("a JSON number is a u64, an i64 or an f64");
        out.extend_from_slice(&f.to_bits().to_le_bytes());
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    if s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        out.push(HEX32);
        out.extend_from_slice(&hex::decode(s).expect("64 lowercase hex digits decode"));
        return;
    }
    if let Some(uuid) = packed_uuid(s) {
        out.push(UUID);
        out.extend_from_slice(&uuid);
        return;
    }
    if let Some(at) = packed_time(s) {
        out.push(TIME);
        put_varint(out, zigzag(at.timestamp()));
        put_varint(out, u64::from(at.timestamp_subsec_nanos()));
        return;
    }
    out.push(STRING);
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// A lowercase `8-4-4-4-12` UUID's 16 bytes.
fn packed_uuid(s: &str) -> Option<[u8; 16]> {
    let bytes = s.as_bytes();
    if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
        return None;
    }
    let digits: String = s.split('-').collect();
    if digits.len() != 32 || !digits.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; 16];
    hex::decode_to_slice(&digits, &mut out).ok()?;
    Some(out)
}

fn unpacked_uuid(bytes: &[u8]) -> String {
    let h = hex::encode(bytes);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// An instant whose text is exactly what chrono's serde writes for it (RFC 3339, UTC, `Z`,
/// 0, 3, 6 or 9 fractional digits): only then does unpacking give the same text back.
fn packed_time(s: &str) -> Option<DateTime<Utc>> {
    if !(20..=30).contains(&s.len()) || !s.ends_with('Z') || s.as_bytes().get(10) != Some(&b'T') {
        return None;
    }
    let at = DateTime::parse_from_rfc3339(s).ok()?.to_utc();
    (time_text(at) == s).then_some(at)
}

fn time_text(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// Deepest nesting [`decode`] follows: what `engine::canonical` accepts, so a corrupt row
/// cannot make it recurse without bound.
const DEPTH_MAX: usize = engine::limits::JSON_DEPTH_MAX;

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let byte = *self.bytes.get(self.at).ok_or("the value ends early")?;
        self.at += 1;
        Ok(byte)
    }

    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or("the value ends early")?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            n |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err("a varint longer than 64 bits".to_owned())
    }

    fn len(&mut self) -> Result<usize, String> {
        let n = self.varint()?;
        // A length can never exceed what is left: refuse before allocating for it.
        usize::try_from(n).ok().filter(|&n| n <= self.bytes.len() - self.at).ok_or_else(|| format!("length {n}"))
    }

    fn text(&mut self, n: usize) -> Result<String, String> {
        String::from_utf8(self.take(n)?.to_vec()).map_err(|e| format!("a string that is not UTF-8: {e}"))
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > DEPTH_MAX {
            return Err("nested deeper than JSON_DEPTH_MAX".to_owned());
        }
        Ok(match self.byte()? {
            NULL => Value::Null,
            FALSE => Value::Bool(false),
            TRUE => Value::Bool(true),
            UINT => Value::Number(self.varint()?.into()),
            NEGINT => Value::Number((!self.varint()? as i64).into()),
            FLOAT => {
                let bits = u64::from_le_bytes(self.take(8)?.try_into().expect("took 8 bytes"));
                Value::Number(Number::from_f64(f64::from_bits(bits)).ok_or("a float that is not finite")?)
            }
            STRING => {
                let n = self.len()?;
                Value::String(self.text(n)?)
            }
            HEX32 => Value::String(hex::encode(self.take(32)?)),
            UUID => Value::String(unpacked_uuid(self.take(16)?)),
            TIME => {
                let seconds = unzigzag(self.varint()?);
                let nanos = u32::try_from(self.varint()?).map_err(|_| "nanoseconds above u32")?;
                let at = DateTime::from_timestamp(seconds, nanos).ok_or("an instant out of range")?;
                Value::String(time_text(at))
            }
            ARRAY => {
                let n = self.len()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(depth + 1)?);
                }
                Value::Array(items)
            }
            OBJECT => {
                let n = self.len()?;
                let mut map = Map::new();
                for _ in 0..n {
                    let k = usize::try_from(self.varint()?).map_err(|_| "a key index above usize")?;
                    let key = match KEYS.get(k) {
                        Some(known) => (*known).to_owned(),
                        None => {
                            let n = k - KEYS.len();
                            if n > self.bytes.len() - self.at {
                                return Err(format!("key length {n}"));
                            }
                            self.text(n)?
                        }
                    };
                    let item = self.value(depth + 1)?;
                    map.insert(key, item);
                }
                Value::Object(map)
            }
            tag => return Err(format!("unknown tag {tag}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_kind_of_value_round_trips_exactly() {
        let value = json!({
            "run_id": "96fb8b79-660d-46fa-a6cf-17002314e6cf",
            "not a uuid": "96FB8B79-660D-46FA-A6CF-17002314E6CF",
            "fingerprint": "0bf875c1d7cfbc6df7b18576df52e0c47104227ffab5206a0264fb1ac9ec5de7",
            "deadline_at": "2026-12-01T09:59:32.901935569Z",
            "round": "2025-03-01T12:00:00Z",
            "micro": "2025-03-01T12:00:00.123456Z",
            "odd time": "2025-03-01T12:00:00.1Z",
            "before 1970": "1969-12-31T23:59:59.999Z",
            "n": [0, 1, 127, 128, u64::MAX, -1, i64::MIN, 1.5, -0.25, 1e300],
            "nested": {"a": [null, true, false, {"é": "ü😀"}]},
            "": "",
        });
        let packed = encode(&value);
        assert_eq!(decode(&packed).expect("decodes"), value);
        assert!(packed.len() < engine::canonical::to_string(&value).len());
    }

    #[test]
    fn truncated_or_garbage_bytes_are_errors_not_panics() {
        let packed = encode(&json!({"key": "charge:t:i", "attempt": 3, "list": [1, 2, 3]}));
        for cut in 0..packed.len() {
            assert!(decode(&packed[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode(&[OBJECT, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        assert!(decode(&[42]).is_err());
        let mut deep = [ARRAY, 1].repeat(DEPTH_MAX + 2);
        deep.push(NULL);
        assert!(decode(&deep).is_err());
    }
}
