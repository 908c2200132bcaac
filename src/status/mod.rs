//! NodeGroupPolicy status: computed by a pure function from the snapshot and recent activity
//! (`compute`), written by the leader with server-side apply (`writer`).

pub mod writer;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use ngo_api::conditions::{self, ConditionStatus, DesiredCondition};
use ngo_api::policy::{GroupStatus, NodeGroupPolicy, NodeGroupPolicyStatus};
use ngo_index::index::{PolicyReport, Snapshot, Source, WorkloadState};
use ngo_service::actuate::ActivityLog;
use ngo_service::actuate::activity::Direction;

/// Condition type (normal-true): the policy governs at least one served group and nothing is
/// failing.
pub const READY: &str = "Ready";
/// Condition type (abnormal-true): some selected resources are governed by an older policy.
/// Always written: False (`NoConflict`) when no other policy governs a selected resource, so a
/// conflict that is resolved turns False instead of disappearing.
pub const CONFLICT: &str = "Conflict";
/// Condition type (normal-true): every governed resource has valid autoscaler configuration.
/// False when a resource is not served for it (`InvalidConfiguration`) or when served groups
/// have values that were ignored (`InvalidValuesIgnored`).
pub const RESOURCES_VALID: &str = "ResourcesValid";

/// Condition type (normal-true): the workload clusters of the governed groups can be read
/// (management topology; always True when Nodes come from one cluster). Unknown (`FirstRead`)
/// while a cluster's Nodes are being read for the first time and no cluster is known to be
/// unreachable.
pub const WORKLOAD_CLUSTERS_REACHABLE: &str = "WorkloadClustersReachable";

/// The reason of every condition of a policy the index has not taken in yet (the status
/// writer's cache has it, the snapshot does not): none of them is known.
pub const NOT_INDEXED_YET: &str = "NotIndexedYet";

fn source(s: Source) -> String {
    format!("{s:?}")
}

/// The status `policy` should have now.
pub fn compute(
    policy: &NodeGroupPolicy,
    snapshot: &Snapshot,
    activity: &ActivityLog,
    now: &Time,
) -> NodeGroupPolicyStatus {
    let key = format!(
        "{}/{}",
        policy.namespace().unwrap_or_default(),
        policy.name_any()
    );
    let generation = policy.metadata.generation;
    let previous = policy
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let Some(report) = snapshot.policies.get(&key) else {
        return not_indexed_yet(previous, generation, now);
    };
    let to_time = |t: jiff::Timestamp| Time(t);

    let mut groups = Vec::new();
    let mut failures = Vec::new();
    for id in &report.governed {
        let Some(g) = snapshot.group(id) else {
            continue;
        };
        let recent = activity.get(id);
        if let Some(f) = recent
            .last_failure
            .as_ref()
            .filter(|f| f.direction == Direction::Up)
        {
            failures.push(format!("{id}: {}", f.message));
        }
        groups.push(GroupStatus {
            id: id.clone(),
            min_size: g.min,
            min_source: source(g.min_source),
            max_size: g.max,
            max_source: source(g.max_source),
            target: g.target,
            registered: g.registered as i32,
            ready: g.ready as i32,
            last_scale_up: recent.last_scale_up.map(to_time),
            last_scale_down: recent.last_scale_down.map(to_time),
            problem: None,
            warnings: g.warnings.iter().map(|w| w.message.clone()).collect(),
        });
    }
    for (id, why) in &report.excluded {
        groups.push(GroupStatus {
            id: id.clone(),
            problem: Some(why.clone()),
            warnings: report.warnings.get(id).cloned().unwrap_or_default(),
            ..Default::default()
        });
    }

    let served = report.governed.len();
    let ready = if let Some(reason) = &report.invalid {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::False,
            reason: "InvalidSpec".into(),
            message: reason.clone(),
        }
    } else if served == 0 && report.excluded.is_empty() && !report.conflicts.is_empty() {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::False,
            reason: "Conflict".into(),
            message: format!(
                "every selected resource is governed by an older policy: {}",
                list_conflicts(report)
            ),
        }
    } else if served == 0 && report.excluded.is_empty() {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::False,
            reason: "NoMatchingResources".into(),
            message: format!(
                "the selector matches no MachineDeployment, MachineSet or MachinePool in namespace {}",
                policy.namespace().unwrap_or_default()
            ),
        }
    } else if served == 0 {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::False,
            reason: "NoServedGroups".into(),
            message: format!(
                "no selected resource is served: {}",
                list_pairs(&report.excluded)
            ),
        }
    } else if !failures.is_empty() {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::False,
            reason: "ScaleUpFailed".into(),
            message: failures.join("; "),
        }
    } else if report.excluded.is_empty() {
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::True,
            reason: "GroupsServed".into(),
            message: format!("serving {served} node group(s)"),
        }
    } else {
        // Served groups keep the policy Ready; the ones left out are named here so that
        // `kubectl get ngp -o wide` says why without reading status.groups.
        DesiredCondition {
            type_: READY,
            status: ConditionStatus::True,
            reason: "GroupsServed".into(),
            message: format!(
                "serving {served} node group(s); not served: {}",
                list_pairs(&report.excluded)
            ),
        }
    };
    let conflict = if report.conflicts.is_empty() {
        DesiredCondition {
            type_: CONFLICT,
            status: ConditionStatus::False,
            reason: "NoConflict".into(),
            message: "no other policy governs a selected resource".into(),
        }
    } else {
        DesiredCondition {
            type_: CONFLICT,
            status: ConditionStatus::True,
            reason: "OlderPolicyGoverns".into(),
            message: format!(
                "governed by older policies instead: {}",
                list_conflicts(report)
            ),
        }
    };
    let invalid: Vec<&(String, String)> = report
        .excluded
        .iter()
        .filter(|(_, why)| !why.starts_with("paused") && !why.starts_with("no max size"))
        .collect();
    let warned = || {
        report
            .warnings
            .iter()
            .map(|(id, warnings)| format!("{id}: {}", warnings.join("; ")))
    };
    let valid = if !invalid.is_empty() {
        DesiredCondition {
            type_: RESOURCES_VALID,
            status: ConditionStatus::False,
            reason: "InvalidConfiguration".into(),
            message: invalid
                .iter()
                .map(|(id, why)| format!("{id}: {why}"))
                .chain(warned())
                .collect::<Vec<_>>()
                .join("; "),
        }
    } else if !report.warnings.is_empty() {
        DesiredCondition {
            type_: RESOURCES_VALID,
            status: ConditionStatus::False,
            reason: "InvalidValuesIgnored".into(),
            message: format!(
                "served with defaults for values that could not be used: {}",
                warned().collect::<Vec<_>>().join("; ")
            ),
        }
    } else {
        DesiredCondition {
            type_: RESOURCES_VALID,
            status: ConditionStatus::True,
            reason: "AllValid".into(),
            message: "every governed resource is valid".into(),
        }
    };
    let reachable = workload_condition(report, snapshot);
    NodeGroupPolicyStatus {
        observed_generation: generation,
        conditions: conditions::merge(
            previous,
            &[ready, conflict, valid, reachable],
            generation,
            now,
        ),
        group_count: served as i32,
        target_nodes: groups.iter().map(|g| g.target).sum(),
        ready_nodes: groups.iter().map(|g| g.ready).sum(),
        registered_nodes: groups.iter().map(|g| g.registered).sum(),
        excluded_resources: report.excluded.len() as i32,
        groups,
    }
}

/// The status of a policy the index has not taken in yet: every condition Unknown, nothing
/// counted.
fn not_indexed_yet(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    generation: Option<i64>,
    now: &Time,
) -> NodeGroupPolicyStatus {
    let unknown = |type_| DesiredCondition {
        type_,
        status: ConditionStatus::Unknown,
        reason: NOT_INDEXED_YET.into(),
        message: "the operator's index has not taken this policy in yet".into(),
    };
    NodeGroupPolicyStatus {
        observed_generation: generation,
        conditions: conditions::merge(
            previous,
            &[
                unknown(READY),
                unknown(CONFLICT),
                unknown(RESOURCES_VALID),
                unknown(WORKLOAD_CLUSTERS_REACHABLE),
            ],
            generation,
            now,
        ),
        ..Default::default()
    }
}

/// Whether the workload clusters of the groups a policy governs (served, or held back because
/// their cluster was never read) can be read.
fn workload_condition(report: &PolicyReport, snapshot: &Snapshot) -> DesiredCondition {
    if !snapshot.nodes_per_cluster {
        return DesiredCondition {
            type_: WORKLOAD_CLUSTERS_REACHABLE,
            status: ConditionStatus::True,
            reason: "SameCluster".into(),
            message: "Nodes are read from the cluster that holds the Cluster API objects".into(),
        };
    }
    let mut clusters = std::collections::BTreeSet::new();
    for id in &report.governed {
        if let Some(g) = snapshot.group(id) {
            clusters.insert(g.cluster.clone());
        }
    }
    for (_, why) in &report.excluded {
        clusters.extend(
            snapshot
                .workload
                .keys()
                .filter(|c| why.contains(&format!("workload cluster {c}")))
                .cloned(),
        );
    }
    let mut problems = Vec::new();
    let mut first_reads = Vec::new();
    for c in &clusters {
        match snapshot.workload.get(c) {
            Some(WorkloadState::Synced) => {}
            Some(WorkloadState::Unreachable(reason)) => problems.push(format!(
                "{c} is unreachable ({reason}); its groups are served from the last known Nodes"
            )),
            Some(WorkloadState::NeverSynced(reason)) => problems.push(format!(
                "{c} cannot be read ({reason}); its groups are not served"
            )),
            Some(WorkloadState::Syncing) => {
                first_reads.push(format!("{c} is being read for the first time"));
            }
            None => problems.push(format!("{c} is not a known Cluster")),
        }
    }
    if problems.is_empty() && !first_reads.is_empty() {
        // Not unreachable: not known yet.
        DesiredCondition {
            type_: WORKLOAD_CLUSTERS_REACHABLE,
            status: ConditionStatus::Unknown,
            reason: "FirstRead".into(),
            message: first_reads.join("; "),
        }
    } else if problems.is_empty() {
        DesiredCondition {
            type_: WORKLOAD_CLUSTERS_REACHABLE,
            status: ConditionStatus::True,
            reason: "Reachable".into(),
            message: format!(
                "the Nodes of {} workload cluster(s) are read",
                clusters.len()
            ),
        }
    } else {
        DesiredCondition {
            type_: WORKLOAD_CLUSTERS_REACHABLE,
            status: ConditionStatus::False,
            reason: "WorkloadClusterUnreachable".into(),
            message: problems
                .into_iter()
                .chain(first_reads)
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

fn list_conflicts(report: &PolicyReport) -> String {
    report
        .conflicts
        .iter()
        .map(|(id, by)| format!("{id} (by {by})"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_pairs(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(id, why)| format!("{id}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests;
