//! What the sweeper asks of the actuator: releasing expired claims, resolving stranded
//! marks against their group's ledger, and dropping finalizers nothing would remove.

use k8s_openapi::api::core::v1::ObjectReference;

use super::actuator::CapiActuator;
use super::marks;
use super::replicas::GroupKey;
use super::scale_down::Released;
use crate::actuate::error::ActuateError;
use crate::events::Severity;
use ngo_index::capi::scale_down::ScaleDownMark;
use ngo_index::capi::scale_down::protocol;

/// The group `id` names when it is in `namespace`, the Machine's: Cluster API's owner
/// references do not cross namespaces, so a record naming a group elsewhere was written by
/// hand (a tenant may forge one on its own Machine) and must not lead the operator there.
fn group_of_machine(id: &str, namespace: &str) -> Option<GroupKey> {
    GroupKey::parse(id).filter(|group| group.namespace == namespace)
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
        if let Some(group) = group.and_then(|g| group_of_machine(g, namespace))
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
    /// claim once it expired, and removes old released records. A mark naming a group of
    /// another namespace is no request's (a Machine and its group share one): once expired it
    /// is removed from this Machine, and nothing of that namespace is read or written. `min`: the minimum of the
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
        let group = group_of_machine(&mark.group, namespace);
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
                // A mark naming no group of this namespace: its request cannot complete.
                None => {
                    self.clear_record(namespace, name, &mark.request, mark.released)
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
