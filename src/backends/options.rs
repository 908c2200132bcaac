//! What the operator's configuration, not a NodePool, decides for the clouds.

use std::path::PathBuf;

use super::endpoints::EndpointPolicy;
use crate::nodepool::ambient::AmbientPolicy;

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
