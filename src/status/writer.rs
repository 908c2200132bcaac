//! Writes NodeGroupPolicy status (server-side apply, own field manager) and Events on the
//! policy for spec problems. Runs on the leader only, one term at a time
//! (`runtime::leader::while_leading`); re-checks on every snapshot and every `RESYNC` so
//! activity (scale-up times, failures) shows up too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use ngo_api::NodeGroupPolicy;
use ngo_index::index::{PolicyRef, SnapshotHandle};
use ngo_service::actuate::ActivityLog;
use ngo_service::events::{EventPublisher, Severity, policy_reference};

/// Field manager for status writes.
pub const FIELD_MANAGER: &str = "nodegroup-operator-status";
const RESYNC: Duration = Duration::from_secs(10);

/// What the writer needs.
pub struct StatusWriter {
    /// Client for status writes.
    pub client: Client,
    /// Current policies.
    pub policies: Box<dyn Fn() -> Vec<Arc<NodeGroupPolicy>> + Send + Sync>,
    /// Snapshots.
    pub snapshots: SnapshotHandle,
    /// Recent actuation activity.
    pub activity: Arc<ActivityLog>,
    /// Events.
    pub events: EventPublisher,
}

impl StatusWriter {
    /// Runs for one leadership term, until `term` is cancelled.
    pub async fn run(self: Arc<Self>, term: CancellationToken) -> anyhow::Result<()> {
        let mut snapshots = self.snapshots.clone();
        let mut reported_invalid: HashMap<String, String> = HashMap::new();
        let mut reported_unreachable: HashMap<String, String> = HashMap::new();
        // A term starts with a pass: the new leader writes what changed while it did not lead.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = term.cancelled() => return Ok(()),
                    alive = snapshots.changed() => if !alive { return Ok(()) },
                    _ = tokio::time::sleep(RESYNC) => {},
                }
            }
            first = false;
            let Some(snapshot) = snapshots.current() else {
                continue;
            };
            let now = Time(jiff::Timestamp::now());
            for policy in (self.policies)() {
                let status = super::compute(&policy, &snapshot, &self.activity, &now);
                if policy.status.as_ref() != Some(&status) {
                    self.write(&policy, &status).await;
                }
                let key = format!(
                    "{}/{}",
                    policy.namespace().unwrap_or_default(),
                    policy.name_any()
                );
                self.report_workload(&policy, &key, &status, &mut reported_unreachable)
                    .await;
                match snapshot.policies.get(&key).and_then(|r| r.invalid.clone()) {
                    Some(reason) if reported_invalid.get(&key) != Some(&reason) => {
                        let reference = policy_reference(&PolicyRef {
                            namespace: policy.namespace().unwrap_or_default(),
                            name: policy.name_any(),
                            uid: policy.uid().unwrap_or_default(),
                        });
                        self.events
                            .publish(
                                &reference,
                                Severity::Warning,
                                "InvalidSpec",
                                "Validate",
                                reason.clone(),
                            )
                            .await;
                        reported_invalid.insert(key, reason);
                    }
                    Some(_) => {}
                    None => {
                        reported_invalid.remove(&key);
                    }
                }
            }
        }
    }

    /// A Warning Event on the policy when its workload clusters become unreachable (or their
    /// problem changes), a Normal one when they are reachable again (not while the condition
    /// is Unknown: a cluster read afresh is not known reachable yet).
    async fn report_workload(
        &self,
        policy: &NodeGroupPolicy,
        key: &str,
        status: &ngo_api::NodeGroupPolicyStatus,
        reported: &mut std::collections::HashMap<String, String>,
    ) {
        let Some(condition) = status
            .conditions
            .iter()
            .find(|c| c.type_ == super::WORKLOAD_CLUSTERS_REACHABLE)
        else {
            return;
        };
        let reference = policy_reference(&PolicyRef {
            namespace: policy.namespace().unwrap_or_default(),
            name: policy.name_any(),
            uid: policy.uid().unwrap_or_default(),
        });
        if condition.status == "False" {
            if reported.get(key) != Some(&condition.message) {
                self.events.queue(
                    &reference,
                    Severity::Warning,
                    "WorkloadClusterUnreachable",
                    "ReadNodes",
                    condition.message.clone(),
                );
                reported.insert(key.to_string(), condition.message.clone());
            }
        } else if condition.status == "True" && reported.remove(key).is_some() {
            self.events.queue(
                &reference,
                Severity::Normal,
                "WorkloadClusterReachable",
                "ReadNodes",
                condition.message.clone(),
            );
        }
    }

    async fn write(&self, policy: &NodeGroupPolicy, status: &ngo_api::NodeGroupPolicyStatus) {
        let namespace = policy.namespace().unwrap_or_default();
        let api: Api<NodeGroupPolicy> = Api::namespaced(self.client.clone(), &namespace);
        let patch = json!({
            "apiVersion": format!("{}/v1alpha1", ngo_api::GROUP),
            "kind": "NodeGroupPolicy",
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(error) = api
            .patch_status(&policy.name_any(), &params, &Patch::Apply(&patch))
            .await
        {
            tracing::warn!(%error, policy = %policy.name_any(), %namespace, "could not write policy status");
        }
    }
}
