//! Index updates happen for changes the index reads, not for Node heartbeats, and touch only
//! what changed. Its own test binary, its tests one at a time: Nodes are cluster-scoped, so
//! tests running alongside would trigger updates too.

mod support;

use std::time::Duration;

use ngo_service::proto;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(20);
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn builds(metrics: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with("nodegroup_snapshot_build_seconds_count"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn node_heartbeats_do_not_rebuild_the_index_but_relevant_changes_do() {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNs::new("churn").await;
    deployment_with_nodes(&ns, "md", 0, 3, 1).await;
    let (operator, client) = ns.operator().await;
    wait_groups(&client, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = builds(&http_get(operator.admin_address, "/metrics").await.1);
    let nodes = kube::api::Api::<k8s_openapi::api::core::v1::Node>::all(ns.client.clone());
    let node = format!("{}-md-0", ns.name);
    for i in 0..5 {
        let heartbeat = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": format!("heartbeat {i}"), "lastHeartbeatTime": format!("2026-01-01T00:00:0{i}Z")}]}});
        nodes
            .patch_status(
                &node,
                &Default::default(),
                &kube::api::Patch::Strategic(heartbeat),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_heartbeats = builds(&http_get(operator.admin_address, "/metrics").await.1);
    assert_eq!(
        after_heartbeats, before,
        "heartbeat-only node updates must not rebuild the index"
    );
    nodes
        .patch(
            &node,
            &Default::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/region": "r1"}}}),
            ),
        )
        .await
        .unwrap();
    eventually("a rebuild after a relevant change", WAIT, || {
        let address = operator.admin_address;
        async move { (builds(&http_get(address, "/metrics").await.1) > after_heartbeats).then_some(()) }
    })
    .await;
    operator.shutdown().await.unwrap();
}

/// Index updates so far, by pass (`full` or `incremental`).
fn passes(metrics: &str, pass: &str) -> u64 {
    let prefix = format!("nodegroup_index_update_latency_seconds_count{{pass=\"{pass}\"}}");
    metrics
        .lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn one_object_changed_updates_the_index_incrementally_and_a_policy_recomputes_all() {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNs::new("incremental").await;
    deployment_with_nodes(&ns, "md", 0, 3, 2).await;
    let (operator, client) = ns.operator().await;
    wait_groups(&client, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let metrics = http_get(operator.admin_address, "/metrics").await.1;
    let (full, incremental) = (passes(&metrics, "full"), passes(&metrics, "incremental"));
    assert!(full >= 1, "the first snapshot is a full pass:\n{metrics}");

    ns.api(&machine_deployments())
        .patch(
            "md",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {MAX: "7"}}})),
        )
        .await
        .unwrap();
    eventually("max 7 served", WAIT, || {
        let mut c = client.clone();
        async move {
            let groups = c
                .node_groups(proto::NodeGroupsRequest {})
                .await
                .ok()?
                .into_inner()
                .node_groups;
            groups.iter().any(|g| g.max_size == 7).then_some(())
        }
    })
    .await;
    let metrics = http_get(operator.admin_address, "/metrics").await.1;
    assert_eq!(
        passes(&metrics, "full"),
        full,
        "an annotation change must not recompute every group"
    );
    assert!(passes(&metrics, "incremental") > incremental);

    ns.policy("all", json!({"selector": {}, "maxSize": 5}))
        .await
        .unwrap();
    eventually("a full pass after a policy change", WAIT, || {
        let address = operator.admin_address;
        async move {
            let metrics = http_get(address, "/metrics").await.1;
            (passes(&metrics, "full") > full).then_some(())
        }
    })
    .await;
    operator.shutdown().await.unwrap();
}
