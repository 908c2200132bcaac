//! Scenario tests for the snapshot builder (mirrors upstream's provider checklist).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::capi::CapiKeys;
use crate::capi::objects::{InfraTemplate, Machine, ScalableKind, ScalableResource};
use crate::index::{
    ClusterKey, ExclusionReason, IndexInputs, InstanceState, NodeGroupLookup, NodeView,
    TemplateKey, TemplateKindState, WorkloadState,
};

const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";

fn dynamic(v: Value) -> kube::core::DynamicObject {
    serde_json::from_value(v).unwrap()
}

fn resource(
    kind: ScalableKind,
    name: &str,
    annotations: Value,
    replicas: Option<i32>,
    owner_md: Option<&str>,
) -> ScalableResource {
    let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "annotations": annotations});
    if let Some(md) = owner_md {
        meta["ownerReferences"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "name": md, "uid": "x"}]);
    }
    let mut spec = json!({"clusterName": "c1", "selector": {"matchLabels": {"set": name}}});
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    let obj = dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind.as_str(), "metadata": meta, "spec": spec}),
    );
    ScalableResource::from_dynamic(kind, &obj, &CapiKeys::default())
}

fn bounds(min: &str, max: &str) -> Value {
    json!({MIN: min, MAX: max})
}

fn machine(
    name: &str,
    owner_ms: &str,
    provider_id: Option<&str>,
    node_ref: Option<&str>,
    status_extra: Value,
    deleting: bool,
) -> Machine {
    let mut meta = json!({"name": name, "namespace": "ns",
        "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": owner_ms, "uid": "y"}]});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        meta["finalizers"] = json!(["x"]);
    }
    let mut status = status_extra;
    if let Some(n) = node_ref {
        status["nodeRef"] = json!({"name": n});
    }
    let mut spec = json!({"clusterName": "c1"});
    if let Some(p) = provider_id {
        spec["providerID"] = json!(p);
    }
    Machine::from_dynamic(&dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta, "spec": spec, "status": status}),
    ))
}

fn node(name: &str, provider_id: &str, ready: bool) -> NodeView {
    NodeView {
        name: name.into(),
        provider_id: Some(provider_id.into()),
        ready,
        ..Default::default()
    }
}

fn inputs(
    resources: Vec<ScalableResource>,
    machines: Vec<Machine>,
    nodes: Vec<NodeView>,
) -> IndexInputs {
    IndexInputs {
        default_arch: "amd64".into(),
        resources,
        machines: machines.into_iter().map(Arc::new).collect(),
        nodes: nodes.into_iter().map(Arc::new).collect(),
        ..Default::default()
    }
}

/// A MachineDeployment `md` with MachineSet `md-ms` and `n` running machines with nodes.
fn deployment(n: usize, annotations: Value, replicas: i32) -> IndexInputs {
    let md = resource(
        ScalableKind::MachineDeployment,
        "md",
        annotations,
        Some(replicas),
        None,
    );
    let ms = resource(
        ScalableKind::MachineSet,
        "md-ms",
        json!({}),
        Some(replicas),
        Some("md"),
    );
    let machines = (0..n)
        .map(|i| {
            machine(
                &format!("m{i}"),
                "md-ms",
                Some(&format!("test:////node-{i}")),
                Some(&format!("node-{i}")),
                json!({}),
                false,
            )
        })
        .collect();
    let nodes = (0..n)
        .map(|i| node(&format!("node-{i}"), &format!("test:////node-{i}"), true))
        .collect();
    inputs(vec![md, ms], machines, nodes)
}

#[test]
fn machine_deployment_with_bounds_is_a_group_and_its_machine_set_is_not() {
    let snap = build_snapshot(&deployment(3, bounds("1", "5"), 3));
    assert_eq!(
        snap.groups.keys().collect::<Vec<_>>(),
        vec!["MachineDeployment/ns/md"]
    );
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert_eq!((g.min, g.max, g.target), (1, 5, 3));
    assert_eq!(
        g.debug(),
        "MachineDeployment/ns/md (min: 1, max: 5, replicas: 3)"
    );
    assert_eq!(g.instances.len(), 3);
    assert!(
        g.instances
            .iter()
            .all(|i| i.state == InstanceState::Running)
    );
    assert_eq!(
        g.instances[0].id, "test:////node-0",
        "raw provider IDs are reported"
    );
    assert_eq!((g.registered, g.ready), (3, 3));
}

#[test]
fn resources_without_max_or_with_max_zero_are_not_groups() {
    let snap = build_snapshot(&deployment(1, json!({}), 1));
    assert!(snap.groups.is_empty());
    assert!(
        snap.exclusions.is_empty(),
        "unannotated resources are not reported"
    );
    let snap = build_snapshot(&deployment(1, bounds("0", "0"), 1));
    assert!(snap.groups.is_empty());
    assert_eq!(snap.exclusions[0].reason, ExclusionReason::NotAutoscaled);
    let snap = build_snapshot(&deployment(1, json!({MAX: "4"}), 1));
    assert_eq!(
        snap.groups["MachineDeployment/ns/md"].min, 0,
        "missing min means 0"
    );
}

#[test]
fn one_invalid_annotation_excludes_only_its_own_resource() {
    let good = resource(
        ScalableKind::MachineSet,
        "good",
        bounds("1", "3"),
        Some(1),
        None,
    );
    let bad = resource(
        ScalableKind::MachineSet,
        "bad",
        bounds("1", "three"),
        Some(1),
        None,
    );
    let inverted = resource(
        ScalableKind::MachineSet,
        "inverted",
        bounds("4", "2"),
        Some(1),
        None,
    );
    let snap = build_snapshot(&inputs(vec![good, bad, inverted], vec![], vec![]));
    assert_eq!(
        snap.groups.keys().collect::<Vec<_>>(),
        vec!["MachineSet/ns/good"]
    );
    assert_eq!(snap.exclusions.len(), 2);
    for e in &snap.exclusions {
        let ExclusionReason::Invalid(message) = &e.reason else {
            panic!("{e:?}")
        };
        assert!(message.contains(MAX), "{message}");
    }
}

#[test]
fn paused_resources_are_excluded_and_their_nodes_have_no_group() {
    let mut i = deployment(
        1,
        json!({MIN: "1", MAX: "3", "cluster.x-k8s.io/paused": ""}),
        1,
    );
    let snap = build_snapshot(&i);
    assert!(snap.groups.is_empty());
    assert_eq!(
        snap.exclusions[0].reason,
        ExclusionReason::Paused("cluster.x-k8s.io/paused".into())
    );
    assert_eq!(
        snap.group_for_provider_id("test:////node-0", None),
        NodeGroupLookup::None
    );
    i.resources[0].annotations.remove("cluster.x-k8s.io/paused");
    assert!(matches!(
        build_snapshot(&i).group_for_provider_id("test:////node-0", None),
        NodeGroupLookup::Group(_)
    ));
}

/// Cluster API does not act on a MachineSet while its Cluster's `spec.paused` is true or the
/// MachineSet carries the paused annotation (`annotations.IsPaused`): a decrement written then
/// waits, and CA would name the machine again meanwhile. Such groups are paused groups.
#[test]
fn a_paused_cluster_or_a_paused_machine_set_pauses_the_group_above_it() {
    let mut i = deployment(2, bounds("1", "3"), 2);
    assert_eq!(build_snapshot(&i).groups.len(), 1);

    i.paused_clusters.push(cluster("c1"));
    let snap = build_snapshot(&i);
    assert!(snap.groups.is_empty());
    assert_eq!(
        snap.exclusions[0].reason,
        ExclusionReason::Paused("Cluster ns/c1 spec.paused".into())
    );
    assert_eq!(
        snap.group_for_provider_id("test:////node-0", None),
        NodeGroupLookup::None
    );
    // Another cluster's pause changes nothing.
    i.paused_clusters = vec![ClusterKey {
        namespace: "other".into(),
        name: "c1".into(),
    }];
    assert_eq!(build_snapshot(&i).groups.len(), 1);

    i.paused_clusters.clear();
    i.resources[1]
        .annotations
        .insert("cluster.x-k8s.io/paused".into(), String::new());
    let snap = build_snapshot(&i);
    assert!(snap.groups.is_empty());
    assert_eq!(
        snap.exclusions[0].reason,
        ExclusionReason::Paused("MachineSet ns/md-ms cluster.x-k8s.io/paused".into())
    );
}

/// As CA's in-tree `IsMachineDeploymentAndRollingOut`: a MachineDeployment rolls out while a
/// MachineSet older than the newest revision has replicas, desired or actual.
#[test]
fn a_machine_deployment_rolls_out_while_an_older_machine_set_has_replicas() {
    const REVISION: &str = "machinedeployment.clusters.x-k8s.io/revision";
    let mut i = deployment(2, bounds("1", "3"), 2);
    let rolling = |i: &IndexInputs| {
        build_snapshot(i)
            .groups
            .values()
            .next()
            .unwrap()
            .rolling_out
            .clone()
    };
    // One MachineSet, with or without a revision: not rolling out.
    assert_eq!(rolling(&i), None);
    i.resources[1]
        .annotations
        .insert(REVISION.into(), "1".into());
    assert_eq!(rolling(&i), None);

    let mut new = resource(
        ScalableKind::MachineSet,
        "md-ms-2",
        json!({REVISION: "2"}),
        Some(1),
        Some("md"),
    );
    i.resources.push(new.clone());
    let why = rolling(&i).expect("rolling out");
    assert!(
        why.contains("ns/md-ms (revision 1) still has 2 replica(s)"),
        "{why}"
    );

    // The old MachineSet scaled to 0 but still has a machine going: still rolling out.
    i.resources[1].replicas = Some(0);
    i.resources[1].status_replicas = Some(1);
    assert!(rolling(&i).is_some());
    i.resources[1].status_replicas = Some(0);
    assert_eq!(rolling(&i), None);

    // A revision that cannot be ordered: rolling out, to be safe.
    new.annotations.insert(REVISION.into(), "two".into());
    i.resources[2] = new;
    let why = rolling(&i).expect("unparseable revision");
    assert!(why.contains("unparseable"), "{why}");
}

#[test]
fn replicas_zero_is_served_only_with_scale_from_zero_capacity() {
    let snap = build_snapshot(&deployment(0, bounds("0", "3"), 0));
    assert!(
        matches!(
            &snap.exclusions[0].reason,
            ExclusionReason::ZeroWithoutTemplate(d) if d.contains("no infrastructure template")
        ),
        "{:?}",
        snap.exclusions[0].reason
    );
    let mut annotations = bounds("0", "3");
    annotations["capacity.cluster-autoscaler.kubernetes.io/cpu"] = json!("2");
    annotations["capacity.cluster-autoscaler.kubernetes.io/memory"] = json!("4Gi");
    let snap = build_snapshot(&deployment(0, annotations, 0));
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert!(g.template.is_some());
    assert_eq!(g.target, 0);
}

#[test]
fn replicas_unset_is_excluded_with_a_reason() {
    let ms = resource(ScalableKind::MachineSet, "ms", bounds("1", "3"), None, None);
    let snap = build_snapshot(&inputs(vec![ms], vec![], vec![]));
    assert!(snap.groups.is_empty());
    assert_eq!(snap.exclusions[0].reason, ExclusionReason::ReplicasUnset);
}

#[test]
fn node_group_for_node_follows_the_owner_chain() {
    let snap = build_snapshot(&deployment(2, bounds("1", "5"), 2));
    let NodeGroupLookup::Group(g) = snap.group_for_provider_id("test:////node-1", None) else {
        panic!()
    };
    assert_eq!(g.id, "MachineDeployment/ns/md");
    assert_eq!(
        snap.group_for_provider_id("test:///node-1", None).clone(),
        NodeGroupLookup::Group(g.clone()),
        "matched on the normalized tail"
    );
    assert_eq!(
        snap.group_for_provider_id("test:////unknown", None),
        NodeGroupLookup::None
    );
    assert_eq!(snap.group_for_provider_id("", None), NodeGroupLookup::None);
}

#[test]
fn machine_set_of_an_invisible_deployment_is_not_a_fallback_group() {
    let mut i = deployment(1, bounds("1", "5"), 1);
    i.resources
        .retain(|r| r.kind != ScalableKind::MachineDeployment);
    let snap = build_snapshot(&i);
    assert!(snap.groups.is_empty());
    assert_eq!(
        snap.group_for_provider_id("test:////node-0", None),
        NodeGroupLookup::None
    );
}

#[test]
fn auto_discovery_filters_groups_and_their_nodes() {
    let mut i = deployment(1, bounds("1", "5"), 1);
    i.filter =
        crate::capi::autodiscovery::DiscoveryFilter::parse(&["clusterapi:clusterName=other"])
            .unwrap();
    let snap = build_snapshot(&i);
    assert!(snap.groups.is_empty());
    assert_eq!(
        snap.group_for_provider_id("test:////node-0", None),
        NodeGroupLookup::None
    );
    i.filter = crate::capi::autodiscovery::DiscoveryFilter::parse(&[
        "clusterapi:clusterName=c1,namespace=ns",
    ])
    .unwrap();
    assert_eq!(build_snapshot(&i).groups.len(), 1);
}

#[test]
fn pending_failed_and_deleting_machines_get_synthetic_ids_and_states() {
    let md = resource(
        ScalableKind::MachineDeployment,
        "md",
        bounds("0", "9"),
        Some(5),
        None,
    );
    let ms = resource(
        ScalableKind::MachineSet,
        "md-ms",
        json!({}),
        Some(5),
        Some("md"),
    );
    let failed_status = json!({"phase": "Failed", "failureMessage": "quota exceeded"});
    let machines = vec![
        machine("pending", "md-ms", None, None, json!({}), false),
        machine("failed", "md-ms", None, None, failed_status.clone(), false),
        machine(
            "failed-deleting",
            "md-ms",
            None,
            None,
            failed_status.clone(),
            true,
        ),
        machine(
            "failed-with-node",
            "md-ms",
            Some("test:////n9"),
            Some("n9"),
            failed_status,
            false,
        ),
        machine(
            "deleting",
            "md-ms",
            Some("test:////n1"),
            Some("n1"),
            json!({}),
            true,
        ),
        machine(
            "pending-with-pid",
            "md-ms",
            Some("test:////n2"),
            None,
            json!({}),
            false,
        ),
        machine(
            "registered-early",
            "md-ms",
            Some("test:////n3"),
            None,
            json!({}),
            false,
        ),
    ];
    let nodes = vec![node("n3", "test:////n3", false)];
    let snap = build_snapshot(&inputs(vec![md, ms], machines, nodes));
    let g = &snap.groups["MachineDeployment/ns/md"];
    let by_id: BTreeMap<&str, _> = g.instances.iter().map(|i| (i.id.as_str(), i)).collect();
    assert_eq!(
        by_id["pending-machine-ns_pending"].state,
        InstanceState::Creating
    );
    assert!(by_id["pending-machine-ns_pending"].error.is_none());
    let failed = by_id["failed-machine-ns_failed"];
    assert_eq!(failed.state, InstanceState::Creating);
    let err = failed.error.as_ref().unwrap();
    assert_eq!((err.code.as_str(), err.class), ("ProvisioningFailed", 99));
    assert!(err.message.contains("quota exceeded"));
    let fd = by_id["failed-machine-ns_failed-deleting"];
    assert_eq!(
        (fd.state, fd.error.as_ref().unwrap().code.as_str()),
        (InstanceState::Deleting, "DeletingFailed")
    );
    assert_eq!(
        by_id["failed-machine-ns_failed-with-node"].state,
        InstanceState::Unspecified
    );
    assert_eq!(
        by_id["deleting-machine-ns_deleting"].state,
        InstanceState::Deleting
    );
    assert_eq!(
        by_id["pending-machine-ns_pending-with-pid"].state,
        InstanceState::Creating
    );
    assert_eq!(
        by_id["test:////n3"].state,
        InstanceState::Running,
        "a registered node counts even before nodeRef"
    );
    assert_eq!((g.registered, g.ready), (1, 0));
    // Synthetic ids resolve back to the group and the machine.
    let NodeGroupLookup::Group(found) =
        snap.group_for_provider_id("pending-machine-ns_pending", None)
    else {
        panic!()
    };
    assert_eq!(found.id, g.id);
    assert_eq!(
        snap.machine_for_provider_id("failed-machine-ns_failed", &cluster("c1"))
            .unwrap()
            .name,
        "failed"
    );
}

#[test]
fn machines_without_provider_id_resolve_through_node_ref_and_node_annotations() {
    let md = resource(
        ScalableKind::MachineDeployment,
        "md",
        bounds("0", "9"),
        Some(1),
        None,
    );
    let ms = resource(
        ScalableKind::MachineSet,
        "md-ms",
        json!({}),
        Some(1),
        Some("md"),
    );
    let m = machine("m0", "md-ms", None, Some("node-a"), json!({}), false);
    let mut n = node("node-a", "cloud:///zone/vm-a", true);
    n.annotations
        .insert("cluster.x-k8s.io/machine".into(), "m0".into());
    n.annotations
        .insert("cluster.x-k8s.io/cluster-namespace".into(), "ns".into());
    let snap = build_snapshot(&inputs(vec![md, ms], vec![m], vec![n]));
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert_eq!(g.instances[0].id, "cloud:///zone/vm-a");
    let NodeGroupLookup::Group(found) = snap.group_for_provider_id("cloud:///zone/vm-a", None)
    else {
        panic!()
    };
    assert_eq!(found.id, g.id);
}

#[test]
fn provider_id_collisions_are_reported_as_ambiguous() {
    let ms = resource(
        ScalableKind::MachineSet,
        "ms",
        bounds("0", "9"),
        Some(2),
        None,
    );
    let machines = vec![
        machine(
            "a",
            "ms",
            Some("aws:///zone-a/i-1"),
            Some("n1"),
            json!({}),
            false,
        ),
        machine(
            "b",
            "ms",
            Some("aws:///zone-b/i-1"),
            Some("n2"),
            json!({}),
            false,
        ),
    ];
    let snap = build_snapshot(&inputs(vec![ms], machines, vec![]));
    assert_eq!(
        snap.group_for_provider_id("aws:///zone-a/i-1", None),
        NodeGroupLookup::Ambiguous(2)
    );
}

#[test]
fn machine_pool_reports_its_provider_id_list_verbatim() {
    let obj = dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": "mp", "namespace": "ns", "annotations": bounds("1", "4")},
        "spec": {"clusterName": "c1", "replicas": 2, "providerIDList": ["kwok:////a", "kwok:////b"]}}),
    );
    let mp = ScalableResource::from_dynamic(ScalableKind::MachinePool, &obj, &CapiKeys::default());
    let snap = build_snapshot(&inputs(
        vec![mp],
        vec![],
        vec![node("a", "kwok:////a", true)],
    ));
    let g = &snap.groups["MachinePool/ns/mp"];
    assert_eq!(
        g.instances
            .iter()
            .map(|i| i.id.as_str())
            .collect::<Vec<_>>(),
        vec!["kwok:////a", "kwok:////b"]
    );
    assert_eq!(g.registered, 1);
    let NodeGroupLookup::Group(found) = snap.group_for_provider_id("kwok:////b", None) else {
        panic!()
    };
    assert_eq!(found.id, "MachinePool/ns/mp");
}

#[test]
fn bad_option_capacity_label_and_taint_values_keep_the_group_served_with_warnings() {
    let mut a = bounds("1", "3");
    for (k, v) in [
        (
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
            "10",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold",
            "1.1",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-scaledownunreadytime",
            "5m",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/cpu", "2"),
        ("capacity.cluster-autoscaler.kubernetes.io/memory", "16GB"),
        (
            "capacity.cluster-autoscaler.kubernetes.io/labels",
            "pool=a,foo",
        ),
        (
            "capacity.cluster-autoscaler.kubernetes.io/taints",
            "a=b:noschedule",
        ),
    ] {
        a[k] = json!(v);
    }
    let snap = build_snapshot(&deployment(1, a, 1));
    assert!(snap.exclusions.is_empty(), "{:?}", snap.exclusions);
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert_eq!(g.options.scale_down_unneeded_time, None, "CA's default");
    assert_eq!(
        g.options.scale_down_utilization_threshold, None,
        "CA's default"
    );
    assert_eq!(
        g.options.scale_down_unready_time,
        Some(std::time::Duration::from_secs(300))
    );
    assert!(
        g.template.is_none(),
        "memory was ignored, so no scale from zero"
    );
    let fields: Vec<&str> = g.warnings.iter().map(|w| w.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
            "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold",
            "capacity.cluster-autoscaler.kubernetes.io/memory",
            "capacity.cluster-autoscaler.kubernetes.io/labels",
            "capacity.cluster-autoscaler.kubernetes.io/taints",
        ]
    );
}

#[test]
fn a_bad_bound_still_excludes_and_reports_the_other_warnings_too() {
    let mut a = bounds("1", "three");
    a["capacity.cluster-autoscaler.kubernetes.io/labels"] = json!("foo");
    let snap = build_snapshot(&deployment(1, a, 1));
    assert!(snap.groups.is_empty());
    assert!(matches!(
        snap.exclusions[0].reason,
        ExclusionReason::Invalid(_)
    ));
    assert_eq!(snap.exclusions[0].warnings.len(), 1);
}

fn with_infra_ref(mut i: IndexInputs) -> IndexInputs {
    i.resources[0].infra_ref = Some(crate::capi::InfraRef {
        group: "infrastructure.cluster.x-k8s.io".into(),
        version: None,
        kind: "TestMachineTemplate".into(),
        name: "tpl".into(),
    });
    i
}

fn kind_state(i: &mut IndexInputs, state: TemplateKindState) {
    i.template_kinds.insert(
        (
            "infrastructure.cluster.x-k8s.io".into(),
            "TestMachineTemplate".into(),
        ),
        state,
    );
}

#[test]
fn zero_replicas_without_a_readable_template_says_precisely_why() {
    let zero = || with_infra_ref(deployment(0, bounds("0", "3"), 0));
    let reason = |i: &IndexInputs| build_snapshot(i).exclusions[0].reason.describe();

    let syncing = zero();
    assert!(
        reason(&syncing).contains(
            "TestMachineTemplate.infrastructure.cluster.x-k8s.io ns/tpl is not synced yet"
        ),
        "{}",
        reason(&syncing)
    );
    let mut missing = zero();
    kind_state(&mut missing, TemplateKindState::Ready);
    assert!(
        reason(&missing).contains("does not exist"),
        "{}",
        reason(&missing)
    );
    let mut empty = zero();
    kind_state(&mut empty, TemplateKindState::Ready);
    empty.templates.insert(
        TemplateKey {
            group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "TestMachineTemplate".into(),
            namespace: "ns".into(),
            name: "tpl".into(),
        },
        InfraTemplate::default(),
    );
    assert!(
        reason(&empty).contains("nor does the status.capacity of infrastructure template"),
        "{}",
        reason(&empty)
    );
}

#[test]
fn an_unreadable_template_kind_serves_the_group_with_a_warning_instead_of_hiding_it() {
    let mut i = with_infra_ref(deployment(0, bounds("0", "3"), 0));
    kind_state(
        &mut i,
        TemplateKindState::Unavailable("testmachinetemplates is forbidden".into()),
    );
    let snap = build_snapshot(&i);
    assert!(snap.exclusions.is_empty(), "{:?}", snap.exclusions);
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert!(g.template.is_none(), "TemplateNodeInfo stays UNIMPLEMENTED");
    assert_eq!(g.warnings.len(), 1);
    assert_eq!(g.warnings[0].field, "spec.template.spec.infrastructureRef");
    assert!(
        g.warnings[0]
            .message
            .contains("is not readable: testmachinetemplates is forbidden")
            && g.warnings[0]
                .message
                .contains("served without a scale-from-zero template"),
        "{}",
        g.warnings[0].message
    );
}

#[test]
fn live_node_labels_are_copied_into_the_template() {
    let mut a = bounds("1", "3");
    a["capacity.cluster-autoscaler.kubernetes.io/cpu"] = json!("2");
    a["capacity.cluster-autoscaler.kubernetes.io/memory"] = json!("4Gi");
    let mut i = deployment(1, a, 1);
    let labels = &mut Arc::make_mut(&mut i.nodes[0]).labels;
    labels.insert("node.kubernetes.io/instance-type".into(), "m5.large".into());
    labels.insert("unrelated".into(), "x".into());
    let snap = build_snapshot(&i);
    let t = snap.groups["MachineDeployment/ns/md"]
        .template
        .as_ref()
        .unwrap();
    assert_eq!(
        t.node_labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("m5.large")
    );
    assert!(!t.node_labels.contains_key("unrelated"));
}

fn cluster(name: &str) -> ClusterKey {
    ClusterKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}

/// Management topology: machines of Cluster c1, Nodes read from two workload clusters that
/// reuse node names (kubelets name nodes per cluster).
fn two_workload_clusters(states: Vec<(&str, WorkloadState)>) -> IndexInputs {
    let mut inputs = deployment(0, bounds("1", "5"), 2);
    inputs.machines = [
        // A provider that never sets Machine.spec.providerID: only nodeRef links the Node.
        machine("m0", "md-ms", None, Some("worker-0"), json!({}), false),
        machine(
            "m1",
            "md-ms",
            Some("test:////c1-1"),
            Some("worker-1"),
            json!({}),
            false,
        ),
    ]
    .into_iter()
    .map(Arc::new)
    .collect();
    let in_cluster = |name: &str, pid: &str, c: &str| NodeView {
        cluster: Some(cluster(c)),
        ..node(name, pid, true)
    };
    inputs.nodes = [
        in_cluster("worker-0", "test:////c1-0", "c1"),
        in_cluster("worker-1", "test:////c1-1", "c1"),
        // Same names in another workload cluster, other providerIDs.
        in_cluster("worker-0", "test:////c2-0", "c2"),
        in_cluster("worker-1", "test:////c2-1", "c2"),
    ]
    .into_iter()
    .map(Arc::new)
    .collect();
    inputs.clusters = vec![cluster("c1"), cluster("c2")];
    inputs.workload = Some(states.into_iter().map(|(c, s)| (cluster(c), s)).collect());
    inputs
}

#[test]
fn machines_are_matched_to_nodes_of_their_own_workload_cluster() {
    let snap = build_snapshot(&two_workload_clusters(vec![
        ("c1", WorkloadState::Synced),
        ("c2", WorkloadState::Synced),
    ]));
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert_eq!(g.cluster, cluster("c1"));
    let mut ids: Vec<&str> = g.instances.iter().map(|i| i.id.as_str()).collect();
    ids.sort();
    assert_eq!(
        ids,
        vec!["test:////c1-0", "test:////c1-1"],
        "the Machine without providerID is matched through its own cluster's Node, by nodeRef"
    );
    assert_eq!((g.registered, g.ready), (2, 2));
}

#[test]
fn groups_of_a_workload_cluster_never_read_are_held_back_and_unreachable_ones_served() {
    let snap = build_snapshot(&two_workload_clusters(vec![(
        "c1",
        WorkloadState::NeverSynced("Secret ns/c1-kubeconfig does not exist".into()),
    )]));
    assert!(snap.groups.is_empty());
    assert!(matches!(
        &snap.exclusions[0].reason,
        ExclusionReason::WorkloadClusterNotSynced(why) if why.contains("c1-kubeconfig")
    ));

    let snap = build_snapshot(&two_workload_clusters(vec![(
        "c1",
        WorkloadState::Unreachable("connection refused".into()),
    )]));
    let g = &snap.groups["MachineDeployment/ns/md"];
    assert_eq!(g.registered, 2, "the last known Nodes are used");
    assert_eq!(snap.workload.len(), 1);
}

/// Cluster c1 (namespace `ns`) runs MachineSet `ms` with machines on `i-1` and `i-2`; a tenant
/// with Cluster `b` in namespace `tenant-b` copies them: a Machine with `i-1`, a MachinePool
/// listing `i-2`, and a Node of c1 on `i-3` annotated as if it were the tenant's Machine.
fn a_tenant_copying_provider_ids() -> IndexInputs {
    let ms = resource(
        ScalableKind::MachineSet,
        "ms",
        bounds("0", "9"),
        Some(2),
        None,
    );
    let own = |name: &str, pid: &str| machine(name, "ms", Some(pid), None, json!({}), false);
    let tenant_set = dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
        "metadata": {"name": "copy", "namespace": "tenant-b", "annotations": bounds("0", "9")},
        "spec": {"clusterName": "b", "replicas": 1}}),
    );
    let tenant_pool = dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": "pool", "namespace": "tenant-b", "annotations": bounds("0", "9")},
        "spec": {"clusterName": "b", "replicas": 1, "providerIDList": ["aws:///zone-a/i-2"]}}),
    );
    let tenant_machine = Machine::from_dynamic(&dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "copy-1", "namespace": "tenant-b",
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "copy", "uid": "z"}]},
        "spec": {"clusterName": "b", "providerID": "aws:///zone-a/i-1"}}),
    ));
    let keys = CapiKeys::default();
    let mut annotated = node("n3", "aws:///zone-a/i-3", true);
    annotated.cluster = Some(cluster("c1"));
    annotated
        .annotations
        .insert(keys.node_cluster_namespace.clone(), "tenant-b".into());
    annotated
        .annotations
        .insert(keys.node_machine.clone(), "copy-1".into());
    let mut inputs = inputs(
        vec![
            ms,
            ScalableResource::from_dynamic(ScalableKind::MachineSet, &tenant_set, &keys),
            ScalableResource::from_dynamic(ScalableKind::MachinePool, &tenant_pool, &keys),
        ],
        vec![
            own("m1", "aws:///zone-a/i-1"),
            own("m2", "aws:///zone-a/i-2"),
            tenant_machine,
        ],
        vec![annotated],
    );
    inputs.clusters = vec![cluster("c1"), tenant_b()];
    inputs
}

fn tenant_b() -> ClusterKey {
    ClusterKey {
        namespace: "tenant-b".into(),
        name: "b".into(),
    }
}

fn group_id(lookup: NodeGroupLookup) -> String {
    match lookup {
        NodeGroupLookup::Group(g) => g.id.clone(),
        other => format!("{other:?}"),
    }
}

#[test]
fn provider_ids_resolve_only_among_the_calling_clusters_objects() {
    let snap = build_snapshot(&a_tenant_copying_provider_ids());
    let c1 = cluster("c1");
    for pid in ["aws:///zone-a/i-1", "aws:///zone-a/i-2"] {
        assert_eq!(
            group_id(snap.group_for_provider_id(pid, Some(&c1))),
            "MachineSet/ns/ms",
            "{pid}: the tenant's copy neither hides nor takes over c1's node"
        );
    }
    assert_eq!(
        snap.group_for_provider_id("aws:///zone-a/i-3", Some(&c1)),
        NodeGroupLookup::None,
        "a Node of c1 annotated with another cluster's Machine belongs to no group of c1"
    );
    assert_eq!(
        snap.machine_for_provider_id("aws:///zone-a/i-1", &c1)
            .map(|m| m.name.as_str()),
        Some("m1")
    );
    // The tenant's objects resolve only for the tenant.
    let b = tenant_b();
    assert_eq!(
        group_id(snap.group_for_provider_id("aws:///zone-a/i-1", Some(&b))),
        "MachineSet/tenant-b/copy"
    );
    assert_eq!(
        group_id(snap.group_for_provider_id("aws:///zone-a/i-2", Some(&b))),
        "MachinePool/tenant-b/pool"
    );
    assert_eq!(
        snap.group_for_provider_id("aws:///zone-a/i-3", Some(&b)),
        NodeGroupLookup::None,
        "a Node read from c1 is not the tenant's, whatever its annotations say"
    );
    // Synthetic ids name a Machine: they resolve only within its Cluster too.
    assert_eq!(
        snap.group_for_provider_id("failed-machine-tenant-b_copy-1", Some(&c1)),
        NodeGroupLookup::None
    );
    assert_eq!(
        snap.machine_for_provider_id("failed-machine-tenant-b_copy-1", &c1),
        None
    );
    // Scoping off (one operator, one cluster): every Cluster's objects count.
    assert_eq!(
        snap.group_for_provider_id("aws:///zone-a/i-1", None),
        NodeGroupLookup::Ambiguous(2)
    );
    assert!(
        snap.groups["MachineSet/ns/ms"].warnings.is_empty(),
        "another cluster's copies are no collision of c1: {:?}",
        snap.groups["MachineSet/ns/ms"].warnings
    );
}

#[test]
fn a_provider_id_collision_in_one_cluster_is_reported_on_both_groups_and_affects_only_that_node() {
    let mut inputs = inputs(
        vec![
            resource(
                ScalableKind::MachineSet,
                "x",
                bounds("0", "9"),
                Some(2),
                None,
            ),
            resource(
                ScalableKind::MachineSet,
                "y",
                bounds("0", "9"),
                Some(1),
                None,
            ),
        ],
        vec![
            machine("x1", "x", Some("aws:///zone-a/i-1"), None, json!({}), false),
            machine("x2", "x", Some("aws:///zone-a/i-2"), None, json!({}), false),
            machine("y1", "y", Some("aws:///zone-b/i-1"), None, json!({}), false),
        ],
        vec![],
    );
    inputs.clusters = vec![cluster("c1")];
    let snap = build_snapshot(&inputs);
    let c1 = cluster("c1");
    assert_eq!(
        snap.group_for_provider_id("aws:///zone-a/i-1", Some(&c1)),
        NodeGroupLookup::Ambiguous(2)
    );
    assert_eq!(
        group_id(snap.group_for_provider_id("aws:///zone-a/i-2", Some(&c1))),
        "MachineSet/ns/x",
        "the other machines of the group are unaffected"
    );
    for (id, other) in [("MachineSet/ns/x", "ns/y1"), ("MachineSet/ns/y", "ns/x1")] {
        let warnings = &snap.groups[id].warnings;
        assert_eq!(warnings.len(), 1, "{id}: {warnings:?}");
        assert_eq!(warnings[0].field, "spec.providerID");
        assert!(
            warnings[0].message.contains(other) && warnings[0].message.contains("i-1"),
            "{id}: {}",
            warnings[0].message
        );
    }
}
