//! The externalgrpc server against a real kube-apiserver with the Cluster API CRDs: every RPC
//! over real gRPC, scaling writes observed in the API server.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::rpc::Rpc;
use crate::support::*;
use k8s_pb::api::core::v1 as pb;
use ngo_service::proto::{self, ExternalGrpcNode};
use prost::Message;
use serde_json::{Value, json};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(20);

fn node_msg(provider_id: &str, name: &str) -> ExternalGrpcNode {
    ExternalGrpcNode {
        provider_id: provider_id.into(),
        name: name.into(),
        ..Default::default()
    }
}

async fn group_ids(rpc: &Rpc) -> Vec<String> {
    let groups = rpc.node_groups().await.unwrap();
    groups.into_iter().map(|g| g.id).collect()
}

#[tokio::test]
async fn node_groups_and_lookups_are_served_from_real_objects() {
    let ns = TestNs::new("groups").await;
    let pids = deployment_with_nodes(&ns, "md", 1, 5, 2).await;
    ns.machine_set("standalone", 1, bounds(0, 3), None).await;
    ns.machine_deployment("unannotated", 1, json!({})).await;
    ns.machine_deployment(
        "paused",
        1,
        json!({MIN: "1", MAX: "3", "cluster.x-k8s.io/paused": "true"}),
    )
    .await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);

    let md_id = format!("MachineDeployment/{}/md", ns.name);
    let ms_id = format!("MachineSet/{}/standalone", ns.name);
    let ids = eventually("two groups", WAIT, || async {
        Some(group_ids(&rpc).await).filter(|ids| ids.len() == 2)
    })
    .await;
    assert_eq!(ids, vec![md_id.clone(), ms_id.clone()]);
    let groups = rpc.node_groups().await.unwrap();
    assert_eq!((groups[0].min_size, groups[0].max_size), (1, 5));
    assert_eq!(
        groups[0].debug,
        format!("{md_id} (min: 1, max: 5, replicas: 2)")
    );

    let found = rpc
        .node_group_for_node(node_msg(&pids[1], "n"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (found.id.as_str(), found.min_size, found.max_size),
        (md_id.as_str(), 1, 5)
    );
    // Raw: the answer carries a group with an empty id, not no group.
    let none = rpc
        .raw()
        .node_group_for_node(proto::NodeGroupForNodeRequest {
            node: Some(node_msg("test:////control-plane", "cp")),
        })
        .await
        .unwrap()
        .into_inner()
        .node_group
        .unwrap();
    assert_eq!(none.id, "", "unmanaged nodes get the empty group");
    let no_node = rpc
        .raw()
        .node_group_for_node(proto::NodeGroupForNodeRequest { node: None })
        .await
        .unwrap_err();
    assert_eq!(no_node.code(), Code::InvalidArgument);

    let target = rpc.node_group_target_size(&md_id).await.unwrap();
    assert_eq!(target, 2);
    let nodes = rpc.node_group_nodes(&md_id).await.unwrap();
    let mut ids: Vec<_> = nodes.iter().map(|i| i.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, pids);
    assert!(
        nodes
            .iter()
            .all(|i| i.status.as_ref().unwrap().instance_state == 1)
    );

    let missing = rpc
        .node_group_target_size("MachineDeployment/x/gone")
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert!(
        missing.message().contains("MachineDeployment/x/gone"),
        "{}",
        missing.message()
    );

    let label = rpc.gpu_label().await.unwrap();
    assert_eq!(label, "cluster-api/accelerator");
    rpc.cleanup().await.unwrap();
    let price = rpc
        .pricing_node_price(node_msg(&pids[0], "n"), 0..3600)
        .await
        .unwrap_err();
    assert_eq!(
        price.code(),
        Code::Unimplemented,
        "no prices without policies"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_bad_annotation_excludes_only_its_group_and_is_reported_as_an_event() {
    let ns = TestNs::new("badann").await;
    ns.machine_deployment("good", 1, bounds(0, 3)).await;
    ns.machine_deployment("bad", 1, json!({MIN: "1", MAX: "lots"}))
        .await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let ids = eventually("good group", WAIT, || async {
        Some(group_ids(&rpc).await).filter(|ids| !ids.is_empty())
    })
    .await;
    assert_eq!(ids, vec![format!("MachineDeployment/{}/good", ns.name)]);
    let events = eventually("warning event on the bad resource", WAIT, || {
        let ns = &ns;
        async move { Some(ns.events_for("bad").await).filter(|e| !e.is_empty()) }
    })
    .await;
    assert_eq!(events[0].0, "InvalidAutoscalerConfiguration");
    assert!(
        events[0].1.contains(MAX) && events[0].1.contains("must be an integer"),
        "{}",
        events[0].1
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn increase_size_writes_the_scale_subresource_within_bounds() {
    let ns = TestNs::new("increase").await;
    deployment_with_nodes(&ns, "md", 1, 4, 2).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    wait_groups(&rpc.raw(), 1).await;

    rpc.node_group_increase_size(&id, 2).await.unwrap();
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 4);
    let too_many = rpc.node_group_increase_size(&id, 1).await.unwrap_err();
    assert_eq!(too_many.code(), Code::FailedPrecondition);
    assert!(
        too_many
            .message()
            .contains("size increase too large - desired:5 max:4"),
        "{}",
        too_many.message()
    );
    let zero = rpc.node_group_increase_size(&id, 0).await.unwrap_err();
    assert_eq!(zero.code(), Code::InvalidArgument);
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        4,
        "refused requests change nothing"
    );

    // IncreaseSize returns once the watch shows the new size: TargetSize right after agrees.
    let target = rpc.node_group_target_size(&id).await.unwrap();
    assert_eq!(target, 4);
    let expected = |events: &[(String, String)]| {
        events
            .iter()
            .any(|(r, n)| r == "ScaleUp" && n.contains("from 2 to 4"))
            && events.iter().any(|(r, _)| r == "ScaleUpRejected")
    };
    let events = ns.wait_events_for("md", expected).await;
    assert!(expected(&events), "{events:?}");
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn decrease_target_size_never_removes_registered_nodes() {
    let ns = TestNs::new("decrease").await;
    let md = ns.machine_deployment("md", 3, bounds(0, 5)).await;
    let ms = ns.machine_set("md-ms", 3, json!({}), Some(&md)).await;
    let pid = format!("test:////{}-n0", ns.name);
    let node = ns.node("n0", &pid, BTreeMap::new()).await;
    ns.machine("m0", &ms, Some(&pid), Some(&node), json!({}))
        .await;
    ns.machine("pending", &ms, None, None, json!({})).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    eventually("two instances", WAIT, || async {
        (rpc.node_group_nodes(&id).await.ok()?.len() == 2).then_some(())
    })
    .await;
    let positive = rpc
        .node_group_decrease_target_size(&id, 1)
        .await
        .unwrap_err();
    assert_eq!(positive.code(), Code::InvalidArgument);
    rpc.node_group_decrease_target_size(&id, -2).await.unwrap();
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 1);
    let below = rpc
        .node_group_decrease_target_size(&id, -1)
        .await
        .unwrap_err();
    assert_eq!(below.code(), Code::FailedPrecondition);
    assert!(
        below.message().contains(
            "attempt to delete existing nodes currentReplicas:1 delta:-1 existingNodes: 1"
        ),
        "{}",
        below.message()
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_nodes_marks_the_machine_and_decrements_once() {
    let ns = TestNs::new("delete").await;
    let pids = deployment_with_nodes(&ns, "md", 1, 5, 3).await;
    deployment_with_nodes(&ns, "other", 0, 5, 1).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    wait_groups(&rpc.raw(), 2).await;

    let nodes = vec![node_msg(&pids[2], "n2")];
    rpc.node_group_delete_nodes(&id, nodes.clone())
        .await
        .unwrap();
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    assert!(
        ns.annotations(&machines(), "md-m2")
            .await
            .contains_key(DELETE_MACHINE)
    );
    assert!(
        !ns.annotations(&machines(), "md-m1")
            .await
            .contains_key(DELETE_MACHINE)
    );

    // CA retries after a timeout: once the cache has seen the mark, nothing is decremented again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    rpc.node_group_delete_nodes(&id, nodes).await.unwrap();
    assert_eq!(
        ns.replicas(&machine_deployments(), "md").await,
        2,
        "a repeated DeleteNodes must not decrement twice"
    );

    let foreign = format!("test:////{}-other-0", ns.name);
    let wrong = rpc
        .node_group_delete_nodes(&id, vec![node_msg(&foreign, "x")])
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::FailedPrecondition);
    assert!(
        wrong.message().contains("doesn't belong to node group"),
        "{}",
        wrong.message()
    );
    let unknown = rpc
        .node_group_delete_nodes(&id, vec![node_msg("test:////nobody", "x")])
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let below_min = rpc
        .node_group_delete_nodes(&id, vec![node_msg(&pids[0], "a"), node_msg(&pids[1], "b")])
        .await
        .unwrap_err();
    assert_eq!(below_min.code(), Code::FailedPrecondition);
    assert!(
        below_min.message().contains("minSize is 1"),
        "{}",
        below_min.message()
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_nodes_accepts_synthetic_ids_of_unregistered_machines() {
    let ns = TestNs::new("synthetic").await;
    let md = ns.machine_deployment("md", 2, bounds(0, 5)).await;
    let ms = ns.machine_set("md-ms", 2, json!({}), Some(&md)).await;
    ns.machine("stuck", &ms, None, None, json!({})).await;
    ns.machine(
        "broken",
        &ms,
        None,
        None,
        json!({"phase": "Failed", "deprecated": {"v1beta1": {"failureMessage": "no capacity"}}}),
    )
    .await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    let instances = eventually("two instances", WAIT, || async {
        rpc.node_group_nodes(&id)
            .await
            .ok()
            .filter(|i| i.len() == 2)
    })
    .await;
    let by_id: BTreeMap<_, _> = instances
        .iter()
        .map(|i| (i.id.clone(), i.status.clone().unwrap()))
        .collect();
    let pending = &by_id[&format!("pending-machine-{}_stuck", ns.name)];
    assert_eq!(pending.instance_state, 2);
    let failed = &by_id[&format!("failed-machine-{}_broken", ns.name)];
    assert_eq!(failed.instance_state, 2);
    let error = failed.error_info.as_ref().unwrap();
    assert_eq!(
        (error.error_code.as_str(), error.instance_error_class),
        ("ProvisioningFailed", 99)
    );

    // CA deletes unregistered instances with fake nodes whose name and providerID are the id.
    let fake = format!("pending-machine-{}_stuck", ns.name);
    rpc.node_group_delete_nodes(&id, vec![node_msg(&fake, &fake)])
        .await
        .unwrap();
    assert!(
        ns.annotations(&machines(), "stuck")
            .await
            .contains_key(DELETE_MACHINE)
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 1);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_group_the_operator_may_not_write_gets_no_machine_marked() {
    let ns = TestNs::new("rollback").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 2).await;
    let (operator, client) = ns
        .operator_with(shared().no_scale_kubeconfig.clone(), None)
        .await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    wait_groups(&rpc.raw(), 1).await;
    let denied = rpc
        .node_group_delete_nodes(&id, vec![node_msg(&pids[0], "n0")])
        .await
        .unwrap_err();
    assert_eq!(
        denied.code(),
        Code::PermissionDenied,
        "{}",
        denied.message()
    );
    // The claim in the group's ledger comes first: refused, nothing else is written.
    assert!(
        denied.message().contains("claiming Machine md-m0 in"),
        "{}",
        denied.message()
    );
    assert!(
        !ns.annotations(&machines(), "md-m0")
            .await
            .contains_key(DELETE_MACHINE),
        "no mark"
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn machine_set_and_machine_pool_groups_scale_through_their_own_scale_subresource() {
    let ns = TestNs::new("kinds").await;
    let ms = ns.machine_set("ms", 1, bounds(1, 3), None).await;
    let pid = format!("test:////{}-ms-0", ns.name);
    let node = ns.node("ms-0", &pid, BTreeMap::new()).await;
    ns.machine("ms-m0", &ms, Some(&pid), Some(&node), json!({}))
        .await;
    let pool_ids = [
        format!("kwok:////{}-p0", ns.name),
        format!("kwok:////{}-p1", ns.name),
    ];
    ns.machine_pool("mp", 2, bounds(1, 4), &[&pool_ids[0], &pool_ids[1]])
        .await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let ms_id = format!("MachineSet/{}/ms", ns.name);
    let mp_id = format!("MachinePool/{}/mp", ns.name);
    wait_groups(&rpc.raw(), 2).await;
    rpc.node_group_increase_size(&ms_id, 1).await.unwrap();
    assert_eq!(ns.replicas(&machine_sets(), "ms").await, 2);

    let nodes = rpc.node_group_nodes(&mp_id).await.unwrap();
    assert_eq!(
        nodes.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        pool_ids.to_vec()
    );
    let found = rpc
        .node_group_for_node(node_msg(&pool_ids[1], "p1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.id, mp_id);
    // Without a Machine for the instance, Cluster API cannot be told which one to remove:
    // refused as CA's in-tree provider refuses it, nothing lowered.
    let no_machine = rpc
        .node_group_delete_nodes(&mp_id, vec![node_msg(&pool_ids[1], "p1")])
        .await
        .unwrap_err();
    assert_eq!(no_machine.code(), Code::FailedPrecondition);
    assert!(
        no_machine.message().contains("unknown machine for node"),
        "{}",
        no_machine.message()
    );
    assert_eq!(ns.replicas(&machine_pools(), "mp").await, 2);
    let not_listed = rpc
        .node_group_delete_nodes(&mp_id, vec![node_msg("kwok:////elsewhere", "x")])
        .await
        .unwrap_err();
    assert_eq!(not_listed.code(), Code::NotFound);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn nodes_without_machine_provider_ids_resolve_through_node_annotations() {
    let ns = TestNs::new("noprovid").await;
    let md = ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let ms = ns.machine_set("md-ms", 1, json!({}), Some(&md)).await;
    let pid = format!("other:///zone/{}-vm", ns.name);
    let annotations = BTreeMap::from([
        ("cluster.x-k8s.io/machine".to_string(), "m0".to_string()),
        (
            "cluster.x-k8s.io/cluster-namespace".to_string(),
            ns.name.clone(),
        ),
    ]);
    let node = ns.node("vm", &pid, annotations).await;
    ns.machine("m0", &ms, None, Some(&node), json!({})).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    let found = eventually("group through node annotations", WAIT, || async {
        let group = rpc.node_group_for_node(node_msg(&pid, "vm")).await.ok()?;
        group.map(|g| g.id)
    })
    .await;
    assert_eq!(found, id);
    let nodes = rpc.node_group_nodes(&id).await.unwrap();
    assert_eq!(
        nodes[0].id, pid,
        "the node's provider ID, through status.nodeRef"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn template_node_info_comes_from_annotations_and_the_infrastructure_template() {
    let ns = TestNs::new("template").await;
    let capacity = json!({
        MIN: "0", MAX: "3",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "8Gi",
        "capacity.cluster-autoscaler.kubernetes.io/taints": "dedicated=batch:NoSchedule",
        "capacity.cluster-autoscaler.kubernetes.io/labels": "pool=batch",
    });
    ns.machine_deployment("zero", 0, capacity).await;
    ns.machine_deployment("plain", 1, bounds(0, 3)).await;
    // The infrastructure template supplies cpu and the architecture.
    let templates = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "TestMachineTemplate",
        ),
        "testmachinetemplates",
    );
    let template: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "TestMachineTemplate",
        "metadata": {"name": "template", "namespace": ns.name}, "spec": {"template": {"spec": {}}}
    }))
    .unwrap();
    let api = ns.api(&templates);
    api.create(&Default::default(), &template).await.unwrap();
    api.patch_status(
        "template",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"status": {"capacity": {"cpu": "4", "memory": "16Gi"}, "nodeInfo": {"architecture": "arm64", "operatingSystem": "linux"}}})),
    )
    .await
    .unwrap();

    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let zero = format!("MachineDeployment/{}/zero", ns.name);
    // Raw: the legacy nodeInfo field is compared with nodeBytes.
    let response = eventually(
        "template with cpu from the infrastructure template",
        WAIT,
        || {
            let mut c = rpc.raw();
            let id = zero.clone();
            async move {
                let r = c
                    .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id })
                    .await
                    .ok()?
                    .into_inner();
                let node = pb::Node::decode(r.node_bytes.as_slice()).ok()?;
                node.status.as_ref()?.capacity.get("cpu")?;
                Some(r)
            }
        },
    )
    .await;
    assert_eq!(
        response.node_info, response.node_bytes,
        "legacy field carries the same bytes"
    );
    let node = pb::Node::decode(response.node_bytes.as_slice()).unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.capacity["cpu"].string.as_deref(), Some("4"));
    assert_eq!(
        status.capacity["memory"].string.as_deref(),
        Some("8Gi"),
        "annotations win"
    );
    assert_eq!(status.capacity["pods"].string.as_deref(), Some("110"));
    let labels = node.metadata.unwrap().labels;
    assert_eq!(labels["kubernetes.io/arch"], "arm64");
    assert_eq!(labels["pool"], "batch");
    let taint = &node.spec.unwrap().taints[0];
    assert_eq!(
        (taint.key.as_deref(), taint.effect.as_deref()),
        (Some("dedicated"), Some("NoSchedule"))
    );

    let plain = rpc
        .node_group_template_node_info(&format!("MachineDeployment/{}/plain", ns.name))
        .await;
    // "plain" shares the template, so it can scale from zero too; a group without any template
    // data is UNIMPLEMENTED, never OK with empty bytes.
    assert!(plain.is_ok());
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn get_options_echoes_defaults_and_applies_annotations() {
    let ns = TestNs::new("options").await;
    let mut annotations = bounds(0, 3);
    annotations["cluster.x-k8s.io/autoscaling-options-scaledownunneededtime"] = json!("1m");
    annotations["cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold"] =
        json!("0.3");
    ns.machine_deployment("tuned", 1, annotations).await;
    ns.machine_deployment("default", 1, bounds(0, 3)).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    wait_groups(&rpc.raw(), 2).await;
    let secs = |s| {
        Some(prost_types::Duration {
            seconds: s,
            nanos: 0,
        })
    };
    let defaults = proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded_duration: secs(600),
        scale_down_unready_duration: secs(1200),
        max_node_provision_duration: secs(900),
        ..Default::default()
    };
    let options = rpc
        .node_group_get_options(&format!("MachineDeployment/{}/tuned", ns.name), defaults)
        .await
        .unwrap();
    assert_eq!(options.scale_down_utilization_threshold, 0.3);
    assert_eq!(options.scale_down_gpu_utilization_threshold, 0.5);
    assert_eq!(options.scale_down_unneeded_duration, secs(60));
    assert_eq!(options.scale_down_unready_duration, secs(1200));
    assert_eq!(options.max_node_provision_duration, secs(900));
    let none = rpc
        .node_group_get_options(&format!("MachineDeployment/{}/default", ns.name), defaults)
        .await
        .unwrap_err();
    assert_eq!(none.code(), Code::Unimplemented);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn annotation_changes_reach_answers_within_a_loop() {
    let ns = TestNs::new("latency").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    wait_groups(&rpc.raw(), 1).await;
    let start = Instant::now();
    ns.api(&machine_deployments())
        .patch(
            "md",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {MAX: "7"}}})),
        )
        .await
        .unwrap();
    eventually("max 7", Duration::from_secs(10), || async {
        let groups = rpc.node_groups().await.ok()?;
        groups
            .iter()
            .find(|g| g.id == id && g.max_size == 7)
            .map(|_| ())
    })
    .await;
    let elapsed = start.elapsed();
    eprintln!("watch-to-answer latency: {elapsed:?}");
    assert!(
        elapsed < Duration::from_secs(10),
        "CA's default loop is 10s"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_rpc_is_unavailable_until_caches_sync() {
    use ngo_service::proto::cloud_provider_server::CloudProvider;
    let client = admin_client().await;
    let resources =
        ngo_service::discovery::CapiResources::discover(&client, "cluster.x-k8s.io", None)
            .await
            .unwrap();
    let actuator = ngo_service::actuate::CapiActuator::new(
        client,
        resources,
        Default::default(),
        None,
        std::sync::Arc::new(Default::default()),
        "test".into(),
    );
    let (_publisher, handle) = ngo_index::index::channel();
    let service = ngo_service::server::CloudProviderService::new(
        handle,
        std::sync::Arc::new(actuator),
        std::sync::Arc::new(Default::default()),
        Default::default(),
    );
    let refresh = service
        .refresh(tonic::Request::new(proto::RefreshRequest {}))
        .await
        .unwrap_err();
    assert_eq!(refresh.code(), Code::Unavailable);
    assert!(
        refresh.message().contains("not synced"),
        "{}",
        refresh.message()
    );
    let groups = service
        .node_groups(tonic::Request::new(proto::NodeGroupsRequest {}))
        .await
        .unwrap_err();
    assert_eq!(groups.code(), Code::Unavailable);
    let target = service
        .node_group_target_size(tonic::Request::new(proto::NodeGroupTargetSizeRequest {
            id: "MachineDeployment/a/b".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(target.code(), Code::Unavailable);
}

#[tokio::test]
async fn admin_endpoints_report_health_and_metrics() {
    let ns = TestNs::new("admin").await;
    ns.machine_deployment("md", 2, bounds(1, 4)).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    wait_groups(&rpc.raw(), 1).await;
    let _ = rpc.node_group_target_size("MachineDeployment/x/none").await;
    assert_eq!(http_get(operator.admin_address, "/livez").await.0, 200);
    assert_eq!(http_get(operator.admin_address, "/readyz").await.0, 200);
    let (code, metrics) = http_get(operator.admin_address, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains(
            r#"nodegroup_grpc_request_duration_seconds_count{method="NodeGroups",code="OK"}"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"method="NodeGroupTargetSize",code="NotFound""#),
        "{metrics}"
    );
    let group = format!("MachineDeployment/{}/md", ns.name);
    assert!(
        metrics.contains(&format!(
            r#"nodegroup_node_group_target_size{{node_group="{group}"}} 2"#
        )),
        "{metrics}"
    );
    assert!(
        metrics.lines().any(|l| l == "nodegroup_node_groups 1"),
        "{metrics}"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn v1beta1_can_be_chosen_with_capi_version() {
    let ns = TestNs::new("v1beta1").await;
    deployment_with_nodes(&ns, "md", 1, 3, 1).await;
    let mut config = operator_config(&ns.name, None);
    config.capi_version = Some("v1beta1".into());
    let operator = nodegroup_operator::runtime::start(config).await.unwrap();
    let channel = tonic::transport::Channel::from_shared(format!(
        "http://{}",
        operator.grpc_address.expect("a TCP listener")
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let rpc = Rpc::from(channel);
    let ids = eventually("group through v1beta1", WAIT, || async {
        rpc.node_groups().await.ok().filter(|g| !g.is_empty())
    })
    .await;
    assert_eq!(ids[0].id, format!("MachineDeployment/{}/md", ns.name));
    assert_eq!((ids[0].min_size, ids[0].max_size), (1, 3));
    let mut config = operator_config(&ns.name, None);
    config.capi_version = Some("v9".into());
    let error = match nodegroup_operator::runtime::start(config).await {
        Ok(_) => panic!("an unserved version must fail start-up"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("does not serve version v9"), "{error}");
    operator.shutdown().await.unwrap();
}

/// A CloudProvider service on loopback whose Kubernetes API server accepts connections and
/// never answers, so that its mutating RPCs wait until the client gives up; it serves one
/// group, `MachineDeployment/ns/slow`. Returns the service's address and its metrics.
async fn service_with_a_silent_api_server() -> (
    std::net::SocketAddr,
    std::sync::Arc<ngo_service::metrics::ServiceMetrics>,
) {
    use ngo_index::capi::{CapiKeys, ScalableKind};
    use ngo_index::index::{
        ClusterKey, IndexInputs, NodeGroup, SnapshotHandle, Source, build_snapshot,
    };
    use ngo_service::actuate::CapiActuator;
    use ngo_service::discovery::CapiResources;
    use std::sync::Arc;

    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api_address = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            held.push(socket);
        }
    });
    let mut config = kube::Config::new(format!("http://{api_address}").parse().unwrap());
    config.read_timeout = Some(Duration::from_secs(5));
    let client = kube::Client::try_from(config).unwrap();
    let resource = |kind: &str, plural: &str| {
        kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", CAPI_VERSION, kind),
            plural,
        )
    };
    let resources = CapiResources {
        group: "cluster.x-k8s.io".into(),
        version: CAPI_VERSION.into(),
        machine_deployments: Some(resource("MachineDeployment", "machinedeployments")),
        machine_sets: resource("MachineSet", "machinesets"),
        machine_pools: Some(resource("MachinePool", "machinepools")),
        machines: resource("Machine", "machines"),
        clusters: None,
    };
    let actuator = CapiActuator::new(
        client,
        resources,
        CapiKeys::default(),
        None,
        Arc::default(),
        "deadline-test".into(),
    );
    let mut snapshot = build_snapshot(&IndexInputs::default());
    let group = NodeGroup {
        id: "MachineDeployment/ns/slow".into(),
        kind: ScalableKind::MachineDeployment,
        namespace: "ns".into(),
        name: "slow".into(),
        cluster: ClusterKey::default(),
        uid: String::new(),
        min: 0,
        max: 10,
        min_source: Source::Annotation,
        max_source: Source::Annotation,
        target: 1,
        instances: Vec::new(),
        registered: 0,
        ready: 0,
        options: Default::default(),
        template: None,
        provider_id_list: None,
        policy: None,
        pricing: None,
        node_capacity: Default::default(),
        warnings: Vec::new(),
        scale_down_claim: None,
        rolling_out: None,
        applied_decrements: Vec::new(),
    };
    snapshot.groups.insert(group.id.clone(), Arc::new(group));
    let metrics = Arc::new(ngo_service::metrics::ServiceMetrics::new());
    let service = ngo_service::server::CloudProviderService::new(
        SnapshotHandle::fixed(snapshot),
        Arc::new(actuator),
        metrics.clone(),
        Default::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(proto::cloud_provider_server::CloudProviderServer::new(
                service,
            ))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (address, metrics)
}

/// The value of the exposition line that starts with `series ` (a sample without a timestamp).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn rpcs_cut_off_by_the_client_are_counted_with_the_reason_and_the_time_taken() {
    let (address, metrics) = service_with_a_silent_api_server().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = proto::cloud_provider_client::CloudProviderClient::new(channel);
    let increase = || proto::NodeGroupIncreaseSizeRequest {
        id: "MachineDeployment/ns/slow".into(),
        delta: 1,
    };

    // The client's deadline (its grpc-timeout) passes while the handler waits for the API
    // server: the server drops the handler's future.
    let mut request = tonic::Request::new(increase());
    request.set_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let status = client
        .node_group_increase_size(request)
        .await
        .expect_err("the API server never answers");
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(290));

    // A client that gives up well before its deadline: its stream is reset.
    let mut request = tonic::Request::new(increase());
    request.set_timeout(Duration::from_secs(30));
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        client.node_group_increase_size(request),
    )
    .await;
    assert!(abandoned.is_err(), "{abandoned:?}");

    let deadline = r#"nodegroup_grpc_request_duration_seconds_count{method="NodeGroupIncreaseSize",code="DeadlineExceeded"}"#;
    let canceled = r#"nodegroup_grpc_request_duration_seconds_count{method="NodeGroupIncreaseSize",code="Canceled"}"#;
    // The server notices the reset and drops the handler a moment later.
    let waited = Instant::now();
    let text = loop {
        let text = metrics.encode();
        if sample(&text, deadline) == Some(1.0) && sample(&text, canceled) == Some(1.0) {
            break text;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "one DeadlineExceeded and one Canceled NodeGroupIncreaseSize, counted:\n{}",
            text.lines()
                .filter(|l| l.contains("grpc_request_duration_seconds_count"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = sample(
        &text,
        r#"nodegroup_grpc_request_duration_seconds_sum{method="NodeGroupIncreaseSize",code="DeadlineExceeded"}"#,
    )
    .expect("a latency sum");
    assert!(
        (0.25..5.0).contains(&took),
        "the time until the deadline is observed: {took}s\n{text}"
    );
}

/// Cluster API acts on no MachineSet of a Cluster whose `spec.paused` is true (as during
/// `clusterctl move`), nor on a paused MachineSet: its groups go away for CA while paused
/// (a decrement would wait there while CA names the node again) and come back after.
#[tokio::test]
async fn a_paused_cluster_or_machine_set_hides_its_groups_until_resumed() {
    let ns = TestNs::new("pausedcluster").await;
    let clusters = ns.api(&capi("Cluster", "clusters"));
    let cluster: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": ns.name},
        "spec": {"paused": false}
    }))
    .unwrap();
    clusters
        .create(&kube::api::PostParams::default(), &cluster)
        .await
        .expect("Cluster c1");
    let md = ns.machine_deployment("md", 1, bounds(0, 3)).await;
    ns.machine_set("md-set", 1, json!({}), Some(&md)).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    let served = |want: bool| {
        let (rpc, id) = (&rpc, &id);
        async move {
            eventually(&format!("{id} served: {want}"), WAIT, || async {
                let ids = group_ids(rpc).await;
                (ids.contains(id) == want).then_some(())
            })
            .await
        }
    };
    served(true).await;

    let set_cluster_paused = |paused: bool| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    "c1",
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"paused": paused}})),
                )
                .await
                .expect("pause the Cluster");
        }
    };
    set_cluster_paused(true).await;
    served(false).await;
    set_cluster_paused(false).await;
    served(true).await;

    let set_machine_set_paused = |value: Value| {
        let sets = ns.api(&machine_sets());
        async move {
            sets.patch(
                "md-set",
                &Default::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": value}}}),
                ),
            )
            .await
            .expect("pause the MachineSet");
        }
    };
    set_machine_set_paused(json!("true")).await;
    served(false).await;
    set_machine_set_paused(Value::Null).await;
    served(true).await;
    operator.shutdown().await.unwrap();
}

/// Cluster API's MachineSet deletes machines carrying `cluster.x-k8s.io/delete-machine` first
/// when replicas drop. One the operator did not set (a person's, or left by another
/// autoscaler) would take the decrement meant for cluster-autoscaler's node, or for the
/// unregistered instance of a DecreaseTargetSize: both are refused with nothing written,
/// and work again once the annotation is gone.
#[tokio::test]
async fn a_delete_machine_annotation_the_operator_did_not_set_stops_scale_down_in_its_group() {
    let ns = TestNs::new("foreignmark").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 3).await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    wait_groups(&rpc.raw(), 1).await;
    let annotate = |value: Value| {
        let machines = ns.api(&machines());
        async move {
            machines
                .patch(
                    "md-m0",
                    &Default::default(),
                    &kube::api::Patch::Merge(
                        json!({"metadata": {"annotations": {DELETE_MACHINE: value}}}),
                    ),
                )
                .await
                .expect("annotate md-m0");
        }
    };
    annotate(json!("yes")).await;
    // The watch brings the annotation within milliseconds; no RPC shows it, so wait a little.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = rpc
        .node_group_delete_nodes(&id, vec![node_msg(&pids[2], "n2")])
        .await
        .expect_err("DeleteNodes beside another's delete-machine");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("md-m0") && refused.message().contains("not set by"),
        "{}",
        refused.message()
    );
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 3);
    assert!(
        !ns.annotations(&machines(), "md-m2")
            .await
            .contains_key(DELETE_MACHINE),
        "nothing marked"
    );
    // DecreaseTargetSize for an instance that never registered: the annotated running
    // machine would go instead.
    ns.api(&machine_deployments())
        .patch(
            "md",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    let ms = ns.api(&machine_sets()).get("md-ms").await.unwrap();
    ns.machine("md-pending", &ms, None, None, json!({})).await;
    eventually("four instances", WAIT, || async {
        (rpc.node_group_nodes(&id).await.ok()?.len() == 4).then_some(())
    })
    .await;
    let refused = rpc
        .node_group_decrease_target_size(&id, -1)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("md-m0"), "{}", refused.message());
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 4);

    // The person takes the annotation back: both work again.
    annotate(Value::Null).await;
    eventually("DecreaseTargetSize accepted", WAIT, || async {
        rpc.node_group_decrease_target_size(&id, -1).await.ok()
    })
    .await;
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 3);
    rpc.node_group_delete_nodes(&id, vec![node_msg(&pids[2], "n2")])
        .await
        .expect("DeleteNodes");
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    operator.shutdown().await.unwrap();
}

/// Liveness of the scale-down finalizer: one left on a Machine without our record (removed by
/// hand, or a write cut short) would keep Cluster API from ever finishing its deletion; the
/// sweeper removes it when no claim of the group names the machine. One beside a record this
/// build cannot read (another version's) is left for that version, and counted unresolved.
#[tokio::test]
async fn a_stray_scale_down_finalizer_is_removed_and_another_versions_is_left() {
    const FINALIZER: &str = "autoscaling.nodegroup.dev/scale-down";
    const MARK: &str = "autoscaling.nodegroup.dev/scale-down-request";
    let ns = TestNs::new("strayfinalizer").await;
    deployment_with_nodes(&ns, "md", 0, 5, 2).await;
    let set = |name: &'static str, metadata: Value| {
        let machines = ns.api(&machines());
        async move {
            machines
                .patch(
                    name,
                    &Default::default(),
                    &kube::api::Patch::Merge(json!({ "metadata": metadata })),
                )
                .await
                .expect("patch the Machine");
        }
    };
    set(
        "md-m0",
        json!({"finalizers": [FINALIZER, "keep.example.com/mine"]}),
    )
    .await;
    let newer = r#"{"request":"r","group":"g","deadline":1,"lease":"x"}"#;
    set(
        "md-m1",
        json!({"finalizers": [FINALIZER], "annotations": {MARK: newer}}),
    )
    .await;
    let (operator, _client) = ns.operator().await;
    let finalizers = |name: &'static str| {
        let machines = ns.api(&machines());
        async move {
            machines
                .get(name)
                .await
                .expect("Machine")
                .metadata
                .finalizers
                .unwrap_or_default()
        }
    };
    eventually("the stray finalizer removed", WAIT, || async {
        (finalizers("md-m0").await == ["keep.example.com/mine"]).then_some(())
    })
    .await;
    let metrics = eventually("the unreadable record counted", WAIT, || async {
        let (_, body) = http_get(operator.admin_address, "/metrics").await;
        body.lines()
            .any(|l| l.starts_with("nodegroup_scale_down_marks_unresolved") && !l.ends_with(" 0"))
            .then_some(body)
    })
    .await;
    assert!(metrics.contains("nodegroup_scale_down_marks_unresolved"));
    assert_eq!(
        finalizers("md-m1").await,
        [FINALIZER],
        "another version's is left"
    );
    operator.shutdown().await.unwrap();
}
