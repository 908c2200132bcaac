//! The single-flight cache of temporary credentials both fetching providers keep, and when
//! it fetches again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::provider::Credentials;
use crate::error::CredentialsError;

/// When cached temporary credentials are fetched again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RefreshPolicy {
    /// Refresh once less than this is left (capped at a fifth of the lifetime).
    pub margin: Duration,
    /// After a failed refresh with still-valid credentials, wait this long before the next.
    pub retry_after: Duration,
}

impl Default for RefreshPolicy {
    fn default() -> Self {
        Self {
            margin: Duration::from_secs(300),
            retry_after: Duration::from_secs(5),
        }
    }
}

impl RefreshPolicy {
    /// When credentials fetched at `now` and expiring at `expiration` should be replaced.
    pub fn refresh_at(&self, now: jiff::Timestamp, expiration: jiff::Timestamp) -> jiff::Timestamp {
        let lifetime = expiration.duration_since(now);
        let margin = jiff::SignedDuration::try_from(self.margin)
            .unwrap_or(jiff::SignedDuration::MAX)
            .min(lifetime / 5)
            .max(jiff::SignedDuration::ZERO);
        expiration.checked_sub(margin).unwrap_or(now)
    }
}

struct Cached {
    credentials: Credentials,
    refresh_at: jiff::Timestamp,
}

/// Single-flight cache of temporary credentials.
pub(super) struct Cache {
    slot: tokio::sync::Mutex<Option<Cached>>,
    stale: AtomicBool,
    policy: RefreshPolicy,
}

impl Cache {
    pub(super) fn new(policy: RefreshPolicy) -> Self {
        Self {
            slot: tokio::sync::Mutex::new(None),
            stale: AtomicBool::new(false),
            policy,
        }
    }

    pub(super) async fn get<F, Fut>(
        &self,
        what: &str,
        fetch: F,
    ) -> Result<Credentials, CredentialsError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Credentials, CredentialsError>>,
    {
        let mut slot = self.slot.lock().await;
        let now = jiff::Timestamp::now();
        let stale = self.stale.swap(false, Ordering::AcqRel);
        if let Some(cached) = slot.as_ref()
            && !stale
            && now < cached.refresh_at
            && cached.credentials.expiration.is_none_or(|exp| now < exp)
        {
            return Ok(cached.credentials.clone());
        }
        match fetch().await {
            Ok(credentials) => {
                let refresh_at = match credentials.expiration {
                    Some(exp) => self.policy.refresh_at(now, exp),
                    None => now + jiff::SignedDuration::from_hours(1),
                };
                tracing::debug!(what, access_key_id = %credentials.access_key_id, expiration = ?credentials.expiration, %refresh_at, "temporary credentials fetched");
                *slot = Some(Cached {
                    credentials: credentials.clone(),
                    refresh_at,
                });
                Ok(credentials)
            }
            Err(error) => match slot.as_mut() {
                Some(cached)
                    if !stale && cached.credentials.expiration.is_some_and(|exp| now < exp) =>
                {
                    tracing::warn!(what, %error, "refreshing credentials failed; the cached ones are still valid");
                    let retry = jiff::SignedDuration::try_from(self.policy.retry_after)
                        .unwrap_or(jiff::SignedDuration::from_secs(5));
                    cached.refresh_at = now + retry;
                    Ok(cached.credentials.clone())
                }
                _ => Err(error),
            },
        }
    }

    pub(super) fn invalidate(&self) {
        self.stale.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn long_lived_credentials_refresh_five_minutes_early() {
        let p = RefreshPolicy::default();
        let now = ts("2024-01-01T00:00:00Z");
        assert_eq!(
            p.refresh_at(now, ts("2024-01-01T01:00:00Z")),
            ts("2024-01-01T00:55:00Z")
        );
    }

    #[test]
    fn short_lived_credentials_refresh_at_four_fifths() {
        let p = RefreshPolicy::default();
        let now = ts("2024-01-01T00:00:00Z");
        assert_eq!(
            p.refresh_at(now, ts("2024-01-01T00:00:10Z")),
            ts("2024-01-01T00:00:08Z")
        );
        // Already expired: refresh now.
        assert!(p.refresh_at(now, ts("2023-12-31T23:59:00Z")) <= now);
    }

    #[tokio::test]
    async fn the_cache_fetches_once_until_refresh_and_after_invalidate() {
        let cache = Cache::new(RefreshPolicy::default());
        let fetches = std::sync::atomic::AtomicU32::new(0);
        let fetch = || async {
            fetches.fetch_add(1, Ordering::SeqCst);
            Ok(Credentials::new("id", "secret")
                .with_expiration(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1)))
        };
        cache.get("test", fetch).await.unwrap();
        cache.get("test", fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
        cache.invalidate();
        cache.get("test", fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_failed_refresh_keeps_valid_credentials_until_they_expire() {
        let cache = Cache::new(RefreshPolicy::default());
        let now = jiff::Timestamp::now();
        let valid = Credentials::new("id", "secret")
            .with_expiration(now + jiff::SignedDuration::from_secs(60));
        *cache.slot.lock().await = Some(Cached {
            credentials: valid.clone(),
            refresh_at: now - jiff::SignedDuration::from_secs(1),
        });
        let failing = || async { Err(CredentialsError::EmptyToken(PathBuf::from("/token"))) };
        assert_eq!(cache.get("test", failing).await.unwrap(), valid);
        // The next refresh waits `retry_after`; the valid credentials are served meanwhile.
        let retry_at = cache.slot.lock().await.as_ref().unwrap().refresh_at;
        assert!(
            retry_at > now + jiff::SignedDuration::from_secs(4),
            "{retry_at}"
        );

        let expired = Credentials::new("id", "secret")
            .with_expiration(now - jiff::SignedDuration::from_secs(1));
        *cache.slot.lock().await = Some(Cached {
            credentials: expired,
            refresh_at: now + jiff::SignedDuration::from_secs(60),
        });
        assert!(cache.get("test", failing).await.is_err());
    }
}
