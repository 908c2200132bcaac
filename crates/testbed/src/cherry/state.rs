//! The state shared by the HTTP tasks, the lifecycle tasks and the handle: the account under
//! its lock, faults, the request log and the rate window; and the tasks that walk a server
//! through its lifecycle, boot it, and remove its Node when it is deleted.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::boot;
use super::faults::{Fault, FaultAction, RequestKind};
use super::model::{Account, BootOutcome, EmulatedServer, Lifecycle};
use crate::emulator::RateWindow;

/// A request as the emulator saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Method.
    pub method: String,
    /// Path with its query (`/v1/projects/1/servers?limit=100&offset=0`).
    pub path: String,
    /// Body as text (lossy UTF-8).
    pub body: String,
    /// Status answered; `None` when the connection was reset instead.
    pub status: Option<u16>,
    /// When it arrived (its answer, for [`FaultAction::LoseAnswer`]), since the start.
    pub at: Duration,
}

/// State shared by the HTTP tasks, the lifecycle tasks and the handle.
pub(super) struct Shared {
    pub(super) token: String,
    pub(super) account: Mutex<Account>,
    pub(super) faults: Mutex<Vec<Fault>>,
    pub(super) log: Mutex<Vec<RecordedRequest>>,
    pub(super) rate: Mutex<RateWindow>,
    pub(super) tasks: Mutex<JoinSet<()>>,
    pub(super) pending_for: Duration,
    pub(super) provisioning_for: Duration,
    pub(super) termination_delay: Duration,
    pub(super) cluster: Option<kube::Client>,
    pub(super) started: Instant,
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

    pub(super) fn rate(&self) -> MutexGuard<'_, RateWindow> {
        lock(&self.rate)
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

    /// Consumes one use of the first fault for `kind`.
    pub(super) fn take_fault(&self, kind: RequestKind) -> Option<FaultAction> {
        let mut faults = lock(&self.faults);
        let index = faults
            .iter()
            .position(|f| f.remaining > 0 && (f.kind == kind || f.kind == RequestKind::Any))?;
        let fault = &mut faults[index];
        fault.remaining -= 1;
        let action = fault.action.clone();
        if fault.remaining == 0 {
            faults.remove(index);
        }
        Some(action)
    }

    fn spawn(self: &Arc<Self>, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut tasks = lock(&self.tasks);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
    }

    /// Walks a new server through `pending`, `provisioning` and `active`, then boots it.
    pub(super) fn spawn_lifecycle(self: &Arc<Self>, id: i64) {
        let shared = self.clone();
        self.spawn(async move {
            tokio::time::sleep(shared.pending_for).await;
            if !shared.advance(id, Lifecycle::Pending, Lifecycle::Provisioning) {
                return;
            }
            tokio::time::sleep(shared.provisioning_for).await;
            if !shared.advance(id, Lifecycle::Provisioning, Lifecycle::Active) {
                return;
            }
            shared.boot(id).await;
        });
    }

    /// Moves server `id` from `from` to `to`; false when it is no longer in `from`.
    fn advance(&self, id: i64, from: Lifecycle, to: Lifecycle) -> bool {
        let mut account = self.account();
        match account.servers.get_mut(&id) {
            Some(server) if server.lifecycle == from => {
                server.lifecycle = to;
                true
            }
            _ => false,
        }
    }

    async fn boot(&self, id: i64) {
        let (server, plan) = {
            let account = self.account();
            let Some(server) = account.servers.get(&id).cloned() else {
                return;
            };
            let plan = account.plan(&server.plan).cloned();
            (server, plan)
        };
        let outcome = crate::boot::boot(self.cluster.as_ref(), &server.user_data, |join| {
            boot::node_for(&server, plan.as_ref(), join)
        })
        .await;
        match &outcome {
            BootOutcome::Joined { node } => {
                tracing::info!(server = id, node, "cherry emulator: server joined")
            }
            other => {
                tracing::info!(server = id, outcome = ?other, "cherry emulator: server did not join")
            }
        }
        let deleted_meanwhile = {
            let mut account = self.account();
            match account.servers.get_mut(&id) {
                Some(server) if server.lifecycle == Lifecycle::Active => {
                    server.boot = outcome.clone();
                    false
                }
                _ => true,
            }
        };
        if deleted_meanwhile && let BootOutcome::Joined { node } = &outcome {
            self.delete_node(node).await;
        }
    }

    /// Deletes a Node this emulator registered; failures are logged (the server is gone
    /// either way).
    async fn delete_node(&self, node: &str) {
        if let Some(client) = &self.cluster
            && let Err(e) = crate::kwok::delete_node(client, node).await
        {
            tracing::warn!(node, error = %e, "cherry emulator: deleting the Node of a deleted server");
        }
    }

    /// Deletes a terminated server's Node (as the cloud controller manager does for
    /// instances that are gone), then forgets the server after the termination delay.
    pub(super) fn spawn_termination(self: &Arc<Self>, server: EmulatedServer) {
        let shared = self.clone();
        self.spawn(async move {
            if let BootOutcome::Joined { node } = &server.boot {
                shared.delete_node(node).await;
            }
            tokio::time::sleep(shared.termination_delay).await;
            shared.account().servers.remove(&server.id);
        });
    }
}
