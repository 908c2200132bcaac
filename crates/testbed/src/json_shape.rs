//! Comparing the shape of JSON answers: an emulator's answer against a cloud's published
//! example of the same call. Shape is which keys there are and what JSON kind each value is,
//! not the values themselves (ids, names and times differ by nature).

use serde_json::Value;

/// Where `ours` differs in shape from `example`, as `<path>: <what>` lines (paths start at
/// `at`, then `.key` and `[0]`): a key of the example missing, a value of another JSON kind,
/// a float where the example has an integer (clients written in typed languages decode
/// those as integers). Keys only `ours` has are not differences (see [`extra_keys`]). Lists
/// compare their first items, when both have one. `null` on either side matches anything.
///
/// `exempt` paths (e.g. `"server.termination_date"`) are not compared at all: neither their
/// absence nor their kind, nor anything under them.
pub fn differences(example: &Value, ours: &Value, at: &str, exempt: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    compare(example, ours, at, exempt, &mut out);
    out
}

fn compare(example: &Value, ours: &Value, at: &str, exempt: &[&str], out: &mut Vec<String>) {
    if exempt.contains(&at) {
        return;
    }
    match (example, ours) {
        (Value::Object(e), Value::Object(o)) => {
            for (key, value) in e {
                let path = format!("{at}.{key}");
                match o.get(key) {
                    Some(mine) => compare(value, mine, &path, exempt, out),
                    None if exempt.contains(&path.as_str()) => {}
                    None => out.push(format!("{path}: missing")),
                }
            }
        }
        (Value::Array(e), Value::Array(o)) => {
            if let (Some(e), Some(o)) = (e.first(), o.first()) {
                compare(e, o, &format!("{at}[0]"), exempt, out);
            }
        }
        (Value::Number(e), Value::Number(o)) => {
            if e.is_i64() && !o.is_i64() {
                out.push(format!("{at}: {o} where the example has the integer {e}"));
            }
        }
        (Value::String(_), Value::String(_)) | (Value::Bool(_), Value::Bool(_)) => {}
        (Value::Null, _) | (_, Value::Null) => {}
        (e, o) => out.push(format!("{at}: {o} where the example has {e}")),
    }
}

/// The keys of `ours` that `example` lacks and whose name is not in `known` (e.g. the
/// response parameters an API reference lists), as paths from `at`. Keys both have are
/// followed into; a key only `ours` has is reported or, when known, not looked into (its
/// name documents its content). Lists follow their first items, when both have one.
pub fn extra_keys(example: &Value, ours: &Value, at: &str, known: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    extras(example, ours, at, known, &mut out);
    out
}

fn extras(example: &Value, ours: &Value, at: &str, known: &[&str], out: &mut Vec<String>) {
    match (example, ours) {
        (Value::Object(e), Value::Object(o)) => {
            for (key, mine) in o {
                let path = format!("{at}.{key}");
                match e.get(key) {
                    Some(theirs) => extras(theirs, mine, &path, known, out),
                    None if known.contains(&key.as_str()) => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(e), Value::Array(o)) => {
            if let (Some(e), Some(o)) = (e.first(), o.first()) {
                extras(e, o, &format!("{at}[0]"), known, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_shape_differences_are_missing_keys_other_kinds_and_floats_for_integers() {
        let example = json!({
            "id": 1, "name": "a", "tags": [{"key": "k"}], "size": 2, "gone": true,
            "optional": "x", "loose": {"deep": 1}, "nothing": null
        });
        let ours = json!({
            "id": 7, "name": 3, "tags": [{"value": "v"}], "size": 2.5, "extra": 1,
            "loose": "flat", "nothing": [1]
        });
        let mut found = differences(&example, &ours, "x", &["x.optional", "x.loose"]);
        found.sort();
        assert_eq!(
            found,
            [
                "x.gone: missing",
                "x.name: 3 where the example has \"a\"",
                "x.size: 2.5 where the example has the integer 2",
                "x.tags[0].key: missing",
            ]
        );
        assert!(differences(&example, &example, "x", &[]).is_empty());
        // Empty lists have no first item to compare.
        assert!(differences(&json!([{"a": 1}]), &json!([]), "l", &[]).is_empty());
    }

    #[test]
    fn json_shape_extra_keys_are_those_neither_the_example_nor_the_known_names_have() {
        let example = json!({"Groups": {"Group": [{"Id": "g"}]}, "RequestId": "r"});
        let ours = json!({
            "Groups": {"Group": [{"Id": "g", "Size": 1, "Name": "n"}]},
            "RequestId": "r", "TotalCount": 1, "Documented": {"Anything": 1}
        });
        let mut found = extra_keys(&example, &ours, "x", &["Name", "Documented"]);
        found.sort();
        assert_eq!(found, ["x.Groups.Group[0].Size", "x.TotalCount"]);
    }
}
