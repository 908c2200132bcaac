//! Kubernetes Events for scaling actions, rejected requests and invalid configuration.
//! Publishing is best effort: a failure is logged and never fails the caller.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Name under which events are reported.
pub const REPORTER: &str = "nodegroup-operator";

/// Publishes events on behalf of the operator.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
}

/// Severity of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventPublisher {
    /// A publisher reporting as `nodegroup-operator` (instance = pod name when known).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes one event on `object`.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: match severity {
                Severity::Normal => EventType::Normal,
                Severity::Warning => EventType::Warning,
            },
            reason: reason.into(),
            note: Some(truncate(note)),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, object).await {
            tracing::warn!(%error, reason, object = ?object.name, "could not publish event");
        }
    }
}

/// Event notes are limited to 1 KiB by the API server.
fn truncate(mut note: String) -> String {
    const LIMIT: usize = 1024;
    if note.len() > LIMIT {
        let mut cut = LIMIT - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

/// Reference to a NodeGroupPolicy, for events on it.
pub fn policy_reference(policy: &crate::index::PolicyRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{}/v1alpha1", crate::api::GROUP)),
        kind: Some("NodeGroupPolicy".into()),
        namespace: Some(policy.namespace.clone()),
        name: Some(policy.name.clone()),
        uid: Some(policy.uid.clone()).filter(|u| !u.is_empty()),
        ..Default::default()
    }
}
