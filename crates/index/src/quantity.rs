//! Kubernetes resource quantities (`500m`, `16Gi`, `1e3`): validation and conversion to numbers.

use thiserror::Error;

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a Kubernetes quantity (examples: 4, 500m, 16Gi, 128G)")]
pub struct QuantityError(pub String);

/// Parses a quantity into its numeric value (cores for cpu, bytes for memory). The value is
/// always finite.
pub fn parse(s: &str) -> Result<f64, QuantityError> {
    let err = || QuantityError(s.to_string());
    let s_trim = s.trim();
    if s_trim.is_empty() || s_trim != s {
        return Err(err());
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let body = number.strip_prefix(['+', '-']).unwrap_or(number);
    if body.is_empty() || body.contains(['+', '-']) || body.matches('.').count() > 1 || body == "."
    {
        return Err(err());
    }
    let value: f64 = number.parse().map_err(|_| err())?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err())?;
            10f64.powi(e)
        }
        _ => return Err(err()),
    };
    let amount = value * multiplier;
    // An exponent past f64's range is no quantity a node has.
    if !amount.is_finite() {
        return Err(err());
    }
    Ok(amount)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_decimal_binary_and_exponent_forms() {
        assert_eq!(parse("4").unwrap(), 4.0);
        assert_eq!(parse("500m").unwrap(), 0.5);
        assert_eq!(parse("16Gi").unwrap(), 16.0 * 1024.0 * 1024.0 * 1024.0);
        assert_eq!(parse("128G").unwrap(), 128e9);
        assert_eq!(parse("1e3").unwrap(), 1000.0);
        assert_eq!(parse("1.5").unwrap(), 1.5);
        assert_eq!(parse("+2k").unwrap(), 2000.0);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "abc", "4 cores", "1.2.3", "Gi", "4gb", " 4", "1e", "--1",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::parse;

        const SUFFIXES: [(&str, f64); 17] = [
            ("", 1.0),
            ("n", 1e-9),
            ("u", 1e-6),
            ("m", 1e-3),
            ("k", 1e3),
            ("M", 1e6),
            ("G", 1e9),
            ("T", 1e12),
            ("P", 1e15),
            ("E", 1e18),
            ("Ki", 1024.0),
            ("Mi", 1048576.0),
            ("Gi", 1073741824.0),
            ("Ti", 1099511627776.0),
            ("Pi", 1125899906842624.0),
            ("Ei", 1152921504606846976.0),
            ("e3", 1e3),
        ];

        proptest! {
            #[test]
            fn never_panics_and_accepted_values_are_finite(s in any::<String>()) {
                if let Ok(v) = parse(&s) {
                    prop_assert!(v.is_finite());
                }
            }

            #[test]
            fn never_panics_on_quantity_like_strings(s in "[-+0-9.eEkKMGTPinum ]{0,12}") {
                if let Ok(v) = parse(&s) {
                    prop_assert!(v.is_finite());
                }
            }

            #[test]
            fn integers_with_any_suffix_are_accepted_with_their_value(
                n in 0u32..1_000_000,
                suffix in 0..SUFFIXES.len(),
            ) {
                let (text, multiplier) = SUFFIXES[suffix];
                let expected = f64::from(n) * multiplier;
                let parsed = parse(&format!("{n}{text}")).unwrap();
                prop_assert!((parsed - expected).abs() <= expected.abs() * 1e-12, "{parsed} vs {expected}");
            }

            #[test]
            fn surrounding_whitespace_is_rejected(n in 0u32..1000, pad in "[ \t\n]{1,3}") {
                let (leading, trailing) = (format!("{pad}{n}"), format!("{n}{pad}"));
                prop_assert!(parse(&leading).is_err());
                prop_assert!(parse(&trailing).is_err());
            }
        }
    }
}
