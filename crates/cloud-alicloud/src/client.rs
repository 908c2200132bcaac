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
//! - retries only on HTTP 5xx and timeouts (default: 3 retries of 10 s attempts, by
//!   [`super::transport`]), each attempt re-signed with a fresh `SignatureNonce` and
//!   `Timestamp`.
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

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::Full;
use serde::de::DeserializeOwned;

use super::credentials::{Credentials, CredentialsProvider};
use super::error::{ApiErrorKind, Error};
use super::signature::{self, nonce, timestamp_now};
use super::transport::{RetryPolicy, Transport, TransportOptions};

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

#[cfg(test)]
mod tests {
    use super::*;

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
