//! Surfaces resources excluded for invalid configuration: one Warning Event per distinct
//! problem on the resource, and a log line. Other groups are unaffected.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::ObjectReference;
use tokio_util::sync::CancellationToken;

use crate::capi::resources::CapiResources;
use crate::events::{EventPublisher, Severity};
use crate::index::{ExclusionReason, SnapshotHandle};

/// Event reason for invalid autoscaler annotations.
pub const INVALID_REASON: &str = "InvalidAutoscalerConfiguration";

/// Watches snapshots until `shutdown` and reports newly invalid resources.
pub async fn report(
    mut snapshots: SnapshotHandle,
    resources: CapiResources,
    events: EventPublisher,
    leader: tokio::sync::watch::Receiver<bool>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut reported: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            alive = snapshots.changed() => if !alive { return Ok(()) },
        }
        if !*leader.borrow() {
            continue;
        }
        let Some(snapshot) = snapshots.current() else {
            continue;
        };
        let mut current = HashMap::new();
        for exclusion in &snapshot.exclusions {
            let ExclusionReason::Invalid(message) = &exclusion.reason else {
                continue;
            };
            let key = format!(
                "{}/{}/{}",
                exclusion.kind, exclusion.namespace, exclusion.name
            );
            current.insert(key.clone(), message.clone());
            if reported.get(&key) == Some(message) {
                continue;
            }
            tracing::warn!(resource = %key, %message, "not serving node group: invalid autoscaler configuration");
            let Some(ar) = resources.scalable(exclusion.kind) else {
                continue;
            };
            let reference = ObjectReference {
                api_version: Some(ar.api_version.clone()),
                kind: Some(ar.kind.clone()),
                namespace: Some(exclusion.namespace.clone()),
                name: Some(exclusion.name.clone()),
                uid: Some(exclusion.uid.clone()).filter(|u| !u.is_empty()),
                ..Default::default()
            };
            events
                .publish(
                    &reference,
                    Severity::Warning,
                    INVALID_REASON,
                    "Validate",
                    format!("not served as a node group: {message}"),
                )
                .await;
            if let Some(policy) = &exclusion.policy {
                events
                    .publish(
                        &crate::events::policy_reference(policy),
                        Severity::Warning,
                        INVALID_REASON,
                        "Validate",
                        format!("{key} is not served: {message}"),
                    )
                    .await;
            }
        }
        reported = current;
    }
}
