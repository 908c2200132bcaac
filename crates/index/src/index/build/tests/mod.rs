//! Scenario tests for the snapshot builder (mirrors upstream's provider checklist), by what
//! they pin: which resources are groups (`groups.rs`), scale from zero (`templates.rs`),
//! machines as instances and Nodes as members (`instances.rs`), and workload clusters and
//! their tenants (`clusters.rs`). This file holds the objects they are built from.

mod clusters;
mod groups;
mod instances;
mod templates;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::capi::CapiKeys;
use crate::capi::objects::{InfraTemplate, Machine, ScalableKind, ScalableResource};
use crate::index::{
    ClusterKey, ExclusionReason, IndexInputs, InstanceState, NodeGroupLookup, NodeView,
    TemplateKey, TemplateKindState, WorkloadState,
};

pub(super) const MIN: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";

pub(super) const MAX: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";

pub(super) fn dynamic(v: Value) -> kube::core::DynamicObject {
    serde_json::from_value(v).unwrap()
}

pub(super) fn resource(
    kind: ScalableKind,
    name: &str,
    annotations: Value,
    replicas: Option<i32>,
    owner_md: Option<&str>,
) -> ScalableResource {
    let mut meta = json!({"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "annotations": annotations});
    if let Some(md) = owner_md {
        meta["ownerReferences"] = json!([{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "name": md, "uid": "x"}]);
    }
    let mut spec = json!({"clusterName": "c1", "selector": {"matchLabels": {"set": name}}});
    if let Some(r) = replicas {
        spec["replicas"] = json!(r);
    }
    let obj = dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": kind.as_str(), "metadata": meta, "spec": spec}),
    );
    ScalableResource::from_dynamic(kind, &obj, &CapiKeys::default())
}

pub(super) fn bounds(min: &str, max: &str) -> Value {
    json!({MIN: min, MAX: max})
}

pub(super) fn machine(
    name: &str,
    owner_ms: &str,
    provider_id: Option<&str>,
    node_ref: Option<&str>,
    status_extra: Value,
    deleting: bool,
) -> Machine {
    let mut meta = json!({"name": name, "namespace": "ns",
        "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": owner_ms, "uid": "y"}]});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        meta["finalizers"] = json!(["x"]);
    }
    let mut status = status_extra;
    if let Some(n) = node_ref {
        status["nodeRef"] = json!({"name": n});
    }
    let mut spec = json!({"clusterName": "c1"});
    if let Some(p) = provider_id {
        spec["providerID"] = json!(p);
    }
    Machine::from_dynamic(&dynamic(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "metadata": meta, "spec": spec, "status": status}),
    ))
}

pub(super) fn node(name: &str, provider_id: &str, ready: bool) -> NodeView {
    NodeView {
        name: name.into(),
        provider_id: Some(provider_id.into()),
        ready,
        ..Default::default()
    }
}

pub(super) fn inputs(
    resources: Vec<ScalableResource>,
    machines: Vec<Machine>,
    nodes: Vec<NodeView>,
) -> IndexInputs {
    IndexInputs {
        default_arch: "amd64".into(),
        resources,
        machines: machines.into_iter().map(Arc::new).collect(),
        nodes: nodes.into_iter().map(Arc::new).collect(),
        ..Default::default()
    }
}

/// A MachineDeployment `md` with MachineSet `md-ms` and `n` running machines with nodes.
pub(super) fn deployment(n: usize, annotations: Value, replicas: i32) -> IndexInputs {
    let md = resource(
        ScalableKind::MachineDeployment,
        "md",
        annotations,
        Some(replicas),
        None,
    );
    let ms = resource(
        ScalableKind::MachineSet,
        "md-ms",
        json!({}),
        Some(replicas),
        Some("md"),
    );
    let machines = (0..n)
        .map(|i| {
            machine(
                &format!("m{i}"),
                "md-ms",
                Some(&format!("test:////node-{i}")),
                Some(&format!("node-{i}")),
                json!({}),
                false,
            )
        })
        .collect();
    let nodes = (0..n)
        .map(|i| node(&format!("node-{i}"), &format!("test:////node-{i}"), true))
        .collect();
    inputs(vec![md, ms], machines, nodes)
}

pub(super) fn cluster(name: &str) -> ClusterKey {
    ClusterKey {
        namespace: "ns".into(),
        name: name.into(),
    }
}
