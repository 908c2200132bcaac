//! The Helm chart: renders with the real helm, grants no wildcard, and its RBAC is enough for
//! every operation (the whole suite runs the operator as the chart's ServiceAccount, see
//! `support::rbac`); a permission taken away is reported as PermissionDenied naming it.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};
use ngo_service::proto;
use serde_json::json;
use tonic::Code;

/// `networkPolicy.metricsFrom` admitting every namespace, for renderings with the ServiceMonitor
/// (the chart refuses it when no pod may reach /metrics).
const METRICS_FROM_ANY_NAMESPACE: &str = r#"networkPolicy.metricsFrom=[{"namespaceSelector":{}}]"#;

#[test]
fn chart_renders_and_grants_no_wildcards() {
    let docs = rbac::render_chart("ngo-system", &[]).unwrap();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for kind in [
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ServiceAccount",
        "ClusterRole",
        "Role",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        for rule in doc["rules"].as_array().unwrap() {
            for field in ["verbs", "resources", "apiGroups"] {
                let values = rule[field].as_array().unwrap();
                assert!(
                    !values.iter().any(|v| v.as_str().unwrap().contains('*')),
                    "wildcard in {field}: {rule}"
                );
            }
        }
    }
    let crds: Vec<&serde_json::Value> = docs
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds/nodegroup-operator.yaml"),
    )
    .unwrap();
    let checked_in: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    assert_eq!(checked_in.len(), 2, "NodeGroupPolicy and NodePool");
    assert_eq!(
        crds,
        checked_in.iter().collect::<Vec<_>>(),
        "charts/nodegroup-operator/crds is stale: copy crds/nodegroup-operator.yaml"
    );
}

/// Every (apiGroup, resource, verb) a set of rendered Roles/ClusterRoles grants, with the
/// namespace of a Role (`None` for a ClusterRole).
fn grants(docs: &[serde_json::Value]) -> Vec<(Option<String>, String, String, String)> {
    let mut out = Vec::new();
    for doc in docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
    {
        let namespace = doc["metadata"]["namespace"].as_str().map(String::from);
        for rule in doc["rules"].as_array().unwrap() {
            for group in rule["apiGroups"].as_array().unwrap() {
                for resource in rule["resources"].as_array().unwrap() {
                    for verb in rule["verbs"].as_array().unwrap() {
                        out.push((
                            namespace.clone(),
                            group.as_str().unwrap().to_string(),
                            resource.as_str().unwrap().to_string(),
                            verb.as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
        }
    }
    out
}

fn grants_anywhere(grants: &[(Option<String>, String, String, String)], resource: &str) -> bool {
    grants.iter().any(|(_, _, r, _)| r == resource)
}

#[test]
fn each_topology_renders_only_the_rbac_it_needs() {
    // Self-hosted, every namespace: Nodes, Clusters (their spec.paused); Secrets only where NodePools need
    // them: credentials read by name in the release namespace, nothing cluster-wide, and
    // nothing in kube-system unless bootstrap tokens are asked for.
    let secrets_of = |docs: &[serde_json::Value]| {
        let mut secrets: Vec<(Option<String>, String)> = grants(docs)
            .iter()
            .filter(|(_, _, r, _)| r == "secrets")
            .map(|(n, _, _, v)| (n.clone(), v.clone()))
            .collect();
        secrets.sort();
        secrets
    };
    let at = |ns: &str, verb: &str| (Some(ns.to_string()), verb.to_string());
    let defaults = rbac::render_chart("ngo-system", &[]).unwrap();
    assert_eq!(secrets_of(&defaults), vec![at("ngo-system", "get")]);
    let docs =
        rbac::render_chart("ngo-system", &["--set", "nodePools.bootstrapTokens=true"]).unwrap();
    let g = grants(&docs);
    assert!(grants_anywhere(&g, "nodes"));
    assert!(grants_anywhere(&g, "clusters"));
    let mut secrets: Vec<(Option<String>, String)> = g
        .iter()
        .filter(|(_, _, r, _)| r == "secrets")
        .map(|(n, _, _, v)| (n.clone(), v.clone()))
        .collect();
    secrets.sort();
    assert_eq!(
        secrets,
        vec![
            at("kube-system", "create"),
            at("kube-system", "delete"),
            at("kube-system", "list"),
            at("ngo-system", "get"),
        ]
    );

    // Management cluster serving workload clusters, scoped by certificate, two namespaces.
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "topology.workloadNodes=cluster-secrets",
            "--set",
            "topology.clientIdentity=uri-san",
            "--set-json",
            r#"rbac.namespaces=["team-a","team-b"]"#,
            "--set-json",
            r#"autoDiscovery=["clusterapi:namespace=team-a","clusterapi:namespace=team-b"]"#,
        ],
    )
    .unwrap();
    let g = grants(&docs);
    assert!(
        !grants_anywhere(&g, "nodes"),
        "no Node access in the management cluster"
    );
    assert!(
        !docs.iter().any(|d| d["kind"] == "ClusterRole"),
        "namespaced Roles only"
    );
    assert!(
        !g.iter()
            .any(|(n, _, _, _)| n.as_deref() == Some("kube-system")),
        "bootstrap tokens go to the workload clusters, with their own credentials"
    );
    for ns in ["team-a", "team-b"] {
        let here = |resource: &str, verb: &str| {
            g.iter()
                .any(|(n, _, r, v)| n.as_deref() == Some(ns) && r == resource && v == verb)
        };
        assert!(here("secrets", "get"), "{ns}: kubeconfig Secrets");
        assert!(
            !here("secrets", "list"),
            "{ns}: Secrets are read by name only"
        );
        assert!(here("clusters", "watch"), "{ns}: Clusters");
        assert!(here("machinedeployments", "patch"), "{ns}: replicas");
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--workload-nodes=cluster-secrets"), "{args}");
    assert!(args.contains("--client-identity=uri-san"), "{args}");

    // One client certificate per workload cluster, naming its Cluster.
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "grpc.certManager.enabled=true",
            "--set-json",
            r#"grpc.certManager.clients=[{"name":"a","cluster":"team-a/prod"}]"#,
        ],
    )
    .unwrap();
    let client = docs
        .iter()
        .find(|d| {
            d["kind"] == "Certificate" && d["metadata"]["name"] == "nodegroup-operator-client-a"
        })
        .expect("client certificate");
    assert_eq!(
        client["spec"]["uris"],
        json!(["spiffe://nodegroup.dev/cluster/team-a/prod"])
    );
    assert_eq!(client["spec"]["usages"], json!(["client auth"]));
}

#[tokio::test]
async fn the_charts_rbac_is_enough_to_run_the_operator() {
    let ns = TestNs::new("chart-rbac").await;
    // The suite's operator identity is the chart's ServiceAccount with a bound token.
    let as_operator = ngo_testbed::controlplane::client_for(&shared().operator_kubeconfig)
        .await
        .unwrap();
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(as_operator)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:ngo-system:nodegroup-operator")
    );

    let md = ns.machine_deployment("md", 2, bounds(1, 4)).await;
    let ms = ns.machine_set("md-ms", 2, json!({}), Some(&md)).await;
    let mut pids = Vec::new();
    for i in 0..2 {
        let pid = format!("test:////{}-{i}", ns.name);
        let node = ns.node(&format!("n{i}"), &pid, BTreeMap::new()).await;
        ns.machine(&format!("m{i}"), &ms, Some(&pid), Some(&node), json!({}))
            .await;
        pids.push(pid);
    }
    ns.policy("p", json!({"selector": {}, "maxSize": 4}))
        .await
        .unwrap();
    let (operator, mut client) = ns.operator().await;
    let id = format!("MachineDeployment/{}/md", ns.name);
    eventually("group", Duration::from_secs(20), || {
        let mut c = client.clone();
        async move {
            c.node_groups(proto::NodeGroupsRequest {})
                .await
                .ok()?
                .into_inner()
                .node_groups
                .first()
                .map(|_| ())
        }
    })
    .await;
    client
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: id.clone(),
            delta: 1,
        })
        .await
        .unwrap();
    client
        .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id,
            nodes: vec![proto::ExternalGrpcNode {
                provider_id: pids[0].clone(),
                name: "n0".into(),
                ..Default::default()
            }],
        })
        .await
        .unwrap();
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    assert!(
        ns.annotations(&machines(), "m0")
            .await
            .contains_key(DELETE_MACHINE)
    );
    let status = ns.policy_status("p", |s| s.group_count == 1).await;
    assert_eq!(
        condition(&status, "Ready").unwrap().status,
        "True",
        "status written with the chart's RBAC"
    );
    let scaled_up = |e: &[(String, String)]| e.iter().any(|(r, _)| r == "ScaleUp");
    let events = ns.wait_events_for("md", scaled_up).await;
    assert!(
        scaled_up(&events),
        "events written with the chart's RBAC: {events:?}"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_permission_missing_from_the_role_is_reported_as_permission_denied_naming_it() {
    let ns = TestNs::new("chart-missing").await;
    deployment_with_nodes(&ns, "md", 1, 5, 2).await;
    // The chart's ClusterRole without `update` on the scale subresources.
    let mut role: ClusterRole = serde_json::from_value(
        rbac::of_kind(rbac::rendered(), "ClusterRole")
            .next()
            .unwrap()
            .clone(),
    )
    .unwrap();
    let name = format!("{}-no-scale-update", ns.name);
    role.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        ..Default::default()
    };
    let mut removed = 0;
    for rule in role.rules.iter_mut().flatten() {
        if rule
            .resources
            .iter()
            .flatten()
            .any(|r| r == "machinedeployments/scale")
        {
            rule.verbs.retain(|v| v != "update");
            removed += 1;
        }
    }
    assert_eq!(removed, 1, "the chart grants update on /scale in one rule");
    let token = rbac::service_account_with(&ns.client, &name, &role, &ns.name)
        .await
        .unwrap();
    let kubeconfig = shared_token_kubeconfig(&name, &token);
    let (operator, mut client) = ns.operator_with(kubeconfig, None).await;
    wait_groups(&client, 1).await;
    let md = ns.api(&machine_deployments()).get("md").await.unwrap();

    let denied = client
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: format!("MachineDeployment/{}/md", ns.name),
            delta: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(
        denied.code(),
        Code::PermissionDenied,
        "{}",
        denied.message()
    );
    assert_eq!(
        denied.message(),
        format!(
            r#"writing the scale of MachineDeployment/{ns}/md: machinedeployments.cluster.x-k8s.io "md" is forbidden: User "system:serviceaccount:ngo-system:{name}" cannot update resource "machinedeployments/scale" in API group "cluster.x-k8s.io" in the namespace "{ns}" (403 Forbidden)"#,
            ns = ns.name
        )
    );
    let after = ns.api(&machine_deployments()).get("md").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        md.metadata.resource_version
    );
    operator.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Values, rendering and linting.

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/nodegroup-operator")
}

fn repo_file(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `helm <args>`: success, stdout and stderr.
fn helm(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(ngo_testbed::upstream_bin("helm"))
        .args(args)
        .output()
        .expect("running helm (tests/upstream/build.sh helm)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `helm template` of the chart as release `ngo` in `ngo-system` with `args`: success and
/// stdout or stderr.
fn template(args: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut all = vec![
        "template",
        "ngo",
        chart.to_str().unwrap(),
        "-n",
        "ngo-system",
    ];
    all.extend_from_slice(args);
    let (ok, out, err) = helm(&all);
    if ok { Ok(out) } else { Err(err) }
}

/// Value sets the chart must render and lint cleanly with: what platform teams run.
const VALUE_SETS: &[(&str, &[&str])] = &[
    ("defaults", &[]),
    (
        "one Cluster of a management cluster, scoped by configuration",
        &[
            "--set",
            "topology.workloadNodes=cluster-secrets",
            "--set",
            "topology.cluster=tenants/c1",
        ],
    ),
    (
        "cert-manager, monitoring, dashboard, network policy",
        &[
            "--set",
            "grpc.certManager.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.dashboard.enabled=true",
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
        ],
    ),
    (
        "management cluster, clients scoped by certificate, namespaced Roles",
        &[
            "--set",
            "topology.workloadNodes=cluster-secrets",
            "--set",
            "topology.clientIdentity=uri-san",
            "--set",
            "grpc.certManager.enabled=true",
            "--set-json",
            r#"grpc.certManager.clients=[{"name":"team-a-prod","cluster":"team-a/prod"}]"#,
            "--set-json",
            r#"rbac.namespaces=["team-a"]"#,
            "--set-json",
            r#"autoDiscovery=["clusterapi:namespace=team-a"]"#,
        ],
    ),
    (
        "workload cluster with a management kubeconfig",
        &[
            "--set",
            "topology.workloadNodes=kubeconfig",
            "--set",
            "topology.managementKubeconfigSecret=management-kubeconfig",
            "--set",
            "podAntiAffinity=hard",
            "--set",
            "capi.version=v1beta1",
        ],
    ),
    (
        "one replica, plaintext, no leader election",
        &[
            "--set",
            "replicas=1",
            "--set",
            "leaderElection.enabled=false",
            "--set",
            "grpc.insecure=true",
            "--set",
            "podAntiAffinity=none",
            "--set-json",
            "topologySpreadConstraints=[]",
        ],
    ),
    (
        "a second release: own names, pinned image, tuned pod, budget and scraping",
        &[
            "--set",
            "fullnameOverride=ngo-b",
            "--set",
            "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "--set-json",
            r#"podSecurityContext={"runAsUser":65532,"fsGroup":65532}"#,
            "--set-json",
            r#"livenessProbe={"periodSeconds":20,"failureThreshold":6}"#,
            "--set",
            "podDisruptionBudget.maxUnavailable=50%",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set-json",
            METRICS_FROM_ANY_NAMESPACE,
            "--set",
            "metrics.serviceMonitor.interval=1m30s",
            "--set-json",
            r#"metrics.serviceMonitor.metricRelabelings=[{"action":"drop","sourceLabels":["__name__"],"regex":"nodegroup_index_.*"}]"#,
            "--set",
            "metrics.prometheusRule.enabled=true",
        ],
    ),
];

#[test]
fn the_chart_lints_strictly_with_each_value_set() {
    let chart = chart_dir();
    for (name, args) in VALUE_SETS {
        let mut all = vec!["lint", chart.to_str().unwrap(), "--strict"];
        all.extend_from_slice(args);
        let (ok, out, err) = helm(&all);
        assert!(ok, "helm lint ({name}):\n{out}\n{err}");
        let docs = template(args).unwrap_or_else(|e| panic!("helm template ({name}): {e}"));
        assert!(docs.contains("kind: Deployment"), "{name}");
    }
}

#[test]
fn bad_values_fail_with_the_value_and_the_reason() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "topology.workloadNodes=workload"],
            "at '/topology/workloadNodes': value must be one of 'same-cluster', 'cluster-secrets', 'kubeconfig'",
        ),
        (&["--set", "grpc.port=70000"], "at '/grpc/port': maximum"),
        (
            &["--set", "imag.tag=v1"],
            "additional properties 'imag' not allowed",
        ),
        (
            &["--set-json", r#"autoDiscovery=["namespace=capi"]"#],
            "at '/autoDiscovery/0': 'namespace=capi' does not match pattern",
        ),
        (
            &["--set", "capi.scaleZeroDefaultArch=x86_64"],
            "at '/capi/scaleZeroDefaultArch': value must be one of 'amd64', 'arm64', 'ppc64le', 's390x'",
        ),
        (
            &["--set", "autoscaler.cloudConfig.grpcTimeout=ten"],
            "at '/autoscaler/cloudConfig/grpcTimeout': 'ten' does not match pattern",
        ),
        (
            &["--set-json", r#"rbac.namespaces=["Team_A"]"#],
            "at '/rbac/namespaces/0'",
        ),
        (
            &["--set", "leaderElection.enabled=false"],
            "replicas=2 needs leaderElection.enabled=true",
        ),
        (
            &["--set", "grpc.tlsSecretName="],
            "grpc.tlsSecretName is empty",
        ),
        (
            &["--set", "topology.workloadNodes=kubeconfig"],
            "topology.workloadNodes=kubeconfig needs topology.managementKubeconfigSecret",
        ),
        (
            &["--set", "topology.workloadNodes=cluster-secrets"],
            "topology.workloadNodes=cluster-secrets serves the cluster-autoscaler of every workload cluster",
        ),
        (
            &[
                "--set",
                "grpc.insecure=true",
                "--set",
                "topology.clientIdentity=uri-san",
            ],
            "topology.clientIdentity=uri-san reads the client certificate, so grpc.insecure must be false",
        ),
        (
            &[
                "--set",
                "grpc.certManager.enabled=true",
                "--set",
                "grpc.certManager.issuerRef.name=shared",
                "--set",
                "grpc.certManager.issuerRef.kind=ClusterIssuer",
            ],
            "grpc.certManager.issuerRef names ClusterIssuer shared, which signs for every namespace",
        ),
        (
            &["--set", "metrics.serviceMonitor.enabled=true"],
            "metrics.serviceMonitor.enabled, but the NetworkPolicy admits the admin port (/metrics) from no pod",
        ),
        (
            &["--set", "securityContext.fsGroup=65532"],
            "securityContext.fsGroup: securityContext is the container's in this chart; fsGroup is the pod's, so it goes in podSecurityContext",
        ),
    ];
    for (args, expected) in cases {
        let error = template(args).expect_err(&format!("{args:?} must be refused"));
        assert!(
            error.contains(expected),
            "{args:?}: expected {expected:?} in:\n{error}"
        );
    }
    // `helm install` checks the same way, before anything reaches a cluster.
    let chart = chart_dir();
    let (ok, _, err) = helm(&[
        "install",
        "ngo",
        chart.to_str().unwrap(),
        "--dry-run=client",
        "--set",
        "replicas=0",
    ]);
    assert!(!ok);
    assert!(
        err.contains("at '/replicas': minimum: got 0, want 1"),
        "{err}"
    );
}

/// The golden rendering of the defaults. To update it after a deliberate chart change:
/// `NGO_UPDATE_GOLDEN=1 cargo test --test packaging chart::default_rendering_matches_the_golden_file`,
/// then review the diff.
#[test]
fn default_rendering_matches_the_golden_file() {
    let golden = repo_file("tests/golden/chart-defaults.yaml");
    let rendered = template(&[]).unwrap();
    if std::env::var_os("NGO_UPDATE_GOLDEN").is_some_and(|v| v != "0") {
        std::fs::write(&golden, &rendered).unwrap();
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_default();
    if rendered != expected {
        let diff: Vec<String> = rendered
            .lines()
            .zip(
                expected
                    .lines()
                    .chain(std::iter::repeat("<end of golden file>")),
            )
            .enumerate()
            .filter(|(_, (r, e))| r != e)
            .take(10)
            .map(|(i, (r, e))| format!("line {}: rendered {r:?}, golden {e:?}", i + 1))
            .collect();
        panic!(
            "the default rendering differs from tests/golden/chart-defaults.yaml ({} vs {} lines):\n{}\n\
             If the change is intended: NGO_UPDATE_GOLDEN=1 cargo test --test packaging chart::default_rendering_matches_the_golden_file",
            rendered.lines().count(),
            expected.lines().count(),
            diff.join("\n")
        );
    }
}

/// `nodegroup-operator run --help`: every long flag, with the environment variable that
/// sets it when there is one.
pub(crate) fn operator_flags() -> Vec<(String, Option<String>)> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodegroup-operator"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let trimmed = trimmed
            .strip_prefix("-h, ")
            .or_else(|| trimmed.strip_prefix("-V, "))
            .unwrap_or(trimmed);
        if let Some(rest) = trimmed.strip_prefix("--") {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            flags.push((name, None));
        }
        if let (Some(start), Some(last)) = (line.find("[env: "), flags.last_mut()) {
            let env: String = line[start + 6..]
                .chars()
                .take_while(|c| *c != '=' && *c != ']')
                .collect();
            last.1 = Some(env);
        }
    }
    flags.retain(|(name, _)| name != "help" && name != "version");
    assert!(flags.len() > 15, "parsed {flags:?} from:\n{help}");
    flags
}

#[test]
fn every_operator_flag_is_reachable_from_values() {
    let value_sets: &[&[&str]] = &[
        &[
            "--set",
            "capi.version=v1beta2",
            "--set-json",
            r#"autoDiscovery=["clusterapi:namespace=capi"]"#,
            "--set",
            "topology.workloadNodes=kubeconfig",
            "--set",
            "topology.managementKubeconfigSecret=management",
            "--set",
            "topology.workloadKubeconfigSecret=workload",
        ],
        &[
            "--set",
            "grpc.insecure=true",
            "--set",
            "replicas=1",
            "--set",
            "leaderElection.enabled=false",
        ],
        &[
            "--set",
            "topology.workloadNodes=cluster-secrets",
            "--set",
            "topology.allowUnscopedClients=true",
        ],
        &["--set", "topology.cluster=capi/c1"],
        &[
            "--set-json",
            r#"nodePools.endpointAllow=["*.aliyuncs.com"]"#,
            "--set",
            "nodePools.endpointAllowHttp=true",
            "--set",
            "nodePools.aliCloudOidcTokenFile=/var/run/secrets/rrsa/token",
        ],
    ];
    // Flags of the co-located sidecar, which runs in cluster-autoscaler's pod (its chart's
    // values, checked by the_upstream_chart_with_the_co_located_values_...), not in this one.
    let sidecar_only = ["grpc-unix-socket"];
    let mut args = Vec::new();
    let mut env = Vec::new();
    for values in value_sets {
        let docs = rbac::render_chart("ngo-system", values).unwrap();
        let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
        let container = &deployment["spec"]["template"]["spec"]["containers"][0];
        for arg in container["args"].as_array().unwrap() {
            args.push(arg.as_str().unwrap().to_string());
        }
        for var in container["env"].as_array().unwrap() {
            env.push(var["name"].as_str().unwrap().to_string());
        }
    }
    let unreachable: Vec<String> = operator_flags()
        .into_iter()
        .filter(|(flag, _)| !sidecar_only.contains(&flag.as_str()))
        .filter(|(flag, var)| {
            let as_flag = args
                .iter()
                .any(|a| a == &format!("--{flag}") || a.starts_with(&format!("--{flag}=")));
            let as_env = var.as_ref().is_some_and(|v| env.contains(v));
            !as_flag && !as_env
        })
        .map(|(flag, var)| format!("--{flag} ({})", var.unwrap_or_default()))
        .collect();
    assert!(
        unreachable.is_empty(),
        "flags no value renders: {unreachable:?}; args {args:?}, env {env:?}"
    );
}

#[test]
fn extra_volumes_reach_the_pod_and_mounts_the_container() {
    let volume = r#"extraVolumes=[{"name":"rrsa-token","projected":{"sources":[{"serviceAccountToken":{"audience":"sts.aliyuncs.com","expirationSeconds":3600,"path":"token"}}]}}]"#;
    let mount = r#"extraVolumeMounts=[{"name":"rrsa-token","mountPath":"/var/run/secrets/rrsa","readOnly":true}]"#;
    let docs = parse_docs(&template(&["--set-json", volume, "--set-json", mount]).unwrap());
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    let volumes = pod["volumes"].as_array().unwrap();
    let token = volumes.iter().find(|v| v["name"] == "rrsa-token").unwrap();
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "sts.aliyuncs.com"
    );
    assert!(
        volumes.iter().any(|v| v["name"] == "tls"),
        "the chart's own volumes stay"
    );
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["name"] == "rrsa-token" && m["mountPath"] == "/var/run/secrets/rrsa")
    );
    let error = template(&["--set-json", r#"extraVolumeMounts=[{"name":"x"}]"#]).unwrap_err();
    assert!(error.contains("mountPath"), "{error}");
}

#[test]
fn replicas_spread_across_nodes_and_zones() {
    let docs = rbac::render_chart("ngo-system", &[]).unwrap();
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"];
    let selector = json!({"app.kubernetes.io/name": "nodegroup-operator", "app.kubernetes.io/instance": "ngo"});
    let preferred = &pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(
        preferred["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        preferred["podAffinityTerm"]["labelSelector"]["matchLabels"],
        selector
    );
    let spread = &pod["spec"]["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(spread["labelSelector"]["matchLabels"], selector);
    for (label, value) in selector.as_object().unwrap() {
        assert_eq!(&pod["metadata"]["labels"][label], value);
    }

    let docs = rbac::render_chart("ngo-system", &["--set", "podAntiAffinity=hard"]).unwrap();
    let pod = &docs.iter().find(|d| d["kind"] == "Deployment").unwrap()["spec"]["template"];
    assert_eq!(
        pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["labelSelector"]["matchLabels"],
        selector
    );
}

#[test]
fn the_network_policy_admits_only_cluster_autoscaler_and_the_test_pod_to_grpc() {
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "networkPolicy.enabled=true",
            "--set-json",
            r#"networkPolicy.autoscalerNamespaceLabels={"kubernetes.io/metadata.name":"kube-system"}"#,
        ],
    )
    .unwrap();
    let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let grpc = &policy["spec"]["ingress"][0];
    assert_eq!(grpc["ports"], json!([{"port": "grpc", "protocol": "TCP"}]));
    assert_eq!(
        grpc["from"],
        json!([
            {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "externalgrpc-cluster-autoscaler"}},
             "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}},
            {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "ngo", "app.kubernetes.io/component": "helm-test"}}}
        ])
    );
    // No metricsFrom: the admin port admits no pod (kubelet's probes come from the node).
    assert_eq!(policy["spec"]["ingress"].as_array().unwrap().len(), 1);
    // The test pod carries the labels the policy admits, and not the operator's selector (the
    // Service must not route gRPC to it).
    let test_pod = docs.iter().find(|d| d["kind"] == "Pod").unwrap();
    assert_eq!(
        test_pod["metadata"]["labels"]["app.kubernetes.io/component"],
        "helm-test"
    );
    assert_ne!(
        test_pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "nodegroup-operator"
    );
}

/// `/metrics` names every tenant's Cluster: by default the chart's NetworkPolicy admits the
/// admin port from no pod (kubelet's probes come from the pod's own node, always admitted) and
/// gRPC from anywhere; `metricsFrom` opens the admin port to the peers it names, and
/// `restrictMetrics=false` to anyone (then without `enabled` no policy is rendered).
#[test]
fn the_admin_port_is_closed_to_every_pod_by_default_and_grpc_stays_open() {
    let policy_of = |args: &[&str]| {
        rbac::render_chart("ngo-system", args)
            .unwrap()
            .into_iter()
            .find(|d| d["kind"] == "NetworkPolicy")
    };
    let policy = policy_of(&[]).expect("a NetworkPolicy by default");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{"ports": [{"port": "grpc", "protocol": "TCP"}]}]),
        "gRPC from anywhere, the admin port from no pod"
    );

    let monitoring = json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let policy = policy_of(&[
        "--set-json",
        &format!("networkPolicy.metricsFrom={monitoring}"),
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ])
    .expect("a NetworkPolicy");
    assert_eq!(
        policy["spec"]["ingress"][1],
        json!({"ports": [{"port": "admin", "protocol": "TCP"}], "from": monitoring})
    );

    assert!(
        policy_of(&["--set", "networkPolicy.restrictMetrics=false"]).is_none(),
        "nothing to restrict"
    );
    let policy = policy_of(&[
        "--set",
        "networkPolicy.restrictMetrics=false",
        "--set",
        "networkPolicy.enabled=true",
    ])
    .expect("a NetworkPolicy");
    assert_eq!(
        policy["spec"]["ingress"][1],
        json!({"ports": [{"port": "admin", "protocol": "TCP"}]}),
        "the admin port from anywhere"
    );
}

/// `service.external`: a second Service, of the type asked, with the gRPC port alone (the admin
/// port and /metrics stay in the cluster); none by default.
#[test]
fn the_external_grpc_service_carries_grpc_alone() {
    let services = |args: &[&str]| -> Vec<serde_json::Value> {
        rbac::render_chart("ngo-system", args)
            .unwrap()
            .into_iter()
            .filter(|d| d["kind"] == "Service")
            .collect()
    };
    assert_eq!(
        services(&[]).len(),
        1,
        "only the ClusterIP Service by default"
    );
    let rendered = services(&[
        "--set",
        "service.external.enabled=true",
        "--set-json",
        r#"service.external.loadBalancerSourceRanges=["10.20.0.0/16"]"#,
        "--set",
        "service.external.loadBalancerClass=internal",
    ]);
    let external = rendered
        .iter()
        .find(|s| s["metadata"]["name"] == "nodegroup-operator-grpc")
        .expect("the external Service");
    assert_eq!(external["spec"]["type"], "LoadBalancer");
    assert_eq!(
        external["spec"]["ports"],
        json!([{"name": "grpc", "port": 8086, "targetPort": "grpc", "protocol": "TCP"}])
    );
    assert_eq!(
        external["spec"]["loadBalancerSourceRanges"],
        json!(["10.20.0.0/16"])
    );
    assert_eq!(external["spec"]["loadBalancerClass"], "internal");
    let node_port = services(&[
        "--set",
        "service.external.enabled=true",
        "--set",
        "service.external.type=NodePort",
        "--set",
        "service.external.nodePort=30086",
    ]);
    let external = node_port
        .iter()
        .find(|s| s["metadata"]["name"] == "nodegroup-operator-grpc")
        .unwrap();
    assert_eq!(external["spec"]["type"], "NodePort");
    assert_eq!(external["spec"]["ports"][0]["nodePort"], 30086);
    assert!(external["spec"].get("loadBalancerSourceRanges").is_none());
    let error = template(&[
        "--set",
        "service.external.enabled=true",
        "--set",
        "service.external.type=ClusterIP",
    ])
    .expect_err("ClusterIP is the other Service's");
    assert!(error.contains("/service/external/type"), "{error}");
}

// ---------------------------------------------------------------------------------------------
// Releases side by side: names, labels and selectors.

/// `helm template` of the chart as release `release` in `namespace` with `args`, as JSON
/// documents (CRDs left out: every release shares them, Helm creates them once).
fn render_release(release: &str, namespace: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let chart = chart_dir();
    let mut all = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "-n",
        namespace,
    ];
    all.extend_from_slice(args);
    let (ok, out, err) = helm(&all);
    assert!(ok, "helm template {release} {args:?}: {err}");
    parse_docs(&out)
}

/// Each object as (kind, namespace, name); the namespace is empty for cluster-scoped kinds.
fn object_keys(docs: &[serde_json::Value]) -> Vec<(String, String, String)> {
    docs.iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().to_string(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                d["metadata"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn the<'a>(docs: &'a [serde_json::Value], kind: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// `helm uninstall` first runs `release-finalizers` as the operator's ServiceAccount; that
/// account and its RBAC are release resources, not hooks, so they still exist while pre-delete
/// hooks run. A failed Job stays for its log; `uninstall.releaseFinalizers=false` opts out.
#[test]
fn uninstall_runs_release_finalizers_as_the_operator_before_anything_is_deleted() {
    let docs = render_release("ngo", "ngo-system", &["--set", "rbac.namespaces={tenants}"]);
    let job = docs
        .iter()
        .find(|d| d["kind"] == "Job")
        .expect("the pre-delete Job");
    let annotations = &job["metadata"]["annotations"];
    assert_eq!(annotations["helm.sh/hook"], "pre-delete");
    let policy = annotations["helm.sh/hook-delete-policy"].as_str().unwrap();
    assert!(policy.contains("before-hook-creation"), "{policy}");
    assert!(
        !policy.contains("hook-failed"),
        "a failed Job stays for its log: {policy}"
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"],
        the(&docs, "ServiceAccount")["metadata"]["name"]
    );
    for d in &docs {
        if [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ]
        .contains(&d["kind"].as_str().unwrap_or_default())
        {
            assert!(
                d["metadata"]["annotations"]["helm.sh/hook"].is_null(),
                "{} {} must outlive the pre-delete hook",
                d["kind"],
                d["metadata"]["name"]
            );
        }
    }
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "release-finalizers",
            "--capi-group=cluster.x-k8s.io",
            "--sweep-clock-margin-secs=30",
            "--namespace=tenants"
        ]
    );
    let selector = &the(&docs, "Deployment")["spec"]["selector"]["matchLabels"];
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    assert!(
        selector
            .as_object()
            .unwrap()
            .iter()
            .any(|(k, v)| &labels[k] != v),
        "the Service must not send gRPC to the hook's pod: {labels}"
    );
    let opted_out = render_release(
        "ngo",
        "ngo-system",
        &["--set", "uninstall.releaseFinalizers=false"],
    );
    assert!(!opted_out.iter().any(|d| d["kind"] == "Job"));
}

#[test]
fn a_second_release_gets_names_of_its_own_and_the_first_keeps_its_names() {
    // The first release, as installed before the overrides existed: every name is the chart's.
    let first = render_release("ngo", "ngo-system", &[]);
    let first_keys = object_keys(&first);
    for (kind, name) in [
        ("Deployment", "nodegroup-operator"),
        ("Service", "nodegroup-operator"),
        ("ServiceAccount", "nodegroup-operator"),
        ("ClusterRole", "nodegroup-operator"),
        ("ClusterRoleBinding", "nodegroup-operator"),
        ("PodDisruptionBudget", "nodegroup-operator"),
        ("Secret", "nodegroup-operator-autoscaler-cloud-config"),
    ] {
        assert!(
            first_keys.iter().any(|(k, _, n)| k == kind && n == name),
            "{kind} {name} in {first_keys:?}"
        );
    }
    assert!(
        !first_keys.iter().any(|(_, ns, _)| ns == "kube-system"),
        "no access to kube-system's Secrets unless asked for: {first_keys:?}"
    );
    let with_tokens = object_keys(&render_release(
        "ngo",
        "ngo-system",
        &["--set", "nodePools.bootstrapTokens=true"],
    ));
    assert!(
        with_tokens.contains(&(
            "Role".into(),
            "kube-system".into(),
            "nodegroup-operator-bootstrap-tokens".into()
        )),
        "{with_tokens:?}"
    );

    // (release, namespace, values, base of the names, app.kubernetes.io/name)
    let second: &[(&str, &str, &[&str], &str, &str)] = &[
        (
            "ngo-b",
            "team-b",
            &["--set", "fullnameOverride=ngo-b"],
            "ngo-b",
            "nodegroup-operator",
        ),
        // In the first release's namespace: namespaced names must differ too.
        (
            "ngo-c",
            "ngo-system",
            &["--set", "nameOverride=operator"],
            "ngo-c-operator",
            "operator",
        ),
        // The usual rule: a release name that contains nameOverride is the base.
        (
            "ngo-operator",
            "ngo-system",
            &["--set", "nameOverride=operator"],
            "ngo-operator",
            "operator",
        ),
    ];
    for (release, namespace, values, base, app) in second {
        let values = [*values, &["--set", "nodePools.bootstrapTokens=true"]].concat();
        let docs = render_release(release, namespace, &values);
        let keys = object_keys(&docs);
        let cluster_scoped: BTreeSet<&str> = keys
            .iter()
            .filter(|(_, ns, _)| ns.is_empty())
            .map(|(kind, _, _)| kind.as_str())
            .collect();
        assert_eq!(
            cluster_scoped,
            BTreeSet::from([
                "ClusterRole",
                "ClusterRoleBinding",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding"
            ]),
            "the ClusterRole and the release guard, each with its binding: {keys:?}"
        );
        let outside: Vec<_> = keys.iter().filter(|(_, ns, _)| ns != namespace).collect();
        assert!(
            outside.len() >= 4,
            "cluster-scoped objects and the kube-system Role and binding: {outside:?}"
        );
        let collisions: Vec<_> = keys
            .iter()
            .filter(|k| first_keys.contains(k) || with_tokens.contains(k))
            .collect();
        assert!(
            collisions.is_empty(),
            "{release}: objects the first release owns: {collisions:?}"
        );
        for (kind, _, name) in &keys {
            assert!(
                name.starts_with(base),
                "{release}: {kind} {name} is not named after {base}"
            );
        }
        for doc in &docs {
            assert_eq!(
                doc["metadata"]["labels"]["app.kubernetes.io/instance"], *release,
                "{}",
                doc["metadata"]["name"]
            );
        }

        // The Service selects this release's pods only; the binding grants this release's
        // ServiceAccount this release's ClusterRole.
        let deployment = the(&docs, "Deployment");
        let selector =
            json!({"app.kubernetes.io/name": app, "app.kubernetes.io/instance": release});
        assert_eq!(deployment["spec"]["selector"]["matchLabels"], selector);
        assert_eq!(the(&docs, "Service")["spec"]["selector"], selector);
        assert_eq!(
            the(&docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
            selector
        );
        let pod = &deployment["spec"]["template"];
        for (label, value) in selector.as_object().unwrap() {
            assert_eq!(&pod["metadata"]["labels"][label], value);
        }
        assert_eq!(pod["spec"]["serviceAccountName"], *base);
        let binding = the(&docs, "ClusterRoleBinding");
        assert_eq!(binding["roleRef"]["name"], *base);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": base, "namespace": namespace}])
        );
        // Its own Lease, and cluster-autoscaler's cloud-config names its own Service.
        let args = pod["spec"]["containers"][0]["args"].to_string();
        assert!(
            args.contains(&format!("\"--leader-election-lease={base}\"")),
            "{args}"
        );
        let cloud_config = docs
            .iter()
            .find(|d| d["kind"] == "Secret")
            .unwrap_or_else(|| panic!("{release}: cloud-config Secret"));
        assert_eq!(
            cloud_config["metadata"]["name"],
            format!("{base}-autoscaler-cloud-config")
        );
        assert!(
            cloud_config["stringData"]["cloud-config"]
                .as_str()
                .unwrap()
                .contains(&format!("address: \"{base}.{namespace}.svc:8086\"")),
            "{}",
            cloud_config["stringData"]["cloud-config"]
        );
        let test_pod = the(&docs, "Pod");
        assert_eq!(
            test_pod["spec"]["volumes"][1]["secret"]["secretName"],
            format!("{base}-client-cluster-autoscaler")
        );
    }

    // With cert-manager, the issued Secrets and the serving certificate's names follow too.
    let docs = render_release(
        "ngo-b",
        "ngo-system",
        &[
            "--set",
            "fullnameOverride=ngo-b",
            "--set",
            "grpc.certManager.enabled=true",
            "--set",
            "grpc.tlsSecretName=ngo-b-grpc-tls",
        ],
    );
    let first = render_release(
        "ngo",
        "ngo-system",
        &["--set", "grpc.certManager.enabled=true"],
    );
    let first_keys = object_keys(&first);
    let keys = object_keys(&docs);
    assert!(
        keys.iter().all(|k| !first_keys.contains(k)),
        "{keys:?} vs {first_keys:?}"
    );
    let server = docs
        .iter()
        .find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == "ngo-b-grpc-server")
        .unwrap();
    assert!(
        server["spec"]["dnsNames"]
            .as_array()
            .unwrap()
            .contains(&json!("ngo-b.ngo-system.svc"))
    );

    for (value, expected) in [
        (
            "fullnameOverride=Bad_Name",
            "at '/fullnameOverride': 'Bad_Name' does not match pattern",
        ),
        (
            "nameOverride=-x",
            "at '/nameOverride': '-x' does not match pattern",
        ),
    ] {
        let error = template(&["--set", value]).unwrap_err();
        assert!(error.contains(expected), "{value}: {error}");
    }
}

// ---------------------------------------------------------------------------------------------
// The pod and the image: values over the restricted defaults.

#[test]
fn an_image_digest_pins_the_operator_and_the_test_pod() {
    let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set",
            &format!("image.digest={digest}"),
            "--set",
            "image.tag=ignored",
        ],
    );
    let expected = format!("ghcr.io/nodegroup-dev/nodegroup-operator@{digest}");
    assert_eq!(
        the(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"],
        expected.as_str()
    );
    assert_eq!(
        the(&docs, "Pod")["spec"]["containers"][0]["image"],
        expected.as_str()
    );
    // Without a digest: repository:tag, the tag defaulting to the appVersion.
    let docs = render_release("ngo", "ngo-system", &[]);
    assert_eq!(
        the(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/nodegroup-dev/nodegroup-operator:0.1.0"
    );
    for bad in [
        "sha256:abc",
        "latest",
        "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef",
    ] {
        let error = template(&["--set", &format!("image.digest={bad}")]).unwrap_err();
        assert!(
            error.contains("at '/image/digest'"),
            "{bad} must be refused: {error}"
        );
    }
}

#[test]
fn security_contexts_merge_over_the_restricted_profile() {
    let restricted_pod =
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    let restricted = json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]}
    });
    let contexts = |docs: &[serde_json::Value]| {
        let pod = &the(docs, "Deployment")["spec"]["template"]["spec"];
        let test_pod = &the(docs, "Pod")["spec"];
        (
            pod["securityContext"].clone(),
            pod["containers"][0]["securityContext"].clone(),
            test_pod["securityContext"].clone(),
            test_pod["containers"][0]["securityContext"].clone(),
        )
    };
    let (pod, container, test_pod, test_container) =
        contexts(&render_release("ngo", "ngo-system", &[]));
    assert_eq!(pod, restricted_pod);
    assert_eq!(test_pod, restricted_pod);
    assert_eq!(container, restricted);
    assert_eq!(test_container, restricted);

    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set-json",
            r#"podSecurityContext={"runAsUser":1001,"fsGroup":1001,"seccompProfile":{"type":"Localhost","localhostProfile":"ngo.json"}}"#,
            "--set-json",
            r#"securityContext={"capabilities":{"add":["NET_BIND_SERVICE"]},"runAsGroup":1001}"#,
        ],
    );
    let (pod, container, test_pod, test_container) = contexts(&docs);
    let expected_pod = json!({
        "runAsNonRoot": true,
        "runAsUser": 1001,
        "fsGroup": 1001,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "ngo.json"}
    });
    let expected = json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "runAsGroup": 1001,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}
    });
    assert_eq!(pod, expected_pod);
    assert_eq!(test_pod, expected_pod);
    assert_eq!(container, expected);
    assert_eq!(test_container, expected);
}

#[test]
fn probe_timings_and_the_disruption_budget_are_values() {
    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set-json",
            r#"livenessProbe={"initialDelaySeconds":5,"periodSeconds":20,"timeoutSeconds":3,"failureThreshold":6}"#,
            "--set-json",
            r#"readinessProbe={"periodSeconds":5,"successThreshold":2}"#,
        ],
    );
    let container = &the(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["livenessProbe"],
        json!({"httpGet": {"path": "/livez", "port": "admin"}, "initialDelaySeconds": 5,
               "periodSeconds": 20, "timeoutSeconds": 3, "failureThreshold": 6})
    );
    assert_eq!(
        container["readinessProbe"],
        json!({"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 5,
               "successThreshold": 2})
    );
    // The check itself stays the chart's; a liveness probe takes no successThreshold.
    for (value, expected) in [
        (
            r#"livenessProbe={"httpGet":{"path":"/","port":80}}"#,
            "additional properties 'httpGet' not allowed",
        ),
        (
            r#"livenessProbe={"successThreshold":2}"#,
            "additional properties 'successThreshold' not allowed",
        ),
        (
            r#"readinessProbe={"periodSeconds":0}"#,
            "at '/readinessProbe/periodSeconds': minimum",
        ),
    ] {
        let error = template(&["--set-json", value]).unwrap_err();
        assert!(error.contains(expected), "{value}: {error}");
    }

    let budget = |args: &[&str]| {
        render_release("ngo", "ngo-system", args)
            .into_iter()
            .find(|d| d["kind"] == "PodDisruptionBudget")
            .map(|d| d["spec"].clone())
    };
    let selector = json!({"matchLabels": {"app.kubernetes.io/name": "nodegroup-operator", "app.kubernetes.io/instance": "ngo"}});
    assert_eq!(
        budget(&[]),
        Some(json!({"minAvailable": 1, "selector": selector}))
    );
    assert_eq!(
        budget(&[
            "--set",
            "podDisruptionBudget.minAvailable=2",
            "--set",
            "replicas=3"
        ]),
        Some(json!({"minAvailable": 2, "selector": selector}))
    );
    assert_eq!(
        budget(&["--set", "podDisruptionBudget.maxUnavailable=50%"]),
        Some(json!({"maxUnavailable": "50%", "selector": selector}))
    );
    assert_eq!(
        budget(&["--set", "podDisruptionBudget.enabled=false"]),
        None
    );
    assert_eq!(
        budget(&["--set", "replicas=1"]),
        None,
        "one replica: a budget would block every drain"
    );
    let error = template(&[
        "--set",
        "podDisruptionBudget.minAvailable=1",
        "--set",
        "podDisruptionBudget.maxUnavailable=1",
    ])
    .unwrap_err();
    assert!(
        error.contains("podDisruptionBudget: set minAvailable or maxUnavailable, not both"),
        "{error}"
    );
    let error = template(&["--set", "podDisruptionBudget.minAvailable=half"]).unwrap_err();
    assert!(
        error.contains("at '/podDisruptionBudget/minAvailable': 'half' does not match pattern"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------
// Metrics: alerts and the dashboard name only what the operator exports.

/// The operator's exposition with a sample in every family (the encoder leaves out families
/// without samples): one served group with a warning, one workload cluster, one RPC, one index
/// update, one sweep.
pub(crate) fn operator_exposition() -> support::promql::Exposition {
    use ngo_index::capi::ScalableKind;
    use ngo_index::index::{
        ClusterKey, ConfigWarning, IndexInputs, NodeGroup, Source, WorkloadState, build_snapshot,
    };
    let metrics = nodegroup_operator::runtime::metrics();
    let service = &metrics.service;
    service.observe_rpc("NodeGroups", Code::Ok, Duration::from_millis(1));
    metrics
        .runtime
        .observe_index_update(false, Some(Duration::from_millis(1)));
    metrics.runtime.set_leader(true);
    metrics
        .pools
        .observe_backend_call("cherryServers", "create", "ok");
    metrics.pools.set_backend_available("ns/pool", true);
    service.set_certificate_expiry("serving", 1_900_000_000);
    service.set_client_certificate_expiry("nodegroup.dev/cluster/ns/c", 1_900_000_000);
    service.count_handshake_failure("rejected");
    service.observe_sweep(&ngo_service::metrics::SweepCounts {
        unacted: vec![("MachineDeployment/ns/md".into(), 1)],
        ..Default::default()
    });
    let mut snapshot = build_snapshot(&IndexInputs::default());
    snapshot.workload.insert(
        ClusterKey {
            namespace: "ns".into(),
            name: "c".into(),
        },
        WorkloadState::Synced,
    );
    let group = NodeGroup {
        id: "MachineDeployment/ns/md".into(),
        kind: ScalableKind::MachineDeployment,
        namespace: "ns".into(),
        name: "md".into(),
        cluster: ClusterKey::default(),
        uid: String::new(),
        min: 1,
        max: 5,
        min_source: Source::Annotation,
        max_source: Source::Annotation,
        target: 2,
        instances: Vec::new(),
        registered: 0,
        ready: 0,
        options: Default::default(),
        template: None,
        provider_id_list: None,
        policy: None,
        pricing: None,
        node_capacity: Default::default(),
        warnings: vec![ConfigWarning {
            field: "labels".into(),
            message: "m".into(),
        }],
        scale_down_claim: None,
        rolling_out: None,
        applied_decrements: Vec::new(),
    };
    snapshot
        .groups
        .insert(group.id.clone(), std::sync::Arc::new(group));
    service.observe_snapshot(&snapshot, Duration::from_millis(1));
    support::promql::Exposition::parse(&metrics.exposition.encode())
}

#[test]
fn alerts_name_only_metrics_the_operator_exports() {
    let exposition = operator_exposition();
    // The rule needs a source of series: the ServiceMonitor (see
    // alerts_select_the_releases_series_and_link_their_runbooks).
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set-json",
            METRICS_FROM_ANY_NAMESPACE,
        ],
    )
    .unwrap();
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            let expr = rule["expr"].as_str().unwrap();
            let problems = exposition.problems(expr);
            assert!(problems.is_empty(), "{name}: {expr}: {problems:?}");
            assert!(
                expr.contains(r#"job="nodegroup-operator",namespace="ngo-system""#),
                "{name} selects the release's series: {expr}"
            );
            alerts.push(name.to_string());
        }
    }
    for expected in [
        "NodegroupOperatorNoLeader",
        "NodegroupOperatorRpcErrors",
        "NodegroupOperatorStrandedScaleDownMarks",
        "NodegroupOperatorScaleDownNotActedOn",
        "NodegroupOperatorWorkloadClusterUnreachable",
        "NodegroupOperatorBackendUnavailable",
        "NodegroupOperatorCertificateExpiringSoon",
    ] {
        assert!(
            alerts.iter().any(|a| a == expected),
            "{expected} in {alerts:?}"
        );
    }
    // A typo is caught.
    assert!(!exposition.problems("max(nodegroup_leaders)").is_empty());
    assert!(
        !exposition
            .problems(
                r#"sum by (methods) (rate(nodegroup_grpc_request_duration_seconds_count[5m]))"#
            )
            .is_empty()
    );
}

#[test]
fn the_dashboard_queries_name_only_metrics_the_operator_exports() {
    let exposition = operator_exposition();
    let docs =
        rbac::render_chart("ngo-system", &["--set", "metrics.dashboard.enabled=true"]).unwrap();
    let config_map = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap" && d["metadata"]["name"] == "nodegroup-operator-dashboard"
        })
        .unwrap();
    assert_eq!(
        config_map["metadata"]["labels"]["grafana_dashboard"], "1",
        "the label Grafana's dashboards sidecar watches"
    );
    let dashboard: serde_json::Value = serde_json::from_str(
        config_map["data"]["nodegroup-operator.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let queries = support::promql::dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");
    for (place, query) in &queries {
        let problems = exposition.problems(query);
        assert!(problems.is_empty(), "{place}: {query}: {problems:?}");
    }
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for expected in [
        "Target, registered and ready nodes per group",
        "Scale-ups and scale-downs",
        "Latency p99 by method",
        "Error ratio by method",
        "Mutating RPC outcomes",
        "Index size",
        "Index update time",
        "Backend available per NodePool",
    ] {
        assert!(titles.contains(&expected), "{expected} in {titles:?}");
    }
}

/// The `###` headings of the `## <section>` of a Markdown page, outside code blocks.
fn subsections(text: &str, section: &str) -> Vec<String> {
    let mut fenced = false;
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with("## ") {
            inside = line[3..].trim() == section;
        } else if !fenced && inside && line.starts_with("### ") {
            out.push(line[4..].trim().to_string());
        }
    }
    out
}

/// The aggregations (`sum`, `max`, `min`, `avg`, `count`) of PromQL `expr` whose result loses
/// one of `labels`: without a `by` clause, or with one that does not name it.
fn aggregations_dropping(expr: &str, labels: &[&str]) -> Vec<String> {
    let mut dropped = Vec::new();
    for op in ["sum", "max", "min", "avg", "count"] {
        for (at, _) in expr.match_indices(op) {
            let before = expr[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = expr[at + op.len()..].trim_start();
            let grouping = if rest.starts_with('(') {
                ""
            } else if let Some(list) = rest.strip_prefix("by") {
                list.trim_start()
                    .strip_prefix('(')
                    .and_then(|l| l.split_once(')'))
                    .map_or("", |(l, _)| l)
            } else {
                continue;
            };
            let kept: Vec<&str> = grouping.split(',').map(str::trim).collect();
            if labels.iter().any(|l| !kept.contains(l)) {
                dropped.push(format!("{op} by ({grouping})"));
            }
        }
    }
    dropped
}

#[test]
fn an_aggregation_is_judged_by_the_labels_it_keeps() {
    let release = ["namespace", "job"];
    assert_eq!(aggregations_dropping("max(x) > 0", &release), ["max by ()"]);
    assert_eq!(
        aggregations_dropping("sum by (method) (rate(x[5m]))", &release),
        ["sum by (method)"]
    );
    assert!(aggregations_dropping("min by (namespace, job, cluster) (x)", &release).is_empty());
    assert!(aggregations_dropping("nodegroup_summary_total > 0", &release).is_empty());
}

/// Every alert of a rendering's PrometheusRule.
fn alert_rules(docs: &[serde_json::Value]) -> Vec<serde_json::Value> {
    the(docs, "PrometheusRule")["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

#[test]
fn alerts_select_the_releases_series_and_link_their_runbooks() {
    let exposition = operator_exposition();
    let monitoring = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set-json",
        METRICS_FROM_ANY_NAMESPACE,
        "--set",
        "metrics.prometheusRule.enabled=true",
    ];

    // Another release's alerts select its own series: the job prometheus-operator gives the
    // targets of the Service its ServiceMonitor selects.
    let mut args = vec!["--set", "fullnameOverride=ngo-b"];
    args.extend_from_slice(&monitoring);
    let docs = render_release("ngo-b", "team-b", &args);
    let monitor = the(&docs, "ServiceMonitor");
    let service = the(&docs, "Service");
    assert_eq!(service["metadata"]["name"], "ngo-b");
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][label], value);
    }
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"],
        json!(["team-b"])
    );
    let rules = alert_rules(&docs);
    assert!(rules.len() >= 7, "{rules:?}");
    for rule in &rules {
        let expr = rule["expr"].as_str().unwrap();
        assert!(
            expr.contains(r#"job="ngo-b",namespace="team-b""#),
            "{}: {expr}",
            rule["alert"]
        );
        assert!(!expr.contains("nodegroup-operator"), "{expr}");
        assert!(exposition.problems(expr).is_empty(), "{expr}");
        let dropped = aggregations_dropping(expr, &["namespace", "job"]);
        assert!(
            dropped.is_empty(),
            "{}: aggregations that drop the release's labels, so two releases' alerts look \
             alike: {dropped:?}",
            rule["alert"]
        );
    }
    let no_leader = rules
        .iter()
        .find(|r| r["alert"] == "NodegroupOperatorNoLeader")
        .unwrap();
    assert!(
        no_leader["annotations"]["description"]
            .as_str()
            .unwrap()
            .contains("team-b/ngo-b"),
        "names the release's Lease: {}",
        no_leader["annotations"]["description"]
    );

    // Every alert links its runbook: a section of docs/operations.md under "Alert runbooks",
    // and that section has a runbook for every alert and nothing else.
    let operations = std::fs::read_to_string(repo_file("docs/operations.md")).unwrap();
    let runbooks = subsections(&operations, "Alert runbooks");
    let base = "https://github.com/nodegroup-dev/nodegroup-operator/blob/main/docs/operations.md";
    let mut alerts: Vec<String> = Vec::new();
    for rule in &rules {
        let alert = rule["alert"].as_str().unwrap();
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        assert_eq!(
            url,
            format!("{base}#{}", ngo_testbed::markdown::github_anchor(alert)),
            "{alert}"
        );
        let anchor = url.split_once('#').unwrap().1;
        assert!(
            runbooks
                .iter()
                .any(|h| ngo_testbed::markdown::github_anchor(h) == anchor),
            "{alert}: no heading with anchor #{anchor} under 'Alert runbooks' in docs/operations.md: {runbooks:?}"
        );
        alerts.push(alert.to_string());
    }
    let mut sections = runbooks.clone();
    sections.sort();
    alerts.sort();
    assert_eq!(sections, alerts, "one runbook per alert");
    // The page can be another copy.
    let mut args = vec![
        "--set",
        "metrics.prometheusRule.runbookUrl=https://wiki.example.com/ngo/runbooks",
    ];
    args.extend_from_slice(&monitoring);
    for rule in alert_rules(&render_release("ngo", "ngo-system", &args)) {
        assert!(
            rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap()
                .starts_with("https://wiki.example.com/ngo/runbooks#nodegroupoperator"),
            "{rule}"
        );
    }

    // Without the ServiceMonitor nothing scrapes that job: the rule is refused unless the
    // series are named explicitly, and then the alerts use that selector.
    let error = template(&["--set", "metrics.prometheusRule.enabled=true"]).unwrap_err();
    assert!(
        error.contains("metrics.prometheusRule.enabled without metrics.serviceMonitor.enabled")
            && error.contains("set metrics.prometheusRule.selector"),
        "{error}"
    );
    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set-json",
            r#"metrics.prometheusRule.selector="job=\"kubernetes-pods\",namespace=\"ops\"""#,
        ],
    );
    assert!(!docs.iter().any(|d| d["kind"] == "ServiceMonitor"));
    for rule in alert_rules(&docs) {
        let expr = rule["expr"].as_str().unwrap();
        assert!(
            expr.contains(r#"{job="kubernetes-pods",namespace="ops""#),
            "{expr}"
        );
        assert!(!expr.contains("nodegroup-operator"), "{expr}");
        assert!(exposition.problems(expr).is_empty(), "{expr}");
        let dropped = aggregations_dropping(expr, &["namespace", "job"]);
        assert!(
            dropped.is_empty(),
            "{}: aggregations that drop the release's labels, so two releases' alerts look \
             alike: {dropped:?}",
            rule["alert"]
        );
    }
    let error = template(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.prometheusRule.selector=job=ngo",
    ])
    .unwrap_err();
    assert!(
        error.contains("at '/metrics/prometheusRule/selector'"),
        "{error}"
    );
}

#[test]
fn the_service_monitor_takes_relabelings_and_prometheus_durations() {
    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set-json",
            METRICS_FROM_ANY_NAMESPACE,
            "--set",
            "metrics.serviceMonitor.interval=1d",
            "--set",
            "metrics.serviceMonitor.scrapeTimeout=1m30s",
            "--set-json",
            r#"metrics.serviceMonitor.relabelings=[{"action":"replace","targetLabel":"cluster","replacement":"prod"}]"#,
            "--set-json",
            r#"metrics.serviceMonitor.metricRelabelings=[{"action":"drop","sourceLabels":["__name__"],"regex":"nodegroup_index_.*"}]"#,
        ],
    );
    let endpoint = &the(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert_eq!(endpoint["interval"], "1d");
    assert_eq!(endpoint["scrapeTimeout"], "1m30s");
    assert_eq!(
        endpoint["relabelings"],
        json!([{"action": "replace", "targetLabel": "cluster", "replacement": "prod"}])
    );
    assert_eq!(
        endpoint["metricRelabelings"],
        json!([{"action": "drop", "sourceLabels": ["__name__"], "regex": "nodegroup_index_.*"}])
    );
    // Without them, the endpoint has neither key.
    let docs = render_release(
        "ngo",
        "ngo-system",
        &[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set-json",
            METRICS_FROM_ANY_NAMESPACE,
        ],
    );
    let endpoint = &the(&docs, "ServiceMonitor")["spec"]["endpoints"][0];
    assert!(endpoint.get("relabelings").is_none() && endpoint.get("metricRelabelings").is_none());

    // Prometheus' duration syntax (prometheus-operator's CRD pattern): units y w d h m s ms, in
    // that order, whole numbers. Go-only forms are refused.
    for good in ["30s", "1d", "2w", "1h30m", "500ms", "1y2w3d4h5m6s7ms"] {
        for field in ["interval", "scrapeTimeout"] {
            template(&[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set-json",
                METRICS_FROM_ANY_NAMESPACE,
                "--set",
                &format!("metrics.serviceMonitor.{field}={good}"),
            ])
            .unwrap_or_else(|e| panic!("{field}={good} must be accepted: {e}"));
        }
    }
    for bad in ["1.5h", "10", "5us", "1m1h", "-1s", "1h0.5m"] {
        for field in ["interval", "scrapeTimeout"] {
            let error = template(&[
                "--set-string",
                &format!("metrics.serviceMonitor.{field}={bad}"),
            ])
            .expect_err(&format!("{field}={bad} must be refused"));
            assert!(
                error.contains(&format!(
                    "at '/metrics/serviceMonitor/{field}': '{bad}' does not match pattern"
                )),
                "{field}={bad}: {error}"
            );
        }
    }
    let error = template(&["--set", "metrics.serviceMonitor.interval="]).unwrap_err();
    assert!(
        error.contains("at '/metrics/serviceMonitor/interval': minLength"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------
// cluster-autoscaler's side: the upstream chart with the README's values.

fn parse_docs(text: &str) -> Vec<serde_json::Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect()
}

#[test]
fn the_readme_shows_the_cluster_autoscaler_values_the_tests_use() {
    let values =
        std::fs::read_to_string(repo_file("examples/cluster-autoscaler-values.yaml")).unwrap();
    let readme = std::fs::read_to_string(repo_file("README.md")).unwrap();
    assert!(
        readme.contains(&format!("```yaml\n{values}```")),
        "README.md must show examples/cluster-autoscaler-values.yaml verbatim in a yaml block"
    );
}

/// The upstream cluster-autoscaler chart rendered into kube-system with the values file
/// `values` (a path in the repository).
fn upstream_ca_chart_with(values: &str) -> Vec<serde_json::Value> {
    let values = repo_file(values);
    let (ok, out, err) = helm(&[
        "template",
        "cluster-autoscaler",
        upstream_ca_chart().to_str().unwrap(),
        "-n",
        "kube-system",
        "-f",
        values.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    parse_docs(&out)
}

/// The co-located values: the upstream chart renders the operator as a native sidecar of
/// cluster-autoscaler's pod, both containers mount the socket's directory, and the
/// cloud-config CA reads names that socket (the operator's `--grpc-unix-socket`).
#[test]
fn the_upstream_chart_with_the_co_located_values_puts_the_operator_beside_cluster_autoscaler() {
    let docs = upstream_ca_chart_with("examples/cluster-autoscaler-colocated-values.yaml");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let sidecar = &spec["initContainers"][0];
    assert_eq!(sidecar["restartPolicy"], "Always", "a native sidecar");
    let args: Vec<&str> = sidecar["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let socket = args
        .iter()
        .find_map(|a| a.strip_prefix("--grpc-unix-socket="))
        .expect("the operator serves a socket");
    assert!(args.iter().any(|a| a.starts_with("--cluster=")), "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--grpc-address")),
        "no TCP listener beside the socket: {args:?}"
    );
    let directory = std::path::Path::new(socket)
        .parent()
        .and_then(|d| d.to_str())
        .expect("socket directory");
    let mounts_socket = |container: &serde_json::Value| {
        container["volumeMounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["mountPath"] == directory))
    };
    assert!(mounts_socket(sidecar), "the operator mounts {directory}");
    assert!(
        mounts_socket(&spec["containers"][0]),
        "cluster-autoscaler mounts {directory}"
    );
    assert!(
        spec["securityContext"]["fsGroup"].is_number(),
        "a shared group for the 0660 socket: {}",
        spec["securityContext"]
    );
    let config_map = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap" && d["metadata"]["name"] == "cluster-autoscaler-cloud-config"
        })
        .expect("the cloud-config");
    let cloud_config: serde_json::Value =
        serde_yaml::from_str(config_map["data"]["cloud-config"].as_str().expect("text")).unwrap();
    assert_eq!(cloud_config["address"], format!("unix://{socket}"));
    assert!(
        cloud_config.get("cert").is_none(),
        "plaintext on the socket"
    );
    let command: Vec<&str> = spec["containers"][0]["command"]
        .as_array()
        .expect("command")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        command.contains(&"--cloud-config=/etc/cluster-autoscaler/cloud-config"),
        "{command:?}"
    );
}

/// The upstream cluster-autoscaler chart with `examples/cluster-autoscaler-relay-values.yaml`
/// runs the relay as a native sidecar: cluster-autoscaler dials its socket in plaintext, the
/// relay dials the operator with the mounted client certificate, and the pod carries no
/// credentials of the relay's own beyond that Secret.
#[test]
fn the_upstream_chart_with_the_relay_values_puts_the_relay_beside_cluster_autoscaler() {
    let docs = upstream_ca_chart_with("examples/cluster-autoscaler-relay-values.yaml");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("a Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let relay = &spec["initContainers"][0];
    assert_eq!(relay["restartPolicy"], "Always", "a native sidecar");
    let args: Vec<&str> = relay["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert_eq!(args.first(), Some(&"relay"), "{args:?}");
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("--{name} in {args:?}"))
            .to_string()
    };
    let socket = flag("grpc-unix-socket");
    let relay_config = flag("operator-cloud-config");
    let mounted = |container: &serde_json::Value, path: &str| {
        container["volumeMounts"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["mountPath"]
                    .as_str()
                    .is_some_and(|dir| path.starts_with(&format!("{dir}/")))
            })
        })
    };
    assert!(
        mounted(relay, &socket),
        "the relay mounts its socket's directory"
    );
    assert!(
        mounted(&spec["containers"][0], &socket),
        "cluster-autoscaler mounts the socket's directory"
    );
    assert!(
        mounted(relay, &relay_config),
        "the relay mounts its cloud-config"
    );
    let config_map = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap" && d["metadata"]["name"] == "cluster-autoscaler-cloud-config"
        })
        .expect("the cloud-configs");
    let ca_config: serde_json::Value =
        serde_yaml::from_str(config_map["data"]["cloud-config"].as_str().expect("text")).unwrap();
    assert_eq!(ca_config["address"], format!("unix://{socket}"));
    let to_operator: serde_json::Value = serde_yaml::from_str(
        config_map["data"]["relay-cloud-config"]
            .as_str()
            .expect("the relay's cloud-config"),
    )
    .unwrap();
    for key in ["cert", "key", "cacert"] {
        let path = to_operator[key].as_str().expect(key);
        assert!(
            mounted(relay, path),
            "{key} {path} is mounted into the relay"
        );
    }
    assert!(
        spec["securityContext"]["fsGroup"].is_number(),
        "a shared group for the 0660 socket"
    );
}

#[test]
fn the_upstream_cluster_autoscaler_chart_with_the_readme_values_reaches_the_operator() {
    let values = repo_file("examples/cluster-autoscaler-values.yaml");
    let ca_chart = upstream_ca_chart();
    let (ok, out, err) = helm(&[
        "template",
        "cluster-autoscaler",
        ca_chart.to_str().unwrap(),
        "-n",
        "ngo-system",
        "-f",
        values.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let ca_docs = parse_docs(&out);
    let deployment = ca_docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the upstream chart renders its Deployment with these values");
    let pod = &deployment["spec"]["template"];
    let container = &pod["spec"]["containers"][0];
    let command: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        command.contains(&"--cloud-provider=externalgrpc"),
        "{command:?}"
    );
    assert!(
        command.contains(&"--cloud-config=/etc/cluster-autoscaler/cloud-config"),
        "{command:?}"
    );
    assert!(
        container["image"].as_str().unwrap().ends_with(":v1.36.1"),
        "{}",
        container["image"]
    );
    let mount = |volume: &str| {
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == volume)
            .unwrap_or_else(|| panic!("no mount {volume}: {}", container["volumeMounts"]))["mountPath"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let secret_of = |volume: &str| {
        pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == volume)
            .unwrap_or_else(|| panic!("no volume {volume}"))["secret"]["secretName"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(mount("cloud-config"), "/etc/cluster-autoscaler");
    let client_dir = mount("client-cert");
    // Reloader rolls cluster-autoscaler when either Secret it reads once changes.
    let mut reloaded: Vec<&str> =
        deployment["metadata"]["annotations"]["secret.reloader.stakater.com/reload"]
            .as_str()
            .expect("the Reloader annotation")
            .split(',')
            .collect();
    reloaded.sort();
    let mut read_once = vec![secret_of("client-cert"), secret_of("cloud-config")];
    read_once.sort();
    assert_eq!(reloaded, read_once);

    // The operator's chart renders the Secrets those volumes name, with paths that match.
    for operator_values in [&[][..], &["--set", "grpc.certManager.enabled=true"][..]] {
        let docs = rbac::render_chart("ngo-system", operator_values).unwrap();
        let cloud_config = docs
            .iter()
            .find(|d| {
                d["kind"] == "Secret" && d["metadata"]["name"] == secret_of("cloud-config").as_str()
            })
            .unwrap_or_else(|| {
                panic!(
                    "the operator's chart renders Secret {}",
                    secret_of("cloud-config")
                )
            });
        let text = cloud_config["stringData"]["cloud-config"].as_str().unwrap();
        let config = nodegroup_operator::probe::CloudConfig::parse(text).unwrap();
        assert_eq!(config.address, "nodegroup-operator.ngo-system.svc:8086");
        assert_eq!(config.grpc_timeout, Duration::from_secs(10));
        for (file, path) in [
            ("tls.crt", &config.cert),
            ("tls.key", &config.key),
            ("ca.crt", &config.cacert),
        ] {
            assert_eq!(
                path.as_deref(),
                Some(PathBuf::from(&client_dir).join(file).as_path()),
                "{text}"
            );
        }
        // The Service the address names, on that port.
        let service = docs.iter().find(|d| d["kind"] == "Service").unwrap();
        assert_eq!(service["metadata"]["name"], "nodegroup-operator");
        assert_eq!(service["spec"]["ports"][0]["port"], 8086);
        // The client certificate Secret is the one cert-manager fills.
        if operator_values.contains(&"grpc.certManager.enabled=true") {
            let certificate = docs
                .iter()
                .find(|d| {
                    d["kind"] == "Certificate"
                        && d["spec"]["secretName"] == secret_of("client-cert").as_str()
                })
                .expect("a client Certificate for the Secret cluster-autoscaler mounts");
            assert_eq!(certificate["spec"]["usages"], json!(["client auth"]));
            let server = docs
                .iter()
                .find(|d| {
                    d["kind"] == "Certificate"
                        && d["metadata"]["name"] == "nodegroup-operator-grpc-server"
                })
                .unwrap();
            assert!(
                server["spec"]["dnsNames"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("nodegroup-operator.ngo-system.svc")),
                "the address's host is a SAN of the serving certificate"
            );
        }
        // `helm test` mounts the same Secrets at the same paths.
        let test_pod = docs.iter().find(|d| d["kind"] == "Pod").unwrap();
        let mounts = &test_pod["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(
            mounts,
            &json!([
                {"name": "cloud-config", "mountPath": "/etc/cluster-autoscaler", "readOnly": true},
                {"name": "client-cert", "mountPath": client_dir, "readOnly": true}
            ])
        );
        assert_eq!(
            test_pod["spec"]["volumes"],
            json!([
                {"name": "cloud-config", "secret": {"secretName": secret_of("cloud-config")}},
                {"name": "client-cert", "secret": {"secretName": secret_of("client-cert")}}
            ])
        );
        assert_eq!(
            test_pod["spec"]["containers"][0]["args"],
            json!([
                "probe",
                "--cloud-config=/etc/cluster-autoscaler/cloud-config"
            ])
        );
    }

    // The NetworkPolicy's default admits these pods.
    let docs = rbac::render_chart("ngo-system", &["--set", "networkPolicy.enabled=true"]).unwrap();
    let policy = docs.iter().find(|d| d["kind"] == "NetworkPolicy").unwrap();
    let admitted = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    for (label, value) in admitted {
        assert_eq!(
            &pod["metadata"]["labels"][label], value,
            "cluster-autoscaler's pod label {label}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// RBAC: exactly what the operator's code uses, per topology.

/// The operator's API access, from its code: `(group, resource, verbs)`, for a topology.
/// Each line names where the access happens; a rule the chart renders beyond these, or one it
/// lacks, fails `rendered_rbac_is_exactly_the_operators_access_in_each_topology`.
fn operator_access(
    workload_nodes: &str,
) -> Vec<(&'static str, &'static str, &'static [&'static str])> {
    const CAPI: &str = "cluster.x-k8s.io";
    const OURS: &str = "autoscaling.nodegroup.dev";
    let mut access: Vec<(&str, &str, &[&str])> = vec![
        // runtime/watches/ (reflectors); actuate/capi/replicas.rs (replicas + ledger patch);
        // uninstall/ (release-finalizers, the pre-delete hook: stale ledgers removed)
        (
            CAPI,
            "machinedeployments",
            &["get", "list", "watch", "patch"],
        ),
        (CAPI, "machinesets", &["get", "list", "watch", "patch"]),
        (CAPI, "machinepools", &["get", "list", "watch", "patch"]),
        // actuate/capi/replicas.rs: read and compare-and-swap of /scale
        (CAPI, "machinedeployments/scale", &["get", "update"]),
        (CAPI, "machinesets/scale", &["get", "update"]),
        (CAPI, "machinepools/scale", &["get", "update"]),
        // runtime/watches/; actuate/capi/marks.rs (delete-machine marks); uninstall/
        // (release-finalizers: our finalizer and records off Machines being deleted)
        (CAPI, "machines", &["get", "list", "watch", "patch"]),
        // runtime/watches/; status/writer.rs (server-side apply of status)
        (OURS, "nodegrouppolicies", &["get", "list", "watch"]),
        (OURS, "nodegrouppolicies/status", &["patch"]),
        // nodepool/reconciler (finalizer); uninstall/ (finalizer released with
        // --orphan-cloud-servers)
        (OURS, "nodepools", &["get", "list", "watch", "patch"]),
        // actuate/capi/replicas.rs: NodePools scale through /scale as well
        (OURS, "nodepools/scale", &["get", "update"]),
        (OURS, "nodepools/status", &["patch"]),
        // events.rs
        ("events.k8s.io", "events", &["create", "patch"]),
        // runtime/watches/templates.rs: infrastructure templates for scale from zero (values list them)
        (
            "infrastructure.cluster.x-k8s.io",
            "awsmachinetemplates",
            &["get", "list", "watch"],
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "azuremachinetemplates",
            &["get", "list", "watch"],
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "dockermachinetemplates",
            &["get", "list", "watch"],
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "gcpmachinetemplates",
            &["get", "list", "watch"],
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "openstackmachinetemplates",
            &["get", "list", "watch"],
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "vspheremachinetemplates",
            &["get", "list", "watch"],
        ),
    ];
    if workload_nodes != "cluster-secrets" {
        // runtime/watches/: Nodes of this cluster (or of the cluster the operator runs in);
        // nodepool/drain.rs: a NodePool server's Node cordoned, its pods listed and evicted
        access.push(("", "nodes", &["get", "list", "watch", "patch"]));
        access.push(("", "pods", &["list"]));
        access.push(("", "pods/eviction", &["create"]));
    }
    // runtime/watches/: Clusters (their spec.paused pauses groups; identities name them;
    // workload connections follow them)
    access.push((CAPI, "clusters", &["get", "list", "watch"]));
    if workload_nodes == "cluster-secrets" {
        // runtime/workload/kubeconfig.rs: `<cluster>-kubeconfig` Secrets, read by name
        access.push(("", "secrets", &["get"]));
    }
    access
}

/// Where the operator's code uses namespaced access outside the rules above, by Role:
/// `(role, namespace, resource, verbs)`.
fn operator_namespaced_access(
    workload_nodes: &str,
) -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
)> {
    let mut access: Vec<(&str, &str, &str, &[&str])> = vec![
        // runtime/leader.rs
        (
            "nodegroup-operator-leader-election",
            "ngo-system",
            "leases",
            &["get", "create", "update"],
        ),
        // nodepool/reconciler/pass.rs: a NodePool's credentials Secret, by name
        (
            "nodegroup-operator-nodepool-credentials",
            "ngo-system",
            "secrets",
            &["get"],
        ),
    ];
    if workload_nodes != "cluster-secrets" {
        // nodepool/bootstrap.rs: kubeadm bootstrap tokens where the Nodes join
        access.push((
            "nodegroup-operator-bootstrap-tokens",
            "kube-system",
            "secrets",
            &["create", "list", "delete"],
        ));
    }
    access
}

#[test]
fn rendered_rbac_is_exactly_the_operators_access_in_each_topology() {
    use std::collections::BTreeSet;
    for (workload_nodes, client_identity) in [
        ("same-cluster", "off"),
        ("same-cluster", "common-name"),
        ("cluster-secrets", "uri-san"),
        ("kubeconfig", "off"),
    ] {
        let docs = rbac::render_chart(
            "ngo-system",
            &[
                "--set",
                &format!("topology.workloadNodes={workload_nodes}"),
                "--set",
                &format!("topology.clientIdentity={client_identity}"),
                "--set",
                "topology.managementKubeconfigSecret=management",
                "--set",
                "nodePools.bootstrapTokens=true",
            ],
        )
        .unwrap();
        let rendered: BTreeSet<(String, String, String)> = grants(&docs)
            .into_iter()
            .map(|(_, g, r, v)| (g, r, v))
            .collect();
        let expected: BTreeSet<(String, String, String)> = operator_access(workload_nodes)
            .into_iter()
            .chain(operator_namespaced_access(workload_nodes).into_iter().map(
                |(_, _, resource, verbs)| {
                    let group = if resource == "leases" {
                        "coordination.k8s.io"
                    } else {
                        ""
                    };
                    (group, resource, verbs)
                },
            ))
            .flat_map(|(g, r, verbs)| {
                verbs
                    .iter()
                    .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
            })
            .collect();
        let extra: Vec<_> = rendered.difference(&expected).collect();
        let missing: Vec<_> = expected.difference(&rendered).collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "{workload_nodes}/{client_identity}: granted beyond the operator's access: {extra:?}; missing: {missing:?}"
        );
        // Each Role is one of those, in its namespace, with exactly those rules.
        let roles: BTreeSet<(String, String, String)> = docs
            .iter()
            .filter(|d| d["kind"] == "Role")
            .map(|d| {
                (
                    d["metadata"]["name"].as_str().unwrap().to_string(),
                    d["metadata"]["namespace"].as_str().unwrap().to_string(),
                    d["rules"].to_string(),
                )
            })
            .collect();
        let expected_roles: BTreeSet<(String, String, String)> =
            operator_namespaced_access(workload_nodes)
                .into_iter()
                .map(|(name, namespace, resource, verbs)| {
                    let group = if resource == "leases" {
                        "coordination.k8s.io"
                    } else {
                        ""
                    };
                    (
                        name.to_string(),
                        namespace.to_string(),
                        json!([{"apiGroups": [group], "resources": [resource], "verbs": verbs}])
                            .to_string(),
                    )
                })
                .collect();
        assert_eq!(roles, expected_roles, "{workload_nodes}/{client_identity}");
    }
}

#[test]
fn notes_say_what_to_check_next() {
    let chart = chart_dir();
    let notes = |args: &[&str]| {
        let mut all = vec![
            "install",
            "ngo",
            chart.to_str().unwrap(),
            "-n",
            "kube-system",
            "--dry-run=client",
        ];
        all.extend_from_slice(args);
        let (ok, out, err) = helm(&all);
        assert!(ok, "{err}");
        out[out.find("NOTES:").expect("NOTES rendered")..].to_string()
    };
    let defaults = notes(&[]);
    for expected in [
        "kubectl -n kube-system rollout status deployment/nodegroup-operator",
        "kubectl -n kube-system get secret nodegroup-operator-grpc-tls nodegroup-operator-client-cluster-autoscaler",
        "helm test ngo -n kube-system",
        "kubectl get nodegrouppolicies,nodepools -A -o wide",
        "cloud-config: {name: nodegroup-operator-autoscaler-cloud-config, mountPath: /etc/cluster-autoscaler}",
    ] {
        assert!(defaults.contains(expected), "{expected:?} in:\n{defaults}");
    }
    let cert_manager = notes(&["--set", "grpc.certManager.enabled=true"]);
    assert!(
        cert_manager
            .contains("kubectl -n kube-system get certificates -l app.kubernetes.io/instance=ngo"),
        "{cert_manager}"
    );
    let insecure = notes(&[
        "--set",
        "grpc.insecure=true",
        "--set",
        "replicas=1",
        "--set",
        "leaderElection.enabled=false",
    ]);
    assert!(
        insecure.contains("WARNING: gRPC is served WITHOUT TLS"),
        "{insecure}"
    );
    assert!(!insecure.contains("client-cert:"), "{insecure}");
}

/// The self-signed CA lives ten years and is renewed over its own key, so the client
/// certificate cluster-autoscaler read at start-up keeps chaining to it; leaves rotate keys.
#[test]
fn the_self_signed_ca_is_long_lived_and_renewed_over_its_key() {
    let certificate = |docs: &[serde_json::Value], name: &str| -> serde_json::Value {
        docs.iter()
            .find(|d| d["kind"] == "Certificate" && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("Certificate {name}"))["spec"]
            .clone()
    };
    let docs =
        rbac::render_chart("ngo-system", &["--set", "grpc.certManager.enabled=true"]).unwrap();
    let ca = certificate(&docs, "nodegroup-operator-ca");
    assert_eq!(ca["isCA"], true);
    assert_eq!(ca["duration"], "87600h");
    assert_eq!(ca["privateKey"]["rotationPolicy"], "Never");
    for leaf in [
        "nodegroup-operator-grpc-server",
        "nodegroup-operator-client-cluster-autoscaler",
    ] {
        let spec = certificate(&docs, leaf);
        assert_eq!(spec["privateKey"]["rotationPolicy"], "Always", "{leaf}");
        assert!(
            spec.get("duration").is_none(),
            "{leaf}: cert-manager's default"
        );
    }
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "grpc.certManager.enabled=true",
            "--set",
            "grpc.certManager.caDuration=43800h",
        ],
    )
    .unwrap();
    assert_eq!(
        certificate(&docs, "nodegroup-operator-ca")["duration"],
        "43800h"
    );
    let error = template(&[
        "--set",
        "grpc.certManager.enabled=true",
        "--set",
        "grpc.certManager.caDuration=10y",
    ])
    .unwrap_err();
    assert!(error.contains("caDuration"), "{error}");
}

/// A ClusterIssuer for the client certificates is taken only when acknowledged, and then
/// signs the clients as named.
#[test]
fn a_cluster_issuer_is_taken_only_when_acknowledged() {
    let rendered = template(&[
        "--set",
        "grpc.certManager.enabled=true",
        "--set",
        "grpc.certManager.issuerRef.name=shared",
        "--set",
        "grpc.certManager.issuerRef.kind=ClusterIssuer",
        "--set",
        "grpc.certManager.allowClusterIssuer=true",
    ])
    .expect("acknowledged");
    assert!(
        rendered.contains("issuerRef: {name: shared, kind: ClusterIssuer"),
        "{rendered}"
    );
    template(&[
        "--set",
        "grpc.certManager.enabled=true",
        "--set",
        "grpc.certManager.issuerRef.name=own",
    ])
    .expect("an Issuer needs no acknowledgement");
}

/// A team copying its cluster-autoscaler chart values: `extraArgs` and `extraEnv` as maps and
/// `replicaCount` are taken as that chart takes them; the list forms keep working.
#[test]
fn the_cluster_autoscaler_charts_forms_of_extra_args_extra_env_and_replica_count_are_taken() {
    let docs = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "replicaCount=3",
            "--set-json",
            r#"extraArgs={"sweep-interval-secs":30,"log-json":true}"#,
            "--set-json",
            r#"extraEnv={"HTTPS_PROXY":"http://proxy:3128","RETRIES":3}"#,
        ],
    )
    .unwrap();
    let deployment = the(&docs, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 3);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&"--sweep-interval-secs=30"), "{args:?}");
    assert!(args.contains(&"--log-json=true"), "{args:?}");
    let env = container["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "HTTPS_PROXY", "value": "http://proxy:3128"})));
    assert!(env.contains(&json!({"name": "RETRIES", "value": "3"})));
    assert_eq!(
        the(&docs, "PodDisruptionBudget")["kind"],
        "PodDisruptionBudget"
    );

    let lists = rbac::render_chart(
        "ngo-system",
        &[
            "--set",
            "extraArgs[0]=--sweep-interval-secs=30",
            "--set",
            "extraEnv[0].name=A",
            "--set",
            "extraEnv[0].value=b",
        ],
    )
    .unwrap();
    let deployment = the(&lists, "Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--sweep-interval-secs=30"))
    );
    assert!(
        container["env"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "A", "value": "b"}))
    );
}

/// The operator's priority: system-cluster-critical in kube-system by default (as the
/// cluster-autoscaler chart), none elsewhere unless given, and exactly what a value names.
#[test]
fn the_operator_is_system_cluster_critical_in_kube_system_unless_told_otherwise() {
    let class = |namespace: &str, args: &[&str]| {
        let docs = rbac::render_chart(namespace, args).unwrap();
        the(&docs, "Deployment")["spec"]["template"]["spec"]["priorityClassName"].clone()
    };
    assert_eq!(class("kube-system", &[]), json!("system-cluster-critical"));
    assert_eq!(class("ngo-system", &[]), serde_json::Value::Null);
    assert_eq!(
        class(
            "ngo-system",
            &["--set", "priorityClassName=platform-critical"]
        ),
        json!("platform-critical")
    );
    assert_eq!(
        class("kube-system", &["--set", "priorityClassName="]),
        serde_json::Value::Null
    );
}
