//! cluster-autoscaler's loop in `results.json` and in the printed report: one entry per
//! setting and dataset (min, median and max over all its loops, a p99 from 20 loops on), the
//! RPCs CA made to ours per loop, what the relay cost, what the network hop itself adds, and
//! the ratios and goals between settings (another release's or a patched build's against the
//! pinned release as published).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::ca_loop::{LoopSummary, P99_MIN_LOOPS};
use super::ca_runs::{Peer, SettingRuns, ca_build};
use super::calibrate::HopCalibration;
use super::dataset::Workload;
use super::report::{Goal, Metric, bounded, num, ratio_cell, table, verdict};
use super::{DatasetRun, Runs};
use ngo_testbed::autoscaler::CaRelease;

/// Fewest loops a setting is meant to have; fewer are flagged in the report.
const MIN_LOOPS: usize = 5;
/// The relay's memory goal, stated for 5,000 nodes: smaller datasets are held to it too,
/// larger ones only reported.
const RELAY_RSS_GOAL_MIB: f64 = 30.0;
const RELAY_RSS_GOAL_NODES: usize = 5_000;

/// cluster-autoscaler's main loop in one setting on one dataset.
#[derive(Clone, Debug, Serialize)]
pub struct CaLoopEntry {
    /// `nodegroup-operator`, `example-server` or `in-tree-clusterapi`.
    pub peer: String,
    /// `remote` (externalgrpc over mTLS on TCP), `co-located` (plaintext on the operator's Unix
    /// socket), `relay` (plaintext on the relay's Unix socket) or `in-tree`.
    pub mode: String,
    /// cluster-autoscaler's release.
    pub ca_version: String,
    /// The patch of docs/upstream.md that release's source was built with alone
    /// (`tests/upstream/patches/cluster-autoscaler-<ca_version>/<ca_patch>.patch`); `None`: as
    /// released.
    pub ca_patch: Option<String>,
    /// `groups x nodes` of the dataset, e.g. `200x25`.
    pub dataset: String,
    /// What runs on it: `filled` or `at minimum`.
    pub workload: String,
    /// Nodes of the dataset (all autoscaled).
    pub nodes: usize,
    /// Node groups.
    pub groups: usize,
    /// Delay added each way in front of what CA calls (see `ca_runs` for where).
    pub delay_ms_each_way: f64,
    /// CA's `--kube-client-qps`, `--kube-client-burst`.
    pub qps: (f64, u32),
    /// Run once after the rounds, not interleaved with the others.
    pub reference: bool,
    /// The loops over all runs.
    #[serde(flatten)]
    pub loops: LoopSummary,
    /// To ours: RPCs per loop by method.
    pub rpcs_per_loop: BTreeMap<String, f64>,
    /// To ours: ms per loop the server CA called spent answering, by method.
    pub server_ms_per_loop: BTreeMap<String, f64>,
    /// What CA 1.36.1's source predicts per loop for these nodes and groups with no
    /// scale-down candidates and no other nodes: `2 + 3 * nodes + 2 * groups` to
    /// `2 + 3 * nodes + 3 * groups` (ours, at-minimum datasets only).
    pub rpcs_per_loop_predicted: Option<(f64, f64)>,
    /// The Nodes CA found unneeded (removable scale-down candidates) at the end of its runs,
    /// the largest over the runs.
    pub unneeded_nodes: Option<f64>,
    /// Relay: its largest resident memory after the loops over the runs, MiB.
    pub relay_rss_max_mib: Option<f64>,
    /// Relay: bytes of view updates the operator sent it per run.
    pub relay_update_bytes_per_run: Option<f64>,
    /// Relay: the same per second of relay.
    pub relay_update_bytes_per_s: Option<f64>,
}

impl CaLoopEntry {
    fn of(run: &DatasetRun, setting: &SettingRuns) -> Self {
        let s = &setting.setting;
        let (nodes, groups) = (run.spec.machines(), run.spec.groups());
        let predicted = (s.peer.is_ours()
            && run.spec.workload == Workload::AtMinimum
            && s.release >= CaRelease::new(35, 0)
            && s.patch.is_none())
        .then(|| {
            let base = 2.0 + 3.0 * nodes as f64;
            (base + 2.0 * groups as f64, base + 3.0 * groups as f64)
        });
        let bytes = setting.relay_update_bytes();
        Self {
            peer: s.peer.name().into(),
            mode: s.peer.mode().into(),
            ca_version: s.release.to_string(),
            ca_patch: s.patch.clone(),
            dataset: run.spec.label(),
            workload: run.spec.workload.label().into(),
            nodes,
            groups,
            delay_ms_each_way: s.delay_ms,
            qps: s.qps,
            reference: setting.reference,
            loops: setting.summary(),
            rpcs_per_loop: setting.rpcs_per_loop(),
            server_ms_per_loop: setting.server_ms_per_loop(),
            rpcs_per_loop_predicted: predicted,
            unneeded_nodes: setting
                .runs
                .iter()
                .filter_map(|r| r.stats.unneeded_nodes)
                .max_by(f64::total_cmp),
            relay_rss_max_mib: setting.relay_rss_max_mib(),
            relay_update_bytes_per_run: bytes.map(|(per_run, _)| per_run),
            relay_update_bytes_per_s: bytes.map(|(_, per_s)| per_s),
        }
    }

    /// `1.36.1`, or `1.36.1 + <patch>` for a patched build.
    pub fn ca(&self) -> String {
        ca_build(&self.ca_version, self.ca_patch.as_deref())
    }

    /// Whether this is the pinned release as published (the rows the goals and the other
    /// releases and patched builds are measured against).
    fn is_pinned(&self) -> bool {
        self.ca_patch.is_none() && self.ca_version == pinned()
    }
}

/// The loop entries of every dataset that ran cluster-autoscaler, in its settings' order.
pub fn entries(runs: &Runs) -> Vec<CaLoopEntry> {
    runs.datasets
        .iter()
        .filter_map(|run| Some((run, run.ca.as_ref()?)))
        .flat_map(|(run, ca)| ca.settings.iter().map(|s| CaLoopEntry::of(run, s)))
        .collect()
}

/// The hop calibrations of the run (the main dataset measures them).
pub fn hop_calibration(runs: &Runs) -> Vec<HopCalibration> {
    runs.datasets
        .iter()
        .filter_map(|d| d.ca.as_ref())
        .flat_map(|ca| ca.hop.iter().cloned())
        .collect()
}

/// The pinned release, as entries name it.
fn pinned() -> String {
    CaRelease::pinned().map_or_else(|_| String::new(), |r| r.to_string())
}

/// Finds the compared (not reference) entry of `dataset` for `peer` at `delay`, with the
/// pinned release as published.
fn compared<'a>(
    entries: &'a [CaLoopEntry],
    dataset: &str,
    peer: Peer,
    delay: f64,
) -> Option<&'a CaLoopEntry> {
    entries.iter().find(|e| {
        !e.reference
            && e.dataset == dataset
            && e.peer == peer.name()
            && e.mode == peer.mode()
            && e.delay_ms_each_way == delay
            && e.is_pinned()
    })
}

/// Relay against in-tree and against ours co-located, at one delay on one dataset.
#[derive(Clone, Debug, Serialize)]
pub struct RelayRatio {
    /// `groups x nodes`.
    pub dataset: String,
    /// Nodes.
    pub nodes: usize,
    /// Delay each way.
    pub delay_ms_each_way: f64,
    /// The relay's median loop, ms.
    pub relay_p50_ms: Option<f64>,
    /// In-tree's median loop (or its lower bound), ms.
    pub in_tree_p50_ms: Option<f64>,
    /// True when `in_tree_p50_ms` is a lower bound.
    pub in_tree_is_bound: bool,
    /// Ours co-located's median loop, ms.
    pub co_located_p50_ms: Option<f64>,
    /// `relay / in-tree`.
    pub vs_in_tree: Option<f64>,
    /// `relay / co-located`.
    pub vs_co_located: Option<f64>,
    /// The relay's largest RSS after its loops, MiB.
    pub relay_rss_max_mib: Option<f64>,
    /// Bytes the operator sent the relay per run.
    pub update_bytes_per_run: Option<f64>,
}

/// The relay's ratios at every delay of every dataset that ran it.
pub fn relay_ratios(entries: &[CaLoopEntry]) -> Vec<RelayRatio> {
    entries
        .iter()
        .filter(|e| !e.reference && e.mode == Peer::Relay.mode() && e.is_pinned())
        .map(|relay| {
            let other = |peer| compared(entries, &relay.dataset, peer, relay.delay_ms_each_way);
            let in_tree = other(Peer::InTree);
            let co_located = other(Peer::OursCoLocated);
            let in_tree_p50 = in_tree.and_then(|e| e.loops.p50_or_bound());
            let co_located_p50 = co_located.and_then(|e| e.loops.p50_ms);
            RelayRatio {
                dataset: relay.dataset.clone(),
                nodes: relay.nodes,
                delay_ms_each_way: relay.delay_ms_each_way,
                relay_p50_ms: relay.loops.p50_ms,
                in_tree_p50_ms: in_tree_p50,
                in_tree_is_bound: in_tree.is_some_and(|e| e.loops.p50_is_bound()),
                co_located_p50_ms: co_located_p50,
                vs_in_tree: super::report::ratio(relay.loops.p50_ms, in_tree_p50),
                vs_co_located: super::report::ratio(relay.loops.p50_ms, co_located_p50),
                relay_rss_max_mib: relay.relay_rss_max_mib,
                update_bytes_per_run: relay.relay_update_bytes_per_run,
            }
        })
        .collect()
}

fn describe(metric: Metric, ours: &CaLoopEntry, upstream: &CaLoopEntry) -> Metric {
    metric
        .with("ours_loops", ours.loops.loops)
        .with("upstream_loops", upstream.loops.loops)
        .with("ours_min_ms", ours.loops.min_ms)
        .with("ours_max_ms", ours.loops.max_ms)
        .with("upstream_min_ms", upstream.loops.min_ms)
        .with("upstream_max_ms", upstream.loops.max_ms)
}

fn compare(ours: &CaLoopEntry, upstream: &CaLoopEntry) -> Metric {
    describe(
        Metric::compare(
            ours.loops.p50_ms,
            upstream.loops.p50_or_bound(),
            upstream.loops.p50_is_bound(),
            "ms",
        ),
        ours,
        upstream,
    )
}

/// The loop metrics: on the main dataset without a hop, ours remote against in-tree (goal
/// 0.2) and against CA through the example server (0.1); per dataset at its largest delay,
/// ours remote (0.5), ours co-located (0.1) and the relay (0.3) against in-tree, the relay
/// against co-located (1.2); the relay's memory (30 MiB, up to 5,000 nodes).
pub fn add_metrics(metrics: &mut BTreeMap<String, Metric>, runs: &Runs, entries: &[CaLoopEntry]) {
    if let Some(main) = runs.datasets.first() {
        add_main_metrics(metrics, &main.spec.label(), entries);
    }
    for run in runs.datasets.iter().filter(|d| d.ca.is_some()) {
        let label = run.spec.label();
        let Some(delay) = entries
            .iter()
            .filter(|e| e.dataset == label && !e.reference)
            .map(|e| e.delay_ms_each_way)
            .max_by(f64::total_cmp)
        else {
            continue;
        };
        let at = |peer| compared(entries, &label, peer, delay);
        let with_setting = |m: Metric, mode: &str, against: &CaLoopEntry| {
            m.with("dataset", &label)
                .with("nodes", run.spec.machines())
                .with("groups", run.spec.groups())
                .with("workload", run.spec.workload.label())
                .with("delay_ms_each_way", delay)
                .with("mode", mode)
                .with("against", format!("{} {}", against.peer, against.mode))
                .with(
                    "upstream_setting",
                    format!("qps {}/{}", against.qps.0, against.qps.1),
                )
        };
        for (peer, key, against, goal) in [
            (Peer::OursRemote, "remote_vs_intree", Peer::InTree, 0.5),
            (
                Peer::OursCoLocated,
                "colocated_vs_intree",
                Peer::InTree,
                0.1,
            ),
            (Peer::Relay, "relay_vs_intree", Peer::InTree, 0.3),
            (Peer::Relay, "relay_vs_colocated", Peer::OursCoLocated, 1.2),
        ] {
            let (Some(ours), Some(upstream)) = (at(peer), at(against)) else {
                continue;
            };
            let metric = with_setting(compare(ours, upstream), peer.mode(), upstream)
                .goal("ratio", Goal::AtMost(goal));
            metrics.insert(format!("ca_loop_{key}_{label}"), metric);
        }
        if let Some(rss) = entries
            .iter()
            .filter(|e| e.dataset == label && e.mode == Peer::Relay.mode())
            .filter_map(|e| e.relay_rss_max_mib)
            .max_by(f64::total_cmp)
        {
            let mut metric = Metric::ours(Some(rss), "MiB")
                .with("dataset", &label)
                .with("nodes", run.spec.machines())
                .with(
                    "measured",
                    "VmRSS of the relay after its loops, the largest over its runs at every delay",
                );
            if run.spec.machines() <= RELAY_RSS_GOAL_NODES {
                metric = metric.goal("ours", Goal::AtMost(RELAY_RSS_GOAL_MIB));
            }
            metrics.insert(format!("relay_rss_mib_{label}"), metric);
        }
    }
}

fn add_main_metrics(metrics: &mut BTreeMap<String, Metric>, main: &str, entries: &[CaLoopEntry]) {
    let Some(ours) = compared(entries, main, Peer::OursRemote, 0.0) else {
        return;
    };
    let reference = |peer: Peer, qps: Option<(f64, u32)>| {
        entries.iter().find(|e| {
            e.reference
                && e.dataset == main
                && e.peer == peer.name()
                && e.mode == peer.mode()
                && qps.is_none_or(|q| e.qps == q)
        })
    };
    if let Some(in_tree) = compared(entries, main, Peer::InTree, 0.0) {
        let mut metric = compare(ours, in_tree).with(
            "upstream_setting",
            format!(
                "--kube-client-qps={} --kube-client-burst={} (both)",
                in_tree.qps.0, in_tree.qps.1
            ),
        );
        if let Some(in_tree_default) = reference(Peer::InTree, None)
            && let Some(ours_default) = reference(Peer::OursRemote, Some(in_tree_default.qps))
        {
            let up = in_tree_default.loops.p50_or_bound();
            metric = metric
                .with(
                    "upstream_default_setting",
                    format!(
                        "--kube-client-qps={} --kube-client-burst={} (both)",
                        in_tree_default.qps.0, in_tree_default.qps.1
                    ),
                )
                .with("ours_default_qps", ours_default.loops.p50_ms)
                .with("upstream_default_qps", up)
                .with(
                    "upstream_default_qps_is_bound",
                    in_tree_default.loops.p50_is_bound(),
                )
                .with(
                    "ratio_default_qps",
                    super::report::ratio(ours_default.loops.p50_ms, up),
                );
        }
        metrics.insert(
            "ca_loop_p50_ms_vs_intree".into(),
            metric.goal("ratio", Goal::AtMost(0.2)),
        );
    }
    if let Some(example) = reference(Peer::Example, None) {
        metrics.insert(
            "ca_loop_p50_ms_vs_example".into(),
            compare(ours, example)
                .with(
                    "upstream_setting",
                    format!(
                        "CA at --kube-client-qps={} --kube-client-burst={} (the example server's own client at 5/10)",
                        example.qps.0, example.qps.1
                    ),
                )
                .goal("ratio", Goal::AtMost(0.1)),
        );
    }
}

/// The main table's rows of the loop metrics (after the two main-dataset ones): per dataset,
/// smallest first, the ratios at the largest delay, then the relay's memory.
pub fn goal_rows(metrics: &BTreeMap<String, Metric>) -> Vec<Vec<String>> {
    let mut named: Vec<(&String, &Metric)> = metrics
        .iter()
        .filter(|(name, _)| {
            (name.starts_with("ca_loop_")
                && name.contains("_vs_")
                && !name.starts_with("ca_loop_p50"))
                || name.starts_with("relay_rss_mib_")
        })
        .collect();
    let order = |name: &str| {
        [
            "ca_loop_remote_vs_intree",
            "ca_loop_colocated_vs_intree",
            "ca_loop_relay_vs_intree",
            "ca_loop_relay_vs_colocated",
            "relay_rss_mib",
        ]
        .iter()
        .position(|p| name.starts_with(p))
        .unwrap_or(usize::MAX)
    };
    named.sort_by_key(|(name, m)| {
        let nodes = m.extra.get("nodes").and_then(Value::as_u64).unwrap_or(0);
        (nodes, order(name))
    });
    named
        .into_iter()
        .map(|(name, metric)| {
            let get = |k: &str| metric.extra.get(k);
            let text = |k: &str| get(k).and_then(Value::as_str).unwrap_or_default();
            let dataset = format!(
                "{} ({} nodes)",
                text("dataset"),
                num(get("nodes").and_then(Value::as_f64))
            );
            let label = if name.starts_with("relay_rss_mib") {
                format!("relay RSS after its loops, largest (MiB), {dataset}")
            } else {
                let ours = match text("mode") {
                    "relay" => "relay".to_string(),
                    mode => format!("ours {mode}"),
                };
                let against = match text("against") {
                    "nodegroup-operator co-located" => "ours co-located".to_string(),
                    _ => format!("in-tree {}", text("upstream_setting")),
                };
                format!(
                    "CA main loop p50 (ms), {dataset}, {} ms each way: {ours} vs {against}",
                    num(get("delay_ms_each_way").and_then(Value::as_f64)),
                )
            };
            vec![
                label,
                num(metric.ours),
                bounded(metric.upstream, metric.upstream_is_bound),
                ratio_cell(metric),
                verdict(metric),
            ]
        })
        .collect()
}

/// The loop table, the hop's own cost, the relay's ratios and cost, the older release and the
/// patched builds against the pinned release, and the RPCs per loop CA made to ours.
pub fn render(entries: &[CaLoopEntry], hop: &[HopCalibration], relay: &[RelayRatio]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let l = &e.loops;
            let mode = if e.reference {
                format!("{} (reference)", e.mode)
            } else {
                e.mode.clone()
            };
            let few = if l.loops < MIN_LOOPS && !e.reference {
                format!(" (< {MIN_LOOPS})")
            } else {
                String::new()
            };
            vec![
                e.peer.clone(),
                mode,
                e.ca(),
                format!(
                    "{} x {} {}",
                    e.groups,
                    e.nodes / e.groups.max(1),
                    e.workload
                ),
                num(Some(e.delay_ms_each_way)),
                format!("{}/{}", e.qps.0, e.qps.1),
                format!("{}{few}", l.loops),
                num(l.min_ms),
                // No loop measured: the figure is how long the first one ran at least.
                bounded(l.p50_or_bound(), l.p50_is_bound()),
                num(l.max_ms),
                num(l.p99_ms),
                l.runs.to_string(),
                num(e.unneeded_nodes),
            ]
        })
        .collect();
    let mut out = String::from("\ncluster-autoscaler main loop\n");
    out.push_str(&table(
        &[
            "peer",
            "setting",
            "CA",
            "groups x nodes",
            "delay ms each way",
            "qps/burst",
            "loops",
            "min ms",
            "p50 ms",
            "max ms",
            "p99 ms",
            "runs",
            "unneeded",
        ],
        &rows,
    ));
    out.push_str(&format!(
        "(every setting but the references ran once per round, the rounds' orders shuffled from a fixed seed; references ran once after the rounds; p99 only from {P99_MIN_LOOPS} loops on; '>' a lower bound: no loop completed, the first had run that long; unneeded: the Nodes CA found removable at the end of a run, none removed; CA '<version> + <patch>': built with tests/upstream/patches/cluster-autoscaler-<version>/<patch>.patch alone, docs/upstream.md)\n"
    ));
    for h in hop {
        out.push_str(&format!(
            "the hop itself at {} ms each way ({} round trips per series, mean): a gRPC round trip (GPULabel, mTLS) {} µs through it against {} µs direct, +{} µs beyond the {} µs of delay; a TCP round trip +{} µs. Not subtracted from the loops above.\n",
            num(Some(h.delay_ms)),
            h.samples,
            num(Some(h.grpc_hop_mean_us)),
            num(Some(h.grpc_direct_mean_us)),
            num(Some(h.grpc_extra_us())),
            num(Some(2.0 * h.delay_ms * 1e3)),
            num(Some(h.tcp_extra_us())),
        ));
    }
    if !relay.is_empty() {
        out.push_str("\nthe relay against in-tree and against ours co-located (median loops)\n");
        let rows: Vec<Vec<String>> = relay
            .iter()
            .map(|r| {
                vec![
                    format!("{} ({} nodes)", r.dataset, num(Some(r.nodes as f64))),
                    num(Some(r.delay_ms_each_way)),
                    num(r.relay_p50_ms),
                    bounded(r.in_tree_p50_ms, r.in_tree_is_bound),
                    if r.in_tree_is_bound {
                        format!("< {}", num(r.vs_in_tree))
                    } else {
                        num(r.vs_in_tree)
                    },
                    num(r.co_located_p50_ms),
                    num(r.vs_co_located),
                    num(r.relay_rss_max_mib),
                    num(r.update_bytes_per_run),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "dataset",
                "delay ms each way",
                "relay p50 ms",
                "in-tree p50 ms",
                "relay / in-tree",
                "co-located p50 ms",
                "relay / co-located",
                "relay RSS MiB",
                "update bytes per run",
            ],
            &rows,
        ));
    }
    out.push_str(&render_against_pinned(entries));
    out.push_str(&render_rpcs(entries));
    out
}

/// Each entry of another release than the pinned one, or of a patched build, beside the pinned
/// release's entry of the same setting: the median loops, the RPCs per loop and their ratio.
fn render_against_pinned(entries: &[CaLoopEntry]) -> String {
    let mut out = String::new();
    for other in entries.iter().filter(|e| !e.is_pinned()) {
        let Some(base) = entries.iter().find(|e| {
            e.is_pinned()
                && e.dataset == other.dataset
                && e.peer == other.peer
                && e.mode == other.mode
                && e.delay_ms_each_way == other.delay_ms_each_way
                && e.qps == other.qps
                && e.reference == other.reference
        }) else {
            continue;
        };
        let total = |e: &CaLoopEntry| {
            let n: f64 = e.rpcs_per_loop.values().sum();
            if n > 0.0 {
                format!(", {} RPCs per loop", num(Some(n)))
            } else {
                String::new()
            }
        };
        out.push_str(&format!(
            "CA {} against {} ({} {}, {}, {} ms each way): p50 {} ms{} against {} ms{} (ratio {})\n",
            other.ca(),
            base.ca(),
            other.peer,
            other.mode,
            other.dataset,
            num(Some(other.delay_ms_each_way)),
            bounded(other.loops.p50_or_bound(), other.loops.p50_is_bound()),
            total(other),
            bounded(base.loops.p50_or_bound(), base.loops.p50_is_bound()),
            total(base),
            num(super::report::ratio(other.loops.p50_ms, base.loops.p50_ms)),
        ));
    }
    if out.is_empty() {
        out
    } else {
        format!("\n{out}")
    }
}

/// RPCs per loop to ours, per dataset, release and mode without a hop (the count does not
/// depend on the delay) and for every older release and patched build; the operator's own time
/// for remote.
fn render_rpcs(entries: &[CaLoopEntry]) -> String {
    let mut out = String::new();
    for e in entries.iter().filter(|e| {
        !e.rpcs_per_loop.is_empty()
            && !e.reference
            && (e.delay_ms_each_way == 0.0 || !e.is_pinned())
    }) {
        let total: f64 = e.rpcs_per_loop.values().sum();
        let by_method = e
            .rpcs_per_loop
            .iter()
            .map(|(m, n)| format!("{m} {}", num(Some(*n))))
            .collect::<Vec<_>>()
            .join(", ");
        let predicted = e
            .rpcs_per_loop_predicted
            .map(|(low, high)| format!("; CA's source predicts {low:.0} to {high:.0}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "RPCs per loop to ours ({}, CA {}) at {} nodes, {} groups, {}: {} ({by_method}){predicted}\n",
            e.mode,
            e.ca(),
            e.nodes,
            e.groups,
            e.workload,
            num(Some(total))
        ));
        let server: f64 = e.server_ms_per_loop.values().sum();
        if server > 0.0 && e.mode == Peer::OursRemote.mode() {
            let per_call = e
                .server_ms_per_loop
                .iter()
                .filter_map(|(m, ms)| {
                    let calls = e.rpcs_per_loop.get(m).copied().filter(|n| *n > 0.0)?;
                    Some(format!("{m} {}", num(Some(ms / calls * 1e3))))
                })
                .collect::<Vec<_>>()
                .join(", ");
            out.push_str(&format!(
                "  the operator's own time answering them: {} ms per loop of a {} ms loop (µs per call: {per_call})\n",
                num(Some(server)),
                num(e.loops.p50_ms),
            ));
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("\n{out}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mode: Peer, delay: f64, p50: f64) -> CaLoopEntry {
        CaLoopEntry {
            peer: mode.name().into(),
            mode: mode.mode().into(),
            ca_version: pinned(),
            ca_patch: None,
            dataset: "200x25".into(),
            workload: "filled".into(),
            nodes: 5_000,
            groups: 200,
            delay_ms_each_way: delay,
            qps: (1000.0, 2000),
            reference: false,
            loops: LoopSummary {
                runs: 5,
                loops: 20,
                min_ms: Some(p50 * 0.9),
                p50_ms: Some(p50),
                max_ms: Some(p50 * 1.2),
                p99_ms: Some(p50 * 1.19),
                bound_ms: None,
            },
            rpcs_per_loop: BTreeMap::new(),
            server_ms_per_loop: BTreeMap::new(),
            rpcs_per_loop_predicted: None,
            unneeded_nodes: None,
            relay_rss_max_mib: (mode == Peer::Relay).then_some(20.0),
            relay_update_bytes_per_run: None,
            relay_update_bytes_per_s: None,
        }
    }

    #[test]
    fn a_patched_build_is_compared_with_the_release_as_published_at_the_same_delay() {
        let rpcs = |n: f64| BTreeMap::from([("NodeGroupGetOptions".to_string(), n)]);
        let mut patched = entry(Peer::OursRemote, 0.25, 6_000.0);
        patched.ca_patch = Some("startup-time-for-unready-nodes".into());
        patched.rpcs_per_loop = rpcs(200.0);
        let mut released = entry(Peer::OursRemote, 0.25, 12_000.0);
        released.rpcs_per_loop = rpcs(10_000.0);
        // The patched row first: the goals and the ratios still take the release as published.
        let entries = vec![
            patched,
            released,
            entry(Peer::InTree, 0.25, 10_000.0),
            entry(Peer::OursRemote, 0.0, 3_000.0),
        ];
        let remote = compared(&entries, "200x25", Peer::OursRemote, 0.25).expect("remote");
        assert_eq!(remote.ca_patch, None);
        assert_eq!(remote.loops.p50_ms, Some(12_000.0));
        let text = render(&entries, &[], &[]);
        let version = pinned();
        let line = format!(
            "CA {version} + startup-time-for-unready-nodes against {version} (nodegroup-operator remote, 200x25, 0.250 ms each way): p50 6,000 ms, 200 RPCs per loop against 12,000 ms, 10,000 RPCs per loop (ratio 0.500)"
        );
        assert!(text.contains(&line), "{line:?} in {text}");
        assert!(
            text.contains(&format!(
                "RPCs per loop to ours (remote, CA {version} + startup-time-for-unready-nodes) at 5000 nodes"
            )),
            "{text}"
        );
        // Its row in the loop table: min, median and max.
        assert!(
            text.lines().any(|l| l
                .contains(&format!("{version} + startup-time-for-unready-nodes"))
                && l.contains("5,400")
                && l.contains("6,000")
                && l.contains("7,200")),
            "{text}"
        );
    }

    #[test]
    fn the_relay_is_compared_with_in_tree_and_co_located_at_the_same_delay() {
        let entries = vec![
            entry(Peer::Relay, 0.25, 2_500.0),
            entry(Peer::InTree, 0.25, 10_000.0),
            entry(Peer::OursCoLocated, 0.25, 2_400.0),
            entry(Peer::InTree, 0.0, 8_000.0),
        ];
        let ratios = relay_ratios(&entries);
        assert_eq!(ratios.len(), 1);
        assert_eq!(ratios[0].vs_in_tree, Some(0.25));
        assert!(
            ratios[0]
                .vs_co_located
                .is_some_and(|r| (r - 2_500.0 / 2_400.0).abs() < 1e-9)
        );
        let text = render(&entries, &[], &ratios);
        assert!(text.contains("relay / co-located"), "{text}");
        assert!(text.contains("200 x 25 filled"), "{text}");
    }
}
