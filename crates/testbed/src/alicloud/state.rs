//! The state shared by the HTTP tasks, the activity tasks and the handle: the account under
//! its lock, the accepted keys, nonces, faults, the request log and the throttle; and the
//! tasks that end scaling activities and boot (or remove the Nodes of) their instances.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinSet;

use super::access_key::AccessKey;
use super::faults::{Fault, FaultAction};
use super::model::{Account, ApiError, EmulatedInstance, Params};
use super::node::node_for;
use super::sts::StsState;
use super::throttle::Throttle;
use crate::boot::BootOutcome;

/// A request as the emulator saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// HTTP method.
    pub method: String,
    /// `Action` (empty when absent).
    pub action: String,
    /// Every parameter but `Signature` and `SecurityToken`, decoded.
    pub params: BTreeMap<String, String>,
    /// Status answered; `None` when the connection was reset before answering.
    pub status: Option<u16>,
    /// `Code` of an error answer.
    pub code: Option<String>,
    /// When it arrived (its answer, for [`FaultAction::LoseAnswer`]), since the start.
    pub at: Duration,
}

/// What the emulator's tasks share; each part under its own lock, taken for one step and
/// never held across an await.
pub(super) struct Shared {
    pub(super) region: String,
    pub(super) account: Mutex<Account>,
    pub(super) keys: Mutex<Vec<AccessKey>>,
    pub(super) sts: Mutex<StsState>,
    pub(super) nonces: Mutex<HashMap<(String, String), Instant>>,
    pub(super) faults: Mutex<Vec<Fault>>,
    pub(super) log: Mutex<Vec<RecordedRequest>>,
    pub(super) throttle: Mutex<Throttle>,
    pub(super) tasks: Mutex<JoinSet<()>>,
    pub(super) activity_duration: Mutex<Duration>,
    pub(super) cluster: Option<kube::Client>,
    pub(super) started: Instant,
    pub(super) requests: std::sync::atomic::AtomicU64,
}

/// Locks `mutex`, going on past a panic of another holder (every step leaves the state
/// whole).
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    pub(super) fn account(&self) -> MutexGuard<'_, Account> {
        lock(&self.account)
    }

    pub(super) fn log(&self) -> MutexGuard<'_, Vec<RecordedRequest>> {
        lock(&self.log)
    }

    pub(super) fn throttle(&self) -> MutexGuard<'_, Throttle> {
        lock(&self.throttle)
    }

    /// A fresh `RequestId`, unique for the emulator's lifetime.
    pub(super) fn request_id(&self) -> String {
        let n = self
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!(
            "E1A0{n:04X}-5A4D-4B0C-9E2F-{:012X}",
            self.started.elapsed().as_micros()
        )
    }

    /// The accepted key `id`, if any.
    pub(super) fn access_key(&self, id: &str) -> Option<AccessKey> {
        lock(&self.keys).iter().find(|k| k.id == id).cloned()
    }

    pub(super) fn sts(&self) -> MutexGuard<'_, StsState> {
        lock(&self.sts)
    }

    /// Accepts a temporary key minted by STS or the metadata server (forgetting keys
    /// expired for over an hour).
    pub(super) fn accept(&self, key: AccessKey) {
        let forget = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
        let mut keys = lock(&self.keys);
        keys.retain(|k| k.expiration.is_none_or(|e| e > forget));
        keys.push(key);
    }

    /// Records `nonce` for `key`; false when it was used in the last 15 minutes.
    pub(super) fn use_nonce(&self, key: &str, nonce: &str) -> bool {
        let mut nonces = lock(&self.nonces);
        let now = Instant::now();
        nonces.retain(|_, at| now.duration_since(*at) < Duration::from_secs(15 * 60));
        nonces
            .insert((key.to_string(), nonce.to_string()), now)
            .is_none()
    }

    /// Logs `record` with the status of `answer`, and returns `answer`.
    pub(super) fn record<B>(
        &self,
        mut record: RecordedRequest,
        answer: http::Response<B>,
    ) -> http::Response<B> {
        record.status = Some(answer.status().as_u16());
        self.log().push(record);
        answer
    }

    /// Consumes one use of the first fault for `action`.
    pub(super) fn take_fault(&self, action: &str) -> Option<FaultAction> {
        let mut faults = lock(&self.faults);
        let index = faults
            .iter()
            .position(|f| f.remaining > 0 && f.action.as_deref().is_none_or(|a| a == action))?;
        let fault = &mut faults[index];
        fault.remaining -= 1;
        let action = fault.fault.clone();
        if fault.remaining == 0 {
            faults.remove(index);
        }
        Some(action)
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Runs an action and schedules the end of the activities it started.
    pub(super) fn act(self: &Arc<Self>, action: &str, params: &Params) -> Result<Value, ApiError> {
        let (answer, effects) = self.account().act(action, params)?;
        for activity in effects.started {
            self.schedule(activity);
        }
        Ok(answer)
    }

    /// Ends `activity` once the activity duration (as set now) has passed.
    pub(super) fn schedule(self: &Arc<Self>, activity: String) {
        let shared = self.clone();
        let after = *lock(&self.activity_duration);
        self.spawn(async move {
            tokio::time::sleep(after).await;
            shared.finish(&activity).await;
        });
    }

    /// Ends an activity: boots what it launched, deletes the Nodes of what it released.
    async fn finish(self: &Arc<Self>, activity: &str) {
        let finished = self.account().finish(activity);
        for next in finished.started {
            self.schedule(next);
        }
        for instance in finished.released {
            if let BootOutcome::Joined { node } = &instance.boot {
                self.delete_node(node).await;
            }
        }
        for instance in finished.launched {
            let shared = self.clone();
            self.spawn(async move { shared.boot(instance).await });
        }
    }

    async fn boot(&self, instance: EmulatedInstance) {
        let instance_type = self
            .account()
            .instance_types
            .iter()
            .find(|t| t.id == instance.instance_type)
            .cloned();
        let outcome = crate::boot::boot(self.cluster.as_ref(), &instance.user_data, |join| {
            let mut node = node_for(&self.region, &instance, instance_type.as_ref());
            node.labels.extend(join.labels.clone());
            node
        })
        .await;
        tracing::info!(instance = %instance.id, outcome = ?outcome, "alicloud emulator: instance booted");
        let released_meanwhile = {
            let mut account = self.account();
            match account.instances.get_mut(&instance.id) {
                Some(i) => {
                    i.boot = outcome.clone();
                    false
                }
                None => true,
            }
        };
        if released_meanwhile && let BootOutcome::Joined { node } = &outcome {
            self.delete_node(node).await;
        }
    }

    async fn delete_node(&self, node: &str) {
        if let Some(client) = &self.cluster
            && let Err(e) = crate::kwok::delete_node(client, node).await
        {
            tracing::warn!(node, error = %e, "alicloud emulator: deleting the Node of a released instance");
        }
    }
}
