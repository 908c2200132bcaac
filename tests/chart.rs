//! The Helm chart: renders with the real helm, grants no wildcard, and its RBAC is enough for
//! every operation (the operator runs as a user bound to the chart's roles against a real API
//! server).

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams};
use ngo_sandbox as sandbox;
use nodegroup_operator::proto;
use serde_json::json;
use support::*;

fn render(namespace: &str) -> Vec<serde_json::Value> {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/nodegroup-operator");
    let out = std::process::Command::new(sandbox::upstream_bin("helm"))
        .args(["template", "ngo"])
        .arg(&chart)
        .args(["--namespace", namespace, "--include-crds"])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            serde_json::to_value(
                <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap(),
            )
            .unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn chart_renders_and_grants_no_wildcards() {
    let docs = render("ngo-system");
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
    let crd = docs
        .iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .unwrap();
    let checked_in: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds/nodegroup-operator.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        crd, &checked_in,
        "charts/nodegroup-operator/crds is stale: copy crds/nodegroup-operator.yaml"
    );
}

#[tokio::test]
async fn the_charts_rbac_is_enough_to_run_the_operator() {
    let ns = TestNs::new("chart-rbac").await;
    let docs = render(&ns.name);
    let pp = PatchParams::apply("ngo-tests").force();
    let user = format!("system:serviceaccount:{}:nodegroup-operator", ns.name);
    for doc in &docs {
        match doc["kind"].as_str().unwrap() {
            "ClusterRole" => {
                let mut role: ClusterRole = serde_json::from_value(doc.clone()).unwrap();
                let name = format!("{}-{}", ns.name, role.metadata.name.clone().unwrap());
                role.metadata.name = Some(name.clone());
                Api::<ClusterRole>::all(ns.client.clone())
                    .patch(&name, &pp, &Patch::Apply(&role))
                    .await
                    .unwrap();
                let binding: ClusterRoleBinding = serde_json::from_value(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
                }))
                .unwrap();
                Api::<ClusterRoleBinding>::all(ns.client.clone())
                    .patch(&name, &pp, &Patch::Apply(&binding))
                    .await
                    .unwrap();
            }
            "Role" => {
                let role: Role = serde_json::from_value(doc.clone()).unwrap();
                let name = role.metadata.name.clone().unwrap();
                Api::<Role>::namespaced(ns.client.clone(), &ns.name)
                    .patch(&name, &pp, &Patch::Apply(&role))
                    .await
                    .unwrap();
                let binding: RoleBinding = serde_json::from_value(json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": name, "namespace": ns.name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
                }))
                .unwrap();
                Api::<RoleBinding>::namespaced(ns.client.clone(), &ns.name)
                    .patch(&name, &pp, &Patch::Apply(&binding))
                    .await
                    .unwrap();
            }
            _ => {}
        }
    }
    // The chart's service account, as a client-certificate user with the same name.
    let kubeconfig = shared_user_kubeconfig(&user);

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
    let (operator, mut client) = ns.operator_with(kubeconfig, None).await;
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
