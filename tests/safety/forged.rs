//! A tenant forges a scale-down mark on one of its own Machines naming another tenant's
//! group. A Machine and its MachineDeployment always share a namespace, so the mark is no
//! request of ours: the sweeper removes it from the tenant's Machine and writes nothing in the
//! other namespace. (It trusted the mark's group: the release fenced a claim in the other
//! tenant's ledger and wrote to that tenant's Machine of the same name, every sweep.)

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use ngo_index::capi::scale_down::{FINALIZER, MARK_ANNOTATION, ScaleDownMark};
use ngo_testbed::capi;
use serde_json::json;

use crate::crash::{Group, poll};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_mark_naming_another_tenants_group_writes_nothing_of_that_tenant() {
    let mut tenant = Group::new("forger", 2).await;
    let other = Group::new("victim", 1).await;
    let running = tenant.running().await;
    let (machine, _) = running[0].clone();

    // The other tenant has a Machine of the same name (a copy of the forger's, by hand).
    let tenant_machines = Api::<DynamicObject>::namespaced_with(
        tenant.client.clone(),
        tenant.ns(),
        &capi::machines(),
    );
    let mut copy = tenant_machines.get(&machine).await.expect("the machine");
    copy.metadata = kube::api::ObjectMeta {
        name: Some(machine.clone()),
        namespace: Some(other.ns().to_string()),
        labels: copy.metadata.labels.clone(),
        ..Default::default()
    };
    copy.data["spec"]["providerID"] = json!(null);
    if let Some(data) = copy.data.as_object_mut() {
        data.remove("status");
    }
    let other_machines =
        Api::<DynamicObject>::namespaced_with(other.client.clone(), other.ns(), &capi::machines());
    other_machines
        .create(&PostParams::default(), &copy)
        .await
        .expect("the other tenant's machine of the same name");
    let other_mds = Api::<DynamicObject>::namespaced_with(
        other.client.clone(),
        other.ns(),
        &capi::machine_deployments(),
    );
    let annotations_of = |object: &DynamicObject| object.annotations().clone();
    let other_md_before = annotations_of(&other_mds.get("w").await.expect("md"));
    let other_machine_before = other_machines.get(&machine).await.expect("machine");

    // The forged mark: expired long ago, of a request that never was, naming the other
    // tenant's group.
    let now = jiff::Timestamp::now().as_second();
    let forged = ScaleDownMark {
        request: "forged".into(),
        group: other.id.clone(),
        deadline: now - 3600,
        preexisting: false,
        released: false,
    };
    let patch = json!({"metadata": {"annotations": {MARK_ANNOTATION: forged.to_annotation()}}});
    tenant_machines
        .patch(&machine, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the forged mark");

    let options = tenant.sweeping_operator();
    tenant.cluster.start_operator(&options).expect("operator");
    // A few sweeps (one a second) after the operator's start.
    tokio::time::sleep(Duration::from_secs(8)).await;

    let other_md_after = annotations_of(&other_mds.get("w").await.expect("md"));
    assert_eq!(
        other_md_after, other_md_before,
        "the other tenant's MachineDeployment was written"
    );
    let other_machine_after = other_machines.get(&machine).await.expect("machine");
    assert_eq!(
        other_machine_after.annotations(),
        other_machine_before.annotations(),
        "the other tenant's Machine was written"
    );
    assert!(
        !other_machine_after
            .finalizers()
            .iter()
            .any(|f| f == FINALIZER),
        "our finalizer on the other tenant's Machine"
    );
    poll("the sweeper to remove the forged mark", || async {
        let m = tenant_machines.get(&machine).await.ok()?;
        (!m.annotations().contains_key(MARK_ANNOTATION)).then_some(())
    })
    .await;
    assert!(
        tenant.live_machines().await.contains(&machine),
        "the forger's own Machine stays"
    );
    tenant.cluster.stop_operator();
}
