//! The benchmark's output: the machine it ran on, metrics with ratios and goals (pass/fail
//! is reported, never enforced), and the tables printed for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use serde_json::Value;

/// The machine a run happened on.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    /// CPUs available to this process (`nproc`).
    pub nproc: usize,
    /// `model name` of /proc/cpuinfo.
    pub cpu: String,
    /// `MemTotal` of /proc/meminfo, MiB.
    pub memory_mib: u64,
    /// /proc/sys/kernel/osrelease.
    pub kernel: String,
    /// /proc/loadavg when the run started (the machine may be shared).
    pub load_at_start: String,
}

impl MachineInfo {
    /// Reads what Linux says; unknown fields stay empty.
    pub fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpu = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default();
        let memory_mib = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kib| kib / 1024);
        Self {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            memory_mib,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            load_at_start: read("/proc/loadavg").trim().to_string(),
        }
    }

    /// One line for the table header.
    pub fn line(&self) -> String {
        format!(
            "{} CPUs ({}), {:.1} GiB RAM, Linux {}, load at start {}",
            self.nproc,
            self.cpu,
            self.memory_mib as f64 / 1024.0,
            self.kernel,
            self.load_at_start
        )
    }
}

/// A target a metric is held to.
#[derive(Clone, Copy, Debug)]
pub enum Goal {
    /// The value must be at least this.
    AtLeast(f64),
    /// The value must be at most this.
    AtMost(f64),
    /// The value must be below this.
    Below(f64),
}

impl Goal {
    fn holds(self, value: f64) -> bool {
        match self {
            Goal::AtLeast(g) => value >= g,
            Goal::AtMost(g) => value <= g,
            Goal::Below(g) => value < g,
        }
    }

    fn text(self) -> String {
        match self {
            Goal::AtLeast(g) => format!(">= {g}"),
            Goal::AtMost(g) => format!("<= {g}"),
            Goal::Below(g) => format!("< {g}"),
        }
    }
}

/// One metric of `results.json`: ours, upstream's, their ratio (ours / upstream), and the
/// goal with its outcome. Extra fields (floors, p50s beside p99s, bounds) are flattened in.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Metric {
    /// Our figure.
    pub ours: Option<f64>,
    /// The upstream peer's figure (or the lower bound it proved, see `upstream_is_bound`).
    pub upstream: Option<f64>,
    /// `ours / upstream`.
    pub ratio: Option<f64>,
    /// Unit of `ours` and `upstream`.
    pub unit: String,
    /// True when `upstream` is a lower bound (the peer did not finish): `ratio` is then an
    /// upper bound.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub upstream_is_bound: bool,
    /// The goal, e.g. `ratio >= 10`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    /// Whether every goal of this metric holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass: Option<bool>,
    /// More figures.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Metric {
    /// `ours` against `upstream` (a lower bound when `upstream_is_bound`).
    pub fn compare(
        ours: Option<f64>,
        upstream: Option<f64>,
        upstream_is_bound: bool,
        unit: &str,
    ) -> Self {
        Self {
            ours,
            upstream,
            ratio: ratio(ours, upstream),
            unit: unit.into(),
            upstream_is_bound: upstream_is_bound && upstream.is_some(),
            ..Default::default()
        }
    }

    /// Ours alone.
    pub fn ours(ours: Option<f64>, unit: &str) -> Self {
        Self::compare(ours, None, false, unit)
    }

    /// Holds `subject` (`"ratio"`, `"ours"` or an extra field) to `goal`; several goals
    /// must all hold.
    pub fn goal(mut self, subject: &str, goal: Goal) -> Self {
        let value = match subject {
            "ratio" => self.ratio,
            "ours" => self.ours,
            other => self.extra.get(other).and_then(Value::as_f64),
        };
        let text = format!("{subject} {}", goal.text());
        self.goal = Some(match self.goal.take() {
            Some(before) => format!("{before} and {text}"),
            None => text,
        });
        let holds = value.is_some_and(|v| goal.holds(v));
        self.pass = Some(self.pass.unwrap_or(true) && holds);
        self
    }

    /// Adds an extra field.
    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        self.extra.insert(
            key.into(),
            serde_json::to_value(value).unwrap_or(Value::Null),
        );
        self
    }
}

/// `ours / upstream` when both are finite and upstream is not zero.
pub fn ratio(ours: Option<f64>, upstream: Option<f64>) -> Option<f64> {
    match (ours, upstream) {
        (Some(a), Some(b)) if b != 0.0 && (a / b).is_finite() => Some(a / b),
        _ => None,
    }
}

/// A number for a table cell: 3 significant digits, thousands separated, `-` when absent.
pub fn num(value: Option<f64>) -> String {
    let Some(v) = value else {
        return "-".into();
    };
    if v == 0.0 {
        return "0".into();
    }
    if v.abs() < 0.001 {
        return format!("{v:.1e}");
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = if v.fract() == 0.0 {
        0
    } else {
        (2 - magnitude).clamp(0, 3) as usize
    };
    let text = format!("{v:.decimals$}");
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let (sign, digits) = int.strip_prefix('-').map_or(("", int), |d| ("-", d));
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    if frac.is_empty() {
        format!("{sign}{grouped}")
    } else {
        format!("{sign}{grouped}.{frac}")
    }
}

/// `value` as a table cell, prefixed `>` when it is a lower bound.
pub fn bounded(value: Option<f64>, is_bound: bool) -> String {
    match (value, is_bound) {
        (Some(_), true) => format!("> {}", num(value)),
        _ => num(value),
    }
}

/// A ratio cell (`<` when the upstream figure was a lower bound of a latency).
pub fn ratio_cell(metric: &Metric) -> String {
    match metric.ratio {
        None => "-".into(),
        Some(r) if metric.upstream_is_bound => format!("< {}", num(Some(r))),
        Some(r) => num(Some(r)),
    }
}

/// `PASS`/`FAIL` with the goal, or nothing.
pub fn verdict(metric: &Metric) -> String {
    match (&metric.goal, metric.pass) {
        (Some(goal), Some(pass)) => {
            format!("{} ({goal})", if pass { "PASS" } else { "FAIL" })
        }
        _ => String::new(),
    }
}

/// A plain-text table: a header row, then rows; columns sized to their widest cell, the
/// first left-aligned, the others right-aligned except the last (free text).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let width = widths[i];
            if i == 0 || i == columns - 1 {
                let _ = write!(text, "{cell:<width$}  ");
            } else {
                let _ = write!(text, "{cell:>width$}  ");
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(header.to_vec());
    line(
        widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect(),
    );
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_three_significant_digits_and_group_thousands() {
        assert_eq!(num(Some(12345.6)), "12,346");
        assert_eq!(num(Some(5.678)), "5.68");
        assert_eq!(num(Some(0.01234)), "0.012");
        assert_eq!(num(Some(0.00004)), "4.0e-5");
        assert_eq!(num(Some(12.0)), "12");
        assert_eq!(num(Some(0.0)), "0");
        assert_eq!(num(None), "-");
        assert_eq!(num(Some(-1234.0)), "-1,234");
    }

    #[test]
    fn goals_combine_and_bounds_mark_the_ratio() {
        let m = Metric::compare(Some(1000.0), Some(10.0), false, "requests/s")
            .with("floor_ratio", 0.5)
            .goal("ratio", Goal::AtLeast(10.0))
            .goal("floor_ratio", Goal::AtLeast(0.7));
        assert_eq!(m.ratio, Some(100.0));
        assert_eq!(m.pass, Some(false));
        assert_eq!(
            m.goal.as_deref(),
            Some("ratio >= 10 and floor_ratio >= 0.7")
        );
        let bound = Metric::compare(Some(500.0), Some(120_000.0), true, "ms")
            .goal("ratio", Goal::AtMost(0.1));
        assert_eq!(bound.pass, Some(true));
        assert!(ratio_cell(&bound).starts_with("< "));
        assert_eq!(
            Metric::ours(None, "ms").goal("ours", Goal::Below(1.0)).pass,
            Some(false)
        );
    }

    #[test]
    fn tables_align_their_columns() {
        let text = table(
            &["metric", "ours", "note"],
            &[
                vec!["a".into(), "1".into(), "x".into()],
                vec!["bb".into(), "100".into(), "y".into()],
            ],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "metric  ours  note");
        assert_eq!(lines[2], "a          1  x");
        assert_eq!(lines[3], "bb       100  y");
    }
}
