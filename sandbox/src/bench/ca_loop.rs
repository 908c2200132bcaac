//! cluster-autoscaler's own main-loop duration, from its metric
//! `cluster_autoscaler_function_duration_seconds{function="main"}` (observed once per loop by
//! `main.go`'s loop around `RunOnce`).
//!
//! The metric is read every [`POLL`]: when `_count` moved by exactly one since the last read,
//! the `_sum` delta is that loop's exact duration. The histogram's buckets (exponential, ±25 %
//! wide) give a second, coarser median over the same loops.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;

use ngo_testbed::autoscaler::histogram_totals;
use ngo_testbed::process::http_get;

/// How often the metrics are read: well below the 1 s scan interval, so loops are seen one
/// at a time.
const POLL: Duration = Duration::from_millis(200);
const METRIC: &str = "cluster_autoscaler_function_duration_seconds";
const MAIN: &str = "function=\"main\"";

/// What to collect.
#[derive(Clone, Copy, Debug)]
pub struct LoopOptions {
    /// Loops to measure.
    pub loops: usize,
    /// Loops ignored first (caches filling), when more than this many complete.
    pub skip: usize,
    /// Give up after this long (from the call), keeping what completed.
    pub window: Duration,
}

/// cluster-autoscaler's main loops as measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoopStats {
    /// Exact durations of the measured loops, milliseconds.
    pub samples_ms: Vec<f64>,
    /// Their median.
    pub p50_ms: Option<f64>,
    /// The median the histogram's buckets give for the same loops (interpolated).
    pub bucket_p50_ms: Option<f64>,
    /// Loops that completed in the window (skipped ones included).
    pub completed: usize,
    /// When no loop completed: how long the first one had been running at least.
    pub bound_ms: Option<f64>,
    /// Seconds spent waiting.
    pub waited_s: f64,
    /// `cluster_autoscaler_node_groups_count{node_group_type="autoscaled"}` at the end: the
    /// groups the loops worked on.
    pub node_groups: Option<f64>,
    /// `cluster_autoscaler_errors_total` at the end, all types.
    pub errors: Option<f64>,
    /// `cluster_autoscaler_unneeded_nodes_count` at the end: the scale-down candidates CA found
    /// removable (a filled dataset's light Nodes).
    pub unneeded_nodes: Option<f64>,
}

/// Fewest loops a 99th percentile is given from: below, it would be the slowest loop or
/// close to it, and is left out.
pub const P99_MIN_LOOPS: usize = 20;

/// The loops of every run of one setting together.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LoopSummary {
    /// Runs (cluster-autoscaler processes).
    pub runs: usize,
    /// Loops measured over all runs.
    pub loops: usize,
    /// Fastest loop, ms.
    pub min_ms: Option<f64>,
    /// Median loop, ms.
    pub p50_ms: Option<f64>,
    /// Slowest loop, ms.
    pub max_ms: Option<f64>,
    /// 99th percentile (interpolated between the closest ranks), from at least
    /// [`P99_MIN_LOOPS`] loops only.
    pub p99_ms: Option<f64>,
    /// When no run measured a loop: how long the longest-running first loop had run at least,
    /// ms.
    pub bound_ms: Option<f64>,
}

impl LoopSummary {
    /// Summarises the loops of `runs`.
    pub fn of<'a>(runs: impl IntoIterator<Item = &'a LoopStats>) -> Self {
        let mut summary = Self::default();
        let mut samples = Vec::new();
        for run in runs {
            summary.runs += 1;
            samples.extend_from_slice(&run.samples_ms);
            summary.bound_ms = match (summary.bound_ms, run.bound_ms) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        samples.sort_by(f64::total_cmp);
        summary.loops = samples.len();
        if !samples.is_empty() {
            summary.bound_ms = None;
        }
        summary.min_ms = samples.first().copied();
        summary.max_ms = samples.last().copied();
        summary.p50_ms = quantile(&samples, 0.5);
        if samples.len() >= P99_MIN_LOOPS {
            summary.p99_ms = quantile(&samples, 0.99);
        }
        summary
    }

    /// The median, or the bound when no loop completed.
    pub fn p50_or_bound(&self) -> Option<f64> {
        self.p50_ms.or(self.bound_ms)
    }

    /// True when [`Self::p50_or_bound`] is the bound.
    pub fn p50_is_bound(&self) -> bool {
        self.p50_ms.is_none() && self.bound_ms.is_some()
    }
}

/// Quantile `q` of `sorted`, interpolated linearly between the two closest ranks (the median
/// of an even count is the mean of the middle two).
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
    let fraction = rank - low as f64;
    Some(sorted[low] + (sorted[high] - sorted[low]) * fraction)
}

/// Measures the loops of the cluster-autoscaler serving metrics at `address`, started
/// `running_for` ago.
pub async fn measure(
    address: SocketAddr,
    running_for: Duration,
    options: LoopOptions,
) -> LoopStats {
    let started = Instant::now();
    let mut stats = LoopStats::default();
    // (loop number, milliseconds) of every loop seen completing on its own.
    let mut exact: Vec<(usize, f64)> = Vec::new();
    let mut last: Option<(f64, f64)> = None;
    let mut text = String::new();
    // Buckets once the skipped loops had completed.
    let mut baseline: Option<Vec<(f64, f64)>> = None;
    let measured = |exact: &[(usize, f64)]| exact.iter().filter(|(i, _)| *i > options.skip).count();
    while measured(&exact) < options.loops && started.elapsed() < options.window {
        if let Some(metrics) = read(address).await
            && let Some(t) = histogram_totals(&metrics, METRIC, MAIN)
        {
            if let Some((count, sum)) = last
                && t.count == count + 1.0
            {
                exact.push((t.count as usize, (t.sum - sum) * 1e3));
            }
            if baseline.is_none() && t.count as usize >= options.skip {
                baseline = Some(histogram_buckets(&metrics, METRIC, MAIN));
            }
            stats.completed = t.count as usize;
            last = Some((t.count, t.sum));
            text = metrics;
        }
        tokio::time::sleep(POLL).await;
    }
    stats.waited_s = started.elapsed().as_secs_f64();
    let skip = if measured(&exact) > 0 {
        options.skip
    } else {
        0
    };
    let mut samples: Vec<f64> = exact
        .iter()
        .filter(|(i, _)| *i > skip)
        .map(|(_, ms)| *ms)
        .collect();
    if samples.is_empty()
        && let Some((count, sum)) = last
        && count >= 1.0
    {
        // Loops completed, none seen on its own (a slow first read): their mean.
        samples.push(sum / count * 1e3);
    }
    if samples.is_empty() {
        stats.bound_ms = Some((running_for + started.elapsed()).as_secs_f64() * 1e3);
    }
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    stats.p50_ms = quantile(&sorted, 0.5);
    let buckets = histogram_buckets(&text, METRIC, MAIN);
    let in_window = match &baseline {
        Some(base) if skip > 0 => subtract(&buckets, base),
        _ => buckets,
    };
    stats.bucket_p50_ms = bucket_quantile(&in_window, 0.5).map(|s| s * 1e3);
    stats.samples_ms = samples;
    stats.node_groups = gauge(&text, "cluster_autoscaler_node_groups_count", "autoscaled");
    stats.errors = counter_total(&text, "cluster_autoscaler_errors_total");
    stats.unneeded_nodes = counter_total(&text, "cluster_autoscaler_unneeded_nodes_count");
    stats
}

async fn read(address: SocketAddr) -> Option<String> {
    tokio::task::spawn_blocking(move || http_get(address, "/metrics").ok())
        .await
        .ok()
        .flatten()
}

/// The cumulative buckets `(le, count)` of histogram `name` whose labels contain `label`,
/// in increasing `le` (`+Inf` last), from Prometheus text exposition.
pub fn histogram_buckets(metrics: &str, name: &str, label: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = l.rsplit_once(' ')?.1.trim().parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

fn subtract(now: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    now.iter()
        .map(|&(le, count)| {
            let earlier = before
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c);
            (le, count - earlier)
        })
        .collect()
}

/// Quantile `q` of cumulative `buckets`, interpolated linearly inside the bucket that holds
/// it (Prometheus' `histogram_quantile`); the highest finite bound if it falls in `+Inf`.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let in_bucket = count - lower.1;
            let fraction = if in_bucket > 0.0 {
                (rank - lower.1) / in_bucket
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * fraction);
        }
        lower = (le, count);
    }
    None
}

/// The operator's answered RPCs by method: `nodegroup_grpc_request_duration_seconds_count`
/// summed over codes.
pub fn rpc_counts(metrics: &str) -> BTreeMap<String, f64> {
    rpc_totals(metrics, "nodegroup_grpc_request_duration_seconds_count{")
}

/// Seconds the operator spent answering, by method: `nodegroup_grpc_request_duration_seconds_sum`
/// summed over codes.
pub fn rpc_seconds(metrics: &str) -> BTreeMap<String, f64> {
    rpc_totals(metrics, "nodegroup_grpc_request_duration_seconds_sum{")
}

/// The series starting with `prefix`, summed per `method` label.
fn rpc_totals(metrics: &str, prefix: &str) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(prefix) else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let method = labels
            .split(',')
            .find_map(|l| l.strip_prefix("method=\""))
            .map(|m| m.trim_end_matches('"'));
        if let (Some(method), Ok(value)) = (method, value.trim().parse::<f64>()) {
            *counts.entry(method.to_string()).or_default() += value;
        }
    }
    counts
}

/// By method, what `after` holds beyond `before` (two reads of [`rpc_counts`] or
/// [`rpc_seconds`]); methods that did not move are left out.
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(method, n)| {
            (
                method.clone(),
                n - before.get(method).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// `totals` (summed over runs) per loop, over the `loops` those runs completed.
pub fn per_loop(totals: &BTreeMap<String, f64>, loops: usize) -> BTreeMap<String, f64> {
    if loops == 0 {
        return BTreeMap::new();
    }
    totals
        .iter()
        .map(|(method, n)| (method.clone(), n / loops as f64))
        .collect()
}

/// Adds `more` into `totals`, method by method.
pub fn add_into(totals: &mut BTreeMap<String, f64>, more: &BTreeMap<String, f64>) {
    for (method, n) in more {
        *totals.entry(method.clone()).or_default() += n;
    }
}

/// The value of gauge `name` on the line whose labels contain `label_value`.
fn gauge(metrics: &str, name: &str, label_value: &str) -> Option<f64> {
    let prefix = format!("{name}{{");
    metrics
        .lines()
        .find(|l| l.starts_with(&prefix) && l.contains(&format!("\"{label_value}\"")))
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.trim().parse().ok())
}

/// The sum of every series of counter (or gauge) `name` (its full name, `_total` included).
pub fn counter_total(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter(|l| l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpcs_are_counted_per_method_over_codes_and_divided_by_loops() {
        let before = rpc_counts(
            "nodegroup_grpc_request_duration_seconds_count{method=\"NodeGroupForNode\",code=\"OK\"} 10\n",
        );
        let after = rpc_counts(
            "# TYPE nodegroup_grpc_request_duration_seconds histogram\n\
             nodegroup_grpc_request_duration_seconds_count{method=\"NodeGroupForNode\",code=\"OK\"} 50\n\
             nodegroup_grpc_request_duration_seconds_count{method=\"NodeGroupForNode\",code=\"NotFound\"} 10\n\
             nodegroup_grpc_request_duration_seconds_count{method=\"Refresh\",code=\"OK\"} 4\n\
             nodegroup_grpc_request_duration_seconds_sum{method=\"Refresh\",code=\"OK\"} 0.5\n",
        );
        assert_eq!(
            rpc_seconds(
                "nodegroup_grpc_request_duration_seconds_sum{method=\"Refresh\",code=\"OK\"} 0.5\n\
                 nodegroup_grpc_request_duration_seconds_sum{method=\"Refresh\",code=\"Internal\"} 0.25\n"
            ),
            BTreeMap::from([("Refresh".to_string(), 0.75)])
        );
        let run = delta(&before, &after);
        let mut totals = BTreeMap::new();
        add_into(&mut totals, &run);
        add_into(&mut totals, &run);
        assert_eq!(
            per_loop(&totals, 8),
            BTreeMap::from([
                ("NodeGroupForNode".to_string(), 12.5),
                ("Refresh".into(), 1.0)
            ])
        );
        assert!(per_loop(&totals, 0).is_empty());
    }

    #[test]
    fn loops_of_several_runs_summarise_together_and_p99_needs_twenty() {
        let run = |samples: &[f64]| LoopStats {
            samples_ms: samples.to_vec(),
            ..Default::default()
        };
        let few = LoopSummary::of(&[run(&[30.0, 10.0]), run(&[20.0, 40.0, 50.0])]);
        assert_eq!(
            (
                few.runs, few.loops, few.min_ms, few.p50_ms, few.max_ms, few.p99_ms
            ),
            (2, 5, Some(10.0), Some(30.0), Some(50.0), None)
        );
        let many: Vec<f64> = (1..=20).map(f64::from).collect();
        let twenty = LoopSummary::of(&[run(&many)]);
        // Rank 0.99 x 19 = 18.81: between the 19th and the 20th loop.
        assert!(
            twenty.p99_ms.is_some_and(|p| (p - 19.81).abs() < 1e-9),
            "{twenty:?}"
        );
        assert_eq!(twenty.p50_ms, Some(10.5));
        let none = LoopSummary::of(&[
            LoopStats {
                bound_ms: Some(120_000.0),
                ..Default::default()
            },
            LoopStats {
                bound_ms: Some(125_000.0),
                ..Default::default()
            },
        ]);
        assert_eq!((none.loops, none.p50_or_bound()), (0, Some(125_000.0)));
        assert!(none.p50_is_bound());
        assert!(!few.p50_is_bound());
    }

    const METRICS: &str = "\
# TYPE cluster_autoscaler_function_duration_seconds histogram
cluster_autoscaler_function_duration_seconds_bucket{function=\"main\",le=\"0.01\"} 0
cluster_autoscaler_function_duration_seconds_bucket{function=\"main\",le=\"0.1\"} 2
cluster_autoscaler_function_duration_seconds_bucket{function=\"main\",le=\"1\"} 10
cluster_autoscaler_function_duration_seconds_bucket{function=\"main\",le=\"+Inf\"} 12
cluster_autoscaler_function_duration_seconds_bucket{function=\"scaleUp\",le=\"0.01\"} 7
cluster_autoscaler_node_groups_count{node_group_type=\"autoscaled\"} 200
cluster_autoscaler_node_groups_count{node_group_type=\"autoprovisioned\"} 0
cluster_autoscaler_errors_total{type=\"cloudProviderError\"} 2
cluster_autoscaler_errors_total{type=\"apiCallError\"} 1
cluster_autoscaler_unneeded_nodes_count 40
";

    #[test]
    fn reads_one_label_sets_buckets_in_order() {
        let buckets = histogram_buckets(METRICS, METRIC, MAIN);
        assert_eq!(
            buckets,
            vec![(0.01, 0.0), (0.1, 2.0), (1.0, 10.0), (f64::INFINITY, 12.0)]
        );
    }

    #[test]
    fn the_median_is_interpolated_inside_its_bucket() {
        let buckets = histogram_buckets(METRICS, METRIC, MAIN);
        // Rank 6 of 12: 4 of the 8 observations in (0.1, 1].
        let p50 = bucket_quantile(&buckets, 0.5).expect("median");
        assert!((p50 - 0.55).abs() < 1e-9, "{p50}");
        // Rank 11.9 falls in +Inf: the highest finite bound.
        assert_eq!(bucket_quantile(&buckets, 0.99), Some(1.0));
        assert_eq!(
            bucket_quantile(&[(1.0, 0.0), (f64::INFINITY, 0.0)], 0.5),
            None
        );
    }

    #[test]
    fn earlier_loops_are_subtracted_before_the_quantile() {
        let now = histogram_buckets(METRICS, METRIC, MAIN);
        let before = vec![(0.01, 0.0), (0.1, 2.0), (1.0, 2.0), (f64::INFINITY, 2.0)];
        let measured = subtract(&now, &before);
        assert_eq!(measured.last(), Some(&(f64::INFINITY, 10.0)));
        assert!(bucket_quantile(&measured, 0.5).is_some_and(|q| q > 0.1 && q <= 1.0));
    }

    #[test]
    fn reads_the_group_gauge_and_sums_error_counters() {
        assert_eq!(
            gauge(
                METRICS,
                "cluster_autoscaler_node_groups_count",
                "autoscaled"
            ),
            Some(200.0)
        );
        assert_eq!(
            counter_total(METRICS, "cluster_autoscaler_errors_total"),
            Some(3.0)
        );
        assert_eq!(
            counter_total(METRICS, "cluster_autoscaler_unneeded_nodes_count"),
            Some(40.0)
        );
    }
}
