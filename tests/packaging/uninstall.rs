//! `helm uninstall` of the chart for real, pre-delete hook included (docs/operations.md,
//! "Uninstall"). The sandbox runs no Job controller and no kubelet, so these tests stand in
//! for them as helm.rs does for `helm test`: when helm creates the hook Job, its pod
//! template's container runs as a local process (`ngo_testbed::localpod`: the real
//! `nodegroup-operator release-finalizers` with the Job's arguments and a token of the Job's
//! ServiceAccount, so with the chart's RBAC), retried as the Job's `backoffLimit` allows, and
//! the outcome is written on the Job's status as the Job controller writes it; helm waits for
//! exactly that. `helm uninstall` itself is the real command.
//!
//! The operator does not run: the hook decides on the objects as they are, whoever else runs.

use std::path::Path;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use kube::{Client, ResourceExt};
use ngo_testbed as testbed;
use nodegroup_operator::ngo_index::capi::scale_down::{
    FINALIZER, LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark,
};
use nodegroup_operator::nodepool::reconciler::FINALIZER as POOL_FINALIZER;
use serde_json::json;

use crate::helm::{self, SERIAL};
use crate::support::{DELETE_MACHINE, TestNs, machine_deployments, machine_sets, machines};

const RELEASE: &str = "ngo";
/// The hook Job: `<fullname>-release-finalizers`, the default names.
const HOOK_JOB: &str = "nodegroup-operator-release-finalizers";

/// What one `helm uninstall` did: helm's success and output, and the hook containers' output
/// (every attempt's, in order).
struct Uninstall {
    succeeded: bool,
    helm_output: String,
    hook_output: String,
    attempts: usize,
}

impl Uninstall {
    /// Fails unless the hook printed each of `lines`.
    fn assert_hook_printed(&self, lines: &[String]) {
        for line in lines {
            assert!(
                self.hook_output.contains(line),
                "{line}\nin the hook's output:\n{}",
                self.hook_output
            );
        }
    }
}

/// Installs the chart as `RELEASE` into namespace `release_namespace` (created here), with
/// Cluster API objects in a namespace of their own: the chart's `rbac.namespaces` names it, so
/// the hook acts there only (`--namespace`), whatever the other tests of this binary left in
/// theirs.
async fn install(client: &Client, release_namespace: &str) -> TestNs {
    install_with(client, release_namespace, &[]).await
}

/// [`install`] with more `values` (helm's `--set` arguments).
async fn install_with(client: &Client, release_namespace: &str, values: &[&str]) -> TestNs {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": release_namespace}})).unwrap(),
        )
        .await
        .unwrap();
    let workers = TestNs::new_with(client.clone(), "capi").await;
    helm::install_into(
        RELEASE,
        release_namespace,
        &helm::repo("charts/nodegroup-operator"),
        &[
            format!("--set-json=rbac.namespaces=[\"{}\"]", workers.name),
            format!(
                "--set-json=autoDiscovery=[\"clusterapi:namespace={}\"]",
                workers.name
            ),
        ]
        .into_iter()
        .chain(values.iter().map(|v| v.to_string()))
        .collect::<Vec<_>>(),
    );
    workers
}

/// A MachineDeployment `md` with MachineSet `ms` and Machine `machine`, which carries our
/// scale-down finalizer, `mark` as its record and the delete-machine annotation, and is then
/// deleted: Cluster API's deletion waits for our finalizer.
async fn deleting_machine(workers: &TestNs, machine: &str, mark: &ScaleDownMark) {
    let md = workers.machine_deployment("md", 2, json!({})).await;
    let ms = workers.machine_set("ms", 2, json!({}), Some(&md)).await;
    workers.machine(machine, &ms, None, None, json!({})).await;
    let machines = workers.api(&machines());
    machines
        .patch(
            machine,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": [FINALIZER],
                "annotations": {MARK_ANNOTATION: mark.to_annotation(), DELETE_MACHINE: "yes"},
            }})),
        )
        .await
        .unwrap();
    machines
        .delete(machine, &DeleteParams::default())
        .await
        .unwrap();
}

fn now() -> i64 {
    jiff::Timestamp::now().as_second()
}

fn mark(deadline: i64, released: bool) -> ScaleDownMark {
    ScaleDownMark {
        request: "r1".into(),
        group: "MachineDeployment/capi/md".into(),
        deadline,
        preexisting: false,
        released,
    }
}

/// Every object of `workers` that still carries one of our finalizers or scale-down
/// annotations, as `<Kind>/<name>: <what>`.
async fn ours_left(workers: &TestNs) -> Vec<String> {
    let mut left = Vec::new();
    let kinds = [
        machines(),
        machine_deployments(),
        machine_sets(),
        ApiResource::erase::<ngo_api::NodePool>(&()),
    ];
    for resource in &kinds {
        for object in workers
            .api(resource)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            let what = format!("{}/{}", resource.kind, object.name_any());
            for finalizer in object.finalizers() {
                if finalizer == FINALIZER || finalizer == POOL_FINALIZER {
                    left.push(format!("{what}: finalizer {finalizer}"));
                }
            }
            for annotation in [MARK_ANNOTATION, LEDGER_ANNOTATION] {
                if object.annotations().contains_key(annotation) {
                    left.push(format!("{what}: annotation {annotation}"));
                }
            }
        }
    }
    left
}

/// Whether the stand-in runs hook Job `job` now: not finished, not run already (`ran` holds
/// the uids run) and not being deleted. A Job of an earlier attempt, kept failed until helm
/// replaces it, is not run.
pub(crate) fn hook_is_due(job: &Job, ran: &[String]) -> bool {
    let finished = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Complete" || c.type_ == "Failed")
        });
    let uid = job.metadata.uid.as_ref();
    !finished
        && uid.is_some_and(|uid| !ran.contains(uid))
        && job.metadata.deletion_timestamp.is_none()
}

/// Stands in for the Job controller and the kubelet on hook Job `job`: runs its pod
/// template's container until it succeeds or `backoffLimit` retries have failed (one after
/// the other; the Job controller waits 10 s, 20 s, 40 s between them), then writes the
/// outcome as the Job controller does: `Complete` (with `SuccessCriteriaMet`) or `Failed`
/// (with `FailureTarget`, reason `BackoffLimitExceeded`), the conditions helm waits for.
/// Returns the containers' output and how many ran.
pub(crate) async fn run_job(client: &Client, job: &Job, log_dir: &Path) -> (String, usize) {
    let namespace = job.namespace().unwrap();
    let name = job.name_any();
    let uid = job.uid().unwrap();
    let spec = job.spec.clone().unwrap();
    let pod_spec = spec.template.spec.unwrap();
    let limit = spec.backoff_limit.unwrap_or(6);
    let started = jiff::Timestamp::now().round(jiff::Unit::Second).unwrap();
    let mut output = String::new();
    let mut attempts = 0;
    let succeeded = loop {
        attempts += 1;
        // As the Job controller names its Pods: the Job's name and a suffix of their own.
        let pod = format!("{name}-{}-{attempts}", &uid[..8]);
        let (status, out) =
            helm::run_hook_pod(client, &namespace, &pod, pod_spec.clone(), log_dir).await;
        output.push_str(&out);
        if status.success() {
            break true;
        }
        if attempts > limit as usize {
            break false;
        }
    };
    let finished = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let condition = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": finished, "lastTransitionTime": finished})
    };
    let status = if succeeded {
        let message = "Reached expected number of succeeded pods";
        json!({
            "startTime": started.to_string(), "completionTime": finished,
            "succeeded": 1, "failed": attempts - 1,
            "conditions": [
                condition("SuccessCriteriaMet", "CompletionsReached", message),
                condition("Complete", "CompletionsReached", message),
            ],
        })
    } else {
        let message = "Job has reached the specified backoff limit";
        json!({
            "startTime": started.to_string(), "failed": attempts,
            "conditions": [
                condition("FailureTarget", "BackoffLimitExceeded", message),
                condition("Failed", "BackoffLimitExceeded", message),
            ],
        })
    };
    Api::<Job>::namespaced(client.clone(), &namespace)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("writing the status of Job {name}: {e}"));
    (output, attempts)
}

/// `helm uninstall RELEASE -n <namespace> --wait`, the real command, with this test standing
/// in for the Job controller and the kubelet on the hook Jobs helm creates meanwhile.
async fn helm_uninstall(client: &Client, namespace: &str, log_dir: &Path) -> Uninstall {
    let jobs = Api::<Job>::namespaced(client.clone(), namespace);
    let selector = ListParams::default().labels("app.kubernetes.io/component=release-finalizers");
    let mut ran = Vec::new();
    let mut hook_output = String::new();
    let mut attempts = 0;
    let args = [
        "uninstall",
        RELEASE,
        "-n",
        namespace,
        "--wait",
        "--timeout=2m",
    ];
    let (succeeded, helm_output) = helm::helm_standing_in(&args, async || {
        for job in jobs.list(&selector).await.unwrap() {
            if !hook_is_due(&job, &ran) {
                continue;
            }
            ran.push(job.uid().unwrap());
            let (output, n) = run_job(client, &job, log_dir).await;
            hook_output.push_str(&output);
            attempts += n;
        }
    })
    .await;
    Uninstall {
        succeeded,
        helm_output,
        hook_output,
        attempts,
    }
}

/// Whether the release's installed objects are all there: the operator's Deployment, its
/// ServiceAccount and ClusterRole.
async fn operator_installed(client: &Client, namespace: &str) -> [bool; 3] {
    [
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
            .get_opt("nodegroup-operator")
            .await
            .unwrap()
            .is_some(),
        Api::<ServiceAccount>::namespaced(client.clone(), namespace)
            .get_opt("nodegroup-operator")
            .await
            .unwrap()
            .is_some(),
        Api::<ClusterRole>::all(client.clone())
            .get_opt("nodegroup-operator")
            .await
            .unwrap()
            .is_some(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_runs_the_hook_which_lets_a_machine_deleted_for_a_scale_down_go() {
    let _serial = SERIAL.lock().await;
    let client = testbed::controlplane::client_for(&helm::plane().kubeconfig)
        .await
        .unwrap();
    let logs = tempfile::Builder::new()
        .prefix("ngo-uninstall-")
        .tempdir()
        .unwrap();
    let workers = install(&client, "ngo-uninstall").await;
    // A scale-down that completed: its request released its record; Cluster API deletes the
    // Machine, which waits for our finalizer; the group's ledger has the applied decrement.
    deleting_machine(&workers, "m-deleted", &mark(now() - 600, true)).await;
    let mut ledger = Ledger::default();
    ledger.record("m-deleted", "r1", now() - 600, |_| true);
    workers
        .api(&machine_deployments())
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {LEDGER_ANNOTATION: ledger.to_annotation()}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(ours_left(&workers).await.len(), 3, "the fixture");

    let uninstall = helm_uninstall(&client, "ngo-uninstall", logs.path()).await;
    assert!(
        uninstall.succeeded,
        "helm uninstall:\n{}\nhook:\n{}",
        uninstall.helm_output, uninstall.hook_output
    );
    assert_eq!(uninstall.attempts, 1, "{}", uninstall.hook_output);
    let ns = &workers.name;
    uninstall.assert_hook_printed(&[
        format!(
            "released Machine {ns}/m-deleted: finalizer {FINALIZER} removed, annotation {MARK_ANNOTATION} removed"
        ),
        format!("released MachineDeployment {ns}/md: annotation {LEDGER_ANNOTATION} removed"),
        "2 released, 0 kept, 0 held".to_string(),
    ]);
    assert_eq!(
        workers
            .api(&machines())
            .get_opt("m-deleted")
            .await
            .unwrap()
            .map(|m| m.name_any()),
        None,
        "the Machine's deletion completed"
    );
    assert_eq!(ours_left(&workers).await, Vec::<String>::new());
    assert_eq!(
        operator_installed(&client, "ngo-uninstall").await,
        [false; 3],
        "{}",
        uninstall.helm_output
    );
    assert!(
        Api::<Job>::namespaced(client.clone(), "ngo-uninstall")
            .get_opt(HOOK_JOB)
            .await
            .unwrap()
            .is_none(),
        "the succeeded hook Job is deleted (hook-succeeded)"
    );
    let (found, out) = helm::try_helm(&["status", RELEASE, "-n", "ngo-uninstall"]);
    assert!(!found && out.contains("release: not found"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_stops_with_the_operator_installed_while_a_scale_down_may_complete_or_a_node_pool_exists()
 {
    let _serial = SERIAL.lock().await;
    let client = testbed::controlplane::client_for(&helm::plane().kubeconfig)
        .await
        .unwrap();
    let logs = tempfile::Builder::new()
        .prefix("ngo-uninstall-held-")
        .tempdir()
        .unwrap();
    let workers = install(&client, "ngo-held").await;
    let ns = workers.name.clone();
    // A scale-down under way: the Machine is being deleted, and its request may still lower
    // the group's replicas for it until its deadline (plus the chart's 30 s clock margin).
    let deadline = now() + 600;
    deleting_machine(&workers, "m-scaling", &mark(deadline, false)).await;
    // A NodePool with a server in the cloud.
    let pools = workers.node_pool_with_a_server().await;
    let before = ours_left(&workers).await;

    // --- The hook fails after its retries; helm stops before deleting anything.
    let stopped = helm_uninstall(&client, "ngo-held", logs.path()).await;
    assert!(
        !stopped.succeeded,
        "helm uninstall went through:\n{}\nhook:\n{}",
        stopped.helm_output, stopped.hook_output
    );
    assert!(
        stopped
            .helm_output
            .contains(&format!("Job/ngo-held/{HOOK_JOB}"))
            && stopped.helm_output.contains("Failed"),
        "helm names the failed hook Job:\n{}",
        stopped.helm_output
    );
    assert_eq!(stopped.attempts, 4, "backoffLimit 3: four attempts");
    for line in [
        format!(
            "held Machine {ns}/m-scaling: request r1 may still complete its scale-down of MachineDeployment/capi/md until unix time {}",
            deadline + 30
        ),
        format!(
            "held NodePool {ns}/np: exists (servers cherryservers://42 (np-0)): delete it and wait until it is gone"
        ),
        "0 released, 0 kept, 2 held".to_string(),
        "release-finalizers: 2 object(s) held, listed above; nothing was forced".to_string(),
    ] {
        assert_eq!(
            stopped.hook_output.matches(&line).count(),
            4,
            "{line}\nonce per attempt in the hook's output:\n{}",
            stopped.hook_output
        );
    }
    assert_eq!(
        operator_installed(&client, "ngo-held").await,
        [true; 3],
        "the operator stays installed"
    );
    let job = Api::<Job>::namespaced(client.clone(), "ngo-held")
        .get(HOOK_JOB)
        .await
        .expect("the failed hook Job is kept for its log");
    assert!(
        job.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Failed" && c.status == "True")
    );
    assert_eq!(ours_left(&workers).await, before, "nothing was released");

    // --- What the docs say to do: delete the NodePools and wait until they are gone (the
    // operator deletes the servers, then its finalizer; this test stands in for it), and let
    // the scale-down settle (time passes: the request's deadline is moved past, as waiting
    // for it plus the margin would). Then `helm uninstall` again: the failed Job is replaced,
    // and the uninstall goes through.
    pools.delete("np", &DeleteParams::default()).await.unwrap();
    pools
        .patch(
            "np",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    workers
        .api(&machines())
        .patch(
            "m-scaling",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                MARK_ANNOTATION: mark(now() - 31, false).to_annotation()
            }}})),
        )
        .await
        .unwrap();
    let retried = helm_uninstall(&client, "ngo-held", logs.path()).await;
    assert!(
        retried.succeeded,
        "helm uninstall:\n{}\nhook:\n{}",
        retried.helm_output, retried.hook_output
    );
    assert!(
        retried.hook_output.contains(&format!(
            "released Machine {ns}/m-scaling: finalizer {FINALIZER} removed, annotation {MARK_ANNOTATION} removed"
        )),
        "{}",
        retried.hook_output
    );
    assert_eq!(ours_left(&workers).await, Vec::<String>::new());
    assert_eq!(operator_installed(&client, "ngo-held").await, [false; 3]);
}

/// With `uninstall.orphanCloudServers=true` the hook releases a NodePool too: its finalizer
/// goes, its servers are listed as left in the cloud, and `helm uninstall` goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_with_orphan_cloud_servers_releases_a_node_pool_and_lists_its_servers() {
    let _serial = SERIAL.lock().await;
    let client = testbed::controlplane::client_for(&helm::plane().kubeconfig)
        .await
        .unwrap();
    let logs = tempfile::Builder::new()
        .prefix("ngo-uninstall-orphan-")
        .tempdir()
        .unwrap();
    let workers = install_with(
        &client,
        "ngo-orphan",
        &["--set=uninstall.orphanCloudServers=true"],
    )
    .await;
    let ns = workers.name.clone();
    let pools = workers.node_pool_with_a_server().await;

    let uninstall = helm_uninstall(&client, "ngo-orphan", logs.path()).await;
    assert!(
        uninstall.succeeded,
        "helm uninstall:\n{}\nhook:\n{}",
        uninstall.helm_output, uninstall.hook_output
    );
    assert_eq!(uninstall.attempts, 1, "{}", uninstall.hook_output);
    uninstall.assert_hook_printed(&[
        format!("released NodePool {ns}/np"),
        "left in the cloud: cherryservers://42".to_string(),
        "1 released, 0 kept, 0 held".to_string(),
    ]);
    let pool = pools.get("np").await.expect("the NodePool stays");
    assert!(
        pool.metadata.finalizers.unwrap_or_default().is_empty(),
        "its finalizer is released"
    );
    assert_eq!(ours_left(&workers).await, Vec::<String>::new());
    assert_eq!(operator_installed(&client, "ngo-orphan").await, [false; 3]);
}
