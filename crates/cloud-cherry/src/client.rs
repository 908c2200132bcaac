//! The HTTP client: endpoints, pacing, retries, paging and how answers become results.
//!
//! Retry policy, per call (at most [`MAX_ATTEMPTS`] requests), as cherrygo v4's
//! (`internal/client/retry.go`: only idempotent methods are retried, 429 included):
//! - GET and DELETE are sent again after a 429, a 5xx, a 408, a timeout or a connection
//!   failure: after the 429's `Retry-After` (seconds or an HTTP date), else after 1 s, 2 s.
//!   A `Retry-After` longer than [`MAX_RETRY_AFTER`] ends the call with
//!   [`CherryError::RateLimited`] at once.
//! - A create is sent once. Its outcome after a 5xx, a timeout or a broken connection is
//!   unknown (the server may exist), so it fails with [`CherryError::Unavailable`] (after a
//!   429, [`CherryError::RateLimited`]) and the caller reconciles by listing.
//! - A 429's wait holds back every later request of this client and its clones.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;
use ngo_cloud_http::excerpt::{excerpt, opaque_body};
use ngo_cloud_http::{HttpClient, HttpOptions, SendError};
use serde::de::DeserializeOwned;

use super::error::CherryError;
use super::limiter::Pacer;
use super::types::{CreateBody, CreateServer, Plan, Server};

/// The API's base URL (cluster-autoscaler's `baseURL`, cherrygo's `apiURL`).
pub const DEFAULT_BASE_URL: &str = "https://api.cherryservers.com/v1/";
/// Items asked for per page of a list.
pub const PAGE_SIZE: usize = 100;
/// Requests per call, the first included.
const MAX_ATTEMPTS: u32 = 3;
/// The longest `Retry-After` waited for inside one call.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(10);
/// Pages per list before the answer is taken to be broken (100,000 items at [`PAGE_SIZE`]).
const MAX_PAGES: usize = 1000;

/// How to reach the API.
#[derive(Clone)]
pub struct ClientConfig {
    /// Base URL; a missing trailing `/` is added (relative paths resolve against it, so
    /// without it `v1` would be dropped). Default [`DEFAULT_BASE_URL`].
    pub base_url: String,
    /// API token, sent as `Authorization: Bearer <token>`. Never logged or printed.
    pub token: String,
    /// `User-Agent`. Default `nodegroup-operator/<version>`.
    pub user_agent: String,
    /// Limit per request, from sending to the last byte of the answer. Default 30 s.
    pub timeout: Duration,
    /// Requests per second this client (and its clones) sends at most. Default 3, below the
    /// API's 4 per source address.
    pub requests_per_second: f64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.into(),
            token: String::new(),
            user_agent: concat!("nodegroup-operator/", env!("CARGO_PKG_VERSION")).into(),
            timeout: Duration::from_secs(30),
            requests_per_second: 3.0,
        }
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("user_agent", &self.user_agent)
            .field("timeout", &self.timeout)
            .field("requests_per_second", &self.requests_per_second)
            .finish()
    }
}

/// A Cherry Servers API client. Clones share the connection pool and the pacing.
#[derive(Clone)]
pub struct CherryClient {
    /// Pooled, with the configured timeout per request.
    http: HttpClient,
    /// Base URL, ending with `/`; request paths are appended to it.
    base: String,
    /// Path part of `base`, for messages.
    base_path: String,
    /// Sent with every request; the `Authorization` value is marked sensitive.
    headers: Arc<HeaderMap>,
    pacer: Arc<Pacer>,
}

impl fmt::Debug for CherryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CherryClient")
            .field("base", &self.base)
            .field("timeout", &self.http.timeout())
            .finish_non_exhaustive()
    }
}

/// Whether a request may be sent again after a failure that says nothing about its effect.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// GET, DELETE: the same request twice has the effect of one.
    Safe,
    /// POST create: never (its effect is unknown after a failure).
    Never,
}

/// One call: method and path (relative to the base, with its query).
struct Call<'a> {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
    repeat: Repeat,
    what: &'a str,
}

/// An HTTP answer, read whole.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    /// `METHOD /path?query`, for messages.
    request: String,
}

impl CherryClient {
    /// Builds a client; makes no request.
    pub fn new(config: ClientConfig) -> Result<Self, CherryError> {
        let invalid = |m: String| CherryError::InvalidConfig(m);
        if config.token.is_empty() {
            return Err(invalid("the API token is empty".into()));
        }
        if !(config.requests_per_second.is_finite() && config.requests_per_second > 0.0) {
            return Err(invalid(format!(
                "requests_per_second must be positive, got {}",
                config.requests_per_second
            )));
        }
        if config.timeout.is_zero() {
            return Err(invalid("timeout must be positive".into()));
        }
        let mut base = config.base_url.trim().to_string();
        if !base.ends_with('/') {
            base.push('/');
        }
        let uri: Uri = base
            .parse()
            .map_err(|e| invalid(format!("base URL {base:?}: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(invalid(format!("base URL {base:?}: not an http(s) URL")));
        }
        if uri.query().is_some() {
            return Err(invalid(format!("base URL {base:?}: has a query")));
        }
        let base_path = uri.path().to_string();
        let mut auth =
            HeaderValue::from_str(&format!("Bearer {}", config.token)).map_err(|_| {
                invalid("the API token contains characters a header cannot carry".into())
            })?;
        auth.set_sensitive(true);
        let agent = HeaderValue::from_str(&config.user_agent).map_err(|_| {
            invalid(format!(
                "user agent {:?}: not a header value",
                config.user_agent
            ))
        })?;
        let json = HeaderValue::from_static("application/json");
        // Content-Type on every request, bodiless ones included, as cluster-autoscaler's
        // `request` sends it.
        let headers = HeaderMap::from_iter([
            (header::AUTHORIZATION, auth),
            (header::CONTENT_TYPE, json.clone()),
            (header::ACCEPT, json),
            (header::USER_AGENT, agent),
        ]);
        // A pooled client trusting the system's root certificates (rustls with ring, as the
        // rest of the operator).
        let http = HttpClient::new(&HttpOptions::new(config.timeout))
            .map_err(|e| invalid(e.to_string()))?;
        Ok(Self {
            http,
            base,
            base_path,
            headers: Arc::new(headers),
            pacer: Arc::new(Pacer::new(config.requests_per_second)),
        })
    }

    /// Every server of the project (`GET projects/{id}/servers`), page by page. Pages are
    /// separate requests, so a server created or deleted meanwhile may be missed or seen
    /// twice; duplicates (by id) are dropped.
    pub async fn list_servers(&self, project_id: i64) -> Result<Vec<Server>, CherryError> {
        self.list_all(
            &format!("projects/{project_id}/servers"),
            "servers",
            |s: &Server| s.id.to_string(),
        )
        .await
    }

    /// One server (`GET servers/{id}`); `None` when the API does not know it (404).
    pub async fn get_server(&self, id: i64) -> Result<Option<Server>, CherryError> {
        let call = Call {
            method: Method::GET,
            path: format!("servers/{id}"),
            body: None,
            repeat: Repeat::Safe,
            what: "a server",
        };
        let answer = self.send(&call).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        ensure_success(&call, &answer)?;
        decode(&answer, call.what).map(Some)
    }

    /// Orders a server (`POST projects/{id}/servers`, 201 with the server). Sent once: on
    /// [`CherryError::Unavailable`] the server may nevertheless exist.
    ///
    /// The API reference documents no error of its own for an order the stock cannot fill
    /// (https://api.cherryservers.com/doc/, "Response codes": `400 Bad parameters or
    /// request can't be made.`, `404 Resource doesn't exist.`), so a refusal (400 to 499
    /// but 401, 403 and 429) is [`CherryError::OutOfStock`] when the plan's documented stock
    /// for the order (`available_regions[].stock_qty`, or `spot_qty` for a spot order) is
    /// exhausted or the region is not among its `available_regions`, whatever the message
    /// says; otherwise, or when the plans cannot be read, it stays what it was.
    pub async fn create_server(
        &self,
        project_id: i64,
        request: &CreateServer,
    ) -> Result<Server, CherryError> {
        let body = serde_json::to_vec(&CreateBody::new(project_id, request))
            .map_err(|e| CherryError::InvalidConfig(format!("encoding the create request: {e}")))?;
        let call = Call {
            method: Method::POST,
            path: format!("projects/{project_id}/servers"),
            body: Some(body),
            repeat: Repeat::Never,
            what: "the created server",
        };
        let answer = self.send(&call).await?;
        match ensure_success(&call, &answer) {
            Ok(()) => decode(&answer, call.what),
            Err(error @ (CherryError::Rejected { .. } | CherryError::NotFound(_))) => {
                Err(self.out_of_stock_or(error, request).await)
            }
            Err(error) => Err(error),
        }
    }

    /// `refusal` of `request`, or [`CherryError::OutOfStock`] when the plan's stock for it
    /// is exhausted (see [`Self::create_server`]).
    async fn out_of_stock_or(&self, refusal: CherryError, request: &CreateServer) -> CherryError {
        let plans = match self.list_plans().await {
            Ok(plans) => plans,
            Err(e) => {
                tracing::debug!(error = %e, "reading plans to explain a refused order");
                return refusal;
            }
        };
        let Some(plan) = plans.iter().find(|p| p.slug == request.plan) else {
            return refusal;
        };
        let field = if request.spot_market {
            "spot_qty"
        } else {
            "stock_qty"
        };
        let left = match plan.regions.iter().find(|r| r.is(&request.region)) {
            Some(region) => region.stock_for(request.spot_market),
            None if plan.regions.is_empty() => None,
            None => Some(0),
        };
        match left {
            Some(left) if left <= 0 => CherryError::OutOfStock(format!(
                "{refusal}; plan {} has {field} {left} in region {}",
                request.plan, request.region
            )),
            _ => refusal,
        }
    }

    /// Deletes a server (`DELETE servers/{id}`, 204). A server the API does not know (404) is
    /// already gone: `Ok`.
    pub async fn delete_server(&self, id: i64) -> Result<(), CherryError> {
        let call = Call {
            method: Method::DELETE,
            path: format!("servers/{id}"),
            body: None,
            repeat: Repeat::Safe,
            what: "the deletion",
        };
        let answer = self.send(&call).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        ensure_success(&call, &answer)
    }

    /// Every plan (`GET plans`, as cluster-autoscaler and cherrygo's `Plans.List` without a
    /// team). The API has no per-project plan list; a team's own prices are at
    /// `teams/{id}/plans`.
    pub async fn list_plans(&self) -> Result<Vec<Plan>, CherryError> {
        self.list_all("plans", "plans", |p: &Plan| p.slug.clone())
            .await
    }

    /// Follows `limit`/`offset` pages until `X-Total-Count` items were seen, or, without that
    /// header, until a short page. An answer longer than the page asked for means the API
    /// ignored `limit` and sent everything.
    async fn list_all<T: DeserializeOwned>(
        &self,
        path: &str,
        what: &str,
        key: impl Fn(&T) -> String,
    ) -> Result<Vec<T>, CherryError> {
        let mut items = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut offset = 0usize;
        for _ in 0..MAX_PAGES {
            let call = Call {
                method: Method::GET,
                path: format!("{path}?limit={PAGE_SIZE}&offset={offset}"),
                body: None,
                repeat: Repeat::Safe,
                what,
            };
            let answer = self.send(&call).await?;
            ensure_success(&call, &answer)?;
            let total = answer
                .headers
                .get("x-total-count")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<usize>().ok());
            let page: Vec<T> = decode(&answer, &format!("a list of {what}"))?;
            let count = page.len();
            offset += count;
            for item in page {
                if seen.insert(key(&item)) {
                    items.push(item);
                }
            }
            if last_page(count, offset, total) {
                return Ok(items);
            }
        }
        Err(CherryError::Decode(format!(
            "GET {}: more than {MAX_PAGES} pages of {PAGE_SIZE} {what}",
            self.path_of(path)
        )))
    }

    /// Sends `call`, pacing and retrying as the module documents. Returns the last answer
    /// (any status but a 429 that may still be waited out) or the transport failure.
    async fn send(&self, call: &Call<'_>) -> Result<Answer, CherryError> {
        let uri: Uri = format!("{}{}", self.base, call.path)
            .parse()
            .map_err(|e| CherryError::InvalidConfig(format!("path {}: {e}", call.path)))?;
        let request = format!("{} {}", call.method, self.path_of(&call.path));
        let mut attempt = 1;
        loop {
            self.pacer.acquire().await;
            let started = tokio::time::Instant::now();
            let outcome = self.exchange(call, uri.clone()).await;
            let last = attempt >= MAX_ATTEMPTS;
            match outcome {
                Err(failure) => {
                    let message = self.failure_message(&request, call, &failure);
                    if call.repeat == Repeat::Safe && !last {
                        tracing::warn!(request, attempt, error = %message, "retrying cherry request");
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                    tracing::debug!(request, attempt, error = %message, "cherry request failed");
                    return Err(CherryError::Unavailable(message));
                }
                Ok(ngo_cloud_http::Answer {
                    status,
                    headers,
                    body,
                }) => {
                    tracing::debug!(
                        request,
                        attempt,
                        status = status.as_u16(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "cherry request"
                    );
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        let retry_after = retry_after(&headers);
                        let wait = retry_after.unwrap_or_else(|| backoff(attempt));
                        if wait <= MAX_RETRY_AFTER {
                            self.pacer.hold_off(wait);
                        }
                        if call.repeat == Repeat::Never || last || wait > MAX_RETRY_AFTER {
                            tracing::warn!(request, attempt, ?retry_after, "cherry API rate limit");
                            return Err(CherryError::RateLimited { retry_after });
                        }
                        tracing::info!(request, attempt, ?wait, "cherry API rate limit; waiting");
                        attempt += 1;
                        continue;
                    }
                    let transient =
                        status.is_server_error() || status == StatusCode::REQUEST_TIMEOUT;
                    if transient && call.repeat == Repeat::Safe && !last {
                        tracing::warn!(
                            request,
                            attempt,
                            status = status.as_u16(),
                            "retrying cherry request"
                        );
                        tokio::time::sleep(backoff(attempt)).await;
                        attempt += 1;
                        continue;
                    }
                    return Ok(Answer {
                        status,
                        headers,
                        body,
                        request,
                    });
                }
            }
        }
    }

    /// One request and its whole answer, within the timeout.
    async fn exchange(
        &self,
        call: &Call<'_>,
        uri: Uri,
    ) -> Result<ngo_cloud_http::Answer, SendError> {
        let body = call.body.clone().map(Bytes::from).unwrap_or_default();
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = call.method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = (*self.headers).clone();
        self.http.send(request).await
    }

    fn path_of(&self, relative: &str) -> String {
        format!("{}{relative}", self.base_path)
    }

    fn failure_message(&self, request: &str, call: &Call<'_>, failure: &SendError) -> String {
        match call.repeat {
            Repeat::Safe => format!("{request}: {failure}"),
            Repeat::Never => format!(
                "{request}: {failure}; the request may have been carried out (list to find out)"
            ),
        }
    }
}

/// Whether a list is complete after a page of `count` items that brought the items seen to
/// `seen`, given the answer's `X-Total-Count`. An empty page ends it (the list shrank
/// meanwhile); a page longer than asked for means the API ignored `limit` and sent
/// everything; without a total, a short page is the last.
fn last_page(count: usize, seen: usize, total: Option<usize>) -> bool {
    match total {
        _ if count == 0 || count > PAGE_SIZE => true,
        Some(total) => seen >= total,
        None => count < PAGE_SIZE,
    }
}

/// 1 s, 2 s, 4 s ... after the first, second, third attempt.
fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1 << (attempt.saturating_sub(1)).min(5))
}

/// `Retry-After` as seconds or an HTTP date (RFC 9110 section 10.2.3).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.duration_since(jiff::Timestamp::now());
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// Turns a non-2xx answer into the error it stands for.
fn ensure_success(call: &Call<'_>, answer: &Answer) -> Result<(), CherryError> {
    let status = answer.status;
    if status.is_success() {
        return Ok(());
    }
    let message = format!(
        "{}: {}: {}",
        answer.request,
        status,
        api_message(&answer.headers, &answer.body)
    );
    Err(match status.as_u16() {
        401 | 403 => CherryError::Unauthorized(message),
        404 => CherryError::NotFound(message),
        429 => CherryError::RateLimited {
            retry_after: retry_after(&answer.headers),
        },
        400..=499 => CherryError::Rejected {
            status: status.as_u16(),
            message,
        },
        500..=599 if call.repeat == Repeat::Never => CherryError::Unavailable(format!(
            "{message}; the request may have been carried out (list to find out)"
        )),
        _ => CherryError::Unavailable(message),
    })
}

/// The API's error text: `message` of `{"code":..,"message":..}` (cherrygo `cherrygo.go`
/// `Do`), else `error`/`errors` (cluster-autoscaler's `ErrorResponse`), each as an
/// [`excerpt`]; a body that is not JSON is named by type and size only.
fn api_message(headers: &HeaderMap, body: &[u8]) -> String {
    if body.is_empty() {
        return "(empty body)".into();
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = value.get("message").and_then(|m| m.as_str()) {
            return excerpt(m);
        }
        if let Some(m) = value.get("error").and_then(|m| m.as_str()) {
            return excerpt(m);
        }
        if let Some(list) = value.get("errors").and_then(|m| m.as_array()) {
            let texts: Vec<String> = list
                .iter()
                .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_string))
                .collect();
            return excerpt(&texts.join("; "));
        }
        return excerpt(&value.to_string());
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    opaque_body(content_type, body)
}

/// Decodes a 2xx answer, which must be JSON (as cluster-autoscaler's `request` insists).
fn decode<T: DeserializeOwned>(answer: &Answer, what: &str) -> Result<T, CherryError> {
    let content_type = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !is_json(content_type) {
        return Err(CherryError::Decode(format!(
            "{}: {} with Content-Type {:?}, expected application/json",
            answer.request, answer.status, content_type
        )));
    }
    serde_json::from_slice(&answer.body).map_err(|e| {
        CherryError::Decode(format!(
            "{}: {}: body is not {what}: {e}",
            answer.request, answer.status
        ))
    })
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

#[cfg(test)]
mod tests;
