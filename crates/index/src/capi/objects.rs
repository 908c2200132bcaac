//! Typed, read-only views of the Cluster API objects we use, extracted from dynamic objects.
//!
//! Works for v1beta1 and v1beta2 shapes: where a field moved between versions both places are
//! read (see each field's doc).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicResourceScope;
use kube::core::{ApiResource, DynamicObject};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::groups::{PoolView, Taint};
use super::keys::CapiKeys;
use crate::quoted::quoted;

/// The kinds that can be node groups: Cluster API's three, and our NodePool.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum ScalableKind {
    /// `MachineDeployment`.
    MachineDeployment,
    /// `MachineSet` (only when not owned by a MachineDeployment).
    MachineSet,
    /// `MachinePool`.
    MachinePool,
    /// `NodePool` (`autoscaling.nodegroup.dev`).
    NodePool,
}

impl From<ngo_api::policy::ScalableKindName> for ScalableKind {
    fn from(kind: ngo_api::policy::ScalableKindName) -> Self {
        match kind {
            ngo_api::policy::ScalableKindName::MachineDeployment => ScalableKind::MachineDeployment,
            ngo_api::policy::ScalableKindName::MachineSet => ScalableKind::MachineSet,
            ngo_api::policy::ScalableKindName::MachinePool => ScalableKind::MachinePool,
            ngo_api::policy::ScalableKindName::NodePool => ScalableKind::NodePool,
        }
    }
}

impl ScalableKind {
    /// The Cluster API kinds, in listing order.
    pub const ALL: [ScalableKind; 3] = [
        ScalableKind::MachineDeployment,
        ScalableKind::MachineSet,
        ScalableKind::MachinePool,
    ];

    /// The Kind string.
    pub fn as_str(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "MachineDeployment",
            ScalableKind::MachineSet => "MachineSet",
            ScalableKind::MachinePool => "MachinePool",
            ScalableKind::NodePool => "NodePool",
        }
    }

    /// True for kinds whose instances are listed on the resource itself (by provider ID)
    /// rather than as Machines.
    pub fn lists_instances(self) -> bool {
        matches!(self, ScalableKind::MachinePool | ScalableKind::NodePool)
    }

    /// The plural resource name.
    pub fn plural(self) -> &'static str {
        match self {
            ScalableKind::MachineDeployment => "machinedeployments",
            ScalableKind::MachineSet => "machinesets",
            ScalableKind::MachinePool => "machinepools",
            ScalableKind::NodePool => "nodepools",
        }
    }
}

impl fmt::Display for ScalableKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ScalableKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScalableKind::ALL
            .into_iter()
            .chain([ScalableKind::NodePool])
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown scalable kind {}", quoted(s)))
    }
}

/// Reference to an infrastructure machine template.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InfraRef {
    /// API group (v1beta2 `apiGroup`, or the group part of v1beta1 `apiVersion`).
    pub group: String,
    /// Version when the reference names one (v1beta1 `apiVersion`); `None` means "preferred".
    pub version: Option<String>,
    /// Kind, e.g. `DockerMachineTemplate`.
    pub kind: String,
    /// Object name, in the scalable resource's namespace.
    pub name: String,
}

/// A label selector (`matchLabels` + `matchExpressions`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    match_labels: BTreeMap<String, String>,
    expressions: Vec<(String, String, Vec<String>)>,
}

impl Selector {
    /// Parses `{matchLabels, matchExpressions}`; `None` for a missing selector.
    pub fn from_value(v: Option<&Value>) -> Option<Self> {
        let v = v?.as_object()?;
        let match_labels = string_map(v.get("matchLabels"));
        let expressions = v
            .get("matchExpressions")
            .and_then(Value::as_array)
            .map(|exprs| {
                exprs
                    .iter()
                    .map(|e| {
                        let key = str_at(e, &["key"]).unwrap_or_default().to_string();
                        let op = str_at(e, &["operator"]).unwrap_or_default().to_string();
                        let values = e
                            .get("values")
                            .and_then(Value::as_array)
                            .map(|vs| {
                                vs.iter()
                                    .filter_map(|v| v.as_str().map(String::from))
                                    .collect()
                            })
                            .unwrap_or_default();
                        (key, op, values)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            match_labels,
            expressions,
        })
    }

    /// A selector from plain equality requirements.
    pub fn from_labels(match_labels: BTreeMap<String, String>) -> Self {
        Self {
            match_labels,
            expressions: Vec::new(),
        }
    }

    /// True when `labels` satisfy every requirement. Unknown operators never match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|(key, op, values)| {
                let actual = labels.get(key);
                match op.as_str() {
                    "In" => actual.is_some_and(|a| values.contains(a)),
                    "NotIn" => actual.is_none_or(|a| !values.contains(a)),
                    "Exists" => actual.is_some(),
                    "DoesNotExist" => actual.is_none(),
                    _ => false,
                }
            })
    }

    /// True when the selector has no requirement at all (matches everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.expressions.is_empty()
    }
}

/// A MachineDeployment, MachineSet or MachinePool as the index needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ScalableResource {
    /// Which kind.
    pub kind: ScalableKind,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Object UID.
    pub uid: String,
    /// Creation time (RFC 3339), used to order policies and for display.
    pub creation_timestamp: Option<String>,
    /// Own labels.
    pub labels: BTreeMap<String, String>,
    /// Own annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.replicas`; `None` when unset.
    pub replicas: Option<i32>,
    /// `status.replicas`.
    pub status_replicas: Option<i32>,
    /// `status.readyReplicas` (v1beta1) or `status.readyReplicas` (v1beta2 keeps the name).
    pub status_ready_replicas: Option<i32>,
    /// `spec.selector` (MachineDeployment, MachineSet).
    pub selector: Option<Selector>,
    /// `spec.clusterName`, or the cluster-name label when the field is absent.
    pub cluster_name: String,
    /// For a MachineSet: the name of its owning MachineDeployment, if any.
    pub owner_machine_deployment: Option<String>,
    /// `spec.template.spec.infrastructureRef`.
    pub infra_ref: Option<InfraRef>,
    /// Labels of the machine template (`spec.template.metadata.labels`).
    pub template_labels: BTreeMap<String, String>,
    /// `spec.template.spec.taints` (Cluster API >= 1.12).
    pub template_taints: Vec<Taint>,
    /// `spec.providerIDList` (MachinePool); the instances' provider IDs (NodePool).
    pub provider_id_list: Option<Vec<String>>,
    /// True when the object is being deleted.
    pub deleting: bool,
    /// What a NodePool adds (bounds, template, machine type, instances).
    pub pool: Option<std::sync::Arc<PoolView>>,
}

impl ScalableResource {
    /// Extracts the view from a dynamic object of the given kind.
    pub fn from_dynamic(kind: ScalableKind, obj: &DynamicObject, keys: &CapiKeys) -> Self {
        let meta = &obj.metadata;
        let data = &obj.data;
        let labels = meta.labels.clone().unwrap_or_default();
        let cluster_name = match value_at(data, &["spec", "clusterName"]).and_then(Value::as_str) {
            Some(name) => name.to_string(),
            None => labels
                .get(&keys.cluster_name_label)
                .cloned()
                .unwrap_or_default(),
        };
        let owner_machine_deployment = if kind == ScalableKind::MachineSet {
            owner_named(meta, "MachineDeployment")
        } else {
            None
        };
        Self {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            creation_timestamp: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
            annotations: meta.annotations.clone().unwrap_or_default(),
            labels,
            replicas: int_at(data, &["spec", "replicas"]),
            status_replicas: int_at(data, &["status", "replicas"]),
            status_ready_replicas: int_at(data, &["status", "readyReplicas"]),
            selector: Selector::from_value(value_at(data, &["spec", "selector"])),
            cluster_name,
            owner_machine_deployment,
            infra_ref: infra_ref(value_at(
                data,
                &["spec", "template", "spec", "infrastructureRef"],
            )),
            template_labels: string_map(value_at(
                data,
                &["spec", "template", "metadata", "labels"],
            )),
            template_taints: taints(value_at(data, &["spec", "template", "spec", "taints"])),
            provider_id_list: value_at(data, &["spec", "providerIDList"])
                .and_then(Value::as_array)
                .map(|ids| {
                    ids.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                }),
            deleting: meta.deletion_timestamp.is_some(),
            pool: None,
        }
    }

    /// `<Kind>/<namespace>/<name>`, the node-group id.
    pub fn group_id(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// A Machine as the index needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Own labels.
    pub labels: BTreeMap<String, String>,
    /// Own annotations.
    pub annotations: BTreeMap<String, String>,
    /// `spec.clusterName`.
    pub cluster_name: String,
    /// Name of the owning MachineSet, if any.
    pub owner_machine_set: Option<String>,
    /// Name of the owning MachinePool, if any (MachinePool Machines).
    pub owner_machine_pool: Option<String>,
    /// `spec.providerID`, when set and non-empty.
    pub provider_id: Option<String>,
    /// `status.nodeRef.name`.
    pub node_ref_name: Option<String>,
    /// `status.nodeRef.kind` (v1beta1; v1beta2 refs are always Nodes).
    pub node_ref_kind: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.failureMessage` (v1beta1) or `status.deprecated.v1beta1.failureMessage` (v1beta2).
    /// Upstream's `findScalableResourceProviderIDs` reads only the first, so it reports failed
    /// v1beta2 machines as pending.
    pub failure_message: Option<String>,
    /// True when the object has a deletion timestamp.
    pub deleting: bool,
    /// Carries this operator's scale-down finalizer.
    pub scale_down_finalizer: bool,
}

impl Machine {
    /// Extracts the view from a dynamic Machine.
    pub fn from_dynamic(obj: &DynamicObject) -> Self {
        let field = |name| obj.data.get(name).unwrap_or(&Value::Null);
        Self::extract(&obj.metadata, field("spec"), field("status"))
    }

    /// The view of a Machine with this metadata, spec and status.
    fn extract(meta: &ObjectMeta, spec: &Value, status: &Value) -> Self {
        let failure_message = str_at(status, &["failureMessage"])
            .or_else(|| str_at(status, &["deprecated", "v1beta1", "failureMessage"]))
            .filter(|m| !m.is_empty())
            .map(String::from);
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
            cluster_name: str_at(spec, &["clusterName"])
                .unwrap_or_default()
                .to_string(),
            owner_machine_set: owner_named(meta, "MachineSet"),
            owner_machine_pool: owner_named(meta, "MachinePool"),
            provider_id: str_at(spec, &["providerID"])
                .filter(|p| !p.is_empty())
                .map(String::from),
            node_ref_name: str_at(status, &["nodeRef", "name"])
                .filter(|n| !n.is_empty())
                .map(String::from),
            node_ref_kind: str_at(status, &["nodeRef", "kind"]).map(String::from),
            phase: str_at(status, &["phase"]).map(String::from),
            failure_message,
            deleting: meta.deletion_timestamp.is_some(),
            scale_down_finalizer: meta
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == crate::capi::scale_down::FINALIZER),
        }
    }

    /// `<namespace>/<name>`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Failed: a failure message, in any phase, as CA's in-tree provider decides
    /// (`findScalableResourceProviderIDs`): Cluster API sets `Deleting` over `Failed`, and
    /// v1beta2 Machines may carry no `Failed` phase at all. Read from v1beta1's
    /// `status.failureMessage` and v1beta2's `status.deprecated.v1beta1.failureMessage` (the
    /// in-tree provider reads only the first).
    pub fn is_failed(&self) -> bool {
        self.failure_message.is_some()
    }
}

/// A Machine as the operator caches it: decoded straight into its [`Machine`] view, so the
/// cache keeps the view and the object's name and version only. Everything else (conditions,
/// addresses, bootstrap and infrastructure references, field managers) is skipped while the
/// watch event is decoded and never held. The view is shared with the index.
#[derive(Clone, Debug)]
pub struct WatchedMachine {
    /// Name, namespace and resourceVersion (the watch resumes from the last one); labels,
    /// annotations and owners are in the view.
    pub metadata: ObjectMeta,
    /// The view.
    pub view: Arc<Machine>,
}

impl<'de> Deserialize<'de> for WatchedMachine {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The parts of a Machine the view reads. `spec` and `status` are decoded as plain
        /// JSON (a Machine's status is only as strict as its CRD schema), read, then dropped.
        #[derive(Deserialize)]
        struct Parts {
            #[serde(default)]
            metadata: ObjectMeta,
            #[serde(default)]
            spec: Value,
            #[serde(default)]
            status: Value,
        }
        let Parts {
            metadata,
            spec,
            status,
        } = Parts::deserialize(deserializer)?;
        let view = Machine::extract(&metadata, &spec, &status);
        Ok(Self {
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                resource_version: metadata.resource_version,
                ..ObjectMeta::default()
            },
            view: Arc::new(view),
        })
    }
}

/// The description of a kind ([`ApiResource`]) shared by every cached object of the kind: the
/// watch cache keys each object with it, and a shared one costs a pointer instead of five
/// strings per object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SharedApiResource(pub Arc<ApiResource>);

impl kube::Resource for WatchedMachine {
    type DynamicType = SharedApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &SharedApiResource) -> Cow<'_, str> {
        dt.0.kind.as_str().into()
    }

    fn group(dt: &SharedApiResource) -> Cow<'_, str> {
        dt.0.group.as_str().into()
    }

    fn version(dt: &SharedApiResource) -> Cow<'_, str> {
        dt.0.version.as_str().into()
    }

    fn api_version(dt: &SharedApiResource) -> Cow<'_, str> {
        dt.0.api_version.as_str().into()
    }

    fn plural(dt: &SharedApiResource) -> Cow<'_, str> {
        dt.0.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// An infrastructure machine template's scale-from-zero hints.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InfraTemplate {
    /// `status.capacity` (unparsed quantity strings).
    pub capacity: BTreeMap<String, String>,
    /// `status.nodeInfo.architecture`.
    pub architecture: Option<String>,
    /// `status.nodeInfo.operatingSystem`.
    pub operating_system: Option<String>,
}

impl InfraTemplate {
    /// Extracts the hints from a dynamic template object.
    pub fn from_dynamic(obj: &DynamicObject) -> Self {
        let data = &obj.data;
        Self {
            capacity: value_at(data, &["status", "capacity"])
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| {
                            let s = match v {
                                Value::String(s) => s.clone(),
                                Value::Number(n) => n.to_string(),
                                _ => return None,
                            };
                            Some((k.clone(), s))
                        })
                        .collect()
                })
                .unwrap_or_default(),
            architecture: str_at(data, &["status", "nodeInfo", "architecture"]).map(String::from),
            operating_system: str_at(data, &["status", "nodeInfo", "operatingSystem"])
                .map(String::from),
        }
    }
}

fn owner_named(meta: &ObjectMeta, kind: &str) -> Option<String> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == kind && !o.name.is_empty())
        .map(|o| o.name.clone())
}

fn infra_ref(v: Option<&Value>) -> Option<InfraRef> {
    let v = v?;
    let kind = str_at(v, &["kind"]).filter(|k| !k.is_empty())?.to_string();
    let name = str_at(v, &["name"]).filter(|n| !n.is_empty())?.to_string();
    let (group, version) = if let Some(group) = str_at(v, &["apiGroup"]) {
        (group.to_string(), None)
    } else {
        let api_version = str_at(v, &["apiVersion"])?;
        match api_version.split_once('/') {
            Some((g, ver)) => (g.to_string(), Some(ver.to_string())),
            None => (String::new(), Some(api_version.to_string())),
        }
    };
    Some(InfraRef {
        group,
        version,
        kind,
        name,
    })
}

fn taints(v: Option<&Value>) -> Vec<Taint> {
    v.and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    Some(Taint {
                        key: str_at(t, &["key"])?.to_string(),
                        value: str_at(t, &["value"]).unwrap_or_default().to_string(),
                        effect: str_at(t, &["effect"]).unwrap_or_default().to_string(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value at a path of object keys.
pub fn value_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    value_at(v, path).and_then(Value::as_str)
}

fn int_at(v: &Value, path: &[&str]) -> Option<i32> {
    value_at(v, path)
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
