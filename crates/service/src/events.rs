//! Kubernetes Events for scaling actions, rejected requests and invalid configuration.
//! Publishing is best effort: a failure is logged and never fails the caller. RPCs only
//! [`EventPublisher::queue`] events: a background task writes them, so a slow Events API
//! never delays an answer to cluster-autoscaler or a held group lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// Name under which events are reported.
pub const REPORTER: &str = "nodegroup-operator";

/// Events waiting to be written; beyond this, new ones are dropped (and logged).
const QUEUE_CAPACITY: usize = 1024;
/// Events one object may have in a burst (client-go's spam filter,
/// `EventSourceObjectSpamFilter`, allows 25 too).
const BURST_PER_OBJECT: f64 = 25.0;
/// How often an object that spent its burst may have one more event (client-go: 5 minutes;
/// here the aim is the shared queue, and a reconcile pass every few seconds may have news).
const REFILL_EVERY: Duration = Duration::from_secs(10);
/// Objects whose budget is remembered before full ones are forgotten.
const REMEMBERED_OBJECTS: usize = 4096;

/// Publishes events on behalf of the operator.
#[derive(Clone)]
pub struct EventPublisher {
    recorder: Recorder,
    queue: mpsc::Sender<(ObjectReference, Event)>,
    budget: Arc<Mutex<EventBudget>>,
}

/// Events per object, as a token bucket per object: one tenant's object that fails with a
/// fresh message at every pass cannot crowd the shared queue, nor others' Events out of it.
#[derive(Debug, Default)]
pub struct EventBudget {
    objects: HashMap<String, (f64, Instant)>,
}

impl EventBudget {
    /// Whether object `key` may have one more event at `now` (and spends it).
    pub fn allow(&mut self, key: &str, now: Instant) -> bool {
        let refill = |tokens: f64, since: Instant| {
            let earned =
                now.saturating_duration_since(since).as_secs_f64() / REFILL_EVERY.as_secs_f64();
            (tokens + earned).min(BURST_PER_OBJECT)
        };
        if self.objects.len() >= REMEMBERED_OBJECTS && !self.objects.contains_key(key) {
            self.objects
                .retain(|_, (tokens, since)| refill(*tokens, *since) < BURST_PER_OBJECT);
        }
        let (tokens, since) = self
            .objects
            .entry(key.to_string())
            .or_insert((BURST_PER_OBJECT, now));
        let available = refill(*tokens, *since);
        if available < 1.0 {
            return false;
        }
        *tokens = available - 1.0;
        *since = now;
        true
    }
}

/// The budget key of `object`.
fn object_key(object: &ObjectReference) -> String {
    format!(
        "{}/{}/{}/{}",
        object.kind.as_deref().unwrap_or_default(),
        object.namespace.as_deref().unwrap_or_default(),
        object.name.as_deref().unwrap_or_default(),
        object.uid.as_deref().unwrap_or_default()
    )
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
        Self {
            recorder,
            queue,
            budget: Arc::default(),
        }
    }

    /// Whether `object` may have one more event now (see [`EventBudget`]); a refusal is
    /// logged at debug level.
    fn within_budget(&self, object: &ObjectReference, reason: &str) -> bool {
        let allowed = self
            .budget
            .lock()
            .map(|mut b| b.allow(&object_key(object), Instant::now()))
            .unwrap_or(true);
        if !allowed {
            tracing::debug!(reason, object = ?object.name, "event dropped: the object spent its event budget");
        }
        allowed
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
        if !self.within_budget(object, reason) {
            return;
        }
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
        if !self.within_budget(object, reason) {
            return;
        }
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
pub fn policy_reference(policy: &ngo_index::index::PolicyRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{}/v1alpha1", ngo_api::GROUP)),
        kind: Some("NodeGroupPolicy".into()),
        namespace: Some(policy.namespace.clone()),
        name: Some(policy.name.clone()),
        uid: Some(policy.uid.clone()).filter(|u| !u.is_empty()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_object_spends_its_own_burst_and_no_one_elses() {
        let mut budget = EventBudget::default();
        let start = Instant::now();
        let allowed = (0..100)
            .filter(|_| budget.allow("NodePool/team-a/noisy/u1", start))
            .count();
        assert_eq!(allowed, 25, "a burst, then nothing");
        assert!(
            budget.allow("NodePool/team-b/quiet/u2", start),
            "another object is untouched"
        );
        assert!(!budget.allow("NodePool/team-a/noisy/u1", start + REFILL_EVERY / 2));
        assert!(
            budget.allow("NodePool/team-a/noisy/u1", start + REFILL_EVERY),
            "one more after the refill time"
        );
    }

    #[test]
    fn full_budgets_are_forgotten_when_too_many_objects_are_remembered() {
        let mut budget = EventBudget::default();
        let start = Instant::now();
        for k in 0..REMEMBERED_OBJECTS {
            budget.allow(&format!("o{k}"), start);
        }
        let later = start + REFILL_EVERY * 30;
        assert!(budget.allow("new", later));
        assert!(budget.objects.len() <= 2, "{}", budget.objects.len());
    }
}
