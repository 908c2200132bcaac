//! DeleteNodes while Cluster API rolls a MachineDeployment out with surge: the MachineDeployment
//! controller, not the delete-machine annotation, chooses which MachineSet takes a decrement
//! then (kubernetes/autoscaler#8494), so a decrement for a new machine could delete an old one.
//! As CA's in-tree provider skips the nodes of a rolling-out MachineDeployment (1.35+), the
//! operator refuses to start a scale-down there; after the rollout, exactly the named machine
//! goes.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use ngo_service::proto;
use ngo_testbed::capi;
use serde_json::json;

use crate::crash::{Group, node, poll};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_machine_goes_for_a_scale_down_named_during_a_rollout_and_the_named_one_goes_after() {
    let mut group = Group::new("rollout", 4).await;
    let options = group.sweeping_operator();
    group.cluster.start_operator(&options).expect("operator");
    let address = group.cluster.operator().expect("operator").grpc_address;
    let mut client = group.cluster.pki.connect(address).await.expect("client");
    let old: BTreeSet<(String, String)> = group.running().await.into_iter().collect();
    let old_names: BTreeSet<String> = old.iter().map(|(n, _)| n.clone()).collect();

    // A new template revision (the bootstrap data changes; label or timeout changes would be
    // propagated in place): Cluster API surges one new machine at a time and retires old ones
    // (maxSurge 1, maxUnavailable 0).
    Api::<DynamicObject>::namespaced_with(
        group.client.clone(),
        group.ns(),
        &capi::machine_deployments(),
    )
    .patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"template": {"spec": {"bootstrap": {"dataSecretName": "revision-2"}}}}}),
        ),
    )
    .await
    .expect("start the rollout");
    let (new_name, new_pid) = poll("a running machine of the new MachineSet", || async {
        group
            .running()
            .await
            .into_iter()
            .find(|(name, _)| !old_names.contains(name))
    })
    .await;
    let still_old: Vec<(String, String)> = group
        .running()
        .await
        .into_iter()
        .filter(|(name, _)| old_names.contains(name))
        .collect();
    assert!(
        still_old.len() >= 2,
        "the rollout is under way: {still_old:?}"
    );

    // Mid-rollout, a machine of the new MachineSet and one of the old: both refused (the old
    // one found going already, if the rollout took it first), nothing written.
    for (name, pid) in [(new_name.clone(), new_pid.clone()), still_old[0].clone()] {
        let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
            id: group.id.clone(),
            nodes: vec![node(&name, &pid)],
        });
        request.set_timeout(Duration::from_secs(5));
        group.ca_asks(&[&name]).await;
        let refused = client.node_group_delete_nodes(request).await;
        group.ca_got(&[&name], &refused).await;
        let refused = match refused {
            // The rollout may have removed the old machine in full since it was listed: its
            // node belongs to no group any more, so nothing can be lowered for it.
            Err(gone) if gone.code() == tonic::Code::NotFound => {
                assert!(
                    name != new_name && !group.live_machines().await.contains(&name),
                    "NotFound for a machine still there: {gone:?}"
                );
                continue;
            }
            Err(refused) => refused,
            // The rollout may take the old machine first: it is going, and nothing is lowered
            // for it ("already deleting").
            Ok(_) => {
                assert!(
                    name != new_name && !group.live_machines().await.contains(&name),
                    "OK during a rollout for a machine the rollout was not deleting: {name}"
                );
                continue;
            }
        };
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(
            refused.message().contains("is rolling out"),
            "{}",
            refused.message()
        );
    }
    assert_eq!(group.replicas().await, 4, "nothing lowered");
    assert!(group.marked().await.is_empty(), "nothing marked");
    assert!(!group.claimed().await, "no claim left");

    let settled = poll("the rollout settled at four new machines", || async {
        let running: BTreeSet<String> = group.running().await.into_iter().map(|(n, _)| n).collect();
        let all = group.machines().await.len();
        (running.len() == 4 && all == 4 && running.is_disjoint(&old_names)).then_some(running)
    })
    .await;
    group.log(&format!("rollout settled: {settled:?}"));
    assert!(settled.contains(&new_name), "{settled:?}");

    // After the rollout the same machine can be named, and exactly it goes.
    group.ca_asks(&[&new_name]).await;
    let accepted = poll("the operator sees the rollout ended", || {
        let mut client = client.clone();
        let (id, name, pid) = (group.id.clone(), new_name.clone(), new_pid.clone());
        async move {
            match client
                .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                    id,
                    nodes: vec![node(&name, &pid)],
                })
                .await
            {
                Ok(reply) => Some(Ok(reply)),
                Err(status) if status.message().contains("is rolling out") => None,
                Err(status) => Some(Err(status)),
            }
        }
    })
    .await;
    group.ca_got(&[&new_name], &accepted).await;
    accepted.expect("DeleteNodes after the rollout");
    assert_eq!(group.replicas().await, 3, "one decrement");
    let others: BTreeSet<String> = settled
        .iter()
        .filter(|n| **n != new_name)
        .cloned()
        .collect();
    let left = poll("the named machine gone", || async {
        let names = group.machine_names().await;
        (!names.contains(&new_name)).then_some(names)
    })
    .await;
    assert_eq!(left, others, "no other machine went");
    poll("no mark left behind", || async {
        group.marked().await.is_empty().then_some(())
    })
    .await;
    group.assert_u1();
}
