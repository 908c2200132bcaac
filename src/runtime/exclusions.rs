//! Surfaces problems in the autoscaler configuration of scalable resources: a resource that is
//! not served because of an invalid value (only unusable min/max do that), and a group that is
//! served although some of its values were ignored or kept as written. Each distinct problem
//! gets one Warning Event on the resource, one on its governing policy, and a log line. Other
//! groups are unaffected.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio_util::sync::CancellationToken;

use ngo_index::capi::ScalableKind;
use ngo_index::index::{ConfigWarning, ExclusionReason, PolicyRef, Snapshot, SnapshotHandle};
use ngo_service::discovery::CapiResources;
use ngo_service::events::{EventPublisher, Severity};

/// Event reason for a resource that is not served because of invalid autoscaler configuration.
pub const INVALID_REASON: &str = "InvalidAutoscalerConfiguration";
/// Event reason for a resource whose unusable values were ignored (it is served regardless, or
/// not served for a reason of its own such as having no scale-from-zero capacity).
pub const WARNING_REASON: &str = "AutoscalerConfigurationWarning";

/// One problem to report on a scalable resource.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Finding {
    kind: ScalableKind,
    namespace: String,
    name: String,
    uid: String,
    policy: Option<PolicyRef>,
    /// [`INVALID_REASON`] or [`WARNING_REASON`].
    reason: &'static str,
    /// The Event note on the resource.
    message: String,
}

impl Finding {
    fn id(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

fn list(warnings: &[ConfigWarning]) -> String {
    warnings
        .iter()
        .map(|w| w.message.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The problems a snapshot shows: invalid exclusions (with any warnings alongside), and
/// warnings on served groups or on resources excluded for other reasons. Paused resources and
/// resources that are not autoscaled are not nagged about.
fn findings(snapshot: &Snapshot) -> Vec<Finding> {
    let mut out = Vec::new();
    for exclusion in &snapshot.exclusions {
        let (reason, message) = match &exclusion.reason {
            ExclusionReason::Invalid(why) if exclusion.warnings.is_empty() => {
                (INVALID_REASON, format!("not served as a node group: {why}"))
            }
            ExclusionReason::Invalid(why) => (
                INVALID_REASON,
                format!(
                    "not served as a node group: {why}; values also ignored: {}",
                    list(&exclusion.warnings)
                ),
            ),
            ExclusionReason::Paused(_) | ExclusionReason::NotAutoscaled => continue,
            _ if exclusion.warnings.is_empty() => continue,
            other => (
                WARNING_REASON,
                format!(
                    "values ignored: {}; (not served as a node group: {})",
                    list(&exclusion.warnings),
                    other.describe()
                ),
            ),
        };
        out.push(Finding {
            kind: exclusion.kind,
            namespace: exclusion.namespace.clone(),
            name: exclusion.name.clone(),
            uid: exclusion.uid.clone(),
            policy: exclusion.policy.clone(),
            reason,
            message,
        });
    }
    for group in snapshot.groups.values().filter(|g| !g.warnings.is_empty()) {
        out.push(Finding {
            kind: group.kind,
            namespace: group.namespace.clone(),
            name: group.name.clone(),
            uid: group.uid.clone(),
            policy: group.policy.clone(),
            reason: WARNING_REASON,
            message: format!(
                "served as a node group; values that could not be used: {}",
                list(&group.warnings)
            ),
        });
    }
    out
}

/// Watches snapshots for one leadership term (see `leader::while_leading`), until `term` is
/// cancelled, and reports new or changed problems (each once per term).
pub async fn report(
    mut snapshots: SnapshotHandle,
    resources: CapiResources,
    events: EventPublisher,
    term: CancellationToken,
) -> anyhow::Result<()> {
    let mut reported: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = term.cancelled() => return Ok(()),
            alive = snapshots.changed() => if !alive { return Ok(()) },
        }
        let Some(snapshot) = snapshots.current() else {
            continue;
        };
        let mut current = HashMap::new();
        for finding in findings(&snapshot) {
            let key = finding.id();
            current.insert(key.clone(), finding.message.clone());
            if reported.get(&key) == Some(&finding.message) {
                continue;
            }
            if finding.reason == INVALID_REASON {
                tracing::warn!(resource = %key, detail = %finding.message, "not serving node group: invalid autoscaler configuration");
            } else {
                tracing::warn!(resource = %key, detail = %finding.message, "autoscaler configuration values ignored");
            }
            let Some(ar) = resources.scalable(finding.kind) else {
                continue;
            };
            let reference = ObjectReference {
                api_version: Some(ar.api_version.clone()),
                kind: Some(ar.kind.clone()),
                namespace: Some(finding.namespace.clone()),
                name: Some(finding.name.clone()),
                uid: Some(finding.uid.clone()).filter(|u| !u.is_empty()),
                ..Default::default()
            };
            events
                .publish(
                    &reference,
                    Severity::Warning,
                    finding.reason,
                    "Validate",
                    finding.message.clone(),
                )
                .await;
            if let Some(policy) = &finding.policy {
                events
                    .publish(
                        &ngo_service::events::policy_reference(policy),
                        Severity::Warning,
                        finding.reason,
                        "Validate",
                        format!("{key}: {}", finding.message),
                    )
                    .await;
            }
        }
        reported = current;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use ngo_index::capi::CapiKeys;
    use ngo_index::capi::objects::ScalableResource;
    use ngo_index::index::{IndexInputs, build_snapshot};

    fn md(name: &str, annotations: serde_json::Value) -> ScalableResource {
        let obj = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "annotations": annotations},
            "spec": {"clusterName": "c1", "replicas": 1}
        }))
        .unwrap();
        ScalableResource::from_dynamic(ScalableKind::MachineDeployment, &obj, &CapiKeys::default())
    }

    const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
    const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";

    #[test]
    fn served_groups_with_ignored_values_and_invalid_exclusions_are_reported() {
        let inputs = IndexInputs {
            resources: vec![
                md("fine", json!({MIN: "0", MAX: "3"})),
                md(
                    "warned",
                    json!({MIN: "0", MAX: "3",
                    "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime": "10"}),
                ),
                md("invalid", json!({MIN: "0", MAX: "lots"})),
                md(
                    "paused",
                    json!({MIN: "0", MAX: "3", "cluster.x-k8s.io/paused": "",
                    "capacity.cluster-autoscaler.kubernetes.io/memory": "16GB"}),
                ),
            ],
            ..Default::default()
        };
        let found = findings(&build_snapshot(&inputs));
        let summary: Vec<(&str, &str)> =
            found.iter().map(|f| (f.name.as_str(), f.reason)).collect();
        assert_eq!(
            summary,
            vec![("invalid", INVALID_REASON), ("warned", WARNING_REASON)]
        );
        assert!(
            found[1].message.starts_with("served as a node group")
                && found[1].message.contains("scaledownunneededtime"),
            "{}",
            found[1].message
        );
    }
}
