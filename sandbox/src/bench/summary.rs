//! From what was measured ([`Runs`]) to `target/bench/results.json` and the printed tables:
//! the named metrics with ratios and goals, the growth table, the multi-cluster table, and
//! cluster-autoscaler's loop ([`super::ca_summary`]).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use super::ca_summary::{self, CaLoopEntry, RelayRatio};
use super::calibrate::HopCalibration;
use super::dataset::Workload;
use super::load::Latency;
use super::report::{self, Goal, MachineInfo, Metric, bounded, num, ratio_cell, table, verdict};
use super::server::ServerFigures;
use super::{BenchOptions, DatasetRun, Runs};
use ngo_testbed::autoscaler::CaRelease;

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
    /// cluster-autoscaler's main loop, one entry per setting on every dataset that ran it.
    pub ca_loop: Vec<CaLoopEntry>,
    /// The relay against in-tree and co-located at every delay.
    pub relay: Vec<RelayRatio>,
    /// What the network hop itself adds per round trip.
    pub hop_calibration: Vec<HopCalibration>,
    /// Seconds the whole run took.
    pub duration_s: f64,
    /// The options it ran with.
    pub options: BenchOptions,
    /// Everything measured, unsummarised.
    pub runs: Runs,
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
            "workload": m.spec.workload,
            "workload_described": m.spec.workload.describe(),
            "pods": m.spec.pods(),
        })
    });
    let ca_loop = ca_summary::entries(&runs);
    ca_summary::add_metrics(&mut metrics, &runs, &ca_loop);
    let relay = ca_summary::relay_ratios(&ca_loop);
    let hop_calibration = ca_summary::hop_calibration(&runs);
    let multicluster = multicluster_summary(&runs);
    Results {
        machine,
        settings: settings(&options),
        dataset,
        metrics,
        growth,
        multicluster,
        ca_loop,
        relay,
        hop_calibration,
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
    let qps = |(q, b): (f64, u32)| format!("--kube-client-qps={q} --kube-client-burst={b}");
    let references = options
        .reference_qps
        .iter()
        .map(|&q| qps(q))
        .collect::<Vec<_>>()
        .join(", ");
    let ca = &options.ca;
    let older = ca
        .older_release
        .as_ref()
        .map(|(release, delay)| {
            format!("; CA {release} too, for ours remote and in-tree at {delay} ms each way")
        })
        .unwrap_or_default();
    let pinned = CaRelease::pinned().map_or_else(|e| e.to_string(), |r| r.to_string());
    let patched = ca
        .patched_at_ms
        .map(|delay| {
            format!(
                "; CA {pinned} built with each patch of tests/upstream/patches/cluster-autoscaler-{pinned}/ alone (docs/upstream.md; never the product), for ours remote at {delay} ms each way"
            )
        })
        .unwrap_or_default();
    let largest = options
        .ca_at_largest
        .as_ref()
        .map(|l| {
            format!(
                "; on the largest dataset at {:?} ms each way, {} rounds of {} loops after {} skipped",
                l.delays_ms, l.rounds, l.per_run.loops, l.per_run.skip
            )
        })
        .unwrap_or_default();
    BTreeMap::from([
        (
            "ours".into(),
            format!(
                "nodegroup-operator, {profile} {}; default flags, mTLS; --node-group-auto-discovery=clusterapi:namespace=bench; the relay: the same binary's `relay` mode, --max-staleness=10s, started for each of its runs",
                binary.display()
            ),
        ),
        ("upstream".into(), super::example_server::SETTINGS.into()),
        (
            "cluster_autoscaler".into(),
            format!(
                "cluster-autoscaler {pinned}{older}{patched}, --scan-interval=1s --v=2 --scale-down-unneeded-time=24h --max-bulk-soft-taint-count=0 (scale-down candidates checked every loop, none removed or tainted); every compared run at {} whatever the provider, grpc_timeout 180s; at {:?} ms each way (0: no hop), in {} rounds (each setting once per round, in an order shuffled per round from seed {}) of {} loops after {} skipped per run{largest}; references once after the rounds (CA through the example server at the compared limits; ours remote and in-tree at {references}), {} loops after {} skipped",
                qps(options.ca_qps),
                ca.delays_ms,
                ca.rounds,
                options.seed,
                ca.per_run.loops,
                ca.per_run.skip,
                options.reference_run.loops,
                options.reference_run.skip,
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
            "one etcd + kube-apiserver per dataset, Cluster API CRDs, static Ready Nodes (the not-ready taint TaintNodesByCondition gives a new Node removed, as the node lifecycle controller would), no controllers; the datasets where cluster-autoscaler runs are filled (they replace the all-at-minimum datasets of the runs before; the others stay at their minimum)".into(),
        ),
        (
            "workload".into(),
            format!(
                "filled: {}; at minimum: {}",
                Workload::Filled.describe(),
                Workload::AtMinimum.describe()
            ),
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
            "nodegroup-operator vs upstream on {} MachineDeployments x {} Machines/Nodes (+{} MachineSets), {}, {} Pods",
            main.spec.groups(),
            main.spec.nodes_per_group,
            main.spec.groups(),
            main.spec.workload.label(),
            main.spec.pods()
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
    rows.extend(ca_summary::goal_rows(&results.metrics));
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
    out.push_str(&ca_summary::render(
        &results.ca_loop,
        &results.hop_calibration,
        &results.relay,
    ));
    out.push_str(&format!("\nrun took {:.0}s\n", results.duration_s));
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
