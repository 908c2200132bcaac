//! One operator in a management cluster serving the cluster-autoscaler of every workload
//! cluster: a management API server with the Cluster API manager, two workload API servers
//! with kwok nodes (Cluster API reaches them through their `<cluster>-kubeconfig` Secrets),
//! the operator binary with `--workload-nodes=cluster-secrets --client-identity=uri-san`, and
//! one real cluster-autoscaler per workload cluster, each presenting a client certificate that
//! names its Cluster.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_sandbox::autoscaler::{AutoscalerOptions, CloudProvider};
use ngo_sandbox::ca_client::CaClient;
use ngo_sandbox::capi;
use ngo_sandbox::environment::{SandboxInfo, SandboxOptions, start_for_process_with};
use ngo_sandbox::operator::write_cloud_config;
use ngo_sandbox::stack::AutoscaledCluster;
use ngo_sandbox::workload;
use ngo_sandbox::workload_cluster::SYSTEM_NAMESPACE;
use nodegroup_operator::api::NodeGroupPolicy;
use serde_json::{Value, json};

const POOL: &str = "e2e.nodegroup.dev/pool";
const WAIT: Duration = Duration::from_secs(120);
/// The second test stops a workload API server: tests run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn sandbox() -> &'static SandboxInfo {
    static SANDBOX: OnceLock<SandboxInfo> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let started = Instant::now();
        let info = start_for_process_with(&SandboxOptions {
            workload_clusters: 2,
        })
        .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "management + 2 workload clusters up in {:.1}s (logs: {})",
            started.elapsed().as_secs_f64(),
            info.log_dir.display()
        );
        info
    })
}

async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => {
                eprintln!("{what} (after {:.1}s)", start.elapsed().as_secs_f64());
                return v;
            }
            Err(last) if start.elapsed() > WAIT => {
                panic!(
                    "timed out after {WAIT:?} waiting for {what}; last: {last}\n{}",
                    diagnose().await
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// For a timeout (CI keeps no log directory): whether each workload cluster answers, and the
/// operators' last warnings, errors and workload cluster connection changes.
async fn diagnose() -> String {
    let mut lines = Vec::new();
    for cluster in &sandbox().workload_clusters {
        let state = match cluster.client().await {
            Ok(client) => match Api::<Node>::all(client).list(&ListParams::default()).await {
                Ok(nodes) => format!("answers, {} Nodes", nodes.items.len()),
                Err(error) => format!("does not answer: {error}"),
            },
            Err(error) => format!("no client: {error:#}"),
        };
        lines.push(format!("workload cluster {}: {state}", cluster.name));
    }
    let logs = std::fs::read_dir(&sandbox().log_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("operator"));
    for log in logs {
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        let notable: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("workload cluster"))
            .collect();
        lines.push(format!(
            "{} (last warnings, errors and connection changes):\n{}",
            log.file_name().to_string_lossy(),
            notable[notable.len().saturating_sub(15)..].join("\n")
        ));
    }
    lines.join("\n")
}

/// Two Clusters, one per workload cluster, each with a MachineDeployment `w` (min 1, max 4)
/// governed by a policy, served by one operator; one cluster-autoscaler per cluster.
struct World {
    a: AutoscaledCluster,
    b: AutoscaledCluster,
    management: Client,
    /// The operator's gRPC and admin addresses.
    address: std::net::SocketAddr,
    admin: std::net::SocketAddr,
}

impl World {
    async fn new(suffix: &str, replicas_a: i32, replicas_b: i32) -> Self {
        let info = sandbox();
        let n = rand::random::<u32>() % 100_000;
        // Each Cluster's Nodes carry its namespace as their pool: the Nodes another test left
        // in the same workload cluster never take this test's pods.
        let (namespace_a, namespace_b) = (format!("{suffix}-a-{n}"), format!("{suffix}-b-{n}"));
        let mut a = AutoscaledCluster::create_on(
            info,
            &info.workload_clusters[0],
            &namespace_a,
            "ca",
            json!({POOL: namespace_a}),
        )
        .await
        .expect("cluster a");
        let b = AutoscaledCluster::create_on(
            info,
            &info.workload_clusters[1],
            &namespace_b,
            "cb",
            json!({POOL: namespace_b}),
        )
        .await
        .expect("cluster b");
        let management = a.client().await.expect("client");
        for (cluster, replicas) in [(&a, replicas_a), (&b, replicas_b)] {
            let md = capi::machine_deployment(
                &cluster.namespace,
                &cluster.cluster,
                "w",
                replicas,
                json!({}),
                ngo_sandbox::environment::WORKER_TEMPLATE,
            )
            .expect("md");
            let mut md = md;
            md.labels_mut().insert("pool".into(), "w".into());
            Api::<DynamicObject>::namespaced_with(
                management.clone(),
                &cluster.namespace,
                &capi::machine_deployments(),
            )
            .create(&PostParams::default(), &md)
            .await
            .expect("create md");
            let policy: NodeGroupPolicy = serde_json::from_value(json!({
                "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodeGroupPolicy",
                "metadata": {"name": "workers", "namespace": cluster.namespace},
                "spec": {"selector": {"matchLabels": {"pool": "w"}}, "minSize": 1, "maxSize": 4}
            }))
            .expect("policy");
            Api::<NodeGroupPolicy>::namespaced(management.clone(), &cluster.namespace)
                .create(&PostParams::default(), &policy)
                .await
                .expect("create policy");
        }
        // One operator for both Clusters, in the management cluster.
        let mut options = a.operator_options();
        options.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
        options.auto_discovery = vec![
            format!("clusterapi:namespace={}", a.namespace),
            format!("clusterapi:namespace={}", b.namespace),
        ];
        options.extra_args = vec![
            "--workload-nodes=cluster-secrets".into(),
            "--client-identity=uri-san".into(),
        ];
        options.name = format!("{suffix}-{n}-operator");
        a.start_operator(&options).expect("operator");
        let operator = a.operator().expect("operator");
        let (address, admin) = (operator.grpc_address, operator.admin_address);
        Self {
            a,
            b,
            management,
            address,
            admin,
        }
    }

    fn id(cluster: &AutoscaledCluster) -> String {
        format!("MachineDeployment/{}/w", cluster.namespace)
    }

    /// A cloud-config for the shared operator with a certificate naming `namespace/cluster`.
    fn cloud_config(&self, name: &str, identity: Option<(&str, &str)>) -> std::path::PathBuf {
        let address = self.address.to_string();
        let cert = match identity {
            Some((ns, cluster)) => self.a.pki.issue_cluster_client(ns, cluster).expect("cert"),
            None => self.a.pki.issue_client(name).expect("cert"),
        };
        let path = sandbox()
            .dir
            .join(format!("{name}-{}.cloud-config.yaml", self.a.namespace));
        write_cloud_config(
            &path,
            &address,
            &cert,
            &self.a.pki.ca_cert,
            Duration::from_secs(10),
        )
        .expect("cloud-config");
        path
    }

    /// cluster-autoscaler for workload cluster `index`, identified as `cluster`.
    fn start_autoscaler(&mut self, which: char) {
        let (ns, name, index) = match which {
            'a' => (self.a.namespace.clone(), self.a.cluster.clone(), 0),
            _ => (self.b.namespace.clone(), self.b.cluster.clone(), 1),
        };
        let cloud_config = self.cloud_config(&format!("ca-{which}"), Some((&ns, &name)));
        let mut options = AutoscalerOptions::new(
            CloudProvider::ExternalGrpc { cloud_config },
            &sandbox().workload_clusters[index].kubeconfig,
            SYSTEM_NAMESPACE,
        );
        options.name = format!("{ns}-cluster-autoscaler");
        let target = if which == 'a' {
            &mut self.a
        } else {
            &mut self.b
        };
        target
            .start_autoscaler(&options)
            .expect("cluster-autoscaler");
    }

    async fn replicas(&self, cluster: &AutoscaledCluster) -> i64 {
        Api::<DynamicObject>::namespaced_with(
            self.management.clone(),
            &cluster.namespace,
            &capi::machine_deployments(),
        )
        .get("w")
        .await
        .expect("md")
        .data["spec"]["replicas"]
            .as_i64()
            .unwrap_or_default()
    }

    async fn ca_target(cluster: &AutoscaledCluster) -> Option<i64> {
        let client = cluster.nodes_client().await.ok()?;
        let status = cluster.autoscaler()?.status(&client).await.ok()??;
        status
            .node_groups
            .iter()
            .find(|g| g.name == Self::id(cluster))
            .map(|g| g.health.cloud_provider_target)
    }
}

async fn nodes_in(client: &Client, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items.iter().map(|n| n.name_any()).collect())
        .unwrap_or_default();
    names.retain(|n| n.starts_with(prefix));
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_autoscaler_sees_and_scales_only_its_own_cluster() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("scope", 1, 2).await;
    let (id_a, id_b) = (World::id(&w.a), World::id(&w.b));
    let nodes_a = w.a.nodes_client().await.expect("a");
    let nodes_b = w.b.nodes_client().await.expect("b");
    poll(
        "Nodes of both clusters in their own API servers",
        || async {
            let a = nodes_in(&nodes_a, &w.a.namespace).await;
            let b = nodes_in(&nodes_b, &w.b.namespace).await;
            let crossed = nodes_in(&nodes_a, &w.b.namespace).await.len()
                + nodes_in(&nodes_b, &w.a.namespace).await.len();
            (a.len() == 1 && b.len() == 2 && crossed == 0)
                .then_some(())
                .ok_or(format!("a {a:?}, b {b:?}, crossed {crossed}"))
        },
    )
    .await;

    // CA's own client with A's certificate: A's group only; B's ids refused.
    let config = w.cloud_config("conformance-a", Some((&w.a.namespace.clone(), "ca")));
    let log = sandbox()
        .dir
        .join(format!("{}-ca-client.log", w.a.namespace));
    let ca = CaClient::start(&config, &log).expect("CA's client");
    let groups = poll("A's client to see its group", || async {
        let refresh = ca.call(json!({"call": "Refresh"})).await;
        let groups = ca.value(json!({"call": "NodeGroups"})).await;
        let ids: Vec<String> = groups
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["id"].as_str().map(String::from))
            .collect();
        (!ids.is_empty()).then_some(ids.clone()).ok_or(format!(
            "{groups}; Refresh: {refresh}; CA's client logged:\n{}",
            ca.log_tail(10)
        ))
    })
    .await;
    assert_eq!(groups, vec![id_a.clone()], "A sees only its own group");
    let b_node = nodes_in(&nodes_b, &w.b.namespace).await[0].clone();
    let b_pid = format!(
        "test:///{}/{}",
        w.b.namespace,
        b_node.trim_start_matches(&format!("{}-", w.b.namespace))
    );
    let for_b_node = ca
        .call(json!({"call": "NodeGroupForNode", "node": {"providerID": b_pid, "name": b_node}}))
        .await;
    assert_eq!(
        for_b_node["value"],
        Value::Null,
        "another cluster's node is not autoscaled for A: {for_b_node}"
    );
    ca.finish().await.expect("CA's client exits");

    // A certificate naming no served Cluster gets nothing; A's certificate asking for B's
    // group by id finds nothing on every RPC.
    let denied_identity =
        w.cloud_config("nobody", Some((&w.a.namespace.clone(), "no-such-cluster")));
    let nobody =
        CaClient::start(&denied_identity, &sandbox().dir.join("nobody.log")).expect("client");
    let refresh = nobody.call(json!({"call": "Refresh"})).await;
    assert_eq!(refresh["code"], "PermissionDenied", "{refresh}");
    assert!(
        refresh["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-cluster"),
        "{refresh}"
    );
    nobody.finish().await.expect("exits");
    // GPULabel and Cleanup name no group, and are refused to it all the same.
    let nobody_cert =
        w.a.pki
            .issue_cluster_client(&w.a.namespace, "no-such-cluster")
            .expect("cert");
    let mut nobody = connect_as(&w, &nobody_cert).await;
    let gpu = nobody
        .gpu_label(nodegroup_operator::proto::GpuLabelRequest {})
        .await;
    assert_eq!(
        gpu.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "GPULabel"
    );
    let cleanup = nobody
        .cleanup(nodegroup_operator::proto::CleanupRequest {})
        .await;
    assert_eq!(
        cleanup.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "Cleanup"
    );
    let a_cert =
        w.a.pki
            .issue_cluster_client(&w.a.namespace, "ca")
            .expect("cert");
    let a_client = connect_as(&w, &a_cert).await;
    // B's group is, to A, a group that does not exist: the same answer as an unknown id, so
    // nothing can be learnt about B.
    for (rpc, result) in scoped_calls(a_client, &id_b).await {
        let status = result.expect_err(rpc);
        assert_eq!(status.code(), tonic::Code::NotFound, "{rpc}: {status:?}");
        assert_eq!(
            status.message(),
            format!("node group {id_b:?} not found"),
            "{rpc}"
        );
    }
    assert_eq!(w.replicas(&w.b).await, 2, "nothing of B was changed");

    // Real autoscalers: pending pods in A scale only A; B's idle node goes back to min.
    w.start_autoscaler('a');
    w.start_autoscaler('b');
    let selector = BTreeMap::from([(POOL.to_string(), w.a.namespace.clone())]);
    let app = workload::deployment(
        SYSTEM_NAMESPACE,
        &format!("load-{}", w.a.namespace),
        3,
        "3",
        &selector,
    )
    .expect("deployment");
    workload::create(&nodes_a, &app).await.expect("create");
    poll("A scaled up to 3 by A's autoscaler", || async {
        let r = w.replicas(&w.a).await;
        (r == 3).then_some(()).ok_or(format!("replicas {r}"))
    })
    .await;
    poll("B scaled down to its minimum by B's autoscaler", || async {
        let r = w.replicas(&w.b).await;
        (r == 1).then_some(()).ok_or(format!("replicas {r}"))
    })
    .await;
    poll("three Nodes in A's cluster, one in B's", || async {
        let a = nodes_in(&nodes_a, &w.a.namespace).await.len();
        let b = nodes_in(&nodes_b, &w.b.namespace).await.len();
        (a == 3 && b == 1)
            .then_some(())
            .ok_or(format!("a {a}, b {b}"))
    })
    .await;
    assert_eq!(World::ca_target(&w.a).await, Some(3));
    assert_eq!(World::ca_target(&w.b).await, Some(1));
    let _ = id_a;
}

async fn connect_as(
    w: &World,
    cert: &(std::path::PathBuf, std::path::PathBuf),
) -> nodegroup_operator::proto::cloud_provider_client::CloudProviderClient<tonic::transport::Channel>
{
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("pem");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&w.a.pki.ca_cert)))
        .identity(Identity::from_pem(read(&cert.0), read(&cert.1)))
        .domain_name("localhost");
    let address = w.address;
    let channel = Channel::from_shared(format!("https://{address}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect");
    nodegroup_operator::proto::cloud_provider_client::CloudProviderClient::new(channel)
}

/// Every RPC that takes a node group id, on `id`.
async fn scoped_calls(
    mut client: nodegroup_operator::proto::cloud_provider_client::CloudProviderClient<
        tonic::transport::Channel,
    >,
    id: &str,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    use nodegroup_operator::proto;
    let id = id.to_string();
    vec![
        (
            "TargetSize",
            client
                .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.clone() })
                .await
                .map(|_| ()),
        ),
        (
            "IncreaseSize",
            client
                .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                    id: id.clone(),
                    delta: 1,
                })
                .await
                .map(|_| ()),
        ),
        (
            "DecreaseTargetSize",
            client
                .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                    id: id.clone(),
                    delta: -1,
                })
                .await
                .map(|_| ()),
        ),
        (
            "DeleteNodes",
            client
                .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                    id: id.clone(),
                    nodes: vec![proto::ExternalGrpcNode {
                        provider_id: "test:///x/y".into(),
                        ..Default::default()
                    }],
                })
                .await
                .map(|_| ()),
        ),
        (
            "Nodes",
            client
                .node_group_nodes(proto::NodeGroupNodesRequest { id: id.clone() })
                .await
                .map(|_| ()),
        ),
        (
            "TemplateNodeInfo",
            client
                .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
                    id: id.clone(),
                })
                .await
                .map(|_| ()),
        ),
        (
            "GetOptions",
            client
                .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                    id: id.clone(),
                    defaults: Some(Default::default()),
                })
                .await
                .map(|_| ()),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_workload_cluster_affects_only_its_own_groups() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("outage", 1, 1).await;
    let nodes_a = w.a.nodes_client().await.expect("a");
    w.start_autoscaler('a');
    poll("both groups served", || async {
        let (a, b) = (World::ca_target(&w.a).await, w.replicas(&w.b).await);
        (a == Some(1) && b == 1)
            .then_some(())
            .ok_or(format!("a {a:?}"))
    })
    .await;

    let switch = sandbox().workload_clusters[1].api_server.clone();
    switch.stop().await.expect("stop B's API server");
    let started = Instant::now();
    let policies: Api<NodeGroupPolicy> = Api::namespaced(w.management.clone(), &w.b.namespace);
    let condition = poll("B's policy to report its cluster unreachable", || async {
        let p = policies.get("workers").await.map_err(|e| e.to_string())?;
        p.status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "WorkloadClustersReachable" && c.status == "False")
            })
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    eprintln!(
        "unreachable reported after {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        condition.message
    );
    assert!(
        condition.message.contains(&w.b.namespace),
        "{}",
        condition.message
    );
    let a_policy: Api<NodeGroupPolicy> = Api::namespaced(w.management.clone(), &w.a.namespace);
    let a_status = a_policy
        .get("workers")
        .await
        .expect("a policy")
        .status
        .expect("status");
    assert!(
        a_status
            .conditions
            .iter()
            .any(|c| c.type_ == "WorkloadClustersReachable" && c.status == "True"),
        "A's policy stays reachable: {:?}",
        a_status.conditions
    );
    let text = ngo_sandbox::process::http_get(w.admin, "/metrics").expect("metrics");
    assert!(
        text.lines()
            .any(|l| l.starts_with("nodegroup_workload_cluster_reachable{")
                && l.contains(&w.b.namespace)
                && l.ends_with(" 0")),
        "metric for B: {text}"
    );

    // A keeps scaling meanwhile.
    let selector = BTreeMap::from([(POOL.to_string(), w.a.namespace.clone())]);
    let app = workload::deployment(
        SYSTEM_NAMESPACE,
        &format!("load-{}", w.a.namespace),
        2,
        "3",
        &selector,
    )
    .expect("deployment");
    workload::create(&nodes_a, &app).await.expect("create");
    poll("A scaled up while B is down", || async {
        let r = w.replicas(&w.a).await;
        (r == 2).then_some(()).ok_or(format!("replicas {r}"))
    })
    .await;

    switch.start().await.expect("start B's API server");
    poll("B's policy reachable again", || async {
        let p = policies.get("workers").await.map_err(|e| e.to_string())?;
        p.status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "WorkloadClustersReachable" && c.status == "True")
            })
            .map(|_| ())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        w.management.clone(),
        &w.b.namespace,
    )
    .list(&ListParams::default())
    .await
    .expect("events")
    .items;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("WorkloadClusterUnreachable")),
        "an Event on B's policy"
    );
}
