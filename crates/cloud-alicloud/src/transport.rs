//! The HTTP layer every Alibaba Cloud call goes through, the API client's and the credential
//! providers': the pooled client over plain TCP or rustls, the `User-Agent`, and the retry
//! loop (HTTP 5xx and timeouts with an exponential wait from 200 ms, throttling answers with
//! one from 1 s; the SDK retries 5xx and timeouts at once and never throttling). What a
//! request carries and how it is signed is the caller's: the loop asks for a new request on
//! every attempt.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::Full;
use ngo_cloud_http::{CertificateDer, HttpClient, HttpOptions, SendError};

use super::error::{ApiError, ApiErrorKind, Error};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
