//! A shared, swappable handle on the current snapshot.

use std::sync::Arc;

use tokio::sync::watch;

use super::Snapshot;

/// Readers get the current snapshot (cheap `Arc` clone); the builder publishes new ones.
/// `None` until every cache has synced once.
#[derive(Clone, Debug)]
pub struct SnapshotHandle {
    rx: watch::Receiver<Option<Arc<Snapshot>>>,
}

/// The write side of a [`SnapshotHandle`].
#[derive(Debug)]
pub struct SnapshotPublisher {
    tx: watch::Sender<Option<Arc<Snapshot>>>,
}

/// A new handle with no snapshot yet.
pub fn channel() -> (SnapshotPublisher, SnapshotHandle) {
    let (tx, rx) = watch::channel(None);
    (SnapshotPublisher { tx }, SnapshotHandle { rx })
}

impl SnapshotHandle {
    /// The current snapshot, or `None` before caches are synced.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.rx.borrow().clone()
    }

    /// Waits for the next published snapshot; `false` once the publisher is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// A handle over a fixed snapshot (tests, benchmarks).
    pub fn fixed(snapshot: Snapshot) -> Self {
        let (_tx, rx) = watch::channel(Some(Arc::new(snapshot)));
        Self { rx }
    }
}

impl SnapshotPublisher {
    /// Publishes a new snapshot to every handle; returns it, shared with the readers.
    pub fn publish(&self, snapshot: Snapshot) -> Arc<Snapshot> {
        let snapshot = Arc::new(snapshot);
        self.tx.send_replace(Some(snapshot.clone()));
        snapshot
    }
}
