//! The gateway's flow control: `Throttling.User` past a number of requests per second per
//! AccessKey.

use std::collections::HashMap;
use std::time::Instant;

use crate::emulator::RateWindow;

/// Requests per AccessKey beyond which a one-second window answers `Throttling.User`.
#[derive(Debug, Default)]
pub(super) struct Throttle {
    /// The limit; `None`: none.
    pub(super) limit: Option<u32>,
    windows: HashMap<String, RateWindow>,
}

impl Throttle {
    /// A throttle admitting `limit` requests per second per AccessKey.
    pub(super) fn new(limit: Option<u32>) -> Self {
        Self {
            limit,
            windows: HashMap::new(),
        }
    }

    /// Whether a request of `key` may pass now (and then it counts).
    pub(super) fn admit(&mut self, key: &str, now: Instant) -> bool {
        let window = self.windows.entry(key.to_string()).or_default();
        window.limit = self.limit;
        window.admit(now).is_none()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn throttling_is_per_access_key() {
        let mut t = Throttle::new(Some(2));
        let now = Instant::now();
        assert!(t.admit("a", now) && t.admit("a", now));
        assert!(!t.admit("a", now));
        assert!(t.admit("b", now));
        assert!(t.admit("a", now + Duration::from_secs(1)));
    }
}
