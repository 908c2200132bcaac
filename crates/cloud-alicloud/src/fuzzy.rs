//! Tolerant JSON decoding for Alibaba Cloud responses, matching the vendored SDK's fuzzy
//! decoders (`sdk/responses/json_parser.go` `registerBetterFuzzyDecoder`): strings accept
//! numbers, booleans and `null`; integers accept numeric strings (`""` is 0), floats
//! (truncated), booleans and `null`; floats accept strings; booleans accept `"true"`,
//! `"false"`, `""` and numbers. Use with `#[serde(default, deserialize_with = "...")]`.
//!
//! Beyond the SDK: a wrapped list (`{"ScalingGroup": [...]}`) may be missing, `null`, `""` or
//! an empty array in place of its wrapper object ([`object`]; the SDK has such a decoder,
//! `tolerateEmptyArrayDecoder`, but never registers it), and a list may be a lone object
//! ([`list`]), as XML-to-JSON gateways render one-element lists.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde_json::Value;

fn value<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    Value::deserialize(d)
}

/// A string from a string, number, boolean or `null` (empty).
pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match value(d)? {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        other => Err(D::Error::custom(format!(
            "expected a string, got {}",
            kind(&other)
        ))),
    }
}

/// Like [`string`], with an empty string as `None`.
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = string(d)?;
    Ok((!s.is_empty()).then_some(s))
}

fn integer(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| {
                n.as_f64()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
            })
            .ok_or_else(|| format!("{n} is not an integer")),
        Value::String(s) if s.trim().is_empty() => Ok(0),
        Value::String(s) => {
            let s = s.trim();
            s.parse::<i64>().or_else(|_| {
                s.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(|f| f.trunc() as i64)
                    .ok_or_else(|| format!("{s:?} is not a number"))
            })
        }
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::Null => Ok(0),
        other => Err(format!("expected an integer, got {}", kind(other))),
    }
}

/// A non-negative integer from a number, numeric string, boolean or `null` (0).
pub fn u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = integer(&value(d)?).map_err(D::Error::custom)?;
    u32::try_from(n).map_err(|_| D::Error::custom(format!("{n} is out of range")))
}

/// Like [`u32`], with `null` and `""` as `None`. A missing field is `None` through
/// `#[serde(default)]`.
pub fn opt_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match value(d)? {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        v => {
            let n = integer(&v).map_err(D::Error::custom)?;
            u32::try_from(n)
                .map(Some)
                .map_err(|_| D::Error::custom(format!("{n} is out of range")))
        }
    }
}

/// A float from a number, numeric string (`""` is 0), boolean or `null` (0).
pub fn f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match value(d)? {
        Value::Number(n) => n
            .as_f64()
            .ok_or_else(|| D::Error::custom(format!("{n} is not a float"))),
        Value::String(s) if s.trim().is_empty() => Ok(0.0),
        Value::String(s) => s
            .trim()
            .parse()
            .map_err(|_| D::Error::custom(format!("{s:?} is not a number"))),
        Value::Bool(b) => Ok(if b { 1.0 } else { 0.0 }),
        Value::Null => Ok(0.0),
        other => Err(D::Error::custom(format!(
            "expected a float, got {}",
            kind(&other)
        ))),
    }
}

/// A boolean from a boolean, a number (0 is false), `"true"`/`"false"`/`""` in any case,
/// or `null` (false).
pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match value(d)? {
        Value::Bool(b) => Ok(b),
        Value::Number(n) => Ok(n.as_f64().is_some_and(|f| f != 0.0)),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(true),
            "false" | "" => Ok(false),
            other => Err(D::Error::custom(format!("{other:?} is not a boolean"))),
        },
        Value::Null => Ok(false),
        other => Err(D::Error::custom(format!(
            "expected a boolean, got {}",
            kind(&other)
        ))),
    }
}

/// Like [`bool`], with `null` as `None`. A missing field is `None` through
/// `#[serde(default)]`.
pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let v = value(d)?;
    if v.is_null() {
        return Ok(None);
    }
    bool(v).map(Some).map_err(D::Error::custom)
}

/// A list from an array, a lone element, or `null`/`""` (empty).
pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match value(d)? {
        Value::Array(items) => items
            .into_iter()
            .map(|item| T::deserialize(item).map_err(D::Error::custom))
            .collect(),
        Value::Null => Ok(Vec::new()),
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        single => Ok(vec![T::deserialize(single).map_err(D::Error::custom)?]),
    }
}

/// An object, or its default for `null`, `""` or an empty array.
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    match value(d)? {
        Value::Null => Ok(T::default()),
        Value::String(s) if s.is_empty() => Ok(T::default()),
        Value::Array(items) if items.is_empty() => Ok(T::default()),
        other => T::deserialize(other).map_err(D::Error::custom),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Tag {
        #[serde(rename = "Key", default, deserialize_with = "super::string")]
        key: String,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Tags {
        #[serde(rename = "Tag", default, deserialize_with = "super::list")]
        tag: Vec<Tag>,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Wire {
        #[serde(rename = "Name", default, deserialize_with = "super::string")]
        name: String,
        #[serde(rename = "Size", default, deserialize_with = "super::u32")]
        size: u32,
        #[serde(rename = "Memory", default, deserialize_with = "super::f64")]
        memory: f64,
        #[serde(rename = "Enabled", default, deserialize_with = "super::bool")]
        enabled: bool,
        #[serde(rename = "Tags", default, deserialize_with = "super::object")]
        tags: Tags,
    }

    fn decode(v: serde_json::Value) -> Result<Wire, serde_json::Error> {
        serde_json::from_value(v)
    }

    #[test]
    fn numbers_as_strings_and_strings_as_numbers() {
        let w =
            decode(json!({"Name": 42, "Size": "7", "Memory": "8.5", "Enabled": "TRUE"})).unwrap();
        assert_eq!(w.name, "42");
        assert_eq!(w.size, 7);
        assert_eq!(w.memory, 8.5);
        assert!(w.enabled);
        let w = decode(json!({"Name": true, "Size": 3.9, "Memory": 16, "Enabled": 1})).unwrap();
        assert_eq!(
            (w.name.as_str(), w.size, w.memory, w.enabled),
            ("true", 3, 16.0, true)
        );
    }

    #[test]
    fn nulls_and_empty_strings_are_zero_values() {
        let w =
            decode(json!({"Name": null, "Size": "", "Memory": null, "Enabled": "", "Tags": null}))
                .unwrap();
        assert_eq!(w, Wire::default());
    }

    #[test]
    fn missing_fields_and_wrappers_default() {
        assert_eq!(decode(json!({})).unwrap(), Wire::default());
        assert_eq!(decode(json!({"Tags": []})).unwrap().tags, Tags::default());
        assert_eq!(decode(json!({"Tags": {}})).unwrap().tags, Tags::default());
        assert_eq!(decode(json!({"Tags": ""})).unwrap().tags, Tags::default());
    }

    #[test]
    fn lists_accept_a_lone_element() {
        let w = decode(json!({"Tags": {"Tag": {"Key": "a"}}})).unwrap();
        assert_eq!(w.tags.tag, vec![Tag { key: "a".into() }]);
        let w = decode(json!({"Tags": {"Tag": [{"Key": "a"}, {"Key": 2}]}})).unwrap();
        assert_eq!(w.tags.tag.len(), 2);
        assert_eq!(w.tags.tag[1].key, "2");
    }

    #[test]
    fn garbage_is_still_an_error() {
        assert!(decode(json!({"Size": "many"})).is_err());
        assert!(decode(json!({"Size": -1})).is_err());
        assert!(decode(json!({"Enabled": "maybe"})).is_err());
        assert!(decode(json!({"Name": {"nested": 1}})).is_err());
    }
}
