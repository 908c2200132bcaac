//! Annotation and label keys, derived once from the Cluster API group (`CAPI_GROUP`).

/// Default Cluster API group.
pub const DEFAULT_GROUP: &str = "cluster.x-k8s.io";
/// Pauses a scalable resource for the autoscaler. Not derived from `CAPI_GROUP`, as upstream.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The MachineDeployment revision a MachineSet carries (the newest is the current template).
pub const REVISION_ANNOTATION: &str = "machinedeployment.clusters.x-k8s.io/revision";
/// Prefix of the scale-from-zero capacity annotations.
pub const CAPACITY_PREFIX: &str = "capacity.cluster-autoscaler.kubernetes.io/";
/// The label CA reads GPU types from.
pub const GPU_LABEL: &str = "cluster-api/accelerator";
/// Prefixes of synthetic instance ids for machines that have no node (yet or any more).
pub const PENDING_PREFIX: &str = "pending-machine-";
/// See [`PENDING_PREFIX`].
pub const FAILED_PREFIX: &str = "failed-machine-";
/// See [`PENDING_PREFIX`].
pub const DELETING_PREFIX: &str = "deleting-machine-";

/// Keys whose group part follows `CAPI_GROUP`, computed once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapiKeys {
    /// The Cluster API group, e.g. `cluster.x-k8s.io`.
    pub group: String,
    /// `<group>/cluster-api-autoscaler-node-group-min-size`.
    pub min_size: String,
    /// `<group>/cluster-api-autoscaler-node-group-max-size`.
    pub max_size: String,
    /// `<group>/autoscaling-options-`.
    pub options_prefix: String,
    /// `<group>/delete-machine`, set on a Machine chosen for deletion.
    pub delete_machine: String,
    /// `<group>/machine`, the Node annotation naming its Machine.
    pub node_machine: String,
    /// `<group>/cluster-namespace`, the Node annotation naming its Machine's namespace.
    pub node_cluster_namespace: String,
    /// `<group>/cluster-name`, label fallback when `spec.clusterName` is absent.
    pub cluster_name_label: String,
}

impl CapiKeys {
    /// Keys for the given group.
    pub fn new(group: &str) -> Self {
        Self {
            group: group.to_string(),
            min_size: format!("{group}/cluster-api-autoscaler-node-group-min-size"),
            max_size: format!("{group}/cluster-api-autoscaler-node-group-max-size"),
            options_prefix: format!("{group}/autoscaling-options-"),
            delete_machine: format!("{group}/delete-machine"),
            node_machine: format!("{group}/machine"),
            node_cluster_namespace: format!("{group}/cluster-namespace"),
            cluster_name_label: format!("{group}/cluster-name"),
        }
    }
}

impl Default for CapiKeys {
    fn default() -> Self {
        Self::new(DEFAULT_GROUP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_group_changes_every_derived_key() {
        let keys = CapiKeys::new("custom.x-k8s.io");
        assert_eq!(
            keys.min_size,
            "custom.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
        );
        assert_eq!(
            keys.max_size,
            "custom.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
        );
        assert_eq!(keys.options_prefix, "custom.x-k8s.io/autoscaling-options-");
        assert_eq!(keys.delete_machine, "custom.x-k8s.io/delete-machine");
        assert_eq!(keys.node_machine, "custom.x-k8s.io/machine");
        assert_eq!(
            keys.node_cluster_namespace,
            "custom.x-k8s.io/cluster-namespace"
        );
        assert_eq!(keys.cluster_name_label, "custom.x-k8s.io/cluster-name");
    }
}
