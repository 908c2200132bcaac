//! A request whose claim was released while it still ran (a sweeper whose clock runs ahead of
//! the request's by more than `--sweep-clock-margin-secs`) meets another request's mark on its
//! machine: it must not take that mark over. Taking it over, then releasing it as its own,
//! removed the delete-machine annotation under the live claim holder, whose decrement then
//! let Cluster API take a machine nobody named.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark};
use ngo_testbed::capi;
use serde_json::json;

use crate::crash::{DELETE_MACHINE, Group, paused_at_fault_point};

/// The stand-in for the request that claimed and marked the machine after ours was released.
const LIVE_HOLDER: &str = "live-holder";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_released_while_running_takes_over_no_live_mark() {
    let mut group = Group::new("takeover", 3).await;
    let running = group.running().await;
    let (victim, pid) = running[0].clone();

    let (log, mut client) = group.start_paused_at("delete-nodes:after-claim", 6).await;
    let request = group.delete_request(&victim, &pid, Duration::from_secs(30));
    group.ca_asks(&[&victim]).await;
    let call = tokio::spawn(async move { client.node_group_delete_nodes(request).await });
    paused_at_fault_point("the request paused after its claim", &log).await;

    // Meanwhile its claim is released and another request claims and marks the machine.
    let mut ledger = Ledger::read(Some(&group.ledger().await)).expect("a readable ledger");
    let (claimed, _) = ledger.claim().expect("the paused request's claim");
    assert_eq!(claimed, victim);
    ledger.remove(&victim);
    let now = jiff::Timestamp::now().as_second();
    ledger.record_claim(&victim, LIVE_HOLDER, now, now + 300, |_| true);
    let mds = Api::<DynamicObject>::namespaced_with(
        group.client.clone(),
        group.ns(),
        &capi::machine_deployments(),
    );
    let patch = json!({"metadata": {"annotations": {LEDGER_ANNOTATION: ledger.to_annotation()}}});
    mds.patch("w", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the live holder's claim");
    let theirs = ScaleDownMark {
        request: LIVE_HOLDER.into(),
        group: group.id.clone(),
        deadline: now + 300,
        preexisting: false,
        released: false,
    };
    let machines =
        Api::<DynamicObject>::namespaced_with(group.client.clone(), group.ns(), &capi::machines());
    let patch = json!({"metadata": {"annotations": {
        MARK_ANNOTATION: theirs.to_annotation(),
        DELETE_MACHINE: "live-holder",
    }}});
    machines
        .patch(&victim, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the live holder's mark");

    let answer = call.await.expect("rpc task");
    group.ca_got(&[&victim], &answer).await;
    let status = answer.expect_err("a request whose claim was released answers an error");
    group.log(&format!("the released request answered: {status:?}"));

    // The live holder's mark and annotation are as it wrote them, and nothing was lowered.
    let machine = machines.get(&victim).await.expect("the victim");
    let mark = machine
        .annotations()
        .get(MARK_ANNOTATION)
        .and_then(|v| ScaleDownMark::parse(v))
        .expect("a mark");
    assert_eq!(mark, theirs, "the live holder's mark was taken over");
    assert!(
        machine.annotations().contains_key(DELETE_MACHINE),
        "the live holder's delete-machine annotation was removed"
    );
    assert_eq!(group.replicas().await, 3);
    let ledger = Ledger::read(Some(&group.ledger().await)).expect("a readable ledger");
    let (holder_machine, holder) = ledger.claim().expect("the live holder's claim stays");
    assert_eq!(
        (holder_machine, holder.request.as_str()),
        (victim.as_str(), LIVE_HOLDER)
    );
    group.assert_u1();
}
