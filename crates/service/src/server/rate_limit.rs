//! A request budget per tenant: a token bucket for each Cluster a client certificate names, so
//! one tenant's cluster-autoscaler (or anything holding its certificate) calling in a tight loop
//! gets `RESOURCE_EXHAUSTED` while every other tenant is served as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ngo_index::index::ClusterKey;

/// Buckets kept before the full ones (idle tenants, nothing to remember) are dropped: the
/// table stays bounded whatever identities certificates name.
const MAX_BUCKETS: usize = 4096;

/// Requests per second and burst for each Cluster identity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Sustained requests per second.
    pub per_second: f64,
    /// Requests that may come at once after a quiet period.
    pub burst: f64,
}

/// What a request's identity may do now.
#[derive(Debug, PartialEq)]
pub enum Admission {
    /// Within its budget.
    Admitted,
    /// Over its budget: try again after `retry_after`. `first` is true for the first refusal
    /// since the tenant was last admitted (log it once, not per request).
    Refused { retry_after: Duration, first: bool },
}

struct Bucket {
    tokens: f64,
    updated: Instant,
    refusing: bool,
}

/// The buckets of every Cluster identity seen.
pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<ClusterKey, Bucket>>,
}

impl RateLimiter {
    /// Buckets of `limit` for each identity.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: Mutex::default(),
        }
    }

    /// The limit each identity gets.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Spends one request of `cluster`'s budget at `now`, if it has one left.
    pub fn admit(&self, cluster: &ClusterKey, now: Instant) -> Admission {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !buckets.contains_key(cluster) && buckets.len() >= MAX_BUCKETS {
            let limit = self.limit;
            buckets.retain(|_, b| refilled(b, limit, now) < limit.burst);
            if buckets.len() >= MAX_BUCKETS {
                // More identities busy at once than the table holds: start over. A tenant then
                // gets a fresh burst, never less than its budget.
                buckets.clear();
            }
        }
        let bucket = buckets.entry(cluster.clone()).or_insert(Bucket {
            tokens: self.limit.burst,
            updated: now,
            refusing: false,
        });
        bucket.tokens = refilled(bucket, self.limit, now);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            bucket.refusing = false;
            return Admission::Admitted;
        }
        let first = !bucket.refusing;
        bucket.refusing = true;
        let missing = 1.0 - bucket.tokens;
        Admission::Refused {
            retry_after: Duration::from_secs_f64(missing / self.limit.per_second.max(f64::EPSILON)),
            first,
        }
    }
}

/// The tokens `bucket` holds at `now`.
fn refilled(bucket: &Bucket, limit: RateLimit, now: Instant) -> f64 {
    let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
    (bucket.tokens + elapsed * limit.per_second).min(limit.burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str) -> ClusterKey {
        ClusterKey {
            namespace: "tenants".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_tenant_spends_its_own_burst_and_refills_at_its_rate() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 10.0,
            burst: 3.0,
        });
        let start = Instant::now();
        let (a, b) = (cluster("a"), cluster("b"));
        for _ in 0..3 {
            assert_eq!(limiter.admit(&a, start), Admission::Admitted);
        }
        let Admission::Refused { retry_after, first } = limiter.admit(&a, start) else {
            panic!("the burst is spent");
        };
        assert!(first, "the first refusal is flagged");
        assert_eq!(retry_after, Duration::from_millis(100));
        assert!(matches!(
            limiter.admit(&a, start),
            Admission::Refused { first: false, .. }
        ));
        assert_eq!(
            limiter.admit(&b, start),
            Admission::Admitted,
            "another tenant's budget is its own"
        );
        let later = start + Duration::from_millis(100);
        assert_eq!(limiter.admit(&a, later), Admission::Admitted, "refilled");
        assert!(matches!(
            limiter.admit(&a, later),
            Admission::Refused { first: true, .. }
        ));
        let idle = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(limiter.admit(&a, idle), Admission::Admitted);
        }
        assert!(
            matches!(limiter.admit(&a, idle), Admission::Refused { .. }),
            "never more than the burst"
        );
    }

    #[test]
    fn the_table_of_buckets_stays_bounded() {
        let limiter = RateLimiter::new(RateLimit {
            per_second: 1.0,
            burst: 2.0,
        });
        let now = Instant::now();
        for i in 0..(MAX_BUCKETS * 2) {
            limiter.admit(&cluster(&format!("c{i}")), now);
        }
        let kept = limiter.buckets.lock().map(|b| b.len()).unwrap_or_default();
        assert!(kept <= MAX_BUCKETS + 1, "{kept} buckets kept");
    }
}
