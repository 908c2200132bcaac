//! Whether strings can be Kubernetes labels, for labels taken from a cloud (plan names, tags).

/// A label value: at most 63 characters, alphanumerics, `-`, `_` and `.`, beginning and ending
/// with an alphanumeric (or empty).
pub fn valid_label_value(value: &str) -> bool {
    value.len() <= 63
        && (value.is_empty()
            || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
                && value.ends_with(|c: char| c.is_ascii_alphanumeric())
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// A label key: a name as a label value (not empty), optionally after a DNS-subdomain prefix
/// and `/`.
pub fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    !name.is_empty()
        && valid_label_value(name)
        && prefix.is_none_or(|p| {
            !p.is_empty()
                && p.len() <= 253
                && p.split('.').all(|part| {
                    !part.is_empty()
                        && part
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_keys_and_values_are_labels() {
        assert!(valid_label_key("workload_type"));
        assert!(valid_label_key("example.com/tier"));
        assert!(!valid_label_key("acs:autoscaling:scalingGroupId"));
        assert!(!valid_label_key("Example.com/tier"));
        assert!(valid_label_value("NVIDIA-T4"));
        assert!(!valid_label_value("NVIDIA T4"));
    }
}
