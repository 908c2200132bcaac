//! `ngo-sandbox bench --smoke`: the side-by-side benchmark's whole code path (API servers,
//! datasets with Pods, the operator, the relay, the upstream example server, cluster-autoscaler
//! every way, the hop calibration, the load client, the change series, the report) on tiny
//! datasets, one round. No timing is asserted: only that the run completes and its results
//! name every metric.

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

/// Runs `ngo-sandbox bench` with `args`, which must succeed; returns the results it wrote
/// and what it printed.
fn bench(args: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.json");
    let run = Command::new(env!("CARGO_BIN_EXE_ngo-sandbox"))
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("ngo-sandbox bench runs");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    eprintln!("{stdout}");
    assert!(
        run.status.success(),
        "bench {args:?} failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let text = std::fs::read_to_string(&out).expect("results written");
    (
        serde_json::from_str(&text).expect("results are JSON"),
        stdout,
    )
}

#[test]
fn bench_smoke_writes_every_metric_with_ratios_and_goals() {
    let (results, stdout) = bench(&["--smoke"]);

    // cluster-autoscaler's loop with every peer: a median, or the lower bound of a loop that
    // did not end in the window.
    let entries = results["ca_loop"].as_array().expect("ca_loop list");
    for peer in ["nodegroup-operator", "example-server", "in-tree-clusterapi"] {
        assert!(
            entries.iter().any(
                |e| e["peer"] == peer && (e["p50_ms"].is_number() || e["bound_ms"].is_number())
            ),
            "{peer} in {entries:?}"
        );
    }
    // Every compared setting without a hop and through it, at the same client limits: ours
    // remote and co-located, the relay, in-tree.
    for mode in ["remote", "co-located", "relay", "in-tree"] {
        for delay in [0.0, 0.25] {
            let entry = entries
                .iter()
                .find(|e| {
                    e["mode"] == mode
                        && e["delay_ms_each_way"] == delay
                        && e["reference"] == false
                        && e["workload"] == "filled"
                })
                .unwrap_or_else(|| panic!("{mode} at {delay} ms in {entries:?}"));
            assert!(entry["p50_ms"].is_number(), "{entry}");
            assert!(
                entry["min_ms"].is_number() && entry["max_ms"].is_number(),
                "{entry}"
            );
            // One loop: no p99.
            assert!(entry["p99_ms"].is_null(), "{entry}");
            assert_eq!(entry["qps"], serde_json::json!([1000.0, 2000]), "{entry}");
            // The light Nodes of the filled dataset are scale-down candidates every provider
            // finds removable.
            assert!(entry["unneeded_nodes"].as_f64() > Some(0.0), "{entry}");
        }
    }
    // The references: CA through the example server, ours remote and in-tree at CA's default.
    for (peer, qps) in [
        ("example-server", 1000.0),
        ("nodegroup-operator", 5.0),
        ("in-tree-clusterapi", 5.0),
    ] {
        assert!(
            entries
                .iter()
                .any(|e| e["peer"] == peer && e["reference"] == true && e["qps"][0] == qps),
            "reference {peer} at {qps} in {entries:?}"
        );
    }
    // What the relay cost, and the hop's own cost.
    let relay = entries
        .iter()
        .find(|e| e["mode"] == "relay")
        .expect("relay");
    assert!(relay["relay_rss_max_mib"].as_f64() > Some(0.0), "{relay}");
    assert!(
        relay["relay_update_bytes_per_run"].as_f64() > Some(0.0),
        "{relay}"
    );
    assert!(
        relay["rpcs_per_loop"]["NodeGroupForNode"].as_f64() > Some(0.0),
        "{relay}"
    );
    let hop = results["hop_calibration"]
        .as_array()
        .expect("hop calibration");
    assert!(
        hop.iter()
            .any(|h| h["delay_ms"] == 0.25 && h["grpc_hop_mean_us"].as_f64() > Some(500.0)),
        "{hop:?}"
    );
    // The goals through the hop, each a ratio with its verdict, and the relay's memory.
    for name in [
        "ca_loop_remote_vs_intree_4x3",
        "ca_loop_colocated_vs_intree_4x3",
        "ca_loop_relay_vs_intree_4x3",
        "ca_loop_relay_vs_colocated_4x3",
    ] {
        let metric = &results["metrics"][name];
        assert!(metric["ratio"].is_number(), "{name}.ratio in {metric}");
        assert!(metric["pass"].is_boolean(), "{name}.pass in {metric}");
        assert_eq!(metric["delay_ms_each_way"], 0.25, "{name}");
    }
    assert!(
        results["metrics"]["relay_rss_mib_4x3"]["pass"].is_boolean(),
        "{}",
        results["metrics"]["relay_rss_mib_4x3"]
    );
    assert!(
        results["relay"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["vs_in_tree"].is_number())),
        "{}",
        results["relay"]
    );
    for line in [
        "ms each way: relay vs in-tree qps 1000/2000",
        "ms each way: relay vs ours co-located",
        "the hop itself at 0.250 ms each way",
        "relay / co-located",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    let ours = entries
        .iter()
        .find(|e| e["peer"] == "nodegroup-operator" && e["mode"] == "remote")
        .expect("ours");
    assert!(
        ours["rpcs_per_loop"]["NodeGroupForNode"].as_f64() > Some(0.0),
        "{ours}"
    );
    assert!(
        ours["server_ms_per_loop"]["NodeGroupForNode"].as_f64() > Some(0.0),
        "{ours}"
    );
    assert!(
        stdout.contains("the operator's own time answering them"),
        "{stdout}"
    );
    assert!(stdout.contains("RPCs per loop to ours"), "{stdout}");
    assert_eq!(results["dataset"]["workload"], "filled");
    assert!(results["dataset"]["pods"].as_u64() > Some(0));

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

/// `--ours-only` on a tiny dataset with the smoke load: our server's figures, then the same
/// reads through a relay it feeds, with the relay's memory.
#[test]
fn ours_only_measures_our_server_and_the_reads_through_a_relay() {
    let (results, _) = bench(&["--smoke", "--ours-only", "3x2"]);
    for server in ["ours", "relay"] {
        let figures = &results[server];
        assert_eq!(figures["groups_seen"], 3, "{server}: {figures}");
        assert!(
            figures["node_group_for_node"]["ok"].as_u64() > Some(0)
                && figures["node_group_for_node"]["errors"] == 0,
            "{server}: {figures}"
        );
        assert!(
            figures["rss_after_mib"].as_f64() > Some(1.0),
            "{server}: {figures}"
        );
    }
    assert_eq!(results["relay"]["name"], "relay");
}
