#![no_main]
//! Decodes arbitrary bytes as each request message of `proto/externalgrpc.proto` (the first
//! byte picks the message) and as the `k8s.io/api/core/v1.Pod` that PricingPodPrice carries,
//! then runs the parts of request handling that need no cluster, against a fixed snapshot:
//! group lookups by id and provider ID (raw, normalized and synthetic), the wire conversions,
//! pricing windows and prices, option merging, template nodes and their encoding, and the
//! annotation parsers applied to the maps a node carries. Any panic is a finding.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use nodegroup_operator::ngo_index::capi::annotations::{self, OptionOverrides};
use nodegroup_operator::ngo_index::capi::objects::{InfraRef, Machine, Selector};
use nodegroup_operator::ngo_index::capi::{CapiKeys, ScalableKind, ScalableResource, providerid};
use nodegroup_operator::ngo_index::index::{
    ClusterKey, IndexInputs, NodeGroupLookup, NodeView, PolicyRef, PolicyRules, PriceList,
    Snapshot, build_snapshot,
};
use nodegroup_operator::ngo_index::template;
use nodegroup_operator::ngo_service::pricing;
use nodegroup_operator::ngo_service::server::{convert, options};
use nodegroup_operator::ngo_service::proto::{self, ExternalGrpcNode};
use prost::Message;

const NAMESPACE: &str = "ns";

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn machine(name: &str, provider_id: Option<&str>, node: Option<&str>) -> Machine {
    Machine {
        namespace: NAMESPACE.into(),
        name: name.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        cluster_name: "c1".into(),
        owner_machine_set: Some("md-ms".into()),
        owner_machine_pool: None,
        provider_id: provider_id.map(String::from),
        node_ref_name: node.map(String::from),
        node_ref_kind: None,
        phase: None,
        failure_message: None,
        deleting: false,
        scale_down_finalizer: false,
    }
}

fn resource(
    kind: ScalableKind,
    name: &str,
    annotations: BTreeMap<String, String>,
    owner: Option<&str>,
) -> ScalableResource {
    ScalableResource {
        kind,
        namespace: NAMESPACE.into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        creation_timestamp: None,
        labels: BTreeMap::from([("pool".to_string(), "general".to_string())]),
        annotations,
        replicas: Some(2),
        status_replicas: Some(2),
        status_ready_replicas: Some(1),
        selector: None,
        cluster_name: "c1".into(),
        owner_machine_deployment: owner.map(String::from),
        infra_ref: Some(InfraRef {
            group: "infrastructure.cluster.x-k8s.io".into(),
            version: None,
            kind: "TestMachineTemplate".into(),
            name: "tpl".into(),
        }),
        template_labels: BTreeMap::new(),
        template_taints: Vec::new(),
        provider_id_list: (kind == ScalableKind::MachinePool)
            .then(|| vec!["aws:///zone/i-pool-0".to_string()]),
        deleting: false,
        pool: None,
    }
}

/// Two annotated groups (one with a policy's prices), a pool, running and pending machines,
/// and nodes, so lookups can hit every branch.
fn snapshot() -> &'static Snapshot {
    static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let keys = CapiKeys::default();
        let md_annotations = annotations(&[
            (&keys.min_size, "0"),
            (&keys.max_size, "5"),
            ("capacity.cluster-autoscaler.kubernetes.io/cpu", "4"),
            ("capacity.cluster-autoscaler.kubernetes.io/memory", "16Gi"),
            (
                "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
                "nvidia.com/gpu",
            ),
            ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "1"),
            (
                "capacity.cluster-autoscaler.kubernetes.io/labels",
                "pool=a,foo",
            ),
            (
                "capacity.cluster-autoscaler.kubernetes.io/taints",
                "a=b:NoSchedule",
            ),
            (
                "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
                "5m",
            ),
        ]);
        let inputs = IndexInputs {
            keys: keys.clone(),
            default_arch: "amd64".into(),
            resources: vec![
                resource(ScalableKind::MachineDeployment, "md", md_annotations, None),
                resource(
                    ScalableKind::MachineSet,
                    "md-ms",
                    BTreeMap::new(),
                    Some("md"),
                ),
                resource(
                    ScalableKind::MachinePool,
                    "pool",
                    annotations(&[(&keys.max_size, "3")]),
                    None,
                ),
            ],
            machines: vec![
                machine("m0", Some("aws:///zone/i-0"), Some("node-0")).into(),
                machine("m1", None, None).into(),
                machine("m2", Some("aws:///other/i-0"), Some("node-0")).into(),
            ],
            nodes: vec![
                NodeView {
                    name: "node-0".into(),
                    provider_id: Some("aws:///zone/i-0".into()),
                    ready: true,
                    ..Default::default()
                }
                .into(),
            ],
            policies: vec![PolicyRules {
                reference: PolicyRef {
                    namespace: NAMESPACE.into(),
                    name: "p".into(),
                    uid: "uid-p".into(),
                },
                created: "2026-01-01T00:00:00Z".into(),
                kinds: vec![ScalableKind::MachinePool],
                selector: Selector::default(),
                pricing: Some(PriceList {
                    node: None,
                    cpu_core: Some(0.04),
                    memory_gib: Some(0.005),
                    gpu: Some(1.0),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        build_snapshot(&inputs)
    })
}

fn prices() -> PriceList {
    PriceList {
        node: Some(0.2),
        cpu_core: Some(0.04),
        memory_gib: Some(0.005),
        gpu: Some(1.0),
    }
}

/// What NodeGroupForNode, PricingNodePrice and DeleteNodes do with a node, plus the annotation
/// parsers over its maps.
fn node(snapshot: &Snapshot, node: &ExternalGrpcNode) {
    let normalized = providerid::normalize(&node.provider_id);
    assert!(node.provider_id.ends_with(normalized));
    if let Some(id) = providerid::parse_synthetic(&node.provider_id) {
        assert_eq!(
            providerid::synthetic_id(id.kind, id.namespace, id.name),
            node.provider_id
        );
    }
    let cluster = ClusterKey {
        namespace: NAMESPACE.into(),
        name: "c1".into(),
    };
    for scope in [None, Some(&cluster)] {
        if let NodeGroupLookup::Group(g) = snapshot.group_for_provider_id(&node.provider_id, scope)
        {
            let _ = convert::node_group(&g);
            let _ = pricing::node_hourly(&g);
        }
    }
    let _ = snapshot.machine_for_provider_id(&node.provider_id, &cluster);
    let keys = CapiKeys::default();
    for map in [&node.annotations, &node.labels] {
        let map: BTreeMap<String, String> =
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let _ = annotations::parse_bounds(&map, &keys);
        let _ = annotations::parse_options(&map, &keys);
        let _ = annotations::parse_capacity(&map);
    }
}

/// What the id-based RPCs do with a group id.
fn group(snapshot: &Snapshot, id: &str) {
    let Some(g) = snapshot.group(id) else {
        return;
    };
    let _ = convert::node_group(g);
    let _ = g.instances.iter().map(convert::instance).count();
    if let Some(inputs) = &g.template {
        let node = template::build_node(&g.name, inputs, 0);
        let bytes = template::encode_node(&node);
        let decoded =
            k8s_pb::api::core::v1::Node::decode(bytes.as_slice()).expect("a template node decodes");
        assert_eq!(decoded, node);
    }
}

fn pod_price(pod_bytes: &[u8]) {
    if let Ok(pod) = k8s_pb::api::core::v1::Pod::decode(pod_bytes) {
        let requests = pricing::pod_requests(&pod);
        assert!(requests.values().all(|v| v.is_finite()));
        let _ = pricing::pod_hourly(&pod, &prices());
    }
}

fn get_options(snapshot: &Snapshot, request: &proto::NodeGroupAutoscalingOptionsRequest) {
    let Some(defaults) = &request.defaults else {
        return;
    };
    let overrides = snapshot
        .group(&request.id)
        .map(|g| g.options.clone())
        .unwrap_or_else(|| OptionOverrides {
            scale_down_utilization_threshold: Some(0.3),
            scale_down_unneeded_time: Some(std::time::Duration::MAX),
            ..Default::default()
        });
    let receivable = options::receivable(defaults, &overrides);
    let _ = options::merge(defaults, &receivable);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else {
        return;
    };
    let snapshot = snapshot();
    match selector % 16 {
        0 => {
            let _ = proto::NodeGroupsRequest::decode(bytes);
            for g in snapshot.groups.values() {
                let _ = convert::node_group(g);
            }
        }
        1 => {
            if let Ok(r) = proto::NodeGroupForNodeRequest::decode(bytes) {
                if let Some(n) = &r.node {
                    node(snapshot, n);
                }
            }
        }
        2 => {
            if let Ok(r) = proto::PricingNodePriceRequest::decode(bytes) {
                let _ = pricing::window_hours(
                    &r.start_timestamp,
                    &r.end_timestamp,
                    &r.start_time,
                    &r.end_time,
                );
                if let Some(n) = &r.node {
                    node(snapshot, n);
                }
            }
        }
        3 => {
            if let Ok(r) = proto::PricingPodPriceRequest::decode(bytes) {
                if let Ok(hours) = pricing::window_hours(
                    &r.start_timestamp,
                    &r.end_timestamp,
                    &r.start_time,
                    &r.end_time,
                ) {
                    assert!(hours.is_finite() && hours >= 0.0);
                }
                pod_price(if r.pod_bytes.is_empty() {
                    &r.pod
                } else {
                    &r.pod_bytes
                });
                let _ = pricing::cheapest_resource_prices(snapshot.groups.values());
            }
        }
        4 => pod_price(bytes),
        5 => {
            let _ = proto::GpuLabelRequest::decode(bytes);
            let _ = proto::GetAvailableGpuTypesRequest::decode(bytes);
            let _ = proto::CleanupRequest::decode(bytes);
            let _ = proto::RefreshRequest::decode(bytes);
        }
        6 => {
            if let Ok(r) = proto::NodeGroupTargetSizeRequest::decode(bytes) {
                group(snapshot, &r.id);
            }
        }
        7 => {
            if let Ok(r) = proto::NodeGroupIncreaseSizeRequest::decode(bytes) {
                group(snapshot, &r.id);
                let _ = r.delta.checked_add(2);
            }
        }
        8 => {
            if let Ok(r) = proto::NodeGroupDeleteNodesRequest::decode(bytes) {
                group(snapshot, &r.id);
                for n in &r.nodes {
                    node(snapshot, n);
                }
            }
        }
        9 => {
            if let Ok(r) = proto::NodeGroupDecreaseTargetSizeRequest::decode(bytes) {
                group(snapshot, &r.id);
            }
        }
        10 => {
            if let Ok(r) = proto::NodeGroupNodesRequest::decode(bytes) {
                group(snapshot, &r.id);
            }
        }
        11 => {
            if let Ok(r) = proto::NodeGroupTemplateNodeInfoRequest::decode(bytes) {
                group(snapshot, &r.id);
            }
        }
        12 => {
            if let Ok(r) = proto::NodeGroupAutoscalingOptionsRequest::decode(bytes) {
                get_options(snapshot, &r);
            }
        }
        13 => {
            // Lookups with the raw bytes as an id or provider ID.
            if let Ok(s) = std::str::from_utf8(bytes) {
                group(snapshot, s);
                node(
                    snapshot,
                    &ExternalGrpcNode {
                        provider_id: s.into(),
                        ..Default::default()
                    },
                );
            }
        }
        _ => {
            // Response messages a client decodes, for symmetry with CA's side.
            let _ = proto::NodeGroupTemplateNodeInfoResponse::decode(bytes);
            let _ = proto::NodeGroupAutoscalingOptionsResponse::decode(bytes);
        }
    }
});
