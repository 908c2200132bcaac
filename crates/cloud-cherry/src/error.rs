//! What a call to the Cherry Servers API can fail with.

use std::time::Duration;

use thiserror::Error;

/// A failed call. Every message names the method, the path, the HTTP status (when there was
/// an answer) and the API's own `message`; none contains the token or the user data.
#[derive(Debug, Error)]
pub enum CherryError {
    /// 401 or 403: the token is wrong, revoked, or lacks access to the project.
    #[error("not authorized by the Cherry Servers API: {0}")]
    Unauthorized(String),
    /// 404 where the method does not treat it as an answer (a missing project, say).
    #[error("not found: {0}")]
    NotFound(String),
    /// 429 on every attempt (or a `Retry-After` too long to wait for inside one call).
    #[error("rate limited by the Cherry Servers API{}", retry_hint(.retry_after))]
    RateLimited {
        /// What the last 429 asked for, when it said.
        retry_after: Option<Duration>,
    },
    /// A create refused (400 to 499 but 401, 403 and 429) while the plan's stock for the
    /// order (`stock_qty`, or `spot_qty` for spot) in the region is exhausted, as the plan
    /// list read after the refusal says; the message is the refusal's and the stock read.
    /// Waiting for stock or another plan or region helps; repeating does not.
    #[error("out of stock: {0}")]
    OutOfStock(String),
    /// Any other 4xx: unknown plan, image, region or SSH key, a malformed request.
    #[error("rejected by the Cherry Servers API: {message}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// Method, path, status and the API's message.
        message: String,
    },
    /// 5xx, a timeout or a connection failure (after the retries idempotent calls get). For a
    /// create the outcome is unknown: the server may exist.
    #[error("Cherry Servers API unavailable: {0}")]
    Unavailable(String),
    /// A 2xx answer that is not JSON (`Content-Type` not `application/json`) or does not have
    /// the expected shape.
    #[error("unexpected answer from the Cherry Servers API: {0}")]
    Decode(String),
    /// [`super::ClientConfig`] cannot make a client (base URL, rate, timeout, token).
    #[error("invalid Cherry Servers client configuration: {0}")]
    InvalidConfig(String),
}

impl CherryError {
    /// Whether the same call may succeed if made again later: rate limits and outages. A
    /// create that failed this way may nevertheless have created its server.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::RateLimited { .. } | Self::Unavailable(_))
    }
}

fn retry_hint(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (retry after {:.1}s)", d.as_secs_f64()),
        None => String::new(),
    }
}
