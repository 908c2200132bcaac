//! Checks PromQL expressions (the chart's alerts, the Grafana dashboard) against the operator's
//! exposition text: every `nodegroup_*` name must be a series the operator exports, and where
//! the exposition has samples of a family, every label an expression matches on or groups by
//! must be one of its labels (or a target label Prometheus adds).

use std::collections::{BTreeMap, BTreeSet};

/// Labels Prometheus adds to every scraped series (ServiceMonitor targets).
const TARGET_LABELS: &[&str] = &[
    "job",
    "namespace",
    "pod",
    "instance",
    "service",
    "container",
    "endpoint",
];

/// One metric family of the exposition.
#[derive(Debug, Default)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    /// Label names seen on its samples (`None` when it has no sample).
    pub labels: Option<BTreeSet<String>>,
}

/// The families of an exposition text, by name (as in `# TYPE`).
#[derive(Debug, Default)]
pub struct Exposition {
    pub families: BTreeMap<String, Family>,
}

/// The series names a family of `kind` exposes, as suffixes of the family name.
fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "histogram" => &["_bucket", "_sum", "_count", "_created"],
        "summary" => &["_sum", "_count", "_created"],
        _ => &[""],
    }
}

impl Exposition {
    /// Parses Prometheus / OpenMetrics text.
    pub fn parse(text: &str) -> Self {
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    families.entry(name.into()).or_default().kind = kind.into();
                }
            }
        }
        let mut exposition = Self { families };
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let sample = &line[..name_end];
            let Some(family) = exposition.family_of(sample).map(String::from) else {
                continue;
            };
            let mut labels = BTreeSet::new();
            if line[name_end..].starts_with('{') {
                let close = line.rfind('}').unwrap_or(line.len());
                for pair in split_matchers(&line[name_end + 1..close]) {
                    if let Some((label, _)) = pair.split_once('=') {
                        labels.insert(label.trim().to_string());
                    }
                }
            }
            labels.remove("le");
            exposition
                .families
                .get_mut(&family)
                .expect("family exists")
                .labels
                .get_or_insert_with(BTreeSet::new)
                .extend(labels);
        }
        exposition
    }

    /// The family a series name belongs to, if the operator exports that series.
    pub fn family_of(&self, series: &str) -> Option<&str> {
        self.families.iter().find_map(|(name, family)| {
            suffixes(&family.kind)
                .iter()
                .any(|suffix| series.strip_suffix(suffix) == Some(name.as_str()))
                .then_some(name.as_str())
        })
    }

    /// Every problem of `expr`; empty when it names only exported series and labels.
    pub fn problems(&self, expr: &str) -> Vec<String> {
        self.check(expr, true)
    }

    /// The label problems of `expr` for the families this exposition has samples of; names it
    /// has no sample of are not problems (a live endpoint omits families without samples).
    pub fn label_problems(&self, expr: &str) -> Vec<String> {
        self.check(expr, false)
    }

    fn check(&self, expr: &str, names: bool) -> Vec<String> {
        let mut problems = Vec::new();
        let mut used = Vec::new();
        let mut skipped = false;
        for (series, matchers) in selectors(expr) {
            if !series.starts_with("nodegroup_") {
                continue;
            }
            let Some(family) = self.family_of(&series) else {
                if names {
                    problems.push(format!("{series} is not exported by the operator"));
                } else {
                    skipped = true;
                }
                continue;
            };
            let family = &self.families[family];
            if family.kind == "histogram" && series.ends_with("_bucket") {
                used.push(("le".to_string(), series.clone()));
            }
            if let Some(labels) = &family.labels {
                for label in matchers {
                    if !labels.contains(&label) && !TARGET_LABELS.contains(&label.as_str()) {
                        problems.push(format!(
                            "{series} has no label {label:?} (labels: {labels:?})"
                        ));
                    }
                }
            }
            used.push((String::new(), series));
        }
        if used.is_empty() && !skipped {
            problems.push("names no nodegroup_* series".into());
        }
        // Grouping labels must exist on some series the expression reads.
        let mut known: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
        let mut complete = true;
        for (extra, series) in &used {
            if !extra.is_empty() {
                known.insert(extra.clone());
                continue;
            }
            match self
                .family_of(series)
                .and_then(|f| self.families[f].labels.as_ref())
            {
                Some(labels) => known.extend(labels.iter().cloned()),
                None => complete = false,
            }
        }
        if complete && !skipped {
            for label in grouping_labels(expr) {
                if !known.contains(&label) {
                    problems.push(format!("groups by {label:?}, which no series here has"));
                }
            }
        }
        problems
    }
}

/// Splits `a="x",b=~"y,z"` at the commas outside quotes.
fn split_matchers(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// Identifier tokens outside string literals, with the byte offset after each.
fn identifiers(expr: &str) -> Vec<(String, usize)> {
    let bytes = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c == '"' || c == '\'' {
            i += 1;
            while i < bytes.len() && bytes[i] as char != c {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '$' || c.is_ascii_digit() {
            // Grafana variables ($__rate_interval) and numbers/durations (5m).
            i += 1;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
            {
                i += 1;
            }
            out.push((expr[start..i].to_string(), i));
        } else {
            i += 1;
        }
    }
    out
}

/// Series selectors: each metric name with the label names its `{...}` matches on.
fn selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (name, end) in identifiers(expr) {
        if !name.starts_with("nodegroup_") {
            continue;
        }
        let rest = expr[end..].trim_start();
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let close = body.find('}').unwrap_or(body.len());
            for matcher in split_matchers(&body[..close]) {
                let label: String = matcher
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !label.is_empty() {
                    labels.push(label);
                }
            }
        }
        out.push((name, labels));
    }
    out
}

/// Labels named in `by (...)` and `without (...)` clauses.
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ids = identifiers(expr);
    for (name, end) in &ids {
        if name != "by" && name != "without" {
            continue;
        }
        let rest = expr[*end..].trim_start();
        if let Some(body) = rest.strip_prefix('(') {
            let close = body.find(')').unwrap_or(body.len());
            out.extend(
                body[..close]
                    .split(',')
                    .map(|l| l.trim().to_string())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    out
}

/// Every PromQL expression in a Grafana dashboard: panel targets' `expr`, annotation `expr`s
/// and templating queries (`label_values(...)`), with where each was found.
pub fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(value: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    let here = match map.get("title").or_else(|| map.get("name")) {
                        Some(t) => format!("{path}/{}", t.as_str().unwrap_or_default()),
                        None => path.to_string(),
                    };
                    match (key.as_str(), v) {
                        ("expr", serde_json::Value::String(q)) => out.push((here, q.clone())),
                        ("query", serde_json::Value::String(q)) if q.contains("nodegroup_") => {
                            out.push((here, q.clone()))
                        }
                        _ => walk(v, &here, out),
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, path, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "", &mut out);
    out
}
