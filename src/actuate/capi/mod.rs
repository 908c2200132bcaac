//! Scaling Cluster API resources: the `/scale` subresource and the delete-machine annotation.
//!
//! Safety model of DeleteNodes (see [`crate::capi::scale_down`]): per machine, (1) mark the
//! Machine (delete-machine annotation plus our request record), then (2) lower replicas and
//! record the machine in the group's ledger in one compare-and-swap. Any await may be the last
//! one of this process:
//! - dying before (1) changes nothing;
//! - dying between (1) and (2) leaves a mark whose machine is not in the ledger; after the
//!   mark's deadline the sweeper (leader, at start and periodically) rolls it back, and a
//!   later DeleteNodes for the machine takes it over;
//! - dying after (2) leaves a consistent state: Cluster API deletes the marked machine.
//!
//! A dropped RPC does not stop a mutation: the service runs it detached
//! ([`crate::server`]), bounded by its [`MutationDeadline`]; a failed (2) rolls (1) back at
//! once. Whether a machine's decrement happened is read from the ledger, never inferred, so a
//! repeated or concurrent DeleteNodes never lowers replicas twice for one machine.

mod marks;
mod pool_removals;
mod replicas;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::discovery::ApiResource;

pub use marks::Marked;

pub use replicas::Decrement;

use super::activity::{ActivityLog, Direction};
use super::deadline::MutationDeadline;
use super::error::ActuateError;
use crate::capi::objects::ScalableKind;
use crate::capi::resources::CapiResources;
use crate::capi::scale_down::{ScaleDownMark, pool_instance_key};
use crate::capi::{CapiKeys, providerid};
use crate::events::{EventPublisher, Severity};
use crate::fault;
use crate::index::{NodeGroup, NodeGroupLookup, Snapshot};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// Nodes whose removal this request started (already-deleting machines not counted).
    pub removed: usize,
    /// Replicas after the last decrement, if any.
    pub target: Option<i32>,
    /// Instances of a pool without Machines (NodePool, MachinePool) whose decrement is in
    /// the ledger, with the request the ledger records it under when known: their removal
    /// is someone else's to carry out ([`CapiActuator::await_pool_removals`]).
    pub pool_removals: Vec<(String, Option<String>)>,
}

/// How often a request waiting for another live request's mark looks again.
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// What marking a Machine for one request came to.
enum MarkOutcome {
    /// Our mark is on the Machine: lower replicas next.
    Marked,
    /// The Machine is deleting, or another request lowered replicas for it (replicas now,
    /// when known).
    NothingToDo(Option<i32>),
}

/// What deleting one node means.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Removal {
    /// Mark this Machine, then decrement.
    Machine { namespace: String, name: String },
    /// MachinePool entry without a Machine: decrement only (the ledger key names the
    /// instance).
    PoolReplica { provider_id: String },
}

impl Removal {
    /// The group ledger's key for this removal.
    fn ledger_key(&self) -> String {
        match self {
            Removal::Machine { name, .. } => name.clone(),
            Removal::PoolReplica { provider_id } => pool_instance_key(provider_id),
        }
    }
}

/// Writes replica changes and machine deletion marks for Cluster API node groups.
pub struct CapiActuator {
    client: Client,
    resources: CapiResources,
    keys: CapiKeys,
    events: Option<EventPublisher>,
    activity: Arc<ActivityLog>,
    /// Names this replica in request ids.
    instance: String,
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
        instance: String,
    ) -> Self {
        Self {
            client,
            resources,
            keys,
            events,
            activity,
            instance,
            locks: Mutex::default(),
        }
    }

    /// A new request id of this replica.
    pub fn request_id(&self) -> String {
        crate::capi::scale_down::request_id(&self.instance)
    }

    /// The Cluster API keys (delete-machine annotation) this actuator writes.
    pub fn keys(&self) -> &CapiKeys {
        &self.keys
    }

    /// Raises the group's replicas by `delta` (> 0), within max.
    pub async fn increase_size(
        &self,
        group: &NodeGroup,
        delta: i32,
        deadline: &MutationDeadline,
    ) -> Result<i32, ActuateError> {
        if delta <= 0 {
            return Err(ActuateError::NonPositiveIncrease(delta));
        }
        let _guard = self.lock(&group.id).await;
        let result = self
            .change_replicas(group, deadline, |current| {
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
        });
        result.map(|(_, to)| to)
    }

    /// Lowers the target by `delta` (< 0) without touching registered nodes.
    pub async fn decrease_target_size(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        delta: i32,
        deadline: &MutationDeadline,
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
            .change_replicas(group, deadline, |current| {
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
        );
        result.map(|(_, to)| to)
    }

    /// Deletes specific nodes: for each, marks its Machine, then lowers replicas by one and
    /// records the machine in the group's ledger (the mark is rolled back when that fails).
    /// Machines already deleting, or whose decrement the ledger already records, need
    /// nothing; the same node twice in one request counts once.
    pub async fn delete_nodes(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        nodes: &[NodeRef],
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<Deleted, ActuateError> {
        let _guard = self.lock(&group.id).await;
        let result = self
            .delete_nodes_locked(snapshot, group, nodes, request, deadline)
            .await;
        let names: Vec<&str> = nodes.iter().map(NodeRef::id).collect();
        self.report(group, "ScaleDown", Direction::Down, &result, |deleted| {
            format!(
                "deleting {} of {} node(s): {}",
                deleted.removed,
                nodes.len(),
                names.join(", ")
            )
        });
        result
    }

    async fn delete_nodes_locked(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        nodes: &[NodeRef],
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<Deleted, ActuateError> {
        let mut removals: Vec<Removal> = Vec::with_capacity(nodes.len());
        for node in nodes {
            if let Some(removal) = self.resolve(snapshot, group, node)?
                && !removals.contains(&removal)
            {
                removals.push(removal);
            }
        }
        if removals.is_empty() {
            return Ok(Deleted::default());
        }
        let (live, ledger) = self.live_state(group).await?;
        let needed = removals
            .iter()
            .filter(|r| ledger.get(&r.ledger_key()).is_none())
            .count();
        if i64::from(live) - (needed as i64) < i64::from(group.min) {
            return Err(ActuateError::DeleteBelowMin {
                group: group.id.clone(),
                count: needed,
                replicas: live,
                min: group.min,
            });
        }
        let mut deleted = Deleted::default();
        for removal in removals {
            let key = removal.ledger_key();
            if let Some(entry) = ledger.get(&key) {
                tracing::info!(group = %group.id, machine = key, by = %entry.request,
                    "decrement already applied for this machine; not lowering replicas again");
                deleted.target = Some(live);
                if let Removal::PoolReplica { provider_id } = &removal {
                    deleted
                        .pool_removals
                        .push((provider_id.clone(), Some(entry.request.clone())));
                }
                continue;
            }
            let outcome = match &removal {
                Removal::PoolReplica { .. } => {
                    if !deadline.may_start() {
                        return Err(ActuateError::DeadlineExceeded {
                            group: group.id.clone(),
                            step: format!("lowering replicas for {key}"),
                        });
                    }
                    self.decrement_for(snapshot, group, &key, request, deadline)
                        .await?
                }
                Removal::Machine { namespace, name } => {
                    let mark = ScaleDownMark {
                        request: request.to_string(),
                        group: group.id.clone(),
                        deadline: deadline.finish_unix(),
                        preexisting: false,
                        released: false,
                    };
                    fault::point("delete-nodes:before-mark").await;
                    match self
                        .mark_when_free(group, namespace, name, &mark, deadline)
                        .await?
                    {
                        MarkOutcome::Marked => {}
                        MarkOutcome::NothingToDo(target) => {
                            if target.is_some() {
                                deleted.target = target;
                            }
                            continue;
                        }
                    }
                    fault::point("delete-nodes:after-mark").await;
                    match self
                        .decrement_for(snapshot, group, &key, request, deadline)
                        .await
                    {
                        Ok(outcome) => outcome,
                        Err(error) => {
                            self.roll_back(namespace, name, request).await;
                            return Err(error);
                        }
                    }
                }
            };
            fault::point("delete-nodes:after-decrement").await;
            let by = match outcome {
                Decrement::Applied(_, to) => {
                    deleted.removed += 1;
                    deleted.target = Some(to);
                    Some(request.to_string())
                }
                Decrement::AlreadyApplied(now) => {
                    tracing::info!(group = %group.id, machine = key, "decrement already applied for this machine; not lowering replicas again");
                    deleted.target = Some(now);
                    None
                }
            };
            if let Removal::PoolReplica { provider_id } = &removal {
                deleted.pool_removals.push((provider_id.clone(), by));
            }
        }
        Ok(deleted)
    }

    /// Marks the Machine, waiting while another live request holds its mark: that request
    /// either lowers replicas for it (then there is nothing left to do) or fails and rolls
    /// back (then we mark it), so its outcome is never duplicated.
    async fn mark_when_free(
        &self,
        group: &NodeGroup,
        namespace: &str,
        name: &str,
        mark: &ScaleDownMark,
        deadline: &MutationDeadline,
    ) -> Result<MarkOutcome, ActuateError> {
        loop {
            match self.mark_machine(namespace, name, mark, deadline).await? {
                Marked::Ours => return Ok(MarkOutcome::Marked),
                Marked::Deleting => return Ok(MarkOutcome::NothingToDo(None)),
                Marked::Busy(other) => {
                    let (live, ledger) = self.live_state(group).await?;
                    if ledger.get(name).is_some() {
                        return Ok(MarkOutcome::NothingToDo(Some(live)));
                    }
                    if !deadline.may_start() {
                        return Err(ActuateError::MachineBusy {
                            machine: format!("{namespace}/{name}"),
                            request: other,
                        });
                    }
                    tokio::time::sleep(BUSY_POLL).await;
                }
            }
        }
    }

    /// Rolls back our mark after a failed decrement; when that fails too, the sweeper rolls
    /// it back after the mark's deadline.
    async fn roll_back(&self, namespace: &str, name: &str, request: &str) {
        match self.unmark_machine(namespace, name, request).await {
            Ok(_) => tracing::info!(machine = name, namespace, "deletion mark rolled back"),
            Err(error) => {
                tracing::error!(%error, machine = name, namespace, "could not roll back the deletion mark; the sweeper will")
            }
        }
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
        if group.kind.lists_instances() && in_pool {
            return Ok(Some(Removal::PoolReplica {
                provider_id: id.to_string(),
            }));
        }
        Err(ActuateError::NotInPool {
            node: id.into(),
            group: group.id.clone(),
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

    pub(super) fn api_resource(&self, kind: ScalableKind) -> &ApiResource {
        // Groups only exist for kinds that discovery found.
        self.resources
            .scalable(kind)
            .unwrap_or(&self.resources.machine_sets)
    }

    /// Records the outcome and queues events (never awaited on the RPC path): Normal for a
    /// completed action, Warning for a refused or failed one, on the scalable resource and
    /// on its governing policy.
    fn report<T>(
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
        events.queue(&resource, severity, &reason, action, note.clone());
        if let Some(policy) = &group.policy {
            let note = format!("{}: {note}", group.id);
            events.queue(
                &crate::events::policy_reference(policy),
                severity,
                &reason,
                action,
                note,
            );
        }
    }
}

/// What the sweeper did with one expired mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The decrement had happened; the mark's record was cleared.
    Completed,
    /// The decrement had not happened; the mark was rolled back.
    RolledBack,
    /// The Machine changed meanwhile (deleted, or marked by another request).
    Unchanged,
}

impl CapiActuator {
    /// Resolves the expired mark `mark` on Machine `namespace/name` against its group's
    /// ledger (see [`crate::actuate::sweeper`]).
    pub async fn resolve_expired_mark(
        &self,
        namespace: &str,
        name: &str,
        mark: &ScaleDownMark,
    ) -> Result<Resolution, ActuateError> {
        let applied = match self.ledger_by_id(&mark.group).await? {
            Some(ledger) => ledger.get(name).is_some(),
            // The group's resource is gone: its machines go with it; a mark must not outlive
            // the request that cannot complete any more.
            None => false,
        };
        if applied {
            return Ok(
                if self.clear_record(namespace, name, &mark.request).await? {
                    Resolution::Completed
                } else {
                    Resolution::Unchanged
                },
            );
        }
        let _guard = self.lock(&mark.group).await;
        if self.unmark_machine(namespace, name, &mark.request).await? {
            tracing::warn!(machine = name, namespace, request = %mark.request, group = %mark.group,
                "rolled back a stranded deletion mark (its request ended before lowering replicas)");
            self.report_rollback(namespace, name, mark);
            Ok(Resolution::RolledBack)
        } else {
            Ok(Resolution::Unchanged)
        }
    }

    /// The ledger of group `id` (`<Kind>/<namespace>/<name>`), read live; `None` when the
    /// resource does not exist.
    async fn ledger_by_id(
        &self,
        id: &str,
    ) -> Result<Option<crate::capi::scale_down::Ledger>, ActuateError> {
        let mut parts = id.splitn(3, '/');
        let (Some(kind), Some(namespace), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return Ok(None);
        };
        let Some(kind) = ScalableKind::ALL.into_iter().find(|k| k.as_str() == kind) else {
            return Ok(None);
        };
        let Some(resource) = self.resources.scalable(kind) else {
            return Ok(None);
        };
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::namespaced_with(self.client.clone(), namespace, resource);
        let object = api
            .get_opt(name)
            .await
            .map_err(ActuateError::api(format!("reading {id}")))?;
        Ok(object.map(|o| {
            crate::capi::scale_down::Ledger::parse(
                o.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(crate::capi::scale_down::LEDGER_ANNOTATION))
                    .map(String::as_str),
            )
        }))
    }

    fn report_rollback(&self, namespace: &str, name: &str, mark: &ScaleDownMark) {
        let Some(events) = &self.events else { return };
        let machine = ObjectReference {
            api_version: Some(self.resources.machines.api_version.clone()),
            kind: Some(self.resources.machines.kind.clone()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            ..Default::default()
        };
        events.queue(
            &machine,
            Severity::Warning,
            "ScaleDownRolledBack",
            "ScaleDown",
            format!(
                "request {} for {} ended before lowering replicas; its deletion mark was removed",
                mark.request, mark.group
            ),
        );
    }
}
