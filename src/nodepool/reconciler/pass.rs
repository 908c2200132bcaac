//! One pass over a pool: read it, connect its backend, list its servers, decide
//! ([`converge::decide`]) and act: deletions ([`super::delete`]), creations
//! ([`super::create`]); the outcome goes to the status ([`super::status`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use kube::api::Api;
use kube::{Client, ResourceExt};

use super::delete::add_finalizer;
use super::pass_report::PassReport;
use super::{Blocked, FINALIZER, NODE_POOL_LABEL, PassError, PoolController};
use crate::nodepool::backend::{ConnectError, MachineTypeInfo, PoolBackend, Secrets, pool_key};
use crate::nodepool::converge::{self, Observed, SeenNode};
use crate::nodepool::deletions;
use ngo_api::NodePool;
use ngo_api::nodepool::NO_BACKEND;
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::{LEDGER_ANNOTATION, Ledger};
use ngo_index::index::{ClusterKey, NodeView};
use ngo_service::fault;

impl PoolController {
    /// One pass over pool `namespace/name`; every outcome is reported on the pool.
    /// `outside_backend` says how the index had to clamp its served bounds into the
    /// backend's (`None` when the pool is not served: its spec is checked instead). An error
    /// says the pass should be retried soon: the Kubernetes API or the cloud failed.
    pub async fn reconcile(
        &self,
        namespace: &str,
        name: &str,
        outside_backend: Option<Vec<String>>,
    ) -> Result<(), PassError> {
        let api: Api<NodePool> = Api::namespaced(self.client.clone(), namespace);
        let pool = match api.get_opt(name).await {
            Ok(Some(pool)) => pool,
            Ok(None) => return Ok(()),
            Err(error) => return Err(PassError::Read(error)),
        };
        let mut report = PassReport {
            outside_backend,
            version: pool.resource_version(),
            recorded: pool
                .status
                .as_ref()
                .map(|s| s.instances.clone())
                .unwrap_or_default(),
            ..Default::default()
        };
        let outcome = self.pass(&api, &pool, &mut report).await;
        if let Err(blocked) = &outcome {
            self.report_blocked(&pool, blocked);
        }
        let retry = match &outcome {
            Err(Blocked::Backend(error)) => Some(PassError::Backend(error.to_string())),
            Err(Blocked::Api(message)) => Some(PassError::Api(message.clone())),
            Ok(()) | Err(Blocked::Spec(..)) => None,
        };
        self.write_status(&api, &pool, &report, outcome.err())
            .await
            .map_err(PassError::Status)?;
        retry.map_or(Ok(()), Err)
    }

    async fn pass(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        report: &mut PassReport,
    ) -> Result<(), Blocked> {
        let key = pool_key(pool);
        let connected = self.connect(pool).await?;
        let backend = connected.as_ref();
        report.backend = Some(backend.name());
        report.machine_type = self.machine_type(&key, pool, backend, false).await;
        let members = backend.members().await;
        self.observe(backend, "list", &members);
        let members = members.map_err(Blocked::Backend)?;
        self.metrics.set_backend_available(&key, true);
        let bounds = backend.bounds().await;
        self.observe(backend, "bounds", &bounds);
        report.backend_bounds = bounds.map_err(Blocked::Backend)?;
        self.check_bounds(pool, report);

        if pool.metadata.deletion_timestamp.is_some() {
            return self.finalize(api, pool, backend, &members, report).await;
        }
        if !pool.finalizers().iter().any(|f| f == FINALIZER) {
            add_finalizer(api, pool).await?;
        }

        let (node_cluster, nodes) = self.pool_nodes(pool);
        let ledger = Ledger::parse(
            pool.annotations()
                .get(LEDGER_ANNOTATION)
                .map(String::as_str),
        );
        let previous = pool
            .status
            .as_ref()
            .map(|s| s.instances.clone())
            .unwrap_or_default();
        // Never pushed outside the backend's own bounds, whatever the spec asks.
        let desired = match report.backend_bounds {
            Some((min, max)) if min <= max => pool.spec.replicas.clamp(min, max),
            _ => pool.spec.replicas,
        };
        let mut decision = converge::decide(&Observed {
            desired,
            previous: &previous,
            members: &members,
            ledger: &ledger,
            nodes: &nodes,
            now: jiff::Timestamp::now(),
            max_creates: self.options.max_creates,
        });
        self.report_dropped(pool, &decision.dropped);
        deletions::accept_removals_under_way(&ledger, &mut decision);
        report.nodes = Some(nodes);
        self.apply_creation_failures(pool, backend, &mut decision, report)
            .await;

        let nodes_client = node_cluster.as_ref().map(|(client, _)| client);
        if !decision.delete.is_empty() {
            fault::point("nodepool:before-draining").await;
            let held = self
                .gate_deletions(pool, nodes_client, &ledger, &mut decision)
                .await;
            if !held.is_empty() {
                // Undone before any intent is recorded: the rollback is one write.
                self.apply_deletions(
                    api,
                    pool,
                    &ledger,
                    Vec::new(),
                    held,
                    nodes_client,
                    &mut decision,
                    report,
                )
                .await;
            }
        }
        if !decision.delete.is_empty() {
            // Intent first: a pass killed after this still deletes these, and only these.
            report.instances = Some(decision.instances.clone());
            self.patch_instances(api, pool, report, &decision.instances)
                .await?;
            fault::point("nodepool:after-recording-deletions").await;
            let outcomes = backend.delete_many(&decision.delete).await;
            self.apply_deletions(
                api,
                pool,
                &ledger,
                outcomes,
                Vec::new(),
                nodes_client,
                &mut decision,
                report,
            )
            .await;
            // The outcomes at once: a DeleteNodes call waits for them.
            self.patch_instances(api, pool, report, &decision.instances)
                .await?;
            report.instances = Some(decision.instances.clone());
        }

        if decision.create > 0 && self.watches.shares_node_view() {
            // The token would be of the cluster the operator's own credentials reach.
            self.options
                .ambient
                .check(
                    &pool.namespace().unwrap_or_default(),
                    "a bootstrap token of the cluster the operator itself runs against",
                )
                .map_err(|m| Blocked::Spec(crate::nodepool::ambient::NOT_ALLOWED, m))?;
        }
        if decision.create > 0 {
            let Some((nodes_client, _)) = node_cluster else {
                return Err(Blocked::Spec(
                    "NodesUnreachable",
                    format!(
                        "the Nodes of cluster {}/{} cannot be read yet, so no bootstrap token can be made for new servers",
                        pool.namespace().unwrap_or_default(),
                        pool.spec.cluster_name
                    ),
                ));
            };
            self.create(
                api,
                pool,
                backend,
                &nodes_client,
                &key,
                &mut decision,
                report,
            )
            .await?;
        }
        report.instances = Some(decision.instances);
        Ok(())
    }

    /// The cluster `pool`'s Nodes join (its client and cached Nodes, when it can be reached)
    /// and those Nodes by normalized provider ID.
    #[allow(clippy::type_complexity)]
    pub(super) fn pool_nodes(
        &self,
        pool: &NodePool,
    ) -> (
        Option<(Client, Vec<Arc<NodeView>>)>,
        HashMap<String, SeenNode>,
    ) {
        let cluster = ClusterKey {
            namespace: pool.namespace().unwrap_or_default(),
            name: pool.spec.cluster_name.clone(),
        };
        let node_cluster = self.watches.node_cluster(&cluster);
        let nodes = node_cluster
            .as_ref()
            .map(|(_, nodes)| seen_nodes(nodes))
            .unwrap_or_default();
        (node_cluster, nodes)
    }

    /// The pool's backend, connected by the connector of the cloud its spec names.
    async fn connect(&self, pool: &NodePool) -> Result<Box<dyn PoolBackend>, Blocked> {
        let connector = self
            .connectors
            .iter()
            .find(|c| c.serves(pool))
            .ok_or_else(|| {
                let message = match pool.backend() {
                    Some(field) => format!("this operator cannot run pools on spec.{field}"),
                    None => NO_BACKEND.into(),
                };
                Blocked::Spec("NoBackend", message)
            })?;
        connector
            .connect(pool, &Secrets::of(self.client.clone(), pool))
            .await
            .map_err(|e| match e {
                ConnectError::Spec(reason, message) => Blocked::Spec(reason, message),
                ConnectError::Api(message) => Blocked::Api(message),
            })
    }

    /// The pool's machine type: cached for
    /// [`machine_type_ttl`](super::PoolControllerOptions::machine_type_ttl) unless `fresh`; the
    /// last one known when the backend does not answer.
    pub(super) async fn machine_type(
        &self,
        key: &str,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        fresh: bool,
    ) -> Option<MachineTypeInfo> {
        let machine_type_key = pool
            .server_settings()
            .map(|s| s.machine_type_key)
            .unwrap_or_default();
        let cache_key = format!("{key}|{machine_type_key}");
        let cached = self.cache().get(&cache_key).cloned();
        if let Some((at, info)) = &cached
            && !fresh
            && at.elapsed() < self.options.machine_type_ttl
        {
            return Some(info.clone());
        }
        let result = backend.machine_type().await;
        self.observe(backend, "plans", &result);
        match result {
            Ok(mut info) => {
                info.machine_type
                    .labels
                    .insert(NODE_POOL_LABEL.into(), key.replacen('/', ".", 1));
                self.cache()
                    .insert(cache_key, (Instant::now(), info.clone()));
                Some(info)
            }
            Err(error) => {
                tracing::warn!(%error, pool = key, "cannot read the pool's machine type");
                cached.map(|(_, info)| info)
            }
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, MachineTypeInfo)>> {
        self.machine_types.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub(super) fn seen_nodes(nodes: &[Arc<NodeView>]) -> HashMap<String, SeenNode> {
    nodes
        .iter()
        .filter_map(|n| {
            let pid = n.provider_id.as_deref()?;
            Some((
                providerid::normalize(pid).to_string(),
                SeenNode {
                    name: n.name.clone(),
                    ready: n.ready,
                },
            ))
        })
        .collect()
}
