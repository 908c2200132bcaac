//! The loop that keeps the index up to date with the caches: object by object, or from
//! scratch after a re-list, on the blocking pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::caches::{NodeStores, Watches};
use crate::runtime::changes::Pending;
use crate::runtime::memory;
use crate::runtime::metrics::RuntimeMetrics;
use crate::runtime::ready::until_ready;
use ngo_index::capi::objects::InfraRef;
use ngo_index::index::state::IndexState;
use ngo_index::index::{Snapshot, SnapshotPublisher};
use ngo_service::metrics::ServiceMetrics;

/// One update of the index.
struct IndexUpdate {
    state: IndexState,
    snapshot: Snapshot,
    /// Every group was recomputed.
    full: bool,
    /// How long the update took.
    took: Duration,
    /// From the first change it applies to the snapshot.
    latency: Option<Duration>,
    /// Template references of the resources it read (their kinds must be watched).
    infra_refs: Vec<InfraRef>,
}

impl Watches {
    /// Publishes the index after the initial sync and keeps it up to date: a change to a
    /// Machine, Node or scalable resource updates only the groups it touches, at once; a
    /// re-list rebuilds from scratch and a policy, template or Cluster change recomputes every
    /// group, both after waiting `delay` (or as long as the last full pass took, if longer) for
    /// the rest of the burst, so constant churn costs at most about half a core. Updates run
    /// on the blocking pool and never stall RPCs.
    pub async fn rebuild_loop(
        self,
        publisher: SnapshotPublisher,
        metrics: (Arc<ServiceMetrics>, RuntimeMetrics),
        delay: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            synced = self.wait_synced() => match synced {
                Ok(()) => {}
                // The reflectors stop first on shutdown, dropping their stores' writers.
                Err(_) if shutdown.is_cancelled() => return Ok(()),
                Err(error) => return Err(error),
            },
        }
        tracing::info!("informer caches synced; serving");
        let changes = self.inner.changes.clone();
        changes.relist();
        let mut state: Option<IndexState> = None;
        let mut full_pass_took = Duration::ZERO;
        loop {
            if changes.wants_full_pass() {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay.max(full_pass_took)) => {}
                }
            }
            let pending = changes.take();
            if !pending.is_empty() {
                let watches = self.clone();
                let previous = state.take();
                let update =
                    tokio::task::spawn_blocking(move || watches.update(previous, pending)).await?;
                if update.full {
                    full_pass_took = update.took;
                }
                // Serve first: refreshing the per-group gauges walks every group (five series
                // each), work a one-Machine update should not wait for.
                let snapshot = publisher.publish(update.snapshot);
                self.ensure_template_watches(update.infra_refs.iter());
                metrics.0.observe_snapshot(&snapshot, update.took);
                metrics.1.observe_index_update(update.full, update.latency);
                tracing::debug!(
                    groups = snapshot.groups.len(),
                    full = update.full,
                    took = ?update.took,
                    "index updated"
                );
                state = Some(update.state);
                if update.full {
                    // The previous state and snapshot are gone: most of what they held is free.
                    tokio::task::spawn_blocking(memory::release_free_memory);
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = changes.notified() => {}
            }
        }
    }

    /// Applies `pending` to `state` (a full pass when there is no state yet or after a
    /// re-list) and takes the snapshot.
    fn update(&self, state: Option<IndexState>, pending: Pending) -> IndexUpdate {
        let start = Instant::now();
        let mut infra_refs = Vec::new();
        let (mut state, full) = match state {
            Some(state) if !pending.relist => (state, pending.context),
            _ => {
                let inputs = self.inputs();
                infra_refs.extend(inputs.resources.iter().filter_map(|r| r.infra_ref.clone()));
                (IndexState::new(&inputs), true)
            }
        };
        if !pending.relist {
            if pending.context {
                state.set_context(self.context());
            }
            for key in &pending.resources {
                match self.resource(key) {
                    Some(r) => {
                        infra_refs.extend(r.infra_ref.clone());
                        state.upsert_resource(r);
                    }
                    None => state.remove_resource(key.0, &key.1, &key.2),
                }
            }
            for (namespace, name) in &pending.machines {
                match self.machine(namespace, name) {
                    Some(m) => state.upsert_machine(m),
                    None => state.remove_machine(namespace, name),
                }
            }
            for key in &pending.nodes {
                match self.node(key) {
                    Some(n) => state.upsert_node(n),
                    None => state.remove_node(key.0.as_ref(), &key.1),
                }
            }
            if let NodeStores::PerCluster(workload) = &self.inner.nodes
                && !pending.clusters.is_empty()
            {
                let states = workload.states();
                for cluster in &pending.clusters {
                    let nodes = workload
                        .cluster(cluster)
                        .map(|(_, cached)| cached.iter().map(|n| n.view.clone()).collect())
                        .unwrap_or_default();
                    state.replace_workload_cluster(cluster, states.get(cluster).cloned(), nodes);
                }
            }
        }
        let snapshot = state.snapshot();
        IndexUpdate {
            state,
            snapshot,
            full,
            took: start.elapsed(),
            latency: pending.since.map(|since| since.elapsed()),
            infra_refs,
        }
    }

    /// Waits for the caches of the management view. Workload clusters sync one by one; the
    /// index holds back each cluster's groups until its Nodes are read.
    async fn wait_synced(&self) -> anyhow::Result<()> {
        for (_, _, store) in &self.inner.scalables {
            store.until_ready().await?;
        }
        self.inner.machines.1.until_ready().await?;
        self.inner.clusters.until_ready().await?;
        if let NodeStores::Single(nodes, _) = &self.inner.nodes {
            until_ready(nodes).await?;
        }
        if let Some(policies) = &self.inner.policies {
            policies.until_ready().await?;
        }
        if let Some(pools) = &self.inner.node_pools {
            pools.until_ready().await?;
        }
        Ok(())
    }
}
