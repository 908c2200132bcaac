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
use ngo_api::NodeGroupPolicy;
use ngo_sandbox::environment::{SandboxInfo, SandboxOptions, start_for_process_with};
use ngo_sandbox::operator::write_cloud_config;
use ngo_sandbox::stack::AutoscaledCluster;
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::autoscaler::{AutoscalerOptions, CloudProvider};
use ngo_testbed::ca_client::CaClient;
use ngo_testbed::capi;
use ngo_testbed::workload;
use ngo_testbed::workload_cluster::SYSTEM_NAMESPACE;
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
    /// One passive deletion auditor per Cluster: its Machines here, its Nodes in its workload
    /// cluster; a removal CA had not left to us fails the test when the world is dropped.
    auditors: Vec<DeletionAuditor>,
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
        let mut auditors = Vec::new();
        for cluster in [&a, &b] {
            let pool = cluster.namespace.clone();
            auditors.push(DeletionAuditor::passive_across(
                management.clone(),
                &cluster.namespace,
                &capi::machines(),
                cluster.nodes_client().await.expect("workload client"),
                POOL,
                move |node| node.labels().get(POOL) == Some(&pool),
            ));
        }
        Self {
            a,
            b,
            management,
            address,
            admin,
            auditors,
        }
    }

    /// Runs `replicas` pods in A's cluster that fit one per node, and waits until A's
    /// autoscaler has raised A's group to as many replicas (`what` says when).
    async fn load_a(&self, nodes_a: &Client, replicas: i32, what: &str) {
        let selector = BTreeMap::from([(POOL.to_string(), self.a.namespace.clone())]);
        let app = workload::deployment(
            SYSTEM_NAMESPACE,
            &format!("load-{}", self.a.namespace),
            replicas,
            "3",
            &selector,
        )
        .expect("deployment");
        workload::create(nodes_a, &app).await.expect("create");
        poll(what, || async {
            let r = self.replicas(&self.a).await;
            (r == i64::from(replicas))
                .then_some(())
                .ok_or(format!("replicas {r}"))
        })
        .await;
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

impl Drop for World {
    /// Fails the test (unless it failed already) on a removal an auditor judged against U1.
    fn drop(&mut self) {
        let violations: Vec<String> = self.auditors.iter().flat_map(|a| a.violations()).collect();
        for line in self.auditors.iter().flat_map(|a| a.residue()) {
            eprintln!("auditor residue: {line}");
        }
        if !violations.is_empty() && !std::thread::panicking() {
            panic!("U1 violations: {violations:#?}");
        }
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

    // The hostile tenant B: a Machine carrying A's node's provider ID, and a Cluster whose
    // kubeconfig Secret tries to make the operator send its own credentials to B's listener.
    let a_pid = poll("A's Machine to have a provider ID", || async {
        let machines = Api::<DynamicObject>::namespaced_with(
            w.management.clone(),
            &w.a.namespace,
            &capi::machines(),
        )
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
        machines
            .items
            .iter()
            .find_map(|m| m.data["spec"]["providerID"].as_str().map(String::from))
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    let hostile = Hostile::plant(&w, &a_pid).await;

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
    let for_a_node = ca
        .call(json!({"call": "NodeGroupForNode", "node": {"providerID": a_pid}}))
        .await;
    assert_eq!(
        for_a_node["value"]["id"], id_a,
        "B's Machine with A's provider ID neither hides nor takes A's node: {for_a_node}"
    );
    hostile.assert_refused(&w).await;
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
        .gpu_label(ngo_service::proto::GpuLabelRequest {})
        .await;
    assert_eq!(
        gpu.map(|_| ()).map_err(|s| s.code()),
        Err(tonic::Code::PermissionDenied),
        "GPULabel"
    );
    let cleanup = nobody.cleanup(ngo_service::proto::CleanupRequest {}).await;
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
    w.load_a(&nodes_a, 3, "A scaled up to 3 by A's autoscaler")
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
    // Each autoscaler's own view: its status ConfigMap, written once per loop, so it may
    // trail the objects by a loop.
    poll("each autoscaler's status at its own target", || async {
        let (a, b) = (World::ca_target(&w.a).await, World::ca_target(&w.b).await);
        (a == Some(3) && b == Some(1))
            .then_some(())
            .ok_or(format!("a {a:?}, b {b:?}"))
    })
    .await;
    let _ = id_a;
}

/// What the hostile tenant B planted: a Machine with A's provider ID, and Cluster `evil`
/// (with a MachineDeployment B's policy governs) whose kubeconfig Secret names the operator's
/// own kubeconfig as its token file and B's listener as its server.
struct Hostile {
    listener: std::net::SocketAddr,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Hostile {
    async fn plant(w: &World, a_pid: &str) -> Self {
        let namespace = &w.b.namespace;
        let machine: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "copy-of-a", "namespace": namespace},
            "spec": {
                "clusterName": w.b.cluster,
                "bootstrap": {"dataSecretName": "none"},
                "infrastructureRef": {"apiGroup": capi::INFRA_GROUP, "kind": "TestMachine", "name": "none"},
                "providerID": a_pid
            }
        }))
        .expect("machine");
        Api::<DynamicObject>::namespaced_with(w.management.clone(), namespace, &capi::machines())
            .create(&PostParams::default(), &machine)
            .await
            .expect("create the copying Machine");

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        let token_file = sandbox().kubeconfig.display().to_string();
        let kubeconfig = serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "Config", "current-context": "evil",
            "clusters": [{"name": "evil", "cluster": {"server": format!("https://{address}")}}],
            "users": [{"name": "evil", "user": {"tokenFile": token_file}}],
            "contexts": [{"name": "evil", "context": {"cluster": "evil", "user": "evil"}}]
        }))
        .expect("kubeconfig");
        capi::create_cluster(&w.management, namespace, "evil", &kubeconfig)
            .await
            .expect("Cluster evil");
        let mut md = capi::machine_deployment(
            namespace,
            "evil",
            "evil-w",
            0,
            // Served from zero whatever its template says: only its cluster holds it back.
            json!({"capacity.cluster-autoscaler.kubernetes.io/cpu": "2",
                   "capacity.cluster-autoscaler.kubernetes.io/memory": "4Gi"}),
            ngo_sandbox::environment::WORKER_TEMPLATE,
        )
        .expect("md");
        md.labels_mut().insert("pool".into(), "w".into());
        Api::<DynamicObject>::namespaced_with(
            w.management.clone(),
            namespace,
            &capi::machine_deployments(),
        )
        .create(&PostParams::default(), &md)
        .await
        .expect("create evil's MachineDeployment");
        Self {
            listener: address,
            connections,
        }
    }

    /// The Secret is refused, visibly on B's policy and in an Event, and nothing ever
    /// connected to B's listener.
    async fn assert_refused(&self, w: &World) {
        let policies: Api<NodeGroupPolicy> = Api::namespaced(w.management.clone(), &w.b.namespace);
        let condition = poll("B's policy to report evil's kubeconfig refused", || async {
            let p = policies.get("workers").await.map_err(|e| e.to_string())?;
            let status = p.status.unwrap_or_default();
            status
                .conditions
                .iter()
                .find(|c| {
                    c.type_ == "WorkloadClustersReachable"
                        && c.status == "False"
                        && c.message.contains("tokenFile")
                })
                .cloned()
                .ok_or_else(|| format!("{:?}; groups {:?}", status.conditions, status.groups))
        })
        .await;
        assert!(
            condition
                .message
                .contains(&format!("{}/evil", w.b.namespace)),
            "{}",
            condition.message
        );
        let events = unreachable_event_naming(w, "tokenFile").await;
        eprintln!("refused: {}", events.note.unwrap_or_default());
        // The operator re-reads the Secret every 30 s; give it a moment more than a reconcile.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            self.connections.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "the operator connected to the hostile server {}",
            self.listener
        );
    }
}

async fn connect_as(
    w: &World,
    cert: &(std::path::PathBuf, std::path::PathBuf),
) -> ngo_service::proto::cloud_provider_client::CloudProviderClient<tonic::transport::Channel> {
    ngo_service::proto::cloud_provider_client::CloudProviderClient::new(channel_as(w, cert).await)
}

/// An mTLS channel to the shared operator with client certificate `cert`.
async fn channel_as(
    w: &World,
    cert: &(std::path::PathBuf, std::path::PathBuf),
) -> tonic::transport::Channel {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("pem");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&w.a.pki.ca_cert)))
        .identity(Identity::from_pem(read(&cert.0), read(&cert.1)))
        .domain_name("localhost");
    let address = w.address;
    Channel::from_shared(format!("https://{address}"))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect")
}

/// Every RPC that takes a node group id, on `id`.
async fn scoped_calls(
    mut client: ngo_service::proto::cloud_provider_client::CloudProviderClient<
        tonic::transport::Channel,
    >,
    id: &str,
) -> Vec<(&'static str, Result<(), tonic::Status>)> {
    use ngo_service::proto;
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
    let text = ngo_testbed::process::http_get(w.admin, "/metrics").expect("metrics");
    assert!(
        text.lines()
            .any(|l| l.starts_with("nodegroup_workload_cluster_reachable{")
                && l.contains(&w.b.namespace)
                && l.ends_with(" 0")),
        "metric for B: {text}"
    );

    // A keeps scaling meanwhile.
    w.load_a(&nodes_a, 2, "A scaled up while B is down").await;

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

/// The Warning Event `WorkloadClusterUnreachable` on B's policy whose note names `naming`,
/// once the operator has written it.
async fn unreachable_event_naming(w: &World, naming: &str) -> k8s_openapi::api::events::v1::Event {
    poll(
        &format!("a Warning Event on B's policy naming {naming}"),
        || async {
            let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
                w.management.clone(),
                &w.b.namespace,
            )
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
            let count = events.items.len();
            events
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("WorkloadClusterUnreachable")
                        && e.note.as_deref().is_some_and(|n| n.contains(naming))
                })
                .ok_or_else(|| format!("{count} Events, none naming it"))
        },
    )
    .await
}

/// A fresh operator (a list deadline of 10 s, for the hostile suite) and A's client of it (its
/// certificate `cert`), once it serves A's group.
async fn restarted_serving_a(
    w: &mut World,
    cert: &(std::path::PathBuf, std::path::PathBuf),
) -> ngo_service::proto::cloud_provider_client::CloudProviderClient<tonic::transport::Channel> {
    restart_operator_with(w, &["--workload-list-deadline-secs=10"]);
    let a = connect_as(w, cert).await;
    poll("A served by the restarted operator", || async {
        a.clone()
            .node_groups(ngo_service::proto::NodeGroupsRequest {})
            .await
            .ok()
            .filter(|g| g.get_ref().node_groups.len() == 1)
            .map(|_| ())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    a
}

/// The address of workload cluster `index`'s API server.
fn api_server_address(index: usize) -> std::net::SocketAddr {
    let server = &sandbox().workload_clusters[index].server;
    server
        .trim_start_matches("https://")
        .parse()
        .unwrap_or_else(|e| panic!("API server address {server}: {e}"))
}

/// Restarts the shared operator, which then connects to the workload clusters as their
/// kubeconfig Secrets say now.
fn restart_operator(w: &mut World) {
    restart_operator_with(w, &[]);
}

/// As [`restart_operator`], with `extra_args` too.
fn restart_operator_with(w: &mut World, extra_args: &[&str]) {
    let options = operator_of_both(
        w,
        ["--client-identity=uri-san"]
            .iter()
            .chain(extra_args)
            .map(|a| a.to_string())
            .collect(),
        format!("{}-operator-restarted", w.a.namespace),
    );
    w.a.start_operator(&options).expect("operator");
    let operator = w.a.operator().expect("operator");
    (w.address, w.admin) = (operator.grpc_address, operator.admin_address);
}

/// Options for an operator (this test binary's build, named `name`) that discovers both
/// Clusters' namespaces and reads their Nodes through their kubeconfig Secrets, with
/// `extra_args` scoping its clients.
fn operator_of_both(
    w: &World,
    extra_args: Vec<String>,
    name: String,
) -> ngo_sandbox::operator::OperatorOptions {
    let mut options = w.a.operator_options();
    options.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
    options.auto_discovery = vec![
        format!("clusterapi:namespace={}", w.a.namespace),
        format!("clusterapi:namespace={}", w.b.namespace),
    ];
    options.extra_args = ["--workload-nodes=cluster-secrets".to_string()]
        .into_iter()
        .chain(extra_args)
        .collect();
    options.name = name;
    options
}

/// The `WorkloadClustersReachable` condition of `cluster`'s policy: its status and message.
async fn reachable_condition(
    w: &World,
    cluster: &AutoscaledCluster,
) -> Result<(String, String), String> {
    let policy = Api::<NodeGroupPolicy>::namespaced(w.management.clone(), &cluster.namespace)
        .get("workers")
        .await
        .map_err(|e| e.to_string())?;
    policy
        .status
        .and_then(|s| {
            s.conditions
                .into_iter()
                .find(|c| c.type_ == "WorkloadClustersReachable")
        })
        .map(|c| (c.status, c.message))
        .ok_or_else(|| "no WorkloadClustersReachable condition yet".to_string())
}

/// Whether the operator's metric says workload cluster `cluster` is reachable.
fn reachable_metric(w: &World, cluster: &AutoscaledCluster) -> Option<bool> {
    let text = ngo_testbed::process::http_get(w.admin, "/metrics").ok()?;
    text.lines()
        .find(|l| {
            l.starts_with("nodegroup_workload_cluster_reachable{") && l.contains(&cluster.namespace)
        })
        .map(|l| l.ends_with(" 1"))
}

/// Co-located beside A's cluster-autoscaler (`--cluster`), an operator in the management
/// topology reads A's kubeconfig Secret and connects to A's workload cluster only: B's
/// connection, whose Secret it could read, is never made (the shared operator, unscoped,
/// makes it in the same time). Of Cluster API's objects it holds A's alone, also where
/// another Cluster's share A's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_co_located_operator_connects_to_its_own_workload_cluster_only() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("sidecar", 1, 1).await;
    // A stranger's MachineDeployment in A's namespace, labelled with its Cluster's name as
    // Cluster API's webhooks and controllers label every one.
    let mut stranger = capi::machine_deployment(
        &w.a.namespace,
        "stranger",
        "w-stranger",
        0,
        json!({}),
        ngo_sandbox::environment::WORKER_TEMPLATE,
    )
    .expect("md");
    stranger.labels_mut().insert("pool".into(), "w".into());
    Api::<DynamicObject>::namespaced_with(
        w.management.clone(),
        &w.a.namespace,
        &capi::machine_deployments(),
    )
    .create(&PostParams::default(), &stranger)
    .await
    .expect("create the stranger's md");
    let options = operator_of_both(
        &w,
        vec![format!("--cluster={}/ca", w.a.namespace)],
        format!("{}-sidecar", w.a.namespace),
    );
    w.b.start_operator(&options).expect("the sidecar");
    let sidecar = w.b.operator().expect("the sidecar").admin_address;
    let workload_series = |admin: std::net::SocketAddr| -> Vec<String> {
        ngo_testbed::process::http_get(admin, "/metrics")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("nodegroup_workload_cluster_reachable{"))
            .map(str::to_string)
            .collect()
    };
    poll("the sidecar to reach A's workload cluster", || async {
        let series = workload_series(sidecar);
        series
            .iter()
            .any(|l| l.contains(&w.a.namespace) && l.ends_with(" 1"))
            .then_some(())
            .ok_or(format!("{series:?}"))
    })
    .await;
    poll("the shared operator to reach B's", || async {
        (reachable_metric(&w, &w.b) == Some(true))
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    let series = workload_series(sidecar);
    assert!(
        !series.iter().any(|l| l.contains(&w.b.namespace)),
        "the sidecar of A connected to B's workload cluster: {series:?}"
    );
    // It reads nothing outside A's namespace (its RBAC can be a Role there), nor the
    // stranger's objects inside it: the shared operator holds both Clusters' scalable
    // resources (a MachineDeployment and its MachineSet each) and the stranger's, the sidecar
    // A's alone.
    let scalables = |admin: std::net::SocketAddr| -> u64 {
        ngo_testbed::process::http_get(admin, "/metrics")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("nodegroup_index_objects{kind=\"scalable_resources\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_default()
    };
    let (shared, own) = (scalables(w.admin), scalables(sidecar));
    assert!(
        own == 2 && shared > 2 * own,
        "the shared operator holds {shared} scalable resources of A, B and the stranger, the \
         sidecar of A {own} (A's MachineDeployment and MachineSet alone)"
    );
}

/// A workload API server that goes silent (connections stay open, nothing is answered: a
/// partition that drops packets, a hung server) is reported unreachable within 30 s, while
/// the other cluster keeps scaling; it is reachable again once it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_workload_cluster_is_reported_within_30s_and_affects_only_its_own_groups() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("partition", 1, 1).await;
    let proxy = ngo_testbed::blackhole::BlackHoleProxy::start(api_server_address(1), false)
        .await
        .expect("proxy");
    let via_proxy = ngo_testbed::proxy::kubeconfig_text_via(
        &sandbox().workload_clusters[1].capi_kubeconfig,
        proxy.address,
    );
    capi::replace_kubeconfig(&w.management, &w.b.namespace, &w.b.cluster, &via_proxy)
        .await
        .expect("B's kubeconfig through the proxy");
    restart_operator(&mut w);
    let nodes_a = w.a.nodes_client().await.expect("a");
    w.start_autoscaler('a');
    poll("A's group served, B read through the proxy", || async {
        let a = World::ca_target(&w.a).await;
        let b = reachable_metric(&w, &w.b);
        let accepted = proxy.accepted();
        (a == Some(1) && b == Some(true) && accepted > 0)
            .then_some(())
            .ok_or(format!(
                "A's target {a:?}, B reachable {b:?}, proxied connections {accepted}"
            ))
    })
    .await;

    proxy.freeze();
    let frozen = Instant::now();
    let message = poll("B's policy to report its cluster unreachable", || async {
        match reachable_condition(&w, &w.b).await? {
            (status, message) if status == "False" => Ok(message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let detected = frozen.elapsed();
    eprintln!(
        "silent partition reported after {:.1}s: {message}",
        detected.as_secs_f64()
    );
    assert!(
        detected <= Duration::from_secs(30),
        "a silent partition must be reported within 30 s, took {detected:?}"
    );
    assert!(message.contains(&w.b.namespace), "{message}");
    let (a_status, a_message) = reachable_condition(&w, &w.a).await.expect("A's condition");
    assert_eq!(a_status, "True", "A's policy stays reachable: {a_message}");
    assert_eq!(reachable_metric(&w, &w.b), Some(false), "metric for B");

    // A keeps scaling meanwhile.
    w.load_a(&nodes_a, 2, "A scaled up while B is silent").await;

    proxy.thaw();
    poll("B's policy reachable again", || async {
        match reachable_condition(&w, &w.b).await? {
            (status, _) if status == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// Whether `id` is served to its own cluster's autoscaler: the read-only RPCs answer.
async fn group_answers(
    client: &mut ngo_service::proto::cloud_provider_client::CloudProviderClient<
        tonic::transport::Channel,
    >,
    id: &str,
) -> Result<(), String> {
    use ngo_service::proto;
    client
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.into() })
        .await
        .map_err(|s| format!("TargetSize: {s:?}"))?;
    client
        .node_group_nodes(proto::NodeGroupNodesRequest { id: id.into() })
        .await
        .map_err(|s| format!("Nodes: {s:?}"))?;
    Ok(())
}

/// The lines of the running operator's log that mention `needle` and `cluster`'s namespace.
fn operator_log_lines(w: &mut World, cluster_namespace: &str, needle: &str) -> Vec<String> {
    let path = w.a.operator().expect("operator").log_path().to_path_buf();
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter(|l| l.contains(needle) && l.contains(cluster_namespace))
        .map(String::from)
        .collect()
}

/// A kubeconfig Secret whose metadata alone changes does not reconnect; one rotated to a
/// kubeconfig whose server never answers keeps the working connection serving (and says so
/// in a warning), and the cluster's state still follows that connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_kubeconfig_replaces_the_connection_only_once_the_new_one_works() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("rotation", 1, 1).await;
    let id_b = World::id(&w.b);
    let b_cert =
        w.a.pki
            .issue_cluster_client(&w.b.namespace, &w.b.cluster)
            .expect("cert");
    let mut b_client = connect_as(&w, &b_cert).await;
    poll("B's group served", || {
        let mut client = b_client.clone();
        let id = id_b.clone();
        async move { group_answers(&mut client, &id).await }
    })
    .await;
    let b_namespace = w.b.namespace.clone();
    let connecting = "connecting to workload cluster";
    let connections_before = operator_log_lines(&mut w, &b_namespace, connecting).len();

    // Metadata only: no reconnect, B served throughout.
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(w.management.clone(), &b_namespace)
        .patch(
            &format!("{}-kubeconfig", w.b.cluster),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"rotated-by": "test"}}})),
        )
        .await
        .expect("label B's kubeconfig Secret");
    // The operator reads each Secret every 30 s.
    let relabeled = Instant::now();
    while relabeled.elapsed() < Duration::from_secs(35) {
        if let Err(e) = group_answers(&mut b_client, &id_b).await {
            panic!(
                "B's group stopped answering after a metadata change: {e}\n{}",
                diagnose().await
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reconnects = operator_log_lines(&mut w, &b_namespace, connecting);
    assert_eq!(
        reconnects.len(),
        connections_before,
        "a change of the Secret's metadata must not reconnect: {reconnects:#?}"
    );

    // A kubeconfig whose server accepts connections and never answers.
    let black_hole = ngo_testbed::blackhole::BlackHoleProxy::start(api_server_address(1), true)
        .await
        .expect("black hole");
    let unanswered = ngo_testbed::proxy::kubeconfig_text_via(
        &sandbox().workload_clusters[1].capi_kubeconfig,
        black_hole.address,
    );
    capi::replace_kubeconfig(&w.management, &b_namespace, &w.b.cluster, &unanswered)
        .await
        .expect("rotate B's kubeconfig");
    let rotated = Instant::now();
    let warning = loop {
        if let Err(e) = group_answers(&mut b_client, &id_b).await {
            panic!(
                "B's group stopped answering during the rotation: {e}\n{}",
                diagnose().await
            );
        }
        let warnings: Vec<String> = operator_log_lines(&mut w, &b_namespace, "rotated kubeconfig")
            .into_iter()
            .filter(|l| l.contains("WARN"))
            .collect();
        if let Some(warning) = warnings.into_iter().next() {
            break warning;
        }
        assert!(
            rotated.elapsed() < WAIT,
            "no warning about the rotated kubeconfig within {WAIT:?}\n{}",
            diagnose().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "rotation to an unanswered server reported after {:.1}s: {warning}",
        rotated.elapsed().as_secs_f64()
    );
    assert!(
        black_hole.accepted() > 0,
        "the operator tried the rotated kubeconfig"
    );
    let (status, message) = reachable_condition(&w, &w.b).await.expect("B's condition");
    assert_eq!(status, "True", "B stays reachable: {message}");

    // The connection still serving goes down: the state says so, and recovers with it.
    let switch = sandbox().workload_clusters[1].api_server.clone();
    switch.stop().await.expect("stop B's API server");
    poll("B's policy to report its cluster unreachable", || async {
        match reachable_condition(&w, &w.b).await? {
            (status, message) if status == "False" => Ok(message),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    switch.start().await.expect("start B's API server");
    poll("B's policy reachable again", || async {
        match reachable_condition(&w, &w.b).await? {
            (status, _) if status == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    poll("B's group served again", || {
        let mut client = b_client.clone();
        let id = id_b.clone();
        async move { group_answers(&mut client, &id).await }
    })
    .await;
}

/// The operator's resident memory, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_default()
}

/// Latencies of `calls` NodeGroups from `client`, sorted.
async fn node_groups_latencies(
    client: &ngo_service::proto::cloud_provider_client::CloudProviderClient<
        tonic::transport::Channel,
    >,
    calls: usize,
) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(calls);
    for _ in 0..calls {
        let start = Instant::now();
        let groups = client
            .clone()
            .node_groups(ngo_service::proto::NodeGroupsRequest {})
            .await
            .expect("A is served");
        assert_eq!(groups.into_inner().node_groups.len(), 1, "A's group");
        latencies.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    latencies.sort();
    latencies
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)]
}

/// Tenant B's workload API server turns hostile, mode after mode (an endless LIST, endless
/// `continue` tokens, an endless watch line, megabyte labels, a LIST dripping a byte every 20 s,
/// watches that end at once): the operator's memory stays under the chart's limit, tenant A's
/// RPCs stay within twice their latency without the hostile tenant, B is reported, and A's
/// cluster-autoscaler still scales A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_workload_api_server_costs_bounded_memory_and_other_tenants_nothing() {
    use ngo_testbed::hostile_apiserver::{HostileApiServer, Hostility};
    /// The chart's memory limit (`resources.limits.memory`).
    const CHART_LIMIT_KIB: u64 = 512 * 1024;
    /// How long cluster-autoscaler runs before a scale-up is timed: its start and first
    /// loops are not the operator's.
    const CA_SETTLES: Duration = Duration::from_secs(8);
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("hostile", 1, 1).await;
    let hostile = HostileApiServer::start().await.expect("hostile server");
    capi::replace_kubeconfig(
        &w.management,
        &w.b.namespace,
        &w.b.cluster,
        &hostile.kubeconfig(),
    )
    .await
    .expect("B's kubeconfig names the hostile server");
    restart_operator(&mut w);
    let pid = w.a.operator().expect("operator").pid();
    let a_cert =
        w.a.pki
            .issue_cluster_client(&w.a.namespace, "ca")
            .expect("cert");
    let a = connect_as(&w, &a_cert).await;
    poll("B's hostile server read honestly first", || async {
        (reachable_metric(&w, &w.b) == Some(true) && hostile.requests() > 0)
            .then_some(())
            .ok_or(format!("{} requests", hostile.requests()))
    })
    .await;
    let baseline = node_groups_latencies(&a, 1000).await;
    let baseline_rss = rss_kib(pid);
    // Below 20 ms a p99 on this 2-core machine is noise: the API servers, Cluster API, kwok
    // and the test share it. Measured: the Drip mode, in which B's server is asked 3 times in
    // the window, gave A 13.7 ms against 5.6 ms without it; the p99 of 1,000 calls without
    // hostility ranged from 5 to 21 ms between runs.
    let floor = Duration::from_millis(20);
    // A's scale-up without hostility: from two pods that need a node each to replicas 2, its
    // cluster-autoscaler running for a while already (it stops after, so that it adds no load
    // below).
    let nodes_a = w.a.nodes_client().await.expect("a");
    w.start_autoscaler('a');
    tokio::time::sleep(CA_SETTLES).await;
    let started = Instant::now();
    w.load_a(&nodes_a, 2, "A scaled up by A's autoscaler, B honest")
        .await;
    let scale_up_baseline = started.elapsed();
    w.a.stop_autoscaler();
    eprintln!(
        "without hostility: A's NodeGroups p99 {:?}, A's scale-up {:.1}s, operator RSS {} KiB",
        p99(&baseline),
        scale_up_baseline.as_secs_f64(),
        baseline_rss
    );
    let mut report = Vec::new();
    // Each mode with the operator's bound it runs into, as B's condition must name it (a
    // list deadline of 10 s instead of 180 s, so that a slow list is judged in the window).
    for (mode, bound) in [
        (Hostility::EndlessList, Some("--workload-max-response-mib")),
        (
            Hostility::EndlessContinue,
            Some("--workload-max-list-pages"),
        ),
        (
            Hostility::EndlessWatchLine,
            Some("--workload-max-watch-line-mib"),
        ),
        (Hostility::HugeLabels, None),
        (Hostility::Drip, Some("--workload-list-deadline-secs")),
        (Hostility::ClosingWatch, None),
    ] {
        // A fresh operator for each mode: it lists B's Nodes at once, into the mode (an
        // earlier mode's backoff does not hide this one).
        hostile.set(mode);
        let a = restarted_serving_a(&mut w, &a_cert).await;
        let pid = w.a.operator().expect("operator").pid();
        let before = hostile.requests();
        let sampling = {
            let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
            let sampled = peak.clone();
            let task = tokio::spawn(async move {
                loop {
                    sampled.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            });
            (peak, task)
        };
        let latencies = node_groups_latencies(&a, 1000).await;
        sampling.1.abort();
        let peak = sampling.0.load(std::sync::atomic::Ordering::Relaxed);
        let requests = hostile.requests() - before;
        let line = format!(
            "{mode:?}: operator RSS peak {peak} KiB, A's NodeGroups p99 {:?} (baseline {:?}), {requests} requests to B's server",
            p99(&latencies),
            p99(&baseline)
        );
        eprintln!("{line}");
        report.push(line);
        assert!(
            peak < CHART_LIMIT_KIB,
            "{mode:?}: RSS {peak} KiB reached the chart's limit"
        );
        assert!(
            p99(&latencies) <= (p99(&baseline) * 2).max(floor),
            "{mode:?}: A's p99 {:?} against {:?} without the hostile tenant",
            p99(&latencies),
            p99(&baseline)
        );
        assert!(
            requests <= 400,
            "{mode:?}: {requests} requests in about 20 s"
        );
        assert!(requests > 0, "{mode:?}: B's server was asked nothing");
        if let Some(bound) = bound {
            let (_, message) = poll(&format!("B reported over {bound}"), || async {
                match reachable_condition(&w, &w.b).await {
                    Ok((status, message)) if status == "False" && message.contains(bound) => {
                        Ok((status, message))
                    }
                    other => Err(format!("{other:?}")),
                }
            })
            .await;
            eprintln!("{mode:?}: B's WorkloadClustersReachable: {message}");
            // And an Event on B's policy, as `kubectl describe` shows it.
            unreachable_event_naming(&w, bound).await;
        }
    }
    // A's scale-up while B's server sends an endless LIST to a fresh operator: within twice
    // its time without hostility, plus CA's scan interval (1 s: where in its loop CA sees the
    // pods is chance).
    hostile.set(Hostility::EndlessList);
    restarted_serving_a(&mut w, &a_cert).await;
    w.start_autoscaler('a');
    tokio::time::sleep(CA_SETTLES).await;
    let started = Instant::now();
    workload::scale(
        &nodes_a,
        SYSTEM_NAMESPACE,
        &format!("load-{}", w.a.namespace),
        3,
    )
    .await
    .expect("three pods");
    poll("A scaled up by A's autoscaler, B hostile", || async {
        let r = w.replicas(&w.a).await;
        (r == 3).then_some(()).ok_or(format!("replicas {r}"))
    })
    .await;
    let scale_up_hostile = started.elapsed();
    let line = format!(
        "A's scale-up {:.1}s with B's endless LIST (baseline {:.1}s)",
        scale_up_hostile.as_secs_f64(),
        scale_up_baseline.as_secs_f64()
    );
    eprintln!("{line}");
    report.push(line);
    assert!(
        scale_up_hostile <= scale_up_baseline * 2 + Duration::from_secs(1),
        "A's scale-up took {scale_up_hostile:?} with B hostile, {scale_up_baseline:?} without"
    );
    hostile.set(Hostility::Honest);
    eprintln!("hostile server report:\n{}", report.join("\n"));
}

#[path = "multicluster/relay.rs"]
mod relay;
