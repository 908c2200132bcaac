use super::*;
use serde_json::json;

fn dynamic(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

/// A v1beta2 Machine as the API server sends it, with the status a real controller writes.
fn full_machine() -> Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": "m1", "namespace": "ns", "uid": "u1", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z", "finalizers": ["machine.cluster.x-k8s.io"],
            "labels": {"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/set-name": "ms"},
            "annotations": {"cluster.x-k8s.io/delete-machine": "yes"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineSet", "name": "ms", "uid": "x"}],
            "managedFields": [{"manager": "capi", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
        },
        "spec": {
            "clusterName": "c1", "providerID": "test:////m1", "version": "v1.34.0",
            "bootstrap": {"dataSecretName": "m1-bootstrap"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachine", "name": "m1"}
        },
        "status": {
            "phase": "Failed",
            "nodeRef": {"name": "node-1"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "False", "reason": "NotReady", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "deprecated": {"v1beta1": {"failureMessage": "the instance is gone", "conditions": []}}
        }
    })
}

#[test]
fn a_watched_machine_holds_the_same_view_as_the_whole_object_and_only_its_identity() {
    let watched: WatchedMachine = serde_json::from_value(full_machine()).unwrap();
    let view = Machine::from_dynamic(&dynamic(full_machine()));
    assert_eq!(*watched.view, view);
    assert_eq!(view.provider_id.as_deref(), Some("test:////m1"));
    assert_eq!(view.node_ref_name.as_deref(), Some("node-1"));
    assert_eq!(view.owner_machine_set.as_deref(), Some("ms"));
    assert!(view.is_failed() && view.deleting);
    assert_eq!(
        watched.metadata,
        ObjectMeta {
            name: Some("m1".into()),
            namespace: Some("ns".into()),
            resource_version: Some("42".into()),
            ..ObjectMeta::default()
        }
    );
}

#[test]
fn a_watched_machine_tolerates_what_the_view_does_not_read_or_cannot_use() {
    let mut odd = full_machine();
    odd["spec"]["providerID"] = json!(7);
    odd["status"] = json!("not an object");
    odd["extra"] = json!({"anything": [1, 2]});
    let watched: WatchedMachine = serde_json::from_value(odd).unwrap();
    assert_eq!(watched.view.provider_id, None);
    assert_eq!(watched.view.phase, None);
    assert_eq!(watched.view.cluster_name, "c1");
    let bare: WatchedMachine = serde_json::from_value(json!({"metadata": {"name": "m"}})).unwrap();
    assert_eq!(bare.view.name, "m");
}

#[test]
fn machine_deployment_v1beta2_fields_are_read() {
    let obj = dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": "md", "namespace": "ns", "uid": "u1", "annotations": {"a": "b"}},
        "spec": {
            "clusterName": "c1", "replicas": 3,
            "selector": {"matchLabels": {"x": "y"}},
            "template": {
                "metadata": {"labels": {"node-role.kubernetes.io/worker": ""}},
                "spec": {
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachineTemplate", "name": "t"},
                    "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]
                }
            }
        }
    }));
    let r =
        ScalableResource::from_dynamic(ScalableKind::MachineDeployment, &obj, &CapiKeys::default());
    assert_eq!(r.group_id(), "MachineDeployment/ns/md");
    assert_eq!(r.replicas, Some(3));
    assert_eq!(r.cluster_name, "c1");
    let infra = r.infra_ref.unwrap();
    assert_eq!(infra.group, "infrastructure.cluster.x-k8s.io");
    assert_eq!(infra.version, None);
    assert_eq!(infra.kind, "TestMachineTemplate");
    assert_eq!(r.template_taints[0].effect, "NoSchedule");
    assert!(
        r.selector
            .unwrap()
            .matches(&[("x".to_string(), "y".to_string())].into())
    );
}

#[test]
fn machine_set_v1beta1_infra_ref_and_owner_are_read() {
    let obj = dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet",
        "metadata": {"name": "ms", "namespace": "ns", "labels": {"cluster.x-k8s.io/cluster-name": "c2"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineDeployment", "name": "md", "uid": "x"}]},
        "spec": {"template": {"spec": {"infrastructureRef": {"apiVersion": "infra.example.com/v1alpha1", "kind": "T", "name": "t"}}}}
    }));
    let r = ScalableResource::from_dynamic(ScalableKind::MachineSet, &obj, &CapiKeys::default());
    assert_eq!(r.owner_machine_deployment.as_deref(), Some("md"));
    assert_eq!(
        r.cluster_name, "c2",
        "label fallback when spec.clusterName is absent"
    );
    assert_eq!(r.replicas, None);
    let infra = r.infra_ref.unwrap();
    assert_eq!(
        (infra.group.as_str(), infra.version.as_deref()),
        ("infra.example.com", Some("v1alpha1"))
    );
}

#[test]
fn machine_failure_is_read_from_both_api_versions() {
    let v1beta1 = Machine::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"clusterName": "c", "providerID": ""},
        "status": {"phase": "Failed", "failureMessage": "boom"}
    })));
    assert!(v1beta1.is_failed());
    assert_eq!(
        v1beta1.provider_id, None,
        "empty providerID is no providerID"
    );
    let v1beta2 = Machine::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"clusterName": "c"},
        "status": {"phase": "Failed", "deprecated": {"v1beta1": {"failureMessage": "boom"}}}
    })));
    assert!(v1beta2.is_failed());
    let running = Machine::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"clusterName": "c"},
        "status": {"phase": "Provisioning", "deprecated": {"v1beta1": {"failureMessage": "no capacity"}}}
    })));
    assert!(
        running.is_failed(),
        "a failure message in any phase fails the machine, as in-tree"
    );
    let healthy = Machine::from_dynamic(&dynamic(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"clusterName": "c"},
        "status": {"phase": "Failed"}
    })));
    assert!(
        !healthy.is_failed(),
        "a phase without a failure message is not"
    );
}

#[test]
fn selector_expressions_match_like_kubernetes() {
    let sel = Selector::from_value(Some(&json!({
        "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1", "2"]},
            {"key": "b", "operator": "NotIn", "values": ["x"]},
            {"key": "c", "operator": "Exists"},
            {"key": "d", "operator": "DoesNotExist"}
        ]
    })))
    .unwrap();
    let l = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(sel.matches(&l(&[("a", "1"), ("c", "")])));
    assert!(!sel.matches(&l(&[("a", "3"), ("c", "")])));
    assert!(!sel.matches(&l(&[("a", "1"), ("b", "x"), ("c", "")])));
    assert!(!sel.matches(&l(&[("a", "1")])));
    assert!(!sel.matches(&l(&[("a", "1"), ("c", ""), ("d", "")])));
}

#[test]
fn infra_template_capacity_and_node_info_are_read() {
    let t = InfraTemplate::from_dynamic(&dynamic(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "T",
        "metadata": {"name": "t", "namespace": "ns"},
        "status": {"capacity": {"cpu": "4", "memory": "16Gi", "pods": 50}, "nodeInfo": {"architecture": "arm64", "operatingSystem": "linux"}}
    })));
    assert_eq!(t.capacity.get("cpu").unwrap(), "4");
    assert_eq!(t.capacity.get("pods").unwrap(), "50");
    assert_eq!(t.architecture.as_deref(), Some("arm64"));
}
