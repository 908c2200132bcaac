//! Replica writes on MachineDeployments, MachineSets and MachinePools. Every write is a
//! compare-and-swap on the object's `resourceVersion`, retried on conflict while the
//! mutation's deadline allows.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::CapiActuator;
use crate::actuate::deadline::{MutationDeadline, conflict_backoff};
use crate::actuate::error::ActuateError;
use crate::capi::scale_down::{LEDGER_ANNOTATION, Ledger};
use crate::index::{NodeGroup, Snapshot};

/// Outcome of a decrement for one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decrement {
    /// Replicas went from `.0` to `.1`, and the ledger records the machine.
    Applied(i32, i32),
    /// The ledger already records this machine: an earlier or concurrent request lowered
    /// replicas for it (replicas now `.0`).
    AlreadyApplied(i32),
}

impl CapiActuator {
    /// Reads `/scale`, computes the new replicas and writes them back with the read
    /// resourceVersion; retries on conflict until `deadline` stops new writes. Returns (old,
    /// new).
    pub(super) async fn change_replicas(
        &self,
        group: &NodeGroup,
        deadline: &MutationDeadline,
        desired: impl Fn(i32) -> Result<i32, ActuateError>,
    ) -> Result<(i32, i32), ActuateError> {
        let api = self.scalable(group);
        let mut attempt = 0;
        loop {
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
            if !deadline.may_start() {
                return Err(ActuateError::DeadlineExceeded {
                    group: group.id.clone(),
                    step: "changing replicas".into(),
                });
            }
            match api
                .replace_scale(&group.name, &PostParams::default(), &scale)
                .await
            {
                Ok(_) => return Ok((current, new)),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    tracing::debug!(group = %group.id, attempt, "replica change conflicted; retrying");
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("writing the scale of {}", group.id),
                        source,
                    });
                }
            }
        }
    }

    /// Lowers replicas by one for machine `key` (a Machine name, or a MachinePool instance's
    /// [`crate::capi::scale_down::pool_instance_key`]), recording `key` in the group's ledger
    /// in the same compare-and-swap. Never decrements twice for one key.
    pub(super) async fn decrement_for(
        &self,
        snapshot: &Snapshot,
        group: &NodeGroup,
        key: &str,
        request: &str,
        deadline: &MutationDeadline,
    ) -> Result<Decrement, ActuateError> {
        let api = self.scalable(group);
        let mut attempt = 0;
        loop {
            let object = api
                .get(&group.name)
                .await
                .map_err(ActuateError::api(format!("reading {}", group.id)))?;
            let current = replicas_of(&object);
            let mut ledger = Ledger::parse(ledger_of(&object));
            if ledger.get(key).is_some() {
                return Ok(Decrement::AlreadyApplied(current));
            }
            let desired = i64::from(current) - 1;
            if desired < i64::from(group.min) {
                return Err(ActuateError::BelowMin {
                    group: group.id.clone(),
                    desired,
                    min: group.min,
                });
            }
            let now = jiff::Timestamp::now().as_second();
            ledger.record(key, request, now, |k| still_exists(snapshot, group, k));
            if !deadline.may_finish() {
                return Err(ActuateError::DeadlineExceeded {
                    group: group.id.clone(),
                    step: format!("lowering replicas for {key}"),
                });
            }
            let patch = json!({
                "metadata": {
                    "resourceVersion": object.metadata.resource_version,
                    "annotations": { LEDGER_ANNOTATION: ledger.to_annotation() }
                },
                "spec": { "replicas": desired }
            });
            match api
                .patch(&group.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Decrement::Applied(current, desired as i32)),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    tracing::debug!(group = %group.id, attempt, "decrement conflicted; retrying");
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("lowering the replicas of {}", group.id),
                        source,
                    });
                }
            }
        }
    }

    /// The group's live `spec.replicas` and ledger.
    pub(super) async fn live_state(
        &self,
        group: &NodeGroup,
    ) -> Result<(i32, Ledger), ActuateError> {
        let object = self
            .scalable(group)
            .get(&group.name)
            .await
            .map_err(ActuateError::api(format!("reading {}", group.id)))?;
        Ok((replicas_of(&object), Ledger::parse(ledger_of(&object))))
    }

    pub(super) fn scalable(&self, group: &NodeGroup) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            &group.namespace,
            self.api_resource(group.kind),
        )
    }
}

/// `spec.replicas`; missing means zero, as for `/scale`.
fn replicas_of(object: &DynamicObject) -> i32 {
    object.data["spec"]["replicas"]
        .as_i64()
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(0)
}

fn ledger_of(object: &DynamicObject) -> Option<&str> {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEDGER_ANNOTATION))
        .map(String::as_str)
}

/// Whether the machine behind ledger key `key` still exists, as far as the snapshot knows.
fn still_exists(snapshot: &Snapshot, group: &NodeGroup, key: &str) -> bool {
    match key.strip_prefix("pid:") {
        Some(pid) => group.provider_id_list.iter().flatten().any(|p| p == pid),
        None => snapshot
            .machines
            .contains_key(&format!("{}/{key}", group.namespace)),
    }
}
