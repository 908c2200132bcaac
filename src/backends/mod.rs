//! The clouds that back node groups which are not Cluster API resources: each one's API
//! client, and its adapter to the NodePool reconciler (`pool`, a
//! [`PoolBackend`](crate::nodepool::backend::PoolBackend) and its
//! [`BackendConnector`](crate::nodepool::backend::BackendConnector)).

pub mod alicloud;
pub mod cherry;

use crate::nodepool::backend::BackendConnector;

/// The connector of every cloud this operator runs NodePools on: the one list a new cloud
/// is added to.
pub fn connectors() -> Vec<Box<dyn BackendConnector>> {
    vec![
        Box::new(cherry::pool::CherryConnector),
        Box::new(alicloud::pool::AliCloudConnector::default()),
    ]
}
