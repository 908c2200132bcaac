//! The clouds that back node groups which are not Cluster API resources: each one's API
//! client, and its adapter to the NodePool reconciler (`pool`, a
//! [`PoolBackend`](crate::nodepool::backend::PoolBackend) and its
//! [`BackendConnector`](crate::nodepool::backend::BackendConnector)).

pub mod alicloud;
pub mod cherry;
pub mod endpoints;

use std::path::PathBuf;

use crate::nodepool::ambient::AmbientPolicy;
use crate::nodepool::backend::BackendConnector;
pub use endpoints::EndpointPolicy;

/// What the operator's configuration (not a NodePool) decides for every cloud.
#[derive(Clone, Debug, Default)]
pub struct BackendOptions {
    /// Which endpoint overrides NodePools may name.
    pub endpoints: EndpointPolicy,
    /// The projected service-account token RRSA pools assume their role with
    /// (`ALIBABA_CLOUD_OIDC_TOKEN_FILE`); RRSA is refused without it.
    pub alicloud_oidc_token_file: Option<PathBuf>,
    /// Which namespaces' pools may use the operator's own authority (ECSRAMRole, bootstrap
    /// tokens of a shared cluster).
    pub ambient: AmbientPolicy,
}

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
