//! Tenant scoping, RPC by RPC: the service behind real mTLS on loopback, its snapshot built
//! from the objects of five tenants, each caller presenting the client certificate of one
//! scenario. Every RPC x scenario gets the exact code, and no message names anything of
//! another tenant: another cluster's group or node is answered exactly as one that does not
//! exist.
//!
//! This file holds the tenants and the endpoint serving them; `matrix.rs` runs every RPC in
//! every scenario, `limits.rs` what a tenant is refused for its size (a too large answer, its
//! request budget).

mod limits;
mod matrix;

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
pub(super) const TENANTS: [(&str, &str); 5] = [
    ("tenant-a", "alpha"),
    ("tenant-b", "bravo"),
    ("tenant-d", "delta"),
    ("tenant-n", "november"),
    ("tenant-c", "charlie"),
];

/// The synthetic instance id of `bravo`'s Machine without a Node, and one of no Machine.
pub(super) const FOREIGN_MACHINE: &str = "pending-machine-tenant-b_bravo-m2";
pub(super) const UNKNOWN_MACHINE: &str = "pending-machine-tenant-z_zulu-m2";

/// Strings of the other tenants that no answer to an `alpha` caller may contain (their
/// Cluster, Machine, Node and GPU type names; no request of the matrix carries them).
pub(super) const BRAVO_SECRETS: [&str; 4] = ["bravo", "bravo-m1", "bravo-n1", "bravo-gpu"];

/// Cluster API v1beta2 as discovery would find it.
pub(super) fn capi_resources() -> CapiResources {
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

pub(super) fn group_id(namespace: &str) -> String {
    format!("MachineSet/{namespace}/workers")
}

/// A provider ID per Cluster (matching uses the last segment, as upstream: they differ there)
/// that does not spell the Cluster's name.
pub(super) fn provider_id(cluster: &str) -> String {
    let n = ["alpha", "bravo", "delta", "november", "charlie"]
        .iter()
        .position(|c| *c == cluster)
        .map_or(999, |i| 101 * (i + 1));
    format!("test:///zone/i-{n}")
}

pub(super) fn dynamic(v: Value) -> kube::api::DynamicObject {
    serde_json::from_value(v).expect("object")
}

/// Each tenant's MachineSet `workers` (GPU type `<cluster>-gpu`) with one Machine
/// `<cluster>-m1` on `test:///<cluster>/i-1`, and `bravo`'s copy of `alpha`'s provider ID.
pub(super) fn inputs() -> IndexInputs {
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
pub(super) fn snapshot() -> Snapshot {
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
pub(super) struct Endpoint {
    address: SocketAddr,
    ca: CertificateAuthority,
    _dir: tempfile::TempDir,
    shutdown: CancellationToken,
}

impl Endpoint {
    pub(super) async fn start() -> Self {
        Self::serving(snapshot()).await
    }

    pub(super) async fn serving(snapshot: Snapshot) -> Self {
        Self::serving_with(snapshot, None).await
    }

    /// [`Endpoint::serving`] with each Cluster's request budget `limit`.
    pub(super) async fn serving_with(snapshot: Snapshot, limit: Option<RateLimit>) -> Self {
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

    pub(super) async fn client(&self, cert: &IssuedCert) -> CloudProviderClient<Channel> {
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
    pub(super) fn naming(&self, namespace: &str, name: &str) -> IssuedCert {
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
