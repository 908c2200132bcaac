//! Removing one Machine for a DeleteNodes request, and releasing a request's claim: the
//! steps of [`ngo_index::capi::scale_down::protocol`], each a read, a decision of that module,
//! and a compare-and-swap write. Every await may be the last of this process, and every
//! write may be committed with its reply lost: each step decides again from what it reads,
//! so a retry, the request's own release and the sweeper all converge on the same outcome.

use kube::ResourceExt;
use kube::api::{DynamicObject, ListParams};

use super::actuator::CapiActuator;
use super::marks::{MachinePatch, MachineStep};
use super::replicas::{GroupKey, GroupStep, still_exists};
use crate::actuate::deadline::MutationDeadline;
use crate::actuate::error::ActuateError;
use crate::fault;
use ngo_index::capi::groups::InstanceState;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::capi::scale_down::ScaleDownMark;
use ngo_index::capi::scale_down::protocol::{
    self, Claim, ClaimBounds, Decrement, Forget, MachineView, Mark, Release, RollForwardBounds,
    Unmark,
};
use ngo_index::index::{NodeGroup, Snapshot};

/// Tries of a failed request's release before it is left to the sweeper.
const RELEASE_ATTEMPTS: u32 = 3;
/// Pause before the next try of a release, times the tries so far.
const RELEASE_BACKOFF: std::time::Duration = std::time::Duration::from_millis(200);

/// What removing one Machine came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Removed {
    /// This request lowered replicas for it (replicas now `.0`).
    Lowered(i32),
    /// Its decrement was applied earlier (by this request, whose reply was lost, or another
    /// one) and Cluster API is deleting it or is about to.
    AlreadyApplied,
    /// The Machine is gone or deleting, not through us: nothing to do.
    Deleting,
    /// Whether the Machine goes is not known (another request for it may still lower
    /// replicas, it keeps an absorbed decrement's delete-machine annotation, or its release
    /// failed after it was marked): an error would let cluster-autoscaler untaint a node that
    /// may go, so the answer is OK and CA keeps it tainted (and names it again later).
    InDoubt(String),
}

/// What one attempt at claiming came to.
pub(super) enum Attempt {
    /// Done, one way or the other.
    Finished(Result<Removed, ActuateError>),
    /// Another request holds the group's claim: try again later, without holding the
    /// group's lock meanwhile. `in_doubt`: giving up is no error for this machine (see
    /// [`Removed::InDoubt`]).
    Busy {
        /// Why it waits.
        error: ActuateError,
        /// Giving up answers OK, in doubt.
        in_doubt: bool,
    },
}

/// What the claim step came to.
enum Claimed {
    /// The claim is this request's: mark (`absorbed`: for an absorbed decrement).
    Ours { absorbed: bool },
    /// Cluster API owes this machine's deletion already.
    Applied { by: String },
    /// Nothing was written; the answer is this.
    Finished(Result<Removed, ActuateError>),
    /// Another request holds the group's claim.
    Busy { error: ActuateError, in_doubt: bool },
}

/// What releasing a claim came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// The decrement had been applied: nothing was undone.
    Applied,
    /// The mark was removed (or never landed) and the claim dropped.
    RolledBack,
    /// Cluster API was deleting the machine under the mark: the decrement was applied.
    RolledForward,
}

impl CapiActuator {
    /// One attempt at removing Machine `namespace/name` of `group` for `request`: claim,
    /// mark, decrement (our finalizer comes off after the answer: [`Self::release_finalizers`]).
    /// A failure after the claim releases it (see
    /// [`Self::release`]); when the release finds the decrement applied (its reply was lost),
    /// the removal succeeded.
    pub(super) async fn remove_machine(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        name: &str,
        request: &str,
        deadline: &MutationDeadline,
    ) -> Attempt {
        let mark = ScaleDownMark {
            request: request.to_string(),
            group: group.id.clone(),
            deadline: deadline.finish_unix(),
            preexisting: false,
            released: false,
        };
        let target = GroupKey::of(group);
        let now = jiff::Timestamp::now().as_second();
        // Decisions that a lagging snapshot could get wrong in the unsafe direction (a pending
        // decrement taken for absorbed, an entry of a machine that still stands pruned) also
        // read the group's Machines live, and count what either read shows.
        let live = self.group_machines(&target).await;
        let view = match &live {
            Ok(machines) => machine_view(snapshot, group, name)
                .either_pending(live_machine_view(machines, name)),
            Err(error) => {
                tracing::warn!(%error, group = %group.id, "could not read the group's Machines; counting every applied decrement as pending");
                MachineView {
                    deleting: machine_view(snapshot, group, name).deleting,
                    staying: i32::MAX,
                }
            }
        };
        let live_names: Option<std::collections::BTreeSet<String>> = live
            .ok()
            .map(|machines| machines.iter().map(|m| m.name_any()).collect());
        // An applied entry is pruned only if neither read shows its machine (none, when the
        // live read failed).
        let stands = |k: &str| {
            still_exists(snapshot, group, k)
                || live_names.as_ref().is_none_or(|names| names.contains(k))
        };
        let claimed = self
            .update_group(
                &target,
                &format!("claiming Machine {name}"),
                Some(deadline),
                |replicas, ledger| {
                    let bounds = ClaimBounds {
                        min: group.min,
                        now,
                        until: mark.deadline,
                        machine: view,
                    };
                    let claim = protocol::claim(replicas, ledger, name, request, bounds, stands);
                    Ok(self.decide_claim(group, name, request, claim, replicas))
                },
            )
            .await;
        let absorbed = match claimed {
            Ok(Claimed::Ours { absorbed }) => absorbed,
            Ok(Claimed::Applied { by }) => {
                tracing::info!(group = %group.id, machine = name, by, "decrement already applied for this machine and Cluster API still owes its deletion; not lowering replicas again");
                return Attempt::Finished(Ok(Removed::AlreadyApplied));
            }
            Ok(Claimed::Finished(result)) => return Attempt::Finished(result),
            Ok(Claimed::Busy { error, in_doubt }) => return Attempt::Busy { error, in_doubt },
            // The claim may have been written, the mark not: release whatever is there.
            Err(error) => {
                return Attempt::Finished(
                    self.fail(&target, group.min, name, &mark, error, false)
                        .await,
                );
            }
        };
        if absorbed {
            tracing::info!(group = %group.id, machine = name, "the machine's earlier decrement was absorbed (replicas were raised before Cluster API acted): lowering replicas again");
        }
        fault::point("delete-nodes:after-claim").await;
        let marked = self
            .update_machine(&group.namespace, name, Some(deadline), |machine| {
                Ok(match protocol::mark(machine, &mark, absorbed) {
                    Mark::Write(ours) => MachineStep::Write(
                        MachinePatch {
                            record: Some(Some(ours)),
                            delete_annotation: Some(true),
                            finalizer: Some(true),
                            fence: None,
                        },
                        Mark::Marked,
                    ),
                    // Another request's mark: taken over only while the claim is ours.
                    Mark::Occupied(ours) => MachineStep::WriteIfClaimed {
                        group: target.clone(),
                        request: request.to_string(),
                        patch: MachinePatch {
                            record: Some(Some(ours)),
                            delete_annotation: Some(true),
                            finalizer: Some(true),
                            fence: None,
                        },
                        then: Mark::Marked,
                        otherwise: Mark::Released,
                    },
                    other => MachineStep::Done(other),
                })
            })
            .await;
        match marked {
            Ok(Mark::Marked | Mark::Write(_) | Mark::Occupied(_)) => {}
            Ok(Mark::Deleting) => {
                tracing::info!(group = %group.id, machine = name, "machine already deleting; not decrementing, releasing the claim");
                let released = self
                    .release(&target, Some(group.min), name, &mark, None)
                    .await;
                return Attempt::Finished(Ok(match released {
                    Ok(Released::Applied) => Removed::AlreadyApplied,
                    Ok(_) => Removed::Deleting,
                    Err(error) => {
                        tracing::warn!(%error, group = %group.id, machine = name, "could not release the claim; the sweeper will once it expires");
                        Removed::Deleting
                    }
                }));
            }
            Ok(Mark::Released) => {
                return Attempt::Finished(Err(self.fenced(group, name, request)));
            }
            Err(error) => {
                return Attempt::Finished(
                    self.fail(&target, group.min, name, &mark, error, true)
                        .await,
                );
            }
        }
        fault::point("delete-nodes:after-mark").await;
        let now = jiff::Timestamp::now().as_second();
        let decremented = self
            .update_group(
                &target,
                &format!("lowering the replicas for Machine {name}"),
                Some(deadline),
                |replicas, ledger| {
                    Ok(
                        match protocol::decrement(
                            replicas, ledger, name, request, group.min, now, stands,
                        ) {
                            Decrement::Write {
                                replicas: lowered,
                                ledger,
                            } => GroupStep::Write(lowered, ledger, Ok(Removed::Lowered(lowered))),
                            Decrement::Applied { .. } => {
                                GroupStep::Done(Ok(Removed::AlreadyApplied))
                            }
                            Decrement::Fenced => {
                                GroupStep::Done(Err(self.fenced(group, name, request)))
                            }
                            Decrement::BelowMin { desired } => {
                                GroupStep::Done(Err(ActuateError::BelowMin {
                                    group: group.id.clone(),
                                    desired,
                                    min: group.min,
                                }))
                            }
                        },
                    )
                },
            )
            .await;
        match decremented {
            // Our finalizer comes off after the answer is sent (see
            // [`Self::release_finalizers`]): the answer waits for no write that does not
            // decide it.
            Ok(Ok(removed)) => {
                fault::point("delete-nodes:after-decrement").await;
                Attempt::Finished(Ok(removed))
            }
            Ok(Err(refused)) | Err(refused) => Attempt::Finished(
                self.fail(&target, group.min, name, &mark, refused, true)
                    .await,
            ),
        }
    }

    /// What a claim decision comes to for the actuator. A machine that keeps an absorbed
    /// decrement's annotation, or that an earlier request may still lower replicas for, is
    /// never answered with an error: cluster-autoscaler would untaint it and let pods onto
    /// a machine that may go.
    fn decide_claim(
        &self,
        group: &NodeGroup,
        name: &str,
        request: &str,
        claim: Claim,
        replicas: i32,
    ) -> GroupStep<Claimed> {
        match claim {
            // A new scale-down would go where the rollout sends it; an absorbed one stays as
            // it is (CA keeps the node tainted and names it again after the rollout).
            Claim::Write { absorbed, .. } if let Some(why) = &group.rolling_out => {
                GroupStep::Done(Claimed::Finished(if absorbed {
                    Ok(Removed::InDoubt(format!(
                        "its earlier decrement was absorbed and the group is rolling out ({why}): not lowering replicas again until the rollout ends"
                    )))
                } else {
                    Err(ActuateError::RollingOut {
                        group: group.id.clone(),
                        why: why.clone(),
                    })
                }))
            }
            Claim::Write { ledger, absorbed } => {
                GroupStep::Write(replicas, ledger, Claimed::Ours { absorbed })
            }
            Claim::Held { absorbed } => GroupStep::Done(Claimed::Ours { absorbed }),
            Claim::Applied { by, .. } => GroupStep::Done(Claimed::Applied { by }),
            Claim::Busy {
                request: holder,
                machine,
                absorbed,
            } => {
                let in_doubt = absorbed || machine == name;
                GroupStep::Done(Claimed::Busy {
                    error: ActuateError::GroupBusy {
                        group: group.id.clone(),
                        machine,
                        request: holder,
                    },
                    in_doubt,
                })
            }
            Claim::BelowMin {
                desired,
                absorbed: true,
            } => GroupStep::Done(Claimed::Finished(Ok(Removed::InDoubt(format!(
                "its earlier decrement was absorbed and lowering replicas again would go below the minimum ({desired} < {})",
                group.min
            ))))),
            Claim::BelowMin { desired, .. } => {
                GroupStep::Done(Claimed::Finished(Err(ActuateError::BelowMin {
                    group: group.id.clone(),
                    desired,
                    min: group.min,
                })))
            }
            Claim::Fenced => {
                GroupStep::Done(Claimed::Finished(Err(self.fenced(group, name, request))))
            }
        }
    }

    /// After `error` in a removal for `mark.request`: releases its claim. The release reads
    /// the ledger first, so a decrement whose reply was lost is found applied, and the
    /// removal succeeded after all.
    /// `marked`: a mark write may have landed, so a release that fails leaves the answer in
    /// doubt rather than an error. `min`: the group's minimum, for a roll-forward.
    async fn fail(
        &self,
        group: &GroupKey,
        min: i32,
        name: &str,
        mark: &ScaleDownMark,
        error: ActuateError,
        marked: bool,
    ) -> Result<Removed, ActuateError> {
        let mut released = self.release(group, Some(min), name, mark, None).await;
        // The release is idempotent: a transient failure is worth a few more tries, as a
        // claim left behind holds the group until the sweeper releases it.
        for attempt in 1..RELEASE_ATTEMPTS {
            if released.is_ok() {
                break;
            }
            tokio::time::sleep(RELEASE_BACKOFF * attempt).await;
            released = self.release(group, Some(min), name, mark, None).await;
        }
        match released {
            Ok(Released::Applied) => {
                tracing::info!(group = %group.id, machine = name, %error,
                    "the decrement was applied although its write reported an error");
                Ok(Removed::AlreadyApplied)
            }
            Ok(Released::RolledForward) => {
                tracing::warn!(group = %group.id, machine = name, %error,
                    "Cluster API took the machine under this request's mark; its decrement was applied after all");
                Ok(Removed::AlreadyApplied)
            }
            Ok(outcome) => {
                tracing::info!(group = %group.id, machine = name, ?outcome, %error, "scale-down claim released");
                Err(error)
            }
            Err(release_error) if marked => {
                tracing::error!(group = %group.id, machine = name, %error, %release_error,
                    "could not release the scale-down claim; the sweeper will once it expires; answering OK so that cluster-autoscaler keeps the node tainted");
                Ok(Removed::InDoubt(format!(
                    "{error}; releasing its claim failed too ({release_error})"
                )))
            }
            Err(release_error) => {
                tracing::error!(group = %group.id, machine = name, %error, %release_error,
                    "could not release the scale-down claim; the sweeper will once it expires");
                Err(error)
            }
        }
    }

    /// Releases `mark.request`'s claim on Machine `name` of `group`: fences the claim, then
    /// replaces the Machine's mark with a released record (or, if Cluster API is deleting
    /// the Machine under the mark, applies the decrement after all), then drops the fenced
    /// claim. Run by a failed request and by the sweeper; `deadline` bounds the request's.
    /// `min`: the group's minimum, below which a roll-forward does not lower replicas
    /// (`None`: not known, so a roll-forward lowers nothing).
    pub async fn release(
        &self,
        group: &GroupKey,
        min: Option<i32>,
        name: &str,
        mark: &ScaleDownMark,
        deadline: Option<&MutationDeadline>,
    ) -> Result<Released, ActuateError> {
        let request = mark.request.as_str();
        let fenced = self
            .update_group(
                group,
                &format!("fencing the claim on Machine {name}"),
                deadline,
                |replicas, ledger| {
                    Ok(match protocol::release(ledger, name, request) {
                        Release::Applied { .. } => GroupStep::Done(None),
                        Release::Write { ledger, absorbed } => {
                            GroupStep::Write(replicas, ledger, Some(absorbed))
                        }
                        Release::Fenced { absorbed } => GroupStep::Done(Some(absorbed)),
                    })
                },
            )
            .await?;
        let Some(absorbed) = fenced else {
            self.unfinalize(&group.namespace, name).await;
            return Ok(Released::Applied);
        };
        fault::point("release:after-fence").await;
        let unmarked = self
            .update_machine(&group.namespace, name, deadline, |machine| {
                Ok(
                    match protocol::unmark(machine, request, mark, absorbed.as_deref()) {
                        Unmark::Write {
                            record,
                            remove_delete_annotation,
                        } => MachineStep::Write(
                            MachinePatch {
                                record: Some(Some(record)),
                                delete_annotation: remove_delete_annotation.then_some(false),
                                finalizer: Some(false),
                                fence: None,
                            },
                            false,
                        ),
                        Unmark::Touch => MachineStep::Write(
                            MachinePatch {
                                fence: Some(request.to_string()),
                                ..Default::default()
                            },
                            false,
                        ),
                        Unmark::RollForward => MachineStep::Done(true),
                        Unmark::Done => MachineStep::Done(false),
                    },
                )
            })
            .await?;
        if unmarked {
            let lowering = RollForwardBounds {
                min,
                others_annotated: self.others_annotated(group, name).await?,
            };
            let now = jiff::Timestamp::now().as_second();
            let rolled = self
                .update_group(
                    group,
                    &format!("rolling the decrement for Machine {name} forward"),
                    deadline,
                    |replicas, ledger| {
                        Ok(
                            match protocol::roll_forward(
                                replicas,
                                ledger,
                                name,
                                request,
                                lowering,
                                now,
                                |_| true,
                            ) {
                                Decrement::Write {
                                    replicas: lowered,
                                    ledger,
                                } => GroupStep::Write(lowered, ledger, true),
                                Decrement::Applied { .. } => GroupStep::Done(true),
                                Decrement::Fenced | Decrement::BelowMin { .. } => {
                                    GroupStep::Done(false)
                                }
                            },
                        )
                    },
                )
                .await?;
            if rolled {
                tracing::warn!(group = %group.id, machine = name, request,
                    "Cluster API deleted the machine under a released request's mark; its decrement was applied after all");
                self.unfinalize(&group.namespace, name).await;
                return Ok(Released::RolledForward);
            }
        }
        let applied = self
            .update_group(
                group,
                &format!("dropping the fenced claim on Machine {name}"),
                deadline,
                |replicas, ledger| {
                    Ok(match protocol::forget(ledger, name, request) {
                        Forget::Write(next) => GroupStep::Write(replicas, next, false),
                        Forget::Applied { .. } => GroupStep::Done(true),
                        Forget::Nothing => GroupStep::Done(false),
                    })
                },
            )
            .await?;
        if applied {
            tracing::warn!(group = %group.id, machine = name, request,
                "the machine's decrement was applied while this request was being released (by a sweeper, or another request); the machine goes");
            self.unfinalize(&group.namespace, name).await;
            return Ok(Released::Applied);
        }
        Ok(Released::RolledBack)
    }

    /// The Machines of `group`, read live through its Cluster API label. Machines the label
    /// misses (Cluster API hashes names longer than a label value) are not listed: callers
    /// count on the list only where a missing Machine errs on the safe side.
    async fn group_machines(&self, group: &GroupKey) -> Result<Vec<DynamicObject>, ActuateError> {
        let label = match group.kind {
            ScalableKind::MachineDeployment => "deployment-name",
            ScalableKind::MachineSet => "set-name",
            ScalableKind::MachinePool => "pool-name",
            ScalableKind::NodePool => return Ok(Vec::new()),
        };
        let selector = format!("{}/{label}={}", self.keys.group, group.name);
        let machines = self
            .machines(&group.namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(ActuateError::api(format!(
                "listing the Machines of {}",
                group.id
            )))?;
        Ok(machines.items)
    }

    /// Whether a Machine of `group` other than `name`, not being deleted, carries the
    /// delete-machine annotation, read live. One the label misses counts as none: a
    /// roll-forward then lowers nothing, which never makes Cluster API take a machine nobody
    /// chose.
    async fn others_annotated(&self, group: &GroupKey, name: &str) -> Result<bool, ActuateError> {
        Ok(self.group_machines(group).await?.iter().any(|m| {
            m.name_any() != name
                && m.metadata.deletion_timestamp.is_none()
                && m.annotations().contains_key(&self.keys.delete_machine)
        }))
    }

    /// Takes our scale-down finalizer off Machines of `namespace` that a DeleteNodes lowered
    /// replicas for (`Deleted::lowered_machines`). Run once the answer is on its way: two
    /// more round trips to the API server per Machine before answering could carry an OK past
    /// the client's deadline, which cluster-autoscaler takes for an error while the Machine
    /// goes. A Machine left with the finalizer (the operator stopped first) is the sweeper's.
    pub async fn release_finalizers(&self, namespace: &str, machines: &[String]) {
        for name in machines {
            self.unfinalize(namespace, name).await;
        }
    }

    /// Removes our finalizer from a Machine whose decrement is applied. A failure is left to
    /// the sweeper: the finalizer only delays the Machine's disappearance.
    pub(super) async fn unfinalize(&self, namespace: &str, name: &str) {
        fault::point("scale-down:before-unfinalize").await;
        let result = self
            .update_machine(namespace, name, None, |machine| {
                Ok(if protocol::unfinalize(machine) {
                    MachineStep::Write(
                        MachinePatch {
                            finalizer: Some(false),
                            ..Default::default()
                        },
                        (),
                    )
                } else {
                    MachineStep::Done(())
                })
            })
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, machine = name, namespace, "could not remove the scale-down finalizer; the sweeper will");
        }
    }

    fn fenced(&self, group: &NodeGroup, name: &str, request: &str) -> ActuateError {
        ActuateError::Fenced {
            group: group.id.clone(),
            machine: format!("{}/{name}", group.namespace),
            request: request.to_string(),
        }
    }
}

/// The named machine and its group as a live list of the group's Machines shows them: the
/// machine counts as deleting only if listed deleting (one the list misses adds nothing).
fn live_machine_view(machines: &[DynamicObject], name: &str) -> MachineView {
    let deleting = machines
        .iter()
        .any(|m| m.name_any() == name && m.metadata.deletion_timestamp.is_some());
    let staying = machines
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .count();
    MachineView {
        deleting,
        staying: i32::try_from(staying).unwrap_or(i32::MAX),
    }
}

/// The named machine and its group as the snapshot shows them: whether the machine is
/// deleting (or gone), and how many of the group's machines stay.
fn machine_view(snapshot: &Snapshot, group: &NodeGroup, name: &str) -> MachineView {
    let deleting = snapshot
        .machines
        .get(&format!("{}/{name}", group.namespace))
        .is_none_or(|m| m.deleting);
    let staying = snapshot.group(&group.id).map_or(0, |g| {
        g.instances
            .iter()
            .filter(|i| i.machine.is_some() && i.state != InstanceState::Deleting)
            .count()
    });
    MachineView {
        deleting,
        staying: i32::try_from(staying).unwrap_or(i32::MAX),
    }
}
