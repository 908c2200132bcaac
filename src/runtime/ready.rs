//! Waiting for a reflector store's first complete list, from any number of tasks at once.
//!
//! kube's `Store::wait_until_ready` keeps the readiness in a one-shot channel, whose receiver
//! remembers one waker: when several tasks wait on the same store at once, only the one that
//! polled last is woken, and the others wait until something else polls them. Here two tasks
//! wait on the Cluster stores (the index and the workload cluster connections), so each wait
//! polls the store again every [`READY_POLL`]: a lost wake-up costs at most that long.

use std::hash::Hash;
use std::time::Duration;

use kube::Resource;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::WriterDropped;

/// How often a wait looks at the store again, in case its wake-up went to another task.
pub const READY_POLL: Duration = Duration::from_millis(100);

/// Waits until `store` holds its first complete list; fails when its writer is gone first.
pub async fn until_ready<K>(store: &Store<K>) -> Result<(), WriterDropped>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    loop {
        if let Ok(ready) = tokio::time::timeout(READY_POLL, store.wait_until_ready()).await {
            return ready;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;

    /// Two tasks wait on one store; the list completes; both must see it.
    async fn two_waiters_see_the_first_list<F, Fut>(wait: F) -> bool
    where
        F: Fn(Store<ConfigMap>) -> Fut,
        Fut: std::future::Future<Output = Result<(), WriterDropped>> + Send + 'static,
    {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let first = tokio::spawn(wait(store.clone()));
        let second = tokio::spawn(wait(store.clone()));
        // Both are waiting before the list completes.
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
        let both = async { (first.await, second.await) };
        matches!(
            tokio::time::timeout(Duration::from_secs(2), both).await,
            Ok((Ok(Ok(())), Ok(Ok(()))))
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_waiter_sees_the_store_ready() {
        assert!(two_waiters_see_the_first_list(|s| async move { until_ready(&s).await }).await);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kubes_own_wait_wakes_only_one_of_two_waiters() {
        // The reason for `until_ready`: if kube fixes this, the workaround can go.
        assert!(
            !two_waiters_see_the_first_list(|s| async move { s.wait_until_ready().await }).await
        );
    }

    #[tokio::test]
    async fn a_dropped_writer_ends_the_wait() {
        let (store, writer) = reflector::store::<ConfigMap>();
        drop(writer);
        let waited = tokio::time::timeout(Duration::from_secs(2), until_ready(&store)).await;
        assert!(matches!(waited, Ok(Err(_))), "{waited:?}");
    }
}
