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
    use std::future::Future;
    use std::pin::{Pin, pin};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    use super::*;

    /// A waker that counts its wake-ups, one per waiter.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// Polls `future` once, as the task that `wakes` stands for.
    fn poll_as<F: Future>(future: Pin<&mut F>, wakes: &Arc<Wakes>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(&Waker::from(Arc::clone(wakes))))
    }

    fn complete_first_list(writer: &mut reflector::store::Writer<ConfigMap>) {
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitDone);
    }

    /// The reason for `until_ready`: two waiters on one store, and the completed list wakes only
    /// the one polled last. If kube fixes this (both woken), the workaround can go.
    #[test]
    fn kubes_wait_until_ready_wakes_only_the_last_polled_waiter() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (first_store, second_store) = (store.clone(), store.clone());
        let mut first = pin!(first_store.wait_until_ready());
        let mut second = pin!(second_store.wait_until_ready());
        let (first_wakes, second_wakes) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        assert!(poll_as(first.as_mut(), &first_wakes).is_pending());
        assert!(poll_as(second.as_mut(), &second_wakes).is_pending());

        complete_first_list(&mut writer);

        assert_eq!(second_wakes.count(), 1, "the last polled waiter is woken");
        assert_eq!(
            first_wakes.count(),
            0,
            "kube now wakes every waiter: `until_ready` can go"
        );
        // The readiness itself is not lost: polled again for another reason, both are ready.
        assert!(matches!(poll_as(first, &first_wakes), Poll::Ready(Ok(()))));
        assert!(matches!(
            poll_as(second, &second_wakes),
            Poll::Ready(Ok(()))
        ));
    }

    /// With `until_ready`, every waiter is woken, and then ready, although kube wakes only the
    /// last polled one: the others are woken by their next look at the store.
    #[tokio::test]
    async fn until_ready_wakes_every_waiter() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let (first_store, second_store) = (store.clone(), store.clone());
        let mut first = pin!(until_ready(&first_store));
        let mut second = pin!(until_ready(&second_store));
        let (first_wakes, second_wakes) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        assert!(poll_as(first.as_mut(), &first_wakes).is_pending());
        assert!(poll_as(second.as_mut(), &second_wakes).is_pending());

        complete_first_list(&mut writer);
        // Real time, so wait generously: a loaded machine only makes this slower.
        let both_woken = async {
            while first_wakes.count() == 0 || second_wakes.count() == 0 {
                tokio::time::sleep(READY_POLL / 10).await;
            }
        };
        let waited = tokio::time::timeout(Duration::from_secs(30), both_woken).await;
        assert!(waited.is_ok(), "a waiter was never woken");

        assert!(matches!(poll_as(first, &first_wakes), Poll::Ready(Ok(()))));
        assert!(matches!(
            poll_as(second, &second_wakes),
            Poll::Ready(Ok(()))
        ));
    }

    #[tokio::test]
    async fn a_dropped_writer_ends_the_wait() {
        let (store, writer) = reflector::store::<ConfigMap>();
        drop(writer);
        let waited = tokio::time::timeout(Duration::from_secs(2), until_ready(&store)).await;
        assert!(matches!(waited, Ok(Err(_))), "{waited:?}");
    }
}
