//! The instances a group reports, and the group a machine belongs to: a machine's instance in
//! upstream's order of precedence, a NodePool's servers as its status lists them.

use super::inputs::{IndexInputs, NodeFinder, allowed};
use super::model::{ClusterKey, NodeGroup};
use crate::capi::groups::{Instance, InstanceError, InstanceState, PoolView};
use crate::capi::objects::{Machine, ScalableKind, ScalableResource};
use crate::capi::providerid::{self, SyntheticKind};

/// The group a machine belongs to through its owner chain (Machine -> MachineSet ->
/// MachineDeployment, or MachinePool), `resource` finding scalable resources by kind,
/// namespace and name.
pub(super) fn owning_group<'a>(
    inputs: &IndexInputs,
    resource: impl Fn(ScalableKind, &str, &str) -> Option<&'a ScalableResource>,
    m: &Machine,
) -> Option<String> {
    let ns = m.namespace.as_str();
    if let Some(pool) = &m.owner_machine_pool {
        return Some(format!("{}/{ns}/{pool}", ScalableKind::MachinePool));
    }
    let ms = resource(
        ScalableKind::MachineSet,
        ns,
        m.owner_machine_set.as_deref()?,
    )?;
    match &ms.owner_machine_deployment {
        // The MachineDeployment is the group; if it is not visible (deleted, filtered), the
        // machine belongs to no group. Upstream's `nodeGroupForNode` falls back to the
        // MachineSet (`findMachineSetOwner` finds no visible owner), which NodeGroups never lists.
        Some(md) => {
            let md = resource(ScalableKind::MachineDeployment, ns, md.as_str())?;
            allowed(inputs, md).then(|| md.group_id())
        }
        None => Some(ms.group_id()),
    }
}

/// The instance for a machine, in upstream's order of precedence; `None` drops the machine.
pub(super) fn instance_for(m: &Machine, nodes: &impl NodeFinder) -> Option<Instance> {
    let cluster = ClusterKey {
        namespace: m.namespace.clone(),
        name: m.cluster_name.clone(),
    };
    let synthetic = |kind| providerid::synthetic_id(kind, &m.namespace, &m.name);
    let machine = Some(m.key());
    let with = |id, state, error| {
        Some(Instance {
            id,
            state,
            error,
            machine: machine.clone(),
        })
    };
    if m.is_failed() {
        let (state, error) = if m.deleting {
            (
                InstanceState::Deleting,
                Some(("DeletingFailed", "Machine deletion failed")),
            )
        } else if m.node_ref_name.is_none() {
            (
                InstanceState::Creating,
                Some(("ProvisioningFailed", "Machine provisioning failed")),
            )
        } else {
            (InstanceState::Unspecified, None)
        };
        let error = error.map(|(code, message)| InstanceError {
            code: code.into(),
            message: match &m.failure_message {
                Some(detail) => format!("{message}: {detail}"),
                None => message.into(),
            },
            class: 99,
        });
        return with(synthetic(SyntheticKind::Failed), state, error);
    }
    if m.deleting {
        return with(
            synthetic(SyntheticKind::Deleting),
            InstanceState::Deleting,
            None,
        );
    }
    // A machine whose Node already registered under its provider ID is running even if Cluster
    // API has not set nodeRef yet; otherwise it is still being created.
    let registered = m
        .provider_id
        .as_deref()
        .is_some_and(|p| nodes.by_pid(p, &cluster).is_some());
    if m.node_ref_name.is_none() && !registered {
        return with(
            synthetic(SyntheticKind::Pending),
            InstanceState::Creating,
            None,
        );
    }
    if let Some(pid) = &m.provider_id {
        return with(pid.clone(), InstanceState::Running, None);
    }
    if m.node_ref_kind
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != "Node")
    {
        return None;
    }
    let node = nodes.by_name(m.node_ref_name.as_deref()?, &cluster)?;
    with(
        node.provider_id.clone().unwrap_or_default(),
        InstanceState::Running,
        None,
    )
}

/// The instances of NodePool group `g`: failed creations and deletions as the pool reports
/// them; a server is running once a Node with its provider ID is registered, creating before.
pub(super) fn pool_instances(
    pool: &PoolView,
    g: &NodeGroup,
    nodes: &impl NodeFinder,
) -> Vec<Instance> {
    pool.instances
        .iter()
        .map(|i| {
            let mut instance = i.clone();
            if instance.state == InstanceState::Running || instance.state == InstanceState::Creating
            {
                instance.state = if instance.error.is_none()
                    && instance.is_real()
                    && nodes.by_pid(&instance.id, &g.cluster).is_some()
                {
                    InstanceState::Running
                } else {
                    InstanceState::Creating
                };
            }
            instance
        })
        .collect()
}
