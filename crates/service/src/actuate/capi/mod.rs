//! Scaling Cluster API resources: the `/scale` subresource and the delete-machine annotation.
//!
//! DeleteNodes follows [`ngo_index::capi::scale_down::protocol`] (claim, mark, decrement; a
//! failure releases the claim), with its steps in [`scale_down`]; `docs/safety.md` states the
//! protocol and the invariants its model checker proves. A dropped RPC does not stop a
//! mutation: the service runs it detached ([`crate::server`]), bounded by its
//! [`MutationDeadline`]; a request that dies anyway leaves a claim the sweeper releases.

mod marks;
mod pool_removals;
mod replicas;
mod scale_down;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::discovery::ApiResource;

pub use replicas::GroupKey;
pub use scale_down::Released;

use super::activity::{ActivityLog, Direction};
use super::deadline::MutationDeadline;
use super::error::ActuateError;
use crate::discovery::CapiResources;
use crate::events::{EventPublisher, Severity};
use ngo_index::capi::groups::InstanceState;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::capi::scale_down::protocol::{self, Decrement};
use ngo_index::capi::scale_down::{ScaleDownMark, pool_instance_key};
use ngo_index::capi::{CapiKeys, providerid};
use ngo_index::index::{NodeGroup, NodeGroupLookup, Snapshot};
use replicas::{GroupStep, still_exists};
use scale_down::{Attempt, Removed};

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
    /// Machines answered OK without knowing whether they go, with the reason (see
    /// `Removed::InDoubt`).
    pub in_doubt: Vec<String>,
}

/// How often a request waiting for another live request's mark looks again.
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// What deleting one node means.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Removal {
    /// Mark this Machine, then decrement.
    Machine { namespace: String, name: String },
    /// NodePool instance: decrement only (the ledger key names the instance, which the
    /// pool's reconciler removes).
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
        ngo_index::capi::scale_down::request_id(&self.instance)
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
        let result = self
            .lower_target(snapshot, group, delta, existing, deadline)
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

    /// DecreaseTargetSize's write: (replicas before, after).
    async fn lower_target(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        delta: i32,
        existing: usize,
        deadline: &MutationDeadline,
    ) -> Result<(i32, i32), ActuateError> {
        // Cluster API would delete an annotated running machine instead of the unregistered
        // instance CA means.
        let foreign = foreign_delete_marks(snapshot, group, &[]);
        if !foreign.is_empty() {
            return Err(ActuateError::ForeignDeleteMark {
                group: group.id.clone(),
                machines: foreign.join(", "),
            });
        }
        let _guard = self.lock_until(group, deadline).await?;
        self.change_replicas(group, deadline, |current| {
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
        .await
    }

    /// Deletes specific nodes: for each Machine, claims it in the group's ledger, marks it,
    /// then lowers replicas by one (releasing the claim when that fails); for each pool
    /// instance without a Machine, lowers replicas and records it in one write. Machines
    /// already deleting, or whose decrement the ledger already records, need nothing; the
    /// same node twice in one request counts once.
    pub async fn delete_nodes(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        nodes: &[NodeRef],
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<Deleted, ActuateError> {
        let result = self
            .delete_all(snapshot, group, nodes, request, deadline)
            .await;
        let names: Vec<&str> = nodes.iter().map(NodeRef::id).collect();
        self.report(group, "ScaleDown", Direction::Down, &result, |deleted| {
            let mut note = format!(
                "deleting {} of {} node(s): {}",
                deleted.removed,
                nodes.len(),
                names.join(", ")
            );
            if !deleted.in_doubt.is_empty() {
                note.push_str(&format!(
                    "; answered OK in doubt, cluster-autoscaler keeps them tainted and names them again: {}",
                    deleted.in_doubt.join("; ")
                ));
            }
            note
        });
        result
    }

    async fn delete_all(
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
        let named: Vec<String> = removals.iter().map(Removal::ledger_key).collect();
        let foreign = foreign_delete_marks(snapshot, group, &named);
        if !foreign.is_empty() {
            let error = ActuateError::ForeignDeleteMark {
                group: group.id.clone(),
                machines: foreign.join(", "),
            };
            // A named machine that already carries our mark keeps it (an error would let CA
            // untaint a machine that may go): OK in doubt, nothing lowered.
            let ours = |r: &Removal| match r {
                Removal::Machine { namespace, name } => snapshot
                    .machines
                    .get(&format!("{namespace}/{name}"))
                    .and_then(|m| m.scale_down.as_ref().map(|mark| mark.is_mark()))
                    .unwrap_or(false),
                Removal::PoolReplica { .. } => false,
            };
            if !removals.iter().any(ours) {
                return Err(error);
            }
            tracing::warn!(group = %group.id, %error, "answering OK in doubt: a named machine carries an earlier mark");
            return Ok(Deleted {
                in_doubt: named.iter().map(|key| format!("{key}: {error}")).collect(),
                ..Deleted::default()
            });
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
        for (done, removal) in removals.iter().enumerate() {
            if let Err(error) = self
                .remove(snapshot, group, removal, request, deadline, &mut deleted)
                .await
            {
                if done == 0 {
                    return Err(error);
                }
                // cluster-autoscaler untaints every node of the batch on an error, and the
                // earlier ones go (lowered, already applied, deleting) or may (in doubt): OK
                // it is, and the nodes not removed stay tainted until CA names them again.
                let rest: Vec<String> = removals[done..].iter().map(Removal::ledger_key).collect();
                tracing::warn!(group = %group.id, %error, not_removed = ?rest,
                    "a later node of the batch failed after earlier ones were settled; answering OK");
                deleted
                    .in_doubt
                    .extend(rest.into_iter().map(|key| format!("{key}: {error}")));
                break;
            }
        }
        Ok(deleted)
    }

    /// Removes one node of a DeleteNodes batch, recording the outcome in `deleted`.
    async fn remove(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        removal: &Removal,
        request: &str,
        deadline: &MutationDeadline,
        deleted: &mut Deleted,
    ) -> Result<(), ActuateError> {
        if !deadline.may_answer() {
            return Err(ActuateError::DeadlineExceeded {
                group: group.id.clone(),
                step: format!("removing {}", removal.ledger_key()),
            });
        }
        match removal {
            Removal::PoolReplica { provider_id } => {
                let _guard = self.lock_until(group, deadline).await?;
                let key = removal.ledger_key();
                let (target, by) = self
                    .decrement_pool_instance(snapshot, group, &key, request, deadline)
                    .await?;
                if by.as_deref() == Some(request) {
                    deleted.removed += 1;
                }
                deleted.target = target.or(deleted.target);
                deleted.pool_removals.push((provider_id.clone(), by));
            }
            Removal::Machine { name, .. } => {
                match self
                    .remove_one(snapshot, group, name, request, deadline)
                    .await?
                {
                    Removed::Lowered(to) => {
                        deleted.removed += 1;
                        deleted.target = Some(to);
                    }
                    Removed::AlreadyApplied | Removed::Deleting => {}
                    Removed::InDoubt(why) => {
                        tracing::warn!(group = %group.id, machine = %name, why,
                                "answering OK in doubt: cluster-autoscaler keeps the node tainted and names it again later");
                        deleted.in_doubt.push(format!("{name}: {why}"));
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes one Machine, waiting (without this group's lock) while another request holds
    /// the group's claim.
    async fn remove_one(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        name: &str,
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<Removed, ActuateError> {
        loop {
            let guard = self.lock_until(group, deadline).await?;
            match self
                .remove_machine(snapshot, group, name, request, deadline)
                .await
            {
                Attempt::Finished(result) => return result,
                Attempt::Busy { error, in_doubt } => {
                    drop(guard);
                    if deadline.answer_remaining() < BUSY_POLL {
                        if in_doubt {
                            return Ok(Removed::InDoubt(error.to_string()));
                        }
                        return Err(error);
                    }
                    tracing::debug!(group = %group.id, busy = %error, "waiting for the group's scale-down claim");
                    tokio::time::sleep(BUSY_POLL).await;
                }
            }
        }
    }

    /// Lowers replicas for a pool instance without a Machine and records it in the ledger, in
    /// one write. Returns the replicas after (when this request lowered them) and the
    /// request the ledger records the instance under. A write whose reply was lost is found
    /// in the ledger by reading it again.
    async fn decrement_pool_instance(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        key: &str,
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<(Option<i32>, Option<String>), ActuateError> {
        let now = jiff::Timestamp::now().as_second();
        let target = GroupKey::of(group);
        let written = self
            .update_group(
                &target,
                &format!("lowering the replicas for {key}"),
                Some(deadline),
                |replicas, ledger| {
                    let exists = |k: &str| still_exists(snapshot, group, k);
                    Ok(
                        match protocol::decrement_unmarked(
                            replicas, ledger, key, request, group.min, now, exists,
                        ) {
                            Decrement::Write {
                                replicas: lowered,
                                ledger,
                            } => GroupStep::Write(
                                lowered,
                                ledger,
                                Ok((Some(lowered), Some(request.to_string()))),
                            ),
                            Decrement::Applied { by } => GroupStep::Done(Ok((None, Some(by)))),
                            Decrement::BelowMin { desired } => {
                                GroupStep::Done(Err(ActuateError::BelowMin {
                                    group: group.id.clone(),
                                    desired,
                                    min: group.min,
                                }))
                            }
                            Decrement::Fenced => GroupStep::Done(Ok((None, None))),
                        },
                    )
                },
            )
            .await;
        match written {
            Ok(outcome) => outcome,
            Err(error @ ActuateError::Api { .. }) => {
                // The write may have been committed with its reply lost.
                let Ok((_, ledger)) = self.live_state(group).await else {
                    return Err(error);
                };
                if ledger.get(key).is_some_and(|e| e.request == request) {
                    Ok((None, Some(request.to_string())))
                } else {
                    Err(error)
                }
            }
            Err(error) => Err(error),
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
        match snapshot.group_for_provider_id(id, Some(&group.cluster)) {
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
        if let Some(machine) = snapshot.machine_for_provider_id(id, &group.cluster) {
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
            // Nothing in Cluster API reads which instance a MachinePool decrement was for: the
            // infrastructure provider would remove one of its own choosing. CA's in-tree
            // provider refuses the same way ("unknown machine for node").
            return Err(ActuateError::NoMachineForInstance {
                node: id.into(),
                group: group.id.clone(),
            });
        }
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

    /// The group's lock, waited for only while the request may still answer.
    async fn lock_until(
        &self,
        group: &NodeGroup,
        deadline: &MutationDeadline,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, ActuateError> {
        tokio::time::timeout(deadline.answer_remaining(), self.lock(&group.id))
            .await
            .map_err(|_| ActuateError::DeadlineExceeded {
                group: group.id.clone(),
                step: "waiting for another request of this replica on the group".into(),
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

/// What the sweeper did with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// The decrement had happened; the mark's record (and our finalizer) was cleared.
    Completed,
    /// The claim was released and the mark rolled back.
    RolledBack,
    /// Cluster API was deleting the machine under the mark; the decrement was applied.
    RolledForward,
    /// An old released record was removed, or nothing was to be done any more.
    Unchanged,
}

impl From<Released> for Resolution {
    fn from(released: Released) -> Self {
        match released {
            Released::Applied => Resolution::Completed,
            Released::RolledBack => Resolution::RolledBack,
            Released::RolledForward => Resolution::RolledForward,
        }
    }
}

/// Seconds of clock difference between replicas the sweeper allows by default before it
/// takes a claim or mark for expired (deadlines are written by one replica's clock and read
/// by another's).
pub const CLOCK_MARGIN_SECS: i64 = 30;

impl CapiActuator {
    /// Releases `group`'s expired claim on machine `key` for `request` (see
    /// [`crate::actuate::sweeper`]); `min` is the group's minimum, for a roll-forward.
    pub async fn release_expired_claim(
        &self,
        group: &GroupKey,
        min: Option<i32>,
        key: &str,
        request: &str,
        until: i64,
    ) -> Result<Resolution, ActuateError> {
        let mark = ScaleDownMark {
            request: request.to_string(),
            group: group.id.clone(),
            deadline: until,
            preexisting: false,
            released: false,
        };
        let released = self.release(group, min, key, &mark, None).await?;
        if released == Released::RolledBack {
            tracing::warn!(machine = key, request, group = %group.id,
                "released an expired scale-down claim (its request ended before lowering replicas)");
            self.report_rollback(&group.namespace, key, &mark);
        }
        Ok(released.into())
    }

    /// Removes our finalizer from Machine `namespace/name` of `group` when it carries no
    /// scale-down record (removed by hand, or a write cut short) and no claim of the group
    /// names it: nothing else would remove it, and Cluster API could never finish deleting
    /// the Machine. A claim naming it is left to its release.
    pub async fn drop_stray_finalizer(
        &self,
        namespace: &str,
        name: &str,
        group: Option<&str>,
    ) -> Result<Resolution, ActuateError> {
        if let Some(group) = group.and_then(GroupKey::parse)
            && self
                .ledger_of(&group)
                .await?
                .is_some_and(|l| l.entry(name).is_some_and(|e| e.is_claim()))
        {
            return Ok(Resolution::Unchanged);
        }
        self.update_machine(namespace, name, None, |machine| {
            Ok(match machine {
                Some(m) if m.finalizer && m.mark.is_none() => marks::MachineStep::Write(
                    marks::MachinePatch {
                        finalizer: Some(false),
                        ..marks::MachinePatch::default()
                    },
                    Resolution::Completed,
                ),
                _ => marks::MachineStep::Done(Resolution::Unchanged),
            })
        })
        .await
    }

    /// Resolves the record `mark` on Machine `namespace/name` against its group's ledger:
    /// clears it once the decrement is applied, releases a mark whose request holds no
    /// claim once it expired, and removes old released records. `min`: the minimum of the
    /// mark's group, for a roll-forward (`None`: not served).
    pub async fn resolve_mark(
        &self,
        namespace: &str,
        name: &str,
        mark: &ScaleDownMark,
        min: Option<i32>,
        margin: i64,
    ) -> Result<Resolution, ActuateError> {
        let now = jiff::Timestamp::now().as_second();
        let group = GroupKey::parse(&mark.group);
        let entry = match &group {
            Some(group) => self
                .ledger_of(group)
                .await?
                .and_then(|l| l.entry(name).cloned()),
            None => None,
        };
        match protocol::sweep_mark(mark, entry.as_ref(), now, margin) {
            protocol::Sweep::Keep => Ok(Resolution::Unchanged),
            protocol::Sweep::ClearRecord => {
                self.clear_record(namespace, name, &mark.request, false)
                    .await?;
                Ok(Resolution::Completed)
            }
            protocol::Sweep::RemoveRecord => {
                self.clear_record(namespace, name, &mark.request, true)
                    .await?;
                Ok(Resolution::Unchanged)
            }
            protocol::Sweep::Release { .. } => match group {
                Some(group) => {
                    let released = self.release(&group, min, name, mark, None).await?;
                    if released == Released::RolledBack {
                        tracing::warn!(machine = name, namespace, request = %mark.request, group = %mark.group,
                            "rolled back a stranded deletion mark (its request ended before lowering replicas)");
                        self.report_rollback(namespace, name, mark);
                    }
                    Ok(released.into())
                }
                // A mark naming no group we know: its request cannot complete.
                None => {
                    self.clear_record(namespace, name, &mark.request, true)
                        .await?;
                    Ok(Resolution::RolledBack)
                }
            },
        }
    }

    /// Removes `request`'s record (mark, or released record when `released`) and our
    /// finalizer from Machine `namespace/name`; a mark's delete-machine annotation stays
    /// (its decrement is applied), and so does anything another request wrote since.
    async fn clear_record(
        &self,
        namespace: &str,
        name: &str,
        request: &str,
        released: bool,
    ) -> Result<(), ActuateError> {
        self.update_machine(namespace, name, None, |machine| {
            let ours = machine
                .and_then(|m| m.mark.as_ref())
                .is_some_and(|m| m.request == request && m.released == released);
            Ok(if ours {
                marks::MachineStep::Write(
                    marks::MachinePatch {
                        record: Some(None),
                        delete_annotation: None,
                        finalizer: Some(false),
                        fence: None,
                    },
                    (),
                )
            } else {
                marks::MachineStep::Done(())
            })
        })
        .await
    }

    /// The ledger of `group`, read live; `None` when its resource does not exist.
    async fn ledger_of(
        &self,
        group: &GroupKey,
    ) -> Result<Option<ngo_index::capi::scale_down::Ledger>, ActuateError> {
        if self.resources.scalable(group.kind).is_none() {
            return Ok(None);
        }
        let object = self
            .scalable(group.kind, &group.namespace)
            .get_opt(&group.name)
            .await
            .map_err(ActuateError::api(format!("reading {}", group.id)))?;
        object
            .map(|o| replicas::read_ledger(&group.id, &o))
            .transpose()
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

/// Machines of `group` not being deleted, other than those `named` (by name), that carry the
/// delete-machine annotation without this operator's live mark: a person's, or left by another
/// autoscaler. Cluster API deletes them first when replicas drop, whatever a decrement was for.
fn foreign_delete_marks(snapshot: &Snapshot, group: &NodeGroup, named: &[String]) -> Vec<String> {
    let mut found: Vec<String> = group
        .instances
        .iter()
        .filter(|i| i.state != InstanceState::Deleting)
        .filter_map(|i| snapshot.machines.get(i.machine.as_deref()?))
        .filter(|m| !m.deleting && m.marked_for_deletion && !named.contains(&m.name))
        .filter(|m| !m.scale_down.as_ref().is_some_and(|mark| mark.is_mark()))
        .map(|m| format!("{}/{}", m.namespace, m.name))
        .collect();
    found.sort();
    found.dedup();
    found
}
