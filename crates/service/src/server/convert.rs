//! Conversions between the index model and wire messages.

use super::ProviderError;
use crate::proto;
use ngo_index::index::{Instance as ModelInstance, InstanceState, NodeGroup as ModelGroup};

/// The largest message cluster-autoscaler's externalgrpc client receives: it dials with no
/// call options, so grpc-go's default receive limit applies.
pub const CLIENT_RECEIVE_LIMIT: usize = 4 * 1024 * 1024;

/// `answer` if cluster-autoscaler's client can receive it; otherwise a precise error naming
/// `what` was asked and the sizes, instead of the client's own "message larger than max".
pub fn receivable<T: prost::Message>(
    answer: T,
    what: impl FnOnce() -> String,
) -> Result<T, ProviderError> {
    let size = answer.encoded_len();
    if size <= CLIENT_RECEIVE_LIMIT {
        return Ok(answer);
    }
    Err(ProviderError::TooLarge(format!(
        "{}: the answer would be {size} bytes, more than the {CLIENT_RECEIVE_LIMIT} bytes cluster-autoscaler's gRPC client accepts; split the node group",
        what()
    )))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use ngo_index::index::InstanceError;
    use prost::Message;

    /// A Cluster API node group id at the longest names Kubernetes allows (63-character
    /// namespace and name).
    fn long_id(n: usize) -> String {
        format!("MachineDeployment/{:a<63}/{:b<58}{n:05}", "ns-", "md-")
    }

    fn running(n: usize) -> ModelInstance {
        ModelInstance {
            id: format!("aws:///eu-central-1a/i-{n:017x}"),
            state: InstanceState::Running,
            error: None,
            machine: Some(format!("{:a<63}/{:b<63}", "ns-", "machine-")),
        }
    }

    #[test]
    fn answers_at_1000_groups_and_10000_nodes_per_group_fit_the_client() {
        let groups = proto::NodeGroupsResponse {
            node_groups: (0..1000)
                .map(|n| proto::NodeGroup {
                    id: long_id(n),
                    min_size: 0,
                    max_size: 10_000,
                    debug: format!("{} (min: 0, max: 10000, replicas: 10000)", long_id(n)),
                })
                .collect(),
        };
        let groups_size = groups.encoded_len();
        assert!(receivable(groups, || "NodeGroups".into()).is_ok());
        // 10,000 nodes, a tenth of them failed with a cloud's message.
        let instances: Vec<proto::Instance> = (0..10_000)
            .map(|n| {
                let mut i = running(n);
                if n % 10 == 0 {
                    i.id = format!("failed-machine-{:a<63}_{:b<58}{n:05}", "ns-", "md-");
                    i.error = Some(InstanceError {
                        code: "ProvisioningFailed".into(),
                        message: "x".repeat(512),
                        class: 99,
                    });
                }
                instance(&i)
            })
            .collect();
        let nodes = proto::NodeGroupNodesResponse { instances };
        let nodes_size = nodes.encoded_len();
        assert!(receivable(nodes, || "NodeGroupNodes".into()).is_ok());
        eprintln!(
            "NodeGroups, 1000 groups: {groups_size} bytes; NodeGroupNodes, 10000 nodes: {nodes_size} bytes"
        );
        assert!(
            groups_size < CLIENT_RECEIVE_LIMIT / 8 && nodes_size < CLIENT_RECEIVE_LIMIT / 2,
            "NodeGroups {groups_size} bytes, NodeGroupNodes {nodes_size} bytes"
        );
    }

    #[test]
    fn an_answer_the_client_cannot_receive_is_refused_with_the_sizes() {
        let instances: Vec<proto::Instance> = (0..100_000).map(|n| instance(&running(n))).collect();
        let nodes = proto::NodeGroupNodesResponse { instances };
        let size = nodes.encoded_len();
        assert!(size > CLIENT_RECEIVE_LIMIT, "{size} bytes");
        let Err(error) = receivable(nodes, || "node group X has 100000 instances".into()) else {
            panic!("an answer of {size} bytes is sent");
        };
        assert_eq!(error.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            error.to_string(),
            format!(
                "node group X has 100000 instances: the answer would be {size} bytes, more than the 4194304 bytes cluster-autoscaler's gRPC client accepts; split the node group"
            )
        );
    }
}
