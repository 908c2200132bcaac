//! The API server goes away and comes back: reads keep answering from the operator's caches
//! with the last known state, mutations fail fast with `Unavailable` saying why, and the
//! watches resume on their own once the API server is back.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use k8s_pb::api::core::v1 as pb;
use kube::api::{Patch, PatchParams};
use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use ngo_testbed::{self as testbed, ControlPlane, ControlPlaneOptions};
use prost::Message as _;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

use crate::support::*;

/// What the test asks of its control plane's thread.
enum Command {
    StopApiserver,
    RestartApiserver,
}

type Reply = tokio::sync::oneshot::Sender<anyhow::Result<()>>;

/// A control plane of this test's own (the shared one must keep its API server), owned by a
/// thread that runs its processes (children die with the thread that spawned them) and
/// carries out commands. Dropping this handle stops the thread and the processes.
struct OwnPlane {
    admin_kubeconfig: PathBuf,
    operator_kubeconfig: PathBuf,
    commands: mpsc::Sender<(Command, Reply)>,
}

impl OwnPlane {
    async fn start() -> Self {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (commands, received) = mpsc::channel::<(Command, Reply)>();
        std::thread::spawn(move || {
            let started = (|| -> anyhow::Result<(ControlPlane, PathBuf)> {
                let plane = ControlPlane::start(&ControlPlaneOptions::default())?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let operator_kubeconfig = rt.block_on(async {
                    let client = plane.client().await?;
                    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
                    testbed::capi::install_crds(&client, &[&root.join("crds")]).await?;
                    rbac::install_operator_identity(&plane, &client).await
                })?;
                Ok((plane, operator_kubeconfig))
            })();
            let mut plane = match started {
                Ok((plane, operator)) => {
                    let _ = started_tx.send(Ok((plane.kubeconfig.clone(), operator)));
                    plane
                }
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            while let Ok((command, reply)) = received.recv() {
                let done = match command {
                    Command::StopApiserver => {
                        plane.stop_apiserver();
                        Ok(())
                    }
                    Command::RestartApiserver => plane.restart_apiserver(),
                };
                let _ = reply.send(done);
            }
        });
        let (admin_kubeconfig, operator_kubeconfig) = started_rx
            .await
            .expect("control plane thread")
            .unwrap_or_else(|e| panic!("starting the control plane: {e:#}"));
        Self {
            admin_kubeconfig,
            operator_kubeconfig,
            commands,
        }
    }

    async fn run(&self, command: Command) {
        let (reply, done) = tokio::sync::oneshot::channel();
        self.commands.send((command, reply)).expect("plane thread");
        done.await
            .expect("plane thread")
            .unwrap_or_else(|e| panic!("control plane command: {e:#}"));
    }
}

/// Everything the read RPCs say about one group, comparable across the outage.
#[derive(Debug, PartialEq)]
struct View {
    groups: Vec<proto::NodeGroup>,
    group_for_node: Option<proto::NodeGroup>,
    target: i32,
    instances: Vec<proto::Instance>,
    /// Labels and capacity of the template node (its timestamp is "now" on every call).
    template: (
        std::collections::BTreeMap<String, String>,
        std::collections::BTreeMap<String, k8s_pb::apimachinery::pkg::api::resource::Quantity>,
    ),
}

async fn read_view(
    client: &CloudProviderClient<Channel>,
    id: &str,
    provider_id: &str,
) -> Result<View, tonic::Status> {
    let mut c = client.clone();
    c.refresh(proto::RefreshRequest {}).await?;
    let groups = c
        .node_groups(proto::NodeGroupsRequest {})
        .await?
        .into_inner()
        .node_groups;
    let group_for_node = c
        .node_group_for_node(proto::NodeGroupForNodeRequest {
            node: Some(proto::ExternalGrpcNode {
                provider_id: provider_id.into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .node_group;
    let target = c
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.into() })
        .await?
        .into_inner()
        .target_size;
    let instances = c
        .node_group_nodes(proto::NodeGroupNodesRequest { id: id.into() })
        .await?
        .into_inner()
        .instances;
    let bytes = c
        .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id: id.into() })
        .await?
        .into_inner()
        .node_bytes;
    let node = pb::Node::decode(bytes.as_slice())
        .map_err(|e| tonic::Status::internal(format!("template is not a v1.Node: {e}")))?;
    let template = (
        node.metadata.unwrap_or_default().labels,
        node.status.unwrap_or_default().capacity,
    );
    Ok(View {
        groups,
        group_for_node,
        target,
        instances,
        template,
    })
}

/// Runs `call` with a client deadline of 10 s; returns its refusal and how long it took.
async fn refused<T, F>(what: &str, call: F) -> (tonic::Status, Duration)
where
    F: Future<Output = Result<T, tonic::Status>>,
{
    let start = Instant::now();
    let result = call.await;
    let took = start.elapsed();
    match result {
        Ok(_) => panic!("{what} succeeded while the API server is down"),
        Err(status) => (status, took),
    }
}

fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(10));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_use_the_cache_and_writes_fail_fast_while_the_api_server_is_down() {
    let plane = OwnPlane::start().await;
    let admin = testbed::controlplane::client_for(&plane.admin_kubeconfig)
        .await
        .unwrap();
    let ns = TestNs::new_with(admin.clone(), "apiserver-down").await;
    let pids = deployment_with_nodes(&ns, "md", 1, 5, 2).await;
    let capacity = json!({"metadata": {"annotations": {
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "2",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "4Gi"
    }}});
    ns.api(&machine_deployments())
        .patch("md", &PatchParams::default(), &Patch::Merge(capacity))
        .await
        .unwrap();
    let config = operator_config_as(&ns.name, plane.operator_kubeconfig.clone(), None);
    let operator = nodegroup_operator::runtime::start(config).await.unwrap();
    let channel = Channel::from_shared(format!(
        "http://{}",
        operator.grpc_address.expect("a TCP listener")
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let client = CloudProviderClient::new(channel);
    let id = format!("MachineDeployment/{}/md", ns.name);
    let before = eventually("the full view of md", Duration::from_secs(20), || {
        let (client, id, pid) = (client.clone(), id.clone(), pids[0].clone());
        async move {
            read_view(&client, &id, &pid).await.ok().filter(|v| {
                v.instances.len() == 2 && v.template.1.contains_key("cpu") && v.target == 2
            })
        }
    })
    .await;
    assert_eq!(before.groups.len(), 1);
    assert_eq!(
        before.group_for_node.as_ref().map(|g| g.id.as_str()),
        Some(id.as_str())
    );

    let down = Instant::now();
    plane.run(Command::StopApiserver).await;
    assert!(
        admin.apiserver_version().await.is_err(),
        "the API server is down"
    );

    // Reads answer from the cache, with the last known state.
    let start = Instant::now();
    let during = read_view(&client, &id, &pids[0])
        .await
        .expect("reads answer while the API server is down");
    let reads_took = start.elapsed();
    assert_eq!(during, before);

    // Mutations fail fast and say why.
    let mut c = client.clone();
    let (increase, increase_took) = refused(
        "IncreaseSize",
        c.node_group_increase_size(with_deadline(proto::NodeGroupIncreaseSizeRequest {
            id: id.clone(),
            delta: 1,
        })),
    )
    .await;
    let (delete, delete_took) = refused(
        "DeleteNodes",
        c.node_group_delete_nodes(with_deadline(proto::NodeGroupDeleteNodesRequest {
            id: id.clone(),
            nodes: vec![proto::ExternalGrpcNode {
                provider_id: pids[0].clone(),
                ..Default::default()
            }],
        })),
    )
    .await;
    let (decrease, decrease_took) = refused(
        "DecreaseTargetSize",
        c.node_group_decrease_target_size(with_deadline(
            proto::NodeGroupDecreaseTargetSizeRequest {
                id: id.clone(),
                delta: -1,
            },
        )),
    )
    .await;
    for (what, status, took, action) in [
        (
            "IncreaseSize",
            &increase,
            increase_took,
            format!("reading the scale of {id}"),
        ),
        ("DeleteNodes", &delete, delete_took, format!("reading {id}")),
        (
            "DecreaseTargetSize",
            &decrease,
            decrease_took,
            format!("reading the scale of {id}"),
        ),
    ] {
        eprintln!("{what} refused after {took:?}: {}", status.message());
        assert_eq!(
            status.code(),
            Code::Unavailable,
            "{what}: {}",
            status.message()
        );
        assert!(
            status.message().starts_with(&format!(
                "could not reach the Kubernetes API server: {action}"
            )),
            "{what}: {}",
            status.message()
        );
        assert!(
            took < Duration::from_secs(2),
            "{what} took {took:?} to fail (client deadline 10 s)"
        );
    }
    eprintln!("reads during the outage took {reads_took:?} for six RPCs");

    plane.run(Command::RestartApiserver).await;
    let restarted = Instant::now();
    eprintln!("the API server was down for {:?}", down.elapsed());
    // Nothing was written while the API server was down.
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    assert!(
        !ns.annotations(&machines(), "md-m0")
            .await
            .contains_key(DELETE_MACHINE)
    );

    // The watches resume without restarting the operator.
    ns.api(&machine_deployments())
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {MAX: "7"}}})),
        )
        .await
        .unwrap();
    eventually(
        "the new max size in NodeGroups",
        Duration::from_secs(30),
        || {
            let mut c = client.clone();
            async move {
                let groups = c.node_groups(proto::NodeGroupsRequest {}).await.ok()?;
                groups
                    .into_inner()
                    .node_groups
                    .iter()
                    .any(|g| g.max_size == 7)
                    .then_some(())
            }
        },
    )
    .await;
    let resumed = restarted.elapsed();
    eprintln!(
        "a change made after the restart reached NodeGroups {resumed:?} after the API server was ready"
    );
    assert!(
        resumed < Duration::from_secs(10),
        "watches took {resumed:?} to resume"
    );
    c.node_group_increase_size(with_deadline(proto::NodeGroupIncreaseSizeRequest {
        id: id.clone(),
        delta: 1,
    }))
    .await
    .expect("a mutation succeeds once the API server is back");
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 3);
    operator.shutdown().await.unwrap();
}
