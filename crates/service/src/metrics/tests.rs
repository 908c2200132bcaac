//! The service layer's metric families, as scraped.

use std::collections::HashMap;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::groups::ClusterLabels;
use super::*;
use ngo_index::index::Snapshot;
use ngo_index::index::{ConfigWarning, Exclusion, ExclusionReason, IndexInputs, build_snapshot};

#[test]
fn config_warnings_are_counted_per_resource_and_field_and_cleared() {
    let inputs = IndexInputs::default();
    let mut snapshot = build_snapshot(&inputs);
    let warning = |field: &str| ConfigWarning {
        field: field.into(),
        message: "m".into(),
    };
    snapshot.exclusions.push(Exclusion {
        kind: ngo_index::capi::ScalableKind::MachineDeployment,
        namespace: "ns".into(),
        name: "md".into(),
        uid: String::new(),
        reason: ExclusionReason::ReplicasUnset,
        policy: None,
        warnings: vec![warning("a/labels"), warning("a/labels"), warning("a/cpu")],
    });
    let metrics = ServiceMetrics::new();
    metrics.observe_snapshot(&snapshot, Duration::ZERO);
    let text = metrics.encode();
    assert!(
        text.contains(
            "nodegroup_config_warnings{node_group=\"MachineDeployment/ns/md\",field=\"a/labels\"} 2"
        ),
        "{text}"
    );
    metrics.observe_snapshot(&build_snapshot(&inputs), Duration::ZERO);
    assert!(!metrics.encode().contains("a/labels"));
}

#[test]
fn an_rpc_dropped_before_answering_is_counted_as_cancelled() {
    let metrics = ServiceMetrics::new();
    {
        let _pending = metrics.unanswered("NodeGroupDeleteNodes");
    }
    {
        let mut answered = metrics.unanswered("NodeGroupIncreaseSize");
        answered.answered();
    }
    let text = metrics.encode();
    assert!(
        text.contains("method=\"NodeGroupDeleteNodes\",code=\"Canceled\""),
        "{text}"
    );
    assert!(!text.contains("NodeGroupIncreaseSize"), "{text}");
}

fn group(id: &str, min: i32, max: i32, target: i32) -> ngo_index::index::NodeGroup {
    ngo_index::index::NodeGroup {
        id: id.into(),
        kind: ngo_index::capi::ScalableKind::MachineDeployment,
        namespace: "ns".into(),
        name: id.rsplit('/').next().unwrap_or(id).into(),
        cluster: Default::default(),
        uid: String::new(),
        min,
        max,
        min_source: ngo_index::index::Source::Annotation,
        max_source: ngo_index::index::Source::Annotation,
        target,
        instances: Vec::new(),
        registered: 1,
        ready: 1,
        options: Default::default(),
        template: None,
        provider_id_list: None,
        policy: None,
        pricing: None,
        node_capacity: Default::default(),
        warnings: Vec::new(),
        scale_down_claim: None,
        rolling_out: None,
        applied_decrements: Vec::new(),
    }
}

fn snapshot_of(groups: impl IntoIterator<Item = ngo_index::index::NodeGroup>) -> Snapshot {
    let mut snapshot = build_snapshot(&IndexInputs::default());
    for g in groups {
        snapshot.groups.insert(g.id.clone(), std::sync::Arc::new(g));
    }
    snapshot
}

#[test]
fn rpc_codes_read_as_grpc_go_writes_them() {
    use tonic::Code;
    let metrics = ServiceMetrics::new();
    let expected = [
        (Code::Ok, "OK"),
        (Code::Cancelled, "Canceled"),
        (Code::Unknown, "Unknown"),
        (Code::InvalidArgument, "InvalidArgument"),
        (Code::DeadlineExceeded, "DeadlineExceeded"),
        (Code::NotFound, "NotFound"),
        (Code::AlreadyExists, "AlreadyExists"),
        (Code::PermissionDenied, "PermissionDenied"),
        (Code::ResourceExhausted, "ResourceExhausted"),
        (Code::FailedPrecondition, "FailedPrecondition"),
        (Code::Aborted, "Aborted"),
        (Code::OutOfRange, "OutOfRange"),
        (Code::Unimplemented, "Unimplemented"),
        (Code::Internal, "Internal"),
        (Code::Unavailable, "Unavailable"),
        (Code::DataLoss, "DataLoss"),
        (Code::Unauthenticated, "Unauthenticated"),
    ];
    for (code, _) in expected {
        let method: &'static str = format!("M{}", code as i32).leak();
        metrics.observe_rpc(method, code, Duration::ZERO);
    }
    let text = metrics.encode();
    for (code, name) in expected {
        let series = format!(
            "nodegroup_grpc_request_duration_seconds_count{{method=\"M{}\",code=\"{name}\"}} 1",
            code as i32
        );
        assert!(text.lines().any(|l| l == series), "{series} in\n{text}");
    }
}

#[test]
fn bounds_and_target_are_families_of_their_own() {
    let metrics = ServiceMetrics::new();
    metrics.observe_snapshot(
        &snapshot_of([group("MachineDeployment/ns/a", 1, 5, 3)]),
        Duration::ZERO,
    );
    let text = metrics.encode();
    for line in [
        "nodegroup_node_group_min_size{node_group=\"MachineDeployment/ns/a\"} 1",
        "nodegroup_node_group_max_size{node_group=\"MachineDeployment/ns/a\"} 5",
        "nodegroup_node_group_target_size{node_group=\"MachineDeployment/ns/a\"} 3",
        "nodegroup_node_group_registered_nodes{node_group=\"MachineDeployment/ns/a\"} 1",
        "nodegroup_node_group_ready_nodes{node_group=\"MachineDeployment/ns/a\"} 1",
        "nodegroup_node_groups 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("nodegroup_node_group_size"), "{text}");
    assert!(!text.contains("kind=\"node_groups\""), "{text}");
}

#[test]
fn a_scrape_during_a_refresh_sees_every_series_that_stays() {
    let ids: Vec<String> = (0..200)
        .map(|i| format!("MachineDeployment/ns/g{i}"))
        .collect();
    let snapshot = snapshot_of(ids.iter().map(|id| {
        let mut g = group(id, 0, 5, 2);
        g.warnings = vec![ConfigWarning {
            field: "labels".into(),
            message: "m".into(),
        }];
        g
    }));
    let metrics = std::sync::Arc::new(ServiceMetrics::new());
    metrics.observe_snapshot(&snapshot, Duration::ZERO);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let refresher = {
        let (metrics, stop) = (metrics.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                metrics.observe_snapshot(&snapshot, Duration::ZERO);
            }
        })
    };
    let mut short = Vec::new();
    for _ in 0..300 {
        let text = metrics.encode();
        let warnings = text
            .lines()
            .filter(|l| l.starts_with("nodegroup_config_warnings{"))
            .count();
        let targets = text
            .lines()
            .filter(|l| l.contains("node_group=") && l.contains("target"))
            .count();
        if warnings != ids.len() || targets != ids.len() {
            short.push((warnings, targets));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    refresher.join().expect("refresher");
    assert!(
        short.is_empty(),
        "scrapes missed series that existed before and after the refresh: {} of 300, e.g. {:?}",
        short.len(),
        &short[..short.len().min(5)]
    );
}

#[test]
fn a_dropped_rpc_is_deadline_exceeded_once_the_clients_deadline_has_passed() {
    let metrics = ServiceMetrics::new();
    let rpc = metrics
        .unanswered("NodeGroupIncreaseSize")
        .client_deadline(Some(Duration::from_secs(5)));
    assert_eq!(
        rpc.dropped_code(Duration::from_secs(1)),
        tonic::Code::Cancelled,
        "a reset long before the deadline"
    );
    assert_eq!(
        rpc.dropped_code(Duration::from_millis(4800)),
        tonic::Code::DeadlineExceeded,
        "dropped by the server's timer, which started when the request arrived"
    );
    assert_eq!(
        rpc.dropped_code(Duration::from_secs(6)),
        tonic::Code::DeadlineExceeded
    );
    let mut rpc = rpc;
    rpc.answered();
    let unbounded = metrics.unanswered("NodeGroups");
    assert_eq!(
        unbounded.dropped_code(Duration::from_secs(60)),
        tonic::Code::Cancelled,
        "without a deadline only a reset drops an RPC"
    );
}

#[test]
fn a_replace_keeps_series_that_stay_and_removes_only_those_gone() {
    let series = GaugeSeries::<ClusterLabels>::default();
    let labels = |c: &str| ClusterLabels { cluster: c.into() };
    series.replace(HashMap::from([(labels("a"), 1), (labels("b"), 0)]));
    let mut registry = Registry::default();
    registry.register("reachable", "", series.family());
    let text = || {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    };
    assert!(text().contains("reachable{cluster=\"b\"} 0"), "{}", text());
    series.replace(HashMap::from([(labels("b"), 1), (labels("c"), 1)]));
    let after = text();
    assert!(!after.contains("cluster=\"a\""), "{after}");
    assert!(after.contains("reachable{cluster=\"b\"} 1"), "{after}");
    assert!(after.contains("reachable{cluster=\"c\"} 1"), "{after}");
    series.replace(HashMap::new());
    assert!(!text().contains("reachable{"), "{}", text());
}

/// The values the chart's alerts and dashboard match the `code` label against: for each
/// `code` matcher (`=`, `!=`, `=~`, `!~`), its value split at `|`.
fn code_matcher_values(text: &str) -> Vec<String> {
    let mut values = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("code") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "code".len()..];
        if !matches!(before, Some('{' | ',' | ' ')) {
            continue;
        }
        let Some(op) = ["!~", "=~", "!=", "="]
            .iter()
            .find(|op| rest.starts_with(**op))
        else {
            continue;
        };
        let quoted = rest[op.len()..].trim_start_matches('\\');
        let Some(quoted) = quoted.strip_prefix('"') else {
            continue;
        };
        let end = quoted.find('"').unwrap_or(quoted.len());
        let value = quoted[..end].trim_end_matches('\\');
        values.extend(value.split('|').map(String::from));
    }
    values
}

#[test]
fn the_charts_code_matchers_name_codes_the_operator_writes() {
    let written: Vec<&str> = (0..=16)
        .map(|n| grpc_code_name(tonic::Code::from(n)))
        .collect();
    let chart =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/nodegroup-operator");
    let mut checked = 0;
    for file in [
        "templates/prometheusrule.yaml",
        "dashboards/nodegroup-operator.json",
    ] {
        let text = std::fs::read_to_string(chart.join(file)).expect("chart file");
        for value in code_matcher_values(&text) {
            assert!(
                written.contains(&value.as_str()),
                "{file}: code {value:?} is not one the operator writes ({written:?})"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "the alerts and dashboard match on codes ({checked} values)"
    );
    assert_eq!(
        code_matcher_values(r#"x{code!~"OK|NotFound",method="m"} y{code=\"OK\"}"#),
        ["OK", "NotFound", "OK"]
    );
}
