//! What changed since the index last looked. Reflectors record the keys of the objects their
//! events touched; the rebuild loop takes them all at once and updates the index for just
//! those objects, or re-reads everything after a re-list.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use kube::Resource;
use kube::runtime::watcher;
use tokio::sync::Notify;

use ngo_index::capi::objects::ScalableKind;
use ngo_index::index::ClusterKey;
use ngo_index::index::state::{NodeKey, ResourceKey};

/// How one reflector's events are recorded.
#[derive(Clone, Debug)]
pub enum Track {
    /// Objects every group may depend on (policies, templates, Clusters): any change
    /// recomputes every group.
    Context,
    /// MachineDeployments, MachineSets or MachinePools.
    Scalable(ScalableKind),
    /// Machines.
    Machines,
    /// Nodes, of a workload cluster or of the shared view (`None`).
    Nodes(Option<ClusterKey>),
}

/// Changes not yet applied to the index.
#[derive(Debug, Default)]
pub struct Pending {
    /// When the oldest of them was recorded.
    pub since: Option<Instant>,
    /// A reflector re-listed: every object must be read again.
    pub relist: bool,
    /// Policies, templates, Clusters or workload cluster states changed.
    pub context: bool,
    /// Scalable resources whose current version must be read.
    pub resources: BTreeSet<ResourceKey>,
    /// Machines (namespace, name) whose current version must be read.
    pub machines: BTreeSet<(String, String)>,
    /// Nodes whose current version must be read.
    pub nodes: BTreeSet<NodeKey>,
    /// Workload clusters whose connection changed or whose Nodes were listed again: their
    /// state and every Node of theirs must be read again (their groups only).
    pub clusters: BTreeSet<ClusterKey>,
}

impl Pending {
    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        !self.relist
            && !self.context
            && self.resources.is_empty()
            && self.machines.is_empty()
            && self.nodes.is_empty()
            && self.clusters.is_empty()
    }
}

/// The record shared by every reflector and the rebuild loop (its only waiter).
#[derive(Debug, Default)]
pub struct Changes {
    pending: Mutex<Pending>,
    notify: Notify,
}

impl Changes {
    /// Records what `event` of a reflector tracked as `track` changed.
    pub fn record<K: Resource>(&self, track: &Track, event: &watcher::Event<K>) {
        let object = match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => o,
            // A (re-)list is complete: objects may have gone while the watch was down.
            watcher::Event::InitDone => {
                self.update(|p| match track {
                    Track::Context => p.context = true,
                    // One workload cluster's Nodes: that cluster's groups only.
                    Track::Nodes(Some(cluster)) => {
                        p.clusters.insert(cluster.clone());
                    }
                    _ => p.relist = true,
                });
                return;
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => return,
        };
        let meta = object.meta();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        self.update(|p| match track {
            Track::Context => p.context = true,
            Track::Scalable(kind) => {
                p.resources.insert((*kind, namespace, name));
            }
            Track::Machines => {
                p.machines.insert((namespace, name));
            }
            Track::Nodes(cluster) => {
                p.nodes.insert((cluster.clone(), name));
            }
        });
    }

    /// Records that something every group may depend on changed.
    pub fn context(&self) {
        self.update(|p| p.context = true);
    }

    /// Records that workload cluster `cluster`'s connection changed: its state and Nodes must
    /// be read again.
    pub fn cluster(&self, cluster: &ClusterKey) {
        self.update(|p| {
            p.clusters.insert(cluster.clone());
        });
    }

    /// Records that every object must be read again.
    pub fn relist(&self) {
        self.update(|p| p.relist = true);
    }

    fn update(&self, change: impl FnOnce(&mut Pending)) {
        {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.since.get_or_insert_with(Instant::now);
            change(&mut pending);
        }
        self.notify.notify_one();
    }

    /// Everything recorded so far (and clears it).
    pub fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// True when what is recorded needs every group recomputed (a re-list or a context
    /// change): worth waiting a little for the rest of a burst.
    pub fn wants_full_pass(&self) -> bool {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.relist || pending.context
    }

    /// Waits until something is recorded.
    pub async fn notified(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::ObjectMeta;

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn events_record_the_keys_they_touch_and_take_clears_them() {
        let changes = Changes::default();
        let cluster = ClusterKey {
            namespace: "ns".into(),
            name: "c1".into(),
        };
        changes.record(&Track::Nodes(None), &watcher::Event::Apply(node("a")));
        changes.record(
            &Track::Nodes(Some(cluster.clone())),
            &watcher::Event::Delete(node("b")),
        );
        changes.record(&Track::Nodes(None), &watcher::Event::InitApply(node("c")));
        let pending = changes.take();
        assert!(pending.since.is_some());
        assert!(!pending.relist && !pending.context);
        assert_eq!(
            pending.nodes.into_iter().collect::<Vec<_>>(),
            vec![(None, "a".to_string()), (Some(cluster), "b".to_string())]
        );
        assert!(changes.take().is_empty());
    }

    #[test]
    fn a_finished_list_means_a_relist_or_for_context_a_context_change() {
        let changes = Changes::default();
        changes.record(&Track::Machines, &watcher::Event::<Node>::InitDone);
        assert!(changes.wants_full_pass());
        assert!(changes.take().relist);
        changes.record(&Track::Context, &watcher::Event::<Node>::InitDone);
        let pending = changes.take();
        assert!(pending.context && !pending.relist);
        changes.record(&Track::Context, &watcher::Event::Apply(node("policy")));
        assert!(changes.take().context);
        assert!(!changes.wants_full_pass());
        let cluster = ClusterKey {
            namespace: "tenant".into(),
            name: "c1".into(),
        };
        changes.record(
            &Track::Nodes(Some(cluster.clone())),
            &watcher::Event::<Node>::InitDone,
        );
        assert!(
            !changes.wants_full_pass(),
            "one workload cluster's list re-reads that cluster only"
        );
        let pending = changes.take();
        assert!(!pending.relist && !pending.context);
        assert_eq!(pending.clusters.into_iter().collect::<Vec<_>>(), [cluster]);
    }
}
