//! What the NodePool reconciler reads from the operator's watches. The runtime implements
//! [`PoolWatches`] over its reflector stores and workload-cluster connections; the reconciler
//! sees neither, so this layer does not depend on the runtime.

use std::sync::Arc;

use kube::Client;
use kube::api::Api;

use ngo_api::NodePool;
use ngo_index::index::{ClusterKey, NodeView};

/// The watched state the reconciler reads: NodePools and the Nodes their servers join.
pub trait PoolWatches: Send + Sync {
    /// One NodePool API per watched scope (each watched namespace, or all namespaces): the
    /// reconciler runs its own watch of pools over each.
    fn pool_apis(&self) -> Vec<Api<NodePool>>;

    /// The cached NodePools.
    fn pools(&self) -> Vec<Arc<NodePool>>;

    /// True when every Cluster's Nodes come from one view (not the per-cluster topology): the
    /// cluster the operator's own credentials reach.
    fn shares_node_view(&self) -> bool;

    /// The cluster that holds the Nodes of Cluster `cluster`: its client and its cached Nodes.
    /// `None` while a workload cluster is not connected.
    fn node_cluster(&self, cluster: &ClusterKey) -> Option<(Client, Vec<Arc<NodeView>>)>;
}
