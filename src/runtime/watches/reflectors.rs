//! Reflectors as the runtime runs them: a watch that retries with [`WatchBackoff`], feeds a
//! store and records for the index only the events that may change it ([`relevant`]); and a
//! kind's stores, one per watched scope.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::core::DynamicResourceScope;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::runtime::changes::{Changes, Track};
use crate::runtime::ready::until_ready;

/// First delay before a failed watch is retried (client-go's reflector starts at 800 ms too).
const WATCH_RETRY_MIN: Duration = Duration::from_millis(800);
/// Longest delay between retries of a failed watch. client-go's reflector (and kube's
/// `DefaultBackoff`) go up to 30 s; then a view served to cluster-autoscaler stays stale for up
/// to 30 s after the API server returns. A retry is one request per watched kind (a watch from
/// the last resourceVersion, or a LIST), so retrying every few seconds costs a recovering API
/// server little.
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// One kind's reflector stores: one per watched namespace, or one for all namespaces.
pub(super) struct Stores<K>(pub(super) Vec<Store<K>>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone;

impl<K> Stores<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    pub(super) fn state(&self) -> Vec<Arc<K>> {
        self.0.iter().flat_map(Store::state).collect()
    }

    /// The cached object `key` refers to, from whichever namespace's store holds it.
    pub(super) fn get(&self, key: &reflector::ObjectRef<K>) -> Option<Arc<K>> {
        self.0.iter().find_map(|store| store.get(key))
    }

    /// Waits until every namespace's store holds its first complete list.
    pub(super) async fn until_ready(&self) -> Result<(), reflector::store::WriterDropped> {
        for store in &self.0 {
            until_ready(store).await?;
        }
        Ok(())
    }
}

/// Reflectors for a kind described by `dyntype`, one per scope (a namespace, or `None` for
/// all), each listing and watching only objects that match `labels` (a label selector) when
/// one is given.
pub(super) fn scoped_stores<K>(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    (client, scopes, labels, dyntype): (&Client, &[Option<String>], Option<&str>, K::DynamicType),
    recording: (Arc<Changes>, Track),
    shutdown: CancellationToken,
    trim: fn(&mut K),
) -> Stores<K>
where
    K: Resource<Scope = DynamicResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    Stores(
        scopes
            .iter()
            .map(|scope| {
                let api = match scope {
                    Some(ns) => Api::<K>::namespaced_with(client.clone(), ns, &dyntype),
                    None => Api::<K>::all_with(client.clone(), &dyntype),
                };
                let config = watcher::Config::default().any_semantic();
                let config = match labels {
                    Some(selector) => config.labels(selector),
                    None => config,
                };
                spawn_reflector_with(
                    tasks,
                    (api, config),
                    dyntype.clone(),
                    recording.clone(),
                    shutdown.clone(),
                    trim,
                    None,
                )
            })
            .collect(),
    )
}

/// Runs a reflector for `api` in `tasks`, recording every event in `changes` as `track`, or,
/// with a `fingerprint`, only changes of an object's fingerprint (Node heartbeats and other
/// status churn the index does not read then cost no update).
pub(super) fn spawn_reflector<K>(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    api: Api<K>,
    dyntype: K::DynamicType,
    recording: (Arc<Changes>, Track),
    shutdown: CancellationToken,
    trim: impl FnMut(&mut K) + Send + 'static,
    fingerprint: Option<fn(&K) -> u64>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let config = watcher::Config::default().any_semantic();
    spawn_reflector_with(
        tasks,
        (api, config),
        dyntype,
        recording,
        shutdown,
        trim,
        fingerprint,
    )
}

/// As [`spawn_reflector`], watching with `config` (a label or field selector).
pub(super) fn spawn_reflector_with<K>(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    (api, config): (Api<K>, watcher::Config),
    dyntype: K::DynamicType,
    (changes, track): (Arc<Changes>, Track),
    shutdown: CancellationToken,
    trim: impl FnMut(&mut K) + Send + 'static,
    fingerprint: Option<fn(&K) -> u64>,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    let kind = K::kind(&dyntype).to_string();
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let stream = watcher(api, config)
        .modify(trim)
        .backoff(WatchBackoff::default())
        .reflect(writer);
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut seen: HashMap<String, u64> = HashMap::new();
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                event = stream.next() => event,
            };
            match event {
                Some(Ok(event)) => {
                    if relevant(&event, fingerprint, &mut seen) {
                        changes.record(&track, &event);
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%kind, %error, "watch error; retrying with backoff")
                }
                None => return Ok(()),
            }
        }
    });
    store
}

/// Retry delays of a failed watch: [`WATCH_RETRY_MIN`] doubling up to [`WATCH_RETRY_MAX`],
/// each stretched by up to a quarter so that reflectors (and replicas) do not retry in
/// lockstep; reset by the first event after a failure.
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self {
            next: WATCH_RETRY_MIN,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(WATCH_RETRY_MAX);
        let spread = u64::from(jiff::Timestamp::now().subsec_nanosecond().unsigned_abs()) % 1000;
        Some(delay + delay.mul_f64(spread as f64 / 4000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = WATCH_RETRY_MIN;
    }
}

/// True when `event` may change the index: with a `fingerprint`, only changes of what the
/// index reads count.
pub(crate) fn relevant<K: Resource>(
    event: &watcher::Event<K>,
    fingerprint: Option<fn(&K) -> u64>,
    seen: &mut HashMap<String, u64>,
) -> bool {
    let Some(fingerprint) = fingerprint else {
        return true;
    };
    let key = |obj: &K| {
        format!(
            "{}/{}",
            obj.meta().namespace.as_deref().unwrap_or_default(),
            obj.meta().name.as_deref().unwrap_or_default()
        )
    };
    match event {
        watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
            let print = fingerprint(obj);
            seen.insert(key(obj), print) != Some(print)
        }
        watcher::Event::Delete(obj) => {
            seen.remove(&key(obj));
            true
        }
        watcher::Event::Init | watcher::Event::InitDone => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff as _;

    #[test]
    fn watch_retries_back_off_to_a_few_seconds_and_reset() {
        let mut backoff = WatchBackoff::default();
        let delays: Vec<Duration> = backoff.by_ref().take(8).collect();
        let bases = [0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0, 5.0];
        for (delay, base) in delays.iter().zip(bases) {
            let base = Duration::from_secs_f64(base);
            assert!(
                *delay >= base && *delay <= base.mul_f64(1.25),
                "{delay:?} for {base:?}"
            );
        }
        backoff.reset();
        assert!(backoff.next().is_some_and(|d| d < Duration::from_secs(1)));
    }
}
