//! How a deployed Cherry Servers server joins the cluster: its user data is checked and a
//! Node registered as [`crate::boot`] describes; the Node is the one cloud-provider-cherry
//! would label ([`node_for`]).

use std::collections::BTreeMap;

pub use crate::boot::{JoinRequest, parse_user_data, verify_token};

use super::model::{EmulatedServer, PlanSpec};
use crate::kwok::FakeNode;

/// `spec.providerID` prefix of Cherry Servers Nodes (cloud-provider-cherry, and
/// cluster-autoscaler's `cherryservers` provider).
pub const PROVIDER_ID_PREFIX: &str = "cherryservers://";

/// The Node a server registers: named by its hostname, providerID `cherryservers://<id>`,
/// the labels cloud-provider-cherry sets (instance type = plan slug, region) plus the
/// kubelet's `--node-labels`, and the plan's capacity.
pub fn node_for(server: &EmulatedServer, plan: Option<&PlanSpec>, join: &JoinRequest) -> FakeNode {
    let mut capacity = BTreeMap::from([("pods".to_string(), "110".to_string())]);
    if let Some(plan) = plan {
        capacity.insert("cpu".into(), plan.cores.to_string());
        capacity.insert("memory".into(), format!("{}Gi", plan.memory_gb));
        if plan.gpus > 0 {
            capacity.insert("nvidia.com/gpu".into(), plan.gpus.to_string());
        }
    }
    let mut node = FakeNode::new(
        &server.hostname,
        &format!("{PROVIDER_ID_PREFIX}{}", server.id),
        capacity,
    );
    node.labels.extend(join.labels.clone());
    node.labels.insert(
        "node.kubernetes.io/instance-type".into(),
        server.plan.clone(),
    );
    node.labels.insert(
        "topology.kubernetes.io/region".into(),
        server.region.clone(),
    );
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "abcdef.0123456789abcdef";

    #[test]
    fn nodes_carry_cloud_labels_capacity_and_provider_id() {
        let server = EmulatedServer {
            id: 42,
            project_id: 1,
            hostname: "prod-workers-abc".into(),
            plan: "e5_1620v4".into(),
            region: "eu_nord_1".into(),
            image: "ubuntu_22_04".into(),
            lifecycle: super::super::model::Lifecycle::Active,
            tags: BTreeMap::new(),
            user_data: String::new(),
            ssh_keys: vec![],
            spot_market: false,
            os_partition_size: None,
            created_at: jiff::Timestamp::now(),
            boot: super::super::model::BootOutcome::Pending,
        };
        let plan = PlanSpec::new(1, "e5_1620v4", "E5-1620v4", 4, 64).gpus(1);
        let join = parse_user_data(&format!(
            "kubeadm join --token {TOKEN} --node-labels=pool=w"
        ))
        .unwrap();
        let node = node_for(&server, Some(&plan), &join);
        assert_eq!(node.name, "prod-workers-abc");
        assert_eq!(node.provider_id, "cherryservers://42");
        assert_eq!(node.labels["node.kubernetes.io/instance-type"], "e5_1620v4");
        assert_eq!(node.labels["topology.kubernetes.io/region"], "eu_nord_1");
        assert_eq!(node.labels["pool"], "w");
        assert_eq!(node.labels["kubernetes.io/hostname"], "prod-workers-abc");
        assert_eq!(node.capacity["cpu"], "4");
        assert_eq!(node.capacity["memory"], "64Gi");
        assert_eq!(node.capacity["nvidia.com/gpu"], "1");
    }
}
