//! `make soak`: many clients hammer the operator binary with a mix of reads and writes for a
//! long time, on the sandbox with the real Cluster API manager, while its resident memory is
//! sampled. With `faults`, the operator reaches the API server through the sandbox's
//! `FaultProxy`, which lies about its writes to Machines and MachineDeployments (dropped replies
//! after commit, resets, 429, 500 after commit, delays), and every Machine deleted must be one a
//! DeleteNodes named. At the end the load (and the faults) stop, the sweeper gets time to act, and
//! the results (throughput, outcomes per RPC, RSS over time, stranded claims and marks, wrong
//! deletions, replicas versus machines) go to `target/soak/results.json`. Every DeleteNodes is
//! made as cluster-autoscaler makes it (the node tainted first, untainted after an error, never
//! two at once for one node), and a [`DeletionAuditor`] judges every Machine deletion by those
//! answers (U1 of `docs/safety.md`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark};
use ngo_service::proto::{self, cloud_provider_client::CloudProviderClient};
use serde::Serialize;
use serde_json::json;
use tonic::transport::Channel;

use crate::environment::{SandboxInfo, WORKER_TEMPLATE};
use crate::stack::AutoscaledCluster;
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::capi;
use ngo_testbed::faultproxy::{FaultPlan, FaultProxy};

/// Soak parameters.
#[derive(Clone, Debug)]
pub struct SoakOptions {
    /// How long the load runs.
    pub duration: Duration,
    /// Concurrent clients.
    pub clients: usize,
    /// Node groups (MachineDeployments of min 1, max 8).
    pub groups: usize,
    /// Faults on the operator's writes: (seed, probability per write); `None`: none.
    pub faults: Option<(u64, f64)>,
}

/// Outcomes of one RPC method.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcomes {
    /// Answered OK.
    pub ok: u64,
    /// Refused as the contract says (above max, below min, not a member any more).
    pub refused: u64,
    /// Anything else (the figure that must stay 0).
    pub errors: u64,
    /// The distinct unexpected errors seen, with counts.
    pub error_kinds: BTreeMap<String, u64>,
}

/// What `target/soak/results.json` holds.
#[derive(Clone, Debug, Serialize)]
pub struct SoakResults {
    /// Seconds of load.
    pub duration_s: f64,
    /// Concurrent clients.
    pub clients: usize,
    /// Node groups.
    pub groups: usize,
    /// All RPCs per second.
    pub throughput_rps: f64,
    /// Outcomes per RPC method.
    pub rpcs: BTreeMap<String, Outcomes>,
    /// Operator RSS in KiB: after warm-up, at the end, and every sample in between.
    pub rss_kib: RssSamples,
    /// Machines (not deleting) still carrying a live scale-down mark, plus scale-down claims
    /// left in ledgers, once the sweeper had time.
    pub stranded_marks: usize,
    /// Faults injected, by kind (empty without faults).
    pub faults_injected: BTreeMap<String, usize>,
    /// The fault seed, when faults were on.
    pub fault_seed: Option<u64>,
    /// Machines deleted that no DeleteNodes named.
    pub wrong_deletions: Vec<String>,
    /// Machines deleted while cluster-autoscaler's latest answer for their node was not OK
    /// (U1), as the auditor judged them.
    pub u1_violations: Vec<String>,
    /// Machines deleted after their DeleteNodes got no answer in time (U1's documented
    /// residue: an OK that could not reach the client).
    pub u1_residue: Vec<String>,
    /// Machines deleted during the soak.
    pub deleted: usize,
    /// Per group at the end: (spec.replicas, machines not deleting) once Cluster API settled.
    pub groups_final: BTreeMap<String, (i64, usize)>,
    /// True when every group's replicas equal its machines.
    pub replicas_match_machines: bool,
}

impl SoakResults {
    /// One line: throughput, errors, memory, deletions and the judges' findings.
    pub fn summary(&self) -> String {
        format!(
            "{:.0}s, {:.0} RPC/s, {} unexpected errors, RSS {} -> {} KiB, {} stranded marks, \
             {} deleted, {} wrong deletions, {} U1 violations, {} U1 residue, faults {:?}, \
             replicas match machines: {}",
            self.duration_s,
            self.throughput_rps,
            self.unexpected_errors(),
            self.rss_kib.start,
            self.rss_kib.end,
            self.stranded_marks,
            self.deleted,
            self.wrong_deletions.len(),
            self.u1_violations.len(),
            self.u1_residue.len(),
            self.faults_injected,
            self.replicas_match_machines,
        )
    }

    /// RPC errors outside the contract, over all methods.
    pub fn unexpected_errors(&self) -> u64 {
        self.rpcs.values().map(|o| o.errors).sum()
    }

    /// What went wrong, one line each; empty when the soak passed.
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        if self.unexpected_errors() > 0 {
            let kinds: Vec<&String> = self
                .rpcs
                .values()
                .flat_map(|o| o.error_kinds.keys())
                .collect();
            failures.push(format!("unexpected RPC errors: {kinds:?}"));
        }
        if self.stranded_marks > 0 {
            failures.push(format!(
                "{} stranded scale-down claims or marks",
                self.stranded_marks
            ));
        }
        if !self.wrong_deletions.is_empty() {
            failures.push(format!(
                "machines deleted that no DeleteNodes named: {:?}",
                self.wrong_deletions
            ));
        }
        if !self.u1_violations.is_empty() {
            failures.push(format!(
                "machines deleted against cluster-autoscaler's latest answer (U1): {:?}",
                self.u1_violations
            ));
        }
        if !self.replicas_match_machines {
            failures.push(format!(
                "replicas do not match machines: {:?}",
                self.groups_final
            ));
        }
        failures
    }
}

/// Resident memory samples.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RssSamples {
    /// After warm-up.
    pub start: u64,
    /// At the end of the load.
    pub end: u64,
    /// (seconds since start, KiB).
    pub samples: Vec<(u64, u64)>,
}

type Tally = Arc<Mutex<BTreeMap<String, Outcomes>>>;

/// Runs the soak on a started sandbox.
pub async fn run(sandbox: &SandboxInfo, options: &SoakOptions) -> anyhow::Result<SoakResults> {
    let mut cluster = AutoscaledCluster::create(sandbox, "soak", "soak", json!({})).await?;
    let client = cluster.client().await?;
    let mut ids = Vec::new();
    for i in 0..options.groups {
        let name = format!("g{i}");
        let md = capi::machine_deployment(
            "soak",
            "soak",
            &name,
            3,
            json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                   "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "8"}),
            WORKER_TEMPLATE,
        )?;
        Api::<DynamicObject>::namespaced_with(client.clone(), "soak", &capi::machine_deployments())
            .create(&PostParams::default(), &md)
            .await?;
        ids.push(format!("MachineDeployment/soak/{name}"));
    }
    let mut operator = cluster.operator_options();
    operator.log_filter = "warn".into();
    let proxy = match options.faults {
        Some((seed, rate)) => {
            let dir = sandbox.scratch("soak-faults")?;
            let plan = FaultPlan::writes(seed, rate, &["machines", "machinedeployments", "scale"]);
            let proxy = FaultProxy::start(&operator.kubeconfig, &dir, plan).await?;
            operator.kubeconfig = proxy.kubeconfig.clone();
            println!("soak: faults on the operator's writes, seed {seed}, rate {rate}");
            Some(proxy)
        }
        None => None,
    };
    cluster.start_operator(&operator)?;
    let (address, pid) = {
        let op = cluster
            .operator()
            .ok_or_else(|| anyhow::anyhow!("operator not running"))?;
        (op.grpc_address, op.pid())
    };
    let grpc = cluster.pki.connect(address).await?;
    // Warm-up: every group served with its nodes.
    let warm = Instant::now();
    loop {
        let groups = grpc
            .clone()
            .node_groups(proto::NodeGroupsRequest {})
            .await?;
        if groups.into_inner().node_groups.len() == options.groups {
            break;
        }
        anyhow::ensure!(
            warm.elapsed() < Duration::from_secs(120),
            "groups never served"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut rss = RssSamples {
        start: rss_kib(pid)?,
        ..Default::default()
    };
    println!(
        "soak: {} clients, {} groups, {:?}; operator RSS {} KiB after warm-up",
        options.clients, options.groups, options.duration, rss.start
    );

    let tally: Tally = Arc::default();
    let ca = Ca {
        auditor: Arc::new(DeletionAuditor::start(
            client.clone(),
            "soak",
            &capi::machines(),
        )),
        named: Arc::default(),
        node_names: Arc::default(),
    };
    let started = Instant::now();
    let deadline = started + options.duration;
    let faulted = options.faults.is_some();
    let mut workers = Vec::new();
    for worker in 0..options.clients {
        let grpc = grpc.clone();
        let ids = ids.clone();
        let tally = tally.clone();
        let ca = ca.clone();
        workers.push(tokio::spawn(async move {
            let mut n: u64 = worker as u64;
            while Instant::now() < deadline {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                one_call(&grpc, &ids, n, &tally, &ca, faulted).await;
            }
        }));
    }
    let watcher = tokio::spawn(watch_deletions(
        client.clone(),
        deadline,
        ca.node_names.clone(),
    ));
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(30).min(deadline - Instant::now())).await;
        let kib = rss_kib(pid)?;
        let at = started.elapsed().as_secs();
        rss.samples.push((at, kib));
        let calls: u64 = tally
            .lock()
            .map(|t| t.values().map(|o| o.ok + o.refused + o.errors).sum())
            .unwrap_or_default();
        println!("soak: {at:>4}s {calls} calls, RSS {kib} KiB");
    }
    for worker in workers {
        worker.await?;
    }
    let elapsed = started.elapsed();
    rss.end = rss_kib(pid)?;
    let mut faults_injected = BTreeMap::new();
    if let Some(proxy) = &proxy {
        proxy.set_plan(FaultPlan::writes(0, 0.0, &[]));
        for injected in proxy.injected() {
            *faults_injected
                .entry(format!("{:?}", injected.fault))
                .or_default() += 1;
        }
    }

    // Let every claim's and mark's deadline pass (plus the sweeper's clock margin) and the
    // sweeper run, then let Cluster API settle.
    tokio::time::sleep(Duration::from_secs(75)).await;
    let stranded = marked_machines(&client).await? + claims_left(&client).await?;
    let deleted_machines = watcher.await??;
    let named = ca.named.lock().map(|n| n.clone()).unwrap_or_default();
    let wrong_deletions: Vec<String> = deleted_machines
        .iter()
        .filter(|(_, pid)| !named.contains(pid.as_str()))
        .map(|(name, pid)| format!("{name} ({pid})"))
        .collect();
    let mut groups_final = BTreeMap::new();
    for _ in 0..60 {
        groups_final = sizes(&client, options.groups).await?;
        if groups_final.values().all(|(r, m)| *r == *m as i64) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    cluster.check_alive()?;
    let rpcs = tally.lock().map(|t| t.clone()).unwrap_or_default();
    let total: u64 = rpcs.values().map(|o| o.ok + o.refused + o.errors).sum();
    Ok(SoakResults {
        duration_s: elapsed.as_secs_f64(),
        clients: options.clients,
        groups: options.groups,
        throughput_rps: total as f64 / elapsed.as_secs_f64(),
        rpcs,
        rss_kib: rss,
        stranded_marks: stranded,
        faults_injected,
        fault_seed: options.faults.map(|(seed, _)| seed),
        wrong_deletions,
        u1_violations: ca.auditor.violations(),
        u1_residue: ca.auditor.residue(),
        deleted: deleted_machines.len(),
        replicas_match_machines: groups_final.values().all(|(r, m)| *r == *m as i64),
        groups_final,
    })
}

/// The soak's clients as cluster-autoscaler: what they named, and the auditor of their answers.
#[derive(Clone)]
struct Ca {
    auditor: Arc<DeletionAuditor>,
    /// Provider IDs some DeleteNodes named; each is named once (CA never sends two DeleteNodes
    /// for one node at a time).
    named: Arc<Mutex<BTreeSet<String>>>,
    /// Provider ID -> Node name of the Machines seen (CA taints a node by its name).
    node_names: NodeNames,
}

/// Provider ID -> Node name, from the Machines' `status.nodeRef`.
type NodeNames = Arc<Mutex<BTreeMap<String, String>>>;

/// One call of the mix: 85% reads, 15% writes. A write raises a group near its minimum,
/// deletes a running node of a group near its maximum, and otherwise does either, so groups
/// keep moving between their bounds. A node is deleted as `ca` would: tainted first, named
/// once, its answer told to the auditor. With `faulted`, a write the API server failed is an
/// expected outcome, not an error.
async fn one_call(
    grpc: &CloudProviderClient<Channel>,
    ids: &[String],
    n: u64,
    tally: &Tally,
    ca: &Ca,
    faulted: bool,
) {
    let mut grpc = grpc.clone();
    let id = ids[(n >> 33) as usize % ids.len()].clone();
    let roll = (n >> 40) % 100;
    let (method, result) = match roll {
        0..=24 => (
            "NodeGroups",
            grpc.node_groups(proto::NodeGroupsRequest {})
                .await
                .map(|_| ()),
        ),
        25..=49 => (
            "NodeGroupTargetSize",
            grpc.node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
                .await
                .map(|_| ()),
        ),
        50..=84 => {
            let nodes = grpc
                .node_group_nodes(proto::NodeGroupNodesRequest { id: id.clone() })
                .await;
            let pick = nodes.as_ref().ok().and_then(|r| {
                let instances = &r.get_ref().instances;
                instances
                    .get((n >> 20) as usize % instances.len().max(1))
                    .cloned()
            });
            if let Some(instance) = pick {
                let node = proto::ExternalGrpcNode {
                    provider_id: instance.id,
                    ..Default::default()
                };
                let found = grpc
                    .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node) })
                    .await
                    .map(|_| ());
                record(tally, "NodeGroupForNode", found);
            }
            ("NodeGroupNodes", nodes.map(|_| ()))
        }
        _ => {
            let target = grpc
                .node_group_target_size(proto::NodeGroupTargetSizeRequest { id: id.clone() })
                .await
                .map(|r| r.into_inner().target_size)
                .unwrap_or_default();
            let grow = match target {
                ..=2 => true,
                7.. => false,
                _ => roll.is_multiple_of(2),
            };
            if grow {
                let result = grpc
                    .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest { id, delta: 1 })
                    .await
                    .map(|_| ());
                record_write(tally, "NodeGroupIncreaseSize", result, faulted);
                return;
            }
            let instances = grpc
                .node_group_nodes(proto::NodeGroupNodesRequest { id: id.clone() })
                .await
                .map(|r| r.into_inner().instances)
                .unwrap_or_default();
            let running: Vec<_> = instances
                .into_iter()
                .filter(|i| i.status.as_ref().is_some_and(|s| s.instance_state == 1))
                .collect();
            let Some(victim) = running.get((n >> 24) as usize % running.len().max(1)) else {
                return;
            };
            let Some(node_name) = ca
                .node_names
                .lock()
                .ok()
                .and_then(|names| names.get(&victim.id).cloned())
            else {
                return;
            };
            let first = ca
                .named
                .lock()
                .is_ok_and(|mut named| named.insert(victim.id.clone()));
            if !first {
                return;
            }
            let node = proto::ExternalGrpcNode {
                provider_id: victim.id.clone(),
                name: node_name.clone(),
                ..Default::default()
            };
            let names = [node_name];
            ca.auditor.taint(&names).await;
            let result = grpc
                .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                    id,
                    nodes: vec![node],
                })
                .await
                .map(|_| ());
            ca.auditor.returned(&names, &result).await;
            record_write(tally, "NodeGroupDeleteNodes", result, faulted);
            return;
        }
    };
    record(tally, method, result);
}

/// Records a write's outcome; with faults on, the codes a failed or lost API write gives are
/// counted as refused.
fn record_write(tally: &Tally, method: &str, result: Result<(), tonic::Status>, faulted: bool) {
    let expected = matches!(
        result.as_ref().map_err(tonic::Status::code),
        Err(tonic::Code::Unavailable
            | tonic::Code::Aborted
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Internal)
    );
    if faulted && expected {
        if let Ok(mut tally) = tally.lock() {
            tally.entry(method.to_string()).or_default().refused += 1;
        }
        return;
    }
    record(tally, method, result);
}

fn record(tally: &Tally, method: &str, result: Result<(), tonic::Status>) {
    let Ok(mut tally) = tally.lock() else { return };
    let outcome = tally.entry(method.to_string()).or_default();
    match result {
        Ok(()) => outcome.ok += 1,
        // The contract's refusals: bounds, and nodes that left the group meanwhile.
        Err(s)
            if matches!(
                s.code(),
                tonic::Code::FailedPrecondition | tonic::Code::NotFound
            ) =>
        {
            outcome.refused += 1
        }
        Err(s) => {
            outcome.errors += 1;
            *outcome
                .error_kinds
                .entry(format!("{:?}: {}", s.code(), s.message()))
                .or_default() += 1;
        }
    }
}

/// Resident memory of process `pid`, from `/proc/<pid>/status`.
fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for process {pid}"))
}

/// Machines (not deleting) carrying a live scale-down mark (a released record is none).
async fn marked_machines(client: &Client) -> anyhow::Result<usize> {
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), "soak", &capi::machines())
        .list(&ListParams::default())
        .await?;
    Ok(machines
        .items
        .iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .filter(|m| {
            m.annotations()
                .get(MARK_ANNOTATION)
                .and_then(|v| ScaleDownMark::parse(v))
                .is_some_and(|mark| mark.is_mark())
        })
        .count())
}

/// Scale-down claims left in the groups' ledgers.
async fn claims_left(client: &Client) -> anyhow::Result<usize> {
    let mds =
        Api::<DynamicObject>::namespaced_with(client.clone(), "soak", &capi::machine_deployments())
            .list(&ListParams::default())
            .await?;
    Ok(mds
        .items
        .iter()
        .filter(|md| {
            let ledger = md.annotations().get(LEDGER_ANNOTATION).map(String::as_str);
            Ledger::parse(ledger).claim().is_some()
        })
        .count())
}

/// Polls the soak's Machines until `until`, then for the settling time after it, keeping
/// `node_names` up to date; returns every Machine seen deleting or gone, with its provider ID.
async fn watch_deletions(
    client: Client,
    until: Instant,
    node_names: NodeNames,
) -> anyhow::Result<Vec<(String, String)>> {
    let api = Api::<DynamicObject>::namespaced_with(client, "soak", &capi::machines());
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut deleted: BTreeMap<String, String> = BTreeMap::new();
    let stop = until + Duration::from_secs(70);
    while Instant::now() < stop {
        let machines = api.list(&ListParams::default()).await?.items;
        let live: BTreeSet<String> = machines.iter().map(|m| m.name_any()).collect();
        for m in &machines {
            if let Some(pid) = m.data["spec"]["providerID"].as_str() {
                seen.insert(m.name_any(), pid.to_string());
                if let (Some(node), Ok(mut names)) = (
                    m.data["status"]["nodeRef"]["name"].as_str(),
                    node_names.lock(),
                ) {
                    names.insert(pid.to_string(), node.to_string());
                }
                if m.metadata.deletion_timestamp.is_some() {
                    deleted.insert(m.name_any(), pid.to_string());
                }
            }
        }
        for (name, pid) in &seen {
            if !live.contains(name) {
                deleted.insert(name.clone(), pid.clone());
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(deleted.into_iter().collect())
}

async fn sizes(client: &Client, groups: usize) -> anyhow::Result<BTreeMap<String, (i64, usize)>> {
    let mds =
        Api::<DynamicObject>::namespaced_with(client.clone(), "soak", &capi::machine_deployments());
    let machines = Api::<DynamicObject>::namespaced_with(client.clone(), "soak", &capi::machines())
        .list(&ListParams::default())
        .await?;
    let mut out = BTreeMap::new();
    for i in 0..groups {
        let name = format!("g{i}");
        let replicas = mds.get(&name).await?.data["spec"]["replicas"]
            .as_i64()
            .unwrap_or_default();
        let count = machines
            .items
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| m.labels().get(capi::DEPLOYMENT_NAME_LABEL) == Some(&name))
            .count();
        out.insert(name, (replicas, count));
    }
    Ok(out)
}
