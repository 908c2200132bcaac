//! The Node a booted instance registers in the cluster, shaped as ACK and the Alibaba Cloud
//! controller manager make it.

use std::collections::BTreeMap;

use super::model::{EmulatedInstance, InstanceTypeSpec};
use crate::kwok::FakeNode;

/// The Node an instance registers: named `<region>.<private IP>` (ACK's node names),
/// providerID `<region>.<instance-id>`, the labels the Alibaba Cloud controller manager sets
/// (instance type, region, zone) and, for GPU types, `aliyun.accelerator/nvidia_name`; the
/// type's capacity.
pub fn node_for(
    region: &str,
    instance: &EmulatedInstance,
    instance_type: Option<&InstanceTypeSpec>,
) -> FakeNode {
    let mut capacity = BTreeMap::from([("pods".to_string(), "110".to_string())]);
    if let Some(t) = instance_type {
        capacity.insert("cpu".into(), t.cpu.to_string());
        // Whole MiB, as a kubelet reports memory (minus nothing: no reservations here).
        let mib = (t.memory_gib * 1024.0).trunc();
        capacity.insert("memory".into(), format!("{mib}Mi"));
        if t.gpus > 0 {
            capacity.insert("nvidia.com/gpu".into(), t.gpus.to_string());
        }
    }
    let mut node = FakeNode::new(
        &format!("{region}.{}", instance.private_ip),
        &format!("{region}.{}", instance.id),
        capacity,
    );
    node.labels.insert(
        "node.kubernetes.io/instance-type".into(),
        instance.instance_type.clone(),
    );
    node.labels
        .insert("topology.kubernetes.io/region".into(), region.into());
    node.labels
        .insert("topology.kubernetes.io/zone".into(), instance.zone.clone());
    if let Some(t) = instance_type.filter(|t| t.gpus > 0) {
        node.labels.insert(
            "aliyun.accelerator/nvidia_name".into(),
            t.gpu_spec.replace(' ', "-"),
        );
    }
    node
}
