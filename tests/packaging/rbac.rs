//! The chart's RBAC as the API server enforces it. The chart is installed with the real helm as
//! the README installs it (`helm install ngo charts/nodegroup-operator -n kube-system`, default
//! values: no NodePool settings), and `kubectl auth can-i`, impersonating the operator's
//! ServiceAccount (the API server adds its ServiceAccount groups), answers verb by verb: the
//! operator may make every call its code makes, and nothing that would matter beyond them: no
//! Secret of kube-system (its release namespace here) or of any other namespace, no delete, no
//! wildcard. With
//! `nodePools.bootstrapTokens=true` the kube-system Secret access appears exactly as
//! docs/clouds.md says: create, list and delete, nothing else.
//!
//! chart.rs compares the rendered rules with the operator's calls, rendered into a namespace of
//! its own; this checks what the installed objects grant where the README puts them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use ngo_testbed as testbed;
use serde_json::json;

use crate::helm::{self, SERIAL};

const NAMESPACE: &str = "kube-system";
/// The chart's ServiceAccount in the release namespace (`ngo.fullname`).
const ACCOUNT: &str = "system:serviceaccount:kube-system:nodegroup-operator";
/// A namespace of Cluster API objects, as `autoDiscovery` would name it.
const WORKLOADS: &str = "capi";

/// Verbs on a resource (`resource[.group][/subresource]`), in a namespace or (`None`) in
/// every namespace.
type Access = (&'static [&'static str], &'static str, Option<&'static str>);

/// Every call the operator's code makes with default values (the calls chart.rs lists,
/// `operator_access`, with the file behind each): cluster-wide unless a namespace is named.
const OPERATOR_CALLS: &[Access] = &[
    // Scalable resources: watched; patched (replicas and the scale-down ledger in one write);
    // `/scale` read and replaced (service/actuate/capi/replicas.rs).
    (
        &["get", "list", "watch", "patch"],
        "machinedeployments.cluster.x-k8s.io",
        None,
    ),
    (
        &["get", "list", "watch", "patch"],
        "machinesets.cluster.x-k8s.io",
        None,
    ),
    (
        &["get", "list", "watch", "patch"],
        "machinepools.cluster.x-k8s.io",
        None,
    ),
    (
        &["get", "update"],
        "machinedeployments.cluster.x-k8s.io/scale",
        None,
    ),
    (
        &["get", "update"],
        "machinesets.cluster.x-k8s.io/scale",
        None,
    ),
    (
        &["get", "update"],
        "machinepools.cluster.x-k8s.io/scale",
        None,
    ),
    // Machines: the delete-machine annotation, the scale-down mark and finalizer.
    (
        &["get", "list", "watch", "patch"],
        "machines.cluster.x-k8s.io",
        None,
    ),
    // Clusters: `spec.paused`, client scoping.
    (&["get", "list", "watch"], "clusters.cluster.x-k8s.io", None),
    // Scale from zero: the first of the default infrastructureTemplates.
    (
        &["get", "list", "watch"],
        "awsmachinetemplates.infrastructure.cluster.x-k8s.io",
        None,
    ),
    // Its own resources and their status.
    (
        &["get", "list", "watch"],
        "nodegrouppolicies.autoscaling.nodegroup.dev",
        None,
    ),
    (
        &["patch"],
        "nodegrouppolicies.autoscaling.nodegroup.dev/status",
        None,
    ),
    (
        &["get", "list", "watch", "patch"],
        "nodepools.autoscaling.nodegroup.dev",
        None,
    ),
    (
        &["patch"],
        "nodepools.autoscaling.nodegroup.dev/status",
        None,
    ),
    (
        &["get", "update"],
        "nodepools.autoscaling.nodegroup.dev/scale",
        None,
    ),
    (&["create", "patch"], "events.events.k8s.io", None),
    // Same-cluster Nodes: read, cordoned and drained before a NodePool server goes.
    (&["get", "list", "watch", "patch"], "nodes", None),
    (&["list"], "pods", None),
    (&["create"], "pods/eviction", None),
    // Leader election, in its own namespace.
    (
        &["get", "create", "update"],
        "leases.coordination.k8s.io",
        Some(NAMESPACE),
    ),
];

/// What the operator never calls and must not be able to do with default values.
const NEVER: &[Access] = &[
    (
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
        "secrets",
        Some(NAMESPACE),
    ),
    (&["get", "list", "watch"], "secrets", None),
    (&["get", "list", "watch"], "secrets", Some(WORKLOADS)),
    (&["get", "list"], "configmaps", Some(NAMESPACE)),
    (&["create"], "serviceaccounts/token", Some(NAMESPACE)),
    (&["get", "create", "delete"], "pods", Some(NAMESPACE)),
    (&["delete", "update"], "nodes", None),
    (
        &["create", "update", "delete"],
        "machinedeployments.cluster.x-k8s.io",
        None,
    ),
    (
        &["create", "update", "delete"],
        "machines.cluster.x-k8s.io",
        None,
    ),
    (&["patch", "delete"], "clusters.cluster.x-k8s.io", None),
    (
        &["create", "update", "delete"],
        "nodepools.autoscaling.nodegroup.dev",
        None,
    ),
    (
        &["patch", "update"],
        "nodegrouppolicies.autoscaling.nodegroup.dev",
        None,
    ),
    (
        &["get", "update"],
        "leases.coordination.k8s.io",
        Some(WORKLOADS),
    ),
    (
        &["update"],
        "customresourcedefinitions.apiextensions.k8s.io",
        None,
    ),
    (
        &["create", "bind", "escalate"],
        "clusterroles.rbac.authorization.k8s.io",
        None,
    ),
    (&["*"], "*", None),
];

/// `nodePools.bootstrapTokens=true`: kubeadm bootstrap token Secrets minted, listed (expired
/// ones swept) and deleted in kube-system (nodepool/bootstrap.rs), as docs/clouds.md says:
/// "create, list and delete there".
const BOOTSTRAP_TOKENS: &[&str] = &["create", "list", "delete"];
const SECRET_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// Serves AWSMachineTemplates (a schemaless stand-in for Cluster API AWS's CRD): `kubectl auth
/// can-i` names a resource of a group only once discovery finds it there.
async fn serve_aws_machine_templates() {
    let client = testbed::controlplane::client_for(&helm::plane().kubeconfig)
        .await
        .unwrap();
    let crd = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "awsmachinetemplates.infrastructure.cluster.x-k8s.io"},
        "spec": {
            "group": "infrastructure.cluster.x-k8s.io", "scope": "Namespaced",
            "names": {"plural": "awsmachinetemplates", "singular": "awsmachinetemplate",
                "kind": "AWSMachineTemplate", "listKind": "AWSMachineTemplateList"},
            "versions": [{"name": "v1beta2", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    testbed::crds::apply(&client, &[crd]).await.unwrap();
}

/// `kubectl auth can-i <verb> <resource>` as the operator's ServiceAccount.
fn can_i(verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (resource, None),
    };
    let mut args = vec![
        "auth".to_string(),
        "can-i".into(),
        verb.into(),
        resource.into(),
        format!("--as={ACCOUNT}"),
    ];
    args.extend(subresource.map(|s| format!("--subresource={s}")));
    args.push(namespace.map_or("--all-namespaces".into(), |n| format!("--namespace={n}")));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Exit status 1 with "no"; any other answer is a failure of the check itself.
    let (_, out) = helm::try_kubectl(&args);
    match out
        .lines()
        .map(str::trim)
        .find(|l| *l == "yes" || *l == "no")
    {
        Some(answer) => answer == "yes",
        None => panic!("kubectl {args:?}: {out}"),
    }
}

fn scope(namespace: Option<&str>) -> String {
    namespace.map_or("in every namespace".into(), |n| format!("in {n}"))
}

/// The checks of `access` whose answer is not `expected`, as sentences.
fn answered_otherwise(access: &[Access], expected: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    for (verbs, resource, namespace) in access {
        for verb in *verbs {
            if can_i(verb, resource, *namespace) != expected {
                let may = if expected { "may not" } else { "may" };
                wrong.push(format!("{may} {verb} {resource} {}", scope(*namespace)));
            }
        }
    }
    wrong
}

/// The verbs the operator may use on Secrets in `namespace` (`None`: in every namespace).
fn secret_verbs_allowed(namespace: Option<&str>) -> BTreeSet<&'static str> {
    SECRET_VERBS
        .iter()
        .copied()
        .filter(|verb| can_i(verb, "secrets", namespace))
        .collect()
}

/// Waits until the API server's authorizer answers `verb resource` with `expected` (bindings
/// reach it through a watch, a moment after helm returns).
fn wait_for_answer(verb: &str, resource: &str, namespace: Option<&str>, expected: bool) {
    let start = Instant::now();
    while can_i(verb, resource, namespace) != expected {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{verb} {resource} {}: still not {expected} after 30 s",
            scope(namespace)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_as_documented_the_operator_may_make_its_calls_and_read_no_secret_of_kube_system()
{
    let _serial = SERIAL.lock().await;
    let chart = helm::repo("charts/nodegroup-operator");
    let chart_arg = chart.to_str().unwrap();
    serve_aws_machine_templates().await;

    // --- Default values, in kube-system as the README installs it.
    helm::install_into("ngo", NAMESPACE, &chart, &[]);
    wait_for_answer("get", "machinedeployments.cluster.x-k8s.io", None, true);
    let mut wrong = answered_otherwise(OPERATOR_CALLS, true);
    wrong.extend(answered_otherwise(NEVER, false));

    // --- Bootstrap tokens asked for: create, list and delete in kube-system, nothing else
    // there, and still nothing in other namespaces.
    helm::helm(&[
        "upgrade",
        "ngo",
        chart_arg,
        "-n",
        NAMESPACE,
        "--set=nodePools.bootstrapTokens=true",
    ]);
    wait_for_answer("create", "secrets", Some(NAMESPACE), true);
    let with_tokens = secret_verbs_allowed(Some(NAMESPACE));
    let elsewhere = [
        secret_verbs_allowed(None),
        secret_verbs_allowed(Some(WORKLOADS)),
    ];
    let calls_with_tokens = answered_otherwise(OPERATOR_CALLS, true);

    // Uninstalled before asserting, so that a failure leaves no release with the default names
    // behind for the other tests of this binary. (`--no-hooks`: nothing to release here.)
    helm::helm(&["uninstall", "ngo", "-n", NAMESPACE, "--no-hooks"]);

    assert!(
        wrong.is_empty(),
        "with default values in {NAMESPACE}, {ACCOUNT}:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        with_tokens,
        BTreeSet::from_iter(BOOTSTRAP_TOKENS.iter().copied()),
        "Secret verbs in {NAMESPACE} with nodePools.bootstrapTokens=true"
    );
    assert_eq!(
        elsewhere,
        [BTreeSet::new(), BTreeSet::new()],
        "Secret verbs in every namespace and in {WORKLOADS} with nodePools.bootstrapTokens=true"
    );
    assert!(
        calls_with_tokens.is_empty(),
        "with nodePools.bootstrapTokens=true, {ACCOUNT}:\n{}",
        calls_with_tokens.join("\n")
    );
}
