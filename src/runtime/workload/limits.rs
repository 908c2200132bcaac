//! What the operator reads from one workload cluster at most, and how a cluster beyond a
//! limit is told apart and paused.

use std::collections::HashMap;
use std::time::Duration;

use kube::runtime::watcher;

use crate::runtime::nodes::WatchedNode;

/// How long a cluster that listed more than [`ReadLimits::nodes`] Nodes waits before it is
/// listed again.
pub(super) const TOO_MANY_NODES_BACKOFF: Duration = Duration::from_secs(60);
/// How long a cluster whose list missed [`ReadLimits::list_deadline`], or whose answer was
/// beyond a size limit, waits before it is listed again.
pub(super) const SLOW_LIST_BACKOFF: Duration = Duration::from_secs(60);

/// What the operator reads from one workload cluster at most: the tenant runs that API
/// server. A cluster beyond a limit is reported failed (naming the limit), its Nodes are not
/// served, and it is listed again after a minute; other clusters are not affected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Largest response body (one LIST page, or one watch request's events). Default 64 MiB:
    /// the Nodes are listed 500 to a page, and 500 Nodes with their image lists come to
    /// about 10 MiB.
    pub response_bytes: usize,
    /// Longest watch event line. Default 16 MiB.
    pub watch_line_bytes: usize,
    /// Most Nodes kept. Default 15,000: three times Kubernetes' largest supported cluster.
    pub nodes: usize,
    /// Most bytes the cache holds for the cluster's Nodes ([`WatchedNode::kept_bytes`]).
    /// Default 128 MiB: a Node with kubelet's labels comes to about 3 KiB, so 15,000 of them
    /// to about 45 MiB; without it a tenant's 15,000 Nodes with 16 KiB of labels each would
    /// hold 240 MiB.
    pub node_bytes: usize,
    /// Most pages of one LIST. Default 100: 15,000 Nodes come in 30 pages of 500, and a
    /// server answering each page with a fresh `continue` token is stopped at the 101st
    /// instead of paging until the list's deadline.
    pub list_pages: usize,
    /// Longest a whole LIST of the Nodes may take, every page included: the read timeout
    /// bounds the wait for each next byte, not the list, and a tenant's server may send one
    /// byte every few seconds forever. Default 180 s: 15,000 Nodes at a few MB/s list in
    /// well under a minute.
    pub list_deadline: Duration,
}

impl Default for ReadLimits {
    fn default() -> Self {
        Self {
            response_bytes: 64 << 20,
            watch_line_bytes: crate::runtime::line_limit::MAX_WATCH_LINE_BYTES,
            nodes: 15_000,
            node_bytes: 128 << 20,
            list_pages: 100,
            list_deadline: Duration::from_secs(180),
        }
    }
}
/// True when a request failed because its answer was larger than a workload client reads
/// ([`ReadLimits::response_bytes`], or a watch line beyond [`ReadLimits::watch_line_bytes`]).
/// Which, named as the operator's flag says it.
pub(super) fn oversized(reason: &str, limits: &ReadLimits) -> Option<String> {
    if reason.contains("length limit exceeded") {
        Some(format!(
            "an answer was larger than {} MiB (--workload-max-response-mib)",
            limits.response_bytes >> 20
        ))
    } else if reason.contains("no API server sends such a Node") {
        Some(
            "a Node had a field longer than any API server sends (name, providerID, or Cluster API's machine annotation)"
                .to_string(),
        )
    } else if reason.contains("pages (fresh continue tokens)") {
        Some(format!(
            "a list ran to more than {} pages (--workload-max-list-pages)",
            limits.list_pages
        ))
    } else if reason.contains("a watch event line longer than") {
        Some(format!(
            "a watch event was longer than {} MiB (--workload-max-watch-line-mib)",
            limits.watch_line_bytes >> 20
        ))
    } else {
        None
    }
}

/// The number of Nodes when `event` takes a cluster beyond `max` Nodes: counted per list
/// (`listing`, reset when a list begins) and, once listed, as the Nodes known (`seen`).
pub(super) fn over_node_cap(
    event: &watcher::Event<WatchedNode>,
    listing: &mut usize,
    seen: &HashMap<String, u64>,
    max: usize,
) -> Option<usize> {
    match event {
        watcher::Event::Init => {
            *listing = 0;
            None
        }
        watcher::Event::InitApply(_) => {
            *listing += 1;
            (*listing > max).then_some(*listing)
        }
        watcher::Event::Apply(node) => {
            let new = node
                .metadata
                .name
                .as_ref()
                .is_some_and(|n| !seen.contains_key(n));
            let count = seen.len() + usize::from(new);
            (count > max).then_some(count)
        }
        _ => None,
    }
}

/// The bytes the cache holds for one cluster's Nodes ([`WatchedNode::kept_bytes`]): counted
/// per list while one is under way and, once listed, over the Nodes known.
#[derive(Debug, Default)]
pub(super) struct KeptBytes {
    /// Each Node of the list under way.
    listing: HashMap<String, usize>,
    listing_total: usize,
    /// Each Node known since the last complete list.
    live: HashMap<String, usize>,
    live_total: usize,
}

impl KeptBytes {
    /// The bytes when `event` takes the cluster beyond `max`.
    pub(super) fn over(
        &mut self,
        event: &watcher::Event<WatchedNode>,
        max: usize,
    ) -> Option<usize> {
        let name = |node: &WatchedNode| node.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => {
                self.listing.clear();
                self.listing_total = 0;
                None
            }
            watcher::Event::InitApply(node) => {
                let size = node.kept_bytes();
                let before = self.listing.insert(name(node), size).unwrap_or_default();
                self.listing_total = self.listing_total - before + size;
                (self.listing_total > max).then_some(self.listing_total)
            }
            watcher::Event::InitDone => {
                self.live = std::mem::take(&mut self.listing);
                self.live_total = std::mem::take(&mut self.listing_total);
                None
            }
            watcher::Event::Apply(node) => {
                let size = node.kept_bytes();
                let total = self.live_total
                    - self.live.get(&name(node)).copied().unwrap_or_default()
                    + size;
                if total > max {
                    return Some(total);
                }
                self.live.insert(name(node), size);
                self.live_total = total;
                None
            }
            watcher::Event::Delete(node) => {
                if let Some(size) = self.live.remove(&name(node)) {
                    self.live_total -= size;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_whose_nodes_hold_more_bytes_than_the_budget_is_stopped_at_the_first_one_beyond() {
        let node = |name: &str, label_bytes: usize| -> WatchedNode {
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": name, "labels": {"example.com/l": "v".repeat(label_bytes.min(63))}}}))
            .unwrap()
        };
        let size = node("n00", 60).kept_bytes();
        let max = 10 * size;
        let mut kept = KeptBytes::default();
        assert_eq!(kept.over(&watcher::Event::Init, max), None);
        for k in 0..10 {
            let event = watcher::Event::InitApply(node(&format!("n{k:02}"), 60));
            assert_eq!(kept.over(&event, max), None, "node {k}");
        }
        let beyond = watcher::Event::InitApply(node("n10", 60));
        assert_eq!(kept.over(&beyond, max), Some(11 * size));
        // A new list counts again; once listed, a Node growing past the budget stops it, a
        // Node replaced by one as large does not, and a deleted one frees its bytes.
        assert_eq!(kept.over(&watcher::Event::Init, max), None);
        for k in 0..10 {
            let event = watcher::Event::InitApply(node(&format!("n{k:02}"), 60));
            assert_eq!(kept.over(&event, max), None);
        }
        assert_eq!(kept.over(&watcher::Event::InitDone, max), None);
        assert_eq!(
            kept.over(&watcher::Event::Apply(node("n03", 60)), max),
            None
        );
        assert!(
            kept.over(&watcher::Event::Apply(node("n11", 60)), max)
                .is_some()
        );
        assert_eq!(
            kept.over(&watcher::Event::Delete(node("n04", 60)), max),
            None
        );
        assert_eq!(
            kept.over(&watcher::Event::Apply(node("n11", 60)), max),
            None
        );
    }

    #[test]
    fn a_cluster_listing_more_nodes_than_the_cap_is_stopped_at_the_first_one_beyond() {
        let node = |name: &str| -> WatchedNode {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
        };
        const MAX_NODES: usize = 1_000;
        let mut listing = 0;
        let mut seen: HashMap<String, u64> = HashMap::new();
        assert_eq!(
            over_node_cap(&watcher::Event::Init, &mut listing, &seen, MAX_NODES),
            None
        );
        for k in 0..MAX_NODES {
            let event = watcher::Event::InitApply(node(&format!("n{k}")));
            assert_eq!(over_node_cap(&event, &mut listing, &seen, MAX_NODES), None);
        }
        let beyond = watcher::Event::InitApply(node("one-more"));
        assert_eq!(
            over_node_cap(&beyond, &mut listing, &seen, MAX_NODES),
            Some(MAX_NODES + 1)
        );
        // A new list starts the count again; once listed, a new Node beyond the cap stops it.
        assert_eq!(
            over_node_cap(&watcher::Event::Init, &mut listing, &seen, MAX_NODES),
            None
        );
        assert_eq!(listing, 0);
        seen.extend((0..MAX_NODES).map(|k| (format!("n{k}"), 0)));
        let known = watcher::Event::Apply(node("n7"));
        assert_eq!(over_node_cap(&known, &mut listing, &seen, MAX_NODES), None);
        let new = watcher::Event::Apply(node("n-new"));
        assert_eq!(
            over_node_cap(&new, &mut listing, &seen, MAX_NODES),
            Some(MAX_NODES + 1)
        );
    }
}
