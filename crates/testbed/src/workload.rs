//! Workloads that make cluster-autoscaler act, and what it says about them: Deployments of
//! pods with CPU requests pinned to a node group by a node selector, pod counts, and
//! cluster-autoscaler's Events (its decisions, as users see them in `kubectl get events`).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// A Deployment of `replicas` pause pods, each requesting `cpu`, scheduled only on Nodes
/// with `node_selector`, and evictable by cluster-autoscaler (owned by a ReplicaSet, no
/// local storage).
pub fn deployment(
    namespace: &str,
    name: &str,
    replicas: i32,
    cpu: &str,
    node_selector: &BTreeMap<String, String>,
) -> Result<Deployment, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": node_selector,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{
                        "name": "app",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}
                    }]
                }
            }
        }
    }))
}

/// Creates `deployment`.
pub async fn create(client: &Client, deployment: &Deployment) -> kube::Result<Deployment> {
    let namespace = deployment.namespace().unwrap_or_default();
    Api::<Deployment>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), deployment)
        .await
}

/// Sets the replicas of Deployment `namespace/name`.
pub async fn scale(
    client: &Client,
    namespace: &str,
    name: &str,
    replicas: i32,
) -> kube::Result<()> {
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .map(|_| ())
}

/// Pods of app `name` in `namespace`, counted by phase, plus how many are bound to a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// `Running`.
    pub running: usize,
    /// `Pending` (scheduled or not).
    pub pending: usize,
    /// Pending and not scheduled (cluster-autoscaler's input).
    pub unschedulable: usize,
    /// All pods of the app.
    pub total: usize,
}

/// Counts the pods of app `name` in `namespace`.
pub async fn pod_counts(client: &Client, namespace: &str, name: &str) -> kube::Result<PodCounts> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await?;
    let mut counts = PodCounts::default();
    for pod in pods.items {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        counts.total += 1;
        let status = pod.status.unwrap_or_default();
        match status.phase.as_deref() {
            Some("Running") => counts.running += 1,
            Some("Pending") => {
                counts.pending += 1;
                let unschedulable = status.conditions.unwrap_or_default().iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                });
                if unschedulable {
                    counts.unschedulable += 1;
                }
            }
            _ => {}
        }
    }
    Ok(counts)
}

/// One Event cluster-autoscaler recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// When it was last seen (RFC 3339), for ordering.
    pub time: String,
    /// `TriggeredScaleUp`, `ScaledUpGroup`, `ScaleDown`, `ScaleDownEmpty`, ...
    pub reason: String,
    /// `<Kind>/<name>` of the object it is about.
    pub object: String,
    /// What cluster-autoscaler said.
    pub message: String,
}

/// The Events cluster-autoscaler (`source.component: cluster-autoscaler`) recorded in
/// `namespace` (its own namespace for status ConfigMap events; the pods' namespace for
/// pod events), oldest first. Node events live in `default`.
pub async fn decisions(client: &Client, namespace: &str) -> kube::Result<Vec<Decision>> {
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut out: Vec<Decision> = events
        .items
        .into_iter()
        .filter(|e| {
            e.source.as_ref().and_then(|s| s.component.as_deref()) == Some("cluster-autoscaler")
                || e.reporting_component.as_deref() == Some("cluster-autoscaler")
        })
        .map(|e| {
            let time = e
                .last_timestamp
                .as_ref()
                .or(e.first_timestamp.as_ref())
                .map(|t| t.0.to_string())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                .unwrap_or_default();
            Decision {
                time,
                reason: e.reason.unwrap_or_default(),
                object: format!(
                    "{}/{}",
                    e.involved_object.kind.unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default()
                ),
                message: e.message.unwrap_or_default(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.time.cmp(&b.time));
    Ok(out)
}

/// `spec.replicas` and `status.readyReplicas` of a Cluster API scalable resource as JSON.
pub fn replicas_of(object: &Value) -> (i64, i64) {
    (
        object["spec"]["replicas"].as_i64().unwrap_or_default(),
        object["status"]["readyReplicas"]
            .as_i64()
            .unwrap_or_default(),
    )
}
