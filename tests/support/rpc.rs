//! Typed calls of the externalgrpc `CloudProvider` service: one method per RPC, taking plain
//! arguments and returning the part of the answer a test asserts on, or the [`Status`] so that
//! tests can assert on its code and message.

use std::ops::Range;

use k8s_pb::api::core::v1 as pb;
use ngo_service::proto::cloud_provider_client::CloudProviderClient;
use ngo_service::proto::{self, ExternalGrpcNode};
use prost::Message;
use tonic::Status;
use tonic::transport::Channel;

/// A `CloudProvider` client. Cloning is cheap: clones share the channel.
#[derive(Clone)]
pub struct Rpc {
    client: CloudProviderClient<Channel>,
}

impl From<CloudProviderClient<Channel>> for Rpc {
    fn from(client: CloudProviderClient<Channel>) -> Self {
        Self { client }
    }
}

impl From<Channel> for Rpc {
    fn from(channel: Channel) -> Self {
        CloudProviderClient::new(channel).into()
    }
}

/// `seconds` since the Unix epoch.
fn timestamp(seconds: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos: 0 })
}

impl Rpc {
    /// The generated client, for requests these methods do not build: metadata, deadlines,
    /// legacy or malformed fields.
    pub fn raw(&self) -> CloudProviderClient<Channel> {
        self.client.clone()
    }

    pub async fn node_groups(&self) -> Result<Vec<proto::NodeGroup>, Status> {
        let response = self.raw().node_groups(proto::NodeGroupsRequest {}).await?;
        Ok(response.into_inner().node_groups)
    }

    /// The group of `node`; `None` when it is not autoscaled: no group or an empty id, as
    /// cluster-autoscaler's `externalgrpc_cloud_provider.go` `NodeGroupForNode` reads it.
    pub async fn node_group_for_node(
        &self,
        node: ExternalGrpcNode,
    ) -> Result<Option<proto::NodeGroup>, Status> {
        let request = proto::NodeGroupForNodeRequest { node: Some(node) };
        let response = self.raw().node_group_for_node(request).await?;
        Ok(response
            .into_inner()
            .node_group
            .filter(|g| !g.id.is_empty()))
    }

    /// The price of `node` over `window` (seconds since the Unix epoch, in the timestamp
    /// fields of cluster-autoscaler 1.35 and later).
    pub async fn pricing_node_price(
        &self,
        node: ExternalGrpcNode,
        window: Range<i64>,
    ) -> Result<f64, Status> {
        let request = proto::PricingNodePriceRequest {
            node: Some(node),
            start_timestamp: timestamp(window.start),
            end_timestamp: timestamp(window.end),
            ..Default::default()
        };
        let response = self.raw().pricing_node_price(request).await?;
        Ok(response.into_inner().price)
    }

    /// The price of `pod` over `window`, as [`Rpc::pricing_node_price`]; the pod goes in
    /// `pod_bytes`.
    pub async fn pricing_pod_price(
        &self,
        pod: &pb::Pod,
        window: Range<i64>,
    ) -> Result<f64, Status> {
        let request = proto::PricingPodPriceRequest {
            pod_bytes: pod.encode_to_vec(),
            start_timestamp: timestamp(window.start),
            end_timestamp: timestamp(window.end),
            ..Default::default()
        };
        let response = self.raw().pricing_pod_price(request).await?;
        Ok(response.into_inner().price)
    }

    pub async fn gpu_label(&self) -> Result<String, Status> {
        let response = self.raw().gpu_label(proto::GpuLabelRequest {}).await?;
        Ok(response.into_inner().label)
    }

    /// The GPU types, sorted (cluster-autoscaler reads only the keys of the answer's map).
    pub async fn get_available_gpu_types(&self) -> Result<Vec<String>, Status> {
        let request = proto::GetAvailableGpuTypesRequest {};
        let response = self.raw().get_available_gpu_types(request).await?;
        let mut types: Vec<_> = response.into_inner().gpu_types.into_keys().collect();
        types.sort();
        Ok(types)
    }

    pub async fn cleanup(&self) -> Result<(), Status> {
        self.raw().cleanup(proto::CleanupRequest {}).await?;
        Ok(())
    }

    pub async fn refresh(&self) -> Result<(), Status> {
        self.raw().refresh(proto::RefreshRequest {}).await?;
        Ok(())
    }

    pub async fn node_group_target_size(&self, id: &str) -> Result<i32, Status> {
        let request = proto::NodeGroupTargetSizeRequest { id: id.into() };
        let response = self.raw().node_group_target_size(request).await?;
        Ok(response.into_inner().target_size)
    }

    pub async fn node_group_increase_size(&self, id: &str, delta: i32) -> Result<(), Status> {
        let request = proto::NodeGroupIncreaseSizeRequest {
            id: id.into(),
            delta,
        };
        self.raw().node_group_increase_size(request).await?;
        Ok(())
    }

    pub async fn node_group_delete_nodes(
        &self,
        id: &str,
        nodes: Vec<ExternalGrpcNode>,
    ) -> Result<(), Status> {
        let request = proto::NodeGroupDeleteNodesRequest {
            id: id.into(),
            nodes,
        };
        self.raw().node_group_delete_nodes(request).await?;
        Ok(())
    }

    /// `delta` is negative, as cluster-autoscaler sends it.
    pub async fn node_group_decrease_target_size(
        &self,
        id: &str,
        delta: i32,
    ) -> Result<(), Status> {
        let request = proto::NodeGroupDecreaseTargetSizeRequest {
            id: id.into(),
            delta,
        };
        self.raw().node_group_decrease_target_size(request).await?;
        Ok(())
    }

    pub async fn node_group_nodes(&self, id: &str) -> Result<Vec<proto::Instance>, Status> {
        let request = proto::NodeGroupNodesRequest { id: id.into() };
        let response = self.raw().node_group_nodes(request).await?;
        Ok(response.into_inner().instances)
    }

    /// The template node, decoded from `nodeBytes`; bytes that are no `v1.Node` are
    /// `Internal`, as tonic reports an undecodable message.
    pub async fn node_group_template_node_info(&self, id: &str) -> Result<pb::Node, Status> {
        let request = proto::NodeGroupTemplateNodeInfoRequest { id: id.into() };
        let response = self.raw().node_group_template_node_info(request).await?;
        pb::Node::decode(response.into_inner().node_bytes.as_slice())
            .map_err(|e| Status::internal(format!("nodeBytes is not a v1.Node: {e}")))
    }

    /// The group's options merged over `defaults`; an answer without options is `Internal`.
    pub async fn node_group_get_options(
        &self,
        id: &str,
        defaults: proto::NodeGroupAutoscalingOptions,
    ) -> Result<proto::NodeGroupAutoscalingOptions, Status> {
        let request = proto::NodeGroupAutoscalingOptionsRequest {
            id: id.into(),
            defaults: Some(defaults),
        };
        let response = self.raw().node_group_get_options(request).await?;
        response
            .into_inner()
            .node_group_autoscaling_options
            .ok_or_else(|| Status::internal("the answer has no nodeGroupAutoscalingOptions"))
    }
}
