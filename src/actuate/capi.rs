//! Scaling Cluster API resources: the `/scale` subresource and the delete-machine annotation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;

use super::activity::{ActivityLog, Direction};
use super::error::ActuateError;
use crate::capi::objects::ScalableKind;
use crate::capi::resources::CapiResources;
use crate::capi::{CapiKeys, providerid};
use crate::events::{EventPublisher, Severity};
use crate::index::{NodeGroup, NodeGroupLookup, Snapshot};

/// How many times a replica change is retried after a resourceVersion conflict.
const CONFLICT_ATTEMPTS: u32 = 5;
/// How many times marking a Machine is retried after a resourceVersion conflict.
const MARK_ATTEMPTS: u32 = 10;
/// Pause between attempts to mark a Machine that keeps changing.
const MARK_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// A machine already carries the delete mark: was the decrement for it already applied? Each
/// marked, not yet deleting machine of the group stands for one decrement Cluster API has not
/// carried out yet, so live replicas at or below (members - marked) mean it was.
fn decrement_already_applied(
    snapshot: &Snapshot,
    group: &NodeGroup,
    live: i32,
    machine: &str,
) -> bool {
    let members: Vec<_> = snapshot
        .machines
        .values()
        .filter(|m| m.group.as_deref() == Some(group.id.as_str()) && !m.deleting)
        .collect();
    let marked = members
        .iter()
        .filter(|m| m.marked_for_deletion)
        .count()
        .max(1);
    let applied = i64::from(live) <= members.len() as i64 - marked as i64;
    if applied {
        tracing::info!(
            machine,
            "machine already marked and its decrement already applied"
        );
    }
    applied
}

/// A node named in a DeleteNodes request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRef {
    /// `spec.providerID` (for CA's fake nodes, the synthetic instance id).
    pub provider_id: String,
    /// Node name.
    pub name: String,
}

impl NodeRef {
    /// The id used for lookups: the provider ID, or the name when it is empty.
    pub fn id(&self) -> &str {
        if self.provider_id.is_empty() {
            &self.name
        } else {
            &self.provider_id
        }
    }
}

/// Outcome of DeleteNodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Nodes whose removal this request started (already-deleting machines not counted).
    pub removed: usize,
    /// Replicas after the last decrement, if any.
    pub target: Option<i32>,
}

/// What deleting one node means.
enum Removal {
    /// Annotate this Machine, then decrement.
    Machine { namespace: String, name: String },
    /// MachinePool entry without a Machine: decrement only.
    PoolReplica,
}

/// Writes replica changes and machine deletion marks for Cluster API node groups.
pub struct CapiActuator {
    client: Client,
    resources: CapiResources,
    keys: CapiKeys,
    events: Option<EventPublisher>,
    activity: Arc<ActivityLog>,
    /// Serialises mutations per group inside this process (replicas race through
    /// resourceVersion checks across processes).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl CapiActuator {
    /// A new actuator. `events` is `None` where events are not wanted (benchmarks).
    pub fn new(
        client: Client,
        resources: CapiResources,
        keys: CapiKeys,
        events: Option<EventPublisher>,
        activity: Arc<ActivityLog>,
    ) -> Self {
        Self {
            client,
            resources,
            keys,
            events,
            activity,
            locks: Mutex::default(),
        }
    }

    /// Raises the group's replicas by `delta` (> 0), within max.
    pub async fn increase_size(&self, group: &NodeGroup, delta: i32) -> Result<i32, ActuateError> {
        if delta <= 0 {
            return Err(ActuateError::NonPositiveIncrease(delta));
        }
        let _guard = self.lock(&group.id).await;
        let result = self
            .change_replicas(group, |current| {
                let desired = i64::from(current) + i64::from(delta);
                if desired > i64::from(group.max) {
                    return Err(ActuateError::AboveMax {
                        group: group.id.clone(),
                        desired,
                        max: group.max,
                    });
                }
                Ok(desired as i32)
            })
            .await;
        self.report(group, "ScaleUp", Direction::Up, &result, |(from, to)| {
            format!("scaled up from {from} to {to} replicas (delta {delta})")
        })
        .await;
        result.map(|(_, to)| to)
    }

    /// Lowers the target by `delta` (< 0) without touching registered nodes.
    pub async fn decrease_target_size(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        delta: i32,
    ) -> Result<i32, ActuateError> {
        if delta >= 0 {
            return Err(ActuateError::NonNegativeDecrease(delta));
        }
        let existing = snapshot
            .group(&group.id)
            .map(|g| g.instances.iter().filter(|i| i.is_real()).count())
            .unwrap_or(0);
        let _guard = self.lock(&group.id).await;
        let result = self
            .change_replicas(group, |current| {
                let desired = i64::from(current) + i64::from(delta);
                if desired < existing as i64 {
                    return Err(ActuateError::WouldDeleteExisting {
                        group: group.id.clone(),
                        current,
                        delta,
                        existing,
                    });
                }
                if desired < i64::from(group.min) {
                    return Err(ActuateError::BelowMin {
                        group: group.id.clone(),
                        desired,
                        min: group.min,
                    });
                }
                Ok(desired as i32)
            })
            .await;
        self.report(
            group,
            "DecreaseTargetSize",
            Direction::Down,
            &result,
            |(from, to)| format!("decreased target size from {from} to {to} (delta {delta})"),
        )
        .await;
        result.map(|(_, to)| to)
    }

    /// Deletes specific nodes: marks each Machine with the delete-machine annotation, then
    /// decrements replicas by one (the mark is rolled back when the decrement fails). Machines
    /// already deleting, or already marked with the decrement done, are skipped, so a retried
    /// request does not scale down twice.
    pub async fn delete_nodes(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        nodes: &[NodeRef],
    ) -> Result<Deleted, ActuateError> {
        let _guard = self.lock(&group.id).await;
        let result = self.delete_nodes_locked(snapshot, group, nodes).await;
        let names: Vec<&str> = nodes.iter().map(NodeRef::id).collect();
        self.report(group, "ScaleDown", Direction::Down, &result, |deleted| {
            format!(
                "deleting {} of {} node(s): {}",
                deleted.removed,
                nodes.len(),
                names.join(", ")
            )
        })
        .await;
        result
    }

    async fn delete_nodes_locked(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        nodes: &[NodeRef],
    ) -> Result<Deleted, ActuateError> {
        let mut removals = Vec::with_capacity(nodes.len());
        for node in nodes {
            if let Some(removal) = self.resolve(snapshot, group, node)? {
                removals.push(removal);
            }
        }
        if removals.is_empty() {
            return Ok(Deleted::default());
        }
        let live = self.live_replicas(group).await?;
        if i64::from(live) - (removals.len() as i64) < i64::from(group.min) {
            return Err(ActuateError::DeleteBelowMin {
                group: group.id.clone(),
                count: removals.len(),
                replicas: live,
                min: group.min,
            });
        }
        let mut deleted = Deleted::default();
        for removal in removals {
            let (_, target) = match removal {
                Removal::PoolReplica => self.decrement(group).await?,
                Removal::Machine { namespace, name } => {
                    if !self
                        .mark_machine(snapshot, group, &namespace, &name, live)
                        .await?
                    {
                        continue;
                    }
                    match self.decrement(group).await {
                        Ok(change) => change,
                        Err(error) => {
                            self.unmark_machine(&namespace, &name).await;
                            return Err(error);
                        }
                    }
                }
            };
            deleted.removed += 1;
            deleted.target = Some(target);
        }
        Ok(deleted)
    }

    /// Checks membership; `None` when the node needs no action (its machine is deleting).
    fn resolve(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        node: &NodeRef,
    ) -> Result<Option<Removal>, ActuateError> {
        let id = node.id();
        match snapshot.group_for_provider_id(id) {
            NodeGroupLookup::Group(actual) if actual.id == group.id => {}
            NodeGroupLookup::Group(actual) => {
                return Err(ActuateError::NotMember {
                    node: id.into(),
                    group: group.id.clone(),
                    actual: actual.id.clone(),
                });
            }
            NodeGroupLookup::Ambiguous(count) => {
                return Err(ActuateError::AmbiguousNode {
                    node: id.into(),
                    count,
                });
            }
            NodeGroupLookup::None => return Err(ActuateError::UnknownNode { node: id.into() }),
        }
        if let Some(machine) = snapshot.machine_for_provider_id(id) {
            if machine.deleting {
                tracing::info!(node = id, machine = %machine.name, "machine already deleting; not decrementing again");
                return Ok(None);
            }
            return Ok(Some(Removal::Machine {
                namespace: machine.namespace.clone(),
                name: machine.name.clone(),
            }));
        }
        let in_pool = group
            .provider_id_list
            .iter()
            .flatten()
            .any(|p| providerid::normalize(p) == providerid::normalize(id));
        if group.kind == ScalableKind::MachinePool && in_pool {
            return Ok(Some(Removal::PoolReplica));
        }
        Err(ActuateError::NotInPool {
            node: id.into(),
            group: group.id.clone(),
        })
    }

    /// Sets the delete-machine annotation. `false` when the machine needs no decrement: it is
    /// deleting, or it was marked by an earlier request whose decrement already happened
    /// (live replicas already leave it out).
    async fn mark_machine(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        namespace: &str,
        name: &str,
        live: i32,
    ) -> Result<bool, ActuateError> {
        let api = self.machines(namespace);
        // Cluster API rewrites Machines often (status, conditions); a conflict means "decide
        // again on the newer object", never "give up".
        for _ in 0..MARK_ATTEMPTS {
            let machine = api.get(name).await.map_err(ActuateError::api(format!(
                "reading Machine {namespace}/{name}"
            )))?;
            if machine.metadata.deletion_timestamp.is_some() {
                return Ok(false);
            }
            let already_marked = machine
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(&self.keys.delete_machine));
            if already_marked {
                return Ok(!decrement_already_applied(snapshot, group, live, name));
            }
            let patch = json!({
                "metadata": {
                    "resourceVersion": machine.metadata.resource_version,
                    "annotations": { &self.keys.delete_machine: jiff::Timestamp::now().to_string() }
                }
            });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::debug!(machine = name, "Machine changed while marking it; retrying");
                    tokio::time::sleep(MARK_RETRY_DELAY).await;
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("marking Machine {namespace}/{name} for deletion"),
                        source,
                    });
                }
            }
        }
        Err(ActuateError::MachineConflict {
            machine: format!("{namespace}/{name}"),
            attempts: MARK_ATTEMPTS,
        })
    }

    async fn unmark_machine(&self, namespace: &str, name: &str) {
        let patch = json!({ "metadata": { "annotations": { &self.keys.delete_machine: null } } });
        if let Err(error) = self
            .machines(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::error!(%error, machine = name, namespace, "could not roll back the delete-machine annotation");
        }
    }

    async fn decrement(&self, group: &NodeGroup) -> Result<(i32, i32), ActuateError> {
        self.change_replicas(group, |current| {
            let desired = i64::from(current) - 1;
            if desired < i64::from(group.min) {
                return Err(ActuateError::BelowMin {
                    group: group.id.clone(),
                    desired,
                    min: group.min,
                });
            }
            Ok(desired as i32)
        })
        .await
    }

    async fn live_replicas(&self, group: &NodeGroup) -> Result<i32, ActuateError> {
        let scale =
            self.scalable(group)
                .get_scale(&group.name)
                .await
                .map_err(ActuateError::api(format!(
                    "reading the scale of {}",
                    group.id
                )))?;
        // The API server omits `replicas: 0` (omitempty): missing means zero.
        Ok(scale.spec.and_then(|s| s.replicas).unwrap_or(0))
    }

    /// Reads `/scale`, computes the new replicas and writes them back with the read
    /// resourceVersion; retries on conflict. Returns (old, new).
    async fn change_replicas(
        &self,
        group: &NodeGroup,
        desired: impl Fn(i32) -> Result<i32, ActuateError>,
    ) -> Result<(i32, i32), ActuateError> {
        let api = self.scalable(group);
        for _ in 0..CONFLICT_ATTEMPTS {
            let mut scale =
                api.get_scale(&group.name)
                    .await
                    .map_err(ActuateError::api(format!(
                        "reading the scale of {}",
                        group.id
                    )))?;
            let spec = scale.spec.get_or_insert_default();
            // The API server omits `replicas: 0` (omitempty): missing means zero.
            let current = spec.replicas.unwrap_or(0);
            let new = desired(current)?;
            spec.replicas = Some(new);
            match api
                .replace_scale(&group.name, &PostParams::default(), &scale)
                .await
            {
                Ok(_) => return Ok((current, new)),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    tracing::debug!(group = %group.id, "replica change conflicted; retrying");
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("writing the scale of {}", group.id),
                        source,
                    });
                }
            }
        }
        Err(ActuateError::ConflictRetriesExhausted {
            group: group.id.clone(),
            attempts: CONFLICT_ATTEMPTS,
        })
    }

    async fn lock(&self, group: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self
                .locks
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.entry(group.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    fn scalable(&self, group: &NodeGroup) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &group.namespace,
            self.api_resource(group.kind),
        )
    }

    fn api_resource(&self, kind: ScalableKind) -> &ApiResource {
        // Groups only exist for kinds that discovery found.
        self.resources
            .scalable(kind)
            .unwrap_or(&self.resources.machine_sets)
    }

    fn machines(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.resources.machines)
    }

    /// Emits a Normal event for a completed action, a Warning for a refused or failed one.
    /// Records the outcome and emits events: Normal for a completed action, Warning for a
    /// refused or failed one, on the scalable resource and on its governing policy.
    async fn report<T>(
        &self,
        group: &NodeGroup,
        action: &str,
        direction: Direction,
        result: &Result<T, ActuateError>,
        describe: impl Fn(&T) -> String,
    ) {
        let now = jiff::Timestamp::now();
        match result {
            Ok(_) => self.activity.success(&group.id, direction, now),
            Err(e) if !e.is_rejection() => {
                self.activity
                    .failure(&group.id, direction, e.to_string(), now)
            }
            Err(_) => {}
        }
        let Some(events) = &self.events else { return };
        let (severity, reason, note) = match result {
            Ok(value) => (Severity::Normal, action.to_string(), describe(value)),
            Err(e) if e.is_rejection() => (
                Severity::Warning,
                format!("{action}Rejected"),
                e.to_string(),
            ),
            Err(e) => (Severity::Warning, format!("{action}Failed"), e.to_string()),
        };
        let ar = self.api_resource(group.kind);
        let resource = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            namespace: Some(group.namespace.clone()),
            name: Some(group.name.clone()),
            uid: Some(group.uid.clone()).filter(|u| !u.is_empty()),
            ..Default::default()
        };
        events
            .publish(&resource, severity, &reason, action, note.clone())
            .await;
        if let Some(policy) = &group.policy {
            let note = format!("{}: {note}", group.id);
            events
                .publish(
                    &crate::events::policy_reference(policy),
                    severity,
                    &reason,
                    action,
                    note,
                )
                .await;
        }
    }
}
