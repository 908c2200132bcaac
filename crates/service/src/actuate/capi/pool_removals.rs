//! DeleteNodes on a NodePool: the decrement and its ledger entry are written like any
//! scalable resource's ([`super::CapiActuator::delete_nodes`]), but the instances are
//! removed by the pool's reconciler, through the cloud. The call then waits for the
//! reconciler's outcome, recorded on each instance's status entry (`deletion`), so that a
//! removal the cloud refuses is reported to cluster-autoscaler instead of success.
//! cluster-autoscaler answers an error from `NodeGroup.DeleteNodes` by untainting the nodes
//! and recording a failed scale-down (`core/scaledown/actuation/delete_in_batch.go`
//! `deleteNodesFromCloudProvider`, `CleanUpAndRecordFailedScaleDownEvent`); upstream's
//! alicloud provider returns nil whatever `RemoveInstances` said.
//!
//! Safety: the wait only reads. It ends, with success, when the client's deadline is near
//! (the removal then goes on in the background, as before this wait existed); the
//! rollback of a refused removal is the reconciler's, in one compare-and-swap of replicas
//! and ledger, so a dropped RPC changes nothing.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;

use super::actuator::CapiActuator;
use crate::actuate::deadline::MutationDeadline;
use crate::actuate::error::ActuateError;
use ngo_api::NodePool;
use ngo_api::nodepool::DeletionOutcome;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, pool_instance_key};
use ngo_index::index::NodeGroup;

/// How often the pool is read while waiting.
const POLL: Duration = Duration::from_millis(200);

/// Where one instance's removal stands.
enum Removal {
    /// Not decided yet.
    Pending,
    /// Accepted by the cloud, or the instance is gone.
    Done,
    /// Refused: `<code>: <message>`.
    Refused(String),
}

impl CapiActuator {
    /// For a NodePool group, waits until the pool's reconciler has tried to remove each of
    /// `removals` (instances one DeleteNodes decremented, with the ledger request each is
    /// recorded under when known, from [`super::Deleted::pool_removals`]): `Ok` when some
    /// removal was accepted (or is still undecided as the client's deadline nears), an error
    /// naming each instance refused when all were. Other groups return at once.
    pub async fn await_pool_removals(
        &self,
        group: &NodeGroup,
        removals: &[(String, Option<String>)],
        deadline: &MutationDeadline,
    ) -> Result<(), ActuateError> {
        if group.kind != ScalableKind::NodePool || removals.is_empty() {
            return Ok(());
        }
        let api: Api<NodePool> = Api::namespaced(self.client.clone(), &group.namespace);
        let mut requests: Vec<(String, Option<String>)> = removals.to_vec();
        let mut first = true;
        loop {
            let pool = match api.get_opt(&group.name).await {
                Ok(Some(pool)) => pool,
                Ok(None) => return Ok(()),
                Err(error) => {
                    tracing::warn!(%error, group = %group.id, "cannot read the NodePool to learn how its removals went");
                    return Ok(());
                }
            };
            if first {
                // A decrement another request applied concurrently: its ledger request.
                let ledger = Ledger::parse(
                    pool.annotations()
                        .get(LEDGER_ANNOTATION)
                        .map(String::as_str),
                );
                for (pid, request) in &mut requests {
                    if request.is_none() {
                        *request = ledger
                            .get(&pool_instance_key(pid))
                            .map(|e| e.request.clone());
                    }
                }
                first = false;
            }
            let states: Vec<(&str, Removal)> = requests
                .iter()
                .map(|(pid, request)| (pid.as_str(), removal(&pool, pid, request.as_deref())))
                .collect();
            if states.iter().all(|(_, s)| !matches!(s, Removal::Pending)) {
                let refused: Vec<String> = states
                    .iter()
                    .filter_map(|(pid, s)| match s {
                        Removal::Refused(why) => Some(format!("{pid}: {why}")),
                        _ => None,
                    })
                    .collect();
                if refused.is_empty() {
                    return Ok(());
                }
                if refused.len() < states.len() {
                    // CA untaints every node of the batch on an error, so an error would
                    // let pods onto nodes whose removal went ahead. OK keeps them all
                    // tainted; a refused one (rolled back) is named again later.
                    tracing::warn!(group = %group.id, refused = %refused.join("; "), "some removals of the batch were refused and rolled back; answering OK, as others went ahead");
                    return Ok(());
                }
                return Err(ActuateError::RemovalRefused {
                    group: group.id.clone(),
                    refused: refused.len(),
                    asked: removals.len(),
                    details: refused.join("; "),
                });
            }
            if deadline.answer_remaining() < POLL {
                tracing::info!(group = %group.id, "removals not decided before the client's deadline; they go on in the background");
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Where the removal of instance `pid`, recorded under ledger request `request`, stands in
/// `pool`'s status.
fn removal(pool: &NodePool, pid: &str, request: Option<&str>) -> Removal {
    let Some(request) = request else {
        // No decrement recorded for it: nothing for the reconciler to remove.
        return Removal::Done;
    };
    let entry = pool.status.as_ref().and_then(|s| {
        s.instances.iter().find(|i| {
            i.provider_id
                .as_deref()
                .is_some_and(|p| providerid::normalize(p) == providerid::normalize(pid))
        })
    });
    let Some(entry) = entry else {
        return Removal::Done;
    };
    match &entry.deletion {
        Some(d) if d.request == request => match d.outcome {
            DeletionOutcome::Accepted => Removal::Done,
            DeletionOutcome::Refused => Removal::Refused(
                d.error
                    .as_ref()
                    .map(|e| format!("{}: {}", e.code, e.message))
                    .unwrap_or_else(|| "refused".into()),
            ),
        },
        _ => Removal::Pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(instances: serde_json::Value) -> NodePool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"replicas": 1, "clusterName": "c1",
                "aliCloud": {"credentialsSecretRef": {"name": "s"}, "regionId": "cn-hangzhou",
                    "scalingGroupId": "asg-1"}},
            "status": {"instances": instances},
        }))
        .unwrap()
    }

    #[test]
    fn a_removal_is_decided_by_the_outcome_recorded_for_its_request() {
        let p = pool(serde_json::json!([
            {"id": "i-a", "providerID": "cn-hangzhou.i-a", "state": "Deleting", "request": "q",
             "deletion": {"request": "r1", "outcome": "Accepted"}},
            {"id": "i-b", "providerID": "cn-hangzhou.i-b", "state": "Running", "request": "q",
             "deletion": {"request": "r1", "outcome": "Refused",
                "error": {"class": "OtherError", "code": "Rejected", "message": "IncorrectInstanceStatus"}}},
            {"id": "i-c", "providerID": "cn-hangzhou.i-c", "state": "Deleting", "request": "q",
             "deletion": {"request": "r0", "outcome": "Refused"}},
        ]));
        assert!(matches!(
            removal(&p, "cn-hangzhou.i-a", Some("r1")),
            Removal::Done
        ));
        match removal(&p, "cn-hangzhou.i-b", Some("r1")) {
            Removal::Refused(why) => assert_eq!(why, "Rejected: IncorrectInstanceStatus"),
            _ => panic!("refused"),
        }
        // An outcome of an earlier request says nothing about this one.
        assert!(matches!(
            removal(&p, "cn-hangzhou.i-c", Some("r1")),
            Removal::Pending
        ));
        // Gone from the status, or never decremented: nothing left to wait for.
        assert!(matches!(
            removal(&p, "cn-hangzhou.i-z", Some("r1")),
            Removal::Done
        ));
        assert!(matches!(
            removal(&p, "cn-hangzhou.i-c", None),
            Removal::Done
        ));
    }
}
