//! Read-path benchmark at the scale DESIGN.md names: 1,000 node groups and 10,000 nodes.
//!
//! Measures the snapshot rebuild (what every watch event costs) and the read RPCs end to end
//! over real gRPC on loopback (tonic client -> our service). The upstream peer (CA's example
//! externalgrpc server wrapping the in-tree clusterapi provider) cannot be built here: the Go
//! module proxy does not serve cluster-autoscaler. Ratios against it are therefore not printed;
//! the absolute numbers are, and written to target/bench/index.json.
//! `NGO_BENCH_INDEX_ONLY=1` measures only the snapshot rebuild (for profiling with perf).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use nodegroup_operator::capi::CapiKeys;
use nodegroup_operator::capi::objects::{Machine, ScalableKind, ScalableResource};
use nodegroup_operator::index::{IndexInputs, NodeView, SnapshotHandle, build_snapshot};
use nodegroup_operator::proto::cloud_provider_client::CloudProviderClient;
use nodegroup_operator::proto::cloud_provider_server::CloudProviderServer;
use nodegroup_operator::proto::{self, ExternalGrpcNode};
use serde_json::json;

const GROUPS: usize = 1_000;
const NODES_PER_GROUP: usize = 10;

fn dynamic(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).expect("fixture")
}

fn inputs() -> IndexInputs {
    let keys = CapiKeys::default();
    let mut resources = Vec::new();
    let mut machines = Vec::new();
    let mut nodes = Vec::new();
    for g in 0..GROUPS {
        let md = format!("md-{g}");
        let ms = format!("md-{g}-ms");
        resources.push(ScalableResource::from_dynamic(
            ScalableKind::MachineDeployment,
            &dynamic(
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": md, "namespace": "ns", "annotations": {
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "20"}},
                "spec": {"clusterName": "c", "replicas": NODES_PER_GROUP}}),
            ),
            &keys,
        ));
        resources.push(ScalableResource::from_dynamic(
            ScalableKind::MachineSet,
            &dynamic(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
                "metadata": {"name": ms, "namespace": "ns", "ownerReferences": [
                    {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment", "name": md, "uid": "u"}]},
                "spec": {"clusterName": "c", "replicas": NODES_PER_GROUP}})),
            &keys,
        ));
        for n in 0..NODES_PER_GROUP {
            let pid = format!("aws:///zone/i-{g}-{n}");
            let node = format!("node-{g}-{n}");
            machines.push(Machine::from_dynamic(&dynamic(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": format!("m-{g}-{n}"), "namespace": "ns", "ownerReferences": [
                    {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": ms, "uid": "u"}]},
                "spec": {"clusterName": "c", "providerID": pid},
                "status": {"nodeRef": {"name": node}}
            }))));
            nodes.push(NodeView {
                name: node,
                provider_id: Some(pid),
                ready: true,
                ..Default::default()
            });
        }
    }
    IndexInputs {
        default_arch: "amd64".into(),
        resources,
        machines,
        nodes,
        ..Default::default()
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p) as usize]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let inputs = inputs();
    let mut builds = Vec::new();
    let mut snapshot = None;
    for _ in 0..10 {
        let start = Instant::now();
        snapshot = Some(build_snapshot(&inputs));
        builds.push(start.elapsed());
    }
    let snapshot = snapshot.expect("built");
    assert_eq!(snapshot.groups.len(), GROUPS);
    if std::env::var_os("NGO_BENCH_INDEX_ONLY").is_some() {
        println!("snapshot rebuild p50 {:?}", percentile(&mut builds, 0.5));
        return Ok(());
    }

    let mut lookups = Vec::new();
    for i in 0..100_000 {
        let pid = format!("aws:///zone/i-{}-{}", i % GROUPS, i % NODES_PER_GROUP);
        let start = Instant::now();
        std::hint::black_box(snapshot.group_for_provider_id(&pid));
        lookups.push(start.elapsed());
    }

    // Real gRPC on loopback; the actuator's client is never used by read RPCs.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse()?))?;
    let resources = nodegroup_operator::capi::resources::CapiResources {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        machine_deployments: None,
        machine_sets: kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineSet"),
            "machinesets",
        ),
        machine_pools: None,
        machines: kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"),
            "machines",
        ),
        clusters: None,
    };
    let actuator = nodegroup_operator::actuate::CapiActuator::new(
        client,
        resources,
        CapiKeys::default(),
        None,
        Arc::default(),
        "bench".into(),
    );
    let service = nodegroup_operator::server::CloudProviderService::new(
        SnapshotHandle::fixed(snapshot),
        Arc::new(actuator),
        Arc::default(),
        Default::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudProviderServer::new(service))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut grpc = CloudProviderClient::connect(format!("http://{address}")).await?;
    let mut rpc = BTreeMap::new();
    let mut for_node = Vec::new();
    for i in 0..5_000 {
        let node = ExternalGrpcNode {
            provider_id: format!("aws:///zone/i-{}-{}", i % GROUPS, i % NODES_PER_GROUP),
            ..Default::default()
        };
        let start = Instant::now();
        grpc.node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node) })
            .await?;
        for_node.push(start.elapsed());
    }
    rpc.insert("NodeGroupForNode", for_node);
    let mut target = Vec::new();
    for i in 0..5_000 {
        let start = Instant::now();
        grpc.node_group_target_size(proto::NodeGroupTargetSizeRequest {
            id: format!("MachineDeployment/ns/md-{}", i % GROUPS),
        })
        .await?;
        target.push(start.elapsed());
    }
    rpc.insert("NodeGroupTargetSize", target);
    let mut groups = Vec::new();
    for _ in 0..200 {
        let start = Instant::now();
        let response = grpc.node_groups(proto::NodeGroupsRequest {}).await?;
        assert_eq!(response.into_inner().node_groups.len(), GROUPS);
        groups.push(start.elapsed());
    }
    rpc.insert("NodeGroups (1000 groups)", groups);

    println!(
        "nodegroup-operator read path, {GROUPS} groups, {} nodes",
        GROUPS * NODES_PER_GROUP
    );
    println!(
        "upstream peer: not measured (cluster-autoscaler is not served by the Go module proxy here; no ratio)"
    );
    let build_p50 = percentile(&mut builds, 0.5);
    println!("{:<32} p50 {:>10.1?}", "snapshot rebuild", build_p50);
    let lookup_p50 = percentile(&mut lookups, 0.5);
    let lookup_p99 = percentile(&mut lookups, 0.99);
    println!(
        "{:<32} p50 {:>10.1?}  p99 {:>10.1?}",
        "in-memory providerID lookup", lookup_p50, lookup_p99
    );
    let mut results = serde_json::Map::new();
    results.insert(
        "snapshot_rebuild_p50_us".into(),
        json!(build_p50.as_secs_f64() * 1e6),
    );
    results.insert("lookup_p50_ns".into(), json!(lookup_p50.as_nanos()));
    for (name, samples) in rpc.iter_mut() {
        let (p50, p99) = (percentile(samples, 0.5), percentile(samples, 0.99));
        println!(
            "{:<32} p50 {:>10.1?}  p99 {:>10.1?}",
            format!("gRPC {name}"),
            p50,
            p99
        );
        results.insert(
            format!("grpc {name} p50_us"),
            json!(p50.as_secs_f64() * 1e6),
        );
        results.insert(
            format!("grpc {name} p99_us"),
            json!(p99.as_secs_f64() * 1e6),
        );
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_string_pretty(&serde_json::Value::Object(results))?,
    )?;
    Ok(())
}
