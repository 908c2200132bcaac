//! What the reconciler does between passes, every interval of a leadership term: forgets
//! the pools that are gone and sweeps expired bootstrap tokens.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::PoolController;
use super::schedule::PassContext;
use crate::nodepool::backend::pool_key;
use crate::nodepool::bootstrap;
use ngo_api::NodePool;
use ngo_index::index::ClusterKey;

/// Longest one cluster's sweep of expired bootstrap tokens may take; one that takes longer is
/// given up until the next sweep.
const TOKEN_SWEEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The running sweeps of expired bootstrap tokens, one task per cluster; aborted when
/// dropped.
#[derive(Default)]
struct TokenSweeps {
    running: HashMap<String, tokio::task::JoinHandle<()>>,
}

impl TokenSweeps {
    /// Forgets the sweeps that ended.
    fn forget_finished(&mut self) {
        self.running.retain(|_, sweep| !sweep.is_finished());
    }

    /// True while the sweep started under `key` runs.
    fn running(&self, key: &str) -> bool {
        self.running
            .get(key)
            .is_some_and(|sweep| !sweep.is_finished())
    }

    /// Starts sweeping the cluster that holds the Nodes of `cluster` with `client`, under
    /// `key`, unless the last sweep under `key` still runs; the sweep is given up after
    /// `timeout`. Returns whether it started.
    fn start(
        &mut self,
        key: String,
        cluster: ClusterKey,
        client: Client,
        timeout: Duration,
    ) -> bool {
        if self.running(&key) {
            return false;
        }
        let sweep = tokio::spawn(async move {
            match tokio::time::timeout(timeout, bootstrap::delete_expired(&client)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    tracing::info!(deleted = n, %cluster, "expired bootstrap tokens deleted")
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, %cluster, "cannot delete expired bootstrap tokens")
                }
                Err(_) => tracing::warn!(
                    %cluster,
                    ?timeout,
                    "deleting expired bootstrap tokens took too long; given up until the next sweep"
                ),
            }
        });
        self.running.insert(key, sweep);
        true
    }
}

impl Drop for TokenSweeps {
    fn drop(&mut self) {
        for sweep in self.running.values() {
            sweep.abort();
        }
    }
}

impl PoolController {
    /// Every [`interval`](super::PoolControllerOptions::interval) until `term` ends: forgets
    /// the pools that are gone (their metrics, failure counts and cached backend connections)
    /// and sweeps expired bootstrap tokens.
    pub(super) async fn housekeeping(&self, context: &PassContext, term: &CancellationToken) {
        let mut known: HashSet<String> = HashSet::new();
        let mut token_sweeps = TokenSweeps::default();
        let mut ticks = tokio::time::interval(self.options.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = term.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let pools = self.watches.pools();
            let current: HashSet<String> = pools.iter().map(|p| pool_key(p)).collect();
            for gone in known.difference(&current) {
                context.record(gone, false);
                self.metrics.forget_pool(gone);
                for connector in &self.connectors {
                    connector.forget(gone);
                }
            }
            known = current;
            self.sweep_expired_tokens(&pools, &mut token_sweeps);
        }
    }

    /// Sweeps away the expired bootstrap tokens minted for `pools`, once per cluster their
    /// Nodes join (kube-controller-manager's token cleaner is off by default). Each cluster is
    /// swept by a task of its own ([`TokenSweeps`]): a cluster that does not answer holds back
    /// neither the other clusters nor this loop.
    fn sweep_expired_tokens(&self, pools: &[Arc<NodePool>], sweeps: &mut TokenSweeps) {
        sweeps.forget_finished();
        for pool in pools {
            let cluster = ClusterKey {
                namespace: pool.namespace().unwrap_or_default(),
                name: pool.spec.cluster_name.clone(),
            };
            // One Node view shared by every cluster: one sweep covers them all.
            let key = if self.watches.shares_node_view() {
                String::new()
            } else {
                cluster.to_string()
            };
            if sweeps.running(&key) {
                continue;
            }
            let Some((client, _)) = self.watches.node_cluster(&cluster) else {
                continue;
            };
            sweeps.start(key, cluster, client, TOKEN_SWEEP_TIMEOUT);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// A client of a server that accepts connections and never answers.
    async fn unanswered_client() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        client_of(address)
    }

    /// A client of a port nothing listens on.
    async fn refused_client() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        client_of(address)
    }

    fn client_of(address: std::net::SocketAddr) -> Client {
        let uri = format!("http://{address}").parse().expect("uri");
        Client::try_from(kube::Config::new(uri)).expect("client")
    }

    fn cluster(name: &str) -> ClusterKey {
        ClusterKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    async fn finished_within(sweeps: &TokenSweeps, key: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while sweeps.running(key) {
            if start.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    #[tokio::test]
    async fn a_cluster_that_never_answers_holds_back_only_its_own_token_sweep() {
        let mut sweeps = TokenSweeps::default();
        let timeout = Duration::from_millis(800);
        assert!(sweeps.start(
            "hung".into(),
            cluster("hung"),
            unanswered_client().await,
            timeout
        ));
        assert!(sweeps.start(
            "down".into(),
            cluster("down"),
            refused_client().await,
            timeout
        ));
        assert!(
            finished_within(&sweeps, "down", Duration::from_millis(400)).await,
            "the other cluster's sweep ends on its own"
        );
        assert!(sweeps.running("hung"));
        assert!(
            !sweeps.start(
                "hung".into(),
                cluster("hung"),
                unanswered_client().await,
                timeout
            ),
            "no second sweep of a cluster while one runs"
        );
        assert!(
            finished_within(&sweeps, "hung", Duration::from_secs(5)).await,
            "the hung sweep is given up after its timeout"
        );
        sweeps.forget_finished();
        assert!(sweeps.running.is_empty());
        assert!(sweeps.start(
            "hung".into(),
            cluster("hung"),
            unanswered_client().await,
            timeout
        ));
    }
}
