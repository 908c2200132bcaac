//! A shared, swappable handle on the current snapshot.

use std::sync::Arc;

use tokio::sync::watch;

use super::model::Snapshot;

/// A published snapshot and its version: versions increase with every publication, so a
/// reader can tell whether it sees a given write yet.
#[derive(Clone, Debug)]
struct Published {
    version: u64,
    snapshot: Arc<Snapshot>,
}

/// Readers get the current snapshot (cheap `Arc` clone); the builder publishes new ones.
/// `None` until every cache has synced once.
#[derive(Clone, Debug)]
pub struct SnapshotHandle {
    rx: watch::Receiver<Option<Published>>,
}

/// The write side of a [`SnapshotHandle`].
#[derive(Debug)]
pub struct SnapshotPublisher {
    tx: watch::Sender<Option<Published>>,
}

/// A new handle with no snapshot yet.
pub fn channel() -> (SnapshotPublisher, SnapshotHandle) {
    let (tx, rx) = watch::channel(None);
    (SnapshotPublisher { tx }, SnapshotHandle { rx })
}

impl SnapshotHandle {
    /// The current snapshot, or `None` before caches are synced.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.rx.borrow().as_ref().map(|p| p.snapshot.clone())
    }

    /// The current snapshot with its version, or `None` before caches are synced.
    pub fn current_versioned(&self) -> Option<(u64, Arc<Snapshot>)> {
        self.rx
            .borrow()
            .as_ref()
            .map(|p| (p.version, p.snapshot.clone()))
    }

    /// The current snapshot's version (0 before the first).
    pub fn version(&self) -> u64 {
        self.rx.borrow().as_ref().map_or(0, |p| p.version)
    }

    /// Waits for the next published snapshot; `false` once the publisher is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// A handle over a fixed snapshot (tests, benchmarks).
    pub fn fixed(snapshot: Snapshot) -> Self {
        let (_tx, rx) = watch::channel(Some(Published {
            version: 1,
            snapshot: Arc::new(snapshot),
        }));
        Self { rx }
    }
}

impl SnapshotPublisher {
    /// Publishes a new snapshot to every handle, one version past the current; returns it,
    /// shared with the readers.
    pub fn publish(&self, snapshot: Snapshot) -> Arc<Snapshot> {
        let version = self.tx.borrow().as_ref().map_or(0, |p| p.version) + 1;
        self.publish_at(version, snapshot)
    }

    /// Publishes `snapshot` as `version` (a copy of another process's snapshot keeps its
    /// version).
    pub fn publish_at(&self, version: u64, snapshot: Snapshot) -> Arc<Snapshot> {
        let snapshot = Arc::new(snapshot);
        self.tx.send_replace(Some(Published {
            version,
            snapshot: snapshot.clone(),
        }));
        snapshot
    }

    /// Withdraws the snapshot: readers see none until the next publication (a copy that can
    /// no longer be kept current).
    pub fn withdraw(&self) {
        self.tx.send_replace(None);
    }

    /// A handle reading what this publisher publishes.
    pub fn handle(&self) -> SnapshotHandle {
        SnapshotHandle {
            rx: self.tx.subscribe(),
        }
    }
}
