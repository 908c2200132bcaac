//! Conversions between the index model and wire messages.

use crate::index::{Instance as ModelInstance, InstanceState, NodeGroup as ModelGroup};
use crate::proto;

/// A group as `NodeGroups` and `NodeGroupForNode` report it.
pub fn node_group(g: &ModelGroup) -> proto::NodeGroup {
    proto::NodeGroup {
        id: g.id.clone(),
        min_size: g.min,
        max_size: g.max,
        debug: g.debug(),
    }
}

/// An instance as `NodeGroupNodes` reports it.
pub fn instance(i: &ModelInstance) -> proto::Instance {
    let state = match i.state {
        InstanceState::Unspecified => proto::instance_status::InstanceState::Unspecified,
        InstanceState::Running => proto::instance_status::InstanceState::InstanceRunning,
        InstanceState::Creating => proto::instance_status::InstanceState::InstanceCreating,
        InstanceState::Deleting => proto::instance_status::InstanceState::InstanceDeleting,
    };
    proto::Instance {
        id: i.id.clone(),
        status: Some(proto::InstanceStatus {
            instance_state: state as i32,
            error_info: i.error.as_ref().map(|e| proto::InstanceErrorInfo {
                error_code: e.code.clone(),
                error_message: e.message.clone(),
                instance_error_class: e.class,
            }),
        }),
    }
}
