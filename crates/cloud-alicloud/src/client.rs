//! One RPC client for the Alibaba Cloud products the operator calls (ESS, ECS; STS for
//! credentials), with the wire behaviour of the SDK that cluster-autoscaler vendors
//! (`sdk/client.go` `DoActionWithSigner`, `sdk/auth/rpc_signature_composer.go`):
//!
//! - `POST <endpoint>/?<query>` with every parameter in the query and an empty
//!   `application/x-www-form-urlencoded` body (`RpcRequest.init` makes every RPC call a POST);
//! - common parameters `Action`, `Version` (per product), `Format=JSON`, `Timestamp` (UTC,
//!   `YYYY-MM-DDThh:mm:ssZ`), `SignatureMethod=HMAC-SHA1`, `SignatureType=` (empty, as the
//!   SDK sends it), `SignatureVersion=1.0`, `SignatureNonce`, `AccessKeyId`, `RegionId`, and
//!   `SecurityToken` with temporary credentials, then `Signature` ([`super::signature`]);
//! - retries only on HTTP 5xx and timeouts (default: 3 retries of 10 s attempts), each
//!   attempt re-signed with a fresh `SignatureNonce` and `Timestamp`.
//!
//! Departures from the SDK, each on purpose: the scheme defaults to HTTPS (the SDK's default
//! is plain HTTP); endpoints are given per product instead of resolved through the Location
//! service; retries wait a little (exponential from 200 ms) instead of hammering a failing
//! server; `Throttling`/`Throttling.*` answers (HTTP 400, never retried by the SDK) are
//! retried after an exponential back-off from 1 s; an answer that says the temporary
//! credentials are unknown or expired drops them and retries once with fresh ones.
//!
//! Writes and retries: a retried write is only sent again when the previous attempt got a
//! 5xx, a throttling answer or no answer. Callers make their writes safe to repeat: a
//! scale-out (`ScaleWithAdjustment` by a quantity) and `RemoveInstances` carry a
//! `ClientToken` that stays the same across the attempts of one call ([`super::ess`]), and
//! the one absolute write, `ModifyScalingGroup` `DesiredCapacity` after a short launch,
//! sets a value read just before.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::Full;
use ngo_cloud_http::{CertificateDer, HttpClient, HttpOptions, SendError};
use serde::de::DeserializeOwned;

use super::credentials::{Credentials, CredentialsProvider};
use super::error::{ApiError, ApiErrorKind, Error};
use super::signature;

/// An Alibaba Cloud product and the API version the client speaks to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// Auto Scaling (ESS), `2014-08-28`.
    Ess,
    /// Elastic Compute Service, `2014-05-26`.
    Ecs,
    /// Virtual Private Cloud, `2016-04-28` (the zones of a group's vSwitches).
    Vpc,
}

impl Product {
    /// The `Version` parameter.
    pub fn version(self) -> &'static str {
        match self {
            Self::Ess => "2014-08-28",
            Self::Ecs => "2014-05-26",
            Self::Vpc => "2016-04-28",
        }
    }
}

/// `http://` or `https://`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP: the SDK's default, for emulators and VPC-internal proxies.
    Http,
    /// HTTPS (default).
    #[default]
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// Base URLs (`scheme://host[:port]`) of each product.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// ESS.
    pub ess: String,
    /// ECS.
    pub ecs: String,
    /// VPC.
    pub vpc: String,
    /// STS (`AssumeRoleWithOIDC`).
    pub sts: String,
}

impl Endpoints {
    /// The public regional endpoints `ess.<region>.aliyuncs.com`,
    /// `ecs.<region>.aliyuncs.com`, `vpc.<region>.aliyuncs.com` and
    /// `sts.<region>.aliyuncs.com`. (cluster-autoscaler asks the Location service instead and
    /// uses `sts.aliyuncs.com` for RRSA.)
    pub fn for_region(region_id: &str, scheme: Scheme) -> Self {
        let s = scheme.as_str();
        Self {
            ess: format!("{s}://ess.{region_id}.aliyuncs.com"),
            ecs: format!("{s}://ecs.{region_id}.aliyuncs.com"),
            vpc: format!("{s}://vpc.{region_id}.aliyuncs.com"),
            sts: format!("{s}://sts.{region_id}.aliyuncs.com"),
        }
    }

    fn of(&self, product: Product) -> &str {
        match product {
            Product::Ess => &self.ess,
            Product::Ecs => &self.ecs,
            Product::Vpc => &self.vpc,
        }
    }
}

/// Connection settings shared by the API client and the credential providers.
#[derive(Clone, Debug)]
pub struct TransportOptions {
    /// Per attempt, from sending the request to the end of the answer (SDK: 10 s).
    pub timeout: Duration,
    /// Trusted in addition to the system's roots (a private gateway's CA).
    pub extra_root_certificates: Vec<CertificateDer<'static>>,
    /// `User-Agent`.
    pub user_agent: String,
}

impl Default for TransportOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            extra_root_certificates: Vec::new(),
            user_agent: format!("nodegroup-operator/{}", env!("CARGO_PKG_VERSION")),
        }
    }
}

/// When to try a call again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after a 5xx or a timeout (SDK: `MaxRetryTime = 3`).
    pub max_retries: u32,
    /// Wait before the first such retry; doubles each time.
    pub backoff: Duration,
    /// Retries after a throttling answer.
    pub throttle_retries: u32,
    /// Wait before the first retry after throttling; doubles each time.
    pub throttle_backoff: Duration,
    /// Upper bound of any single wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 3,
            backoff: Duration::from_millis(200),
            throttle_retries: 3,
            throttle_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    fn wait(&self, base: Duration, retry: u32) -> Duration {
        let factor = 1u32 << retry.saturating_sub(1).min(16);
        base.saturating_mul(factor).min(self.max_backoff)
    }
}

/// The HTTP layer: the pooled client over plain TCP or rustls ([`HttpClient`]), the
/// `User-Agent`, and the retry loop. Cheap to clone.
#[derive(Clone)]
pub struct Transport {
    http: HttpClient,
    options: TransportOptions,
}

/// One attempt's outcome.
pub(crate) enum Sent {
    /// Any HTTP answer.
    Answer(StatusCode, Bytes),
    /// No answer within the timeout.
    Timeout,
}

impl Transport {
    /// A transport trusting the system's roots plus `extra_root_certificates`.
    pub fn new(options: TransportOptions) -> Result<Self, Error> {
        let http = HttpClient::new(&HttpOptions {
            extra_root_certificates: options.extra_root_certificates.clone(),
            ..HttpOptions::new(options.timeout)
        })
        .map_err(|e| Error::Config(e.to_string()))?;
        Ok(Self { http, options })
    }

    /// Sends one request and reads the whole answer, within the per-attempt timeout.
    pub(crate) async fn send_once(
        &self,
        action: &str,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Sent, Error> {
        if let Ok(agent) = header::HeaderValue::from_str(&self.options.user_agent) {
            request.headers_mut().insert(header::USER_AGENT, agent);
        }
        match self.http.send(request).await {
            Ok(answer) => Ok(Sent::Answer(answer.status, answer.body)),
            Err(SendError::Timeout(_)) => Ok(Sent::Timeout),
            Err(SendError::Connect(message) | SendError::Broken(message)) => {
                Err(Error::Transport {
                    action: action.to_string(),
                    message,
                })
            }
        }
    }

    /// Sends the request `build` makes (called again for every attempt, so each is re-signed)
    /// until it succeeds or `policy` gives up; returns the body of a 2xx answer.
    pub(crate) async fn execute(
        &self,
        action: &str,
        policy: &RetryPolicy,
        mut build: impl FnMut() -> Result<Request<Full<Bytes>>, Error>,
    ) -> Result<Bytes, Error> {
        let (mut failures, mut throttled, mut attempts) = (0u32, 0u32, 0u32);
        loop {
            attempts += 1;
            let request = build()?;
            match self.send_once(action, request).await? {
                Sent::Answer(status, body) if status.is_success() => return Ok(body),
                Sent::Answer(status, body) => {
                    let error = ApiError::from_response(status.as_u16(), &body);
                    match error.kind() {
                        ApiErrorKind::Throttling if throttled < policy.throttle_retries => {
                            throttled += 1;
                            let wait = policy.wait(policy.throttle_backoff, throttled);
                            tracing::debug!(action, code = %error.code, ?wait, "throttled; backing off");
                            tokio::time::sleep(wait).await;
                        }
                        ApiErrorKind::Throttling => {
                            return Err(Error::Throttled {
                                action: action.to_string(),
                                attempts,
                                last: Box::new(error),
                            });
                        }
                        _ if status.is_server_error() && failures < policy.max_retries => {
                            failures += 1;
                            let wait = policy.wait(policy.backoff, failures);
                            tracing::debug!(
                                action,
                                status = status.as_u16(),
                                ?wait,
                                "server error; retrying"
                            );
                            tokio::time::sleep(wait).await;
                        }
                        _ => {
                            return Err(Error::Api {
                                action: action.to_string(),
                                error: Box::new(error),
                            });
                        }
                    }
                }
                Sent::Timeout if failures < policy.max_retries => {
                    failures += 1;
                    let wait = policy.wait(policy.backoff, failures);
                    tracing::debug!(action, ?wait, "no answer in time; retrying");
                    tokio::time::sleep(wait).await;
                }
                Sent::Timeout => {
                    return Err(Error::Timeout {
                        action: action.to_string(),
                        attempts,
                        timeout: self.options.timeout,
                    });
                }
            }
        }
    }
}

/// Everything [`Client::new`] needs.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// `RegionId` of every call.
    pub region_id: String,
    /// Where each product answers.
    pub endpoints: Endpoints,
    /// Timeouts, TLS roots, user agent.
    pub transport: TransportOptions,
    /// Retries.
    pub retry: RetryPolicy,
}

impl ClientOptions {
    /// The public endpoints of `region_id` over HTTPS, SDK-like timeouts and retries.
    pub fn for_region(region_id: &str) -> Self {
        Self {
            region_id: region_id.to_string(),
            endpoints: Endpoints::for_region(region_id, Scheme::Https),
            transport: TransportOptions::default(),
            retry: RetryPolicy::default(),
        }
    }
}

/// The signed RPC client. Cheap to clone; clones share the connection pool and the
/// credentials, which [`Client::set_credentials`] swaps for every clone at once (a new
/// AccessKey in the Secret applies to the next call).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    transport: Transport,
    options: ClientOptions,
    credentials: RwLock<Arc<dyn CredentialsProvider>>,
}

impl Client {
    /// A client signing with `credentials`.
    pub fn new(
        options: ClientOptions,
        credentials: Arc<dyn CredentialsProvider>,
    ) -> Result<Self, Error> {
        for (product, url) in [
            ("ESS", &options.endpoints.ess),
            ("ECS", &options.endpoints.ecs),
            ("VPC", &options.endpoints.vpc),
            ("STS", &options.endpoints.sts),
        ] {
            let uri: http::Uri = url
                .parse()
                .map_err(|e| Error::Config(format!("{product} endpoint {url:?}: {e}")))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(Error::Config(format!(
                    "{product} endpoint {url:?} is not an http(s) URL"
                )));
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                transport: Transport::new(options.transport.clone())?,
                options,
                credentials: RwLock::new(credentials),
            }),
        })
    }

    /// Signs every later call with `credentials`.
    pub fn set_credentials(&self, credentials: Arc<dyn CredentialsProvider>) {
        let mut slot = self
            .inner
            .credentials
            .write()
            .unwrap_or_else(|p| p.into_inner());
        *slot = credentials;
    }

    /// The options the client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// Typed ESS calls.
    pub fn ess(&self) -> super::ess::Ess {
        super::ess::Ess::new(self.clone())
    }

    /// Typed ECS calls.
    pub fn ecs(&self) -> super::ecs::Ecs {
        super::ecs::Ecs::new(self.clone())
    }

    /// Typed VPC calls.
    pub fn vpc(&self) -> super::vpc::Vpc {
        super::vpc::Vpc::new(self.clone())
    }

    fn provider(&self) -> Arc<dyn CredentialsProvider> {
        self.inner
            .credentials
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Calls `action` of `product` with `params` (without the common ones) and decodes the
    /// 2xx answer (an empty one decodes as `{}`).
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        product: Product,
        action: &str,
        params: &[(String, String)],
    ) -> Result<T, Error> {
        let provider = self.provider();
        let mut credentials = provider.credentials().await?;
        let endpoint = self
            .inner
            .options
            .endpoints
            .of(product)
            .trim_end_matches('/');
        let mut refreshed = false;
        let body = loop {
            let result = self
                .inner
                .transport
                .execute(action, &self.inner.options.retry, || {
                    let query = self.signed_query(product, action, params, &credentials);
                    Request::builder()
                        .method(Method::POST)
                        .uri(format!("{endpoint}/?{query}"))
                        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                        .header(header::ACCEPT, "application/json")
                        .body(Full::new(Bytes::new()))
                        .map_err(|e| Error::Config(format!("{endpoint}: {e}")))
                })
                .await;
            match result {
                // Temporary credentials the API no longer accepts (revoked, or our clock is
                // behind the issuer's): fetch new ones once.
                Err(Error::Api { ref error, .. })
                    if !refreshed
                        && credentials.expiration.is_some()
                        && matches!(
                            error.kind(),
                            ApiErrorKind::InvalidAccessKey | ApiErrorKind::InvalidSecurityToken
                        ) =>
                {
                    tracing::info!(action, code = %error.code, "temporary credentials refused; fetching new ones");
                    refreshed = true;
                    provider.invalidate();
                    credentials = provider.credentials().await?;
                }
                other => break other?,
            }
        };
        let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &body
        };
        serde_json::from_slice(text).map_err(|source| Error::Decode {
            action: action.to_string(),
            source,
        })
    }

    fn signed_query(
        &self,
        product: Product,
        action: &str,
        params: &[(String, String)],
        credentials: &Credentials,
    ) -> String {
        let mut query: BTreeMap<String, String> = params.iter().cloned().collect();
        let common = [
            ("Action", action.to_string()),
            ("Version", product.version().to_string()),
            ("Format", "JSON".to_string()),
            ("Timestamp", timestamp_now()),
            ("SignatureMethod", "HMAC-SHA1".to_string()),
            ("SignatureType", String::new()),
            ("SignatureVersion", "1.0".to_string()),
            ("SignatureNonce", nonce()),
            ("AccessKeyId", credentials.access_key_id.clone()),
        ];
        for (k, v) in common {
            query.insert(k.to_string(), v);
        }
        query
            .entry("RegionId".to_string())
            .or_insert_with(|| self.inner.options.region_id.clone());
        if let Some(token) = &credentials.security_token {
            query.insert("SecurityToken".to_string(), token.clone());
        }
        let signature = signature::sign(
            credentials.access_key_secret(),
            &signature::string_to_sign("POST", &query),
        );
        query.insert("Signature".to_string(), signature);
        signature::canonical_query(&query)
    }
}

/// Now, in the SDK's layout `2006-01-02T15:04:05Z` (UTC, no fraction).
pub(crate) fn timestamp_now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A fresh `SignatureNonce`: a random UUIDv4 as 32 lower-case hex digits, no dashes
/// (the SDK's `utils.GetUUIDV4`).
pub(crate) fn nonce() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        // The system RNG never fails on Linux; the clock keeps the nonce unique regardless.
        let nanos = jiff::Timestamp::now().as_nanosecond().to_le_bytes();
        bytes.copy_from_slice(&nanos);
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_uuid4_hex_and_fresh() {
        let a = nonce();
        let b = nonce();
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(&a[12..13], "4");
        assert_ne!(a, b);
    }

    #[test]
    fn timestamps_have_no_fraction() {
        let t = timestamp_now();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z'));
        assert_eq!(&t[10..11], "T");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = RetryPolicy {
            max_backoff: Duration::from_secs(3),
            ..RetryPolicy::default()
        };
        assert_eq!(p.wait(Duration::from_secs(1), 1), Duration::from_secs(1));
        assert_eq!(p.wait(Duration::from_secs(1), 2), Duration::from_secs(2));
        assert_eq!(p.wait(Duration::from_secs(1), 3), Duration::from_secs(3));
        assert_eq!(p.wait(Duration::from_secs(1), 40), Duration::from_secs(3));
    }

    #[test]
    fn endpoints_are_regional_and_https_by_default() {
        let e = ClientOptions::for_region("cn-hangzhou").endpoints;
        assert_eq!(e.ess, "https://ess.cn-hangzhou.aliyuncs.com");
        assert_eq!(e.ecs, "https://ecs.cn-hangzhou.aliyuncs.com");
        assert_eq!(
            Endpoints::for_region("x", Scheme::Http).sts,
            "http://sts.x.aliyuncs.com"
        );
    }
}
