//! Which scalable resources are groups, with which bounds, and why the others are not.

use super::*;

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
fn replicas_unset_is_excluded_with_a_reason() {
    let ms = resource(ScalableKind::MachineSet, "ms", bounds("1", "3"), None, None);
    let snap = build_snapshot(&inputs(vec![ms], vec![], vec![]));
    assert!(snap.groups.is_empty());
    assert_eq!(snap.exclusions[0].reason, ExclusionReason::ReplicasUnset);
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
