//! A relay beside A's cluster-autoscaler (`nodegroup-operator relay`): no Kubernetes
//! credentials, its Cluster's view streamed from the shared operator, CA's reads answered from
//! it as the operator answers them, CA's mutations forwarded, reads refused once the stream is
//! gone for longer than allowed, and back when a new operator process leads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use tonic::transport::Channel;

use super::*;

/// Stands in for the operator's Service: forwards each new connection to the address the
/// operator listens on now, so the relay dials one address across operator restarts.
struct Front {
    address: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl Front {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let upstream = Arc::new(Mutex::new(upstream));
        let target = upstream.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = *target.lock().expect("lock");
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Self {
            address,
            upstream,
            task,
        }
    }

    fn retarget(&self, upstream: SocketAddr) {
        *self.upstream.lock().expect("lock") = upstream;
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The relay's process; killed when dropped.
struct Relay {
    child: Child,
    socket: PathBuf,
    admin: SocketAddr,
    log: PathBuf,
}

impl Relay {
    fn start(w: &World, operator: SocketAddr, name: &str) -> Self {
        let cert =
            w.a.pki
                .issue_cluster_client(&w.a.namespace, &w.a.cluster)
                .expect("the relay's certificate");
        let dir = sandbox().dir.join(format!("{}-{name}", w.a.namespace));
        std::fs::create_dir_all(&dir).expect("relay dir");
        let config = dir.join("operator.cloud-config.yaml");
        write_cloud_config(
            &config,
            &format!("localhost:{}", operator.port()),
            &cert,
            &w.a.pki.ca_cert,
            Duration::from_secs(10),
        )
        .expect("cloud-config");
        let socket = dir.join("grpc.sock");
        let admin = SocketAddr::from((
            [127, 0, 0, 1],
            ngo_testbed::process::free_port().expect("port"),
        ));
        let log = dir.join("relay.log");
        let child = Command::new(env!("CARGO_BIN_EXE_nodegroup-operator"))
            .arg("relay")
            .arg(format!("--operator-cloud-config={}", config.display()))
            .arg(format!("--cluster={}/{}", w.a.namespace, w.a.cluster))
            .arg(format!("--grpc-unix-socket={}", socket.display()))
            .arg("--max-staleness=3s")
            .arg(format!("--admin-address={admin}"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::from(std::fs::File::create(&log).expect("log")))
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(&log)
                    .expect("log"),
            ))
            .spawn()
            .expect("start the relay");
        Self {
            child,
            socket,
            admin,
            log,
        }
    }

    async fn client(&self) -> CloudProviderClient<Channel> {
        let socket = self.socket.clone();
        let log = self.log.clone();
        let channel = poll("the relay's socket", || {
            let socket = socket.clone();
            let log = log.clone();
            async move {
                tonic::transport::Endpoint::try_from(format!("unix://{}", socket.display()))
                    .map_err(|e| e.to_string())?
                    .connect()
                    .await
                    .map_err(|e| {
                        format!(
                            "{e}; the relay logged: {}",
                            std::fs::read_to_string(&log).unwrap_or_default()
                        )
                    })
            }
        })
        .await;
        CloudProviderClient::new(channel)
    }

    /// `/readyz` answers 200.
    fn ready(&self) -> bool {
        ngo_testbed::process::http_ok(self.admin, "/readyz")
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An answer reduced to what must match between the relay and the operator.
fn outcome<T: std::fmt::Debug>(answer: Result<tonic::Response<T>, tonic::Status>) -> String {
    match answer {
        Ok(reply) => format!("OK {:?}", reply.into_inner()),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// Every read CA makes, through `client`, for group `id` (A's), the other Cluster's group
/// `foreign` and the provider IDs of A's instances.
async fn reads(
    mut client: CloudProviderClient<Channel>,
    id: &str,
    foreign: &str,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    out.push((
        "NodeGroups".into(),
        outcome(client.node_groups(proto::NodeGroupsRequest {}).await),
    ));
    for group in [id, foreign] {
        out.push((
            format!("TargetSize {group}"),
            outcome(
                client
                    .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: group.into() })
                    .await,
            ),
        ));
        out.push((
            format!("GetOptions {group}"),
            outcome(
                client
                    .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                        id: group.into(),
                        defaults: Some(Default::default()),
                    })
                    .await,
            ),
        ));
        // The template node carries the time it was made: its size and the code must match.
        let template = client
            .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest {
                id: group.into(),
            })
            .await
            .map(|r| r.into_inner().node_bytes.len())
            .map_err(|s| (s.code(), s.message().to_string()));
        out.push((format!("TemplateNodeInfo {group}"), format!("{template:?}")));
    }
    let nodes = client
        .node_group_nodes(proto::NodeGroupNodesRequest { id: id.into() })
        .await;
    let ids: Vec<String> = nodes
        .as_ref()
        .map(|r| r.get_ref().instances.iter().map(|i| i.id.clone()).collect())
        .unwrap_or_default();
    out.push(("NodeGroupNodes".into(), outcome(nodes)));
    for provider_id in ids
        .iter()
        .map(String::as_str)
        .chain(["test:///nobody/none"])
    {
        let node = proto::ExternalGrpcNode {
            provider_id: provider_id.into(),
            ..Default::default()
        };
        out.push((
            format!("NodeGroupForNode {provider_id}"),
            outcome(
                client
                    .node_group_for_node(proto::NodeGroupForNodeRequest {
                        node: Some(node.clone()),
                    })
                    .await,
            ),
        ));
        out.push((
            format!("PricingNodePrice {provider_id}"),
            outcome(
                client
                    .pricing_node_price(proto::PricingNodePriceRequest {
                        node: Some(node),
                        ..Default::default()
                    })
                    .await,
            ),
        ));
    }
    out.push((
        "GPULabel".into(),
        outcome(client.gpu_label(proto::GpuLabelRequest {}).await),
    ));
    out.push((
        "GetAvailableGPUTypes".into(),
        outcome(
            client
                .get_available_gpu_types(proto::GetAvailableGpuTypesRequest {})
                .await,
        ),
    ));
    out.push((
        "Refresh".into(),
        outcome(client.refresh(proto::RefreshRequest {}).await),
    ));
    out
}

fn stream_gauge(admin: SocketAddr) -> Option<i64> {
    ngo_testbed::process::http_get(admin, "/metrics")
        .ok()?
        .lines()
        .find(|l| l.starts_with("nodegroup_relay_streams "))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_answers_as_the_operator_scales_through_it_and_refuses_reads_once_its_stream_is_gone()
 {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut w = World::new("relay", 1, 1).await;
    let (id_a, id_b) = (World::id(&w.a), World::id(&w.b));
    let nodes_a = w.a.nodes_client().await.expect("a");
    let front = Front::start(w.address).await;
    let relay = Relay::start(&w, front.address, "relay");
    let mut through_relay = relay.client().await;
    poll("the relay to serve A's group", || async {
        let groups = through_relay
            .clone()
            .node_groups(proto::NodeGroupsRequest {})
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
        let ids: Vec<String> = groups
            .into_inner()
            .node_groups
            .into_iter()
            .map(|g| g.id)
            .collect();
        (ids == vec![id_a.clone()])
            .then_some(())
            .ok_or(format!("{ids:?}"))
    })
    .await;
    assert!(relay.ready(), "ready once its copy is fresh");
    // The group can reach the relay before its Machine has a Node: compare reads once the
    // relay's copy holds A's instance, so both sides answer about the same world.
    poll("the relay to list A's instance", || async {
        let nodes = through_relay
            .clone()
            .node_group_nodes(proto::NodeGroupNodesRequest { id: id_a.clone() })
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
        let count = nodes.into_inner().instances.len();
        (count == 1)
            .then_some(())
            .ok_or(format!("{count} instances"))
    })
    .await;
    assert_eq!(
        stream_gauge(w.admin),
        Some(1),
        "the operator counts one relay stream"
    );

    // Every read answers as the operator answers A's own certificate.
    let a_cert =
        w.a.pki
            .issue_cluster_client(&w.a.namespace, &w.a.cluster)
            .expect("cert");
    let direct = connect_as(&w, &a_cert).await;
    let (from_relay, from_operator) = (
        reads(through_relay.clone(), &id_a, &id_b).await,
        reads(direct.clone(), &id_a, &id_b).await,
    );
    // NodeGroups, three reads of each of two groups, NodeGroupNodes, two per instance and two
    // for an unknown node, GPULabel, GPU types and Refresh: at least 14 with one instance.
    assert!(from_relay.len() >= 14, "{from_relay:#?}");
    assert_eq!(from_relay.len(), from_operator.len(), "{from_relay:#?}");
    for (relayed, direct) in from_relay.iter().zip(&from_operator) {
        assert_eq!(relayed, direct, "through the relay and from the operator");
    }

    // A tenant's relay learns nothing of another Cluster: with A's certificate, asking for B's
    // view is refused, and A's own view names nothing in B's namespace.
    let mut stream = ngo_service::relay::wire::proto::relay_client::RelayClient::new(
        channel_as(&w, &a_cert).await,
    );
    let asked = |cluster: String| ngo_service::relay::wire::proto::WatchRequest {
        protocol: ngo_service::relay::wire::PROTOCOL,
        cluster,
    };
    let refused = stream
        .watch(asked(format!("{}/{}", w.b.namespace, w.b.cluster)))
        .await
        .map(|_| ())
        .expect_err("B's view with A's certificate");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let mut own = stream
        .watch(asked(format!("{}/{}", w.a.namespace, w.a.cluster)))
        .await
        .expect("A's own view")
        .into_inner();
    let first = own
        .message()
        .await
        .expect("an update")
        .expect("the stream is open");
    let text = format!("{first:?}");
    assert!(first.reset && !first.groups.is_empty(), "{text}");
    assert!(
        !text.contains(&w.b.namespace),
        "A's view names something of B's: {text}"
    );
    drop(own);

    // Read-your-writes: a forwarded IncreaseSize is in the relay's very next TargetSize.
    through_relay
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: id_a.clone(),
            delta: 1,
        })
        .await
        .expect("IncreaseSize through the relay");
    let target = through_relay
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id_a.clone() })
        .await
        .expect("TargetSize")
        .into_inner()
        .target_size;
    assert_eq!(target, 2, "the relay's read after its own write");
    assert_eq!(w.replicas(&w.a).await, 2);

    // The real cluster-autoscaler through the relay: pending pods scale A up.
    let ca_config = sandbox()
        .dir
        .join(format!("{}-ca-via-relay.cloud-config.yaml", w.a.namespace));
    ngo_sandbox::operator::write_unix_socket_cloud_config(
        &ca_config,
        &relay.socket,
        Duration::from_secs(10),
    )
    .expect("CA's cloud-config");
    let mut options = AutoscalerOptions::new(
        CloudProvider::ExternalGrpc {
            cloud_config: ca_config,
        },
        &sandbox().workload_clusters[0].kubeconfig,
        SYSTEM_NAMESPACE,
    );
    options.name = format!("{}-cluster-autoscaler-via-relay", w.a.namespace);
    w.a.start_autoscaler(&options).expect("cluster-autoscaler");
    w.load_a(&nodes_a, 3, "A scaled up to 3 by CA through the relay")
        .await;

    // The stream gone (the operator stopped): within the allowed staleness, reads are
    // refused, saying why, and the relay is not ready.
    w.a.kill_operator();
    let refused = poll("the relay to refuse reads", || {
        let mut client = through_relay.clone();
        let id = id_a.clone();
        async move {
            match client
                .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
                .await
            {
                Err(status) if status.code() == tonic::Code::Unavailable => Ok(status),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert!(
        refused
            .message()
            .contains("heard nothing from the operator"),
        "{}",
        refused.message()
    );
    assert!(!relay.ready(), "not ready while it refuses reads");

    // A new operator process (a new leader) behind the same address: the relay streams again
    // and CA scales A down through it once the load is gone.
    restart_operator(&mut w);
    front.retarget(w.address);
    poll("the relay to answer again", || async {
        through_relay
            .clone()
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id_a.clone() })
            .await
            .map(|_| ())
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
    })
    .await;
    workload::scale(
        &nodes_a,
        SYSTEM_NAMESPACE,
        &format!("load-{}", w.a.namespace),
        0,
    )
    .await
    .expect("remove the load");
    poll(
        "A scaled down to its minimum by CA through the relay",
        || async {
            let r = w.replicas(&w.a).await;
            (r == 1).then_some(()).ok_or(format!("replicas {r}"))
        },
    )
    .await;
    poll("one Node left in A's cluster", || async {
        let a = nodes_in(&nodes_a, &w.a.namespace).await;
        (a.len() == 1).then_some(()).ok_or(format!("{a:?}"))
    })
    .await;
    let relay_log = std::fs::read_to_string(&relay.log).unwrap_or_default();
    assert!(
        relay_log.contains("reconnecting"),
        "the relay saw its stream end: {relay_log}"
    );
}
