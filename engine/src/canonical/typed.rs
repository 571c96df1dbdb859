//! Typed decoding of outside JSON, in which a struct is read from an object only.
//!
//! Owns [`decode`]. `serde`'s derived `Deserialize` for a struct also accepts the struct's
//! *sequence* form: `[tenant, null, order, amount, currency, token]` reads as a charge request
//! whose fields are taken by position. No door of Keel documents that form, a reviewer reading
//! such a body cannot tell which value is which field, and `deny_unknown_fields` cannot apply
//! to it. [`decode`] refuses it at every depth (a struct nested in a struct, in an array, in a
//! map, in an `Option`), and otherwise reads exactly as `serde_json::from_value` does.
//!
//! It must never accept what `serde_json::from_value` refuses; it only refuses more. Enum
//! variants carrying data are handed to `serde_json` as they are: Keel's doors read enums as
//! strings.

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{DeserializeOwned, Error as _, IntoDeserializer, Unexpected, Visitor};
use serde_json::Value;

/// Decodes `value` into `T`, refusing a JSON array wherever `T` (or anything in it) expects a
/// struct.
///
/// ```
/// #[derive(serde::Deserialize, Debug)]
/// struct Charge { order: String, amount: i64 }
/// let object = serde_json::json!({"order": "o_1", "amount": 100});
/// assert_eq!(engine::canonical::decode::<Charge>(object).unwrap().amount, 100);
/// let array = serde_json::json!(["o_1", 100]);
/// assert!(serde_json::from_value::<Charge>(array.clone()).is_ok());
/// assert!(engine::canonical::decode::<Charge>(array).is_err());
/// ```
///
/// # Errors
///
/// `serde_json`'s error, saying what was expected.
pub fn decode<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    T::deserialize(ObjectsOnly(value))
}

/// A JSON value whose structs must be objects.
struct ObjectsOnly(Value);

impl<'de> IntoDeserializer<'de, serde_json::Error> for ObjectsOnly {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("a number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> serde::Deserializer<'de> for ObjectsOnly {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Array(items) => {
                let mut seq = SeqDeserializer::new(items.into_iter().map(ObjectsOnly));
                let value = visitor.visit_seq(&mut seq)?;
                seq.end()?;
                Ok(value)
            }
            Value::Object(entries) => {
                let mut map = MapDeserializer::new(entries.into_iter().map(|(k, v)| (k, ObjectsOnly(v))));
                let value = visitor.visit_map(&mut map)?;
                map.end()?;
                Ok(value)
            }
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            object @ Value::Object(_) => ObjectsOnly(object).deserialize_any(visitor),
            other => Err(serde_json::Error::invalid_type(unexpected(&other), &"a JSON object")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            other => visitor.visit_some(ObjectsOnly(other)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::decode;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: i64,
        #[serde(default)]
        b: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        inner: Inner,
        list: Vec<Inner>,
        maybe: Option<Inner>,
        by_name: BTreeMap<String, Inner>,
        numbers: Vec<u32>,
        #[serde(default)]
        flag: bool,
    }

    fn good() -> serde_json::Value {
        json!({"inner": {"a": 1}, "list": [{"a": 2, "b": "x"}], "maybe": null,
               "by_name": {"k": {"a": 3}}, "numbers": [1, 2], "flag": true})
    }

    #[test]
    fn it_reads_what_serde_json_reads() {
        let value = good();
        assert_eq!(
            decode::<Outer>(value.clone()).expect("decodes"),
            serde_json::from_value::<Outer>(value).expect("x")
        );
    }

    #[test]
    fn a_struct_given_as_an_array_is_refused_at_every_depth() {
        let cases = [
            json!([{"a": 1}, [], null, {}, []]),
            json!({"inner": [1, null], "list": [], "maybe": null, "by_name": {}, "numbers": []}),
            json!({"inner": {"a": 1}, "list": [[2, "x"]], "maybe": null, "by_name": {}, "numbers": []}),
            json!({"inner": {"a": 1}, "list": [], "maybe": [3], "by_name": {}, "numbers": []}),
            json!({"inner": {"a": 1}, "list": [], "maybe": null, "by_name": {"k": [3]}, "numbers": []}),
        ];
        for case in cases {
            assert!(serde_json::from_value::<Outer>(case.clone()).is_ok(), "serde_json takes {case}");
            let error = decode::<Outer>(case.clone()).expect_err("refused");
            assert!(error.to_string().contains("a JSON object"), "{case}: {error}");
        }
    }

    #[test]
    fn what_serde_json_refuses_stays_refused() {
        for case in [json!({"inner": {"a": 1, "c": 2}}), json!({"inner": {"a": "1"}}), json!("text"), json!(null)] {
            assert!(decode::<Outer>(case.clone()).is_err(), "{case}");
        }
        assert!(decode::<Vec<u32>>(json!([1, 2, 3])).is_ok(), "arrays where arrays are expected");
    }
}
