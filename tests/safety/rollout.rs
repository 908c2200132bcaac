//! DeleteNodes while Cluster API rolls a MachineDeployment out with surge: old and new
//! MachineSets coexist, machines come and go, and replica counts say nothing about which
//! decrement happened. The ledger, not the counts, decides.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use ngo_sandbox::capi;
use nodegroup_operator::proto;
use serde_json::json;

use crate::crash::{Group, node, poll};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_deleted_during_a_rollout_with_surge_go_and_replicas_stay_exact() {
    let mut group = Group::new("rollout", 4).await;
    let options = group.sweeping_operator();
    group.cluster.start_operator(&options).expect("operator");
    let address = group.cluster.operator().expect("operator").grpc_address;
    let mut client = group.cluster.pki.connect(address).await.expect("client");
    let old = group.running().await;
    let victims: Vec<(String, String)> = old[..2].to_vec();
    let victim_names: BTreeSet<String> = victims.iter().map(|(n, _)| n.clone()).collect();

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
    poll("the rollout's surge machine", || async {
        (group.machines().await.len() > 4).then_some(())
    })
    .await;

    for (name, pid) in &victims {
        let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
            id: group.id.clone(),
            nodes: vec![node(name, pid)],
        });
        request.set_timeout(Duration::from_secs(5));
        client
            .node_group_delete_nodes(request)
            .await
            .unwrap_or_else(|e| panic!("DeleteNodes {name}: {e}"));
        // cluster-autoscaler retries after a timeout it saw; a retry succeeds and changes
        // nothing (the node may be gone from the index by then: NotFound).
        let retry = client
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id: group.id.clone(),
                nodes: vec![node(name, pid)],
            })
            .await;
        assert!(
            retry.is_ok()
                || retry
                    .as_ref()
                    .is_err_and(|s| s.code() == tonic::Code::NotFound),
            "retry of DeleteNodes {name}: {retry:?}"
        );
    }
    assert_eq!(group.replicas().await, 2, "two decrements, no more");
    poll("the victims deleted", || async {
        let names: BTreeSet<String> = group
            .machines()
            .await
            .iter()
            .map(|m| m.name_any())
            .collect();
        names.is_disjoint(&victim_names).then_some(())
    })
    .await;

    let old_names: BTreeSet<String> = old.iter().map(|(n, _)| n.clone()).collect();
    let settled = poll("the rollout settled at two new machines", || async {
        let names: BTreeSet<String> = group
            .machines()
            .await
            .iter()
            .map(|m| m.name_any())
            .collect();
        let running = group.running().await.len();
        (names.len() == 2 && running == 2 && names.is_disjoint(&old_names)).then_some(names)
    })
    .await;
    group.log(&format!("rollout settled: {settled:?}"));
    assert_eq!(
        group.replicas().await,
        2,
        "replicas exact after the rollout"
    );
    poll("no mark left behind", || async {
        group.marked().await.is_empty().then_some(())
    })
    .await;
}
