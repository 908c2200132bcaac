//! One connection to a workload cluster: its client, the Node cache its watch fills, and
//! what its probes tell of the API server. Its tasks end when it is dropped.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kube::Client;
use kube::runtime::reflector::{self, Store};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::health::{Health, SharedHealth};
use super::kubeconfig::KubeconfigDigest;
use super::limits::ReadLimits;
use super::nodes::watch_nodes;
use super::probe::probe_api_server;
use crate::runtime::changes::Changes;
use crate::runtime::nodes::WatchedNode;
use ngo_index::index::{ClusterKey, WorkloadState};

/// One connection to a workload cluster: its client, the Node cache its watch fills, and
/// what its probes tell of the API server. Its tasks end when it is dropped.
pub(super) struct Connection {
    pub(super) store: Store<WatchedNode>,
    /// `None` when no kubeconfig could be read.
    pub(super) client: Option<Client>,
    pub(super) health: Arc<SharedHealth>,
    /// The kubeconfig it was made from; `None` when none could be read.
    pub(super) kubeconfig: Option<KubeconfigDigest>,
    pub(super) shutdown: CancellationToken,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Connection {
    /// Connects with `client`: starts the Node watch and the probe. A connection made beside
    /// the serving one (`serving` false) records nothing for the index until it serves.
    pub(super) fn open(
        cluster: ClusterKey,
        client: Client,
        kubeconfig: KubeconfigDigest,
        (serving, limits): (bool, ReadLimits),
        changes: Arc<Changes>,
        shutdown: CancellationToken,
    ) -> Self {
        let writer = reflector::store::Writer::<WatchedNode>::default();
        let store = writer.as_reader();
        let health = Arc::new(SharedHealth {
            cluster,
            kubeconfig: kubeconfig.short(),
            health: Mutex::new(Health::new(Instant::now())),
            serving: AtomicBool::new(serving),
            changes,
        });
        let relist = Arc::new(Notify::new());
        tokio::spawn(watch_nodes(
            client.clone(),
            writer,
            (health.clone(), limits),
            relist.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(probe_api_server(
            client.clone(),
            health.clone(),
            relist,
            shutdown.clone(),
        ));
        Self {
            store,
            client: Some(client),
            health,
            kubeconfig: Some(kubeconfig),
            shutdown,
        }
    }

    /// A connection that could not be made, for `reason`.
    pub(super) fn failed(cluster: ClusterKey, reason: String, changes: Arc<Changes>) -> Self {
        Self {
            store: reflector::store::Writer::<WatchedNode>::default().as_reader(),
            client: None,
            health: Arc::new(SharedHealth {
                cluster,
                kubeconfig: String::new(),
                health: Mutex::new(Health::failed(reason, Instant::now())),
                serving: AtomicBool::new(true),
                changes,
            }),
            kubeconfig: None,
            shutdown: CancellationToken::new(),
        }
    }

    pub(super) fn state(&self) -> WorkloadState {
        self.health.state()
    }
}
