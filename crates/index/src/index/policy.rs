//! Policies as the index sees them: plain rules, already validated, with no Kubernetes types.

use crate::capi::annotations::OptionOverrides;
use crate::capi::groups::PolicyTemplate;
use crate::capi::objects::{ScalableKind, ScalableResource, Selector};

/// `<namespace>/<name>` of a policy, plus its UID for events.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct PolicyRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl PolicyRef {
    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Prices per hour.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PriceList {
    /// One node.
    pub node: Option<f64>,
    /// One CPU core.
    pub cpu_core: Option<f64>,
    /// One GiB of memory.
    pub memory_gib: Option<f64>,
    /// One GPU.
    pub gpu: Option<f64>,
}

impl PriceList {
    /// True when per-resource prices are set (pod prices can be computed).
    pub fn has_resource_prices(&self) -> bool {
        self.cpu_core.is_some() || self.memory_gib.is_some() || self.gpu.is_some()
    }
}

/// A NodeGroupPolicy reduced to what the index needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyRules {
    /// Identity.
    pub reference: PolicyRef,
    /// Creation time (RFC 3339); the oldest policy governs a contested resource.
    pub created: String,
    /// Kinds selected; empty selects all.
    pub kinds: Vec<ScalableKind>,
    /// Only this cluster.
    pub cluster_name: Option<String>,
    /// Label selector on the resource.
    pub selector: Selector,
    /// Default min size.
    pub min: Option<i32>,
    /// Default max size.
    pub max: Option<i32>,
    /// Default option overrides.
    pub options: OptionOverrides,
    /// Scale-from-zero template.
    pub template: Option<PolicyTemplate>,
    /// Prices.
    pub pricing: Option<PriceList>,
    /// Why the spec is unusable, if it is (checks the API server's schema cannot make).
    pub invalid: Option<String>,
}

impl PolicyRules {
    /// True when the policy selects `resource` (same namespace, kind, cluster and labels).
    pub fn selects(&self, resource: &ScalableResource) -> bool {
        resource.namespace == self.reference.namespace
            && (self.kinds.is_empty() || self.kinds.contains(&resource.kind))
            && self
                .cluster_name
                .as_ref()
                .is_none_or(|c| *c == resource.cluster_name)
            && self.selector.matches(&resource.labels)
    }

    /// Ordering key: older first, then by name.
    pub fn seniority(&self) -> (&str, &str) {
        (&self.created, &self.reference.name)
    }
}
