//! Index rebuilds happen for changes the index reads, not for Node heartbeats. Its own test
//! binary: Nodes are cluster-scoped, so tests running alongside would trigger rebuilds too.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(20);

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
