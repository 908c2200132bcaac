//! The NodePool reconciler's view of the watches ([`PoolWatches`]): the NodePool store, and
//! each cluster's Nodes, reduced to the index's view of a Node.

use std::sync::Arc;

use kube::Client;
use kube::api::Api;

use super::watches::Watches;
use crate::nodepool::watches::PoolWatches;
use ngo_api::NodePool;
use ngo_index::index::{ClusterKey, NodeView};

impl PoolWatches for Watches {
    fn pool_apis(&self) -> Vec<Api<NodePool>> {
        self.node_pool_apis()
    }

    fn pools(&self) -> Vec<Arc<NodePool>> {
        self.node_pools()
    }

    fn shares_node_view(&self) -> bool {
        Watches::shares_node_view(self)
    }

    fn node_cluster(&self, cluster: &ClusterKey) -> Option<(Client, Vec<Arc<NodeView>>)> {
        let (client, nodes) = Watches::node_cluster(self, cluster)?;
        Some((client, nodes.iter().map(|n| n.view.clone()).collect()))
    }
}
