//! The pool's status: what a pass did ([`PassReport`]) written as counts, machine type and
//! conditions, and the instance lists a pass records before acting, each write fenced on the
//! instances the pass last saw.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::conditions::conditions;
use super::pass::seen_nodes;
use super::pass_report::PassReport;
use super::{Blocked, PoolController};
use crate::nodepool::backend::pool_key;
use crate::nodepool::converge;
use ngo_api::NodePool;
use ngo_api::conditions::merge;
use ngo_api::nodepool::{InstanceStateName, NodePoolStatus, PoolInstance};
use ngo_index::capi::providerid;
use ngo_index::index::ClusterKey;

impl PoolController {
    /// Records `instances` as the pool's `status.instances`, over the list this pass last saw
    /// there only (see [`guarded_status_patch`]).
    pub(super) async fn patch_instances(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        report: &mut PassReport,
        instances: &[PoolInstance],
    ) -> Result<(), Blocked> {
        let written = guarded_status_patch(
            api,
            &pool.name_any(),
            report.version.clone(),
            &report.recorded,
            json!({"instances": instances}),
        )
        .await
        .map_err(|e| Blocked::Api(format!("recording instances in status: {e}")))?;
        (report.version, report.recorded) = written;
        Ok(())
    }

    /// Writes the pool's status: instances, counts, machine type and conditions.
    pub(super) async fn write_status(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        report: &PassReport,
        blocked: Option<Blocked>,
    ) -> Result<(), kube::Error> {
        let previous = pool.status.clone().unwrap_or_default();
        let instances = report
            .instances
            .clone()
            .unwrap_or_else(|| previous.instances.clone());
        let live = |i: &&PoolInstance| i.state != Some(InstanceStateName::Deleting);
        let replicas = instances.iter().filter(live).count();
        let cluster = ClusterKey {
            namespace: pool.namespace().unwrap_or_default(),
            name: pool.spec.cluster_name.clone(),
        };
        // The pass's own view of the Nodes when it got that far; read here otherwise.
        let read_now;
        let ready_nodes = match &report.nodes {
            Some(nodes) => nodes,
            None => {
                read_now = self
                    .watches
                    .node_cluster(&cluster)
                    .map(|(_, nodes)| seen_nodes(&nodes))
                    .unwrap_or_default();
                &read_now
            }
        };
        let registered = instances
            .iter()
            .filter(live)
            .filter(|i| i.node.is_some())
            .count();
        let ready = instances
            .iter()
            .filter(live)
            .filter_map(|i| ready_nodes.get(providerid::normalize(i.provider_id.as_deref()?)))
            .filter(|n| n.ready)
            .count();
        let desired = usize::try_from(pool.spec.replicas).unwrap_or(0);
        let now = Time(jiff::Timestamp::now());
        let conditions = merge(
            &previous.conditions,
            &conditions(
                &blocked,
                report,
                previous
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "ScaleUpFailed"),
                desired,
                replicas,
                ready,
            ),
            pool.metadata.generation,
            &now,
        );
        let machine_type = report
            .machine_type
            .as_ref()
            .map(|t| t.machine_type.clone())
            .or(previous.machine_type.clone());
        let status = NodePoolStatus {
            observed_generation: pool.metadata.generation,
            conditions,
            backend: report
                .backend
                .map(String::from)
                .or(previous.backend.clone()),
            replicas: i32::try_from(replicas).unwrap_or(i32::MAX),
            registered_replicas: i32::try_from(registered).unwrap_or(i32::MAX),
            ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
            min_size: pool.spec.min_size,
            max_size: pool.spec.max_size,
            backend_min_size: report
                .backend_bounds
                .map(|b| b.0)
                .or(previous.backend_min_size),
            backend_max_size: report
                .backend_bounds
                .map(|b| b.1)
                .or(previous.backend_max_size),
            instances,
            machine_type,
            last_scale_up_time: if report.scaled_up {
                Some(now.clone())
            } else {
                previous.last_scale_up_time.clone()
            },
            last_scale_down_time: if report.scaled_down {
                Some(now.clone())
            } else {
                previous.last_scale_down_time.clone()
            },
        };
        if pool.status.as_ref() == Some(&status) {
            return Ok(());
        }
        match guarded_status_patch(
            api,
            &pool.name_any(),
            report.version.clone(),
            &report.recorded,
            json!(status),
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(StatusWriteError::Fenced) => {
                tracing::info!(pool = %pool_key(pool), "another reconciler wrote this pool's instances meanwhile; leaving its status to it");
                Ok(())
            }
            Err(StatusWriteError::Api(e)) => Err(e),
        }
    }
}

/// Why a guarded status write did not land.
#[derive(Debug, thiserror::Error)]
enum StatusWriteError {
    /// Someone else changed `status.instances` since this pass saw them.
    #[error(
        "another reconciler changed the pool's instances since this pass read them; the next pass decides again"
    )]
    Fenced,
    /// The API call failed.
    #[error(transparent)]
    Api(#[from] kube::Error),
}

/// Conflicts a guarded status write retries (each after a spec, ledger or status change that
/// left the instances alone, such as a DeleteNodes).
const STATUS_CONFLICTS: u32 = 10;

/// Merges `status` into pool `name`'s status, only while its `status.instances` still are
/// `recorded` (what the pass last saw or wrote): the write carries `version`; on a conflict
/// the pool is read again, and the write retried with its new version when the instances are
/// unchanged (a DeleteNodes, or a spec change, moved the version), refused otherwise. Returns
/// the version after the write and the instances as stored (timestamps as the API server
/// keeps them), to compare the next write with.
async fn guarded_status_patch(
    api: &Api<NodePool>,
    name: &str,
    mut version: Option<String>,
    recorded: &[PoolInstance],
    status: serde_json::Value,
) -> Result<(Option<String>, Vec<PoolInstance>), StatusWriteError> {
    let mut attempt = 0;
    loop {
        let body = json!({"metadata": {"resourceVersion": version}, "status": status});
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(pool) => {
                let stored = pool.status.as_ref().map(|s| s.instances.clone());
                return Ok((pool.resource_version(), stored.unwrap_or_default()));
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < STATUS_CONFLICTS => {
                attempt += 1;
                let current = api.get(name).await?;
                let theirs = current.status.as_ref().map(|s| s.instances.as_slice());
                if !converge::intents_may_land(theirs.unwrap_or_default(), recorded) {
                    return Err(StatusWriteError::Fenced);
                }
                version = current.resource_version();
            }
            Err(e) => return Err(e.into()),
        }
    }
}
