//! Tenant values quoted in messages. A message quoting what a tenant wrote (an invalid label,
//! an unknown operator) reaches conditions, Events, RPC errors and the logs, so a value is
//! quoted whole only when short: a longer one is cut, saying how long it was.

/// Most characters of a value quoted whole.
pub const MAX_QUOTED_CHARS: usize = 64;

/// `value` as a quoted string (`"abc"`, escapes as `{:?}` writes them), cut after
/// [`MAX_QUOTED_CHARS`] characters with its length in bytes: `"abc…" (70000 bytes)`.
pub fn quoted(value: &str) -> String {
    match value.char_indices().nth(MAX_QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_quoted_whole_and_long_ones_cut_with_their_length() {
        assert_eq!(quoted("a\"b"), r#""a\"b""#);
        let exact: String = "x".repeat(MAX_QUOTED_CHARS);
        assert_eq!(quoted(&exact), format!("{exact:?}"));
        let long = "é".repeat(50_000);
        let shown = quoted(&long);
        assert!(shown.ends_with("… (100000 bytes)"), "{shown}");
        assert_eq!(shown.matches('é').count(), MAX_QUOTED_CHARS);
    }
}
