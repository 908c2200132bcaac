//! Deleting servers: each one's Node checked, cordoned and drained first
//! ([`drain::prepare`]), the outcomes recorded ([`deletions::apply`]); and a deleted pool's
//! servers, then its finalizer.

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::pass_report::PassReport;
use super::{Blocked, FINALIZER, PoolController};
use crate::nodepool::backend::{BackendError, PoolBackend, pool_key};
use crate::nodepool::converge::{self, Decision};
use crate::nodepool::deletions;
use crate::nodepool::drain::{self, Gate};
use ngo_api::NodePool;
use ngo_api::nodepool::DeletionOutcome;
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::{Ledger, pool_instance_key};
use ngo_service::events::Severity;

impl PoolController {
    /// Deletes every server of a pool being deleted, then lets the pool go.
    pub(super) async fn finalize(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        members: &[converge::Member],
        report: &mut PassReport,
    ) -> Result<(), Blocked> {
        let live: Vec<_> = members
            .iter()
            .filter(|m| m.phase != converge::MemberPhase::Terminating)
            .collect();
        // Drained first, as Cluster API drains the Machines of a deleted MachineDeployment;
        // Nodes that cannot be reached are not waited for.
        let (node_cluster, nodes) = self.pool_nodes(pool);
        let mut ids: Vec<String> = Vec::new();
        for member in &live {
            let node = nodes.get(providerid::normalize(&member.provider_id));
            let gate = match (node, &node_cluster) {
                (Some(node), Some((client, _))) => drain::prepare(client, &node.name, false).await,
                _ => Ok(Gate::Proceed),
            };
            match gate {
                Ok(Gate::Proceed) => ids.push(member.id.clone()),
                Ok(Gate::Draining(message) | Gate::NotHeld(message)) => {
                    self.event(pool, Severity::Normal, "DrainWaiting", "Delete", message);
                }
                Err(error) => {
                    self.event(
                        pool,
                        Severity::Warning,
                        "DrainFailed",
                        "Delete",
                        format!(
                            "draining the node of server {}: {error}; retrying next pass",
                            member.id
                        ),
                    );
                }
            }
        }
        for (_, result) in backend.delete_many(&ids).await {
            self.observe(backend, "delete", &result);
            result.map_err(Blocked::Backend)?;
        }
        report.scaled_down = !live.is_empty();
        if members.is_empty() && pool.finalizers().iter().any(|f| f == FINALIZER) {
            let finalizers: Vec<&String> = pool
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .collect();
            api.patch(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": pool.resource_version(),
                }})),
            )
            .await
            .map_err(|e| Blocked::Api(format!("removing finalizer: {e}")))?;
        }
        Ok(())
    }

    /// Checks, cordons and drains the Node of each server `decision` deletes
    /// ([`drain::prepare`]), leaving in `decision.delete` only those ready to go: a server
    /// whose Node still has pods stays `Deleting` for a later pass. Returns the servers whose
    /// deletion cluster-autoscaler asked for and has given up since (id, why), to roll back.
    /// `nodes_client`: the cluster the pool's Nodes join, when it can be reached.
    pub(super) async fn gate_deletions(
        &self,
        pool: &NodePool,
        nodes_client: Option<&Client>,
        ledger: &Ledger,
        decision: &mut Decision,
    ) -> Vec<(String, String)> {
        let mut held = Vec::new();
        let mut ready = Vec::new();
        for id in std::mem::take(&mut decision.delete) {
            let Some(entry) = decision
                .instances
                .iter()
                .find(|i| i.id.as_deref() == Some(id.as_str()))
            else {
                ready.push(id);
                continue;
            };
            let asked = entry
                .provider_id
                .as_deref()
                .and_then(|pid| ledger.get(&pool_instance_key(pid)));
            let accepted = entry.deletion.as_ref().is_some_and(|d| {
                d.outcome == DeletionOutcome::Accepted
                    && asked.is_some_and(|a| a.request == d.request)
            });
            // The cloud took the server already (a lost answer, or not yet listed as
            // terminating): nothing to drain any more.
            let node = entry.node.clone().filter(|_| !accepted);
            let Some(node) = node else {
                ready.push(id);
                continue;
            };
            let Some(client) = nodes_client else {
                self.event(
                    pool,
                    Severity::Warning,
                    "DrainWaiting",
                    "Delete",
                    format!("server {id} not deleted yet: the Nodes of its cluster cannot be reached to drain node {node}"),
                );
                continue;
            };
            match drain::prepare(client, &node, asked.is_some()).await {
                Ok(Gate::Proceed) => ready.push(id),
                Ok(Gate::NotHeld(why)) => {
                    tracing::warn!(pool = %pool_key(pool), server = %id, %why, "deletion undone");
                    held.push((id, why));
                }
                Ok(Gate::Draining(message)) => {
                    tracing::info!(pool = %pool_key(pool), server = %id, %message, "server waits for its node's drain");
                    self.event(pool, Severity::Normal, "DrainWaiting", "Delete", message);
                }
                Err(error) => {
                    tracing::warn!(pool = %pool_key(pool), server = %id, %error, "cannot drain the server's node; retrying next pass");
                    self.event(
                        pool,
                        Severity::Warning,
                        "DrainFailed",
                        "Delete",
                        format!("draining node {node} of server {id}: {error}; retrying next pass"),
                    );
                }
            }
        }
        decision.delete = ready;
        held
    }

    /// Records the deletions' outcomes ([`deletions::apply`]) and reports them: a metric per
    /// call, an Event per outcome.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_deletions(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        ledger: &Ledger,
        outcomes: Vec<(String, Result<(), BackendError>)>,
        held: Vec<(String, String)>,
        nodes_client: Option<&Client>,
        decision: &mut Decision,
        report: &mut PassReport,
    ) {
        let backend = pool.backend().unwrap_or_default();
        for (_, result) in &outcomes {
            let outcome = match result {
                Ok(()) => "ok",
                Err(e) => e.kind.as_str(),
            };
            self.metrics
                .observe_backend_call(backend, "delete", outcome);
        }
        let applied = deletions::apply(
            api,
            pool,
            ledger,
            outcomes,
            held,
            decision,
            report.nodes.as_ref(),
        )
        .await;
        report.scaled_down |= applied.deleted;
        if let Some(client) = nodes_client {
            for node in &applied.kept_nodes {
                if let Err(error) = drain::release(client, node).await {
                    tracing::warn!(pool = %pool_key(pool), node, %error, "cannot uncordon the node of a server kept; uncordon it by hand");
                }
            }
        }
        for note in applied.notes {
            self.event(pool, note.severity, note.reason, "Delete", note.message);
        }
    }
}

pub(super) async fn add_finalizer(api: &Api<NodePool>, pool: &NodePool) -> Result<(), Blocked> {
    let mut finalizers = pool.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    api.patch(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": pool.resource_version(),
        }})),
    )
    .await
    .map(|_| ())
    .map_err(|e| Blocked::Api(format!("adding finalizer {FINALIZER}: {e}")))
}
