//! Someone else (a person's `kubectl scale`, GitOps) lowers replicas while a DeleteNodes is
//! between its mark and its decrement. Cluster API deletes the marked machine for *their*
//! decrement. If the request then lowers replicas, Cluster API takes one more machine of its
//! own choosing: both intents, as CA's in-tree provider gives. If the request fails instead,
//! its release must not lower replicas for a machine that already went: that would make
//! Cluster API take a machine nobody chose (perhaps one CA was answered an error for).

use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use ngo_testbed::capi;
use serde_json::json;

use crate::crash::{Group, paused_at_fault_point, poll};

/// Starts a DeleteNodes for the group's first machine with a client deadline of `timeout`,
/// paused after its mark for `pause`; lowers replicas by one as a person would; waits until
/// Cluster API deletes the marked machine. Returns the answer, the victim and the group.
async fn lowered_between_mark_and_decrement(
    prefix: &str,
    timeout: Duration,
    pause: Duration,
) -> (Result<(), tonic::Status>, String, Group) {
    let mut group = Group::new(prefix, 4).await;
    let (victim, pid) = group.running().await[0].clone();
    let (log, mut client) = group
        .start_paused_at("delete-nodes:after-mark", pause.as_secs())
        .await;
    let request = group.delete_request(&victim, &pid, timeout);
    group.ca_asks(&[&victim]).await;
    let call = tokio::spawn(async move { client.node_group_delete_nodes(request).await });
    paused_at_fault_point("the request paused after its mark", &log).await;
    let paused_at = std::time::Instant::now();

    let mds = Api::<DynamicObject>::namespaced_with(
        group.client.clone(),
        group.ns(),
        &capi::machine_deployments(),
    );
    group.auditor.person_lowered("w");
    mds.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 3}})),
    )
    .await
    .expect("a person lowers replicas");
    poll("Cluster API deleting the marked machine", || async {
        (!group.live_machines().await.contains(&victim)).then_some(())
    })
    .await;
    assert!(
        paused_at.elapsed() < pause,
        "Cluster API acted only after the request went on"
    );
    let answer = call.await.expect("rpc task").map(|_| ());
    group.ca_got(&[&victim], &answer).await;
    (answer, victim, group)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someone_elses_decrement_between_mark_and_decrement_gives_both_intents() {
    let (answer, victim, group) = lowered_between_mark_and_decrement(
        "outside-ok",
        Duration::from_secs(30),
        Duration::from_secs(8),
    )
    .await;
    answer.expect("the request lowered replicas: OK");
    poll("two machines left, exactly one more gone", || async {
        let live = group.live_machines().await;
        (live.len() == 2 && group.machines().await.len() == 2).then_some(())
    })
    .await;
    assert_eq!(group.replicas().await, 2);
    assert!(!group.live_machines().await.contains(&victim));
    assert!(group.marked().await.is_empty(), "no mark left");
    group.assert_u1();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_lowers_nothing_for_a_machine_someone_elses_decrement_took() {
    // The client's deadline passes during the pause: the decrement is not written, and the
    // release finds the machine deleting under the request's mark.
    let (answer, victim, group) = lowered_between_mark_and_decrement(
        "outside-failed",
        Duration::from_secs(3),
        Duration::from_secs(8),
    )
    .await;
    group.log(&format!("the request answered {answer:?}"));
    poll("the victim gone and the release done", || async {
        let machines = group.machines().await;
        (machines.len() == 3 && !group.claimed().await).then_some(())
    })
    .await;
    // Give Cluster API time to take one more machine, were replicas lowered again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(group.replicas().await, 3, "the person's replicas stand");
    let live = group.live_machines().await;
    assert_eq!(
        live.len(),
        3,
        "no machine but the marked one went: {live:?}"
    );
    assert!(!live.contains(&victim));
    assert!(group.marked().await.is_empty(), "no mark left");
    group.assert_u1();
}
