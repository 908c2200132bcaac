use std::sync::Arc;

use super::*;
use ngo_index::index::{NodeGroup, PolicyRef};

fn policy() -> NodeGroupPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
        "metadata": {"name": "p", "namespace": "ns", "generation": 3},
        "spec": {"selector": {}}
    }))
    .unwrap()
}

fn group(id: &str) -> NodeGroup {
    NodeGroup {
        id: id.into(),
        kind: ngo_index::capi::ScalableKind::MachineDeployment,
        namespace: "ns".into(),
        name: "md".into(),
        cluster: Default::default(),
        uid: String::new(),
        min: 1,
        max: 5,
        min_source: Source::Policy,
        max_source: Source::Annotation,
        target: 3,
        instances: vec![],
        registered: 3,
        ready: 2,
        options: Default::default(),
        template: None,
        provider_id_list: None,
        policy: None,
        pricing: None,
        node_capacity: Default::default(),
        warnings: vec![],
        scale_down_claim: None,
        rolling_out: None,
        applied_decrements: Vec::new(),
    }
}

fn snapshot(report: PolicyReport, groups: &[&str]) -> Snapshot {
    let mut s = Snapshot::default();
    for id in groups {
        s.groups.insert(id.to_string(), Arc::new(group(id)));
    }
    s.policies.insert("ns/p".into(), report);
    s
}

fn report() -> PolicyReport {
    PolicyReport {
        reference: PolicyRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: String::new(),
        },
        ..Default::default()
    }
}

fn condition<'a>(
    status: &'a NodeGroupPolicyStatus,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    status.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

fn now() -> Time {
    Time(jiff::Timestamp::from_second(1_000).unwrap())
}

#[test]
fn served_groups_make_the_policy_ready_with_effective_values_and_sources() {
    let mut r = report();
    r.governed = vec!["MachineDeployment/ns/md".into()];
    let status = compute(
        &policy(),
        &snapshot(r, &["MachineDeployment/ns/md"]),
        &ActivityLog::default(),
        &now(),
    );
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(
        (
            status.group_count,
            status.target_nodes,
            status.registered_nodes,
            status.ready_nodes,
            status.excluded_resources
        ),
        (1, 3, 3, 2, 0)
    );
    let g = &status.groups[0];
    assert_eq!(
        (g.min_size, g.min_source.as_str(), g.max_source.as_str()),
        (1, "Policy", "Annotation")
    );
    let ready = condition(&status, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "GroupsServed")
    );
    assert_eq!(condition(&status, CONFLICT).status, "False");
}

#[test]
fn no_match_conflict_invalid_spec_and_scale_up_failure_have_their_reasons() {
    let status = compute(
        &policy(),
        &snapshot(report(), &[]),
        &ActivityLog::default(),
        &now(),
    );
    assert_eq!(condition(&status, READY).reason, "NoMatchingResources");

    let mut r = report();
    r.conflicts = vec![("MachineDeployment/ns/md".into(), "ns/older".into())];
    let status = compute(
        &policy(),
        &snapshot(r, &[]),
        &ActivityLog::default(),
        &now(),
    );
    assert_eq!(condition(&status, READY).reason, "Conflict");
    let conflict = condition(&status, CONFLICT);
    assert_eq!(conflict.status, "True");
    assert!(
        conflict
            .message
            .contains("MachineDeployment/ns/md (by ns/older)"),
        "{}",
        conflict.message
    );

    let mut r = report();
    r.invalid = Some("spec.selector.matchLabels: bad".into());
    let status = compute(
        &policy(),
        &snapshot(r, &[]),
        &ActivityLog::default(),
        &now(),
    );
    assert_eq!(condition(&status, READY).reason, "InvalidSpec");

    let mut r = report();
    r.governed = vec!["MachineDeployment/ns/md".into()];
    let log = ActivityLog::default();
    log.failure(
        "MachineDeployment/ns/md",
        Direction::Up,
        "quota".into(),
        jiff::Timestamp::now(),
    );
    let status = compute(
        &policy(),
        &snapshot(r, &["MachineDeployment/ns/md"]),
        &log,
        &now(),
    );
    let ready = condition(&status, READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ScaleUpFailed")
    );
    assert!(ready.message.contains("quota"));
}

#[test]
fn invalid_resources_are_listed_with_their_problem() {
    let mut r = report();
    r.governed = vec!["MachineDeployment/ns/md".into()];
    r.excluded = vec![(
        "MachineDeployment/ns/bad".into(),
        "annotation x: must be an integer".into(),
    )];
    let status = compute(
        &policy(),
        &snapshot(r, &["MachineDeployment/ns/md"]),
        &ActivityLog::default(),
        &now(),
    );
    let valid = condition(&status, RESOURCES_VALID);
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidConfiguration")
    );
    assert!(valid.message.contains("MachineDeployment/ns/bad"));
    assert_eq!(
        status.groups[1].problem.as_deref(),
        Some("annotation x: must be an integer")
    );
    let ready = condition(&status, READY);
    assert_eq!(ready.status, "True", "other groups keep being served");
    assert_eq!(
        ready.message,
        "serving 1 node group(s); not served: MachineDeployment/ns/bad: annotation x: must be an integer",
        "kubectl get ngp -o wide shows why, without reading status.groups"
    );
    assert_eq!(status.excluded_resources, 1);
}

#[test]
fn served_groups_with_ignored_values_keep_the_policy_ready_and_list_the_warnings() {
    let id = "MachineDeployment/ns/md";
    let warning = "annotation capacity.cluster-autoscaler.kubernetes.io/labels=\"pool=a,foo\": label \"foo\" is not key=value; item \"foo\" skipped";
    let mut r = report();
    r.governed = vec![id.into()];
    r.warnings.insert(id.into(), vec![warning.into()]);
    let mut s = snapshot(r, &[]);
    let mut g = group(id);
    g.warnings = vec![ngo_index::index::ConfigWarning {
        field: "capacity.cluster-autoscaler.kubernetes.io/labels".into(),
        message: warning.into(),
    }];
    s.groups.insert(id.into(), Arc::new(g));
    let status = compute(&policy(), &s, &ActivityLog::default(), &now());
    let valid = condition(&status, RESOURCES_VALID);
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "InvalidValuesIgnored")
    );
    assert!(
        valid.message.contains(id) && valid.message.contains("foo"),
        "{}",
        valid.message
    );
    assert_eq!(status.groups[0].warnings, vec![warning.to_string()]);
    assert_eq!(status.groups[0].problem, None);
    assert_eq!(condition(&status, READY).status, "True");
}

#[test]
fn a_policy_the_index_has_not_taken_in_yet_has_unknown_conditions() {
    let status = compute(
        &policy(),
        &Snapshot::default(),
        &ActivityLog::default(),
        &now(),
    );
    for type_ in [
        READY,
        CONFLICT,
        RESOURCES_VALID,
        WORKLOAD_CLUSTERS_REACHABLE,
    ] {
        let c = condition(&status, type_);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", "NotIndexedYet"),
            "{type_}"
        );
    }
}

#[test]
fn a_workload_cluster_read_for_the_first_time_is_unknown_not_unreachable() {
    let id = "MachineDeployment/ns/md";
    let cluster = ngo_index::index::ClusterKey {
        namespace: "ns".into(),
        name: "c1".into(),
    };
    let mut r = report();
    r.governed = vec![id.into()];
    let mut s = snapshot(r, &[]);
    let mut g = group(id);
    g.cluster = cluster.clone();
    s.groups.insert(id.into(), Arc::new(g));
    s.nodes_per_cluster = true;
    s.workload.insert(cluster.clone(), WorkloadState::Syncing);
    let status = compute(&policy(), &s, &ActivityLog::default(), &now());
    let reachable = condition(&status, WORKLOAD_CLUSTERS_REACHABLE);
    assert_eq!(
        (reachable.status.as_str(), reachable.reason.as_str()),
        ("Unknown", "FirstRead")
    );
    assert!(
        reachable
            .message
            .contains("ns/c1 is being read for the first time"),
        "{}",
        reachable.message
    );
    s.workload
        .insert(cluster, WorkloadState::NeverSynced("Secret missing".into()));
    let status = compute(&policy(), &s, &ActivityLog::default(), &now());
    assert_eq!(
        condition(&status, WORKLOAD_CLUSTERS_REACHABLE).status,
        "False",
        "a cluster that cannot be read is known unreachable"
    );
}

#[test]
fn a_conflict_that_no_longer_applies_turns_false_and_is_not_dropped() {
    let mut r = report();
    r.governed = vec!["MachineDeployment/ns/md".into()];
    r.conflicts = vec![("MachineDeployment/ns/other".into(), "ns/older".into())];
    let mut p = policy();
    let conflicting = compute(
        &p,
        &snapshot(r.clone(), &["MachineDeployment/ns/md"]),
        &ActivityLog::default(),
        &now(),
    );
    assert_eq!(condition(&conflicting, CONFLICT).status, "True");
    p.status = Some(conflicting);
    r.conflicts.clear();
    let later = Time(jiff::Timestamp::from_second(2_000).unwrap());
    let resolved = compute(
        &p,
        &snapshot(r, &["MachineDeployment/ns/md"]),
        &ActivityLog::default(),
        &later,
    );
    let conflict = condition(&resolved, CONFLICT);
    assert_eq!(
        (conflict.status.as_str(), conflict.reason.as_str()),
        ("False", "NoConflict")
    );
    assert_eq!(
        conflict.last_transition_time, later,
        "the flip is a transition"
    );
}
