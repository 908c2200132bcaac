//! Field decoders for APIs whose JSON is looser than their documents: a field documented as
//! a string comes as a number, a number as a string, a zero value as `null` or `""`, a list
//! of one as the lone item. Each decoder takes the spellings listed on it and still refuses
//! a value of another kind (an object where a number must be, a word for an integer, a
//! negative number for an unsigned one), so a changed API is noticed rather than read as
//! zeros.
//!
//! Use with `#[serde(deserialize_with = "lenient::...")]` and `#[serde(default)]` on the
//! field or the container: a missing field is then its zero value (or `None`). The `opt_`
//! decoders read `null` (and, but for [`opt_bool`], `""`) as `None`; the others read them as
//! the zero value, except [`required_int`].
//!
//! [`as_int`] and [`kind`] are for decoders of shapes this module does not know.

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde_json::Value;

/// Text from a string, a number or a boolean (written out); `null` is empty.
pub fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    text(Value::deserialize(d)?).map_err(D::Error::custom)
}

/// Like [`string`], with `null` and `""` as `None`.
pub fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = string(d)?;
    Ok((!s.is_empty()).then_some(s))
}

/// An integer from an integer, a float (truncated), a numeric string (`"7"`, `" 7.9 "`) or
/// a boolean (1, 0); `null` and a blank string are 0. Out of range for `T` is an error.
pub fn int<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + Default,
{
    match integer(&Value::deserialize(d)?).map_err(D::Error::custom)? {
        Some(n) => in_range(n).map_err(D::Error::custom),
        None => Ok(T::default()),
    }
}

/// Like [`int`], with `null` and a blank string as `None`.
pub fn opt_int<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    match integer(&Value::deserialize(d)?).map_err(D::Error::custom)? {
        Some(n) => in_range(n).map(Some).map_err(D::Error::custom),
        None => Ok(None),
    }
}

/// Like [`int`], for a value that must be there: `null` and a blank string are errors.
pub fn required_int<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    let v = Value::deserialize(d)?;
    match integer(&v).map_err(D::Error::custom)? {
        Some(n) => in_range(n).map_err(D::Error::custom),
        None => Err(D::Error::custom(format!(
            "expected an integer, got {}",
            shown(&v)
        ))),
    }
}

/// A float from a number, a numeric string or a boolean (1, 0); `null` and a blank string
/// are 0.
pub fn float<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    opt_float(d).map(Option::unwrap_or_default)
}

/// Like [`float`], with `null` and a blank string as `None`.
pub fn opt_float<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        Value::Number(n) => n
            .as_f64()
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{n} is not a float"))),
        Value::String(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("{s:?} is not a number"))),
        Value::Bool(b) => Ok(Some(if b { 1.0 } else { 0.0 })),
        other => Err(D::Error::custom(format!(
            "expected a number, got {}",
            kind(&other)
        ))),
    }
}

/// A boolean from a boolean, a number (0 is false) or `"true"`/`"false"` in any case; `null`
/// and a blank string are false.
pub fn bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    match Value::deserialize(d)? {
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

/// Like [`bool`], with `null` as `None`; a blank string is still `Some(false)`, a value
/// that was sent.
pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    let v = Value::deserialize(d)?;
    if v.is_null() {
        return Ok(None);
    }
    bool(v).map(Some).map_err(D::Error::custom)
}

/// A list from a list or a lone item (a list of one); `null` and `""` are empty.
pub fn list<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .map(|item| T::deserialize(item).map_err(D::Error::custom))
            .collect(),
        Value::Null => Ok(Vec::new()),
        Value::String(s) if s.is_empty() => Ok(Vec::new()),
        single => Ok(vec![T::deserialize(single).map_err(D::Error::custom)?]),
    }
}

/// An object; `null`, `""` and an empty list are its default (the wrapper of an empty list
/// is often sent as one of those).
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    match Value::deserialize(d)? {
        Value::Null => Ok(T::default()),
        Value::String(s) if s.is_empty() => Ok(T::default()),
        Value::Array(items) if items.is_empty() => Ok(T::default()),
        other => T::deserialize(other).map_err(D::Error::custom),
    }
}

/// A number, a numeric string or a boolean as [`int`] reads it; `None` for anything else,
/// `null`, blank strings and numbers beyond `i64` included.
pub fn as_int(v: &Value) -> Option<i64> {
    // `i64::MAX as f64` is 2^63, the first float beyond the range.
    let truncated =
        |f: f64| (f >= i64::MIN as f64 && f < i64::MAX as f64).then(|| f.trunc() as i64);
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().and_then(truncated)),
        Value::String(s) => {
            let s = s.trim();
            s.parse::<i64>()
                .ok()
                .or_else(|| s.parse::<f64>().ok().and_then(truncated))
        }
        Value::Bool(b) => Some(i64::from(*b)),
        _ => None,
    }
}

/// The kind of a JSON value, for messages: `a string`, `an object`...
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn text(v: Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        Value::Null => Ok(String::new()),
        other => Err(format!("expected a string, got {}", kind(&other))),
    }
}

/// `None` for `null` and blank strings, else the integer or why not.
fn integer(v: &Value) -> Result<Option<i64>, String> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s.trim().is_empty() => Ok(None),
        other => as_int(other)
            .map(Some)
            .ok_or_else(|| format!("expected an integer, got {}", shown(other))),
    }
}

fn in_range<T: TryFrom<i64>>(n: i64) -> Result<T, String> {
    T::try_from(n).map_err(|_| format!("{n} is out of range"))
}

/// A scalar as JSON, a list or an object by its kind.
fn shown(v: &Value) -> String {
    match v {
        Value::Array(_) | Value::Object(_) => kind(v).to_string(),
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde::de::DeserializeOwned;
    use serde_json::{Value, json};

    /// One field `v` decoded by the decoder under test, or missing.
    macro_rules! field {
        ($name:ident, $ty:ty, $decoder:literal) => {
            #[derive(Debug, Default, Deserialize)]
            #[serde(default)]
            struct $name {
                #[serde(deserialize_with = $decoder)]
                v: $ty,
            }
        };
    }

    field!(Str, String, "super::string");
    field!(OptStr, Option<String>, "super::opt_string");
    field!(Int, u32, "super::int");
    field!(SignedInt, i64, "super::int");
    field!(OptInt, Option<u32>, "super::opt_int");
    field!(Float, f64, "super::float");
    field!(OptFloat, Option<f64>, "super::opt_float");
    field!(Bool, bool, "super::bool");
    field!(OptBool, Option<bool>, "super::opt_bool");
    field!(List, Vec<Item>, "super::list");
    field!(Names, Vec<String>, "super::list");
    field!(Wrapper, Items, "super::object");

    #[derive(Debug, Deserialize)]
    struct Required {
        #[serde(deserialize_with = "super::required_int")]
        v: i64,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Item {
        #[serde(rename = "Key")]
        key: String,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    struct Items {
        #[serde(rename = "Item", default, deserialize_with = "super::list")]
        items: Vec<Item>,
    }

    fn read<T: DeserializeOwned>(v: Value) -> Result<T, String> {
        serde_json::from_value(json!({ "v": v })).map_err(|e| e.to_string())
    }

    fn key(k: &str) -> Item {
        Item { key: k.into() }
    }

    #[test]
    fn strings_take_numbers_and_booleans_and_null_is_empty() {
        for (v, want) in [
            (json!("a"), "a"),
            (json!(42), "42"),
            (json!(1.5), "1.5"),
            (json!(true), "true"),
            (json!(null), ""),
            (json!(""), ""),
        ] {
            assert_eq!(read::<Str>(v).unwrap().v, want);
        }
        assert_eq!(serde_json::from_value::<Str>(json!({})).unwrap().v, "");
        for v in [json!([]), json!({"a": 1})] {
            assert!(read::<Str>(v).unwrap_err().contains("expected a string"));
        }
    }

    #[test]
    fn optional_strings_are_none_when_null_or_empty() {
        assert_eq!(read::<OptStr>(json!("a")).unwrap().v.as_deref(), Some("a"));
        assert_eq!(read::<OptStr>(json!(7)).unwrap().v.as_deref(), Some("7"));
        assert_eq!(
            read::<OptStr>(json!(false)).unwrap().v.as_deref(),
            Some("false")
        );
        assert_eq!(read::<OptStr>(json!("")).unwrap().v, None);
        assert_eq!(read::<OptStr>(json!(null)).unwrap().v, None);
        assert_eq!(serde_json::from_value::<OptStr>(json!({})).unwrap().v, None);
        assert!(read::<OptStr>(json!(["a"])).is_err());
    }

    #[test]
    fn integers_take_strings_floats_and_booleans() {
        for (v, want) in [
            (json!(7), 7),
            (json!("7"), 7),
            (json!(" 7 "), 7),
            (json!(3.9), 3),
            (json!("3.9"), 3),
            (json!(2.0), 2),
            (json!(true), 1),
            (json!(false), 0),
            (json!(null), 0),
            (json!(""), 0),
            (json!(" "), 0),
        ] {
            assert_eq!(read::<Int>(v.clone()).unwrap().v, want, "{v}");
        }
        assert_eq!(serde_json::from_value::<Int>(json!({})).unwrap().v, 0);
        assert_eq!(read::<SignedInt>(json!("-5")).unwrap().v, -5);
    }

    #[test]
    fn integers_refuse_words_other_kinds_and_out_of_range() {
        let err = read::<Int>(json!("many")).unwrap_err();
        assert!(err.contains("expected an integer, got \"many\""), "{err}");
        assert!(
            read::<Int>(json!({"n": 1}))
                .unwrap_err()
                .contains("an object")
        );
        assert!(read::<Int>(json!([1])).is_err());
        assert!(read::<Int>(json!(-1)).unwrap_err().contains("out of range"));
        assert!(read::<Int>(json!(5_000_000_000_i64)).is_err());
        assert!(read::<OptInt>(json!(-1)).is_err());
    }

    #[test]
    fn optional_integers_are_none_when_null_or_blank() {
        assert_eq!(read::<OptInt>(json!("12")).unwrap().v, Some(12));
        assert_eq!(read::<OptInt>(json!(0)).unwrap().v, Some(0));
        assert_eq!(read::<OptInt>(json!(null)).unwrap().v, None);
        assert_eq!(read::<OptInt>(json!("")).unwrap().v, None);
        assert_eq!(serde_json::from_value::<OptInt>(json!({})).unwrap().v, None);
        assert!(read::<OptInt>(json!("x")).is_err());
    }

    #[test]
    fn required_integers_must_be_there() {
        assert_eq!(read::<Required>(json!(621229)).unwrap().v, 621229);
        assert_eq!(read::<Required>(json!("5")).unwrap().v, 5);
        assert_eq!(read::<Required>(json!(2.0)).unwrap().v, 2);
        for v in [json!(null), json!(""), json!("abc")] {
            let err = read::<Required>(v).unwrap_err();
            assert!(err.contains("expected an integer"), "{err}");
        }
        assert!(serde_json::from_value::<Required>(json!({})).is_err());
    }

    #[test]
    fn floats_take_strings_and_booleans() {
        for (v, want) in [
            (json!(8.5), 8.5),
            (json!(16), 16.0),
            (json!("8.5"), 8.5),
            (json!(" 2 "), 2.0),
            (json!(true), 1.0),
            (json!(null), 0.0),
            (json!(""), 0.0),
        ] {
            assert_eq!(read::<Float>(v.clone()).unwrap().v, want, "{v}");
        }
        assert!(read::<Float>(json!("lots")).is_err());
        assert!(read::<Float>(json!({})).is_err());
        assert_eq!(read::<OptFloat>(json!("1.25")).unwrap().v, Some(1.25));
        assert_eq!(read::<OptFloat>(json!(null)).unwrap().v, None);
        assert_eq!(read::<OptFloat>(json!("")).unwrap().v, None);
        assert!(read::<OptFloat>(json!([1.0])).is_err());
    }

    #[test]
    fn booleans_take_words_and_numbers() {
        for (v, want) in [
            (json!(true), true),
            (json!("TRUE"), true),
            (json!(" false "), false),
            (json!(1), true),
            (json!(0), false),
            (json!(0.5), true),
            (json!(""), false),
            (json!(null), false),
        ] {
            assert_eq!(read::<Bool>(v.clone()).unwrap().v, want, "{v}");
        }
        assert!(
            read::<Bool>(json!("maybe"))
                .unwrap_err()
                .contains("not a boolean")
        );
        assert!(read::<Bool>(json!([])).is_err());
    }

    #[test]
    fn optional_booleans_are_none_only_when_null() {
        assert_eq!(read::<OptBool>(json!("true")).unwrap().v, Some(true));
        assert_eq!(read::<OptBool>(json!(null)).unwrap().v, None);
        assert_eq!(read::<OptBool>(json!("")).unwrap().v, Some(false));
        assert_eq!(
            serde_json::from_value::<OptBool>(json!({})).unwrap().v,
            None
        );
        assert!(read::<OptBool>(json!("maybe")).is_err());
    }

    #[test]
    fn lists_take_a_lone_item_and_null_or_empty_as_none() {
        let two = json!([{"Key": "a"}, {"Key": "b"}]);
        assert_eq!(read::<List>(two).unwrap().v, [key("a"), key("b")]);
        assert_eq!(read::<List>(json!({"Key": "a"})).unwrap().v, [key("a")]);
        assert_eq!(read::<Names>(json!("vsw-a")).unwrap().v, ["vsw-a"]);
        for empty in [json!(null), json!(""), json!([])] {
            assert!(read::<List>(empty).unwrap().v.is_empty());
        }
        assert!(
            serde_json::from_value::<List>(json!({}))
                .unwrap()
                .v
                .is_empty()
        );
        assert!(read::<List>(json!([{"Key": []}])).is_err());
        assert!(read::<List>(json!(7)).is_err());
    }

    #[test]
    fn objects_take_null_empty_string_and_empty_list_as_default() {
        let one = json!({"Item": {"Key": "a"}});
        assert_eq!(read::<Wrapper>(one).unwrap().v.items, [key("a")]);
        for empty in [json!(null), json!(""), json!([]), json!({})] {
            assert_eq!(read::<Wrapper>(empty).unwrap().v, Items::default());
        }
        assert!(read::<Wrapper>(json!([{"Item": []}])).is_err());
        assert!(read::<Wrapper>(json!("x")).is_err());
    }

    #[test]
    fn as_int_reads_what_int_reads_and_nothing_else() {
        assert_eq!(super::as_int(&json!("4")), Some(4));
        assert_eq!(super::as_int(&json!(4.7)), Some(4));
        assert_eq!(super::as_int(&json!(true)), Some(1));
        for v in [
            json!(null),
            json!(""),
            json!("x"),
            json!({"count": 1}),
            json!(1e300),
            json!(u64::MAX),
            json!("1e19"),
        ] {
            assert_eq!(super::as_int(&v), None, "{v}");
        }
        assert_eq!(super::kind(&json!([])), "an array");
    }
}
