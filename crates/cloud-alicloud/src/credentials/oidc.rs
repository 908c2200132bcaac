//! RRSA: temporary credentials from STS `AssumeRoleWithOIDC` with the pod's projected
//! service-account token, read from its file on every refresh (kubelet rotates it).

use std::path::PathBuf;

use futures::future::BoxFuture;

use super::cache::{Cache, RefreshPolicy};
use super::provider::{Credentials, CredentialsProvider};
use crate::error::{CredentialsError, Error};
use crate::sts::{self, AssumeRoleWithOidc};
use crate::transport::{RetryPolicy, Transport, TransportOptions};

/// How to assume a RAM role with the pod's OIDC token (RRSA).
#[derive(Clone, Debug)]
pub struct OidcRoleConfig {
    /// `ALIBABA_CLOUD_ROLE_ARN`.
    pub role_arn: String,
    /// `ALIBABA_CLOUD_OIDC_PROVIDER_ARN`.
    pub oidc_provider_arn: String,
    /// `ALIBABA_CLOUD_OIDC_TOKEN_FILE`: read again on every refresh.
    pub token_file: PathBuf,
    /// `ALIBABA_CLOUD_SESSION_NAME`.
    pub session_name: String,
    /// Requested lifetime; STS's default (3600 s) when `None`.
    pub duration_seconds: Option<u32>,
    /// STS base URL.
    pub sts_endpoint: String,
}

/// Temporary credentials from `AssumeRoleWithOIDC`.
pub struct OidcRoleCredentials {
    config: OidcRoleConfig,
    transport: Transport,
    retry: RetryPolicy,
    cache: Cache,
}

impl OidcRoleCredentials {
    /// A provider; nothing is fetched until the first call.
    pub fn new(
        config: OidcRoleConfig,
        transport: TransportOptions,
        retry: RetryPolicy,
        refresh: RefreshPolicy,
    ) -> Result<Self, Error> {
        Ok(Self {
            config,
            transport: Transport::new(transport)?,
            retry,
            cache: Cache::new(refresh),
        })
    }

    async fn fetch(&self) -> Result<Credentials, CredentialsError> {
        let path = &self.config.token_file;
        let token = tokio::fs::read_to_string(path).await.map_err(|source| {
            CredentialsError::TokenFile {
                path: path.clone(),
                source,
            }
        })?;
        let token = token.trim();
        if token.is_empty() {
            return Err(CredentialsError::EmptyToken(path.clone()));
        }
        let request = AssumeRoleWithOidc {
            role_arn: self.config.role_arn.clone(),
            oidc_provider_arn: self.config.oidc_provider_arn.clone(),
            oidc_token: token.to_string(),
            role_session_name: self.config.session_name.clone(),
            duration_seconds: self.config.duration_seconds,
        };
        sts::assume_role_with_oidc(
            &self.transport,
            &self.retry,
            &self.config.sts_endpoint,
            &request,
        )
        .await
        .map_err(|e| CredentialsError::Sts(Box::new(e)))
    }
}

impl CredentialsProvider for OidcRoleCredentials {
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>> {
        Box::pin(self.cache.get("AssumeRoleWithOIDC", || self.fetch()))
    }

    fn invalidate(&self) {
        self.cache.invalidate();
    }
}
