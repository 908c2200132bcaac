//! What the reconciler records about the deletions cluster-autoscaler asked for
//! (DeleteNodes, in the pool's scale-down ledger), so that the DeleteNodes call waiting for
//! them (`actuate::capi::pool_removals`) learns how each went, and the undo of a deletion
//! the backend refused.

use std::collections::HashMap;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::backend::{BackendError, BackendErrorKind, OTHER_ERROR};
use super::converge::{Decision, SeenNode};
use ngo_api::NodePool;
use ngo_api::nodepool::{
    DeletionOutcome, InstanceDeletion, InstanceErrorStatus, InstanceStateName,
};
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, pool_instance_key};
use ngo_service::events::Severity;

/// An Event to publish on the pool.
#[derive(Debug)]
pub struct Note {
    /// Normal or Warning.
    pub severity: Severity,
    /// Event reason.
    pub reason: &'static str,
    /// Event message.
    pub message: String,
}

/// What [`apply`] did.
#[derive(Debug, Default)]
pub struct Applied {
    /// At least one deletion was accepted.
    pub deleted: bool,
    /// Events to publish.
    pub notes: Vec<Note>,
    /// Nodes of servers whose deletion was rolled back: to uncordon if this operator
    /// cordoned them ([`super::drain::release`]).
    pub kept_nodes: Vec<String>,
}

/// Records what the backend made of each deletion (`outcomes` of the delete calls) on its
/// entry in `decision`. A deletion cluster-autoscaler asked for (in the scale-down
/// `ledger`) that the backend refuses outright is rolled back — replicas raised back and
/// the ledger entry dropped in one compare-and-swap ([`roll_back`]) — and recorded as
/// `Refused`, so the DeleteNodes call waiting for it reports the failure to
/// cluster-autoscaler (which then untaints the node) instead of success; the instance is
/// Running (or Creating, without a Node) again. Failures that may pass (an activity in
/// progress, throttling, no answer) stay in the ledger with their error on the entry and
/// are retried next pass; so are refused ones when the rollback itself fails.
///
/// `held`: servers (id, why) whose deletion CA asked for and has given up since (see
/// [`super::drain`]): rolled back and reported the same way, with code
/// [`super::drain::NOT_HELD`].
pub async fn apply(
    api: &Api<NodePool>,
    pool: &NodePool,
    ledger: &Ledger,
    outcomes: Vec<(String, Result<(), BackendError>)>,
    held: Vec<(String, String)>,
    decision: &mut Decision,
    nodes: Option<&HashMap<String, SeenNode>>,
) -> Applied {
    let mut applied = Applied::default();
    let mut refused: Vec<(usize, String, InstanceErrorStatus)> = Vec::new();
    for (id, why) in held {
        let Some((index, asked)) = entry_of(decision, ledger, &id) else {
            continue;
        };
        if let Some(request) = asked {
            let status = InstanceErrorStatus {
                class: OTHER_ERROR.into(),
                code: super::drain::NOT_HELD.into(),
                message: why,
            };
            refused.push((index, request, status));
        }
    }
    for (id, result) in outcomes {
        let Some((index, asked)) = entry_of(decision, ledger, &id) else {
            continue;
        };
        let entry = &mut decision.instances[index];
        match result {
            Ok(()) => {
                applied.deleted = true;
                entry.error = None;
                if let Some(request) = asked {
                    entry.deletion = Some(InstanceDeletion {
                        request,
                        outcome: DeletionOutcome::Accepted,
                        error: None,
                    });
                }
                applied.notes.push(Note {
                    severity: Severity::Normal,
                    reason: "ServerDeleted",
                    message: format!("deleted server {id}"),
                });
            }
            Err(error) => {
                let status = InstanceErrorStatus {
                    class: OTHER_ERROR.into(),
                    code: error.kind.as_str().into(),
                    message: error.message.clone(),
                };
                if let (BackendErrorKind::Rejected, Some(request)) = (error.kind, asked) {
                    refused.push((index, request, status));
                    continue;
                }
                entry.error = Some(status);
                applied.notes.push(Note {
                    severity: Severity::Warning,
                    reason: "ServerDeleteFailed",
                    message: format!("deleting server {id}: {error}; retrying next pass"),
                });
            }
        }
    }
    if refused.is_empty() {
        return applied;
    }
    let keys: Vec<String> = refused
        .iter()
        .filter_map(|(i, _, _)| decision.instances[*i].provider_id.as_deref())
        .map(pool_instance_key)
        .collect();
    match roll_back(api, &pool.name_any(), &keys).await {
        Ok(raised) => {
            for (index, request, status) in refused {
                let entry = &mut decision.instances[index];
                applied.kept_nodes.extend(entry.node.clone());
                let registered = entry
                    .provider_id
                    .as_deref()
                    .and_then(|pid| nodes?.get(providerid::normalize(pid)));
                entry.state = Some(if registered.is_some() {
                    InstanceStateName::Running
                } else {
                    InstanceStateName::Creating
                });
                entry.error = None;
                let held = status.code == super::drain::NOT_HELD;
                applied.notes.push(Note {
                    severity: Severity::Warning,
                    reason: if held {
                        "ServerKept"
                    } else {
                        "ServerDeleteRefused"
                    },
                    message: if held {
                        format!(
                            "server {} kept: {}; the deletion is rolled back (replicas raised by {raised})",
                            entry.id.clone().unwrap_or_default(),
                            status.message
                        )
                    } else {
                        format!(
                            "the backend refused to delete server {}: {}: {}; the deletion is rolled back (replicas raised by {raised}) and reported to cluster-autoscaler",
                            entry.id.clone().unwrap_or_default(),
                            status.code,
                            status.message
                        )
                    },
                });
                entry.deletion = Some(InstanceDeletion {
                    request,
                    outcome: DeletionOutcome::Refused,
                    error: Some(status),
                });
            }
        }
        Err(error) => {
            tracing::warn!(%error, pool = %pool.name_any(), "cannot roll back refused deletions; retrying them next pass");
            for (index, _, status) in refused {
                decision.instances[index].error = Some(status);
            }
        }
    }
    applied
}

/// The index of server `id`'s entry in `decision`, and the request the scale-down `ledger`
/// records its deletion under (`None`: not a DeleteNodes').
fn entry_of(decision: &Decision, ledger: &Ledger, id: &str) -> Option<(usize, Option<String>)> {
    let index = decision
        .instances
        .iter()
        .position(|i| i.id.as_deref() == Some(id))?;
    let asked = decision.instances[index]
        .provider_id
        .as_deref()
        .and_then(|pid| ledger.get(&pool_instance_key(pid)))
        .map(|e| e.request.clone());
    Some((index, asked))
}

/// Records as accepted the DeleteNodes removals the backend already carries out (the
/// instance is listed as terminating, so no delete call is made for it), so the request
/// waiting for them learns so.
pub fn accept_removals_under_way(ledger: &Ledger, decision: &mut Decision) {
    let calling = &decision.delete;
    for entry in decision.instances.iter_mut() {
        let (Some(id), Some(pid)) = (entry.id.as_deref(), entry.provider_id.as_deref()) else {
            continue;
        };
        if entry.state != Some(InstanceStateName::Deleting) || calling.iter().any(|d| d == id) {
            continue;
        }
        let Some(asked) = ledger.get(&pool_instance_key(pid)) else {
            continue;
        };
        if entry
            .deletion
            .as_ref()
            .is_none_or(|d| d.request != asked.request)
        {
            entry.deletion = Some(InstanceDeletion {
                request: asked.request.clone(),
                outcome: DeletionOutcome::Accepted,
                error: None,
            });
        }
    }
}

/// Undoes the DeleteNodes decrements of ledger `keys`: raises `spec.replicas` by one per
/// key still in the ledger and drops those keys, in one write guarded by the pool's
/// resourceVersion, re-read and retried on conflict. Returns by how much replicas rose.
pub async fn roll_back(
    api: &Api<NodePool>,
    name: &str,
    keys: &[String],
) -> Result<i32, kube::Error> {
    let mut attempt = 0;
    loop {
        let pool = api.get(name).await?;
        let mut ledger = Ledger::parse(
            pool.annotations()
                .get(LEDGER_ANNOTATION)
                .map(String::as_str),
        );
        let removed = keys.iter().filter(|k| ledger.remove(k).is_some()).count();
        if removed == 0 {
            return Ok(0);
        }
        let raised = i32::try_from(removed).unwrap_or(i32::MAX);
        let patch = json!({
            "metadata": {
                "resourceVersion": pool.resource_version(),
                "annotations": {LEDGER_ANNOTATION: ledger.to_annotation()},
            },
            "spec": {"replicas": pool.spec.replicas.saturating_add(raised)},
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => return Ok(raised),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(ngo_service::actuate::deadline::conflict_backoff(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ngo_api::nodepool::PoolInstance;

    fn deleting(id: &str, deletion: Option<InstanceDeletion>) -> PoolInstance {
        PoolInstance {
            id: Some(id.into()),
            provider_id: Some(format!("cn-hangzhou.{id}")),
            state: Some(InstanceStateName::Deleting),
            request: "q".into(),
            deletion,
            ..Default::default()
        }
    }

    #[test]
    fn removals_under_way_are_accepted_under_their_ledger_request() {
        let mut ledger = Ledger::parse(None);
        for id in ["i-a", "i-b", "i-c"] {
            ledger.record(
                &pool_instance_key(&format!("cn-hangzhou.{id}")),
                "r2",
                1,
                |_| true,
            );
        }
        let old = InstanceDeletion {
            request: "r1".into(),
            outcome: DeletionOutcome::Refused,
            error: None,
        };
        let mut decision = Decision {
            instances: vec![
                deleting("i-a", Some(old)),
                deleting("i-b", None),
                deleting("i-d", None),
            ],
            // i-b is still to be deleted: its outcome comes from the call.
            delete: vec!["i-b".into()],
            ..Default::default()
        };
        accept_removals_under_way(&ledger, &mut decision);
        let a = decision.instances[0].deletion.clone().expect("recorded");
        assert_eq!(
            (a.request.as_str(), a.outcome),
            ("r2", DeletionOutcome::Accepted)
        );
        assert_eq!(decision.instances[1].deletion, None);
        assert_eq!(decision.instances[2].deletion, None, "not in the ledger");
    }
}
