//! Before a NodePool server is deleted: its Node is checked, cordoned and drained, as Cluster
//! API's Machine controller does for a Machine, because the cloud's delete call takes the
//! server with whatever runs on it.
//!
//! - A deletion cluster-autoscaler asked for (DeleteNodes, in the pool's scale-down ledger)
//!   goes ahead only while the Node still carries CA's `ToBeDeletedByClusterAutoscaler`
//!   taint. CA removes that taint when it gives a node up: on any error answer, and at its
//!   start-up clean-up. Without it the node may run pods again, so the deletion is undone
//!   ([`Gate::NotHeld`]) rather than carried out late.
//! - Every deletion (CA's, or replicas a person lowered) cordons the Node first (recorded in
//!   [`CORDONED_ANNOTATION`], so that an undone deletion uncordons only what it cordoned),
//!   evicts the pods a drain evicts (not DaemonSet pods, mirror pods, or finished ones)
//!   through the Eviction API, so PodDisruptionBudgets hold, and deletes the server only once
//!   none is left.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The taint cluster-autoscaler puts on a node it is deleting, and removes when it gives the
/// node up.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// On a Node this operator cordoned for a server's deletion.
pub const CORDONED_ANNOTATION: &str = "autoscaling.nodegroup.dev/cordoned-for-deletion";
/// The code a deletion undone because CA gave its node up is reported with.
pub const NOT_HELD: &str = "NotHeldByAutoscaler";
/// Most pod names one message lists.
const LISTED: usize = 5;
/// How long one pass waits for the evictions of a node's pods.
const EVICTION_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether a server may be deleted now.
#[derive(Debug, PartialEq, Eq)]
pub enum Gate {
    /// Its Node is gone, or cordoned and drained.
    Proceed,
    /// cluster-autoscaler asked for the deletion and has given the Node up since: undo it.
    NotHeld(String),
    /// Draining: pods are still on the Node (being evicted, or their eviction refused).
    Draining(String),
}

/// True when `node` carries [`TO_BE_DELETED_TAINT`].
pub fn held_by_autoscaler(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

/// True for a pod a drain evicts: not finished, not of a DaemonSet, not a mirror pod.
pub fn evictable(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
        && !pod.owner_references().iter().any(|o| o.kind == "DaemonSet")
        && !pod
            .annotations()
            .contains_key("kubernetes.io/config.mirror")
}

fn not_held_message(node: &str) -> String {
    format!(
        "node {node} no longer carries cluster-autoscaler's {TO_BE_DELETED_TAINT} taint: cluster-autoscaler gave it up (an error answer or its restart) and may have let pods onto it, so its server is kept and the decrement undone"
    )
}

/// Checks, cordons and drains Node `node` (of the cluster `client` reaches) before its
/// server's deletion; `asked_by_autoscaler`: the deletion is a DeleteNodes' (see the module
/// documentation).
pub async fn prepare(client: &Client, node: &str, asked_by_autoscaler: bool) -> kube::Result<Gate> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(current) = nodes.get_opt(node).await? else {
        return Ok(Gate::Proceed);
    };
    if asked_by_autoscaler && !held_by_autoscaler(&current) {
        release(client, node).await?;
        return Ok(Gate::NotHeld(not_held_message(node)));
    }
    let cordoned = current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    if !cordoned {
        let patch = json!({
            "metadata": {"annotations": {CORDONED_ANNOTATION: "true"}},
            "spec": {"unschedulable": true},
        });
        let written = nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // The answer shows the Node as the write left it: with the taint there, it was
        // still held when it became unschedulable, and no pod is let on after that.
        if asked_by_autoscaler && !held_by_autoscaler(&written) {
            release(client, node).await?;
            return Ok(Gate::NotHeld(not_held_message(node)));
        }
    }
    drain(client, node).await
}

/// Evicts the evictable pods of `node`: [`Gate::Proceed`] once none is left.
async fn drain(client: &Client, node: &str) -> kube::Result<Gate> {
    let pods: Api<Pod> = Api::all(client.clone());
    let bound = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let left: Vec<&Pod> = bound.items.iter().filter(|p| evictable(p)).collect();
    if left.is_empty() {
        return Ok(Gate::Proceed);
    }
    let evictions = left
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|pod| evict(client, pod));
    let mut refused = Vec::new();
    for outcome in futures::future::join_all(evictions).await {
        if let Some(why) = outcome? {
            refused.push(why);
        }
    }
    let mut message = format!(
        "draining node {node}: {} pod(s) left ({})",
        left.len(),
        names(&left)
    );
    if !refused.is_empty() {
        let _ = write!(
            message,
            "; eviction refused for {}",
            refused
                .iter()
                .take(LISTED)
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(Gate::Draining(message))
}

/// Evicts `pod`: `Some(why)` when the eviction is not allowed now.
async fn evict(client: &Client, pod: &Pod) -> kube::Result<Option<String>> {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    // The client retries a 429 (a PodDisruptionBudget that allows no eviction now) by
    // itself, for up to hours: the pass waits a bounded time and tries again next pass.
    match tokio::time::timeout(EVICTION_WAIT, api.evict(&name, &EvictParams::default())).await {
        Ok(Ok(_)) => Ok(None),
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(None),
        // Not allowed now (429), or a misconfigured budget (500): the drain waits, as
        // `kubectl drain` does.
        Ok(Err(kube::Error::Api(status))) if matches!(status.code, 429 | 500) => {
            Ok(Some(format!("{namespace}/{name}: {}", status.message)))
        }
        Ok(Err(error)) => Err(error),
        Err(_) => Ok(Some(format!(
            "{namespace}/{name}: not allowed within {}s (a PodDisruptionBudget)",
            EVICTION_WAIT.as_secs()
        ))),
    }
}

fn names(pods: &[&Pod]) -> String {
    let mut listed: Vec<String> = pods
        .iter()
        .take(LISTED)
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    if pods.len() > LISTED {
        listed.push(format!("and {} more", pods.len() - LISTED));
    }
    listed.join(", ")
}

/// Uncordons Node `node` if this operator cordoned it for a deletion that is not going ahead.
pub async fn release(client: &Client, node: &str) -> kube::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(current) = nodes.get_opt(node).await? else {
        return Ok(());
    };
    if !current.annotations().contains_key(CORDONED_ANNOTATION) {
        return Ok(());
    }
    let patch = json!({
        "metadata": {"annotations": {CORDONED_ANNOTATION: null}},
        "spec": {"unschedulable": null},
    });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_drain_evicts_neither_daemon_set_nor_mirror_nor_finished_pods() {
        let plain = pod(json!({"metadata": {"name": "a"}}));
        let daemon = pod(json!({"metadata": {"name": "b", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u"}]}}));
        let mirror = pod(json!({"metadata": {"name": "c",
            "annotations": {"kubernetes.io/config.mirror": "x"}}}));
        let done = pod(json!({"metadata": {"name": "d"}, "status": {"phase": "Succeeded"}}));
        let replica = pod(json!({"metadata": {"name": "e", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u"}]},
            "status": {"phase": "Running"}}));
        assert!(evictable(&plain));
        assert!(evictable(&replica));
        assert!(!evictable(&daemon));
        assert!(!evictable(&mirror));
        assert!(!evictable(&done));
    }

    #[test]
    fn only_the_autoscalers_taint_means_it_holds_the_node() {
        let node = |taints: serde_json::Value| -> Node {
            serde_json::from_value(json!({"metadata": {"name": "n"}, "spec": {"taints": taints}}))
                .unwrap()
        };
        assert!(held_by_autoscaler(&node(json!([
            {"key": TO_BE_DELETED_TAINT, "value": "1700000000", "effect": "NoSchedule"}
        ]))));
        assert!(!held_by_autoscaler(&node(json!([
            {"key": "DeletionCandidateOfClusterAutoscaler", "value": "1", "effect": "PreferNoSchedule"}
        ]))));
        assert!(!held_by_autoscaler(&node(json!([]))));
    }
}
