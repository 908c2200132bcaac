//! A NodePool's servers on Cherry Servers. Membership is by tags, as cluster-autoscaler's
//! in-tree provider keeps it (`k8s-cluster=<cluster>`, `k8s-nodepool=<pool>`), so servers
//! that provider created are adopted; servers this operator creates also carry
//! `k8s-nodegroup-request=<request>`, which finds a server whose create answer was lost.

use std::collections::BTreeMap;

use base64::Engine as _;

use super::{CherryClient, CherryError, ClientConfig, CreateServer, Plan, Server};
use crate::api::nodepool::{CherryServersSpec, MachineType};
use crate::nodepool::backend::{
    BackendError, BackendErrorKind, Created, MachineTypeInfo, NewServer,
};
use crate::nodepool::converge::{Member, MemberPhase};

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

    /// The project's servers tagged for this pool.
    pub async fn members(&self) -> Result<Vec<Member>, BackendError> {
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

    fn is_member(&self, server: &Server) -> bool {
        server.tags.get(CLUSTER_TAG) == Some(&self.cluster)
            && server.tags.get(POOL_TAG) == Some(&self.pool)
    }

    /// The plan: cores, memory and GPUs as capacity, hourly price, stock in the region.
    pub async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError> {
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
            machine_type: machine_type(plan, &self.spec.region),
            in_stock: match region {
                Some(r) => r.stock_qty.map(|q| q > 0),
                None if plan.regions.is_empty() => None,
                None => Some(false),
            },
        })
    }

    /// Orders one server.
    pub async fn create(&self, new: &NewServer) -> Created {
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
    pub async fn delete(&self, id: &str) -> Result<(), BackendError> {
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

/// The pool's machine type from `plan` in `region`.
fn machine_type(plan: &Plan, region: &str) -> MachineType {
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), plan.cpu_cores.to_string()),
        ("memory".to_string(), plan.memory_bytes.to_string()),
        ("pods".to_string(), "110".to_string()),
    ]);
    if plan.gpus > 0 {
        capacity.insert("nvidia.com/gpu".into(), plan.gpus.to_string());
    }
    MachineType {
        name: plan.slug.clone(),
        capacity,
        hourly_price: plan.hourly_price,
        currency: plan.currency.clone(),
        labels: BTreeMap::from([
            (
                "node.kubernetes.io/instance-type".to_string(),
                plan.slug.clone(),
            ),
            ("topology.kubernetes.io/region".to_string(), region.into()),
        ]),
    }
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
