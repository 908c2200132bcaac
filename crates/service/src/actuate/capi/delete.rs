//! DeleteNodes: which removal each named node means (a Machine to mark, or a pool instance
//! to decrement for), then each removal in turn, reported as one outcome.

use super::actuator::CapiActuator;
use super::marks::foreign_delete_marks;
use super::replicas::{GroupKey, GroupStep, still_exists};
use super::scale_down::{Attempt, Removed};
use crate::actuate::activity::Direction;
use crate::actuate::deadline::MutationDeadline;
use crate::actuate::error::ActuateError;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::pool_instance_key;
use ngo_index::capi::scale_down::protocol::{self, Decrement};
use ngo_index::index::{NodeGroup, NodeGroupLookup, Snapshot};

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
    /// Names of the group's Machines this request lowered replicas for, which still carry
    /// our scale-down finalizer ([`CapiActuator::release_finalizers`] takes it off).
    pub lowered_machines: Vec<String>,
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

impl CapiActuator {
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
                        deleted.lowered_machines.push(name.clone());
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
}
