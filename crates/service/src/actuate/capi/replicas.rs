//! Replica writes on MachineDeployments, MachineSets and MachinePools. Every write is a
//! compare-and-swap on the object's `resourceVersion`, retried on conflict while the
//! mutation's deadline allows.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::actuator::CapiActuator;
use crate::actuate::deadline::{MutationDeadline, conflict_backoff};
use crate::actuate::error::ActuateError;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger};
use ngo_index::index::{NodeGroup, Snapshot};

/// The scalable resource behind a node group id (`<Kind>/<namespace>/<name>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupKey {
    /// The group id.
    pub id: String,
    /// Kind of the scalable resource.
    pub kind: ScalableKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl GroupKey {
    /// The key of a served group.
    pub fn of(group: &NodeGroup) -> Self {
        Self {
            id: group.id.clone(),
            kind: group.kind,
            namespace: group.namespace.clone(),
            name: group.name.clone(),
        }
    }

    /// Parses a group id; `None` for anything else.
    pub fn parse(id: &str) -> Option<Self> {
        let mut parts = id.splitn(3, '/');
        let (kind, namespace, name) = (parts.next()?, parts.next()?, parts.next()?);
        let kind = ScalableKind::ALL.into_iter().find(|k| k.as_str() == kind)?;
        (!namespace.is_empty() && !name.is_empty()).then(|| Self {
            id: id.to_string(),
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }
}

/// What a decision on a group's replicas and ledger comes to.
pub(super) enum GroupStep<T> {
    /// Write these replicas and this ledger, then return `.2`.
    Write(i32, Ledger, T),
    /// Nothing to write: return this.
    Done(T),
}

/// Conflicts in a row after which a write without a deadline (the sweeper's) gives up.
const MAX_CONFLICTS: u32 = 50;

impl CapiActuator {
    /// The ledger of `group`, read live; `None` when its resource does not exist.
    pub(super) async fn ledger_of(
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
        object.map(|o| read_ledger(&group.id, &o)).transpose()
    }

    /// Reads `/scale`, computes the new replicas and writes them back with the read
    /// resourceVersion; retries on conflict until `deadline` stops new writes. Returns (old,
    /// new).
    pub(super) async fn change_replicas(
        &self,
        group: &NodeGroup,
        deadline: &MutationDeadline,
        desired: impl Fn(i32) -> Result<i32, ActuateError>,
    ) -> Result<(i32, i32), ActuateError> {
        let api = self.scalable(group.kind, &group.namespace);
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

    /// Reads the group's scalable resource, lets `decide` choose what to write from its
    /// `spec.replicas` and ledger, and writes both with the read `resourceVersion`; on a
    /// conflict, reads and decides again. `action` (e.g. "claiming Machine m") names the
    /// write in errors. `deadline`, when given, bounds the writes; the
    /// sweeper passes none. An unreadable ledger is an error: no decision is taken on it.
    pub(super) async fn update_group<T>(
        &self,
        group: &GroupKey,
        action: &str,
        deadline: Option<&MutationDeadline>,
        mut decide: impl FnMut(i32, &Ledger) -> Result<GroupStep<T>, ActuateError>,
    ) -> Result<T, ActuateError> {
        let api = self.scalable(group.kind, &group.namespace);
        let mut attempt = 0;
        loop {
            let read = std::time::Instant::now();
            let object = api
                .get(&group.name)
                .await
                .map_err(ActuateError::api(format!("reading {}", group.id)))?;
            // The write goes the same way as this read: it takes about as long.
            let round_trip = read.elapsed();
            let current = replicas_of(&object);
            let ledger = read_ledger(&group.id, &object)?;
            let (replicas, next, then) = match decide(current, &ledger)? {
                GroupStep::Done(then) => return Ok(then),
                GroupStep::Write(replicas, next, then) => (replicas, next, then),
            };
            if deadline.is_some_and(|d| !d.may_answer_within(round_trip)) {
                return Err(ActuateError::DeadlineExceeded {
                    group: group.id.clone(),
                    step: "writing its scale-down ledger".into(),
                });
            }
            let mut patch = json!({
                "metadata": {
                    "resourceVersion": object.metadata.resource_version,
                    "annotations": { LEDGER_ANNOTATION: next.to_annotation() }
                }
            });
            if replicas != current {
                patch["spec"] = json!({ "replicas": replicas });
            }
            let write = std::time::Instant::now();
            let written = api
                .patch(&group.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            if let Some(deadline) = deadline {
                deadline.wrote(write.elapsed());
            }
            match written {
                Ok(_) => return Ok(then),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    attempt += 1;
                    if deadline.is_none() && attempt >= MAX_CONFLICTS {
                        return Err(ActuateError::ConflictRetriesExhausted {
                            group: group.id.clone(),
                            attempts: attempt,
                        });
                    }
                    tracing::debug!(group = %group.id, attempt, "group changed meanwhile; deciding again");
                    tokio::time::sleep(conflict_backoff(attempt)).await;
                }
                Err(source) => {
                    return Err(ActuateError::Api {
                        action: format!("{action} in {}", group.id),
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
            .scalable(group.kind, &group.namespace)
            .get(&group.name)
            .await
            .map_err(ActuateError::api(format!("reading {}", group.id)))?;
        Ok((replicas_of(&object), read_ledger(&group.id, &object)?))
    }

    pub(super) fn scalable(&self, kind: ScalableKind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, self.api_resource(kind))
    }
}

/// `spec.replicas`; missing means zero, as for `/scale`.
fn replicas_of(object: &DynamicObject) -> i32 {
    object.data["spec"]["replicas"]
        .as_i64()
        .and_then(|r| i32::try_from(r).ok())
        .unwrap_or(0)
}

/// The object's scale-down ledger; an unreadable one is an error naming the group.
pub(super) fn read_ledger(group: &str, object: &DynamicObject) -> Result<Ledger, ActuateError> {
    let value = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LEDGER_ANNOTATION))
        .map(String::as_str);
    Ledger::read(value).map_err(|source| ActuateError::UnreadableLedger {
        group: group.to_string(),
        source,
    })
}

/// Whether the machine behind ledger key `key` still exists, as far as the snapshot knows.
pub(super) fn still_exists(snapshot: &Snapshot, group: &NodeGroup, key: &str) -> bool {
    match key.strip_prefix("pid:") {
        Some(pid) => group.provider_id_list.iter().flatten().any(|p| p == pid),
        None => snapshot
            .machines
            .contains_key(&format!("{}/{key}", group.namespace)),
    }
}
