//! From what was measured ([`Runs`]) to `target/bench/results.json` and the printed tables:
//! the named metrics with ratios and goals, the growth table, the multi-cluster table.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::ca_loop::LoopStats;
use super::load::Latency;
use super::report::{self, Goal, MachineInfo, Metric, bounded, num, ratio_cell, table, verdict};
use super::server::ServerFigures;
use super::{BenchOptions, DatasetRun, Runs};

/// `results.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    /// The machine.
    pub machine: MachineInfo,
    /// What each peer ran with.
    pub settings: BTreeMap<String, String>,
    /// The main dataset.
    pub dataset: Value,
    /// The named metrics, on the main dataset (the index change on the largest).
    pub metrics: BTreeMap<String, Metric>,
    /// The read metrics per dataset size.
    pub growth: Vec<GrowthRow>,
    /// Ours serving many clusters, next to one cluster of the same size.
    pub multicluster: Value,
    /// cluster-autoscaler's main loop, one entry per peer and setting on every dataset that
    /// ran it.
    pub ca_loop: Vec<CaLoopEntry>,
    /// Seconds the whole run took.
    pub duration_s: f64,
    /// The options it ran with.
    pub options: BenchOptions,
    /// Everything measured, unsummarised.
    pub runs: Runs,
}

/// cluster-autoscaler's main loop with one peer on one dataset.
#[derive(Clone, Debug, Serialize)]
pub struct CaLoopEntry {
    /// `nodegroup-operator`, `example-server` or `in-tree-clusterapi`.
    pub peer: String,
    /// How CA reaches it: `remote` (externalgrpc over mTLS on TCP), `co-located` (plaintext on
    /// the operator's Unix socket) or `qps <qps>/<burst>` (in-tree, its API client's limits).
    pub mode: String,
    /// Nodes of the dataset (all autoscaled).
    pub nodes: usize,
    /// Node groups.
    pub groups: usize,
    /// Delay added each way between CA and the peer (or the API server, in-tree).
    pub delay_ms_each_way: f64,
    /// Median loop, or the lower bound when none completed.
    pub p50_ms: Option<f64>,
    /// 99th percentile of the measured loops.
    pub p99_ms: Option<f64>,
    /// Loops measured.
    pub loops: usize,
    /// externalgrpc to ours: RPCs per loop by method.
    pub rpcs_per_loop: BTreeMap<String, f64>,
    /// externalgrpc to ours: ms per loop the operator spent answering, by method.
    pub server_ms_per_loop: BTreeMap<String, f64>,
    /// What CA 1.36.1's source predicts per loop for these nodes and groups with no
    /// scale-down candidates and no other nodes: `2 + 3 * nodes + 2 * groups` to
    /// `2 + 3 * nodes + 3 * groups` (ours only).
    pub rpcs_per_loop_predicted: Option<(f64, f64)>,
}

/// The loop entries of every dataset that ran cluster-autoscaler.
fn ca_loop_entries(runs: &Runs) -> Vec<CaLoopEntry> {
    let mut entries = Vec::new();
    for run in &runs.datasets {
        let Some(ca) = &run.ca else {
            continue;
        };
        let (nodes, groups) = (run.spec.machines(), run.spec.groups());
        let entry = |peer: &str, mode: String, stats: &LoopStats| {
            let mut sorted = stats.samples_ms.clone();
            sorted.sort_by(f64::total_cmp);
            let p99 = sorted
                .get(((sorted.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
                .copied();
            let ours = peer == "nodegroup-operator";
            CaLoopEntry {
                peer: peer.into(),
                mode,
                nodes,
                groups,
                delay_ms_each_way: 0.0,
                p50_ms: stats.p50_or_bound(),
                p99_ms: p99,
                loops: stats.samples_ms.len(),
                rpcs_per_loop: stats.rpcs_per_loop.clone(),
                server_ms_per_loop: stats.server_ms_per_loop.clone(),
                rpcs_per_loop_predicted: ours.then(|| {
                    let base = 2.0 + 3.0 * nodes as f64;
                    (base + 2.0 * groups as f64, base + 3.0 * groups as f64)
                }),
            }
        };
        entries.push(entry("nodegroup-operator", "remote".into(), &ca.ours));
        if let Some(example) = &ca.example {
            entries.push(entry("example-server", "remote".into(), example));
        }
        for ((qps, burst), stats) in &ca.in_tree {
            entries.push(entry(
                "in-tree-clusterapi",
                format!("qps {qps}/{burst}"),
                stats,
            ));
        }
        for run in &ca.through_hop {
            let mut delayed = entry(&run.peer, run.mode.clone(), &run.stats);
            delayed.delay_ms_each_way = run.delay_ms;
            entries.push(delayed);
        }
    }
    entries
}

/// One dataset of the growth table.
#[derive(Clone, Debug, Serialize)]
pub struct GrowthRow {
    /// `groups x nodes`.
    pub dataset: String,
    /// Node groups.
    pub groups: usize,
    /// Machines (and Nodes).
    pub machines: usize,
    /// Our server.
    pub ours: GrowthFigures,
    /// The upstream example server.
    pub upstream: GrowthFigures,
}

/// The read metrics of one server on one dataset. A latency is the lower bound the call
/// proved when none answered within the per-call limit (named in `bounds`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct GrowthFigures {
    /// `NodeGroupForNode` requests/s under the load.
    pub nodegroupfornode_rps: Option<f64>,
    /// `NodeGroups` median, ms.
    pub nodegroups_p50_ms: Option<f64>,
    /// `NodeGroupNodes` median, ms.
    pub nodegroupnodes_p50_ms: Option<f64>,
    /// `NodeGroupTargetSize` median, ms.
    pub targetsize_p50_ms: Option<f64>,
    /// RSS after the load, MiB.
    pub rss_mib: Option<f64>,
    /// The latencies above that are lower bounds.
    pub bounds: Vec<String>,
}

impl GrowthFigures {
    fn of(f: &ServerFigures) -> Self {
        let mut bounds = Vec::new();
        let mut latency = |name: &str, l: &Latency| {
            if l.p50_ms.is_none() && l.bound_ms.is_some() {
                bounds.push(name.to_string());
            }
            l.p50_or_bound()
        };
        Self {
            nodegroupfornode_rps: Some(f.node_group_for_node.rps),
            nodegroups_p50_ms: latency("nodegroups_p50_ms", &f.node_groups),
            nodegroupnodes_p50_ms: latency("nodegroupnodes_p50_ms", &f.node_group_nodes),
            targetsize_p50_ms: latency("targetsize_p50_ms", &f.target_size),
            rss_mib: Some(f.rss_after_mib),
            bounds,
        }
    }

    /// The figure named `key` and whether it is a lower bound.
    fn get(&self, key: &str) -> (Option<f64>, bool) {
        let value = match key {
            "nodegroupfornode_rps" => self.nodegroupfornode_rps,
            "nodegroups_p50_ms" => self.nodegroups_p50_ms,
            "nodegroupnodes_p50_ms" => self.nodegroupnodes_p50_ms,
            "targetsize_p50_ms" => self.targetsize_p50_ms,
            "rss_mib" => self.rss_mib,
            _ => None,
        };
        (value, self.bounds.iter().any(|b| b == key))
    }
}

/// Summarises `runs`: the main dataset is the first.
pub fn summarise(
    runs: Runs,
    options: BenchOptions,
    machine: MachineInfo,
    duration_s: f64,
) -> Results {
    let mut metrics = BTreeMap::new();
    let main = runs.datasets.first();
    if let Some(main) = main {
        add_server_metrics(&mut metrics, main);
        if let Some(ca) = &main.ca {
            add_ca_metrics(&mut metrics, ca);
        }
        if let Some(p) = &main.propagation {
            metrics.insert(
                "propagation_p99_ms".into(),
                Metric::ours(Some(p.p99_ms), "ms")
                    .with("p50_ms", p.p50_ms)
                    .with("changes", p.changes)
                    .goal("ours", Goal::Below(100.0)),
            );
        }
    }
    if let Some((run, index)) = runs
        .datasets
        .iter()
        .find_map(|d| d.index.as_ref().map(|i| (d, i)))
    {
        // The index's own part, as the operator measured each change, when it could be read;
        // else from the bench's watch seeing the event; else end to end.
        let (p50, p99, from) = match (
            index.served.operator_p50_ms,
            index.served.after_watch_p50_ms,
        ) {
            (Some(p50), _) => (
                p50,
                index.served.operator_p99_ms,
                "the operator's watch receiving the event to the snapshot holding it being published (the operator's nodegroup_index_update_latency_seconds, read after each change)",
            ),
            (None, Some(p50)) => (
                p50,
                index.served.after_watch_p99_ms,
                "the API server delivering the watch event (seen by a second watcher, the bench's) to the first RPC answer showing the change",
            ),
            (None, None) => (
                index.served.p50_ms,
                Some(index.served.p99_ms),
                "sending the patch to the first RPC answer showing the change (the bench's watch saw no event)",
            ),
        };
        metrics.insert(
            "index_single_change_p50_ms".into(),
            Metric::ours(Some(p50), "ms")
                .with("p99_ms", p99)
                .with("measured_from", from)
                .with("machines", run.spec.machines())
                .with("changes", index.served.changes)
                .with("end_to_end_p50_ms", index.served.p50_ms)
                .with("end_to_end_p99_ms", index.served.p99_ms)
                .with("apiserver_watch_p50_ms", index.served.watch_p50_ms)
                .with("apiserver_watch_p99_ms", index.served.watch_p99_ms)
                .with(
                    "second_watcher_to_served_p50_ms",
                    index.served.after_watch_p50_ms,
                )
                .with(
                    "second_watcher_to_served_p99_ms",
                    index.served.after_watch_p99_ms,
                )
                .with("operator_index_update_mean_ms", index.index_update_mean_ms)
                .with("operator_index_updates", index.index_updates)
                .with(
                    "operator_event_to_index_updated_mean_ms",
                    index.event_to_index_updated_mean_ms,
                )
                .goal("ours", Goal::AtMost(1.0)),
        );
    }
    let mut growth: Vec<GrowthRow> = runs.datasets.iter().map(growth_row).collect();
    growth.sort_by_key(|r| r.machines);
    let dataset = main.map_or(Value::Null, |m| {
        json!({
            "groups": m.spec.groups(), "nodes_per_group": m.spec.nodes_per_group,
            "machine_deployments": m.spec.groups(), "machine_sets": m.spec.groups(),
            "machines": m.spec.machines(), "nodes": m.spec.machines(),
            "unknown_node_share": options.load.unknown_share,
            "create_seconds": m.create_seconds,
        })
    });
    add_hop_goals(&mut metrics, &runs);
    let multicluster = multicluster_summary(&runs);
    let ca_loop = ca_loop_entries(&runs);
    Results {
        machine,
        settings: settings(&options),
        dataset,
        metrics,
        growth,
        multicluster,
        ca_loop,
        duration_s,
        options,
        runs,
    }
}

fn settings(options: &BenchOptions) -> BTreeMap<String, String> {
    let binary = crate::operator::operator_binary();
    let profile = if binary.components().any(|c| c.as_os_str() == "release") {
        "release (optimized) build"
    } else {
        "debug build (not optimized: figures are not comparable)"
    };
    let in_tree = options
        .in_tree_qps
        .iter()
        .map(|(q, b)| format!("{q}/{b}"))
        .collect::<Vec<_>>()
        .join(" and ");
    BTreeMap::from([
        (
            "ours".into(),
            format!(
                "nodegroup-operator, {profile} {}; default flags, mTLS; --node-group-auto-discovery=clusterapi:namespace=bench",
                binary.display()
            ),
        ),
        ("upstream".into(), super::example_server::SETTINGS.into()),
        (
            "cluster_autoscaler".into(),
            format!(
                "cluster-autoscaler 1.36.1, --scan-interval=1s --v=2, scale-down on (every group at its min size); externalgrpc runs at CA's default --kube-client-qps/burst 5/10 with grpc_timeout 180s; in-tree clusterapi at {in_tree}"
            ),
        ),
        (
            "load".into(),
            format!(
                "one client for every server (ngo-sandbox, tonic): {} HTTP/2 connections over mTLS, {} workers, {:?} window after {:?} warm-up; {:.0}% of NodeGroupForNode calls for nodes of no group; latency series back to back, up to {} calls or {:?}, {:?} per-call limit",
                options.connections,
                options.load.concurrency,
                options.load.window,
                options.load.warmup,
                options.load.unknown_share * 100.0,
                options.load.latency_samples,
                options.load.latency_budget,
                options.load.call_timeout,
            ),
        ),
        (
            "api_server".into(),
            "one etcd + kube-apiserver per dataset, Cluster API CRDs, static Ready Nodes, no controllers".into(),
        ),
    ])
}

fn latency_metric(ours: &Latency, upstream: &Latency, p99: bool) -> Metric {
    let pick = |l: &Latency| if p99 { l.p99_ms } else { l.p50_ms };
    let up = pick(upstream);
    let bound = up.is_none() && upstream.bound_ms.is_some();
    Metric::compare(pick(ours), up.or(upstream.bound_ms), bound, "ms")
        .with("ours_samples", ours.samples)
        .with("upstream_samples", upstream.samples)
}

fn add_server_metrics(metrics: &mut BTreeMap<String, Metric>, run: &DatasetRun) {
    let (ours, up) = (&run.ours, &run.upstream);
    let floor = ours.floor.as_ref().map(|f| f.rps);
    let ours_rps = Some(ours.node_group_for_node.rps);
    metrics.insert(
        "nodegroupfornode_rps_c16".into(),
        Metric::compare(
            ours_rps,
            Some(up.node_group_for_node.rps),
            false,
            "requests/s",
        )
        .with("floor", floor)
        .with("floor_ratio", report::ratio(ours_rps, floor))
        .with("ours_errors", ours.node_group_for_node.errors)
        .with("upstream_errors", up.node_group_for_node.errors)
        .goal("ratio", Goal::AtLeast(10.0))
        .goal("floor_ratio", Goal::AtLeast(0.9)),
    );
    metrics.insert(
        "rss_mib".into(),
        Metric::compare(
            Some(ours.rss_after_mib),
            Some(up.rss_after_mib),
            false,
            "MiB",
        )
        .with("ours_warm", ours.rss_warm_mib)
        .with("upstream_warm", up.rss_warm_mib)
        .goal("ratio", Goal::AtMost(0.34)),
    );
    for (name, o, u) in [
        ("nodegroups", &ours.node_groups, &up.node_groups),
        (
            "nodegroupnodes",
            &ours.node_group_nodes,
            &up.node_group_nodes,
        ),
        ("targetsize", &ours.target_size, &up.target_size),
    ] {
        metrics.insert(format!("{name}_p50_ms"), latency_metric(o, u, false));
        metrics.insert(format!("{name}_p99_ms"), latency_metric(o, u, true));
    }
}

fn add_ca_metrics(metrics: &mut BTreeMap<String, Metric>, ca: &super::CaRuns) {
    let loops = |s: &LoopStats| (s.p50_or_bound(), s.p50_is_bound());
    let ours = ca.ours.p50_ms;
    let describe = |m: Metric, s: &LoopStats| {
        m.with("ours_loops", ca.ours.samples_ms.len())
            .with("upstream_loops", s.samples_ms.len())
            .with("ours_bucket_p50_ms", ca.ours.bucket_p50_ms)
            .with("upstream_bucket_p50_ms", s.bucket_p50_ms)
            .with("ours_node_groups_seen", ca.ours.node_groups)
            .with("upstream_node_groups_seen", s.node_groups)
    };
    if let Some(((qps, burst), raised)) = ca.in_tree.last() {
        let (up, bound) = loops(raised);
        let mut metric = describe(Metric::compare(ours, up, bound, "ms"), raised).with(
            "upstream_setting",
            format!("--kube-client-qps={qps} --kube-client-burst={burst}"),
        );
        if let Some(((q0, b0), default)) = ca.in_tree.first().filter(|_| ca.in_tree.len() > 1) {
            let (up0, bound0) = loops(default);
            metric = metric
                .with(
                    "upstream_default_setting",
                    format!("--kube-client-qps={q0} --kube-client-burst={b0}"),
                )
                .with("upstream_default_qps", up0)
                .with("upstream_default_qps_is_bound", bound0)
                .with("ratio_default_qps", report::ratio(ours, up0));
        }
        metrics.insert(
            "ca_loop_p50_ms_vs_intree".into(),
            metric.goal("ratio", Goal::AtMost(0.2)),
        );
    }
    if let Some(example) = &ca.example {
        let (up, bound) = loops(example);
        metrics.insert(
            "ca_loop_p50_ms_vs_example".into(),
            describe(Metric::compare(ours, up, bound, "ms"), example)
                .goal("ratio", Goal::AtMost(0.1)),
        );
    }
}

/// The goals through a network hop, per dataset that ran cluster-autoscaler: at the largest
/// delay, ours remote within half of in-tree's loop at its last setting, and ours co-located
/// within a tenth. Named `ca_loop_<mode>_vs_intree_<groups>x<nodes per group>`.
fn add_hop_goals(metrics: &mut BTreeMap<String, Metric>, runs: &Runs) {
    for run in &runs.datasets {
        let Some(ca) = &run.ca else {
            continue;
        };
        let Some(delay) = ca
            .through_hop
            .iter()
            .map(|h| h.delay_ms)
            .max_by(f64::total_cmp)
        else {
            continue;
        };
        let at = |peer: &str, mode: Option<&str>| {
            ca.through_hop
                .iter()
                .find(|h| h.delay_ms == delay && h.peer == peer && mode.is_none_or(|m| h.mode == m))
        };
        let Some(in_tree) = at("in-tree-clusterapi", None) else {
            continue;
        };
        let (up, up_is_bound) = (in_tree.stats.p50_or_bound(), in_tree.stats.p50_is_bound());
        for (mode, key, goal) in [("remote", "remote", 0.5), ("co-located", "colocated", 0.1)] {
            let Some(ours) = at("nodegroup-operator", Some(mode)) else {
                continue;
            };
            let metric = Metric::compare(ours.stats.p50_ms, up, up_is_bound, "ms")
                .with("dataset", run.spec.label())
                .with("nodes", run.spec.machines())
                .with("groups", run.spec.groups())
                .with("delay_ms_each_way", delay)
                .with("mode", mode)
                .with("upstream_setting", &in_tree.mode)
                .with("ours_loops", ours.stats.samples_ms.len())
                .with("upstream_loops", in_tree.stats.samples_ms.len())
                .goal("ratio", Goal::AtMost(goal));
            metrics.insert(
                format!("ca_loop_{key}_vs_intree_{}", run.spec.label()),
                metric,
            );
        }
    }
}

fn growth_row(run: &DatasetRun) -> GrowthRow {
    GrowthRow {
        dataset: run.spec.label(),
        groups: run.spec.groups(),
        machines: run.spec.machines(),
        ours: GrowthFigures::of(&run.ours),
        upstream: GrowthFigures::of(&run.upstream),
    }
}

fn server_summary(f: &ServerFigures) -> Value {
    json!({
        "nodegroupfornode_rps": f.node_group_for_node.rps,
        "floor_rps": f.floor.as_ref().map(|t| t.rps),
        "groups_seen_by_nodegroups": f.groups_seen,
        "nodegroups_p50_ms": f.node_groups.p50_ms, "nodegroups_p99_ms": f.node_groups.p99_ms,
        "nodegroupnodes_p50_ms": f.node_group_nodes.p50_ms, "nodegroupnodes_p99_ms": f.node_group_nodes.p99_ms,
        "targetsize_p50_ms": f.target_size.p50_ms, "targetsize_p99_ms": f.target_size.p99_ms,
        "rss_warm_mib": f.rss_warm_mib, "rss_after_mib": f.rss_after_mib,
    })
}

/// The single-cluster run to compare the multi-cluster one with: the same number of
/// machines if there is one, else the largest.
fn single_peer(runs: &Runs) -> Option<&DatasetRun> {
    let machines = runs.multicluster.spec.machines();
    runs.datasets
        .iter()
        .find(|d| d.spec.machines() == machines)
        .or_else(|| runs.datasets.iter().max_by_key(|d| d.spec.machines()))
}

fn multicluster_summary(runs: &Runs) -> Value {
    let mc = &runs.multicluster;
    json!({
        "dataset": mc.spec,
        "label": mc.spec.label(),
        "create_seconds": mc.create_seconds,
        "simulated": format!(
            "{} Cluster objects in namespaces c-000.., {} MachineDeployments (+MachineSets) of {} Machines each per cluster, all in one API server (--workload-nodes=same-cluster); the operator runs with --client-identity=uri-san and every load connection presents one Cluster's certificate (GrpcPki::issue_cluster_client), so each read is scoped to that Cluster's {} groups",
            mc.spec.clusters, mc.spec.groups_per_cluster, mc.spec.nodes_per_group, mc.spec.groups_per_cluster
        ),
        "ours": server_summary(&mc.ours),
        "single_cluster": single_peer(runs).map(|d| json!({"dataset": d.spec.label(), "ours": server_summary(&d.ours)})),
    })
}

/// The tables, as printed and pasted into the README.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    let Some(main) = results.runs.datasets.first() else {
        return out;
    };
    let push = |out: &mut String, line: String| {
        out.push_str(&line);
        out.push('\n');
    };
    push(
        &mut out,
        format!(
            "nodegroup-operator vs upstream on {} MachineDeployments x {} Machines/Nodes (+{} MachineSets)",
            main.spec.groups(),
            main.spec.nodes_per_group,
            main.spec.groups()
        ),
    );
    push(&mut out, format!("machine:  {}", results.machine.line()));
    for (key, value) in &results.settings {
        push(&mut out, format!("{key}: {value}"));
    }
    out.push('\n');
    let m = |name: &str| results.metrics.get(name);
    let mut rows = Vec::new();
    let row = |rows: &mut Vec<Vec<String>>, label: &str, metric: Option<&Metric>| {
        if let Some(metric) = metric {
            rows.push(vec![
                label.to_string(),
                num(metric.ours),
                bounded(metric.upstream, metric.upstream_is_bound),
                ratio_cell(metric),
                verdict(metric),
            ]);
        }
    };
    row(
        &mut rows,
        "NodeGroupForNode throughput (req/s)",
        m("nodegroupfornode_rps_c16"),
    );
    if let Some(metric) = m("nodegroupfornode_rps_c16") {
        let floor = metric.extra.get("floor").and_then(Value::as_f64);
        let floor_ratio = metric.extra.get("floor_ratio").and_then(Value::as_f64);
        rows.push(vec![
            "  floor: empty GPULabel on ours (req/s)".into(),
            num(floor),
            String::new(),
            format!("{} of floor", num(floor_ratio)),
            String::new(),
        ]);
    }
    row(&mut rows, "RSS after load (MiB)", m("rss_mib"));
    if let Some(metric) = m("rss_mib") {
        let get = |k: &str| metric.extra.get(k).and_then(Value::as_f64);
        rows.push(vec![
            "  RSS after warm-up (MiB)".into(),
            num(get("ours_warm")),
            num(get("upstream_warm")),
            num(report::ratio(get("ours_warm"), get("upstream_warm"))),
            String::new(),
        ]);
    }
    for (label, name) in [
        ("NodeGroups p50 (ms)", "nodegroups_p50_ms"),
        ("NodeGroups p99 (ms)", "nodegroups_p99_ms"),
        ("NodeGroupNodes p50 (ms)", "nodegroupnodes_p50_ms"),
        ("NodeGroupNodes p99 (ms)", "nodegroupnodes_p99_ms"),
        ("NodeGroupTargetSize p50 (ms)", "targetsize_p50_ms"),
        ("NodeGroupTargetSize p99 (ms)", "targetsize_p99_ms"),
    ] {
        row(&mut rows, label, m(name));
    }
    if let Some(metric) = m("ca_loop_p50_ms_vs_intree") {
        let setting = metric
            .extra
            .get("upstream_setting")
            .and_then(Value::as_str)
            .unwrap_or_default();
        row(
            &mut rows,
            &format!("CA main loop p50 (ms) vs in-tree, {setting}"),
            Some(metric),
        );
        let get = |k: &str| metric.extra.get(k);
        if let Some(default) = get("upstream_default_setting").and_then(Value::as_str) {
            let up = get("upstream_default_qps").and_then(Value::as_f64);
            let is_bound = get("upstream_default_qps_is_bound")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let r = get("ratio_default_qps").and_then(Value::as_f64);
            rows.push(vec![
                format!("  vs in-tree at CA's default, {default}"),
                num(metric.ours),
                bounded(up, is_bound),
                if is_bound {
                    format!("< {}", num(r))
                } else {
                    num(r)
                },
                String::new(),
            ]);
        }
    }
    row(
        &mut rows,
        "CA main loop p50 (ms) vs CA + example server",
        m("ca_loop_p50_ms_vs_example"),
    );
    let mut hop_goals: Vec<(&String, &Metric)> = results
        .metrics
        .iter()
        .filter(|(name, _)| name.starts_with("ca_loop_") && name.contains("_vs_intree_"))
        .collect();
    // By dataset size, remote before co-located.
    hop_goals.sort_by_key(|(name, m)| {
        let nodes = m.extra.get("nodes").and_then(Value::as_u64).unwrap_or(0);
        (nodes, !name.starts_with("ca_loop_remote"))
    });
    for (name, metric) in hop_goals {
        let get = |k: &str| metric.extra.get(k);
        let label = format!(
            "CA main loop p50 (ms), {} ({} nodes), {} ms each way: ours {} vs in-tree {}",
            get("dataset").and_then(Value::as_str).unwrap_or_default(),
            num(get("nodes").and_then(Value::as_f64)),
            num(get("delay_ms_each_way").and_then(Value::as_f64)),
            get("mode").and_then(Value::as_str).unwrap_or(name),
            get("upstream_setting")
                .and_then(Value::as_str)
                .unwrap_or_default(),
        );
        row(&mut rows, &label, Some(metric));
    }
    row(
        &mut rows,
        "propagation, min/max change -> NodeGroups p99 (ms)",
        m("propagation_p99_ms"),
    );
    if let Some(metric) = m("propagation_p99_ms") {
        rows.push(vec![
            "  p50 (ms)".into(),
            num(metric.extra.get("p50_ms").and_then(Value::as_f64)),
            String::new(),
            String::new(),
            String::new(),
        ]);
    }
    if let Some(metric) = m("index_single_change_p50_ms") {
        let get = |k: &str| metric.extra.get(k).and_then(Value::as_f64);
        row(
            &mut rows,
            &format!(
                "one Machine changed at {} Machines: operator's watch event -> served p50 (ms)",
                num(get("machines"))
            ),
            Some(metric),
        );
        for (label, key) in [
            ("  p99 (ms)", "p99_ms"),
            ("  end to end from the patch, p50 (ms)", "end_to_end_p50_ms"),
            ("  end to end from the patch, p99 (ms)", "end_to_end_p99_ms"),
            (
                "  API server write + watch delivery, p50 (ms)",
                "apiserver_watch_p50_ms",
            ),
            (
                "  the bench's own watch event -> served, p50 (ms)",
                "second_watcher_to_served_p50_ms",
            ),
            (
                "  operator's metric: index update, mean (ms)",
                "operator_index_update_mean_ms",
            ),
            (
                "  operator's metric: event -> index updated, mean (ms)",
                "operator_event_to_index_updated_mean_ms",
            ),
        ] {
            if get(key).is_some() {
                rows.push(vec![
                    label.into(),
                    num(get(key)),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
    }
    out.push_str(&table(
        &["metric", "ours", "upstream", "ratio", "goal"],
        &rows,
    ));
    out.push_str("(upstream: the example server; for CA loops the CA run named. '>' marks a lower bound: the peer had not answered by then.)\n\n");

    out.push_str(&growth_table(&results.growth));
    out.push('\n');

    let mc = &results.multicluster;
    out.push_str(&format!(
        "scale across clusters (ours only): {}\n",
        mc["simulated"].as_str().unwrap_or_default()
    ));
    let single = &mc["single_cluster"];
    let single_label = single["dataset"].as_str().unwrap_or("-").to_string();
    let mc_label = mc["label"].as_str().unwrap_or("-").to_string();
    let cell = |v: &Value, key: &str| num(v[key].as_f64());
    let rows: Vec<Vec<String>> = [
        ("NodeGroupForNode req/s", "nodegroupfornode_rps"),
        ("floor: GPULabel req/s", "floor_rps"),
        (
            "groups a NodeGroups call returns",
            "groups_seen_by_nodegroups",
        ),
        ("NodeGroups p50 ms", "nodegroups_p50_ms"),
        ("NodeGroups p99 ms", "nodegroups_p99_ms"),
        ("NodeGroupNodes p50 ms", "nodegroupnodes_p50_ms"),
        ("NodeGroupNodes p99 ms", "nodegroupnodes_p99_ms"),
        ("NodeGroupTargetSize p50 ms", "targetsize_p50_ms"),
        ("NodeGroupTargetSize p99 ms", "targetsize_p99_ms"),
        ("RSS after warm-up MiB", "rss_warm_mib"),
        ("RSS after load MiB", "rss_after_mib"),
    ]
    .iter()
    .map(|(label, key)| {
        vec![
            label.to_string(),
            cell(&single["ours"], key),
            cell(&mc["ours"], key),
            String::new(),
        ]
    })
    .collect();
    out.push_str(&table(
        &[
            "ours",
            &format!("1 cluster, {single_label}"),
            &format!("{mc_label}, scoped"),
            "",
        ],
        &rows,
    ));
    out.push_str(&render_ca_loop(&results.ca_loop));
    out.push_str(&format!("\nrun took {:.0}s\n", results.duration_s));
    out
}

/// The loop table (peer x setting x dataset) and the RPCs per loop CA made to ours, beside
/// what CA's source predicts.
fn render_ca_loop(entries: &[CaLoopEntry]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.peer.clone(),
                e.mode.clone(),
                format!("{} x {}", e.groups, e.nodes / e.groups.max(1)),
                num(Some(e.delay_ms_each_way)),
                // No loop measured: the figure is how long the first one ran at least.
                bounded(e.p50_ms, e.loops == 0),
                num(e.p99_ms),
                e.loops.to_string(),
            ]
        })
        .collect();
    let mut out = String::from("\ncluster-autoscaler main loop\n");
    out.push_str(&table(
        &[
            "peer",
            "setting",
            "groups x nodes",
            "delay ms each way",
            "p50 ms",
            "p99 ms",
            "loops",
        ],
        &rows,
    ));
    for e in entries.iter().filter(|e| !e.rpcs_per_loop.is_empty()) {
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
            "RPCs per loop to ours at {} nodes, {} groups: {} ({by_method}){predicted}\n",
            e.nodes,
            e.groups,
            num(Some(total))
        ));
        let server: f64 = e.server_ms_per_loop.values().sum();
        if server > 0.0 {
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
                num(e.p50_ms),
            ));
        }
    }
    out
}

/// Rows: each read metric for ours and upstream; columns: the datasets, smallest first, each
/// figure with its factor over the smallest dataset's.
fn growth_table(growth: &[GrowthRow]) -> String {
    let mut out = String::from(
        "growth: read metrics by dataset size (x = factor over the smallest dataset; '>' a lower bound)\n",
    );
    let Some(first) = growth.first() else {
        return out;
    };
    let mut rows = Vec::new();
    for (label, key) in [
        ("NodeGroupForNode req/s", "nodegroupfornode_rps"),
        ("NodeGroups p50 ms", "nodegroups_p50_ms"),
        ("NodeGroupNodes p50 ms", "nodegroupnodes_p50_ms"),
        ("NodeGroupTargetSize p50 ms", "targetsize_p50_ms"),
        ("RSS after load MiB", "rss_mib"),
    ] {
        for (server, pick) in [
            (
                "ours",
                (|r: &GrowthRow| &r.ours) as fn(&GrowthRow) -> &GrowthFigures,
            ),
            ("upstream", |r: &GrowthRow| &r.upstream),
        ] {
            let (base, _) = pick(first).get(key);
            let mut row = vec![
                if server == "ours" {
                    label.to_string()
                } else {
                    String::new()
                },
                server.to_string(),
            ];
            for r in growth {
                let (value, is_bound) = pick(r).get(key);
                let factor = match (value, base) {
                    (Some(v), Some(b)) if b > 0.0 && !std::ptr::eq(r, first) => {
                        format!(" (x{})", num(Some(v / b)))
                    }
                    _ => String::new(),
                };
                row.push(format!("{}{factor}", bounded(value, is_bound)));
            }
            row.push(String::new());
            rows.push(row);
        }
    }
    let headers: Vec<String> = growth
        .iter()
        .map(|r| format!("{} ({} machines)", r.dataset, num(Some(r.machines as f64))))
        .collect();
    let mut header = vec!["metric", "server"];
    header.extend(headers.iter().map(String::as_str));
    header.push("");
    out.push_str(&table(&header, &rows));
    out
}
