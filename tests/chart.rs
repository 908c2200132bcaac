//! The Helm chart: renders with the real helm, grants no wildcard, and its RBAC is enough for
//! every operation (the whole suite runs the operator as the chart's ServiceAccount, see
//! `support::rbac`); a permission taken away is reported as PermissionDenied naming it.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};
use nodegroup_operator::proto;
use serde_json::json;
use support::*;
use tonic::Code;

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
    // Self-hosted, every namespace: Nodes, no Clusters; Secrets only where NodePools need
    // them: credentials read by name in the release namespace, bootstrap tokens in
    // kube-system, nothing cluster-wide.
    let docs = rbac::render_chart("ngo-system", &[]).unwrap();
    let g = grants(&docs);
    assert!(grants_anywhere(&g, "nodes"));
    assert!(!grants_anywhere(&g, "clusters"));
    let mut secrets: Vec<(Option<String>, String)> = g
        .iter()
        .filter(|(_, _, r, _)| r == "secrets")
        .map(|(n, _, _, v)| (n.clone(), v.clone()))
        .collect();
    secrets.sort();
    let at = |ns: &str, verb: &str| (Some(ns.to_string()), verb.to_string());
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
    let as_operator = ngo_sandbox::controlplane::client_for(&shared().operator_kubeconfig)
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
