//! A replica on a Node of a node group it serves says so: cluster-autoscaler may scale that
//! Node down and take the autoscaler's provider with it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::*;
use nodegroup_operator::runtime::{self, placement::Placement};

/// The operator's `nodegroup_on_served_node` sample, as `/metrics` serves it.
async fn on_served_node(admin: std::net::SocketAddr) -> Option<String> {
    let (_, body) = http_get(admin, "/metrics").await;
    body.lines()
        .find(|l| l.starts_with("nodegroup_on_served_node "))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_a_node_of_a_group_it_serves_warns_and_one_elsewhere_does_not() {
    let ns = TestNs::new("placement").await;
    deployment_with_nodes(&ns, "workers", 1, 3, 1).await;
    let served = format!("{}-workers-0", ns.name);
    let outsider = ns
        .node(
            "system-0",
            &format!("test:////{}-system-0", ns.name),
            BTreeMap::new(),
        )
        .await;

    for (node, pod, expected) in [
        (served.clone(), "ngo-on-workers", "1"),
        (outsider.clone(), "ngo-on-system", "0"),
    ] {
        let mut config = operator_config(&ns.name, None);
        config.placement = Some(Placement {
            node: node.clone(),
            pod: Some((pod.to_string(), ns.name.clone())),
        });
        let running = runtime::start(config).await.expect("operator starts");
        let admin = running.admin_address;
        // Judged once the index has the group (the gauge reads 0 before anything is known).
        eventually("the index built", Duration::from_secs(20), || async {
            running
                .snapshots
                .current()
                .filter(|s| !s.groups.is_empty())
                .map(|_| ())
        })
        .await;
        eventually(
            &format!("nodegroup_on_served_node {expected} on {node}"),
            Duration::from_secs(20),
            || async { (on_served_node(admin).await.as_deref() == Some(expected)).then_some(()) },
        )
        .await;
        let events = ns
            .wait_events_for(pod, |e| expected == "0" || !e.is_empty())
            .await;
        if expected == "1" {
            assert!(
                events
                    .iter()
                    .any(|(reason, note)| reason == "OnAutoscaledNode"
                        && note.contains(&served)
                        && note.contains("workers")),
                "{events:?}"
            );
        } else {
            assert!(events.is_empty(), "{events:?}");
        }
        running.shutdown().await.expect("stops");
    }
}
