//! Where this replica runs: on a Node of a node group it serves, cluster-autoscaler may scale
//! that Node down and take the autoscaler's provider with it. The replica's Node comes from
//! `NODE_NAME` (the chart sets it from `spec.nodeName`); each time the index changes, its
//! provider ID is looked up among the served groups. Found: a warning in the log and an Event
//! on the replica's Pod (once per group), and `nodegroup_on_served_node` 1.

use crate::runtime::metrics::RuntimeMetrics;
use k8s_openapi::api::core::v1::ObjectReference;
use ngo_index::index::{NodeGroupLookup, SnapshotHandle};
use ngo_service::events::{EventPublisher, Severity};
use tokio_util::sync::CancellationToken;

use super::watches::Watches;

/// Event reason on the replica's Pod.
pub const ON_SERVED_NODE_REASON: &str = "OnAutoscaledNode";

/// The replica's own Pod and Node.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Node name (`NODE_NAME`).
    pub node: String,
    /// Pod name and namespace, for the Event; without them only the log and the metric say it.
    pub pod: Option<(String, String)>,
}

/// Checks the replica's Node against the served groups on every index change, until
/// `shutdown`.
pub async fn watch(
    mut snapshots: SnapshotHandle,
    (watches, placement): (Watches, Placement),
    (events, metrics): (EventPublisher, RuntimeMetrics),
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut reported: Option<String> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            alive = snapshots.changed() => if !alive { return Ok(()) },
        }
        let Some(snapshot) = snapshots.current() else {
            continue;
        };
        let group = watches
            .local_node_provider_id(&placement.node)
            .and_then(|id| match snapshot.group_for_provider_id(&id, None) {
                NodeGroupLookup::Group(group) => Some(group.id.clone()),
                _ => None,
            });
        metrics.set_on_served_node(group.is_some());
        if group == reported {
            continue;
        }
        if let Some(group) = &group {
            let message = format!(
                "this replica runs on Node {} of node group {group}, which it serves: cluster-autoscaler may scale that Node down and stop the operator with it; keep the operator off autoscaled groups (the chart's nodeSelector, affinity or tolerations)",
                placement.node
            );
            tracing::warn!(node = %placement.node, %group, "{message}");
            if let Some((name, namespace)) = &placement.pod {
                let pod = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(name.clone()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                };
                events
                    .publish(
                        &pod,
                        Severity::Warning,
                        ON_SERVED_NODE_REASON,
                        "Place",
                        message,
                    )
                    .await;
            }
        }
        reported = group;
    }
}
