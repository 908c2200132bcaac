//! Kubernetes Events for scaling actions, rejected requests and invalid configuration.
//! Publishing is best effort: a failure is logged and never fails the caller. RPCs only
//! [`EventPublisher::queue`] events: a background task writes them, so a slow Events API
//! never delays an answer to cluster-autoscaler or a held group lock.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// Name under which events are reported.
pub const REPORTER: &str = "nodegroup-operator";

/// Events waiting to be written; beyond this, new ones are dropped (and logged).
const QUEUE_CAPACITY: usize = 1024;

/// Publishes events on behalf of the operator.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
    queue: mpsc::Sender<(ObjectReference, Event)>,
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
    /// A publisher reporting as `nodegroup-operator` (instance = pod name when known), with
    /// its writer task on the current runtime (it ends when every clone is dropped).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: REPORTER.into(),
            instance,
        };
        let recorder = Recorder::new(client, reporter);
        let (queue, mut pending) = mpsc::channel::<(ObjectReference, Event)>(QUEUE_CAPACITY);
        let writer = recorder.clone();
        tokio::spawn(async move {
            while let Some((object, event)) = pending.recv().await {
                write(&writer, &object, &event).await;
            }
        });
        Self { recorder, queue }
    }

    /// Publishes one event on `object`, waiting for the API server.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        write(
            &self.recorder,
            object,
            &event(severity, reason, action, note),
        )
        .await;
    }

    /// Queues one event on `object` without waiting; dropped (and logged) when the queue is
    /// full.
    pub fn queue(
        &self,
        object: &ObjectReference,
        severity: Severity,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = event(severity, reason, action, note);
        if let Err(error) = self.queue.try_send((object.clone(), event)) {
            tracing::warn!(%error, reason, object = ?object.name, "event queue full or closed; event dropped");
        }
    }
}

fn event(severity: Severity, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_: match severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        },
        reason: reason.into(),
        note: Some(truncate(note)),
        action: action.into(),
        secondary: None,
    }
}

async fn write(recorder: &Recorder, object: &ObjectReference, event: &Event) {
    if let Err(error) = recorder.publish(event, object).await {
        tracing::warn!(%error, reason = %event.reason, object = ?object.name, "could not publish event");
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
