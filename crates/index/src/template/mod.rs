//! Scale-from-zero template nodes: what a new node of a group would look like, assembled from
//! annotations, the infrastructure template and live nodes, and encoded as a raw protobuf
//! `k8s.io/api/core/v1.Node` (no `k8s\0` envelope), which is what cluster-autoscaler decodes.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use thiserror::Error;

use crate::capi::annotations::CapacityHints;
use crate::capi::groups::PolicyTemplate;
use crate::capi::groups::Taint;
use crate::capi::objects::InfraTemplate;
use crate::quantity;

/// What the template builder needs for a group that may scale from zero.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TemplateInputs {
    /// Parsed capacity annotations (and policy template, when one applies).
    pub hints: CapacityHints,
    /// The infrastructure template's status hints, when a template exists and is cached.
    pub infra: Option<InfraTemplate>,
    /// CAPI-managed labels from the machine template.
    pub managed_labels: BTreeMap<String, String>,
    /// Taints from `spec.template.spec.taints`.
    pub spec_taints: Vec<Taint>,
    /// Labels copied from a live node of the group (arch, os, instance type, region, zone).
    pub node_labels: BTreeMap<String, String>,
    /// Architecture used when nothing else says (`CAPI_SCALE_ZERO_DEFAULT_ARCH`).
    pub default_arch: String,
    /// The governing policy's template (between the infrastructure template and annotations).
    pub policy: Option<PolicyTemplate>,
}

/// Default max pods per node when nothing says otherwise (kubelet's default).
pub const DEFAULT_MAX_PODS: i64 = 110;

const COPIED_NODE_LABELS: [&str; 7] = [
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];

/// Architectures accepted for `CAPI_SCALE_ZERO_DEFAULT_ARCH`.
pub const KNOWN_ARCHITECTURES: [&str; 4] = ["amd64", "arm64", "ppc64le", "s390x"];
/// The architecture used when `CAPI_SCALE_ZERO_DEFAULT_ARCH` names none of
/// [`KNOWN_ARCHITECTURES`] (upstream's `DefaultArch`).
pub const FALLBACK_ARCHITECTURE: &str = "amd64";

/// `CAPI_SCALE_ZERO_DEFAULT_ARCH` names no architecture we know.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error(
    "unrecognized scale-from-zero default architecture {0:?} (expected amd64, arm64, ppc64le or s390x, exactly); falling back to {FALLBACK_ARCHITECTURE}"
)]
pub struct UnknownArchitecture(pub String);

/// The default architecture of template nodes, as upstream's
/// `GetDefaultScaleFromZeroArchitecture` (`clusterapi_utils.go`) reads it: one of
/// [`KNOWN_ARCHITECTURES`], compared exactly; anything else (`x86_64`, `AMD64`, empty) is an
/// error whose fallback is [`FALLBACK_ARCHITECTURE`], so the caller can log it loudly and go
/// on, as upstream does, instead of refusing to start.
pub fn default_architecture(value: &str) -> Result<&'static str, UnknownArchitecture> {
    KNOWN_ARCHITECTURES
        .iter()
        .find(|a| **a == value)
        .copied()
        .ok_or_else(|| UnknownArchitecture(value.into()))
}

/// Labels from a machine template that Cluster API syncs to Nodes (and so belong in templates).
pub fn managed_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| is_managed_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn is_managed_label(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    domain == "node-role.kubernetes.io"
        || ["node-restriction.kubernetes.io", "node.cluster.x-k8s.io"]
            .iter()
            .any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
}

/// The labels of a live node that describe its machine type and place.
pub fn copied_node_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    COPIED_NODE_LABELS
        .iter()
        .filter_map(|k| {
            labels
                .get(*k)
                .filter(|v| !v.is_empty())
                .map(|v| (k.to_string(), v.clone()))
        })
        .collect()
}

/// Capacity of a new node: infrastructure template `status.capacity` (unparsable values
/// skipped), overlaid by the governing policy's template, overlaid by the annotations. `pods` comes from the maxPods annotation, else the
/// template, else 110. (Upstream lets its default 110 override a template's pods; we do not.)
pub fn capacity(t: &TemplateInputs) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = t
        .infra
        .iter()
        .flat_map(|i| i.capacity.iter())
        .chain(t.policy.iter().flat_map(|p| p.capacity.iter()))
        .filter(|(_, v)| quantity::parse(v).is_ok())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let h = &t.hints;
    for (name, value) in [
        ("cpu", &h.cpu),
        ("memory", &h.memory),
        ("ephemeral-storage", &h.ephemeral_storage),
    ] {
        if let Some(v) = value {
            out.insert(name.into(), v.clone());
        }
    }
    if let Some((gpu_type, count)) = &h.gpu {
        out.insert(gpu_type.clone(), count.to_string());
    }
    match h.max_pods {
        Some(n) => {
            out.insert("pods".into(), n.to_string());
        }
        None => {
            out.entry("pods".into())
                .or_insert_with(|| DEFAULT_MAX_PODS.to_string());
        }
    }
    out
}

/// A group can scale from zero when the merged capacity has both cpu and memory.
pub fn can_scale_from_zero(t: &TemplateInputs) -> bool {
    let c = capacity(t);
    c.contains_key("cpu") && c.contains_key("memory")
}

/// Labels of a new node, lowest priority first: generic, system info, the policy's arch/os,
/// managed template labels, policy labels, the labels annotation, labels of a live node.
pub fn labels(t: &TemplateInputs, node_name: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("kubernetes.io/arch".to_string(), t.default_arch.clone());
    out.insert("kubernetes.io/os".to_string(), "linux".to_string());
    out.insert("kubernetes.io/hostname".to_string(), node_name.to_string());
    if let Some(infra) = &t.infra {
        // Upstream's `systemInfoFromInfrastructureObject` gives empty arch/os when the template
        // has no `status.nodeInfo`; we keep the defaults instead.
        if let Some(arch) = infra.architecture.as_ref().filter(|a| !a.is_empty()) {
            out.insert("kubernetes.io/arch".into(), arch.clone());
        }
        if let Some(os) = infra.operating_system.as_ref().filter(|o| !o.is_empty()) {
            out.insert("kubernetes.io/os".into(), os.clone());
        }
    }
    if let Some(policy) = &t.policy {
        if let Some(arch) = &policy.architecture {
            out.insert("kubernetes.io/arch".into(), arch.clone());
        }
        if let Some(os) = &policy.operating_system {
            out.insert("kubernetes.io/os".into(), os.clone());
        }
    }
    out.extend(t.managed_labels.clone());
    out.extend(t.policy.iter().flat_map(|p| p.labels.clone()));
    out.extend(t.hints.labels.clone());
    out.extend(t.node_labels.clone());
    out
}

/// Taints of a new node: spec taints, then policy taints, then annotation taints; a later taint
/// replaces an earlier one with the same key and effect.
pub fn taints(t: &TemplateInputs) -> Vec<Taint> {
    let mut out = t.spec_taints.clone();
    let policy_taints = t.policy.iter().flat_map(|p| p.taints.iter());
    for taint in policy_taints.chain(&t.hints.taints) {
        match out
            .iter_mut()
            .find(|e| e.key == taint.key && e.effect == taint.effect)
        {
            Some(existing) => *existing = taint.clone(),
            None => out.push(taint.clone()),
        }
    }
    out
}

/// Builds the template Node for a group whose scalable resource is named `resource_name`.
pub fn build_node(resource_name: &str, t: &TemplateInputs, now_unix: i64) -> pb::Node {
    let name = format!("{resource_name}-template");
    let quantities: BTreeMap<String, Quantity> = capacity(t)
        .into_iter()
        .map(|(k, v)| (k, Quantity { string: Some(v) }))
        .collect();
    let transition = meta::Time {
        seconds: Some(now_unix - 60),
        nanos: Some(0),
    };
    let condition = |kind: &str, status: &str| pb::NodeCondition {
        r#type: Some(kind.into()),
        status: Some(status.into()),
        last_heartbeat_time: Some(transition),
        last_transition_time: Some(transition),
        ..Default::default()
    };
    let labels = labels(t, &name);
    let system_info = pb::NodeSystemInfo {
        architecture: labels.get("kubernetes.io/arch").cloned(),
        operating_system: labels.get("kubernetes.io/os").cloned(),
        ..Default::default()
    };
    pb::Node {
        metadata: Some(meta::ObjectMeta {
            name: Some(name),
            labels,
            ..Default::default()
        }),
        spec: Some(pb::NodeSpec {
            taints: taints(t)
                .into_iter()
                .map(|taint| pb::Taint {
                    key: Some(taint.key),
                    value: Some(taint.value),
                    effect: Some(taint.effect),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(pb::NodeStatus {
            capacity: quantities.clone(),
            allocatable: quantities,
            phase: Some("Running".into()),
            conditions: vec![
                condition("Ready", "True"),
                condition("NetworkUnavailable", "False"),
                condition("DiskPressure", "False"),
                condition("MemoryPressure", "False"),
            ],
            node_info: Some(system_info),
            ..Default::default()
        }),
    }
}

/// Raw protobuf bytes of a Node, as `v1.Node.Marshal()` produces them.
pub fn encode_node(node: &pb::Node) -> Vec<u8> {
    node.encode_to_vec()
}

pub mod labels;
#[cfg(test)]
mod tests;
