//! `ngo-sandbox scale --smoke`: the management topology's scale measurement end to end on small
//! numbers (10 workload clusters behind stand-in API servers, 10 relay streams): the operator
//! syncs every cluster through its real client, Node changes reach relay streams, the stream
//! steps are read, and the results name every figure and goal. No figure is judged.

use std::process::{Command, Stdio};

use serde_json::Value;

#[test]
fn scale_smoke_measures_clusters_streams_and_judges_no_goal_below_its_scale() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.json");
    let run = Command::new(env!("CARGO_BIN_EXE_ngo-sandbox"))
        .args(["scale", "--smoke", "--out"])
        .arg(&out)
        .stdin(Stdio::null())
        .output()
        .expect("ngo-sandbox scale runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}");
    assert!(
        run.status.success(),
        "scale --smoke failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("results written"))
            .expect("results are JSON");

    let clusters = results["clusters"].as_array().expect("cluster runs");
    assert_eq!(clusters.len(), 1, "{clusters:?}");
    let run = &clusters[0];
    assert_eq!(run["clusters"], 10);
    assert_eq!(run["nodes_per_cluster"], 10);
    for figure in ["sync_seconds", "rss_mib", "peak_rss_mib", "idle_cpu_cores"] {
        assert!(
            run[figure].as_f64().is_some_and(|v| v >= 0.0),
            "{figure} in {run}"
        );
    }
    assert!(run["rss_mib"].as_f64().is_some_and(|v| v > 0.0), "{run}");
    // The operator probes and watches every stand-in.
    assert!(
        run["standin_requests_per_s"]
            .as_f64()
            .is_some_and(|v| v > 0.0),
        "{run}"
    );
    assert_eq!(run["propagation"]["samples"], 10, "{run}");
    assert!(
        run["propagation"]["p99_ms"]
            .as_f64()
            .is_some_and(|v| v > 0.0),
        "{run}"
    );

    let streams = &results["streams"];
    assert_eq!(streams["clusters"], 10, "{streams}");
    let steps = streams["steps"].as_array().expect("stream steps");
    let counts: Vec<u64> = steps.iter().filter_map(|s| s["streams"].as_u64()).collect();
    assert_eq!(counts, [1, 10], "{steps:?}");
    for step in steps {
        // The operator counts the streams it serves, and each gets its keepalives.
        assert_eq!(
            step["streams_gauge"].as_f64(),
            step["streams"].as_f64(),
            "{step}"
        );
        assert!(
            step["update_bytes_per_stream_per_s"]
                .as_f64()
                .is_some_and(|v| v > 0.0),
            "{step}"
        );
        assert!(step["added_kib_per_stream"].is_number(), "{step}");
    }
    assert_eq!(streams["propagation"]["samples"], 10, "{streams}");

    // Every goal is printed, none judged below its scale.
    let goals = results["goals"].as_array().expect("goals");
    assert_eq!(goals.len(), 4, "{goals:?}");
    assert!(goals.iter().all(|g| g["met"].is_null()), "{goals:?}");
    assert!(stdout.contains("[not judged]"), "{stdout}");
    assert!(results["machine"]["cpus"].as_u64().is_some_and(|n| n >= 1));
}
