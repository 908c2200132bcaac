//! What a scale run found, the goals it is judged against (issue 36: at 1,000 clusters of 10
//! Nodes, the operator within 1 GiB and each cluster's Node change served within 50 ms p99; at
//! most 200 KiB more per relay stream), and the tables it prints.

use std::fmt::Write as _;

use serde::Serialize;

use super::ScaleOptions;
use super::measure::Latencies;
use super::procfs::Machine;

/// Clusters the goals are stated at.
pub const GOAL_CLUSTERS: usize = 1_000;
/// Relay streams the per-stream goal is judged at.
pub const GOAL_STREAMS: usize = 1_000;
/// The operator's resident memory at [`GOAL_CLUSTERS`], at most, MiB.
pub const GOAL_RSS_MIB: f64 = 1024.0;
/// A Node change served within this, p99, ms.
pub const GOAL_PROPAGATION_P99_MS: f64 = 50.0;
/// The central operator's added memory per relay stream, at most, KiB.
pub const GOAL_KIB_PER_STREAM: f64 = 200.0;

/// One operator serving a number of workload clusters.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterRun {
    /// Workload clusters served.
    pub clusters: usize,
    /// Nodes in each.
    pub nodes_per_cluster: usize,
    /// Seconds to start the stand-ins and write the management objects.
    pub create_seconds: f64,
    /// Seconds from the operator's start until it served every cluster's Nodes.
    pub sync_seconds: f64,
    /// Resident memory once synced and settled, MiB.
    pub rss_mib: f64,
    /// The most resident memory the operator had until then (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
    /// CPU over the idle window (no changes, no streams), cores.
    pub idle_cpu_cores: f64,
    /// The idle window, seconds.
    pub idle_window_s: f64,
    /// Requests the stand-in API servers answered per second over the idle window (the
    /// operator's probes and watch renewals).
    pub standin_requests_per_s: f64,
    /// From a Node's readiness change in its cluster's API server until a relay stream of that
    /// cluster (the only stream open) shows it.
    pub propagation: Latencies,
    /// The operator's CPU time per change of that series, ms.
    pub cpu_ms_per_change: f64,
}

/// One number of relay streams on the operator.
#[derive(Clone, Debug, Serialize)]
pub struct StreamStep {
    /// Streams open.
    pub streams: usize,
    /// What the operator's `nodegroup_relay_streams` said.
    pub streams_gauge: f64,
    /// Seconds to open the streams added at this step and receive their full views.
    pub open_seconds: f64,
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// Added resident memory per stream over no streams, KiB.
    pub added_kib_per_stream: f64,
    /// CPU over the window, cores.
    pub cpu_cores: f64,
    /// Added CPU per stream over no streams, millicores.
    pub added_millicores_per_stream: f64,
    /// Bytes of view updates sent per stream per second (keepalives, while nothing changes).
    pub update_bytes_per_stream_per_s: f64,
}

/// Relay streams on the operator serving the most clusters.
#[derive(Clone, Debug, Serialize)]
pub struct StreamsRun {
    /// Workload clusters the operator serves.
    pub clusters: usize,
    /// Resident memory with no stream, MiB.
    pub baseline_rss_mib: f64,
    /// CPU with no stream, cores.
    pub baseline_cpu_cores: f64,
    /// Each measurement window, seconds.
    pub window_s: f64,
    /// Per number of streams.
    pub steps: Vec<StreamStep>,
    /// The change series again, with every stream open.
    pub propagation: Latencies,
    /// The operator's CPU time per change of that series, ms: every stream's view is computed
    /// again at each change.
    pub cpu_ms_per_change: f64,
}

/// A goal and whether the run met it.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// What is asked.
    pub goal: String,
    /// What was measured, and where.
    pub measured: String,
    /// `None` when the run did not reach the goal's scale.
    pub met: Option<bool>,
}

/// Everything a scale run measured.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleResults {
    /// Where it ran.
    pub machine: Machine,
    /// What it ran.
    pub options: ScaleOptions,
    /// Per number of workload clusters.
    pub clusters: Vec<ClusterRun>,
    /// Relay streams, on the operator serving the most clusters.
    pub streams: Option<StreamsRun>,
    /// The goals, judged.
    pub goals: Vec<Goal>,
    /// Seconds the whole run took.
    pub seconds: f64,
}

/// The goals, judged on `clusters` and `streams`.
pub fn goals(clusters: &[ClusterRun], streams: Option<&StreamsRun>) -> Vec<Goal> {
    let at_goal = clusters.iter().find(|c| c.clusters == GOAL_CLUSTERS);
    let largest = clusters.iter().max_by_key(|c| c.clusters);
    let judged = at_goal.or(largest);
    let scale = |c: &ClusterRun| {
        let note = if c.clusters == GOAL_CLUSTERS {
            ""
        } else {
            " (below the goal's scale)"
        };
        format!(
            "{} clusters x {} nodes{note}",
            c.clusters, c.nodes_per_cluster
        )
    };
    let met = |ok: bool, c: &ClusterRun| (c.clusters == GOAL_CLUSTERS).then_some(ok);
    let mut goals = Vec::new();
    if let Some(c) = judged {
        let rss = c.rss_mib.max(c.peak_rss_mib);
        goals.push(Goal {
            goal: format!(
                "operator RSS <= {GOAL_RSS_MIB:.0} MiB at {GOAL_CLUSTERS} clusters x 10 nodes"
            ),
            measured: format!(
                "{:.0} MiB peak ({:.0} MiB settled) at {}: {:.0} % of the goal",
                c.peak_rss_mib,
                c.rss_mib,
                scale(c),
                rss / GOAL_RSS_MIB * 100.0
            ),
            met: met(rss <= GOAL_RSS_MIB, c),
        });
        goals.push(Goal {
            goal: format!(
                "each cluster's Node change served within {GOAL_PROPAGATION_P99_MS:.0} ms p99 at {GOAL_CLUSTERS} clusters"
            ),
            measured: format!(
                "p99 {:.1} ms (p50 {:.1}, max {:.1}; {} changes, each seen on one relay stream) at {}",
                c.propagation.p99_ms,
                c.propagation.p50_ms,
                c.propagation.max_ms,
                c.propagation.samples,
                scale(c)
            ),
            met: met(c.propagation.p99_ms <= GOAL_PROPAGATION_P99_MS, c),
        });
    }
    if let Some(run) = streams {
        if let Some(p) = Some(&run.propagation).filter(|p| p.samples > 0) {
            let most = run.steps.iter().map(|s| s.streams).max().unwrap_or(0);
            goals.push(Goal {
                goal: format!(
                    "the same, with {GOAL_STREAMS} relays streaming from the operator"
                ),
                measured: format!(
                    "p99 {:.1} ms (p50 {:.1}, max {:.1}; {} changes) with {most} streams on {} clusters",
                    p.p99_ms, p.p50_ms, p.max_ms, p.samples, run.clusters
                ),
                met: (most >= GOAL_STREAMS && run.clusters >= GOAL_CLUSTERS)
                    .then_some(p.p99_ms <= GOAL_PROPAGATION_P99_MS),
            });
        }
        let step = run
            .steps
            .iter()
            .find(|s| s.streams == GOAL_STREAMS)
            .or_else(|| run.steps.iter().max_by_key(|s| s.streams));
        if let Some(step) = step {
            goals.push(Goal {
                goal: format!("the central operator's added cost per relay stream <= {GOAL_KIB_PER_STREAM:.0} KiB"),
                measured: format!(
                    "{:.1} KiB and {:.2} millicores per stream with {} streams ({:.1} MiB over {:.1} MiB without)",
                    step.added_kib_per_stream,
                    step.added_millicores_per_stream,
                    step.streams,
                    step.rss_mib - run.baseline_rss_mib,
                    run.baseline_rss_mib
                ),
                met: (step.streams == GOAL_STREAMS)
                    .then_some(step.added_kib_per_stream <= GOAL_KIB_PER_STREAM),
            });
        }
    }
    goals
}

/// The tables and the goals, as printed.
pub fn render(results: &ScaleResults) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Management topology scale on {}",
        results.machine.line()
    );
    let _ = writeln!(
        out,
        "\n{:>8} {:>7} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "clusters",
        "nodes",
        "create s",
        "sync s",
        "RSS MiB",
        "peak MiB",
        "idle CPU",
        "stand-in",
        "change p50",
        "change p99"
    );
    for c in &results.clusters {
        let _ = writeln!(
            out,
            "{:>8} {:>7} {:>9.1} {:>8.1} {:>8.1} {:>9.1} {:>9.3} {:>7.0}/s {:>7.1} ms {:>7.1} ms {:>8.1} ms",
            c.clusters,
            c.clusters * c.nodes_per_cluster,
            c.create_seconds,
            c.sync_seconds,
            c.rss_mib,
            c.peak_rss_mib,
            c.idle_cpu_cores,
            c.standin_requests_per_s,
            c.propagation.p50_ms,
            c.propagation.p99_ms,
            c.cpu_ms_per_change
        );
    }
    if let Some(run) = &results.streams {
        let _ = writeln!(
            out,
            "\nRelay streams on the operator serving {} clusters (windows of {:.0} s; CPU in cores)",
            run.clusters, run.window_s
        );
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:>9} {:>11} {:>9} {:>13} {:>13}",
            "streams", "open s", "RSS MiB", "+KiB/stream", "CPU", "+mcore/stream", "bytes/s/stream"
        );
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:>9.1} {:>11} {:>9.3} {:>13} {:>13}",
            0, "-", run.baseline_rss_mib, "-", run.baseline_cpu_cores, "-", "-"
        );
        for s in &run.steps {
            let _ = writeln!(
                out,
                "{:>8} {:>8.1} {:>9.1} {:>11.1} {:>9.3} {:>13.3} {:>13.0}",
                s.streams,
                s.open_seconds,
                s.rss_mib,
                s.added_kib_per_stream,
                s.cpu_cores,
                s.added_millicores_per_stream,
                s.update_bytes_per_stream_per_s
            );
        }
        let p = &run.propagation;
        if p.samples > 0 {
            let _ = writeln!(
                out,
                "Node change with every stream open: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} changes); operator CPU {:.1} ms per change",
                p.p50_ms, p.p90_ms, p.p99_ms, p.max_ms, p.samples, run.cpu_ms_per_change
            );
        }
    }
    let _ = writeln!(out, "\nGoals");
    for goal in &results.goals {
        let verdict = match goal.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not judged",
        };
        let _ = writeln!(out, "  [{verdict}] {}: {}", goal.goal, goal.measured);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(clusters: usize, peak: f64, p99: f64) -> ClusterRun {
        ClusterRun {
            clusters,
            nodes_per_cluster: 10,
            create_seconds: 1.0,
            sync_seconds: 1.0,
            rss_mib: peak - 10.0,
            peak_rss_mib: peak,
            idle_cpu_cores: 0.01,
            idle_window_s: 5.0,
            standin_requests_per_s: 1.0,
            cpu_ms_per_change: 1.0,
            propagation: Latencies {
                samples: 100,
                p50_ms: p99 / 2.0,
                p90_ms: p99,
                p99_ms: p99,
                max_ms: p99,
            },
        }
    }

    #[test]
    fn goals_are_judged_only_at_their_scale() {
        let small = goals(&[run(10, 2000.0, 80.0)], None);
        assert!(small.iter().all(|g| g.met.is_none()), "{small:?}");
        let full = goals(&[run(10, 50.0, 10.0), run(1000, 900.0, 60.0)], None);
        assert_eq!(full[0].met, Some(true), "{full:?}");
        assert_eq!(full[1].met, Some(false), "{full:?}");
    }

    #[test]
    fn the_stream_goal_reads_the_step_of_a_thousand_streams() {
        let step = |streams, kib| StreamStep {
            streams,
            streams_gauge: streams as f64,
            open_seconds: 1.0,
            rss_mib: 100.0,
            added_kib_per_stream: kib,
            cpu_cores: 0.1,
            added_millicores_per_stream: 0.1,
            update_bytes_per_stream_per_s: 40.0,
        };
        let streams = StreamsRun {
            clusters: 1000,
            baseline_rss_mib: 90.0,
            baseline_cpu_cores: 0.05,
            window_s: 10.0,
            steps: vec![step(1, 900.0), step(1000, 150.0)],
            propagation: Latencies::default(),
            cpu_ms_per_change: 0.0,
        };
        let judged = goals(&[], Some(&streams));
        assert_eq!(judged.len(), 1);
        assert_eq!(judged[0].met, Some(true), "{judged:?}");
    }
}
