//! A deletion auditor written from cluster-autoscaler's side, independent of the operator's
//! code and records: it holds the taints and answers CA would (taint a node before
//! DeleteNodes, keep the taint on OK, remove it on any error), watches Machines (or, for servers
//! without Machines, Nodes), and reports
//! every Machine that starts being deleted while its Node exists and CA's latest answer for
//! that Node was not OK, or the Node is not tainted. Property U1 of `docs/safety.md`, as the
//! user states it: "CA got an error for this node, so nothing may remove it".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Taint};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

/// The taint cluster-autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
/// Cluster API's annotation choosing a Machine for deletion first.
const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
/// Cluster API's label naming a Machine's MachineDeployment.
const DEPLOYMENT_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// Why a passive auditor counts a node CA gave up, removed with no pod on it, as residue: it
/// cannot tell an error answer from one that reached CA too late (U1's residue), and nothing
/// was lost; a pod on it is a violation.
const PASSIVE_RESIDUE: &str =
    "CA's answers are not seen: an error and a late answer look alike, and no pod ran on it";
/// Cluster API's label naming a Machine's MachinePool.
const MACHINE_POOL_LABEL: &str = "cluster.x-k8s.io/pool-name";
/// The MachineDeployment revision Cluster API records on it and on each of its MachineSets.
const REVISION_ANNOTATION: &str = "machinedeployment.clusters.x-k8s.io/revision";

/// What CA last heard about a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A DeleteNodes naming the node is under way: CA holds it tainted and waits.
    Pending,
    /// DeleteNodes answered OK: the node stays tainted.
    Ok,
    /// DeleteNodes answered an error: CA untainted the node, pods may land on it.
    Error,
    /// No answer reached CA (the operator was killed or stalled past CA's deadline, the
    /// connection broke): an error to CA, which untainted the node. A deletion then is U1's
    /// documented residue, which no provider can close, not a violation.
    Lost,
}

/// Why a Machine's deletion breaks U1, or `None` when it does not. `node_exists`: the
/// Machine's Node is there (a Machine without a Node carries no pods); `latest`: CA's latest
/// answer for that node; `tainted`: the Node carries [`TO_BE_DELETED_TAINT`].
pub fn violation(node_exists: bool, latest: Option<Answer>, tainted: bool) -> Option<String> {
    if !node_exists {
        return None;
    }
    match latest {
        None => Some("CA never asked to delete its node".into()),
        Some(Answer::Error) => Some("CA's latest answer for its node was an error".into()),
        Some(Answer::Lost) => Some("no answer for its node reached CA".into()),
        Some(Answer::Ok | Answer::Pending) if !tainted => {
            Some(format!("its node is not tainted {TO_BE_DELETED_TAINT}"))
        }
        // While the request is under way its answer decides: an error for a node whose
        // Machine is being deleted is reported when it comes.
        Some(Answer::Ok | Answer::Pending) => None,
    }
}

/// True when `status` carries no answer of the operator's to a request: the status was made on
/// the client's side (its deadline passed, the connection broke or could not be made: it
/// carries a transport source), or it is the one tonic's server makes when the request's
/// `grpc-timeout` passes (Canceled, "Timeout expired") while the request still runs, so
/// whatever the operator would have answered could no longer reach the client.
pub fn unanswered(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
        || (status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired")
}

#[derive(Default)]
struct Record {
    /// Passive: CA's answers are not seen (a real CA dialing the operator directly), so a
    /// removal is judged by the taint CA keeps on OK and removes on any error, as seen on
    /// the Nodes ([`Record::given_up`]), and by the pods still on the node: a node CA gave up
    /// that goes with pods is a violation, one that goes empty is residue.
    passive: bool,
    /// Nodes seen carrying CA's taint.
    held: BTreeSet<String>,
    /// Nodes seen losing CA's taint (CA gave them up) and not tainted again since.
    given_up: BTreeSet<String>,
    /// By node name.
    answers: BTreeMap<String, Answer>,
    /// Node names whose Machine is being deleted.
    deleting: BTreeSet<String>,
    /// Nodes answered OK whose taint a restart of cluster-autoscaler removed (its start-up
    /// clean-up): deleted untainted afterwards, that is the documented residue of U1, which no
    /// provider can close, not a violation.
    cleaned_by_restart: BTreeSet<String>,
    violations: Vec<String>,
    residue: Vec<String>,
    /// Machines a person annotated with delete-machine: their deletion is that person's.
    excused: BTreeSet<String>,
    /// Per MachineDeployment: decrements a person made (`kubectl scale`), each of which lets
    /// Cluster API take one machine of its own choosing (without the delete-machine
    /// annotation).
    lowered_by_person: BTreeMap<String, usize>,
    by_person: Vec<String>,
    /// Machines of an older MachineSet that a MachineDeployment's rollout deleted (Cluster
    /// API's own choice, by design).
    by_rollout: Vec<String>,
    /// Machines seen deleting.
    deleted: usize,
}

impl Record {
    /// Why removing the node `name` breaks U1 (see [`violation`]; passive: whether CA gave it
    /// up, see [`Record::passive`]).
    fn judge(&self, name: &str, node_exists: bool, tainted: bool) -> Option<String> {
        if !self.passive {
            return violation(node_exists, self.answers.get(name).copied(), tainted);
        }
        (node_exists && self.given_up.contains(name)).then(|| {
            format!("CA removed its {TO_BE_DELETED_TAINT} taint (an error answer) and did not put it back")
        })
    }

    /// Spends one decrement a person made of `group` (see
    /// [`DeletionAuditor::person_lowered`]): false when none is left.
    fn spend_person_budget(&mut self, group: Option<&str>) -> bool {
        match group.and_then(|g| self.lowered_by_person.get_mut(g)) {
            Some(left) if *left > 0 => {
                *left -= 1;
                true
            }
            _ => false,
        }
    }

    /// Files `line`, a removal neither a person's nor a rollout's: residue when CA's restart
    /// removed the taint of a node answered OK (`restarted`), when no answer reached CA (as
    /// the tap saw it, or by CA's own event, `late`: see [`late_answer`]), or (passive) when
    /// nothing ran on it (`drained`); a violation otherwise.
    fn residue_or_violation(
        &mut self,
        line: String,
        restarted: bool,
        latest: Option<Answer>,
        drained: bool,
        late: Option<String>,
    ) {
        let answered_ok = matches!(latest, Some(Answer::Ok | Answer::Pending));
        if restarted && answered_ok {
            self.residue.push(format!(
                "{line} (its taint was removed by a restart of cluster-autoscaler)"
            ));
        } else if let Some(word) = late.filter(|_| answered_ok && !self.passive) {
            self.residue.push(format!(
                "{line} (the answer reached the tap but not cluster-autoscaler in time; its own event: {word})"
            ));
        } else if latest == Some(Answer::Lost) {
            self.residue.push(format!(
                "{line} (the operator's answer never reached cluster-autoscaler)"
            ));
        } else if self.passive && drained {
            self.residue.push(format!("{line} ({PASSIVE_RESIDUE})"));
        } else {
            self.violations.push(line);
        }
    }

    /// Node `name` seen with (`tainted`) or without CA's taint.
    fn saw(&mut self, name: &str, tainted: bool) {
        if tainted {
            self.held.insert(name.to_string());
            self.given_up.remove(name);
        } else if self.held.remove(name) {
            self.given_up.insert(name.to_string());
        }
    }
}

/// The auditor of one namespace's Machines; stops watching when dropped.
pub struct DeletionAuditor {
    /// A client of the cluster holding the Nodes (and their pods) it judges.
    client: Client,
    record: Arc<Mutex<Record>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl DeletionAuditor {
    /// Starts watching the Machines (`machines`) of `namespace`.
    pub fn start(client: Client, namespace: &str, machines: &ApiResource) -> Self {
        Self::start_across(client.clone(), namespace, machines, client)
    }

    /// [`DeletionAuditor::start`] for Machines in a management cluster (`client`) whose Nodes
    /// live in a workload cluster (`nodes_client`).
    pub fn start_across(
        client: Client,
        namespace: &str,
        machines: &ApiResource,
        nodes_client: Client,
    ) -> Self {
        let record = Arc::new(Mutex::new(Record::default()));
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, machines);
        let nodes: Api<Node> = Api::all(nodes_client.clone());
        let pods: Api<Pod> = Api::all(nodes_client.clone());
        let events_api: Api<Event> = Api::all(nodes_client.clone());
        let client_for_sets = client.clone();
        let shared = record.clone();
        let watch = tokio::spawn(async move {
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let machine = match event {
                    Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => m,
                    _ => continue,
                };
                if machine.metadata.deletion_timestamp.is_none() || !seen.insert(machine.name_any())
                {
                    continue;
                }
                let Some(node_name) = machine.data["status"]["nodeRef"]["name"].as_str() else {
                    continue;
                };
                let rolled_out = of_an_older_revision(&client_for_sets, &machine).await;
                let node = nodes.get_opt(node_name).await.ok().flatten();
                let tainted = node.as_ref().is_some_and(is_tainted);
                let undrained = match node {
                    Some(_) => undrained_pods(&pods, node_name).await,
                    None => Vec::new(),
                };
                let events = node_events(&events_api, node_name).await;
                let mut record = lock(&shared);
                record.deleted += 1;
                record.deleting.insert(node_name.to_string());
                let latest = record.answers.get(node_name).copied();
                let restarted = record.cleaned_by_restart.contains(node_name);
                let mut why = record.judge(node_name, node.is_some(), tainted);
                if why.is_none() && !undrained.is_empty() {
                    why = Some(format!(
                        "its node still runs pods CA did not drain: {undrained:?}"
                    ));
                }
                if let Some(why) = why {
                    let line = format!(
                        "Machine {} (node {node_name}) deleted: {why} (CA's latest answer: {latest:?}; the node's events: {})",
                        machine.name_any(),
                        quoted(&events)
                    );
                    let deployment = machine
                        .labels()
                        .get(DEPLOYMENT_LABEL)
                        .or_else(|| machine.labels().get(MACHINE_POOL_LABEL))
                        .cloned();
                    let annotated = machine.annotations().contains_key(DELETE_MACHINE);
                    if record.excused.contains(&machine.name_any()) {
                        record.by_person.push(line);
                    } else if rolled_out {
                        record.by_rollout.push(line);
                    } else if !annotated && record.spend_person_budget(deployment.as_deref()) {
                        record
                            .by_person
                            .push(format!("{line} (replicas lowered by a person)"));
                    } else {
                        let late = (!tainted).then(|| late_answer(&events)).flatten();
                        record.residue_or_violation(
                            line,
                            restarted,
                            latest,
                            undrained.is_empty(),
                            late,
                        );
                    }
                }
            }
        });
        Self {
            client: nodes_client,
            record,
            watches: vec![watch],
        }
    }

    /// Starts watching the Nodes matching `selector` (a label selector) rather than Machines:
    /// for servers without Machines (NodePools), whose removal shows as their Node's deletion.
    /// A Node deleted while CA's latest answer for it was not OK, or untainted in its last
    /// state, or with pods CA did not drain still bound to it, is a violation (or residue, or
    /// a person's, as for Machines).
    pub fn start_for_nodes(client: Client, selector: &str) -> Self {
        let record = Arc::new(Mutex::new(Record::default()));
        let watch = watch_nodes(
            client.clone(),
            record.clone(),
            selector,
            None,
            Arc::new(|_| true),
        );
        Self {
            client,
            record,
            watches: vec![watch],
        }
    }

    /// Also watches the Nodes matching `selector`, as [`DeletionAuditor::start_for_nodes`]
    /// does. `group_label`: the Node label naming its group, for the decrements a person made
    /// ([`DeletionAuditor::person_lowered`] with that label's value).
    pub fn watch_nodes(&mut self, selector: &str, group_label: &str) {
        let watch = watch_nodes(
            self.client.clone(),
            self.record.clone(),
            selector,
            Some(group_label.to_string()),
            Arc::new(|_| true),
        );
        self.watches.push(watch);
    }

    /// A passive auditor for a real cluster-autoscaler that dials the operator directly, so
    /// its answers are not seen: it watches the Machines (`machines`) of `namespace` and the
    /// Nodes `node_filter` accepts, and judges each removal by what CA does with its taint
    /// (kept on OK, removed on any error): a node that lost CA's taint and did not get it
    /// back, or still runs pods CA did not drain, must not be removed. `group_label`: as
    /// for [`DeletionAuditor::watch_nodes`].
    pub fn passive(
        client: Client,
        namespace: &str,
        machines: &ApiResource,
        group_label: &str,
        node_filter: impl Fn(&Node) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self::passive_across(
            client.clone(),
            namespace,
            machines,
            client,
            group_label,
            node_filter,
        )
    }

    /// [`DeletionAuditor::passive`] for Machines in a management cluster (`client`) whose
    /// Nodes live in a workload cluster (`nodes_client`).
    pub fn passive_across(
        client: Client,
        namespace: &str,
        machines: &ApiResource,
        nodes_client: Client,
        group_label: &str,
        node_filter: impl Fn(&Node) -> bool + Send + Sync + 'static,
    ) -> Self {
        let mut auditor = Self::start_across(client, namespace, machines, nodes_client);
        lock(&auditor.record).passive = true;
        let watch = watch_nodes(
            auditor.client.clone(),
            auditor.record.clone(),
            "",
            Some(group_label.to_string()),
            Arc::new(node_filter),
        );
        auditor.watches.push(watch);
        auditor
    }

    /// An auditor that watches nothing and whose client reaches no cluster: it only records
    /// what it is told, for tests of what tells it (the sandbox's tap). Call it inside a Tokio
    /// runtime, as any kube client is made.
    pub fn detached() -> Self {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a valid URI"));
        Self {
            client: Client::try_from(config).expect("a client"),
            record: Arc::new(Mutex::new(Record::default())),
            watches: Vec::new(),
        }
    }

    /// What CA last heard about node `name`, as far as this auditor was told.
    pub fn latest(&self, name: &str) -> Option<Answer> {
        lock(&self.record).answers.get(name).copied()
    }

    /// Before a DeleteNodes naming `nodes`: taints them as CA does.
    pub async fn taint(&self, nodes: &[String]) {
        for name in nodes {
            self.set_taint(name, true).await;
        }
        self.asked(nodes);
    }

    /// After a DeleteNodes naming `nodes` answered: records the answer and, on an error,
    /// untaints them all as CA does. An error for a node whose Machine is already being deleted
    /// is a violation.
    pub async fn answered(&self, nodes: &[String], ok: bool) {
        self.heard(nodes, ok);
        if !ok {
            for name in nodes {
                self.set_taint(name, false).await;
            }
        }
    }

    /// After a DeleteNodes naming `nodes` got no answer (see [`Answer::Lost`]): records it and
    /// untaints them, as CA does for any error.
    pub async fn lost(&self, nodes: &[String]) {
        self.heard_nothing(nodes);
        for name in nodes {
            self.set_taint(name, false).await;
        }
    }

    /// After a DeleteNodes naming `nodes` returned `answer`, as a test's client saw it: an
    /// error that is no answer of the operator's ([`unanswered`]) is [`Answer::Lost`], any
    /// other error [`Answer::Error`].
    pub async fn returned<T>(&self, nodes: &[String], answer: &Result<T, tonic::Status>) {
        match answer {
            Err(status) if unanswered(status) => self.lost(nodes).await,
            other => self.answered(nodes, other.is_ok()).await,
        }
    }

    /// Every violation seen so far.
    pub fn violations(&self) -> Vec<String> {
        lock(&self.record).violations.clone()
    }

    /// Deletions of nodes whose taint a restart of cluster-autoscaler removed after an OK
    /// (see [`DeletionAuditor::ca_stopped`]).
    pub fn residue(&self) -> Vec<String> {
        lock(&self.record).residue.clone()
    }

    /// Deletions of Machines passed to [`DeletionAuditor::excuse`].
    pub fn by_person(&self) -> Vec<String> {
        lock(&self.record).by_person.clone()
    }

    /// Machine `name` carries a person's delete-machine annotation (or, watching Nodes, Node
    /// `name` goes for replicas a person lowered): its deletion is theirs.
    pub fn excuse(&self, name: &str) {
        lock(&self.record).excused.insert(name.to_string());
    }

    /// A person lowered group `deployment`'s replicas by one (a MachineDeployment's or
    /// MachinePool's name; for watched Nodes, their group label's value): Cluster API, or the
    /// pool's reconciler, may take one machine of its own choosing for it.
    pub fn person_lowered(&self, deployment: &str) {
        *lock(&self.record)
            .lowered_by_person
            .entry(deployment.to_string())
            .or_default() += 1;
    }

    /// The decrement announced with [`DeletionAuditor::person_lowered`] was not written.
    pub fn person_did_not_lower(&self, deployment: &str) {
        if let Some(n) = lock(&self.record).lowered_by_person.get_mut(deployment) {
            *n = n.saturating_sub(1);
        }
    }

    /// Deletions of Machines of an older MachineSet during a MachineDeployment's rollout.
    pub fn by_rollout(&self) -> Vec<String> {
        lock(&self.record).by_rollout.clone()
    }

    /// How many Machines were seen starting to be deleted.
    pub fn deleted(&self) -> usize {
        lock(&self.record).deleted
    }

    /// A real cluster-autoscaler (which taints and untaints by itself) sent a DeleteNodes
    /// naming `nodes`: its answer is pending.
    pub fn asked(&self, nodes: &[String]) {
        let mut record = lock(&self.record);
        for name in nodes {
            record.answers.insert(name.clone(), Answer::Pending);
            record.cleaned_by_restart.remove(name);
        }
    }

    /// A real cluster-autoscaler heard `ok` for its DeleteNodes naming `nodes` (it untaints
    /// them itself on an error). An error for a node whose Machine is being deleted is a
    /// violation.
    pub fn heard(&self, nodes: &[String], ok: bool) {
        let answer = if ok { Answer::Ok } else { Answer::Error };
        let mut record = lock(&self.record);
        for name in nodes {
            record.answers.insert(name.clone(), answer);
            if !ok && record.deleting.contains(name) {
                record.violations.push(format!(
                    "CA got an error for node {name} whose Machine is being deleted"
                ));
            }
        }
    }

    /// A real cluster-autoscaler's DeleteNodes naming `nodes` got no answer of the operator's
    /// (its deadline passed, or the connection broke): CA untaints them itself, as for any
    /// error, and a deletion then is U1's residue ([`Answer::Lost`]), not a violation.
    pub fn heard_nothing(&self, nodes: &[String]) {
        let mut record = lock(&self.record);
        for name in nodes {
            record.answers.insert(name.clone(), Answer::Lost);
            if record.deleting.contains(name) {
                record.residue.push(format!(
                    "no answer reached CA for node {name} whose Machine is being deleted"
                ));
            }
        }
    }

    /// cluster-autoscaler's process has exited and a new one is about to start: the new one's
    /// start-up clean-up removes the taint of every node the old one was answered OK for, and
    /// of every node whose DeleteNodes was still under way (the process that would have heard
    /// the answer is gone: a reply that never reached CA). Called before the old process has
    /// exited, it would miss the DeleteNodes that process still sends while shutting down.
    pub fn ca_stopped(&self) {
        let mut record = lock(&self.record);
        let tainted: Vec<String> = record
            .answers
            .iter()
            .filter(|(_, a)| matches!(a, Answer::Ok | Answer::Pending))
            .map(|(n, _)| n.clone())
            .collect();
        record.cleaned_by_restart.extend(tainted);
    }

    /// cluster-autoscaler restarted ([`DeletionAuditor::ca_stopped`]), and its start-up
    /// clean-up removed the taint of every node it had been answered OK for or was still
    /// waiting on, as CA does (`cleanUpIfRequired`).
    pub async fn ca_restarted(&self) {
        self.ca_stopped();
        let cleaned: Vec<String> = lock(&self.record)
            .cleaned_by_restart
            .iter()
            .cloned()
            .collect();
        for name in cleaned {
            self.set_taint(&name, false).await;
        }
    }

    async fn set_taint(&self, name: &str, present: bool) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Ok(Some(node)) = nodes.get_opt(name).await else {
            return;
        };
        let mut taints: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        taints.retain(|t| t.key != TO_BE_DELETED_TAINT);
        if present {
            taints.push(Taint {
                key: TO_BE_DELETED_TAINT.into(),
                value: Some(jiff::Timestamp::now().as_second().to_string()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
        }
        let patch = serde_json::json!({ "spec": { "taints": taints } });
        if let Err(error) = nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(%error, node = name, "auditor could not write the node's taint");
        }
    }
}

impl Drop for DeletionAuditor {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// Which Nodes a watch judges.
type NodeFilter = Arc<dyn Fn(&Node) -> bool + Send + Sync>;

/// Watches the Nodes matching `selector` into `record`: each Node's deletion is judged as a
/// Machine's is (see [`DeletionAuditor::start_for_nodes`]).
fn watch_nodes(
    client: Client,
    record: Arc<Mutex<Record>>,
    selector: &str,
    group_label: Option<String>,
    node_filter: NodeFilter,
) -> tokio::task::JoinHandle<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let events_api: Api<Event> = Api::all(client);
    let config = watcher::Config::default().labels(selector);
    tokio::spawn(async move {
        let mut events = watcher(nodes, config).boxed();
        while let Some(event) = events.next().await {
            let node = match event {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    if node_filter(&node) {
                        lock(&record).saw(&node.name_any(), is_tainted(&node));
                    }
                    continue;
                }
                Ok(watcher::Event::Delete(node)) => node,
                _ => continue,
            };
            if !node_filter(&node) {
                continue;
            }
            let name = node.name_any();
            if lock(&record).deleting.contains(&name) {
                // Its Machine's deletion was judged when it started.
                continue;
            }
            let undrained = undrained_pods(&pods, &name).await;
            let events = node_events(&events_api, &name).await;
            let mut record = lock(&record);
            record.deleted += 1;
            record.deleting.insert(name.clone());
            let latest = record.answers.get(&name).copied();
            let mut why = record.judge(&name, true, is_tainted(&node));
            if why.is_none() && !undrained.is_empty() {
                why = Some(format!("it still ran pods CA did not drain: {undrained:?}"));
            }
            let Some(why) = why else {
                continue;
            };
            let line = format!(
                "Node {name} deleted: {why} (CA's latest answer: {latest:?}; its events: {})",
                quoted(&events)
            );
            let group = group_label
                .as_ref()
                .and_then(|l| node.labels().get(l).cloned());
            if record.excused.contains(&name) {
                record.by_person.push(line);
            } else if undrained.is_empty() && record.spend_person_budget(group.as_deref()) {
                record
                    .by_person
                    .push(format!("{line} (replicas lowered by a person)"));
            } else {
                let restarted = record.cleaned_by_restart.contains(&name);
                let late = (!is_tainted(&node)).then(|| late_answer(&events)).flatten();
                record.residue_or_violation(line, restarted, latest, undrained.is_empty(), late);
            }
        }
    })
}

/// True when `machine` belongs to a MachineSet of an older revision than its
/// MachineDeployment's: a rollout replaces it, by Cluster API's own choice (read from Cluster
/// API's objects, not the operator's).
async fn of_an_older_revision(client: &Client, machine: &DynamicObject) -> bool {
    let namespace = machine.namespace().unwrap_or_default();
    let Some(set) = machine
        .owner_references()
        .iter()
        .find(|o| o.kind == "MachineSet")
        .map(|o| o.name.clone())
    else {
        return false;
    };
    let Some(deployment) = machine.labels().get(DEPLOYMENT_LABEL).cloned() else {
        return false;
    };
    let revision = |o: Option<DynamicObject>| {
        o.and_then(|o| {
            o.annotations()
                .get(REVISION_ANNOTATION)?
                .parse::<u64>()
                .ok()
        })
    };
    let sets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &crate::capi::machine_sets());
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &crate::capi::machine_deployments(),
    );
    let set_revision = revision(sets.get_opt(&set).await.ok().flatten());
    let current = revision(deployments.get_opt(&deployment).await.ok().flatten());
    matches!((set_revision, current), (Some(s), Some(d)) if s < d)
}

/// One Event about a Node, as a violation's line quotes it and [`late_answer`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEvent {
    /// When it last happened (RFC 3339, so that text order is time order; seconds only).
    pub at: String,
    /// Who recorded it (`cluster-autoscaler`, `node-controller`, ...).
    pub component: String,
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for NodeEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {}: {}",
            self.at, self.component, self.reason, self.message
        )
    }
}

/// The Events about Node `node`, oldest first: cluster-autoscaler records there why it gave a
/// node up (`ScaleDownFailed` with the error it heard), beside what the auditor was told.
async fn node_events(events: &Api<Event>, node: &str) -> Vec<NodeEvent> {
    let params = kube::api::ListParams::default().fields(&format!(
        "involvedObject.kind=Node,involvedObject.name={node}"
    ));
    let Ok(list) = events.list(&params).await else {
        return Vec::new();
    };
    let mut items: Vec<NodeEvent> = list
        .items
        .iter()
        .map(|e| NodeEvent {
            at: e
                .last_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
                .unwrap_or_default(),
            component: e
                .source
                .as_ref()
                .and_then(|s| s.component.clone())
                .or_else(|| e.reporting_component.clone())
                .unwrap_or_default(),
            reason: e.reason.clone().unwrap_or_default(),
            message: e.message.clone().unwrap_or_default(),
        })
        .collect();
    items.sort_by(|a, b| a.at.cmp(&b.at));
    items
}

/// `events` for a violation's line.
fn quoted(events: &[NodeEvent]) -> String {
    if events.is_empty() {
        return "none".into();
    }
    events
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}

/// cluster-autoscaler's own word that no answer reached it in time, when its newest word
/// about deleting the node (`ScaleDown`, `ScaleDownFailed`) is a failure naming its own
/// deadline or a broken connection: CA untainted the node for an answer the tap saw come
/// back (the answer reached the tap before the tap's copy of CA's deadline passed, and CA
/// after its own). As for [`Answer::Lost`], a removal then is U1's residue. A failure
/// recorded in the same second as another word is taken as the newer (CA marks a node, then
/// fails to delete it; it never succeeds and fails for one node at once).
pub fn late_answer(events: &[NodeEvent]) -> Option<String> {
    let words = events.iter().filter(|e| {
        e.component == "cluster-autoscaler"
            && (e.reason == "ScaleDown" || e.reason == "ScaleDownFailed")
    });
    let newest = words.max_by(|a, b| {
        a.at.cmp(&b.at)
            .then_with(|| (a.reason == "ScaleDownFailed").cmp(&(b.reason == "ScaleDownFailed")))
    })?;
    let no_answer = [
        "code = DeadlineExceeded",
        "code = Canceled",
        "code = Unavailable",
    ];
    (newest.reason == "ScaleDownFailed" && no_answer.iter().any(|c| newest.message.contains(c)))
        .then(|| newest.to_string())
}

/// Pods bound to `node` that CA would have evicted before deleting it: not terminating, not
/// finished, not of a DaemonSet, not mirror pods.
async fn undrained_pods(pods: &Api<Pod>, node: &str) -> Vec<String> {
    let params = kube::api::ListParams::default().fields(&format!("spec.nodeName={node}"));
    let Ok(list) = pods.list(&params).await else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            !p.owner_references().iter().any(|o| o.kind == "DaemonSet")
                && !p.annotations().contains_key("kubernetes.io/config.mirror")
        })
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

fn is_tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT))
}

fn lock(record: &Mutex<Record>) -> std::sync::MutexGuard<'_, Record> {
    record
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passive_auditor_judges_by_the_taint_ca_removed_and_did_not_put_back() {
        let mut record = Record {
            passive: true,
            ..Record::default()
        };
        assert_eq!(
            record.judge("n", true, false),
            None,
            "never tainted: not CA's"
        );
        record.saw("n", true);
        assert_eq!(record.judge("n", true, true), None, "held by CA");
        record.saw("n", false);
        assert!(record.judge("n", true, false).is_some(), "CA gave it up");
        record.saw("n", true);
        assert_eq!(record.judge("n", true, true), None, "named again");
        record.saw("n", false);
        assert_eq!(record.judge("n", false, false), None, "no node, no pods");
    }

    fn event(at: &str, component: &str, reason: &str, message: &str) -> NodeEvent {
        NodeEvent {
            at: at.into(),
            component: component.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    const MARKED: &str = "marked the node as toBeDeleted/unschedulable";
    const LATE: &str = "failed to delete empty node: failed to delete nodes from group g: rpc error: code = DeadlineExceeded desc = context deadline exceeded";

    #[test]
    fn cluster_autoscalers_own_event_tells_an_answer_that_came_too_late() {
        let ca = |at, reason, message| event(at, "cluster-autoscaler", reason, message);
        let registered = event(
            "2026-12-07T20:00:00Z",
            "node-controller",
            "RegisteredNode",
            "",
        );
        assert_eq!(late_answer(&[]), None, "no word of CA's");
        assert_eq!(late_answer(std::slice::from_ref(&registered)), None);
        let failed_late = [
            registered.clone(),
            ca("2026-12-07T20:01:00Z", "ScaleDown", MARKED),
            ca("2026-12-07T20:01:10Z", "ScaleDownFailed", LATE),
        ];
        assert!(late_answer(&failed_late).is_some_and(|w| w.contains("DeadlineExceeded")));
        let same_second = [
            ca("2026-12-07T20:01:00Z", "ScaleDownFailed", LATE),
            ca("2026-12-07T20:01:00Z", "ScaleDown", MARKED),
        ];
        assert!(
            late_answer(&same_second).is_some(),
            "a failure in the second of its marking is the newer"
        );
        let succeeded = [
            ca("2026-12-07T20:01:00Z", "ScaleDown", MARKED),
            ca(
                "2026-12-07T20:01:02Z",
                "ScaleDown",
                "nodes removed by cluster autoscaler",
            ),
        ];
        assert_eq!(late_answer(&succeeded), None, "CA heard the OK");
        let named_again = [
            ca("2026-12-07T20:01:10Z", "ScaleDownFailed", LATE),
            ca("2026-12-07T20:02:00Z", "ScaleDown", MARKED),
            ca(
                "2026-12-07T20:02:01Z",
                "ScaleDown",
                "nodes removed by cluster autoscaler",
            ),
        ];
        assert_eq!(late_answer(&named_again), None, "a later OK decides");
        let refused = [ca(
            "2026-12-07T20:01:10Z",
            "ScaleDownFailed",
            "failed to delete empty node: rpc error: code = FailedPrecondition desc = not held",
        )];
        assert_eq!(late_answer(&refused), None, "an answer, not its absence");
    }

    #[test]
    fn a_late_answer_by_cas_own_event_is_residue_and_only_after_an_ok() {
        let mut record = Record::default();
        let word = Some("CA's own event".to_string());
        record.residue_or_violation("ok".into(), false, Some(Answer::Ok), true, word.clone());
        assert_eq!(record.residue.len(), 1);
        record.residue_or_violation("error".into(), false, Some(Answer::Error), true, word);
        assert_eq!(
            record.violations,
            ["error"],
            "CA's error answer stays a violation"
        );
        record.residue_or_violation("ok, no word".into(), false, Some(Answer::Ok), true, None);
        assert_eq!(record.violations.len(), 2);
    }

    #[test]
    fn only_statuses_the_operator_did_not_answer_are_unanswered() {
        assert!(unanswered(&tonic::Status::cancelled("Timeout expired")));
        assert!(!unanswered(&tonic::Status::cancelled(
            "the stream was reset"
        )));
        assert!(!unanswered(&tonic::Status::deadline_exceeded(
            "the operator's own deadline"
        )));
        assert!(!unanswered(&tonic::Status::failed_precondition("not held")));
        let broken = tonic::Status::from_error(Box::new(std::io::Error::other("reset")));
        assert!(unanswered(&broken));
    }

    #[test]
    fn a_deletion_breaks_u1_unless_ca_holds_its_node_tainted_after_an_ok() {
        assert_eq!(violation(true, Some(Answer::Ok), true), None);
        assert!(violation(true, Some(Answer::Error), false).is_some());
        assert!(violation(true, Some(Answer::Error), true).is_some());
        assert!(violation(true, Some(Answer::Ok), false).is_some());
        assert!(violation(true, None, false).is_some());
        assert_eq!(
            violation(true, Some(Answer::Pending), true),
            None,
            "Cluster API may act before the answer arrives; the answer decides"
        );
        assert!(violation(true, Some(Answer::Pending), false).is_some());
        assert_eq!(violation(false, None, false), None, "no node, no pods");
        assert!(
            violation(true, Some(Answer::Lost), false).is_some(),
            "a lost answer is judged apart, as residue"
        );
    }
}
