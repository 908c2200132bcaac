//! Template assembly and encoding.

use std::collections::BTreeMap;

use k8s_pb::api::core::v1 as pb;
use prost::Message;

use super::TemplateInputs;
use super::*;
use crate::capi::annotations::CapacityHints;
use crate::capi::objects::InfraTemplate;

fn inputs(hints: CapacityHints, infra: Option<InfraTemplate>) -> TemplateInputs {
    TemplateInputs {
        hints,
        infra,
        default_arch: "amd64".into(),
        ..Default::default()
    }
}

fn hints(cpu: Option<&str>, memory: Option<&str>) -> CapacityHints {
    CapacityHints {
        cpu: cpu.map(String::from),
        memory: memory.map(String::from),
        ..Default::default()
    }
}

fn infra(capacity: &[(&str, &str)], arch: Option<&str>) -> InfraTemplate {
    InfraTemplate {
        capacity: capacity
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        architecture: arch.map(String::from),
        operating_system: None,
    }
}

#[test]
fn cpu_and_memory_are_both_needed_and_may_come_from_different_sources() {
    assert!(!can_scale_from_zero(&inputs(hints(Some("2"), None), None)));
    assert!(can_scale_from_zero(&inputs(
        hints(Some("2"), Some("4Gi")),
        None
    )));
    assert!(can_scale_from_zero(&inputs(
        hints(Some("2"), None),
        Some(infra(&[("memory", "8Gi")], None))
    )));
    assert!(!can_scale_from_zero(&inputs(
        hints(None, None),
        Some(infra(&[("memory", "8Gi"), ("cpu", "bad")], None))
    )));
}

#[test]
fn annotations_override_template_capacity_and_pods_default_to_110() {
    let mut h = hints(Some("8"), None);
    h.gpu = Some(("nvidia.com/gpu".into(), 2));
    let t = inputs(h, Some(infra(&[("cpu", "4"), ("memory", "16Gi")], None)));
    let c = capacity(&t);
    assert_eq!(c["cpu"], "8");
    assert_eq!(c["memory"], "16Gi");
    assert_eq!(c["nvidia.com/gpu"], "2");
    assert_eq!(c["pods"], "110");
}

#[test]
fn template_pods_are_kept_unless_max_pods_is_annotated() {
    let t = inputs(
        hints(Some("1"), Some("1Gi")),
        Some(infra(&[("pods", "50")], None)),
    );
    assert_eq!(capacity(&t)["pods"], "50");
    let mut h = hints(Some("1"), Some("1Gi"));
    h.max_pods = Some(30);
    let t = inputs(h, Some(infra(&[("pods", "50")], None)));
    assert_eq!(capacity(&t)["pods"], "30");
}

#[test]
fn label_priority_is_generic_then_system_then_managed_then_annotation_then_node() {
    let mut t = inputs(
        hints(Some("1"), Some("1Gi")),
        Some(infra(&[], Some("arm64"))),
    );
    t.managed_labels = managed_labels(&BTreeMap::from([
        ("node-role.kubernetes.io/worker".to_string(), "".to_string()),
        ("team".to_string(), "x".to_string()),
        ("a.node.cluster.x-k8s.io/pool".to_string(), "p".to_string()),
    ]));
    t.hints.labels = BTreeMap::from([("kubernetes.io/os".to_string(), "windows".to_string())]);
    t.node_labels = BTreeMap::from([("kubernetes.io/arch".to_string(), "s390x".to_string())]);
    let l = labels(&t, "n");
    assert_eq!(l["kubernetes.io/arch"], "s390x");
    assert_eq!(l["kubernetes.io/os"], "windows");
    assert_eq!(l["kubernetes.io/hostname"], "n");
    assert!(l.contains_key("node-role.kubernetes.io/worker"));
    assert!(l.contains_key("a.node.cluster.x-k8s.io/pool"));
    assert!(
        !l.contains_key("team"),
        "unmanaged template labels are not copied"
    );
}

#[test]
fn template_without_node_info_keeps_default_arch() {
    let t = inputs(hints(Some("1"), Some("1Gi")), Some(infra(&[], None)));
    assert_eq!(labels(&t, "n")["kubernetes.io/arch"], "amd64");
}

#[test]
fn annotation_taints_replace_spec_taints_with_same_key_and_effect() {
    let mut t = inputs(hints(Some("1"), Some("1Gi")), None);
    let taint = |k: &str, v: &str, e: &str| Taint {
        key: k.into(),
        value: v.into(),
        effect: e.into(),
    };
    t.spec_taints = vec![taint("a", "1", "NoSchedule"), taint("b", "1", "NoSchedule")];
    t.hints.taints = vec![taint("a", "2", "NoSchedule"), taint("b", "2", "NoExecute")];
    let out = taints(&t);
    assert_eq!(
        out,
        vec![
            taint("a", "2", "NoSchedule"),
            taint("b", "1", "NoSchedule"),
            taint("b", "2", "NoExecute")
        ]
    );
}

#[test]
fn encoded_node_decodes_as_a_plain_v1_node() {
    let mut t = inputs(hints(Some("2"), Some("4Gi")), None);
    t.hints.taints = vec![Taint {
        key: "k".into(),
        value: "v".into(),
        effect: "NoSchedule".into(),
    }];
    let bytes = encode_node(&build_node("md-0", &t, 1_700_000_000));
    assert_ne!(&bytes[..4], b"k8s\0", "no Kubernetes protobuf envelope");
    let node = pb::Node::decode(bytes.as_slice()).unwrap();
    let status = node.status.unwrap();
    assert_eq!(status.capacity["cpu"].string.as_deref(), Some("2"));
    assert_eq!(status.allocatable["memory"].string.as_deref(), Some("4Gi"));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.r#type.as_deref() == Some("Ready") && c.status.as_deref() == Some("True"))
    );
    assert_eq!(node.spec.unwrap().taints[0].key.as_deref(), Some("k"));
    assert_eq!(node.metadata.unwrap().labels["kubernetes.io/arch"], "amd64");
}
