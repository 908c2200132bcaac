//! `make demo`: the sandbox, the operator binary and the real cluster-autoscaler over mTLS;
//! a Cluster with one MachineDeployment bounded by a NodeGroupPolicy (or, with `--cherry`,
//! a NodePool of servers on the Cherry Servers emulator); a workload that grows and shrinks;
//! and a live view of the node group as cluster-autoscaler sees it, with its decisions as
//! they happen.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::environment::{Sandbox, WORKER_TEMPLATE, wait_for};
use crate::stack::AutoscaledCluster;
use ngo_testbed::autoscaler::AutoscalerStatus;
use ngo_testbed::capi;
use ngo_testbed::cherry::{CherryEmulator, CherryOptions};
use ngo_testbed::workload::{self, Decision, PodCounts};

/// Namespace (and Cluster name) of the demo.
pub const NAMESPACE: &str = "demo";
const GROUP_NAME: &str = "workers";
const APP: &str = "demo-app";
const POOL_LABEL: &str = "sandbox.nodegroup.dev/pool";
/// Pods the workload grows to; each asks for 3 of a node's 4 CPUs, so one pod per node.
const PEAK_PODS: i32 = 4;
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// Which kind of node group the demo scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DemoGroup {
    /// A Cluster API MachineDeployment bounded by a NodeGroupPolicy.
    MachineDeployment,
    /// A NodePool of servers on the Cherry Servers emulator.
    CherryNodePool,
}

/// How the demo prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// A table redrawn in place (interactive terminals).
    Live,
    /// One line per change (logs, CI, pipes).
    Plain,
}

/// Times the demo measured.
#[derive(Clone, Debug, Default)]
pub struct DemoReport {
    /// Workload grown until cluster-autoscaler raised the group's target.
    pub scale_up_decision: Duration,
    /// Workload grown until every pod ran.
    pub scale_up_done: Duration,
    /// Workload removed until the group's target was back at its minimum.
    pub scale_down_decision: Duration,
    /// Workload removed until the surplus Nodes were gone.
    pub scale_down_done: Duration,
}

/// Runs the scenario against a started sandbox whose `cluster` has the operator and
/// cluster-autoscaler running.
pub async fn run(
    cluster: &mut AutoscaledCluster,
    output: Output,
    started: Instant,
    kind: DemoGroup,
) -> anyhow::Result<DemoReport> {
    let client = cluster.client().await?;
    let mut view = View::new(output, started);
    let namespace = cluster.namespace.clone();
    // Lives as long as the scenario: its servers are the NodePool's Nodes.
    let mut _cloud = None;
    let group = match kind {
        DemoGroup::MachineDeployment => {
            apply_policy_and_deployment(&client, &namespace, &cluster.cluster).await?;
            view.say(&format!(
                "applied NodeGroupPolicy {namespace}/{GROUP_NAME} (min 1, max 5, price 0.19/h) and \
                 MachineDeployment {namespace}/{GROUP_NAME} (1 replica, 4 CPU / 16Gi nodes, no annotations)"
            ));
            format!("MachineDeployment/{namespace}/{GROUP_NAME}")
        }
        DemoGroup::CherryNodePool => {
            let cloud = CherryEmulator::start(CherryOptions {
                cluster: Some(client.clone()),
                ..Default::default()
            })
            .await?;
            apply_node_pool(&client, &namespace, &cluster.cluster, &cloud).await?;
            view.say(&format!(
                "Cherry Servers emulator at {}; applied Secret {namespace}/cherry and NodePool \
                 {namespace}/{GROUP_NAME} (plan e3_1240v3: 4 cores / 16 GB, min 1, max 5)",
                cloud.url()
            ));
            _cloud = Some(cloud);
            format!("NodePool/{namespace}/{GROUP_NAME}")
        }
    };
    wait_view(
        cluster,
        &client,
        &mut view,
        &group,
        "the group's first node to be Ready",
        |s| (s.target == 1 && s.ready == 1).then_some(()),
    )
    .await?;

    let selector = BTreeMap::from([(POOL_LABEL.to_string(), GROUP_NAME.to_string())]);
    let app = workload::deployment(&namespace, APP, PEAK_PODS, "3", &selector)?;
    workload::create(&client, &app).await?;
    let grown = Instant::now();
    view.say(&format!(
        "workload {APP}: {PEAK_PODS} pods requesting 3 CPU each (one per node)"
    ));
    let want = i64::from(PEAK_PODS);
    let scale_up_decision = wait_view(
        cluster,
        &client,
        &mut view,
        &group,
        "cluster-autoscaler to raise the target",
        |s| (s.target == want).then(|| grown.elapsed()),
    )
    .await?;
    let scale_up_done = wait_view(
        cluster,
        &client,
        &mut view,
        &group,
        "every pod running",
        |s| (s.pods.running == PEAK_PODS as usize && s.ready == want).then(|| grown.elapsed()),
    )
    .await?;
    view.say(&format!(
        "scale-up: target raised after {:.1}s, all pods running after {:.1}s",
        scale_up_decision.as_secs_f64(),
        scale_up_done.as_secs_f64()
    ));

    workload::scale(&client, &namespace, APP, 0).await?;
    let shrunk = Instant::now();
    view.say(&format!("workload {APP} scaled to 0 pods"));
    let scale_down_decision = wait_view(
        cluster,
        &client,
        &mut view,
        &group,
        "cluster-autoscaler to remove the idle nodes",
        |s| (s.target == 1).then(|| shrunk.elapsed()),
    )
    .await?;
    let scale_down_done = wait_view(
        cluster,
        &client,
        &mut view,
        &group,
        "the surplus nodes to be gone",
        |s| (s.target == 1 && s.registered == 1 && s.nodes == 1).then(|| shrunk.elapsed()),
    )
    .await?;
    view.say(&format!(
        "scale-down: target back to 1 after {:.1}s, nodes gone after {:.1}s",
        scale_down_decision.as_secs_f64(),
        scale_down_done.as_secs_f64()
    ));
    Ok(DemoReport {
        scale_up_decision,
        scale_up_done,
        scale_down_decision,
        scale_down_done,
    })
}

/// The NodeGroupPolicy supplies bounds and a price; the MachineDeployment carries no
/// autoscaler annotation at all.
async fn apply_policy_and_deployment(
    client: &Client,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<()> {
    let policy: ngo_api::NodeGroupPolicy = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
        "kind": "NodeGroupPolicy",
        "metadata": {"name": GROUP_NAME, "namespace": namespace},
        "spec": {
            "selector": {"kinds": ["MachineDeployment"], "clusterName": cluster,
                         "matchLabels": {"pool": GROUP_NAME}},
            "minSize": 1,
            "maxSize": 5,
            "pricing": {"nodeHourly": 0.19}
        }
    }))?;
    Api::<ngo_api::NodeGroupPolicy>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &policy)
        .await?;
    let mut md = capi::machine_deployment(
        namespace,
        cluster,
        GROUP_NAME,
        1,
        json!({}),
        WORKER_TEMPLATE,
    )?;
    md.labels_mut().insert("pool".into(), GROUP_NAME.into());
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machine_deployments())
        .create(&PostParams::default(), &md)
        .await?;
    Ok(())
}

/// A NodePool of Cherry Servers servers (min 1, max 5) whose Nodes carry the demo label, and
/// the Secret with the emulator's token.
async fn apply_node_pool(
    client: &Client,
    namespace: &str,
    cluster: &str,
    cloud: &CherryEmulator,
) -> anyhow::Result<()> {
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "cherry", "namespace": namespace},
        "stringData": {"token": cloud.token()},
    }))?;
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await?;
    let pool: ngo_api::NodePool = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": GROUP_NAME, "namespace": namespace},
        "spec": {
            "replicas": 1, "minSize": 1, "maxSize": 5, "clusterName": cluster,
            "template": {"labels": {POOL_LABEL: GROUP_NAME}},
            "cherryServers": {
                "credentialsSecretRef": {"name": "cherry", "key": "token"},
                "projectId": 1, "region": "eu_nord_1", "plan": "e3_1240v3",
                "image": "ubuntu_22_04", "apiServerEndpoint": "127.0.0.1:6443",
                "endpoint": cloud.url(),
                "userData": ngo_testbed::cherry::JOIN_USER_DATA,
            },
        },
    }))?;
    Api::<ngo_api::NodePool>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pool)
        .await?;
    Ok(())
}

/// The labels every demo Node carries (the workload's node selector).
pub fn node_labels() -> serde_json::Value {
    json!({POOL_LABEL: GROUP_NAME})
}

/// One observation of the demo group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct GroupState {
    /// As cluster-autoscaler reports it (status ConfigMap).
    min: i64,
    max: i64,
    target: i64,
    registered: i64,
    ready: i64,
    unregistered: i64,
    scale_up: String,
    scale_down: String,
    /// Nodes of the group in the API server.
    nodes: i64,
    pods: PodCounts,
}

async fn observe(
    cluster: &AutoscaledCluster,
    client: &Client,
    group: &str,
) -> anyhow::Result<Option<GroupState>> {
    let Some(autoscaler) = cluster.autoscaler() else {
        anyhow::bail!("cluster-autoscaler is not running");
    };
    let status: Option<AutoscalerStatus> = autoscaler.status(client).await?;
    let Some(entry) = status
        .as_ref()
        .and_then(|s| s.node_groups.iter().find(|g| g.name == group))
    else {
        return Ok(None);
    };
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .list(&kube::api::ListParams::default().labels(&format!("{POOL_LABEL}={GROUP_NAME}")))
        .await?
        .items
        .len() as i64;
    let health = &entry.health;
    Ok(Some(GroupState {
        min: health.min_size,
        max: health.max_size,
        target: health.cloud_provider_target,
        registered: health.node_counts.registered.total,
        ready: health.node_counts.registered.ready,
        unregistered: health.node_counts.unregistered,
        scale_up: entry.scale_up.status.clone(),
        scale_down: entry.scale_down.status.clone(),
        nodes,
        pods: workload::pod_counts(client, &cluster.namespace, APP).await?,
    }))
}

/// Refreshes the view every half second until `done` accepts a state.
async fn wait_view<T>(
    cluster: &mut AutoscaledCluster,
    client: &Client,
    view: &mut View,
    group: &str,
    what: &str,
    mut done: impl FnMut(&GroupState) -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        cluster.check_alive()?;
        let state = observe(cluster, client, group).await?;
        let decisions = [
            workload::decisions(client, &cluster.namespace).await?,
            workload::decisions(client, "default").await?,
        ]
        .concat();
        view.update(group, state.as_ref(), decisions, what);
        if let Some(value) = state.as_ref().and_then(&mut done) {
            return Ok(value);
        }
        if start.elapsed() > STEP_TIMEOUT {
            anyhow::bail!(
                "timed out after {STEP_TIMEOUT:?} waiting for {what}; last state: {state:?}; \
                 logs: see the sandbox log directory"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the demo prints: the group row and cluster-autoscaler's decisions.
struct View {
    output: Output,
    started: Instant,
    last_row: Option<GroupState>,
    seen: BTreeSet<(String, String, String)>,
    log: Vec<String>,
}

impl View {
    fn new(output: Output, started: Instant) -> Self {
        Self {
            output,
            started,
            last_row: None,
            seen: BTreeSet::new(),
            log: Vec::new(),
        }
    }

    fn stamp(&self) -> String {
        format!("[{:>6.1}s]", self.started.elapsed().as_secs_f64())
    }

    /// A narrative line.
    fn say(&mut self, line: &str) {
        let line = format!("{} {line}", self.stamp());
        match self.output {
            Output::Plain => println!("{line}"),
            Output::Live => self.log.push(line),
        }
    }

    fn update(
        &mut self,
        group: &str,
        state: Option<&GroupState>,
        decisions: Vec<Decision>,
        waiting_for: &str,
    ) {
        for d in decisions {
            // A pod event repeats for every pod; show each decision message once.
            let key = (d.reason.clone(), d.message.clone(), d.object.clone());
            let short = (d.reason.clone(), d.message.clone(), String::new());
            if self.seen.contains(&key)
                || (d.reason == "TriggeredScaleUp" && self.seen.contains(&short))
            {
                continue;
            }
            self.seen.insert(key);
            self.seen.insert(short);
            let line = format!(
                "cluster-autoscaler: {} {}: {}",
                d.reason, d.object, d.message
            );
            self.say(&line);
        }
        match self.output {
            Output::Plain => {
                if let Some(state) = state
                    && self.last_row.as_ref() != Some(state)
                {
                    if self.last_row.is_none() {
                        println!("{:>9} {}", "", header());
                    }
                    println!("{} {}", self.stamp(), row(group, state));
                    self.last_row = Some(state.clone());
                }
            }
            Output::Live => {
                let mut out = String::from("\x1b[H\x1b[2J");
                out.push_str(&format!(
                    "nodegroup-operator demo — cluster-autoscaler 1.36.1 (externalgrpc, mTLS) {}\n\n",
                    self.stamp()
                ));
                out.push_str(&format!("{}\n", header()));
                match state {
                    Some(state) => out.push_str(&format!("{}\n", row(group, state))),
                    None => out.push_str(&format!(
                        "{group:<34} (not reported by cluster-autoscaler yet)\n"
                    )),
                }
                out.push_str(&format!("\nwaiting for {waiting_for}\n\n"));
                let tail = self.log.len().saturating_sub(16);
                for line in &self.log[tail..] {
                    out.push_str(line);
                    out.push('\n');
                }
                print!("{out}");
                let _ = std::io::stdout().flush();
            }
        }
    }
}

fn header() -> String {
    format!(
        "{:<34} {:>3} {:>3} {:>6} {:>10} {:>5} {:>5} {:>12}  {:<11} {:<16}",
        "GROUP",
        "MIN",
        "MAX",
        "TARGET",
        "REGISTERED",
        "READY",
        "NODES",
        "PODS run/pen",
        "SCALE-UP",
        "SCALE-DOWN"
    )
}

fn row(group: &str, s: &GroupState) -> String {
    let registered = if s.unregistered > 0 {
        format!("{} (+{})", s.registered, s.unregistered)
    } else {
        s.registered.to_string()
    };
    format!(
        "{:<34} {:>3} {:>3} {:>6} {:>10} {:>5} {:>5} {:>12}  {:<11} {:<16}",
        group,
        s.min,
        s.max,
        s.target,
        registered,
        s.ready,
        s.nodes,
        format!("{}/{}", s.pods.running, s.pods.pending),
        s.scale_up,
        s.scale_down
    )
}

/// Prepares a started sandbox for the demo: the demo Cluster, the operator and
/// cluster-autoscaler (processes started on the calling thread).
pub async fn start(sandbox: &Sandbox, started: Instant) -> anyhow::Result<AutoscaledCluster> {
    let say = |line: &str| println!("[{:>6.1}s] {line}", started.elapsed().as_secs_f64());
    let mut cluster =
        AutoscaledCluster::create(&sandbox.info(), NAMESPACE, NAMESPACE, node_labels()).await?;
    say(&format!("Cluster {NAMESPACE}/{NAMESPACE} connected"));
    let operator = cluster.operator_options();
    cluster.start_operator(&operator)?;
    let address = cluster
        .operator()
        .map(|o| o.grpc_address.to_string())
        .unwrap_or_default();
    say(&format!(
        "nodegroup-operator serving {address} (mTLS, client certificates required)"
    ));
    let autoscaler = cluster.externalgrpc_autoscaler()?;
    cluster.start_autoscaler(&autoscaler)?;
    say("cluster-autoscaler 1.36.1 running with --cloud-provider=externalgrpc");
    let client = cluster.client().await?;
    wait_for(
        "cluster-autoscaler's first status",
        STEP_TIMEOUT,
        Duration::from_millis(500),
        || async {
            match cluster.autoscaler() {
                Some(a) => match a.status(&client).await {
                    Ok(Some(s)) if s.autoscaler_status == "Running" => Ok(()),
                    other => Err(format!("{other:?}")),
                },
                None => Err("not running".into()),
            }
        },
    )
    .await?;
    Ok(cluster)
}
