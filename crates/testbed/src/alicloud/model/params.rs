//! Request parameters: decoded, repeated (`Name.N`), integers and paging.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::errors::ApiError;

/// Request parameters, decoded.
pub type Params = BTreeMap<String, String>;

/// Parameters from `(name, value)` pairs (tests).
#[cfg(test)]
pub(in crate::alicloud) fn params(pairs: &[(&str, &str)]) -> Params {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Integer parameter `name`, if given.
pub(super) fn int(params: &Params, name: &str) -> Result<Option<i64>, ApiError> {
    params
        .get(name)
        .map(|v| {
            v.parse::<i64>()
                .map_err(|_| ApiError::invalid(name, "must be an integer"))
        })
        .transpose()
}

/// `Name.1`, `Name.2`, ... up to `limit`, in order.
pub(super) fn repeated(params: &Params, name: &str, limit: usize) -> Result<Vec<String>, ApiError> {
    let mut values = Vec::new();
    for (key, value) in params {
        if let Some(n) = key
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix('.'))
            .and_then(|n| n.parse::<usize>().ok())
        {
            if n == 0 || n > limit {
                return Err(ApiError::invalid(
                    &format!("{name}.{n}"),
                    &format!("the index must be 1 to {limit}"),
                ));
            }
            values.push((n, value.clone()));
        }
    }
    values.sort();
    Ok(values.into_iter().map(|(_, v)| v).collect())
}

/// `PageNumber` (1-based, default 1) and `PageSize` (default 10, at most 50).
pub(super) fn paging(params: &Params) -> Result<(usize, usize), ApiError> {
    let number = match params.get("PageNumber") {
        None => 1,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ApiError::invalid("PageNumber", "must be a positive integer"))?,
    };
    let size = match params.get("PageSize") {
        None => 10,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=50).contains(n))
            .ok_or_else(|| ApiError::invalid("PageSize", "must be 1 to 50"))?,
    };
    Ok((number, size))
}

/// Page `number` (of `size` items) of `items`, with the total, as ESS lists pages:
/// `{"TotalCount", "PageNumber", "PageSize", outer: {inner: [...]}}`.
pub(super) fn page_of(
    items: Vec<Value>,
    number: usize,
    size: usize,
    outer: &str,
    inner: &str,
) -> Value {
    let total = items.len();
    let selected: Vec<Value> = items
        .into_iter()
        .skip((number - 1).saturating_mul(size))
        .take(size)
        .collect();
    json!({
        "TotalCount": total,
        "PageNumber": number,
        "PageSize": size,
        outer: {inner: selected},
    })
}
