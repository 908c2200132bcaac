//! Go-style duration strings (`10m0s`, `1h30m`, `300ms`), as cluster-autoscaler's flags and
//! annotations use them.

use std::time::Duration;

use thiserror::Error;

/// A string that is not a non-negative Go duration.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{0:?} is not a duration (examples: 30s, 10m, 1h30m, 500ms)")]
pub struct DurationError(pub String);

/// Parses a non-negative Go duration. `"0"` is accepted, as in Go.
pub fn parse(s: &str) -> Result<Duration, DurationError> {
    let err = || DurationError(s.to_string());
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return Err(err());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." {
            return Err(err());
        }
        let value: f64 = num.parse().map_err(|_| err())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| err())
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
    fn rejects_non_durations() {
        for bad in ["", "10", "ten minutes", "-5m", "5x", "m", "1h-5m", "."] {
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
}
