//! Go-style duration strings (`10m0s`, `1h30m`, `300ms`), as cluster-autoscaler's flags and
//! annotations use them.

use std::time::Duration;

use thiserror::Error;

/// A string that is not a non-negative Go duration.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a duration (examples: 30s, 10m, 1h30m, 500ms)")]
pub struct DurationError(pub String);

/// The largest duration Go represents: `time.Duration` is an int64 of nanoseconds.
const MAX_NANOS: u64 = i64::MAX as u64;

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a non-negative Go duration exactly as Go's `time.ParseDuration` does (integer
/// nanoseconds, the same grammar, units and overflow limit), refusing negative values.
/// `"0"` (also signed) is accepted, as in Go.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let err = || DurationError(s.to_string());
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let bytes = rest.as_bytes();
        if !(bytes[0] == b'.' || bytes[0].is_ascii_digit()) {
            return Err(err());
        }
        // [0-9]*
        let int_len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
        let mut whole: u64 = 0;
        for b in &bytes[..int_len] {
            whole = whole
                .checked_mul(10)
                .and_then(|w| w.checked_add(u64::from(b - b'0')))
                .filter(|w| *w <= 1 << 63)
                .ok_or_else(err)?;
        }
        rest = &rest[int_len..];
        // (\.[0-9]*)? — digits past what fits are ignored, as in Go's leadingFraction.
        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut frac_len = 0;
        if let Some(after) = rest.strip_prefix('.') {
            frac_len = after.bytes().take_while(u8::is_ascii_digit).count();
            let mut overflow = false;
            for b in after[..frac_len].bytes() {
                if overflow {
                    continue;
                }
                match fraction
                    .checked_mul(10)
                    .and_then(|f| f.checked_add(u64::from(b - b'0')))
                    .filter(|f| *f <= 1 << 63)
                {
                    Some(f) => {
                        fraction = f;
                        scale *= 10.0;
                    }
                    None => overflow = true,
                }
            }
            rest = &after[frac_len..];
        }
        if int_len == 0 && frac_len == 0 {
            return Err(err());
        }
        let unit_len = rest
            .bytes()
            .take_while(|b| !(*b == b'.' || b.is_ascii_digit()))
            .count();
        let unit = unit_nanos(&rest[..unit_len]).ok_or_else(err)?;
        rest = &rest[unit_len..];
        if whole > (1 << 63) / unit {
            return Err(err());
        }
        let mut value = whole * unit;
        if fraction > 0 {
            // As Go: float64 keeps a fraction of an hour accurate to the nanosecond.
            value += (fraction as f64 * (unit as f64 / scale)) as u64;
            if value > 1 << 63 {
                return Err(err());
            }
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= 1 << 63)
            .ok_or_else(err)?;
    }
    if negative || total > MAX_NANOS {
        return Err(err());
    }
    Ok(Duration::from_nanos(total))
}

/// Formats like Go's `time.Duration.String()` for whole seconds and above (`1h2m3s`, `0s`).
pub fn format(d: Duration) -> String {
    let total = d.as_secs();
    let sub = d.subsec_nanos();
    if total == 0 && sub == 0 {
        return "0s".into();
    }
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if sub == 0 {
        out.push_str(&format!("{s}s"));
    } else {
        let frac = format!("{:09}", sub);
        out.push_str(&format!("{s}.{}s", frac.trim_end_matches('0')));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("10m0s").unwrap(), Duration::from_secs(600));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("300ms").unwrap(), Duration::from_millis(300));
        assert_eq!(parse("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert_eq!(parse("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn follows_go_in_fractions_units_and_limits() {
        assert_eq!(parse(".5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("5.s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse("1.000000001s").unwrap(), Duration::new(1, 1));
        assert_eq!(parse("3\u{b5}s").unwrap(), Duration::from_micros(3));
        assert_eq!(parse("3\u{3bc}s").unwrap(), Duration::from_micros(3));
        assert_eq!(parse("+0").unwrap(), Duration::ZERO);
        assert_eq!(parse("-0").unwrap(), Duration::ZERO);
        assert_eq!(
            parse("2562047h47m16.854775807s").unwrap(),
            Duration::from_nanos(i64::MAX as u64),
            "Go's largest duration"
        );
        assert!(
            parse("2562047h47m16.854775808s").is_err(),
            "overflows in Go"
        );
        assert!(parse("9223372036854775808ns").is_err());
    }

    #[test]
    fn rejects_non_durations() {
        for bad in [
            "",
            "10",
            "ten minutes",
            "-5m",
            "5x",
            "m",
            "1h-5m",
            ".",
            ".s",
            "1h30",
            "1e3s",
            "+",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(600)), "10m0s");
        assert_eq!(format(Duration::from_secs(3723)), "1h2m3s");
        assert_eq!(format(Duration::ZERO), "0s");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::{format, parse};
        use std::time::Duration;

        proptest! {
            #[test]
            fn never_panics(s in any::<String>()) {
                let _ = parse(&s);
            }

            #[test]
            fn never_panics_on_duration_like_strings(s in "[-+0-9.hmsunµμ]{0,24}") {
                let _ = parse(&s);
            }

            #[test]
            fn formatted_durations_round_trip(nanos in 0..=i64::MAX as u64) {
                let d = Duration::from_nanos(nanos);
                prop_assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
            }

            #[test]
            fn go_components_add_up(h in 0u64..10_000, m in 0u64..100, s in 0u64..100, ms in 0u64..1000) {
                let text = format!("{h}h{m}m{s}s{ms}ms");
                let expected = Duration::from_secs(h * 3600 + m * 60 + s) + Duration::from_millis(ms);
                prop_assert_eq!(parse(&text), Ok(expected));
            }

            #[test]
            fn negative_durations_are_refused(nanos in 1u64..=i64::MAX as u64) {
                let text = format!("-{}", format(Duration::from_nanos(nanos)));
                prop_assert!(parse(&text).is_err());
            }
        }
    }
}
