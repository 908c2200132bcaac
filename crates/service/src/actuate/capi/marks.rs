//! Compare-and-swap writes of a Machine's scale-down metadata: Cluster API's delete-machine
//! annotation (which makes the MachineSet controller delete that Machine first when replicas
//! drop), our [`ScaleDownMark`] record and our [`FINALIZER`]. What to write is decided by
//! [`ngo_index::capi::scale_down::protocol`] on the Machine as read; this module reads, writes
//! with the read `resourceVersion`, and decides again on a conflict.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Map, Value, json};

use super::actuator::CapiActuator;
use super::replicas::GroupKey;
use crate::actuate::deadline::{MutationDeadline, conflict_backoff};
use crate::actuate::error::ActuateError;
use ngo_index::capi::groups::InstanceState;
use ngo_index::capi::scale_down::protocol::{self, MachineState};
use ngo_index::capi::scale_down::{FENCE_ANNOTATION, FINALIZER, MARK_ANNOTATION, ScaleDownMark};
use ngo_index::index::{NodeGroup, Snapshot};

/// Conflicts in a row after which a Machine write gives up (Cluster API rewrites Machines
/// often, so a few are normal).
const MAX_CONFLICTS: u32 = 50;

/// A change to a Machine's scale-down metadata.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct MachinePatch {
    /// Our record (`None`: leave it; `Some(None)`: remove it).
    pub record: Option<Option<ScaleDownMark>>,
    /// The delete-machine annotation (`None`: leave it; `Some(false)`: remove it;
    /// `Some(true)`: set it, keeping a value already there).
    pub delete_annotation: Option<bool>,
    /// Our finalizer (`None`: leave it).
    pub finalizer: Option<bool>,
    /// The request to record in [`FENCE_ANNOTATION`] (`None`: leave it).
    pub fence: Option<String>,
}

/// What a decision on a Machine comes to.
pub(super) enum MachineStep<T> {
    /// Write this patch, then return `.1`.
    Write(MachinePatch, T),
    /// Write `patch` and return `then` only if `group`'s ledger, read after the Machine,
    /// shows `request`'s live claim on it ([`protocol::may_take_over`]); else write nothing
    /// and return `otherwise`. The write still carries the Machine's version read first.
    WriteIfClaimed {
        /// The group whose ledger holds the claim.
        group: GroupKey,
        /// The request that must hold it.
        request: String,
        /// What to write.
        patch: MachinePatch,
        /// Returned after the write.
        then: T,
        /// Returned when the claim is not the request's.
        otherwise: T,
    },
    /// Nothing to write: return this.
    Done(T),
}

/// The protocol's view of a Machine object.
pub(super) fn machine_state(machine: &DynamicObject, delete_key: &str) -> MachineState {
    let annotations = machine.metadata.annotations.as_ref();
    MachineState {
        deleting: machine.metadata.deletion_timestamp.is_some(),
        delete_annotation: annotations.is_some_and(|a| a.contains_key(delete_key)),
        finalizer: machine
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == FINALIZER)),
        mark: annotations
            .and_then(|a| a.get(MARK_ANNOTATION))
            .and_then(|v| ScaleDownMark::parse(v)),
    }
}

impl CapiActuator {
    /// Reads Machine `namespace/name`, lets `decide` choose what to write from what was read
    /// (`None`: the Machine does not exist), and writes it with the read `resourceVersion`;
    /// on a conflict, reads and decides again. `deadline`, when given, bounds the writes
    /// (a mutation's finish time); the sweeper passes none.
    pub(super) async fn update_machine<T>(
        &self,
        namespace: &str,
        name: &str,
        deadline: Option<&MutationDeadline>,
        mut decide: impl FnMut(Option<&MachineState>) -> Result<MachineStep<T>, ActuateError>,
    ) -> Result<T, ActuateError> {
        let api = self.machines(namespace);
        let delete_key = self.keys.delete_machine.as_str();
        let mut attempt = 0;
        loop {
            let read = std::time::Instant::now();
            let machine = api.get_opt(name).await.map_err(ActuateError::api(format!(
                "reading Machine {namespace}/{name}"
            )))?;
            // The write goes the same way as this read: it takes about as long.
            let round_trip = read.elapsed();
            let state = machine.as_ref().map(|m| machine_state(m, delete_key));
            let (patch, then) = match decide(state.as_ref())? {
                MachineStep::Done(then) => return Ok(then),
                MachineStep::Write(patch, then) => (patch, then),
                MachineStep::WriteIfClaimed {
                    group,
                    request,
                    patch,
                    then,
                    otherwise,
                } => {
                    // Read after the Machine: a claim live now was live when it was read.
                    let claimed = self
                        .ledger_of(&group)
                        .await?
                        .is_some_and(|ledger| protocol::may_take_over(&ledger, name, &request));
                    if !claimed {
                        return Ok(otherwise);
                    }
                    (patch, then)
                }
            };
            let Some(machine) = machine else {
                return Ok(then);
            };
            if deadline.is_some_and(|d| !d.may_answer_within(round_trip)) {
                return Err(ActuateError::DeadlineExceeded {
                    group: format!("Machine {namespace}/{name}"),
                    step: "writing its scale-down mark".into(),
                });
            }
            let body = self.machine_patch_body(&machine, &patch);
            let write = std::time::Instant::now();
            let written = api
                .patch(name, &PatchParams::default(), &Patch::Merge(&body))
                .await;
            if let Some(deadline) = deadline {
                deadline.wrote(write.elapsed());
            }
            match written {
                Ok(_) => return Ok(then),
                // A conflict means "decide again on the newer object", never "give up".
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    if attempt >= MAX_CONFLICTS {
                        return Err(ActuateError::MachineConflict {
                            machine: format!("{namespace}/{name}"),
                            attempts: attempt,
                        });
                    }
                    tracing::debug!(
                        machine = name,
                        attempt,
                        "Machine changed meanwhile; deciding again"
                    );
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                }
                // Deleted meanwhile: decide again on its absence.
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    attempt += 1;
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!(
                            "writing the scale-down mark of Machine {namespace}/{name}"
                        ),
                        source,
                    });
                }
            }
        }
    }

    /// The merge patch for `patch` on `machine`, guarded by its `resourceVersion`.
    fn machine_patch_body(&self, machine: &DynamicObject, patch: &MachinePatch) -> Value {
        let delete_key = &self.keys.delete_machine;
        let mut annotations = Map::new();
        if let Some(record) = &patch.record {
            let value = record
                .as_ref()
                .map_or(Value::Null, |r| Value::String(r.to_annotation()));
            annotations.insert(MARK_ANNOTATION.into(), value);
        }
        match patch.delete_annotation {
            Some(true) => {
                let current = machine
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(delete_key).cloned());
                let value = current.unwrap_or_else(|| jiff::Timestamp::now().to_string());
                annotations.insert(delete_key.clone(), Value::String(value));
            }
            Some(false) => {
                annotations.insert(delete_key.clone(), Value::Null);
            }
            None => {}
        }
        if let Some(request) = &patch.fence {
            annotations.insert(FENCE_ANNOTATION.into(), Value::String(request.clone()));
        }
        let mut metadata = Map::new();
        metadata.insert(
            "resourceVersion".into(),
            json!(machine.metadata.resource_version),
        );
        if !annotations.is_empty() {
            metadata.insert("annotations".into(), Value::Object(annotations));
        }
        if let Some(want) = patch.finalizer {
            // A merge patch replaces the list: the resourceVersion guards the others'.
            let mut finalizers = machine.metadata.finalizers.clone().unwrap_or_default();
            finalizers.retain(|f| f != FINALIZER);
            if want {
                finalizers.push(FINALIZER.to_string());
            }
            metadata.insert("finalizers".into(), json!(finalizers));
        }
        json!({ "metadata": metadata })
    }

    pub(super) fn machines(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.resources.machines)
    }
}

/// Machines of `group` not being deleted, other than those `named` (by name), that carry the
/// delete-machine annotation without this operator's live mark: a person's, or left by another
/// autoscaler. Cluster API deletes them first when replicas drop, whatever a decrement was for.
pub(super) fn foreign_delete_marks(
    snapshot: &Snapshot,
    group: &NodeGroup,
    named: &[String],
) -> Vec<String> {
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
