//! Several workload clusters: Nodes matched in their own cluster, groups of a cluster never
//! read held back, and provider IDs resolved among the calling cluster's objects only.

use super::*;

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
