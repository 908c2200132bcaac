//! Tenant scoping, RPC by RPC: the service behind real mTLS on loopback, its snapshot built
//! from the objects of five tenants, each caller presenting the client certificate of one
//! scenario. Every RPC x scenario gets the exact code, and no message names anything of
//! another tenant: another cluster's group or node is answered exactly as one that does not
//! exist.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ngo_testbed::pki::{CertificateAuthority, IssuedCert};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::CloudProviderService;
use super::identity::{DEFAULT_PREFIX, IdentitySource};
use super::rate_limit::RateLimit;
use super::tls::{self, ReloadingTls, TlsFiles};
use crate::actuate::CapiActuator;
use crate::discovery::CapiResources;
use crate::proto::{self, cloud_provider_client::CloudProviderClient};
use ngo_index::capi::keys::CapiKeys;
use ngo_index::capi::objects::{Machine, ScalableKind, ScalableResource};
use ngo_index::index::PriceList;
use ngo_index::index::{
    ClusterKey, IndexInputs, NodeView, Snapshot, SnapshotHandle, WorkloadState,
};

/// Every tenant: namespace, Cluster name, and the first letter of its objects' names.
/// `alpha` is the caller's own Cluster, `bravo` another tenant's; `delta` is being deleted,
/// `november`'s Nodes are being listed for the first time, `charlie` has no connection yet.
const TENANTS: [(&str, &str); 5] = [
    ("tenant-a", "alpha"),
    ("tenant-b", "bravo"),
    ("tenant-d", "delta"),
    ("tenant-n", "november"),
    ("tenant-c", "charlie"),
];

/// The synthetic instance id of `bravo`'s Machine without a Node, and one of no Machine.
const FOREIGN_MACHINE: &str = "pending-machine-tenant-b_bravo-m2";
const UNKNOWN_MACHINE: &str = "pending-machine-tenant-z_zulu-m2";

/// Strings of the other tenants that no answer to an `alpha` caller may contain (their
/// Cluster, Machine, Node and GPU type names; no request of the matrix carries them).
const BRAVO_SECRETS: [&str; 4] = ["bravo", "bravo-m1", "bravo-n1", "bravo-gpu"];

/// Cluster API v1beta2 as discovery would find it.
fn capi_resources() -> CapiResources {
    use kube::api::{ApiResource, GroupVersionKind};
    let resource = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
            plural,
        )
    };
    CapiResources {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        machine_deployments: Some(resource("MachineDeployment", "machinedeployments")),
        machine_sets: resource("MachineSet", "machinesets"),
        machine_pools: Some(resource("MachinePool", "machinepools")),
        machines: resource("Machine", "machines"),
        clusters: Some(resource("Cluster", "clusters")),
    }
}

fn group_id(namespace: &str) -> String {
    format!("MachineSet/{namespace}/workers")
}

/// A provider ID per Cluster (matching uses the last segment, as upstream: they differ there)
/// that does not spell the Cluster's name.
fn provider_id(cluster: &str) -> String {
    let n = ["alpha", "bravo", "delta", "november", "charlie"]
        .iter()
        .position(|c| *c == cluster)
        .map_or(999, |i| 101 * (i + 1));
    format!("test:///zone/i-{n}")
}

fn dynamic(v: Value) -> kube::api::DynamicObject {
    serde_json::from_value(v).expect("object")
}

/// Each tenant's MachineSet `workers` (GPU type `<cluster>-gpu`) with one Machine
/// `<cluster>-m1` on `test:///<cluster>/i-1`, and `bravo`'s copy of `alpha`'s provider ID.
fn inputs() -> IndexInputs {
    let keys = CapiKeys::default();
    let mut inputs = IndexInputs {
        default_arch: "amd64".into(),
        ..Default::default()
    };
    let mut workload = BTreeMap::new();
    for (namespace, cluster) in TENANTS {
        let set = dynamic(
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet",
            "metadata": {"name": "workers", "namespace": namespace, "uid": format!("uid-{cluster}"),
                "annotations": {
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5",
                    "capacity.cluster-autoscaler.kubernetes.io/cpu": "2",
                    "capacity.cluster-autoscaler.kubernetes.io/memory": "4Gi",
                    "capacity.cluster-autoscaler.kubernetes.io/gpu-type": format!("{cluster}-gpu"),
                    "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "1"}},
            "spec": {"clusterName": cluster, "replicas": 1}}),
        );
        inputs.resources.push(ScalableResource::from_dynamic(
            ScalableKind::MachineSet,
            &set,
            &keys,
        ));
        let mut machines = vec![(format!("{cluster}-m1"), provider_id(cluster))];
        if cluster == "bravo" {
            machines.push(("bravo-m2".into(), provider_id("alpha")));
        }
        for (name, pid) in machines {
            let machine = dynamic(
                json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": name, "namespace": namespace, "ownerReferences": [
                    {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "workers", "uid": "x"}]},
                "spec": {"clusterName": cluster, "providerID": pid}}),
            );
            inputs
                .machines
                .push(Arc::new(Machine::from_dynamic(&machine)));
        }
        let key = ClusterKey {
            namespace: namespace.into(),
            name: cluster.into(),
        };
        inputs.nodes.push(Arc::new(NodeView {
            name: format!("{cluster}-n1"),
            provider_id: Some(provider_id(cluster)),
            ready: true,
            cluster: Some(key.clone()),
            ..Default::default()
        }));
        match cluster {
            "november" => {
                workload.insert(key.clone(), WorkloadState::Syncing);
            }
            "charlie" => {}
            _ => {
                workload.insert(key.clone(), WorkloadState::Synced);
            }
        }
        if cluster == "delta" {
            inputs.deleting_clusters.push(key.clone());
        }
        inputs.clusters.push(key);
    }
    inputs.workload = Some(workload);
    inputs
}

/// The snapshot of [`inputs`], with per-resource prices: `bravo`'s are the cheaper ones.
fn snapshot() -> Snapshot {
    let mut snapshot = ngo_index::index::build_snapshot(&inputs());
    for (id, group) in snapshot.groups.iter_mut() {
        let cpu_core = if id.contains("tenant-b") { 0.01 } else { 1.0 };
        Arc::make_mut(group).pricing = Some(PriceList {
            node: None,
            cpu_core: Some(cpu_core),
            memory_gib: None,
            gpu: None,
        });
    }
    snapshot
}

/// The operator's gRPC endpoint with client identity from URI SANs, serving [`snapshot`];
/// its Kubernetes client points at a closed port, so a mutation that passes every check ends
/// at the API server it cannot reach.
struct Endpoint {
    address: SocketAddr,
    ca: CertificateAuthority,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Endpoint {
    async fn start() -> Self {
        Self::serving(snapshot()).await
    }

    async fn serving(snapshot: Snapshot) -> Self {
        Self::serving_with(snapshot, None).await
    }

    /// [`Endpoint::serving`] with each Cluster's request budget `limit`.
    async fn serving_with(snapshot: Snapshot, limit: Option<RateLimit>) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = CertificateAuthority::new("scoping-ca").expect("ca");
        let server = ca
            .issue("operator", &["localhost", "127.0.0.1"], None)
            .expect("server cert");
        let (cert, key) = server.write(dir.path(), "server").expect("write");
        let client_ca = dir.path().join("ca.crt");
        ca.write_cert(&client_ca).expect("write ca");
        let tls = ReloadingTls::load(TlsFiles {
            cert,
            key,
            client_ca,
        })
        .expect("tls");

        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let unreachable = format!("http://{}", closed.local_addr().expect("addr"));
        drop(closed);
        let config = kube::Config::new(unreachable.parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let actuator = CapiActuator::new(
            client,
            capi_resources(),
            CapiKeys::default(),
            None,
            Arc::default(),
            "scoping".into(),
        );
        let service = CloudProviderService::new(
            SnapshotHandle::fixed(snapshot),
            Arc::new(actuator),
            Arc::default(),
            Default::default(),
        )
        .scoped(IdentitySource::UriSan {
            prefix: DEFAULT_PREFIX.into(),
        });
        let service = match limit {
            Some(limit) => service.rate_limited(limit),
            None => service,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let incoming = tls::incoming(listener, tls, shutdown.clone());
        let serve = tonic::transport::Server::builder()
            .add_service(proto::cloud_provider_server::CloudProviderServer::new(
                service,
            ))
            .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned());
        tokio::spawn(serve);
        Self {
            address,
            ca,
            _dir: dir,
            shutdown,
        }
    }

    async fn client(&self, cert: &IssuedCert) -> CloudProviderClient<Channel> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.cert_pem))
            .identity(Identity::from_pem(&cert.cert_pem, &cert.key_pem))
            .domain_name("localhost");
        let channel = Channel::from_shared(format!("https://{}", self.address))
            .expect("uri")
            .tls_config(tls)
            .expect("tls")
            .connect()
            .await
            .expect("connect");
        CloudProviderClient::new(channel)
    }

    /// A client certificate naming Cluster `namespace/name`.
    fn naming(&self, namespace: &str, name: &str) -> IssuedCert {
        self.ca
            .issue_client(
                "cluster-autoscaler",
                &[&format!("spiffe://{DEFAULT_PREFIX}{namespace}/{name}")],
            )
            .expect("client cert")
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One column of the matrix: who calls, with which group id and node provider ID.
struct Scenario {
    name: &'static str,
    caller: IssuedCert,
    group: String,
    node: String,
}

/// The node group id a node of `provider_id` claims in the annotation this operator puts on
/// template nodes: the group that owns it, or (unknown node) one that does not exist.
fn annotated_group(provider_id: &str) -> String {
    let owner = TENANTS
        .iter()
        .find(|(_, cluster)| self::provider_id(cluster) == provider_id)
        .map_or("tenant-z", |(namespace, _)| namespace);
    group_id(owner)
}

const RPCS: [&str; 15] = [
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
];

/// What an RPC answered: its code and message, or on success a summary of what it returned.
#[derive(Clone, Debug, PartialEq)]
struct Answer {
    code: Code,
    text: String,
}

fn hour(h: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: 1_700_000_000 + h * 3600,
        nanos: 0,
    })
}

/// A pod requesting one core.
fn pod_bytes() -> Vec<u8> {
    use k8s_pb::api::core::v1 as pb;
    let pod = pb::Pod {
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                resources: Some(pb::ResourceRequirements {
                    requests: BTreeMap::from([(
                        "cpu".to_string(),
                        k8s_pb::apimachinery::pkg::api::resource::Quantity {
                            string: Some("1".into()),
                        },
                    )]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    prost::Message::encode_to_vec(&pod)
}

async fn call(client: &mut CloudProviderClient<Channel>, rpc: &str, s: &Scenario) -> Answer {
    let node = || proto::ExternalGrpcNode {
        provider_id: s.node.clone(),
        annotations: [(
            super::service::TEMPLATE_GROUP_ANNOTATION.to_string(),
            annotated_group(&s.node),
        )]
        .into(),
        ..Default::default()
    };
    let id = s.group.clone();
    let ok = |text: String| Ok::<String, tonic::Status>(text);
    let result = match rpc {
        "NodeGroups" => client
            .node_groups(proto::NodeGroupsRequest {})
            .await
            .and_then(|r| {
                let ids: Vec<String> = r
                    .into_inner()
                    .node_groups
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
                ok(ids.join(","))
            }),
        "NodeGroupForNode" => client
            .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node()) })
            .await
            .and_then(|r| ok(r.into_inner().node_group.unwrap_or_default().id)),
        "PricingNodePrice" => client
            .pricing_node_price(proto::PricingNodePriceRequest {
                node: Some(node()),
                start_timestamp: hour(0),
                end_timestamp: hour(1),
                ..Default::default()
            })
            .await
            .and_then(|r| ok(r.into_inner().price.to_string())),
        "PricingPodPrice" => client
            .pricing_pod_price(proto::PricingPodPriceRequest {
                pod_bytes: pod_bytes(),
                start_timestamp: hour(0),
                end_timestamp: hour(1),
                ..Default::default()
            })
            .await
            .and_then(|r| ok(r.into_inner().price.to_string())),
        "GPULabel" => client
            .gpu_label(proto::GpuLabelRequest {})
            .await
            .and_then(|r| ok(r.into_inner().label)),
        "GetAvailableGPUTypes" => client
            .get_available_gpu_types(proto::GetAvailableGpuTypesRequest {})
            .await
            .and_then(|r| {
                let types: Vec<String> = r.into_inner().gpu_types.into_keys().collect();
                ok(types.join(","))
            }),
        "Cleanup" => client
            .cleanup(proto::CleanupRequest {})
            .await
            .and_then(|_| ok(String::new())),
        "Refresh" => client
            .refresh(proto::RefreshRequest {})
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupTargetSize" => client
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
            .await
            .and_then(|r| ok(r.into_inner().target_size.to_string())),
        "NodeGroupIncreaseSize" => client
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest { id, delta: 1 })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupDeleteNodes" => client
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id,
                nodes: vec![node()],
            })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupDecreaseTargetSize" => client
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id,
                delta: -1,
            })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupNodes" => client
            .node_group_nodes(proto::NodeGroupNodesRequest { id })
            .await
            .and_then(|r| {
                let ids: Vec<String> = r.into_inner().instances.into_iter().map(|i| i.id).collect();
                ok(ids.join(","))
            }),
        "NodeGroupTemplateNodeInfo" => client
            .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id })
            .await
            .and_then(|r| ok(format!("{} bytes", r.into_inner().node_bytes.len()))),
        "NodeGroupGetOptions" => client
            .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                id,
                defaults: Some(Default::default()),
            })
            .await
            .and_then(|_| ok(String::new())),
        other => panic!("no RPC {other}"),
    };
    match result {
        Ok(text) => Answer {
            code: Code::Ok,
            text,
        },
        Err(status) => Answer {
            code: status.code(),
            text: status.message().to_string(),
        },
    }
}

/// The expected code of `rpc` in scenario `scenario`.
fn expected(scenario: &str, rpc: &str) -> Code {
    let names_group =
        rpc.starts_with("NodeGroup") && rpc != "NodeGroups" && rpc != "NodeGroupForNode";
    match scenario {
        "unknown cluster" | "no identity" => Code::PermissionDenied,
        "cluster deleting" | "cluster not synced" | "cluster not connected" => Code::Unavailable,
        "another cluster's group" | "unknown group" if names_group => Code::NotFound,
        "another cluster's node"
        | "unknown node"
        | "another cluster's machine"
        | "unknown machine"
            if rpc == "NodeGroupDeleteNodes" =>
        {
            Code::NotFound
        }
        "another cluster's group"
        | "unknown group"
        | "another cluster's node"
        | "unknown node"
        | "another cluster's machine"
        | "unknown machine"
            if rpc == "PricingNodePrice" =>
        {
            Code::Unimplemented
        }
        _ => match rpc {
            // Past every check, the mutation reaches the API server, which this test has not.
            "NodeGroupIncreaseSize" | "NodeGroupDeleteNodes" | "NodeGroupDecreaseTargetSize" => {
                Code::Unavailable
            }
            // The group has no option overrides.
            "NodeGroupGetOptions" => Code::Unimplemented,
            _ => Code::Ok,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoping_matrix_every_rpc_in_every_scenario() {
    let endpoint = Endpoint::start().await;
    let own = endpoint.naming("tenant-a", "alpha");
    let scenario = |name, caller: &IssuedCert, group: String, node: String| Scenario {
        name,
        caller: caller.clone(),
        group,
        node,
    };
    let scenarios = [
        scenario("own", &own, group_id("tenant-a"), provider_id("alpha")),
        scenario(
            "another cluster's group",
            &own,
            group_id("tenant-b"),
            provider_id("bravo"),
        ),
        scenario(
            "another cluster's node",
            &own,
            group_id("tenant-a"),
            provider_id("bravo"),
        ),
        scenario(
            "unknown cluster",
            &endpoint.naming("tenant-x", "xray"),
            group_id("tenant-a"),
            provider_id("alpha"),
        ),
        scenario(
            "no identity",
            &endpoint
                .ca
                .issue_client("cluster-autoscaler", &["https://example.com/ca"])
                .expect("cert"),
            group_id("tenant-a"),
            provider_id("alpha"),
        ),
        scenario(
            "cluster deleting",
            &endpoint.naming("tenant-d", "delta"),
            group_id("tenant-d"),
            provider_id("delta"),
        ),
        scenario(
            "cluster not synced",
            &endpoint.naming("tenant-n", "november"),
            group_id("tenant-n"),
            provider_id("november"),
        ),
        scenario(
            "cluster not connected",
            &endpoint.naming("tenant-c", "charlie"),
            group_id("tenant-c"),
            provider_id("charlie"),
        ),
        // What another tenant's objects must be indistinguishable from.
        scenario(
            "unknown group",
            &own,
            group_id("tenant-z"),
            provider_id("zulu"),
        ),
        scenario(
            "unknown node",
            &own,
            group_id("tenant-a"),
            provider_id("zulu"),
        ),
        // A synthetic instance id names a Machine: another cluster's must be unknown too.
        scenario(
            "another cluster's machine",
            &own,
            group_id("tenant-a"),
            FOREIGN_MACHINE.into(),
        ),
        scenario(
            "unknown machine",
            &own,
            group_id("tenant-a"),
            UNKNOWN_MACHINE.into(),
        ),
    ];
    let mut answers: BTreeMap<(&str, &str), Answer> = BTreeMap::new();
    let mut wrong = Vec::new();
    for s in &scenarios {
        let mut client = endpoint.client(&s.caller).await;
        for rpc in RPCS {
            let answer = call(&mut client, rpc, s).await;
            let want = expected(s.name, rpc);
            if answer.code != want {
                wrong.push(format!("{rpc} / {}: want {want:?}, got {answer:?}", s.name));
            }
            // What the request itself carried may be echoed; nothing else of bravo.
            let unechoed = answer.text.replace(&s.node, "").replace(&s.group, "");
            if let Some(secret) = BRAVO_SECRETS.iter().find(|x| unechoed.contains(*x)) {
                wrong.push(format!(
                    "{rpc} / {}: the answer names {secret:?}: {}",
                    s.name, answer.text
                ));
            }
            answers.insert((s.name, rpc), answer);
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));

    // Another tenant's group or node is answered as one that does not exist.
    let anonymous = |a: &Answer| {
        let mut text = a.text.clone();
        for (foreign, unknown) in [
            (group_id("tenant-b"), group_id("tenant-z")),
            (provider_id("bravo"), provider_id("zulu")),
            (FOREIGN_MACHINE.into(), UNKNOWN_MACHINE.into()),
        ] {
            text = text.replace(&foreign, &unknown);
        }
        (a.code, text)
    };
    for rpc in RPCS {
        for (foreign, unknown) in [
            ("another cluster's group", "unknown group"),
            ("another cluster's node", "unknown node"),
            ("another cluster's machine", "unknown machine"),
        ] {
            let (a, b) = (&answers[&(foreign, rpc)], &answers[&(unknown, rpc)]);
            assert_eq!(anonymous(a), anonymous(b), "{rpc}: {foreign} / {unknown}");
        }
    }

    // What the own Cluster's caller sees is its own, and all of it.
    let own_answer = |rpc| answers[&("own", rpc)].text.clone();
    assert_eq!(own_answer("NodeGroups"), group_id("tenant-a"));
    assert_eq!(
        own_answer("NodeGroupForNode"),
        group_id("tenant-a"),
        "bravo's Machine with alpha's provider ID neither hides nor takes alpha's node"
    );
    assert_eq!(own_answer("NodeGroupNodes"), provider_id("alpha"));
    assert_eq!(own_answer("GetAvailableGPUTypes"), "alpha-gpu");
    assert_eq!(own_answer("NodeGroupTargetSize"), "1");
    assert_eq!(
        own_answer("PricingPodPrice"),
        "1",
        "one core at alpha's price, not bravo's cheaper one"
    );
    assert_eq!(
        own_answer("PricingNodePrice"),
        "2",
        "two cores at alpha's price"
    );
    assert_eq!(
        answers[&("another cluster's node", "NodeGroupForNode")].text,
        ""
    );
    for rpc in [
        "NodeGroupIncreaseSize",
        "NodeGroupDeleteNodes",
        "NodeGroupDecreaseTargetSize",
    ] {
        assert!(
            own_answer(rpc).contains("could not reach the Kubernetes API server"),
            "{rpc} passed every check: {}",
            own_answer(rpc)
        );
    }
    for (scenario, cluster) in [
        ("cluster deleting", "tenant-d/delta"),
        ("cluster not synced", "tenant-n/november"),
        ("cluster not connected", "tenant-c/charlie"),
        ("unknown cluster", "tenant-x/xray"),
    ] {
        let text = &answers[&(scenario, "Refresh")].text;
        assert!(text.contains(cluster), "{scenario}: {text}");
    }
}

/// An answer too large for cluster-autoscaler's client names how many groups the caller's
/// Cluster has, and nothing of the others' (it counted every tenant's groups).
#[tokio::test]
async fn a_too_large_answer_counts_the_callers_groups_only() {
    let mut snapshot = snapshot();
    let template = |tenant: &str| {
        snapshot
            .groups
            .values()
            .find(|g| g.id.contains(tenant))
            .cloned()
            .expect("the tenant's group")
    };
    let (alpha, bravo) = (template("tenant-a"), template("tenant-b"));
    let padding = "p".repeat(200);
    for k in 0..20_000 {
        for (group, tenant) in [(&alpha, "tenant-a"), (&bravo, "tenant-b")] {
            let mut copy = (**group).clone();
            copy.id = format!("MachineSet/{tenant}/w{k}-{padding}");
            snapshot.groups.insert(copy.id.clone(), Arc::new(copy));
        }
    }
    let endpoint = Endpoint::serving(snapshot).await;
    let mut client = endpoint.client(&endpoint.naming("tenant-a", "alpha")).await;
    let status = client
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .expect_err("more than cluster-autoscaler's client accepts");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("the caller's Cluster has 20001 node groups"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_request_budget_is_refused_and_another_is_served_as_before() {
    let limit = RateLimit {
        per_second: 20.0,
        burst: 40.0,
    };
    let endpoint = Endpoint::serving_with(snapshot(), Some(limit)).await;
    let alpha = endpoint.client(&endpoint.naming("tenant-a", "alpha")).await;
    let bravo = endpoint.client(&endpoint.naming("tenant-b", "bravo")).await;
    let hammer = (0..400).map(|_| {
        let mut alpha = alpha.clone();
        async move { alpha.node_groups(proto::NodeGroupsRequest {}).await }
    });
    let flood = tokio::spawn(futures::future::join_all(hammer));
    let mut served = 0;
    for _ in 0..20 {
        let answer = bravo.clone().node_groups(proto::NodeGroupsRequest {}).await;
        assert!(answer.is_ok(), "bravo is served: {answer:?}");
        served += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let flood = flood.await.expect("flood");
    let refused: Vec<&tonic::Status> = flood.iter().filter_map(|r| r.as_ref().err()).collect();
    let admitted = flood.len() - refused.len();
    assert_eq!(served, 20);
    assert!(
        (40..=100).contains(&admitted),
        "alpha gets its burst and its rate, not more: {admitted} of 400 admitted"
    );
    for status in &refused {
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status
                .message()
                .starts_with("Cluster tenant-a/alpha is over its request budget of 20 per second (burst 40); retry in "),
            "{}",
            status.message()
        );
        assert!(!status.message().contains("bravo"), "{}", status.message());
    }
}
