//! Marking Machines for deletion: Cluster API's delete-machine annotation, which makes the
//! MachineSet controller delete that Machine first when replicas drop, plus our
//! [`ScaleDownMark`] saying which request set it. Both are written in one compare-and-swap.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::CapiActuator;
use crate::actuate::deadline::{MutationDeadline, conflict_backoff};
use crate::actuate::error::ActuateError;
use crate::capi::scale_down::{MARK_ANNOTATION, ScaleDownMark};

/// What marking found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marked {
    /// The Machine now carries our mark.
    Ours,
    /// The Machine is being deleted already: nothing to do.
    Deleting,
    /// Another request that may still complete holds the mark (its id).
    Busy(String),
}

impl CapiActuator {
    /// Marks Machine `namespace/name` for deletion on behalf of `mark.request`. A mark of
    /// another request that may still complete is left alone ([`Marked::Busy`]); a mark of
    /// an expired or unknown request is replaced by ours.
    pub(super) async fn mark_machine(
        &self,
        namespace: &str,
        name: &str,
        mark: &ScaleDownMark,
        deadline: &MutationDeadline,
    ) -> Result<Marked, ActuateError> {
        let api = self.machines(namespace);
        let mut attempt = 0;
        loop {
            let machine = api.get(name).await.map_err(ActuateError::api(format!(
                "reading Machine {namespace}/{name}"
            )))?;
            if machine.metadata.deletion_timestamp.is_some() {
                return Ok(Marked::Deleting);
            }
            let annotations = machine.metadata.annotations.clone().unwrap_or_default();
            let theirs = annotations
                .get(MARK_ANNOTATION)
                .and_then(|v| ScaleDownMark::parse(v))
                .filter(|m| m.request != mark.request);
            let now = jiff::Timestamp::now().as_second();
            if let Some(other) = theirs.as_ref().filter(|m| !m.expired(now)) {
                return Ok(Marked::Busy(other.request.clone()));
            }
            if !deadline.may_start() {
                return Err(ActuateError::DeadlineExceeded {
                    group: mark.group.clone(),
                    step: format!("marking Machine {namespace}/{name}"),
                });
            }
            let delete_key = &self.keys.delete_machine;
            let preexisting = match &theirs {
                // Taking over an expired request's mark: keep what it knew.
                Some(expired) => expired.preexisting,
                None => {
                    annotations.contains_key(delete_key)
                        && !annotations.contains_key(MARK_ANNOTATION)
                }
            };
            let ours = ScaleDownMark {
                preexisting,
                ..mark.clone()
            };
            let delete_value = annotations
                .get(delete_key)
                .cloned()
                .unwrap_or_else(|| jiff::Timestamp::now().to_string());
            let patch = json!({
                "metadata": {
                    "resourceVersion": machine.metadata.resource_version,
                    "annotations": {
                        delete_key: delete_value,
                        MARK_ANNOTATION: ours.to_annotation()
                    }
                }
            });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(Marked::Ours),
                // Cluster API rewrites Machines often (status, conditions); a conflict means
                // "decide again on the newer object", never "give up".
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    tracing::debug!(
                        machine = name,
                        attempt,
                        "Machine changed while marking it; retrying"
                    );
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Marked::Deleting),
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("marking Machine {namespace}/{name} for deletion"),
                        source,
                    });
                }
            }
        }
    }

    /// Removes the mark of `request` from Machine `namespace/name` (and the delete-machine
    /// annotation, unless it was there before). Leaves a Machine alone whose mark belongs to
    /// another request. Returns whether a mark was removed.
    pub async fn unmark_machine(
        &self,
        namespace: &str,
        name: &str,
        request: &str,
    ) -> Result<bool, ActuateError> {
        let api = self.machines(namespace);
        let mut attempt = 0;
        loop {
            let machine = match api.get(name).await {
                Ok(m) => m,
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("reading Machine {namespace}/{name}"),
                        source,
                    });
                }
            };
            let annotations = machine.metadata.annotations.clone().unwrap_or_default();
            let Some(mark) = annotations
                .get(MARK_ANNOTATION)
                .and_then(|v| ScaleDownMark::parse(v))
                .filter(|m| m.request == request)
            else {
                return Ok(false);
            };
            let mut remove = serde_json::Map::new();
            remove.insert(MARK_ANNOTATION.into(), Value::Null);
            if !mark.preexisting {
                remove.insert(self.keys.delete_machine.clone(), Value::Null);
            }
            let patch = json!({
                "metadata": {
                    "resourceVersion": machine.metadata.resource_version,
                    "annotations": remove
                }
            });
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                    if attempt > 50 {
                        return Err(ActuateError::MachineConflict {
                            machine: format!("{namespace}/{name}"),
                            attempts: attempt,
                        });
                    }
                }
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!(
                            "rolling back the deletion mark of Machine {namespace}/{name}"
                        ),
                        source,
                    });
                }
            }
        }
    }

    /// Removes only our record of `request` from a Machine whose decrement happened: the
    /// delete-machine annotation stays for Cluster API. Returns whether it was there.
    pub(super) async fn clear_record(
        &self,
        namespace: &str,
        name: &str,
        request: &str,
    ) -> Result<bool, ActuateError> {
        let api = self.machines(namespace);
        let machine = match api.get(name).await {
            Ok(m) => m,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(false),
            Err(source) => {
                return Err(ActuateError::Api {
                    action: format!("reading Machine {namespace}/{name}"),
                    source,
                });
            }
        };
        let ours = machine
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MARK_ANNOTATION))
            .and_then(|v| ScaleDownMark::parse(v))
            .is_some_and(|m| m.request == request);
        if !ours {
            return Ok(false);
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": machine.metadata.resource_version,
                "annotations": { MARK_ANNOTATION: null }
            }
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(true),
            // Changed meanwhile: the next sweep looks again.
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
            Err(source) => Err(ActuateError::Api {
                action: format!("clearing the scale-down record of Machine {namespace}/{name}"),
                source,
            }),
        }
    }

    pub(super) fn machines(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &self.resources.machines)
    }
}
