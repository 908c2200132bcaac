//! The clouds that back node groups which are not Cluster API resources: each one's API
//! client, and its adapter to the NodePool reconciler (`pool`, a
//! [`PoolBackend`](crate::nodepool::backend::PoolBackend) and its
//! [`BackendConnector`](crate::nodepool::backend::BackendConnector)).

pub mod alicloud;
pub mod cherry;
pub mod endpoints;
mod options;

use crate::nodepool::backend::BackendConnector;
pub use endpoints::EndpointPolicy;
pub use options::BackendOptions;

/// The connector of every cloud this operator runs NodePools on: the one list a new cloud
/// is added to.
pub fn connectors(options: &BackendOptions) -> Vec<Box<dyn BackendConnector>> {
    vec![
        Box::new(cherry::pool::CherryConnector::new(
            options.endpoints.clone(),
        )),
        Box::new(alicloud::pool::AliCloudConnector::new(options)),
    ]
}
