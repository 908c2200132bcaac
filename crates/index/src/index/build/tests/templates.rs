//! Scale from zero: the template a group at 0 replicas is served with, or why it is not.

use super::*;

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
