//! What the reconciler records about the deletions cluster-autoscaler asked for
//! (DeleteNodes, in the pool's scale-down ledger), so that the DeleteNodes call waiting for
//! them (`actuate::capi::pool_removals`) learns how each went, and the undo of a deletion
//! the backend refused.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::converge::Decision;
use crate::api::NodePool;
use crate::api::nodepool::{DeletionOutcome, InstanceDeletion, InstanceStateName};
use crate::capi::scale_down::{LEDGER_ANNOTATION, Ledger, pool_instance_key};

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
                tokio::time::sleep(crate::actuate::deadline::conflict_backoff(attempt)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::nodepool::PoolInstance;

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
