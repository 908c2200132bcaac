//! How a pool connects: its client options, the operator's endpoint policy, and one
//! credentials provider per pool.

use std::path::PathBuf;

use async_trait::async_trait;

use super::group::{AliCloudPool, BACKEND_NAME};
use crate::backends::EndpointPolicy;
use crate::backends::alicloud::auth::{CredentialsSource, ProviderCache, metadata_endpoint};
use crate::backends::options::BackendOptions;
use crate::nodepool::ambient::AmbientPolicy;
use crate::nodepool::backend::{BackendConnector, ConnectError, PoolBackend, Secrets, pool_key};
use ngo_api::nodepool::{AliCloudCredentialsMode, AliCloudSpec, NodePool, UrlScheme};
use ngo_cloud_alicloud::{ClientOptions, Endpoints, Scheme};

/// The client options of `spec`: its region, and its endpoints with the defaults
/// (`<scheme>://<product>.<region>.aliyuncs.com`, HTTPS unless `endpoints.scheme` says
/// `http`) filled in.
pub fn client_options(spec: &AliCloudSpec) -> ClientOptions {
    let mut options = ClientOptions::for_region(&spec.region_id);
    let overrides = spec.endpoints.clone().unwrap_or_default();
    let scheme = match overrides.scheme.unwrap_or_default() {
        UrlScheme::Https => Scheme::Https,
        UrlScheme::Http => Scheme::Http,
    };
    let defaults = Endpoints::for_region(&spec.region_id, scheme);
    options.endpoints = Endpoints {
        ess: overrides.ess.unwrap_or(defaults.ess),
        ecs: overrides.ecs.unwrap_or(defaults.ecs),
        vpc: overrides.vpc.unwrap_or(defaults.vpc),
        sts: overrides.sts.unwrap_or(defaults.sts),
    };
    options
}

/// Connects the pools whose spec sets `aliCloud`, with the credentials its
/// `credentialsMode` names; keeps one credentials provider per pool
/// ([`ProviderCache`]), so temporary credentials are renewed, not fetched every pass.
#[derive(Default)]
pub struct AliCloudConnector {
    credentials: ProviderCache,
    endpoints: EndpointPolicy,
    oidc_token_file: Option<PathBuf>,
    ambient: AmbientPolicy,
}

impl AliCloudConnector {
    /// A connector with the operator's endpoint policy and RRSA token file.
    pub fn new(options: &BackendOptions) -> Self {
        Self {
            credentials: ProviderCache::default(),
            endpoints: options.endpoints.clone(),
            oidc_token_file: options.alicloud_oidc_token_file.clone(),
            ambient: options.ambient.clone(),
        }
    }
}

/// Checks `spec`'s endpoint overrides against the operator's `policy`.
fn check_endpoints(spec: &AliCloudSpec, policy: &EndpointPolicy) -> Result<(), String> {
    let Some(endpoints) = &spec.endpoints else {
        return Ok(());
    };
    if endpoints.scheme == Some(UrlScheme::Http) {
        policy.check_http("spec.aliCloud.endpoints.scheme")?;
    }
    for (field, url) in [
        ("ess", &endpoints.ess),
        ("ecs", &endpoints.ecs),
        ("vpc", &endpoints.vpc),
        ("sts", &endpoints.sts),
        ("metadata", &endpoints.metadata),
    ] {
        if let Some(url) = url {
            policy.check(&format!("spec.aliCloud.endpoints.{field}"), url)?;
        }
    }
    Ok(())
}

#[async_trait]
impl BackendConnector for AliCloudConnector {
    fn field(&self) -> &'static str {
        BACKEND_NAME
    }

    fn serves(&self, pool: &NodePool) -> bool {
        pool.spec.ali_cloud.is_some()
    }

    async fn connect(
        &self,
        pool: &NodePool,
        secrets: &Secrets,
    ) -> Result<Box<dyn PoolBackend>, ConnectError> {
        let ali =
            pool.spec.ali_cloud.as_ref().ok_or_else(|| {
                ConnectError::Spec("NoBackend", "spec.aliCloud is not set".into())
            })?;
        check_endpoints(ali, &self.endpoints)
            .map_err(|m| ConnectError::Spec("EndpointNotAllowed", m))?;
        if ali.credentials_mode == Some(AliCloudCredentialsMode::EcsRamRole) {
            self.ambient
                .check(
                    &kube::ResourceExt::namespace(pool).unwrap_or_default(),
                    "credentialsMode ECSRAMRole (the RAM role of the ECS instance the operator runs on)",
                )
                .map_err(|m| ConnectError::Spec(crate::nodepool::ambient::NOT_ALLOWED, m))?;
        }
        let secret = match &ali.credentials_secret_ref {
            Some(reference) => Some(
                secrets
                    .get(&reference.name, "spec.aliCloud.credentialsSecretRef")
                    .await?,
            ),
            None => None,
        };
        let source = CredentialsSource::of(
            ali,
            secret.as_ref().and_then(|s| s.data.as_ref()),
            self.oidc_token_file.as_deref(),
        )
        .map_err(|m| {
            let name = ali
                .credentials_secret_ref
                .as_ref()
                .map_or("", |r| r.name.as_str());
            ConnectError::Spec(
                "CredentialsMissing",
                format!(
                    "Secret {}/{name} (credentialsMode {:?}) {m}",
                    secrets.namespace(),
                    ali.credentials_mode.unwrap_or_default(),
                ),
            )
        })?;
        let options = client_options(ali);
        let credentials = self
            .credentials
            .provider(
                &pool_key(pool),
                &source,
                &options.endpoints.sts,
                &metadata_endpoint(ali),
                &options.transport,
                &options.retry,
            )
            .map_err(|e| ConnectError::Spec("InvalidBackendConfig", e.to_string()))?;
        let backend = AliCloudPool::new(ali, options, credentials)
            .map_err(|e| ConnectError::Spec("InvalidBackendConfig", e.message))?;
        Ok(Box::new(backend))
    }

    fn forget(&self, key: &str) {
        self.credentials.forget(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_default_to_https_regional_hosts_unless_overridden_or_http() {
        let mut spec = AliCloudSpec {
            region_id: "cn-shanghai".into(),
            scaling_group_id: "asg-1".into(),
            ..Default::default()
        };
        let e = client_options(&spec).endpoints;
        assert_eq!(e.ess, "https://ess.cn-shanghai.aliyuncs.com");
        assert_eq!(e.vpc, "https://vpc.cn-shanghai.aliyuncs.com");
        assert_eq!(e.sts, "https://sts.cn-shanghai.aliyuncs.com");
        spec.endpoints = Some(ngo_api::nodepool::AliCloudEndpoints {
            scheme: Some(UrlScheme::Http),
            ess: Some("https://ess-vpc.cn-shanghai.aliyuncs.com".into()),
            ..Default::default()
        });
        let e = client_options(&spec).endpoints;
        assert_eq!(
            e.ess, "https://ess-vpc.cn-shanghai.aliyuncs.com",
            "an override wins"
        );
        assert_eq!(
            e.ecs, "http://ecs.cn-shanghai.aliyuncs.com",
            "the scheme of defaults"
        );
        assert_eq!(e.sts, "http://sts.cn-shanghai.aliyuncs.com");
    }
}
