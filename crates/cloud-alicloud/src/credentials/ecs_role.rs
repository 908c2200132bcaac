//! The RAM role of the ECS instance the operator runs on: temporary credentials from the
//! metadata server.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request};
use http_body_util::Full;
use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::cache::{Cache, RefreshPolicy};
use super::provider::{Credentials, CredentialsProvider};
use crate::error::{CredentialsError, Error};
use crate::transport::{Sent, Transport, TransportOptions};

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
