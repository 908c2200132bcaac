//! `ngo-sandbox bench --smoke`: the side-by-side benchmark's whole code path (API servers,
//! datasets, the operator, the upstream example server, cluster-autoscaler three ways, the
//! load client, the change series, the report) on tiny datasets. No timing is asserted: only
//! that the run completes and its results name every metric.

use std::process::{Command, Stdio};

use serde_json::Value;

/// Metrics `target/bench/results.json` must always have, with `ours` and `unit`.
const METRICS: &[&str] = &[
    "nodegroupfornode_rps_c16",
    "rss_mib",
    "nodegroups_p50_ms",
    "nodegroups_p99_ms",
    "nodegroupnodes_p50_ms",
    "nodegroupnodes_p99_ms",
    "targetsize_p50_ms",
    "targetsize_p99_ms",
    "ca_loop_p50_ms_vs_intree",
    "ca_loop_p50_ms_vs_example",
    "propagation_p99_ms",
    "index_single_change_p50_ms",
];

#[test]
fn bench_smoke_writes_every_metric_with_ratios_and_goals() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.json");
    let run = Command::new(env!("CARGO_BIN_EXE_ngo-sandbox"))
        .args(["bench", "--smoke", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("ngo-sandbox bench runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}");
    assert!(
        run.status.success(),
        "bench --smoke failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = std::fs::read_to_string(&out).expect("results written");
    let results: Value = serde_json::from_str(&text).expect("results are JSON");

    // cluster-autoscaler's loop with every peer, and the RPCs it made to ours per loop.
    let entries = results["ca_loop"].as_array().expect("ca_loop list");
    for peer in ["nodegroup-operator", "example-server", "in-tree-clusterapi"] {
        assert!(
            entries
                .iter()
                .any(|e| e["peer"] == peer && e["p50_ms"].is_number()),
            "{peer} in {entries:?}"
        );
    }
    // And through a network hop: ours remote and co-located, in-tree at its last setting.
    for (peer, mode) in [
        ("nodegroup-operator", "remote"),
        ("nodegroup-operator", "co-located"),
        ("in-tree-clusterapi", "qps 50/100"),
    ] {
        assert!(
            entries.iter().any(|e| e["peer"] == peer
                && e["mode"] == mode
                && e["delay_ms_each_way"] == 0.25
                && e["p50_ms"].is_number()),
            "{peer} {mode} at 0.25 ms in {entries:?}"
        );
    }
    // The largest dataset runs the compared settings too: ours remote and co-located, in-tree
    // at its last setting, with and without the hop.
    for (peer, mode, delay) in [
        ("nodegroup-operator", "remote", 0.0),
        ("nodegroup-operator", "remote", 0.25),
        ("nodegroup-operator", "co-located", 0.25),
        ("in-tree-clusterapi", "qps 50/100", 0.0),
        ("in-tree-clusterapi", "qps 50/100", 0.25),
    ] {
        assert!(
            entries.iter().any(|e| e["groups"] == 6
                && e["peer"] == peer
                && e["mode"] == mode
                && e["delay_ms_each_way"] == delay
                && e["p50_ms"].is_number()),
            "6x2: {peer} {mode} at {delay} ms in {entries:?}"
        );
    }
    // The goals through the hop, per dataset, each a ratio to in-tree with its verdict.
    for name in [
        "ca_loop_remote_vs_intree_4x3",
        "ca_loop_colocated_vs_intree_4x3",
        "ca_loop_remote_vs_intree_6x2",
        "ca_loop_colocated_vs_intree_6x2",
    ] {
        let metric = &results["metrics"][name];
        assert!(metric["ratio"].is_number(), "{name}.ratio in {metric}");
        assert!(metric["pass"].is_boolean(), "{name}.pass in {metric}");
        assert_eq!(metric["delay_ms_each_way"], 0.25, "{name}");
    }
    assert!(
        stdout.contains("ms each way: ours co-located vs in-tree qps 50/100"),
        "{stdout}"
    );
    let ours = entries
        .iter()
        .find(|e| e["peer"] == "nodegroup-operator")
        .expect("ours");
    assert!(
        ours["rpcs_per_loop"]["NodeGroupForNode"].as_f64() > Some(0.0),
        "{ours}"
    );
    assert!(ours["rpcs_per_loop_predicted"].is_array(), "{ours}");
    assert!(
        ours["server_ms_per_loop"]["NodeGroupForNode"].as_f64() > Some(0.0),
        "{ours}"
    );
    assert!(
        stdout.contains("the operator's own time answering them"),
        "{stdout}"
    );
    assert!(stdout.contains("RPCs per loop to ours"), "{stdout}");

    for name in METRICS {
        let metric = &results["metrics"][name];
        assert!(metric["ours"].is_number(), "{name}.ours in {metric}");
        assert!(metric["unit"].is_string(), "{name}.unit in {metric}");
    }
    let for_node = &results["metrics"]["nodegroupfornode_rps_c16"];
    for field in ["upstream", "ratio", "floor", "floor_ratio", "pass"] {
        assert!(
            !for_node[field].is_null(),
            "nodegroupfornode_rps_c16.{field}"
        );
    }
    for name in [
        "rss_mib",
        "ca_loop_p50_ms_vs_intree",
        "ca_loop_p50_ms_vs_example",
    ] {
        let metric = &results["metrics"][name];
        assert!(
            metric["upstream"].is_number(),
            "{name}.upstream in {metric}"
        );
        assert!(metric["ratio"].is_number(), "{name}.ratio in {metric}");
        assert!(metric["pass"].is_boolean(), "{name}.pass in {metric}");
    }
    assert!(results["machine"]["nproc"].as_u64() > Some(0));
    assert!(results["dataset"]["machines"].as_u64() > Some(0));
    assert!(
        results["growth"]
            .as_array()
            .is_some_and(|rows| rows.len() >= 2),
        "a growth row per single-cluster dataset"
    );
    assert!(results["multicluster"]["ours"]["nodegroupfornode_rps"].is_number());
    assert!(results["settings"]["upstream"].is_string());
    for heading in ["ratio", "goal", "growth:", "scale across clusters"] {
        assert!(
            stdout.contains(heading),
            "the printed report has {heading:?}"
        );
    }
}
