//! Client-side pacing shared by every clone of a client.
//!
//! The API rate-limits by source address ("more than 4 requests per second ... may return
//! HTTP status code 429", api.cherryservers.com/doc). A token bucket of one token spaces
//! requests at least `1/rate` apart, so no one-second window holds more than `rate + 1`
//! requests: 4 at the default 3 per second. A larger bucket would let a burst after an idle
//! spell exceed the API's limit.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Hands out send times `1/rate` apart; a 429's `Retry-After` pushes them all back.
#[derive(Debug)]
pub(super) struct Pacer {
    interval: Duration,
    next: Mutex<Instant>,
}

impl Pacer {
    /// `rate` must be positive and finite (checked by the client).
    pub(super) fn new(rate: f64) -> Self {
        Self {
            interval: Duration::from_secs_f64(1.0 / rate),
            next: Mutex::new(Instant::now()),
        }
    }

    /// Waits for this request's turn. A dropped wait still uses its slot, which only makes
    /// later requests more conservative.
    pub(super) async fn acquire(&self) {
        let slot = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let slot = (*next).max(Instant::now());
            *next = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot).await;
    }

    /// No request leaves before `wait` from now (the API said so with `Retry-After`).
    pub(super) fn hold_off(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if *next < until {
            *next = until;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn requests_are_spaced_by_the_rate() {
        let pacer = Pacer::new(20.0);
        let start = Instant::now();
        for _ in 0..5 {
            pacer.acquire().await;
        }
        // The first goes at once, the other four 50 ms apart.
        let elapsed = start.elapsed();
        assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(600), "{elapsed:?}");
    }

    #[tokio::test]
    async fn hold_off_delays_the_next_request() {
        let pacer = Pacer::new(100.0);
        pacer.acquire().await;
        pacer.hold_off(Duration::from_millis(300));
        let start = Instant::now();
        pacer.acquire().await;
        assert!(start.elapsed() >= Duration::from_millis(290));
    }
}
