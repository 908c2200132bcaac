//! DeleteNodes against the real Cluster API manager, with the operator binary killed
//! (SIGKILL) at each step of the mutation, over many iterations; and cluster-autoscaler's own
//! client timing out against a slow API server.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark};
use ngo_sandbox::environment::{SandboxInfo, WORKER_TEMPLATE, start_for_process};
use ngo_sandbox::operator::{OperatorOptions, write_cloud_config};
use ngo_sandbox::stack::AutoscaledCluster;
use ngo_service::proto;
use ngo_testbed::auditor::DeletionAuditor;
use ngo_testbed::capi;
use serde_json::json;

pub const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
const WAIT: Duration = Duration::from_secs(120);

/// The Cluster API sandbox of this test binary.
pub fn sandbox() -> &'static SandboxInfo {
    static SANDBOX: OnceLock<SandboxInfo> = OnceLock::new();
    SANDBOX.get_or_init(|| start_for_process().unwrap_or_else(|e| panic!("{e:#}")))
}

/// A namespace with a Cluster and a MachineDeployment `w` of `replicas` Running machines,
/// and a deletion auditor judging every Machine deletion by cluster-autoscaler's answers
/// (U1), told what CA asked and got through [`Group::ca_asks`] and [`Group::ca_got`].
pub struct Group {
    pub cluster: AutoscaledCluster,
    pub client: Client,
    pub id: String,
    pub auditor: DeletionAuditor,
}

impl Group {
    pub async fn new(prefix: &str, replicas: i32) -> Self {
        let namespace = format!("{prefix}-{}", rand::random::<u32>() % 100_000);
        let cluster = AutoscaledCluster::create(sandbox(), &namespace, "c1", json!({}))
            .await
            .unwrap_or_else(|e| panic!("creating {namespace}: {e:#}"));
        let client = cluster.client().await.expect("client");
        let md = capi::machine_deployment(
            &namespace,
            "c1",
            "w",
            replicas,
            json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                   "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "100"}),
            WORKER_TEMPLATE,
        )
        .expect("md");
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &namespace,
            &capi::machine_deployments(),
        )
        .create(&Default::default(), &md)
        .await
        .expect("create md");
        let auditor = DeletionAuditor::start(client.clone(), &namespace, &capi::machines());
        let group = Self {
            cluster,
            client,
            id: format!("MachineDeployment/{namespace}/w"),
            auditor,
        };
        group.wait_running(replicas as usize).await;
        group
    }

    pub fn ns(&self) -> &str {
        &self.cluster.namespace
    }

    /// cluster-autoscaler is about to ask to delete the nodes of `machines`: it taints them
    /// first.
    pub async fn ca_asks(&self, machines: &[&str]) {
        let nodes = self.node_names(machines).await;
        self.auditor.taint(&nodes).await;
    }

    /// What cluster-autoscaler got back for the nodes of `machines` (an error untaints them).
    pub async fn ca_got<T>(&self, machines: &[&str], answer: &Result<T, tonic::Status>) {
        let nodes = self.node_names(machines).await;
        self.auditor.returned(&nodes, answer).await;
    }

    /// The Node names of `machines` (their `status.nodeRef`), as CA names them.
    async fn node_names(&self, machines: &[&str]) -> Vec<String> {
        let all = self.machines().await;
        machines
            .iter()
            .filter_map(|name| {
                all.iter()
                    .find(|m| m.name_any() == *name)
                    .and_then(|m| m.data["status"]["nodeRef"]["name"].as_str())
                    .map(str::to_string)
            })
            .collect()
    }

    /// What CA's own client (`CaClient`, its per-RPC deadline `timeout`) returned for a
    /// DeleteNodes naming `machines`: OK, an error the operator answered, or no answer (the
    /// client's deadline passed first, or the connection broke), which CA also takes as an
    /// error but which is U1's residue when the deletion went on.
    pub async fn ca_got_from_client(
        &self,
        machines: &[&str],
        result: &serde_json::Value,
        timeout: Duration,
    ) {
        let nodes = self.node_names(machines).await;
        let took = Duration::from_secs_f64(result["ms"].as_f64().unwrap_or_default() / 1000.0);
        let error = result["error"].as_str().unwrap_or_default();
        match result["code"].as_str() {
            None if result.get("error").is_none() => self.auditor.answered(&nodes, true).await,
            // The client's deadline passed, on its side (DeadlineExceeded) or on the
            // operator's (tonic answers Canceled "Timeout expired" at the request's
            // grpc-timeout): an OK in flight then can no longer reach CA.
            Some("DeadlineExceeded" | "Canceled") if took >= timeout.mul_f64(0.9) => {
                self.auditor.lost(&nodes).await
            }
            Some("Unavailable") if error.contains("connection") || error.contains("transport") => {
                self.auditor.lost(&nodes).await
            }
            _ => self.auditor.answered(&nodes, false).await,
        }
    }

    /// Fails on any Machine the auditor saw deleted against CA's latest answer (U1); logs
    /// the documented residue (answers that never reached CA).
    pub fn assert_u1(&self) {
        let violations = self.auditor.violations();
        assert!(
            violations.is_empty(),
            "Machines deleted against cluster-autoscaler's latest answer (U1): {violations:#?}"
        );
        for line in self.auditor.residue() {
            self.log(&format!("U1 residue: {line}"));
        }
    }

    /// Options for this test binary's operator build (fault points compiled in) that sweeps
    /// every second and takes deadlines as passed at once (no clock margin).
    pub fn sweeping_operator(&self) -> OperatorOptions {
        let mut options = self.cluster.operator_options();
        options.binary = env!("CARGO_BIN_EXE_nodegroup-operator").into();
        options.extra_args = vec![
            "--sweep-interval-secs=1".into(),
            "--sweep-clock-margin-secs=0".into(),
        ];
        options
    }

    /// A cloud-config for cluster-autoscaler's client of the running operator, with
    /// `timeout` per RPC, written into `dir`.
    pub fn cloud_config(&mut self, dir: &std::path::Path, timeout: Duration) -> PathBuf {
        let address = self.cluster.operator().expect("operator").grpc_address;
        let config = dir.join("cloud-config.yaml");
        write_cloud_config(
            &config,
            &address.to_string(),
            &self.cluster.pki.client,
            &self.cluster.pki.ca_cert,
            timeout,
        )
        .expect("cloud-config");
        config
    }

    pub fn log(&self, what: &str) {
        eprintln!("[{}] {what}", self.ns());
    }

    pub async fn machines(&self) -> Vec<DynamicObject> {
        Api::<DynamicObject>::namespaced_with(self.client.clone(), self.ns(), &capi::machines())
            .list(&ListParams::default())
            .await
            .expect("machines")
            .items
    }

    /// Names of every Machine, those being deleted too.
    pub async fn machine_names(&self) -> BTreeSet<String> {
        self.machines().await.iter().map(|m| m.name_any()).collect()
    }

    /// Starts this test binary's sweeping operator paused for `secs` at fault point `point`
    /// (`NGO_FAULT_PAUSE_AT`); returns its log and a gRPC client of it.
    pub async fn start_paused_at(
        &mut self,
        point: &str,
        secs: u64,
    ) -> (
        PathBuf,
        proto::cloud_provider_client::CloudProviderClient<tonic::transport::Channel>,
    ) {
        let mut options = self.sweeping_operator();
        options.env = vec![
            ("NGO_FAULT_PAUSE_AT".into(), point.into()),
            ("NGO_FAULT_PAUSE_SECS".into(), secs.to_string()),
        ];
        self.cluster.start_operator(&options).expect("operator");
        let operator = self.cluster.operator().expect("operator");
        let (log, address) = (operator.log_path().to_path_buf(), operator.grpc_address);
        let client = self.cluster.pki.connect(address).await.expect("client");
        (log, client)
    }

    /// A DeleteNodes of this group naming Machine `name` (provider ID `pid`), whose client
    /// waits `timeout`.
    pub fn delete_request(
        &self,
        name: &str,
        pid: &str,
        timeout: Duration,
    ) -> tonic::Request<proto::NodeGroupDeleteNodesRequest> {
        let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
            id: self.id.clone(),
            nodes: vec![node(name, pid)],
        });
        request.set_timeout(timeout);
        request
    }

    /// Names of the Machines not being deleted.
    pub async fn live_machines(&self) -> BTreeSet<String> {
        self.machines()
            .await
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .map(|m| m.name_any())
            .collect()
    }

    pub async fn replicas(&self) -> i64 {
        let md = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            self.ns(),
            &capi::machine_deployments(),
        )
        .get("w")
        .await
        .expect("md");
        md.data["spec"]["replicas"].as_i64().unwrap_or_default()
    }

    /// Machines with a Node (providerID and nodeRef), not deleting: name -> providerID.
    pub async fn running(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .machines()
            .await
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| m.data["status"]["nodeRef"]["name"].is_string())
            .filter_map(|m| {
                let pid = m.data["spec"]["providerID"].as_str()?.to_string();
                Some((m.name_any(), pid))
            })
            .collect();
        out.sort();
        out
    }

    pub async fn wait_running(&self, n: usize) -> Vec<(String, String)> {
        poll(
            &format!("{n} running machines in {}", self.ns()),
            || async {
                let running = self.running().await;
                let all = self.machines().await.len();
                (running.len() == n && all == n).then_some(running)
            },
        )
        .await
    }

    /// Machines (not deleting) that carry a delete-machine annotation or our mark (a
    /// released record is no mark).
    pub async fn marked(&self) -> BTreeSet<String> {
        self.machines()
            .await
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| {
                let a = m.annotations();
                let mark = a
                    .get(MARK_ANNOTATION)
                    .and_then(|v| ScaleDownMark::parse(v))
                    .is_some_and(|mark| mark.is_mark());
                a.contains_key(DELETE_MACHINE) || mark
            })
            .map(|m| m.name_any())
            .collect()
    }

    /// Whether the group's ledger holds a scale-down claim.
    pub async fn claimed(&self) -> bool {
        let ledger = self.ledger().await;
        let value = (!ledger.is_empty()).then_some(ledger.as_str());
        Ledger::read(value)
            .expect("a readable ledger")
            .claim()
            .is_some()
    }

    /// The running operator's log lines that name any of `names` (the last 60), and the
    /// group's ledger: what a failed assertion about those Machines quotes.
    pub async fn story_of(&mut self, names: &[&String]) -> String {
        let log = self
            .cluster
            .operator()
            .map(|o| std::fs::read_to_string(o.log_path()).unwrap_or_default())
            .unwrap_or_default();
        let lines: Vec<&str> = log
            .lines()
            .filter(|line| names.iter().any(|n| line.contains(n.as_str())))
            .collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        format!(
            "ledger: {}\noperator log about them:\n{}",
            self.ledger().await,
            tail.join("\n")
        )
    }

    pub async fn ledger(&self) -> String {
        let md = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            self.ns(),
            &capi::machine_deployments(),
        )
        .get("w")
        .await
        .expect("md");
        md.annotations()
            .get(LEDGER_ANNOTATION)
            .cloned()
            .unwrap_or_default()
    }
}

impl Drop for Group {
    /// Every safety test on a group is audited: a Machine deleted against CA's latest answer
    /// fails it (unless it failed already), also where the test does not call
    /// [`Group::assert_u1`] itself.
    fn drop(&mut self) {
        let violations = self.auditor.violations();
        if !violations.is_empty() && !std::thread::panicking() {
            panic!("U1 violations in {}: {violations:#?}", self.ns());
        }
    }
}

/// A node as cluster-autoscaler sends it in DeleteNodes.
pub fn node(name: &str, provider_id: &str) -> proto::ExternalGrpcNode {
    proto::ExternalGrpcNode {
        provider_id: provider_id.into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Waits until the operator whose log is `log` reports that it paused at its fault point
/// (`NGO_FAULT_PAUSE_AT`); `what` names the wait in a timeout.
pub async fn paused_at_fault_point(what: &str, log: &std::path::Path) {
    poll(what, || async {
        std::fs::read_to_string(log)
            .ok()
            .filter(|l| l.contains("fault point reached"))
            .map(|_| ())
    })
    .await;
}

pub async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Where the operator stopped, and what must hold once a new operator has swept.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Claimed in the ledger, nothing marked: the sweeper releases the claim.
    Claimed,
    /// Marked, replicas not lowered: the sweeper releases the claim and rolls the mark back.
    Marked,
    /// Marked and lowered: Cluster API deletes exactly the victim.
    Decremented,
}

impl Step {
    fn point(self) -> &'static str {
        match self {
            Step::Claimed => "delete-nodes:after-claim",
            Step::Marked => "delete-nodes:after-mark",
            Step::Decremented => "delete-nodes:after-decrement",
        }
    }

    /// The request's deadline: short, so that the sweeper may release what a dead request
    /// left soon after (its marks carry the deadline plus the grace), but long enough on a
    /// loaded machine for the writes up to the step killed at (a write that might answer
    /// after the deadline is not sent, and each point is reached only once its write is).
    fn client_timeout(self) -> Duration {
        match self {
            Step::Claimed | Step::Marked => Duration::from_secs(3),
            Step::Decremented => Duration::from_secs(5),
        }
    }
}

/// How many times each step is killed (`NGO_SAFETY_ITERATIONS` raises it).
fn iterations() -> usize {
    std::env::var("NGO_SAFETY_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_at_any_step_of_delete_nodes_strands_no_mark() {
    let steps = [Step::Claimed, Step::Marked, Step::Decremented];
    let rounds = iterations();
    let total = rounds * steps.len();
    let mut group = Group::new("crash", (total + 2) as i32).await;
    let mut expected_replicas = group.replicas().await;
    let mut gone = BTreeSet::new();
    let mut rolled_back = 0;
    let started = Instant::now();
    for round in 0..rounds {
        for step in steps {
            let running = group.running().await;
            let (victim, pid) = running
                .iter()
                .find(|(name, _)| !gone.contains(name))
                .cloned()
                .expect("a machine to delete");
            let others: BTreeSet<String> = running
                .iter()
                .map(|(n, _)| n.clone())
                .filter(|n| *n != victim)
                .collect();
            group.log(&format!(
                "round {round}: killing the operator at {step:?} while deleting {victim}"
            ));

            let mut options = group.sweeping_operator();
            options.env = vec![("NGO_FAULT_PAUSE_AT".into(), step.point().into())];
            group.cluster.start_operator(&options).expect("operator");
            let address = group.cluster.operator().expect("operator").grpc_address;
            let log = group
                .cluster
                .operator()
                .expect("operator")
                .log_path()
                .to_path_buf();
            let mut client = group.cluster.pki.connect(address).await.expect("client");
            let mut request = tonic::Request::new(proto::NodeGroupDeleteNodesRequest {
                id: group.id.clone(),
                nodes: vec![node(&victim, &pid)],
            });
            request.set_timeout(step.client_timeout());
            group.ca_asks(&[&victim]).await;
            let call = tokio::spawn(async move { client.node_group_delete_nodes(request).await });
            paused_at_fault_point("the fault point", &log).await;
            group.cluster.kill_operator();
            // The operator died before answering: what matters is what it left behind (a
            // decrement it committed is U1's residue: no answer reached CA).
            let answer = call.await.expect("rpc task");
            group.ca_got(&[&victim], &answer).await;

            // A new operator (no fault) starts; its sweeper resolves what the dead one left.
            options.env.clear();
            group
                .cluster
                .start_operator(&options)
                .expect("operator restarts");
            match step {
                Step::Claimed => {
                    assert!(group.claimed().await, "the dead request's claim is there");
                    poll("the stranded claim released", || async {
                        (!group.claimed().await).then_some(())
                    })
                    .await;
                    rolled_back += 1;
                    assert_eq!(group.replicas().await, expected_replicas);
                    assert!(group.marked().await.is_empty(), "nothing was marked");
                }
                Step::Marked => {
                    poll("the stranded mark rolled back", || async {
                        (group.marked().await.is_empty() && !group.claimed().await).then_some(())
                    })
                    .await;
                    rolled_back += 1;
                    assert_eq!(
                        group.replicas().await,
                        expected_replicas,
                        "replicas untouched"
                    );
                }
                Step::Decremented => {
                    expected_replicas -= 1;
                    assert_eq!(group.replicas().await, expected_replicas, "one decrement");
                }
            }

            // cluster-autoscaler asks again; whatever happened before, the result is exact. (A
            // node already removed is unknown by now: CA would not ask for it.)
            let address = group.cluster.operator().expect("operator").grpc_address;
            let mut client = group.cluster.pki.connect(address).await.expect("client");
            group.ca_asks(&[&victim]).await;
            let retry = client
                .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                    id: group.id.clone(),
                    nodes: vec![node(&victim, &pid)],
                })
                .await;
            // CA does not ask about a node it no longer sees; this test does.
            if !retry
                .as_ref()
                .is_err_and(|s| s.code() == tonic::Code::NotFound)
            {
                group.ca_got(&[&victim], &retry).await;
            }
            match step {
                Step::Decremented => assert!(
                    retry.is_ok()
                        || retry
                            .as_ref()
                            .is_err_and(|s| s.code() == tonic::Code::NotFound),
                    "{retry:?}"
                ),
                _ => {
                    retry.expect("DeleteNodes on retry");
                    expected_replicas -= 1;
                }
            }
            assert_eq!(
                group.replicas().await,
                expected_replicas,
                "exactly one decrement"
            );
            gone.insert(victim.clone());
            poll(&format!("{victim} deleted and only it"), || async {
                let names = group.machine_names().await;
                (!names.contains(&victim) && others.is_subset(&names)).then_some(())
            })
            .await;
            assert!(group.marked().await.is_empty(), "no mark left behind");
            let _ = client
                .node_groups(proto::NodeGroupsRequest {})
                .await
                .expect("still serving");
        }
    }
    group.cluster.stop_operator();
    let machines = group.machines().await.len() as i64;
    assert_eq!(machines, expected_replicas, "machines match replicas");
    group.assert_u1();
    group.log(&format!(
        "{total} kills survived in {:.0}s: {rolled_back} stranded claims released by the sweeper, \
         0 left; ledger: {}",
        started.elapsed().as_secs_f64(),
        group.ledger().await
    ));
}
