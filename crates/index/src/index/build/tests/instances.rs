//! Machines as instances, and the group a Node belongs to.

use super::*;

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
