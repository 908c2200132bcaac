//! Nodes as the operator caches them: decoded into the index's view of a Node, and nothing
//! more.

use std::borrow::Cow;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use kube::{Resource, ResourceExt};
use serde::{Deserialize, Deserializer};

use ngo_index::index::{ClusterKey, NodeView};

/// A Node as cached: its identity and its [`NodeView`] (name, provider ID, labels,
/// annotations, Ready, capacity), which the index shares. The rest of the Node (images,
/// addresses, allocatable, system info, its other conditions, field managers) is dropped as
/// the watch event is decoded.
#[derive(Clone, Debug)]
pub struct WatchedNode {
    /// Name and resourceVersion (the watch resumes from the last one).
    pub metadata: ObjectMeta,
    /// The view.
    pub view: Arc<NodeView>,
}

impl WatchedNode {
    /// Marks the view as read from workload cluster `cluster` (a fresh view is not shared
    /// yet, so this copies nothing).
    pub fn set_cluster(&mut self, cluster: &ClusterKey) {
        Arc::make_mut(&mut self.view).cluster = Some(cluster.clone());
    }

    /// About how many bytes the cache holds for this Node: its strings, and a fixed cost per
    /// map entry and per Node (allocation headers, the map's nodes, the view's fields).
    pub fn kept_bytes(&self) -> usize {
        /// What a map entry costs beside its key and value strings.
        const ENTRY: usize = 64;
        /// What a Node costs beside its strings (`WatchedNode`, its `Arc`, the store's key).
        const NODE: usize = 512;
        let view = &self.view;
        let entries = |map: &std::collections::BTreeMap<String, String>| -> usize {
            map.iter().map(|(k, v)| k.len() + v.len() + ENTRY).sum()
        };
        NODE + 2 * view.name.len()
            + self
                .metadata
                .resource_version
                .as_ref()
                .map_or(0, String::len)
            + view.provider_id.as_ref().map_or(0, String::len)
            + entries(&view.annotations)
            + entries(&view.labels)
            + entries(&view.capacity)
    }

    /// A hash of what the index reads: a Node event that leaves it unchanged (a heartbeat, an
    /// image list) needs no index update.
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = std::hash::DefaultHasher::new();
        self.view.hash(&mut hasher);
        hasher.finish()
    }
}

/// Longest Node name (a DNS subdomain, as the API server validates it).
const MAX_NAME_BYTES: usize = 253;
/// Longest provider ID kept: the longest real ones (Azure's scale-set instances) come to about
/// 250 bytes.
const MAX_PROVIDER_ID_BYTES: usize = 2048;
/// Longest value of a kept annotation (a Machine's name, a namespace).
const MAX_ANNOTATION_VALUE_BYTES: usize = 253;

/// Why a Node no API server would send is refused: the fields kept whole (its name, provider
/// ID, resourceVersion and the annotations the index reads) are bounded, as a tenant's server
/// could otherwise make each Node as large as a watch line.
fn unreal(node: &Node) -> Option<String> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "a Node name of {} bytes (at most {MAX_NAME_BYTES})",
            name.len()
        ));
    }
    let version = node
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    if version.len() > MAX_NAME_BYTES {
        return Some(format!(
            "Node {name}: a resourceVersion of {} bytes",
            version.len()
        ));
    }
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    if let Some(id) = provider_id.filter(|id| id.len() > MAX_PROVIDER_ID_BYTES) {
        return Some(format!(
            "Node {name}: a providerID of {} bytes (at most {MAX_PROVIDER_ID_BYTES})",
            id.len()
        ));
    }
    node.annotations()
        .iter()
        .find(|(key, value)| read_annotation(key) && value.len() > MAX_ANNOTATION_VALUE_BYTES)
        .map(|(key, value)| {
            format!(
                "Node {name}: annotation {key} of {} bytes (at most {MAX_ANNOTATION_VALUE_BYTES})",
                value.len()
            )
        })
}

impl<'de> Deserialize<'de> for WatchedNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let node = Node::deserialize(deserializer)?;
        if let Some(why) = unreal(&node) {
            return Err(serde::de::Error::custom(format!(
                "refused {why}: no API server sends such a Node"
            )));
        }
        let view = node_view(&node, None);
        Ok(Self {
            metadata: ObjectMeta {
                name: node.metadata.name,
                resource_version: node.metadata.resource_version,
                ..ObjectMeta::default()
            },
            view: Arc::new(view),
        })
    }
}

impl Resource for WatchedNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Node::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        Node::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        Node::version(&())
    }

    fn api_version(_: &()) -> Cow<'_, str> {
        Node::api_version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Node::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// True for the Node annotations the index reads: Cluster API's `<group>/machine` and
/// `<group>/cluster-namespace` (whatever the group). The rest are not kept, so a Node's
/// annotations cost nothing however large.
fn read_annotation(key: &str) -> bool {
    key.rsplit_once('/')
        .is_some_and(|(_, name)| name == "machine" || name == "cluster-namespace")
}

/// Bytes of labels (keys and values) kept per Node. Kubelet's own come to about 1 KiB and node
/// feature discovery's to under 10 KiB; a tenant's API server may send any number.
const MAX_LABEL_BYTES: usize = 16 * 1024;
/// Capacity entries kept per Node (a real Node has a handful, plus its extended resources).
const MAX_CAPACITY_ENTRIES: usize = 128;
/// Longest capacity value kept (a quantity).
const MAX_QUANTITY_BYTES: usize = 64;

/// The labels of a Node the index keeps: valid Kubernetes labels (a real API server accepts no
/// others) up to [`MAX_LABEL_BYTES`], Kubernetes' own (`*kubernetes.io/`, `*k8s.io/`: zone,
/// instance type, architecture, which templates copy) first, then the rest in key order.
fn kept_labels(
    labels: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    use ngo_index::template::labels::{valid_label_key, valid_label_value};
    let kubernetes = |key: &str| {
        key.split_once('/').is_some_and(|(prefix, _)| {
            prefix.ends_with("kubernetes.io") || prefix.ends_with("k8s.io")
        })
    };
    let valid = labels
        .iter()
        .filter(|(k, v)| valid_label_key(k) && valid_label_value(v));
    let (own, others): (Vec<_>, Vec<_>) = valid.partition(|(k, _)| kubernetes(k));
    let mut budget = MAX_LABEL_BYTES;
    own.into_iter()
        .chain(others)
        .filter(|(k, v)| {
            let size = k.len() + v.len();
            let fits = size <= budget;
            if fits {
                budget -= size;
            }
            fits
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The index's view of `node`, read from `cluster` (`None`: the view shared by every cluster).
pub fn node_view(node: &Node, cluster: Option<ClusterKey>) -> NodeView {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    NodeView {
        name: node.name_any(),
        provider_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty()),
        annotations: node
            .annotations()
            .iter()
            .filter(|(key, _)| read_annotation(key))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        labels: kept_labels(node.labels()),
        ready,
        capacity: node
            .status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .map(|c| {
                c.iter()
                    .filter(|(k, v)| {
                        ngo_index::template::labels::valid_label_key(k)
                            && v.0.len() <= MAX_QUANTITY_BYTES
                    })
                    .take(MAX_CAPACITY_ENTRIES)
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect()
            })
            .unwrap_or_default(),
        cluster,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_json() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u", "resourceVersion": "7", "labels": {"zone": "a"},
                "annotations": {"x": "y"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"providerID": "test:////n1", "podCIDR": "10.0.0.0/24",
                "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi"},
                "allocatable": {"cpu": "3900m"},
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "message": "ok"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"}
                ],
                "images": [{"names": ["registry.example/image:1"], "sizeBytes": 1}]
            }
        })
    }

    #[test]
    fn a_watched_node_holds_its_view_and_identity_only() {
        let node: Node = serde_json::from_value(node_json()).unwrap();
        let watched: WatchedNode = serde_json::from_value(node_json()).unwrap();
        assert_eq!(*watched.view, node_view(&node, None));
        assert!(watched.view.ready);
        assert_eq!(watched.view.provider_id.as_deref(), Some("test:////n1"));
        assert_eq!(
            watched.view.capacity.get("cpu").map(String::as_str),
            Some("4")
        );
        assert_eq!(
            watched.metadata,
            ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            }
        );
    }

    #[test]
    fn only_the_annotations_the_index_reads_are_kept() {
        let mut node = node_json();
        node["metadata"]["annotations"] = serde_json::json!({
            "cluster.x-k8s.io/machine": "m1",
            "custom.x-k8s.io/cluster-namespace": "ns",
            "example.com/huge": "x".repeat(1 << 20),
            "machine": "no group",
        });
        let watched: WatchedNode = serde_json::from_value(node).unwrap();
        assert_eq!(
            watched.view.annotations.keys().collect::<Vec<_>>(),
            [
                "cluster.x-k8s.io/machine",
                "custom.x-k8s.io/cluster-namespace"
            ]
        );
    }

    #[test]
    fn labels_and_capacity_are_kept_only_as_a_real_api_server_would_send_them_and_bounded() {
        let mut node = node_json();
        let mut labels = serde_json::json!({
            "kubernetes.io/hostname": "n1",
            "zone": "a",
            "huge": "x".repeat(1 << 20),
            "Bad Key": "v",
        });
        for i in 0..2000 {
            labels[format!("example.com/l{i:04}")] = "v".repeat(60).into();
        }
        node["metadata"]["labels"] = labels;
        let mut capacity =
            serde_json::json!({"cpu": "4", "memory": "8Gi", "long": "9".repeat(100)});
        for i in 0..1000 {
            capacity[format!("example.com/device{i}")] = "1".into();
        }
        node["status"]["capacity"] = capacity;
        let watched: WatchedNode = serde_json::from_value(node).unwrap();
        let labels = &watched.view.labels;
        let bytes: usize = labels.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(bytes <= MAX_LABEL_BYTES, "{bytes} bytes of labels kept");
        assert!(labels.len() > 100, "valid labels are kept up to the budget");
        assert!(
            labels.contains_key("kubernetes.io/hostname"),
            "Kubernetes' own labels come first"
        );
        assert!(!labels.contains_key("huge") && !labels.contains_key("Bad Key"));
        let capacity = &watched.view.capacity;
        assert!(capacity.len() <= MAX_CAPACITY_ENTRIES, "{}", capacity.len());
        assert_eq!(capacity.get("cpu").map(String::as_str), Some("4"));
        assert!(!capacity.contains_key("long"));
    }

    /// The fields kept whole are bounded: a Node with any of them beyond what an API server
    /// sends is refused (its page fails to decode, and the cluster is reported), not kept.
    #[test]
    fn a_node_no_api_server_would_send_is_refused_not_kept() {
        let refused = |change: &dyn Fn(&mut serde_json::Value), named: &str| {
            let mut node = node_json();
            change(&mut node);
            let error = serde_json::from_value::<WatchedNode>(node)
                .expect_err(named)
                .to_string();
            assert!(
                error.contains(named) && error.contains("no API server sends such a Node"),
                "{named}: {error}"
            );
        };
        refused(
            &|n| n["metadata"]["name"] = "n".repeat(254).into(),
            "a Node name of 254 bytes",
        );
        refused(
            &|n| n["spec"]["providerID"] = "p".repeat(1 << 20).into(),
            "a providerID of 1048576 bytes",
        );
        refused(
            &|n| n["metadata"]["annotations"]["cluster.x-k8s.io/machine"] = "m".repeat(300).into(),
            "annotation cluster.x-k8s.io/machine of 300 bytes",
        );
        refused(
            &|n| n["metadata"]["resourceVersion"] = "7".repeat(1000).into(),
            "a resourceVersion of 1000 bytes",
        );
        let mut longest = node_json();
        longest["metadata"]["name"] = "n".repeat(253).into();
        longest["spec"]["providerID"] = "p".repeat(2048).into();
        longest["metadata"]["annotations"]["cluster.x-k8s.io/machine"] = "m".repeat(253).into();
        let kept: WatchedNode = serde_json::from_value(longest).expect("at the bounds");
        assert!(
            kept.kept_bytes() > 253 + 2048 + 253,
            "{}",
            kept.kept_bytes()
        );
    }

    #[test]
    fn a_heartbeat_keeps_the_fingerprint_and_a_readiness_change_does_not() {
        let watched: WatchedNode = serde_json::from_value(node_json()).unwrap();
        let mut heartbeat = node_json();
        heartbeat["status"]["conditions"][1]["lastHeartbeatTime"] = "2026-01-01T00:00:00Z".into();
        heartbeat["status"]["images"] = serde_json::json!([]);
        let heartbeat: WatchedNode = serde_json::from_value(heartbeat).unwrap();
        assert_eq!(heartbeat.fingerprint(), watched.fingerprint());
        let mut not_ready = node_json();
        not_ready["status"]["conditions"][1]["status"] = "False".into();
        let not_ready: WatchedNode = serde_json::from_value(not_ready).unwrap();
        assert_ne!(not_ready.fingerprint(), watched.fingerprint());
        let mut in_cluster = watched.clone();
        in_cluster.set_cluster(&ClusterKey {
            namespace: "ns".into(),
            name: "c1".into(),
        });
        assert_eq!(
            in_cluster.view.cluster.as_ref().map(|c| c.name.as_str()),
            Some("c1")
        );
        assert_eq!(
            watched.view.cluster, None,
            "the original view is not changed"
        );
    }
}
