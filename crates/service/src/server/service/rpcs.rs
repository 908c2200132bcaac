//! cluster-autoscaler's `externalgrpc` RPCs (`CloudProvider`), each answered from one
//! snapshot or through the actuator, by way of the steps in [`super`].

use tonic::Request;

use super::{CloudProviderService, RpcResult, TEMPLATE_GROUP_ANNOTATION, Writes};
use crate::actuate::NodeRef;
use crate::pricing;
use crate::proto::{self, cloud_provider_server::CloudProvider};
use crate::server::convert;
use crate::server::error::ProviderError;
use crate::server::options;
use ngo_index::capi::keys::GPU_LABEL;
use ngo_index::index::NodeGroupLookup;
use ngo_index::template;
use prost::Message as _;
use tracing::Instrument as _;

#[tonic::async_trait]
impl CloudProvider for CloudProviderService {
    async fn node_groups(
        &self,
        request: Request<proto::NodeGroupsRequest>,
    ) -> RpcResult<proto::NodeGroupsResponse> {
        let caller = self.caller(&request);
        self.rpc("NodeGroups", &caller, None, async {
            let (snapshot, scope) = self.visible_snapshot(&caller)?;
            let answer = proto::NodeGroupsResponse {
                node_groups: snapshot
                    .groups
                    .values()
                    .filter(|g| Self::visible(&scope, g))
                    .map(|g| convert::node_group(g))
                    .collect(),
            };
            let visible = answer.node_groups.len();
            convert::receivable(answer, || {
                format!("the caller's Cluster has {visible} node groups")
            })
        })
        .await
    }

    async fn node_group_for_node(
        &self,
        request: Request<proto::NodeGroupForNodeRequest>,
    ) -> RpcResult<proto::NodeGroupForNodeResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("NodeGroupForNode", &caller, None, async {
            let node = request
                .node
                .ok_or_else(|| ProviderError::InvalidArgument("request has no node".into()))?;
            let (snapshot, scope) = self.visible_snapshot(&caller)?;
            // Resolved among the caller's Cluster's objects only: another cluster's node is
            // "not autoscaled" to this caller, as CA expects for nodes of no group.
            let group = match snapshot.group_for_provider_id(&node.provider_id, scope.cluster()) {
                NodeGroupLookup::Group(g) => Some(g),
                NodeGroupLookup::None => None,
                NodeGroupLookup::Ambiguous(_) => Self::group_for_node(&snapshot, &node, &scope)?,
            };
            let group = group.map(|g| convert::node_group(&g)).unwrap_or_default();
            Ok(proto::NodeGroupForNodeResponse {
                node_group: Some(group),
            })
        })
        .await
    }

    async fn pricing_node_price(
        &self,
        request: Request<proto::PricingNodePriceRequest>,
    ) -> RpcResult<proto::PricingNodePriceResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("PricingNodePrice", &caller, None, async {
            let node = request
                .node
                .ok_or_else(|| ProviderError::InvalidArgument("request has no node".into()))?;
            let hours = pricing::window_hours(
                &request.start_timestamp,
                &request.end_timestamp,
                &request.start_time,
                &request.end_time,
            )?;
            let (snapshot, scope) = self.visible_snapshot(&caller)?;
            let group = Self::group_for_node(&snapshot, &node, &scope)?;
            let hourly = group
                .as_deref()
                .and_then(pricing::node_hourly)
                .ok_or_else(|| {
                    ProviderError::NotImplemented(match &group {
                        Some(g) => format!(
                            "node group {} has no price (set spec.pricing on its NodeGroupPolicy)",
                            g.id
                        ),
                        None => {
                            format!("node {:?} belongs to no node group with a price", node.name)
                        }
                    })
                })?;
            Ok(proto::PricingNodePriceResponse {
                price: hourly * hours,
            })
        })
        .await
    }

    async fn pricing_pod_price(
        &self,
        request: Request<proto::PricingPodPriceRequest>,
    ) -> RpcResult<proto::PricingPodPriceResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("PricingPodPrice", &caller, None, async {
            let hours = pricing::window_hours(
                &request.start_timestamp,
                &request.end_timestamp,
                &request.start_time,
                &request.end_time,
            )?;
            let (snapshot, scope) = self.visible_snapshot(&caller)?;
            let prices = pricing::cheapest_resource_prices(
                snapshot.groups.values().filter(|g| Self::visible(&scope, g)),
            )
            .ok_or_else(|| {
                ProviderError::NotImplemented("no NodeGroupPolicy sets per-resource prices".into())
            })?;
            let (field, bytes) = if request.pod_bytes.is_empty() {
                ("pod", &request.pod)
            } else {
                ("pod_bytes", &request.pod_bytes)
            };
            if bytes.is_empty() {
                return Err(ProviderError::InvalidArgument(
                    "request has no pod (neither pod_bytes nor pod is set)".into(),
                ));
            }
            let pod = k8s_pb::api::core::v1::Pod::decode(bytes.as_slice()).map_err(|e| {
                ProviderError::InvalidArgument(format!(
                    "{field} ({} bytes) is not a protobuf v1.Pod: {e}",
                    bytes.len()
                ))
            })?;
            let price = pricing::pod_hourly(&pod, &prices) * hours;
            // The API server never admits such requests; a decoded pod can carry anything.
            if !price.is_finite() || price < 0.0 {
                return Err(ProviderError::InvalidArgument(format!(
                    "the pod's resource requests price at {price}; requests must be finite, non-negative quantities"
                )));
            }
            Ok(proto::PricingPodPriceResponse { price })
        })
        .await
    }

    async fn gpu_label(
        &self,
        request: Request<proto::GpuLabelRequest>,
    ) -> RpcResult<proto::GpuLabelResponse> {
        let caller = self.caller(&request);
        self.rpc("GPULabel", &caller, None, async {
            // Names no group, but answers only clients of a served Cluster, as every RPC.
            self.visible_snapshot(&caller)?;
            Ok(proto::GpuLabelResponse {
                label: GPU_LABEL.into(),
            })
        })
        .await
    }

    async fn get_available_gpu_types(
        &self,
        request: Request<proto::GetAvailableGpuTypesRequest>,
    ) -> RpcResult<proto::GetAvailableGpuTypesResponse> {
        let caller = self.caller(&request);
        self.rpc("GetAvailableGPUTypes", &caller, None, async {
            let (snapshot, scope) = self.visible_snapshot(&caller)?;
            let gpu_types = snapshot
                .groups
                .values()
                .filter(|g| Self::visible(&scope, g))
                .filter_map(|g| {
                    g.template
                        .as_ref()?
                        .hints
                        .gpu
                        .as_ref()
                        .map(|(t, _)| t.clone())
                })
                .map(|t| (t, prost_types::Any::default()))
                .collect();
            Ok(proto::GetAvailableGpuTypesResponse { gpu_types })
        })
        .await
    }

    async fn cleanup(
        &self,
        request: Request<proto::CleanupRequest>,
    ) -> RpcResult<proto::CleanupResponse> {
        let caller = self.caller(&request);
        self.rpc("Cleanup", &caller, None, async {
            self.visible_snapshot(&caller)?;
            Ok(proto::CleanupResponse {})
        })
        .await
    }

    async fn refresh(
        &self,
        request: Request<proto::RefreshRequest>,
    ) -> RpcResult<proto::RefreshResponse> {
        let caller = self.caller(&request);
        // The index is kept current by watches; Refresh only reports whether it is usable, so CA
        // skips a loop instead of acting on an empty view while caches sync.
        self.rpc("Refresh", &caller, None, async {
            self.visible_snapshot(&caller)?;
            Ok(proto::RefreshResponse {})
        })
        .await
    }

    async fn node_group_target_size(
        &self,
        request: Request<proto::NodeGroupTargetSizeRequest>,
    ) -> RpcResult<proto::NodeGroupTargetSizeResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("NodeGroupTargetSize", &caller, None, async {
            let (_, group) = self.scoped_group(&caller, &request.id)?;
            Ok(proto::NodeGroupTargetSizeResponse {
                target_size: group.target,
            })
        })
        .await
    }

    async fn node_group_increase_size(
        &self,
        request: Request<proto::NodeGroupIncreaseSizeRequest>,
    ) -> RpcResult<proto::NodeGroupIncreaseSizeResponse> {
        let caller = self.caller(&request);
        let deadline = Self::deadline(&request);
        let request = request.into_inner();
        let asked = format!("{} by {}", request.id, request.delta);
        let answer = self
            .rpc("NodeGroupIncreaseSize", &caller, Some(asked), async {
                let (_, group) = self.scoped_group(&caller, &request.id)?;
                let id = group.id.clone();
                let target = match &self.writes {
                    Writes::Local(actuator) => {
                        let (actuator, bounds) = (actuator.clone(), deadline.clone());
                        Some(
                            self.detached(async move {
                                actuator.increase_size(&group, request.delta, &bounds).await
                            })
                            .await?,
                        )
                    }
                    Writes::Relayed { forwarder, .. } => forwarder
                        .increase_size(request, &deadline)
                        .await
                        .map_err(ProviderError::Relayed)?,
                };
                if let Some(target) = target {
                    self.await_target(&id, target, &deadline).await;
                }
                Ok((proto::NodeGroupIncreaseSizeResponse {}, target))
            })
            .await;
        Self::with_target(answer)
    }

    async fn node_group_delete_nodes(
        &self,
        request: Request<proto::NodeGroupDeleteNodesRequest>,
    ) -> RpcResult<proto::NodeGroupDeleteNodesResponse> {
        let caller = self.caller(&request);
        let deadline = Self::deadline(&request);
        let request = request.into_inner();
        let asked = format!(
            "{}: {}",
            request.id,
            request
                .nodes
                .iter()
                .map(|n| if n.provider_id.is_empty() {
                    n.name.as_str()
                } else {
                    n.provider_id.as_str()
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        let answer = self
            .rpc("NodeGroupDeleteNodes", &caller, Some(asked), async {
                let (snapshot, group) = self.scoped_group(&caller, &request.id)?;
                let actuator = match &self.writes {
                    Writes::Local(actuator) => actuator.clone(),
                    Writes::Relayed { forwarder, .. } => {
                        let id = group.id.clone();
                        let target = forwarder
                            .delete_nodes(request, &deadline)
                            .await
                            .map_err(ProviderError::Relayed)?;
                        if let Some(target) = target {
                            self.await_target(&id, target, &deadline).await;
                        }
                        return Ok((proto::NodeGroupDeleteNodesResponse {}, target));
                    }
                };
                let nodes: Vec<NodeRef> = request
                    .nodes
                    .iter()
                    .cloned()
                    .map(|n| NodeRef {
                        provider_id: n.provider_id,
                        name: n.name,
                    })
                    .collect();
                if let Some(bad) = nodes.iter().position(|n| n.id().is_empty()) {
                    return Err(ProviderError::InvalidArgument(format!(
                        "node {} of {} has neither providerID nor name",
                        bad + 1,
                        nodes.len()
                    )));
                }
                let id = group.id.clone();
                let mutations = self.mutations.clone();
                let bounds = deadline.clone();
                let deleted = self
                    .detached(async move {
                        let request = actuator.request_id();
                        let mut deleted = actuator
                            .delete_nodes(&snapshot, &group, &nodes, &request, &bounds)
                            .await?;
                        let (finalizers, namespace) = (actuator.clone(), group.namespace.clone());
                        let lowered = std::mem::take(&mut deleted.lowered_machines);
                        mutations.spawn(
                            async move { finalizers.release_finalizers(&namespace, &lowered).await }
                                .in_current_span(),
                        );
                        // A NodePool's cloud removes the instances: report what it refused.
                        actuator
                            .await_pool_removals(&group, &deleted.pool_removals, &bounds)
                            .await?;
                        Ok(deleted)
                    })
                    .await?;
                if let Some(target) = deleted.target {
                    self.await_target(&id, target, &deadline).await;
                }
                Ok((proto::NodeGroupDeleteNodesResponse {}, deleted.target))
            })
            .await;
        Self::with_target(answer)
    }

    async fn node_group_decrease_target_size(
        &self,
        request: Request<proto::NodeGroupDecreaseTargetSizeRequest>,
    ) -> RpcResult<proto::NodeGroupDecreaseTargetSizeResponse> {
        let caller = self.caller(&request);
        let deadline = Self::deadline(&request);
        let request = request.into_inner();
        let asked = format!("{} by {}", request.id, request.delta);
        let answer = self
            .rpc("NodeGroupDecreaseTargetSize", &caller, Some(asked), async {
                let (snapshot, group) = self.scoped_group(&caller, &request.id)?;
                let id = group.id.clone();
                let target = match &self.writes {
                    Writes::Local(actuator) => {
                        let (actuator, bounds) = (actuator.clone(), deadline.clone());
                        Some(
                            self.detached(async move {
                                actuator
                                    .decrease_target_size(&snapshot, &group, request.delta, &bounds)
                                    .await
                            })
                            .await?,
                        )
                    }
                    Writes::Relayed { forwarder, .. } => forwarder
                        .decrease_target_size(request, &deadline)
                        .await
                        .map_err(ProviderError::Relayed)?,
                };
                if let Some(target) = target {
                    self.await_target(&id, target, &deadline).await;
                }
                Ok((proto::NodeGroupDecreaseTargetSizeResponse {}, target))
            })
            .await;
        Self::with_target(answer)
    }

    async fn node_group_nodes(
        &self,
        request: Request<proto::NodeGroupNodesRequest>,
    ) -> RpcResult<proto::NodeGroupNodesResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("NodeGroupNodes", &caller, None, async {
            let (_, group) = self.scoped_group(&caller, &request.id)?;
            let answer = proto::NodeGroupNodesResponse {
                instances: group.instances.iter().map(convert::instance).collect(),
            };
            convert::receivable(answer, || {
                format!(
                    "node group {} has {} instances",
                    group.id,
                    group.instances.len()
                )
            })
        })
        .await
    }

    async fn node_group_template_node_info(
        &self,
        request: Request<proto::NodeGroupTemplateNodeInfoRequest>,
    ) -> RpcResult<proto::NodeGroupTemplateNodeInfoResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("NodeGroupTemplateNodeInfo", &caller, None, async {
            let (_, group) = self.scoped_group(&caller, &request.id)?;
            let inputs = group.template.as_ref().ok_or_else(|| {
                ProviderError::NotImplemented(format!(
                    "node group {} cannot scale from zero: neither capacity annotations nor the infrastructure template give cpu and memory",
                    group.id
                ))
            })?;
            let mut node = template::build_node(&group.name, inputs, jiff::Timestamp::now().as_second());
            if let Some(meta) = node.metadata.as_mut() {
                meta.annotations.insert(TEMPLATE_GROUP_ANNOTATION.into(), group.id.clone());
            }
            let bytes = template::encode_node(&node);
            Ok(proto::NodeGroupTemplateNodeInfoResponse { node_info: bytes.clone(), node_bytes: bytes })
        })
        .await
    }

    async fn node_group_get_options(
        &self,
        request: Request<proto::NodeGroupAutoscalingOptionsRequest>,
    ) -> RpcResult<proto::NodeGroupAutoscalingOptionsResponse> {
        let caller = self.caller(&request);
        let request = request.into_inner();
        self.rpc("NodeGroupGetOptions", &caller, None, async {
            let (_, group) = self.scoped_group(&caller, &request.id)?;
            let defaults = request
                .defaults
                .ok_or_else(|| ProviderError::InvalidArgument("request has no defaults".into()))?;
            let overrides = options::receivable(&defaults, &group.options);
            if overrides.is_empty() {
                return Err(ProviderError::NotImplemented(format!(
                    "node group {} has no option overrides this client can receive",
                    group.id
                )));
            }
            Ok(proto::NodeGroupAutoscalingOptionsResponse {
                node_group_autoscaling_options: Some(options::merge(&defaults, &overrides)),
            })
        })
        .await
    }
}
