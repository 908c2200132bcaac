//! Paces the requests of a client to a tenant's API server: a token bucket of requests, each
//! request sent only once a token is free. An honest workload cluster never waits (a watch
//! every few minutes, a probe every few seconds); a server that ends every watch at once, or
//! answers 410 to every watch so that each is followed by a LIST, makes the client wait instead
//! of spinning, so one tenant's server cannot make the operator spend a core reconnecting.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// Requests a client may send at once after a quiet period.
pub const BURST: u32 = 50;
/// Requests per second a client may send after its burst.
pub const PER_SECOND: u32 = 10;

/// When each next request may go.
#[derive(Debug)]
struct Schedule {
    /// The earliest time the bucket is full again: requests reserve slots before it.
    full_at: Instant,
}

/// A tower layer pacing every request of the service it wraps ([`Paced`]).
#[derive(Clone, Debug)]
pub struct PaceLayer {
    interval: Duration,
    burst: Duration,
}

impl PaceLayer {
    /// At most `burst` requests at once, then `per_second`.
    pub fn new(burst: u32, per_second: u32) -> Self {
        let interval = Duration::from_secs(1) / per_second.max(1);
        Self {
            interval,
            burst: interval * burst.max(1),
        }
    }
}

impl<S> tower::Layer<S> for PaceLayer {
    type Service = Paced<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Paced {
            inner,
            interval: self.interval,
            burst: self.burst,
            schedule: Arc::new(Mutex::new(Schedule {
                full_at: Instant::now(),
            })),
        }
    }
}

/// A service whose requests go out no faster than its [`PaceLayer`] allows.
#[derive(Clone, Debug)]
pub struct Paced<S> {
    inner: S,
    interval: Duration,
    burst: Duration,
    schedule: Arc<Mutex<Schedule>>,
}

impl<S> Paced<S> {
    /// Reserves the next slot: how long this request waits.
    fn reserve(&self, now: Instant) -> Duration {
        let mut schedule = self
            .schedule
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The bucket holds `burst` worth of slots: a request is free while the bucket's
        // refill time lies less than `burst` ahead.
        let full_at = schedule.full_at.max(now) + self.interval;
        schedule.full_at = full_at;
        full_at.saturating_duration_since(now + self.burst)
    }
}

impl<S, R> tower::Service<R> for Paced<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let wait = self.reserve(Instant::now());
        // The request goes out when its future is first polled, after the wait.
        let response = self.inner.call(request);
        Box::pin(async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            response.await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Layer;

    #[test]
    fn a_burst_goes_at_once_the_rest_at_the_rate_and_quiet_refills() {
        let paced = PaceLayer::new(5, 10).layer(());
        let start = Instant::now();
        let waits: Vec<Duration> = (0..15).map(|_| paced.reserve(start)).collect();
        assert!(waits[..5].iter().all(Duration::is_zero), "{waits:?}");
        assert_eq!(waits[5], Duration::from_millis(100));
        assert_eq!(
            waits[14],
            Duration::from_secs(1),
            "ten more at 10 per second"
        );
        let later = start + Duration::from_millis(500);
        assert_eq!(
            paced.reserve(later),
            Duration::from_millis(600),
            "the slots already promised come first"
        );
        let quiet = start + Duration::from_secs(60);
        let refilled: Vec<Duration> = (0..5).map(|_| paced.reserve(quiet)).collect();
        assert!(refilled.iter().all(Duration::is_zero), "{refilled:?}");
        assert!(!paced.reserve(quiet).is_zero(), "never more than the burst");
    }
}
