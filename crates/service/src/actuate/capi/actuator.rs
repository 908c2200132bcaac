//! The actuator itself: its clients and keys, the per-group locks that serialise this
//! process's mutations, and how an outcome is recorded (activity, Events). What it does is in
//! the files beside this one, each an `impl CapiActuator` of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::discovery::ApiResource;

use crate::actuate::activity::{ActivityLog, Direction};
use crate::actuate::deadline::MutationDeadline;
use crate::actuate::error::ActuateError;
use crate::discovery::CapiResources;
use crate::events::{EventPublisher, Severity};
use ngo_index::capi::CapiKeys;
use ngo_index::capi::objects::ScalableKind;
use ngo_index::index::NodeGroup;

/// Writes replica changes and machine deletion marks for Cluster API node groups.
pub struct CapiActuator {
    pub(super) client: Client,
    pub(super) resources: CapiResources,
    pub(super) keys: CapiKeys,
    pub(super) events: Option<EventPublisher>,
    pub(super) activity: Arc<ActivityLog>,
    /// Names this replica in request ids.
    pub(super) instance: String,
    /// Serialises mutations per group inside this process (replicas race through
    /// resourceVersion checks across processes).
    pub(super) locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl CapiActuator {
    /// A new actuator. `events` is `None` where events are not wanted (benchmarks).
    pub fn new(
        client: Client,
        resources: CapiResources,
        keys: CapiKeys,
        events: Option<EventPublisher>,
        activity: Arc<ActivityLog>,
        instance: String,
    ) -> Self {
        Self {
            client,
            resources,
            keys,
            events,
            activity,
            instance,
            locks: Mutex::default(),
        }
    }

    /// A new request id of this replica.
    pub fn request_id(&self) -> String {
        ngo_index::capi::scale_down::request_id(&self.instance)
    }

    /// The Cluster API keys (delete-machine annotation) this actuator writes.
    pub fn keys(&self) -> &CapiKeys {
        &self.keys
    }

    /// The group's lock, waited for only while the request may still answer.
    pub(super) async fn lock_until(
        &self,
        group: &NodeGroup,
        deadline: &MutationDeadline,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>, ActuateError> {
        tokio::time::timeout(deadline.answer_remaining(), self.lock(&group.id))
            .await
            .map_err(|_| ActuateError::DeadlineExceeded {
                group: group.id.clone(),
                step: "waiting for another request of this replica on the group".into(),
            })
    }

    pub(super) async fn lock(&self, group: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self
                .locks
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            locks.entry(group.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    pub(super) fn api_resource(&self, kind: ScalableKind) -> &ApiResource {
        // Groups only exist for kinds that discovery found.
        self.resources
            .scalable(kind)
            .unwrap_or(&self.resources.machine_sets)
    }

    /// Records the outcome and queues events (never awaited on the RPC path): Normal for a
    /// completed action, Warning for a refused or failed one, on the scalable resource and
    /// on its governing policy.
    pub(super) fn report<T>(
        &self,
        group: &NodeGroup,
        action: &str,
        direction: Direction,
        result: &Result<T, ActuateError>,
        describe: impl Fn(&T) -> String,
    ) {
        let now = jiff::Timestamp::now();
        match result {
            Ok(_) => self.activity.success(&group.id, direction, now),
            Err(e) if !e.is_rejection() => {
                self.activity
                    .failure(&group.id, direction, e.to_string(), now)
            }
            Err(_) => {}
        }
        let Some(events) = &self.events else { return };
        let (severity, reason, note) = match result {
            Ok(value) => (Severity::Normal, action.to_string(), describe(value)),
            Err(e) if e.is_rejection() => (
                Severity::Warning,
                format!("{action}Rejected"),
                e.to_string(),
            ),
            Err(e) => (Severity::Warning, format!("{action}Failed"), e.to_string()),
        };
        let ar = self.api_resource(group.kind);
        let resource = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            namespace: Some(group.namespace.clone()),
            name: Some(group.name.clone()),
            uid: Some(group.uid.clone()).filter(|u| !u.is_empty()),
            ..Default::default()
        };
        events.queue(&resource, severity, &reason, action, note.clone());
        if let Some(policy) = &group.policy {
            let note = format!("{}: {note}", group.id);
            events.queue(
                &crate::events::policy_reference(policy),
                severity,
                &reason,
                action,
                note,
            );
        }
    }
}
