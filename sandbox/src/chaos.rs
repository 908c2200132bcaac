//! `make chaos`: the real cluster-autoscaler decides while the world misbehaves.
//! MachineDeployments, a MachinePool and a NodePool (Cherry Servers emulator) scale up and down
//! under workloads whose pods come and go, and seeded outside actions happen meanwhile:
//! replicas raised by hand (IncreaseSize, `kubectl scale`) and lowered by a person
//! (`kubectl scale`), MachineDeployment rollouts, MachineSets and the Cluster paused and
//! resumed, Cluster API stalled, a person's delete-machine annotation, the cloud refusing
//! deletions for a while, the operator killed and restarted, cluster-autoscaler restarted, and
//! lost replies from the API server (the fault proxy in front of the operator). CA reaches the
//! operator through a [`Tap`], so a [`DeletionAuditor`] judges every Machine deletion, and every
//! NodePool Node's, by CA's own answers (U1 of `docs/safety.md`). Seeded and replayable: the same seed takes the same actions in the same
//! order (what the processes do in between is timing). Results go to
//! `target/chaos/results.json`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_api::NodePool;
use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::environment::SandboxInfo;
use crate::stack::AutoscaledCluster;
use crate::tap::Tap;
use crate::world::{POD_CPU, POOL_LABEL};
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::capi;
use ngo_testbed::cherry::{CherryEmulator, CherryOptions, FaultAction, RequestKind};
use ngo_testbed::faultproxy::{FaultPlan, FaultProxy};
use ngo_testbed::infra_provider;
use ngo_testbed::stall::Stall;
use ngo_testbed::workload;

/// Chaos parameters.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// How long the actions go on.
    pub duration: Duration,
    /// Seed of the action sequence (and of the fault proxy).
    pub seed: u64,
    /// MachineDeployments (min 1, max 5), each with its own workload; one MachinePool and one
    /// NodePool (min 1, max 5) come besides.
    pub groups: usize,
    /// Mean time between two actions.
    pub action_interval: Duration,
    /// Share of the operator's writes to Machines and MachineDeployments the fault proxy
    /// lies about (dropped replies after commit, resets, 429, 500 after commit, delays).
    pub fault_rate: f64,
}

/// What `target/chaos/results.json` holds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChaosResults {
    /// The seed.
    pub seed: u64,
    /// Seconds of actions.
    pub duration_s: f64,
    /// Groups: the MachineDeployments, the MachinePool and the NodePool.
    pub groups: usize,
    /// Nodes named in DeleteNodes calls cluster-autoscaler heard OK for.
    pub scale_downs: u64,
    /// DeleteNodes calls answered OK.
    pub delete_nodes_ok: u64,
    /// DeleteNodes calls answered an error (CA untainted their nodes).
    pub delete_nodes_errors: u64,
    /// Removals the auditor saw: Machines deleted, NodePool Nodes gone.
    pub removals: usize,
    /// Outside actions taken, by kind.
    pub actions: BTreeMap<String, u64>,
    /// Faults the proxy injected into the operator's writes, by kind.
    pub faults_injected: BTreeMap<String, u64>,
    /// U1 violations: a Machine deleted while CA's latest answer for its node was an error,
    /// or its node untainted, or still running pods CA did not drain.
    pub violations: Vec<String>,
    /// Deletions of nodes whose taint a restart of cluster-autoscaler removed after an OK:
    /// the documented residue no provider can close.
    pub residue: Vec<String>,
    /// Deletions of Machines a person had annotated with delete-machine, or taken by Cluster
    /// API for replicas a person lowered (theirs to ask).
    pub by_person: Vec<String>,
    /// Deletions of Machines of an older MachineSet during a rollout (Cluster API's, by
    /// design).
    pub by_rollout: Vec<String>,
    /// Every DeleteNodes cluster-autoscaler made, as the tap saw it (see [`Tap::journal`]),
    /// and the outside actions, in the order they came.
    pub journal: Vec<String>,
}

/// An action to undo later (a pause, a stall, an annotation).
enum Undo {
    MachineSetPaused(String),
    ClusterPaused,
    Stalled(Stall),
    Annotated(String),
    CloudOutage,
}

/// What kind of group a chaos group is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Deployment,
    MachinePool,
    NodePool,
}

/// One autoscaled group and its workload `app-<name>`.
struct Group {
    kind: Kind,
    name: String,
    id: String,
}

impl Group {
    fn resource(&self) -> kube::discovery::ApiResource {
        match self.kind {
            Kind::Deployment => capi::machine_deployments(),
            Kind::MachinePool => capi::machine_pools(),
            Kind::NodePool => kube::discovery::ApiResource::erase::<NodePool>(&()),
        }
    }

    /// What the auditor counts a person's decrement of this group under.
    fn person_key(&self, ns: &str) -> String {
        match self.kind {
            Kind::NodePool => format!("{ns}-{}", self.name),
            _ => self.name.clone(),
        }
    }
}

/// Runs chaos on a started sandbox with the operator binary `binary`.
pub async fn run(
    sandbox: &SandboxInfo,
    binary: &Path,
    options: &ChaosOptions,
) -> anyhow::Result<ChaosResults> {
    let namespace = format!("chaos-{}", options.seed % 100_000);
    let mut cluster = AutoscaledCluster::create(sandbox, &namespace, "c1", json!({})).await?;
    let client = cluster.client().await?;
    let ns = namespace.as_str();
    let mut groups: Vec<Group> = Vec::new();
    let bounds = json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "5"});
    for i in 0..options.groups {
        let name = format!("g{i}");
        let label = format!("{ns}-{name}");
        let template = capi::test_machine_template(
            ns,
            &name,
            json!({"nodeLabels": {POOL_LABEL: label}}),
            json!({}),
        )?;
        create(&client, ns, &capi::test_machine_templates(), template).await?;
        let md = capi::machine_deployment(ns, "c1", &name, 1, bounds.clone(), &name)?;
        create(&client, ns, &capi::machine_deployments(), md).await?;
        groups.push(Group {
            kind: Kind::Deployment,
            id: format!("MachineDeployment/{ns}/{name}"),
            name,
        });
    }
    let infra_pool = capi::test_machine_pool(
        ns,
        "mp",
        json!({"nodeLabels": {POOL_LABEL: format!("{ns}-mp")}}),
        json!({}),
    )?;
    create(
        &client,
        ns,
        &infra_provider::test_machine_pools(),
        infra_pool,
    )
    .await?;
    let mp = capi::machine_pool(ns, "c1", "mp", 1, bounds.clone(), "mp")?;
    create(&client, ns, &capi::machine_pools(), mp).await?;
    groups.push(Group {
        kind: Kind::MachinePool,
        id: format!("MachinePool/{ns}/mp"),
        name: "mp".into(),
    });
    let cherry = CherryEmulator::start(CherryOptions {
        cluster: Some(client.clone()),
        first_server_id: 7_000_000 + i64::try_from(options.seed % 1_000).unwrap_or(0) * 1_000,
        pending_for: Duration::from_millis(300),
        provisioning_for: Duration::from_millis(300),
        ..Default::default()
    })
    .await?;
    create_node_pool(&client, ns, &cherry).await?;
    groups.push(Group {
        kind: Kind::NodePool,
        id: format!("NodePool/{ns}/np"),
        name: "np".into(),
    });
    for group in &groups {
        let selector = BTreeMap::from([(POOL_LABEL.to_string(), format!("{ns}-{}", group.name))]);
        let app = workload::deployment(ns, &format!("app-{}", group.name), 1, POD_CPU, &selector)?;
        workload::create(&client, &app).await?;
    }

    let scratch = sandbox.scratch(&format!("chaos-{}", options.seed))?;
    let mut operator = cluster.operator_options();
    operator.binary = binary.to_path_buf();
    operator.log_filter = "info".into();
    operator.extra_args = vec![
        "--sweep-interval-secs=2".into(),
        "--node-pool-interval-secs=2".into(),
    ];
    let proxy = FaultProxy::start(
        &operator.kubeconfig,
        &scratch,
        FaultPlan::writes(
            options.seed,
            options.fault_rate,
            &["machines", "machinedeployments", "scale"],
        ),
    )
    .await?;
    operator.kubeconfig = proxy.kubeconfig.clone();
    cluster.start_operator(&operator)?;
    let mut auditor = DeletionAuditor::start(client.clone(), ns, &capi::machines());
    auditor.watch_nodes(&format!("{POOL_LABEL}={ns}-np"), POOL_LABEL);
    let auditor = Arc::new(auditor);
    let socket = scratch.join("ca.sock");
    let tap = Tap::start(&socket, connect(&mut cluster).await?, auditor.clone())?;
    let mut ca = cluster.colocated_autoscaler(&socket)?;
    cluster.start_autoscaler(&ca)?;
    // Each process started again logs to a file of its own (`<name>-<n>.log`): the log of
    // the one that took a decision survives the restarts after it.
    let (operator_log, ca_log) = (operator.name.clone(), ca.name.clone());
    let mut restarts = 0u32;
    println!(
        "chaos: namespace {ns}, {} groups, seed {}, {:?}, faults {}",
        groups.len(),
        options.seed,
        options.duration,
        options.fault_rate
    );

    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut actions: BTreeMap<String, u64> = BTreeMap::new();
    let mut undo: Vec<(Instant, Undo)> = Vec::new();
    let mut rollouts = 0u32;
    let mut acted: Vec<(Duration, String)> = Vec::new();
    let started = Instant::now();
    let deadline = started + options.duration;
    while Instant::now() < deadline {
        let jitter = rng.random_range(0.5..1.5);
        tokio::time::sleep(options.action_interval.mul_f64(jitter)).await;
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = undo.into_iter().partition(|(at, _)| *at <= now);
        undo = later;
        for (_, action) in due {
            revert(&client, ns, &cherry, action).await;
        }
        let group = &groups[rng.random_range(0..groups.len())];
        let name = group.name.clone();
        let roll = rng.random_range(0..100u32);
        let hold = Duration::from_secs(rng.random_range(10..40));
        let kind = match roll {
            // Pods come and go: the load cluster-autoscaler scales for.
            0..=44 => {
                let replicas = rng.random_range(0..=5);
                workload::scale(&client, ns, &format!("app-{name}"), replicas).await?;
                "workload"
            }
            45..=51 => {
                let mut grpc = connect(&mut cluster).await?;
                let _ = grpc
                    .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                        id: group.id.clone(),
                        delta: 1,
                    })
                    .await;
                "increase_size_by_hand"
            }
            52..=55 => {
                let scalables = api(&client, ns, &group.resource());
                let object = scalables.get(&name).await?;
                let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(1);
                if replicas < 5 {
                    let patch = json!({"spec": {"replicas": replicas + 1}});
                    let _ = scalables
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                "kubectl_scale_up"
            }
            56..=58 => {
                let scalables = api(&client, ns, &group.resource());
                let object = scalables.get(&name).await?;
                let replicas = object.data["spec"]["replicas"].as_i64().unwrap_or(1);
                if replicas <= 1 {
                    continue;
                }
                // Counted before the write: Cluster API may act on it at once.
                let key = group.person_key(ns);
                auditor.person_lowered(&key);
                let patch = json!({"spec": {"replicas": replicas - 1}});
                if let Err(error) = scalables
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(%error, "a person's kubectl scale did not apply");
                    auditor.person_did_not_lower(&key);
                }
                "kubectl_scale_down"
            }
            59..=61 => {
                if group.kind != Kind::Deployment {
                    continue;
                }
                rollouts += 1;
                let patch = json!({"spec": {"template": {"spec": {"bootstrap": {
                    "dataSecretName": format!("chaos-revision-{rollouts}")
                }}}}});
                merge_patch(&client, ns, &capi::machine_deployments(), &name, patch).await;
                "rollout"
            }
            62..=64 => {
                if group.kind != Kind::Deployment {
                    continue;
                }
                let sets = machine_sets_of(&client, ns, &name).await?;
                for set in &sets {
                    set_paused_annotation(&client, ns, set, true).await;
                }
                for set in sets {
                    undo.push((now + hold, Undo::MachineSetPaused(set)));
                }
                "pause_machine_set"
            }
            65..=68 => {
                set_cluster_paused(&client, ns, true).await;
                undo.push((now + hold, Undo::ClusterPaused));
                "pause_cluster"
            }
            69..=75 => {
                if undo.iter().any(|(_, u)| matches!(u, Undo::Stalled(_))) {
                    continue;
                }
                match Stall::machine_set_replicas(&client, ns).await {
                    Ok(stall) => undo.push((now + hold, Undo::Stalled(stall))),
                    Err(error) => tracing::warn!(%error, "could not stall Cluster API"),
                }
                "stall_cluster_api"
            }
            76..=81 => {
                let machines = api(&client, ns, &capi::machines())
                    .list(&ListParams::default())
                    .await?;
                let live: Vec<&DynamicObject> = machines
                    .items
                    .iter()
                    .filter(|m| m.metadata.deletion_timestamp.is_none())
                    .collect();
                if live.is_empty() {
                    continue;
                }
                let machine = live[rng.random_range(0..live.len())].name_any();
                auditor.excuse(&machine);
                annotate_delete_machine(&client, ns, &machine, true).await;
                undo.push((now + hold, Undo::Annotated(machine)));
                "person_delete_machine"
            }
            82..=89 => {
                cluster.kill_operator();
                tokio::time::sleep(Duration::from_secs(rng.random_range(1..5))).await;
                restarts += 1;
                operator.name = format!("{operator_log}-{restarts}");
                // Starting blocks until the process is ready: off the runtime's workers, so
                // the tap keeps relaying CA's calls meanwhile.
                tokio::task::block_in_place(|| cluster.start_operator(&operator))?;
                tap.retarget(connect(&mut cluster).await?);
                "operator_kill"
            }
            90..=93 => {
                if undo.iter().any(|(_, u)| matches!(u, Undo::CloudOutage)) {
                    continue;
                }
                // The cloud takes no server for a while: deletions CA was answered OK for
                // wait, and a CA restart meanwhile gives their nodes up.
                cherry.inject(
                    RequestKind::DeleteServer,
                    1_000_000,
                    FaultAction::Status(503),
                );
                undo.push((now + hold, Undo::CloudOutage));
                "cloud_outage"
            }
            _ => {
                // The old process keeps deleting while it shuts down (its signal handler
                // runs a clean-up RPC first): only once it is gone is every taint it got an
                // OK for left to the new process's start-up clean-up.
                tokio::task::block_in_place(|| cluster.stop_autoscaler());
                auditor.ca_stopped();
                restarts += 1;
                ca.name = format!("{ca_log}-{restarts}");
                tokio::task::block_in_place(|| cluster.start_autoscaler(&ca))?;
                "ca_restart"
            }
        };
        *actions.entry(kind.to_string()).or_default() += 1;
        acted.push((tap.since_start(), format!("action {kind} on {name}")));
    }
    for (_, action) in undo {
        revert(&client, ns, &cherry, action).await;
    }
    proxy.set_plan(FaultPlan::writes(options.seed, 0.0, &[]));
    // Settle: the workloads shrink, CA scales the groups back down, nothing is paused.
    for group in &groups {
        workload::scale(&client, ns, &format!("app-{}", group.name), 0).await?;
    }
    tokio::time::sleep(Duration::from_secs(90)).await;
    let counts = tap.counts();
    let mut faults_injected: BTreeMap<String, u64> = BTreeMap::new();
    for injected in proxy.injected() {
        *faults_injected
            .entry(format!("{:?}", injected.fault))
            .or_default() += 1;
    }
    let results = ChaosResults {
        seed: options.seed,
        duration_s: options.duration.as_secs_f64(),
        groups: groups.len(),
        scale_downs: counts.nodes_ok,
        delete_nodes_ok: counts.delete_ok,
        delete_nodes_errors: counts.delete_errors,
        removals: auditor.deleted(),
        actions,
        faults_injected,
        violations: auditor.violations(),
        residue: auditor.residue(),
        by_person: auditor.by_person(),
        by_rollout: auditor.by_rollout(),
        journal: journal(tap.journal(), acted),
    };
    cluster.stop_autoscaler();
    cluster.stop_operator();
    Ok(results)
}

/// The tap's journal and the actions taken (`acted`), each with its time since the tap
/// started, merged in time order.
fn journal(tap: Vec<(Duration, String)>, acted: Vec<(Duration, String)>) -> Vec<String> {
    let mut lines = tap;
    lines.extend(
        acted
            .into_iter()
            .map(|(at, what)| (at, format!("{:.3}s {what}", at.as_secs_f64()))),
    );
    lines.sort_by_key(|(at, _)| *at);
    lines.into_iter().map(|(_, line)| line).collect()
}

/// The NodePool `np` (min 1, max 5) on the Cherry Servers emulator `cherry`, with its
/// credentials Secret.
async fn create_node_pool(
    client: &Client,
    ns: &str,
    cherry: &CherryEmulator,
) -> anyhow::Result<()> {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "cherry", "namespace": ns},
        "stringData": {"token": cherry.token()},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await?;
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
        "kind": "NodePool",
        "metadata": {"name": "np", "namespace": ns},
        "spec": {
            "replicas": 1,
            "minSize": 1,
            "maxSize": 5,
            "clusterName": "c1",
            "template": {"labels": {POOL_LABEL: format!("{ns}-np")}},
            "cherryServers": {
                "credentialsSecretRef": {"name": "cherry", "key": "token"},
                "projectId": 4242,
                "region": "eu_nord_1",
                "plan": "e3_1240v3",
                "image": "ubuntu_22_04",
                "userData": ngo_testbed::cherry::JOIN_USER_DATA,
                "apiServerEndpoint": "127.0.0.1:6443",
                "endpoint": cherry.url(),
            },
        },
    }))?;
    Api::<NodePool>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pool)
        .await?;
    Ok(())
}

/// Writes `results` to `target/chaos/results.json`.
pub fn write_results(results: &ChaosResults) -> anyhow::Result<std::path::PathBuf> {
    let dir = ngo_testbed::workspace_root().join("target/chaos");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(results)?)?;
    Ok(path)
}

async fn create(
    client: &Client,
    ns: &str,
    resource: &kube::discovery::ApiResource,
    object: DynamicObject,
) -> anyhow::Result<()> {
    api(client, ns, resource)
        .create(&PostParams::default(), &object)
        .await?;
    Ok(())
}

fn api(client: &Client, ns: &str, resource: &kube::discovery::ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, resource)
}

/// A client of the running operator (the test's own, not CA's tap).
async fn connect(cluster: &mut AutoscaledCluster) -> anyhow::Result<CloudProviderClient<Channel>> {
    let address = cluster
        .operator()
        .ok_or_else(|| anyhow::anyhow!("the operator is not running"))?
        .grpc_address;
    Ok(cluster.pki.connect(address).await?)
}

async fn machine_sets_of(
    client: &Client,
    ns: &str,
    deployment: &str,
) -> anyhow::Result<Vec<String>> {
    let sets = api(client, ns, &capi::machine_sets())
        .list(
            &ListParams::default()
                .labels(&format!("cluster.x-k8s.io/deployment-name={deployment}")),
        )
        .await?;
    Ok(sets.items.iter().map(|s| s.name_any()).collect())
}

/// A merge patch of `name`, logged (not failed) when it does not apply: an outside action
/// may race the object's deletion.
async fn merge_patch(
    client: &Client,
    ns: &str,
    resource: &kube::discovery::ApiResource,
    name: &str,
    patch: Value,
) {
    if let Err(error) = api(client, ns, resource)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(%error, kind = %resource.kind, name, "an outside action did not apply");
    }
}

/// A merge patch setting annotation `key` to `value` (`None`: removing it).
fn annotation(key: &str, value: Option<&str>) -> Value {
    json!({"metadata": {"annotations": {key: value}}})
}

async fn set_paused_annotation(client: &Client, ns: &str, set: &str, paused: bool) {
    let patch = annotation("cluster.x-k8s.io/paused", paused.then_some("true"));
    merge_patch(client, ns, &capi::machine_sets(), set, patch).await;
}

async fn set_cluster_paused(client: &Client, ns: &str, paused: bool) {
    let patch = json!({"spec": {"paused": paused}});
    merge_patch(client, ns, &capi::clusters(), "c1", patch).await;
}

async fn annotate_delete_machine(client: &Client, ns: &str, machine: &str, present: bool) {
    let patch = annotation(
        "cluster.x-k8s.io/delete-machine",
        present.then_some("chaos"),
    );
    merge_patch(client, ns, &capi::machines(), machine, patch).await;
}

async fn revert(client: &Client, ns: &str, cherry: &CherryEmulator, action: Undo) {
    match action {
        Undo::CloudOutage => cherry.clear_faults(),
        Undo::MachineSetPaused(set) => set_paused_annotation(client, ns, &set, false).await,
        Undo::ClusterPaused => set_cluster_paused(client, ns, false).await,
        Undo::Stalled(stall) => {
            if let Err(error) = stall.resume().await {
                tracing::warn!(%error, "could not resume Cluster API");
            }
        }
        Undo::Annotated(machine) => annotate_delete_machine(client, ns, &machine, false).await,
    }
}
