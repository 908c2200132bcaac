//! Where the AccessKey that signs a call comes from. Three providers, the modes of
//! cluster-autoscaler's `cloudConfig.isValid` (`alicloud_cloud_config.go`):
//!
//! - [`StaticCredentials`]: an AccessKey pair (optionally with an STS token), as
//!   `ACCESS_KEY_ID`/`ACCESS_KEY_SECRET`;
//! - [`OidcRoleCredentials`] (RRSA): `AssumeRoleWithOIDC` with a role ARN, an OIDC provider ARN
//!   and the service-account token, read from its file on every refresh (kubelet rotates it);
//! - [`EcsRamRoleCredentials`]: the RAM role of the ECS instance, from the metadata server
//!   (`GET /latest/meta-data/ram/security-credentials/<role>`), in security hardening mode
//!   (a session token from `PUT /latest/api/token` on every read) so that instances created
//!   with `HttpTokens=required` answer; cluster-autoscaler's `alicloud/metadata/metadata.go`
//!   reads without a token and is refused there.
//!
//! Temporary credentials are cached and fetched again before they expire: once less than
//! [`RefreshPolicy::margin`] (5 min) — or a fifth of their lifetime, for short-lived ones —
//! is left. One fetch at a time; concurrent callers wait for it. If a refresh fails while the
//! cached credentials are still valid they keep being used (the failure is logged and the
//! refresh tried again a few seconds later). Upstream refreshes RRSA credentials once 80 % of
//! an assumed 3600 s lifetime has passed (`credential_updater.go`) and rebuilds metadata
//! clients every 60 min (`refreshClientInterval`), whatever the real expiry.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request};
use http_body_util::Full;
use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::client::{RetryPolicy, Sent, Transport, TransportOptions};
use super::error::Error;
use super::sts::{self, AssumeRoleWithOidc};

/// An AccessKey pair, with the STS token and expiry of temporary credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `AccessKeyId`.
    pub access_key_id: String,
    access_key_secret: String,
    /// `SecurityToken`, sent with every call signed by temporary credentials.
    pub security_token: Option<String>,
    /// When temporary credentials stop working.
    pub expiration: Option<jiff::Timestamp>,
}

impl Credentials {
    /// A permanent AccessKey pair.
    pub fn new(access_key_id: impl Into<String>, access_key_secret: impl Into<String>) -> Self {
        Self {
            access_key_id: access_key_id.into(),
            access_key_secret: access_key_secret.into(),
            security_token: None,
            expiration: None,
        }
    }

    /// With an STS `SecurityToken`.
    pub fn with_security_token(mut self, token: impl Into<String>) -> Self {
        self.security_token = Some(token.into());
        self
    }

    /// With an expiry.
    pub fn with_expiration(mut self, expiration: jiff::Timestamp) -> Self {
        self.expiration = Some(expiration);
        self
    }

    /// The secret (never logged; `Debug` redacts it).
    pub fn access_key_secret(&self) -> &str {
        &self.access_key_secret
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("access_key_secret", &"<redacted>")
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "<redacted>"),
            )
            .field("expiration", &self.expiration)
            .finish()
    }
}

/// Why credentials could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The OIDC token file could not be read.
    #[error("reading the OIDC token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The OIDC token file is empty.
    #[error("the OIDC token file {0} is empty")]
    EmptyToken(PathBuf),
    /// `AssumeRoleWithOIDC` failed.
    #[error("AssumeRoleWithOIDC: {0}")]
    Sts(#[source] Box<Error>),
    /// The metadata server did not give credentials.
    #[error("ECS metadata server {url}: {message}")]
    Metadata {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
        /// No answer (as opposed to a refusal).
        transient: bool,
    },
}

impl CredentialsError {
    /// Worth trying again later unchanged.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Sts(e) => e.is_transient(),
            Self::Metadata { transient, .. } => *transient,
            Self::TokenFile { .. } | Self::EmptyToken(_) => false,
        }
    }
}

/// A source of credentials. The client asks before every call; implementations cache.
pub trait CredentialsProvider: Send + Sync {
    /// Credentials valid now.
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>>;

    /// The API refused the credentials last returned: fetch new ones next time.
    fn invalidate(&self) {}
}

/// Fixed credentials.
#[derive(Clone, Debug)]
pub struct StaticCredentials(Credentials);

impl StaticCredentials {
    /// An AccessKey pair.
    pub fn new(access_key_id: impl Into<String>, access_key_secret: impl Into<String>) -> Self {
        Self(Credentials::new(access_key_id, access_key_secret))
    }

    /// Given credentials as they are (an STS token from elsewhere, say).
    pub fn from_credentials(credentials: Credentials) -> Self {
        Self(credentials)
    }
}

impl CredentialsProvider for StaticCredentials {
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>> {
        let c = self.0.clone();
        Box::pin(async move { Ok(c) })
    }
}

/// When cached temporary credentials are fetched again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefreshPolicy {
    /// Refresh once less than this is left (capped at a fifth of the lifetime).
    pub margin: Duration,
    /// After a failed refresh with still-valid credentials, wait this long before the next.
    pub retry_after: Duration,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            margin: Duration::from_secs(300),
            retry_after: Duration::from_secs(5),
        }
    }
}

impl RefreshPolicy {
    /// When credentials fetched at `now` and expiring at `expiration` should be replaced.
    pub fn refresh_at(&self, now: jiff::Timestamp, expiration: jiff::Timestamp) -> jiff::Timestamp {
        let lifetime = expiration.duration_since(now);
        let margin = jiff::SignedDuration::try_from(self.margin)
            .unwrap_or(jiff::SignedDuration::MAX)
            .min(lifetime / 5)
            .max(jiff::SignedDuration::ZERO);
        expiration.checked_sub(margin).unwrap_or(now)
    }
}

struct Cached {
    credentials: Credentials,
    refresh_at: jiff::Timestamp,
}

/// Single-flight cache of temporary credentials.
struct Cache {
    slot: tokio::sync::Mutex<Option<Cached>>,
    stale: AtomicBool,
    policy: RefreshPolicy,
}

impl Cache {
    fn new(policy: RefreshPolicy) -> Self {
        Self {
            slot: tokio::sync::Mutex::new(None),
            stale: AtomicBool::new(false),
            policy,
        }
    }

    async fn get<F, Fut>(&self, what: &str, fetch: F) -> Result<Credentials, CredentialsError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Credentials, CredentialsError>>,
    {
        let mut slot = self.slot.lock().await;
        let now = jiff::Timestamp::now();
        let stale = self.stale.swap(false, Ordering::AcqRel);
        if let Some(cached) = slot.as_ref()
            && !stale
            && now < cached.refresh_at
            && cached.credentials.expiration.is_none_or(|exp| now < exp)
        {
            return Ok(cached.credentials.clone());
        }
        match fetch().await {
            Ok(credentials) => {
                let refresh_at = match credentials.expiration {
                    Some(exp) => self.policy.refresh_at(now, exp),
                    None => now + jiff::SignedDuration::from_hours(1),
                };
                tracing::debug!(what, access_key_id = %credentials.access_key_id, expiration = ?credentials.expiration, %refresh_at, "temporary credentials fetched");
                *slot = Some(Cached {
                    credentials: credentials.clone(),
                    refresh_at,
                });
                Ok(credentials)
            }
            Err(error) => match slot.as_mut() {
                Some(cached)
                    if !stale && cached.credentials.expiration.is_some_and(|exp| now < exp) =>
                {
                    tracing::warn!(what, %error, "refreshing credentials failed; the cached ones are still valid");
                    let retry = jiff::SignedDuration::try_from(self.policy.retry_after)
                        .unwrap_or(jiff::SignedDuration::from_secs(5));
                    cached.refresh_at = now + retry;
                    Ok(cached.credentials.clone())
                }
                _ => Err(error),
            },
        }
    }

    fn invalidate(&self) {
        self.stale.store(true, Ordering::Release);
    }
}

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

/// The ECS metadata server's default address.
pub const METADATA_ENDPOINT: &str = "http://100.100.100.200";

/// Attempts per metadata request, 200 ms apart, on timeouts and connection errors only (the
/// `AttemptStrategy` of `alicloud/metadata/metadata.go`).
const METADATA_ATTEMPTS: u32 = 5;

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase", default)]
struct RoleAuth {
    #[serde(deserialize_with = "lenient::string")]
    code: String,
    #[serde(deserialize_with = "lenient::string")]
    access_key_id: String,
    #[serde(deserialize_with = "lenient::string")]
    access_key_secret: String,
    #[serde(deserialize_with = "lenient::string")]
    security_token: String,
    #[serde(deserialize_with = "lenient::string")]
    expiration: String,
}

/// Lifetime asked for a metadata session token, seconds (the most the server gives).
const METADATA_TOKEN_TTL: u64 = 21600;
/// A session token is asked for again once this much of its lifetime is left.
const METADATA_TOKEN_MARGIN: Duration = Duration::from_secs(600);

/// Temporary credentials of the instance's RAM role, from the metadata server.
///
/// Reads use security hardening mode, as the ECS instance-metadata page
/// (<https://www.alibabacloud.com/help/en/ecs/user-guide/view-instance-metadata>)
/// describes it: "Obtain a temporary token" with `curl -X PUT
/// "http://100.100.100.200/latest/api/token" -H "X-aliyun-ecs-metadata-token-ttl-seconds:21600"`,
/// then "Include the token in your request to retrieve metadata" as
/// `X-aliyun-ecs-metadata-token`. A metadata server that hands out no token (the `PUT` is
/// answered with an error) is read without one, in normal mode; a token refused on a read
/// (expired, the server restarted) is dropped and a new one asked for once.
pub struct EcsRamRoleCredentials {
    base: String,
    role: tokio::sync::OnceCell<String>,
    transport: Transport,
    cache: Cache,
    session: tokio::sync::Mutex<Option<(String, std::time::Instant)>>,
}

impl EcsRamRoleCredentials {
    /// A provider for `role` (found through the metadata server when `None`) at `base`
    /// ([`METADATA_ENDPOINT`] on ECS). Each metadata request gets at most 2 s per attempt.
    pub fn new(
        base: impl Into<String>,
        role: Option<String>,
        mut transport: TransportOptions,
        refresh: RefreshPolicy,
    ) -> Result<Self, Error> {
        transport.timeout = transport.timeout.min(Duration::from_secs(2));
        let role_cell = tokio::sync::OnceCell::new();
        if let Some(role) = role.filter(|r| !r.is_empty()) {
            // A fresh cell cannot be set already.
            let _ = role_cell.set(role);
        }
        Ok(Self {
            base: base.into().trim_end_matches('/').to_string(),
            role: role_cell,
            transport: Transport::new(transport)?,
            cache: Cache::new(refresh),
            session: tokio::sync::Mutex::new(None),
        })
    }

    /// A session token for the next read: the cached one while it has
    /// [`METADATA_TOKEN_MARGIN`] left, else a new one (`PUT /latest/api/token`); `None` when
    /// the server gives none (normal mode only).
    async fn session_token(&self) -> Option<String> {
        let mut session = self.session.lock().await;
        if let Some((token, expires)) = session.as_ref()
            && expires.saturating_duration_since(std::time::Instant::now()) > METADATA_TOKEN_MARGIN
        {
            return Some(token.clone());
        }
        let url = format!("{}/latest/api/token", self.base);
        for attempt in 1..=METADATA_ATTEMPTS {
            let request = Request::builder()
                .method(Method::PUT)
                .uri(&url)
                .header(
                    "X-aliyun-ecs-metadata-token-ttl-seconds",
                    METADATA_TOKEN_TTL.to_string(),
                )
                .body(Full::new(Bytes::new()))
                .ok()?;
            let asked = std::time::Instant::now();
            match self.transport.send_once("metadata", request).await {
                Ok(Sent::Answer(status, body)) if status.is_success() => {
                    let token = String::from_utf8_lossy(&body).trim().to_string();
                    if token.is_empty() {
                        return None;
                    }
                    *session = Some((
                        token.clone(),
                        asked + Duration::from_secs(METADATA_TOKEN_TTL),
                    ));
                    return Some(token);
                }
                Ok(Sent::Answer(status, _)) => {
                    tracing::debug!(%status, "the metadata server gives no session token; reading in normal mode");
                    return None;
                }
                Ok(Sent::Timeout) | Err(_) => {}
            }
            if attempt < METADATA_ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        None
    }

    async fn get(&self, path: &str) -> Result<String, CredentialsError> {
        let token = self.session_token().await;
        let tokened = token.is_some();
        match self.get_with(path, token).await {
            (Some(http::StatusCode::UNAUTHORIZED), _) if tokened => {
                *self.session.lock().await = None;
                self.get_with(path, self.session_token().await).await.1
            }
            (_, result) => result,
        }
    }

    /// One read with `token`, and the HTTP status of a refusal.
    async fn get_with(
        &self,
        path: &str,
        token: Option<String>,
    ) -> (Option<http::StatusCode>, Result<String, CredentialsError>) {
        let url = format!("{}{path}", self.base);
        let failed = |url: String, message: String, transient: bool| {
            Err(CredentialsError::Metadata {
                url,
                message,
                transient,
            })
        };
        let mut last = String::new();
        for attempt in 1..=METADATA_ATTEMPTS {
            let mut request = Request::builder().method(Method::GET).uri(&url);
            if let Some(token) = &token {
                request = request.header("X-aliyun-ecs-metadata-token", token.as_str());
            }
            let request = match request.body(Full::new(Bytes::new())) {
                Ok(r) => r,
                Err(e) => return (None, failed(url, e.to_string(), false)),
            };
            match self.transport.send_once("metadata", request).await {
                Ok(Sent::Answer(status, body)) if status.is_success() => {
                    let text = String::from_utf8_lossy(&body).to_string();
                    if text.trim().is_empty() {
                        return (None, failed(url, "empty answer".into(), false));
                    }
                    return (None, Ok(text));
                }
                Ok(Sent::Answer(status, _)) => {
                    let transient = status.is_server_error();
                    return (
                        Some(status),
                        failed(url, format!("HTTP {status}"), transient),
                    );
                }
                Ok(Sent::Timeout) => last = "no answer in time".into(),
                Err(e) => last = e.to_string(),
            }
            if attempt < METADATA_ATTEMPTS {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        (None, failed(url, last, true))
    }

    async fn fetch(&self) -> Result<Credentials, CredentialsError> {
        let role = self
            .role
            .get_or_try_init(|| async {
                let text = self
                    .get("/latest/meta-data/ram/security-credentials/")
                    .await?;
                text.lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| CredentialsError::Metadata {
                        url: format!("{}/latest/meta-data/ram/security-credentials/", self.base),
                        message: "no RAM role attached to the instance".into(),
                        transient: false,
                    })
            })
            .await?;
        let path = format!("/latest/meta-data/ram/security-credentials/{role}");
        let text = self.get(&path).await?;
        let url = format!("{}{path}", self.base);
        let auth: RoleAuth =
            serde_json::from_str(&text).map_err(|e| CredentialsError::Metadata {
                url: url.clone(),
                message: format!("decoding the answer: {e}"),
                transient: false,
            })?;
        if auth.code != "Success" {
            return Err(CredentialsError::Metadata {
                url,
                message: format!("Code {:?}", auth.code),
                transient: true,
            });
        }
        let expiration =
            auth.expiration
                .parse::<jiff::Timestamp>()
                .map_err(|e| CredentialsError::Metadata {
                    url: url.clone(),
                    message: format!("Expiration {:?}: {e}", auth.expiration),
                    transient: false,
                })?;
        if auth.access_key_id.is_empty() || auth.access_key_secret.is_empty() {
            return Err(CredentialsError::Metadata {
                url,
                message: "answer lacks AccessKeyId or AccessKeySecret".into(),
                transient: false,
            });
        }
        let mut credentials = Credentials::new(auth.access_key_id, auth.access_key_secret)
            .with_expiration(expiration);
        if !auth.security_token.is_empty() {
            credentials = credentials.with_security_token(auth.security_token);
        }
        Ok(credentials)
    }
}

impl CredentialsProvider for EcsRamRoleCredentials {
    fn credentials(&self) -> BoxFuture<'_, Result<Credentials, CredentialsError>> {
        Box::pin(self.cache.get("ECS RAM role", || self.fetch()))
    }

    fn invalidate(&self) {
        self.cache.invalidate();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn long_lived_credentials_refresh_five_minutes_early() {
        let p = RefreshPolicy::default();
        let now = ts("2024-01-01T00:00:00Z");
        assert_eq!(
            p.refresh_at(now, ts("2024-01-01T01:00:00Z")),
            ts("2024-01-01T00:55:00Z")
        );
    }

    #[test]
    fn short_lived_credentials_refresh_at_four_fifths() {
        let p = RefreshPolicy::default();
        let now = ts("2024-01-01T00:00:00Z");
        assert_eq!(
            p.refresh_at(now, ts("2024-01-01T00:00:10Z")),
            ts("2024-01-01T00:00:08Z")
        );
        // Already expired: refresh now.
        assert!(p.refresh_at(now, ts("2023-12-31T23:59:00Z")) <= now);
    }

    #[test]
    fn debug_redacts_secrets() {
        let c = Credentials::new("LTAIkey", "s3cret").with_security_token("tok3n");
        let text = format!("{c:?}");
        assert!(text.contains("LTAIkey"));
        assert!(
            !text.contains("s3cret") && !text.contains("tok3n"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_cache_fetches_once_until_refresh_and_after_invalidate() {
        let cache = Cache::new(RefreshPolicy::default());
        let fetches = std::sync::atomic::AtomicU32::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Ok(Credentials::new("id", "secret")
                .with_expiration(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)))
        };
        cache.get("test", fetch).await.unwrap();
        cache.get("test", fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        cache.invalidate();
        cache.get("test", fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_valid_credentials_until_they_expire() {
        let cache = Cache::new(RefreshPolicy::default());
        let now = jiff::Timestamp::now();
        let valid = Credentials::new("id", "secret")
            .with_expiration(now + jiff::SignedDuration::from_secs(60));
        *cache.slot.lock().await = Some(Cached {
            credentials: valid.clone(),
            refresh_at: now - jiff::SignedDuration::from_secs(1),
        });
        let failing = || async { Err(CredentialsError::EmptyToken(PathBuf::from("/token"))) };
        assert_eq!(cache.get("test", failing).await.unwrap(), valid);
        // The next refresh waits `retry_after`; the valid credentials are served meanwhile.
        let retry_at = cache.slot.lock().await.as_ref().unwrap().refresh_at;
        assert!(
            retry_at > now + jiff::SignedDuration::from_secs(4),
            "{retry_at}"
        );

        let expired = Credentials::new("id", "secret")
            .with_expiration(now - jiff::SignedDuration::from_secs(1));
        *cache.slot.lock().await = Some(Cached {
            credentials: expired,
            refresh_at: now + jiff::SignedDuration::from_secs(60),
        });
        assert!(cache.get("test", failing).await.is_err());
    }
}
