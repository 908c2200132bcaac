//! A NodePool's servers on Cherry Servers. Membership is by tags, as cluster-autoscaler's
//! in-tree provider keeps it (`k8s-cluster=<cluster>`, `k8s-nodepool=<pool>`), so servers
//! that provider created are adopted; servers this operator creates also carry
//! `k8s-nodegroup-request=<request>`, which finds a server whose create answer was lost.

use std::collections::BTreeMap;

use async_trait::async_trait;
use base64::Engine as _;
use kube::ResourceExt;

use crate::backends::EndpointPolicy;
use crate::nodepool::backend::{
    BackendConnector, BackendError, BackendErrorKind, ConnectError, Created, MachineTypeInfo,
    NewServer, PoolBackend, Secrets, secret_value,
};
use crate::nodepool::converge::{Member, MemberPhase};
use ngo_api::nodepool::{CherryServersSpec, MachineType, NodePool};
use ngo_cloud_cherry::{CherryClient, CherryError, ClientConfig, CreateServer, Plan, Server};
use ngo_index::template::labels::valid_label_value;

/// Tag naming the cluster (in-tree provider's).
pub const CLUSTER_TAG: &str = "k8s-cluster";
/// Tag naming the pool (in-tree provider's).
pub const POOL_TAG: &str = "k8s-nodepool";
/// Tag naming the creation request (ours).
pub const REQUEST_TAG: &str = "k8s-nodegroup-request";
/// Provider ID scheme of Cherry Servers Nodes (cloud-provider-cherry).
pub const PROVIDER_ID_PREFIX: &str = "cherryservers://";

/// A pool's view of its Cherry Servers project.
pub struct CherryPool {
    client: CherryClient,
    spec: CherryServersSpec,
    cluster: String,
    pool: String,
}

impl CherryPool {
    /// Connects pool `pool` of cluster `cluster` with API token `token`.
    pub fn new(
        spec: &CherryServersSpec,
        token: String,
        cluster: &str,
        pool: &str,
    ) -> Result<Self, BackendError> {
        let mut config = ClientConfig {
            token,
            ..Default::default()
        };
        if let Some(endpoint) = &spec.endpoint {
            config.base_url = endpoint.clone();
        }
        let client = CherryClient::new(config).map_err(backend_error)?;
        Ok(Self {
            client,
            spec: spec.clone(),
            cluster: cluster.into(),
            pool: pool.into(),
        })
    }

    fn is_member(&self, server: &Server) -> bool {
        server.tags.get(CLUSTER_TAG) == Some(&self.cluster)
            && server.tags.get(POOL_TAG) == Some(&self.pool)
    }
}

/// Connects the pools whose spec sets `cherryServers`, with the API token of their Secret.
#[derive(Debug, Default)]
pub struct CherryConnector {
    endpoints: EndpointPolicy,
}

impl CherryConnector {
    /// A connector allowing the endpoint overrides `endpoints` allows.
    pub fn new(endpoints: EndpointPolicy) -> Self {
        Self { endpoints }
    }
}

#[async_trait]
impl BackendConnector for CherryConnector {
    fn field(&self) -> &'static str {
        BACKEND_NAME
    }

    fn serves(&self, pool: &NodePool) -> bool {
        pool.spec.cherry_servers.is_some()
    }

    async fn connect(
        &self,
        pool: &NodePool,
        secrets: &Secrets,
    ) -> Result<Box<dyn PoolBackend>, ConnectError> {
        let cherry = pool.spec.cherry_servers.as_ref().ok_or_else(|| {
            ConnectError::Spec("NoBackend", "spec.cherryServers is not set".into())
        })?;
        if let Some(endpoint) = &cherry.endpoint {
            self.endpoints
                .check("spec.cherryServers.endpoint", endpoint)
                .map_err(|m| ConnectError::Spec("EndpointNotAllowed", m))?;
        }
        let reference = &cherry.credentials_secret_ref;
        let secret = secrets
            .get(&reference.name, "spec.cherryServers.credentialsSecretRef")
            .await?;
        let token = secret_value(&secret, &reference.key).ok_or_else(|| {
            ConnectError::Spec(
                "CredentialsMissing",
                format!(
                    "Secret {}/{} has no non-empty key {:?}",
                    secrets.namespace(),
                    reference.name,
                    reference.key
                ),
            )
        })?;
        let backend = CherryPool::new(cherry, token, &pool.spec.cluster_name, &pool.name_any())
            .map_err(|e| ConnectError::Spec("InvalidBackendConfig", e.to_string()))?;
        Ok(Box::new(backend))
    }
}

/// The backend's name (`status.backend`), the spec field naming it.
pub const BACKEND_NAME: &str = "cherryServers";

#[async_trait]
impl PoolBackend for CherryPool {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    /// The project's servers tagged for this pool.
    async fn members(&self) -> Result<Vec<Member>, BackendError> {
        let servers = self
            .client
            .list_servers(self.spec.project_id)
            .await
            .map_err(backend_error)?;
        Ok(servers
            .iter()
            .filter(|s| self.is_member(s))
            .map(member)
            .collect())
    }

    /// The plan: cores, memory and GPUs as capacity, hourly price, stock in the region (of
    /// the spot pool, `spot_qty`, for a pool ordering spot servers; else `stock_qty`).
    async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError> {
        let plans = self.client.list_plans().await.map_err(backend_error)?;
        let plan = plans
            .iter()
            .find(|p| p.slug == self.spec.plan)
            .ok_or_else(|| BackendError {
                kind: BackendErrorKind::Rejected,
                message: format!(
                    "plan {:?} is not offered (known: {})",
                    self.spec.plan,
                    plans
                        .iter()
                        .map(|p| p.slug.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })?;
        let region = plan.regions.iter().find(|r| r.is(&self.spec.region));
        Ok(MachineTypeInfo {
            machine_type: machine_type(plan, &self.spec.region)?,
            in_stock: match region {
                Some(r) => r.stock_for(self.spec.spot_market).map(|q| q > 0),
                None if plan.regions.is_empty() => None,
                None => Some(false),
            },
        })
    }

    /// Orders one server.
    async fn create(&self, new: &NewServer) -> Created {
        let request = CreateServer {
            plan: self.spec.plan.clone(),
            hostname: new.hostname.clone(),
            image: self.spec.image.clone(),
            region: self.spec.region.clone(),
            ssh_keys: self.spec.ssh_key_ids.clone(),
            user_data: base64::engine::general_purpose::STANDARD.encode(&new.user_data),
            tags: BTreeMap::from([
                (CLUSTER_TAG.to_string(), self.cluster.clone()),
                (POOL_TAG.to_string(), self.pool.clone()),
                (REQUEST_TAG.to_string(), new.request.clone()),
            ]),
            os_partition_size: self.spec.os_partition_size,
            spot_market: self.spec.spot_market,
        };
        match self
            .client
            .create_server(self.spec.project_id, &request)
            .await
        {
            Ok(server) => Created::Server(member(&server)),
            Err(error) => Created::from_error(backend_error(error)),
        }
    }

    /// Deletes server `id` (gone already is fine).
    async fn delete(&self, id: &str) -> Result<(), BackendError> {
        let id: i64 = id.parse().map_err(|_| BackendError {
            kind: BackendErrorKind::Rejected,
            message: format!("{id:?} is not a Cherry Servers server id"),
        })?;
        self.client.delete_server(id).await.map_err(backend_error)
    }
}

fn member(server: &Server) -> Member {
    Member {
        id: server.id.to_string(),
        provider_id: format!("{PROVIDER_ID_PREFIX}{}", server.id),
        hostname: server.hostname.clone(),
        phase: match server.state.as_str() {
            "active" | "deployed" => MemberPhase::Active,
            "terminating" | "deleting" | "deleted" => MemberPhase::Terminating,
            _ => MemberPhase::Provisioning,
        },
        request: server.tags.get(REQUEST_TAG).cloned(),
        created: server
            .created_at
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok()),
    }
}

/// The pool's machine type from `plan` in `region`; an error when the plan's memory cannot
/// be read (a template node without it would make cluster-autoscaler scale up for pods that
/// never fit).
///
/// Labels as cluster-autoscaler's in-tree provider gives its template nodes
/// (`cherry_manager_rest.go` `BuildGenericLabels`: `apiv1.LabelInstanceType`, that is
/// `beta.kubernetes.io/instance-type`, set to the plan's *name*), plus the stable
/// `node.kubernetes.io/instance-type` with the same value and the region. A name that is
/// not a valid label value (`Cloud VPS 1` has spaces) could label no Node and match no
/// selector, so the slug stands in for it. The in-tree `pool=<group>` label is not added:
/// only Nodes whose kubelet sets it carry it.
fn machine_type(plan: &Plan, region: &str) -> Result<MachineType, BackendError> {
    let memory = plan.memory_bytes().map_err(|message| BackendError {
        kind: BackendErrorKind::Rejected,
        message,
    })?;
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), plan.cpu_cores.to_string()),
        ("memory".to_string(), memory.to_string()),
        ("pods".to_string(), "110".to_string()),
    ]);
    if plan.gpus > 0 {
        capacity.insert("nvidia.com/gpu".into(), plan.gpus.to_string());
    }
    let instance_type = if valid_label_value(&plan.name) && !plan.name.is_empty() {
        &plan.name
    } else {
        &plan.slug
    };
    Ok(MachineType {
        name: plan.slug.clone(),
        capacity,
        hourly_price: plan.hourly_price,
        currency: plan.currency.clone(),
        labels: BTreeMap::from([
            (
                "beta.kubernetes.io/instance-type".to_string(),
                instance_type.clone(),
            ),
            (
                "node.kubernetes.io/instance-type".to_string(),
                instance_type.clone(),
            ),
            ("topology.kubernetes.io/region".to_string(), region.into()),
        ]),
    })
}

fn backend_error(error: CherryError) -> BackendError {
    let kind = match &error {
        CherryError::Unauthorized(_) => BackendErrorKind::Unauthorized,
        CherryError::OutOfStock(_) => BackendErrorKind::OutOfStock,
        CherryError::RateLimited { .. } | CherryError::Unavailable(_) | CherryError::Decode(_) => {
            BackendErrorKind::Unavailable
        }
        CherryError::NotFound(_) | CherryError::Rejected { .. } | CherryError::InvalidConfig(_) => {
            BackendErrorKind::Rejected
        }
    };
    BackendError {
        kind,
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(value: serde_json::Value) -> Plan {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn instance_type_labels_are_the_in_tree_providers_plan_name() {
        // cluster-autoscaler `cherry_manager_rest.go` `BuildGenericLabels`:
        // `result[apiv1.LabelInstanceType] = plan.Name` (`beta.kubernetes.io/instance-type`).
        let plan = plan_of(serde_json::json!({
            "slug": "e5_1620v4", "name": "E5-1620v4",
            "specs": {"cpus": {"cores": 4}, "memory": {"total": 64, "unit": "GB"}}
        }));
        let machine = machine_type(&plan, "eu_nord_1").unwrap();
        assert_eq!(machine.name, "e5_1620v4");
        assert_eq!(
            machine
                .labels
                .get("beta.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("E5-1620v4")
        );
        assert_eq!(
            machine
                .labels
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("E5-1620v4")
        );
        assert_eq!(machine.capacity["memory"], (64_i64 << 30).to_string());

        // A name no label can carry: the slug.
        let vps = plan_of(serde_json::json!({
            "slug": "cloud_vps_1", "name": "Cloud VPS 1",
            "specs": {"cpus": {"cores": 1}, "memory": {"total": 1, "unit": "GB"}}
        }));
        let machine = machine_type(&vps, "eu_nord_1").unwrap();
        assert_eq!(
            machine.labels["beta.kubernetes.io/instance-type"],
            "cloud_vps_1"
        );
        assert_eq!(
            machine.labels["node.kubernetes.io/instance-type"],
            "cloud_vps_1"
        );
    }

    #[test]
    fn an_unknown_memory_unit_is_an_error_naming_it() {
        let plan = plan_of(serde_json::json!({
            "slug": "x", "name": "X",
            "specs": {"cpus": {"cores": 4}, "memory": {"total": 8, "unit": "GiB"}}
        }));
        let err = machine_type(&plan, "eu_nord_1").unwrap_err();
        assert_eq!(err.kind, BackendErrorKind::Rejected);
        assert!(err.message.contains("\"GiB\""), "{}", err.message);
    }
}
