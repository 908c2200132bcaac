//! The NodePool reconciler: on the leader, converges each pool's servers towards
//! `spec.replicas` through its backend ([`converge`] decides, this module observes, acts and
//! reports). kube-runtime's [`Controller`] runs the passes: when a pool's spec or scale-down
//! ledger changes and every [`PoolControllerOptions::interval`] otherwise, side by side over
//! pools and one at a time per pool ([`PoolController::run`]).
//!
//! Intent is written before it is acted on, so a pass killed at any point is finished by the
//! next one, on this replica or another: a creation is recorded in `status.instances` before
//! the create call (a lost answer is matched by the server's request tag), a deletion before
//! the delete call. Pools are deleted with their servers (finalizer).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::api::NodePool;
use crate::api::conditions::{ConditionStatus, DesiredCondition, merge};
use crate::api::nodepool::{
    DeletionOutcome, InstanceErrorStatus, InstanceStateName, NO_BACKEND, NodePoolStatus,
    PoolInstance,
};
use crate::capi::providerid;
use crate::capi::scale_down::{LEDGER_ANNOTATION, Ledger, pool_instance_key, request_id};
use crate::duration;
use crate::events::{EventPublisher, Severity};
use crate::fault;
use crate::nodepool::backend::{
    BackendConnector, BackendError, ConnectError, Created, CreationFailure, MachineTypeInfo,
    NewServer, PoolBackend, Secrets, pool_key,
};
use crate::nodepool::converge::{self, Decision, Dropped, Observed, SeenNode};
use crate::nodepool::drain::{self, Gate};
use crate::nodepool::{bootstrap, deletions, render, view};

use super::nodes::WatchedNode;
use super::watches::Watches;
use crate::index::{BACKEND_BOUNDS_FIELD, ClusterKey, SnapshotHandle};
use crate::metrics::Metrics;

/// How long a burst of changes to one pool is collected into one pass.
const COALESCE: Duration = Duration::from_millis(200);
/// How long shutdown waits for running passes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Longest one cluster's sweep of expired bootstrap tokens may take; one that takes longer is
/// given up until the next sweep.
const TOKEN_SWEEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Finalizer that deletes a pool's servers before the pool goes.
pub const FINALIZER: &str = "autoscaling.nodegroup.dev/servers";
/// Label added to every Node a pool's servers register (`<namespace>.<name>` of the pool).
pub const NODE_POOL_LABEL: &str = "autoscaling.nodegroup.dev/node-pool";
/// `InvalidSpec` reason (and Event reason) of a pool whose min/max lie outside the
/// backend's own bounds (an ESS scaling group's MinSize/MaxSize).
pub const SIZE_OUTSIDE_BACKEND: &str = "SizeOutsideScalingGroup";

/// How the reconciler runs.
#[derive(Clone, Debug)]
pub struct PoolControllerOptions {
    /// Longest time between two passes over a pool.
    pub interval: Duration,
    /// Most servers one pass creates for a pool.
    pub max_creates: usize,
    /// How long a machine type read from the backend is reused.
    pub machine_type_ttl: Duration,
    /// Most passes (over different pools) running at once.
    pub concurrency: usize,
    /// Name of this replica, in creation request ids.
    pub instance: String,
    /// Which namespaces' pools may have a bootstrap token of a shared cluster minted.
    pub ambient: crate::nodepool::ambient::AmbientPolicy,
}

impl Default for PoolControllerOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(15),
            max_creates: 10,
            machine_type_ttl: Duration::from_secs(600),
            concurrency: 8,
            instance: format!("ngo-{}", std::process::id()),
            ambient: crate::nodepool::ambient::AmbientPolicy::default(),
        }
    }
}

/// The reconciler.
pub struct PoolController {
    client: Client,
    watches: Watches,
    events: EventPublisher,
    metrics: Arc<Metrics>,
    options: PoolControllerOptions,
    machine_types: Mutex<HashMap<String, (Instant, MachineTypeInfo)>>,
    /// One per cloud: connects the pools that name it.
    connectors: Vec<Box<dyn BackendConnector>>,
}

/// The running sweeps of expired bootstrap tokens, one task per cluster; aborted when
/// dropped.
#[derive(Default)]
struct TokenSweeps {
    running: HashMap<String, tokio::task::JoinHandle<()>>,
}

impl TokenSweeps {
    /// Forgets the sweeps that ended.
    fn forget_finished(&mut self) {
        self.running.retain(|_, sweep| !sweep.is_finished());
    }

    /// True while the sweep started under `key` runs.
    fn running(&self, key: &str) -> bool {
        self.running
            .get(key)
            .is_some_and(|sweep| !sweep.is_finished())
    }

    /// Starts sweeping the cluster that holds the Nodes of `cluster` with `client`, under
    /// `key`, unless the last sweep under `key` still runs; the sweep is given up after
    /// `timeout`. Returns whether it started.
    fn start(
        &mut self,
        key: String,
        cluster: ClusterKey,
        client: Client,
        timeout: Duration,
    ) -> bool {
        if self.running(&key) {
            return false;
        }
        let sweep = tokio::spawn(async move {
            match tokio::time::timeout(timeout, bootstrap::delete_expired(&client)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    tracing::info!(deleted = n, %cluster, "expired bootstrap tokens deleted")
                }
                Ok(Err(error)) => {
                    tracing::warn!(%error, %cluster, "cannot delete expired bootstrap tokens")
                }
                Err(_) => tracing::warn!(
                    %cluster,
                    ?timeout,
                    "deleting expired bootstrap tokens took too long; given up until the next sweep"
                ),
            }
        });
        self.running.insert(key, sweep);
        true
    }
}

impl Drop for TokenSweeps {
    fn drop(&mut self) {
        for sweep in self.running.values() {
            sweep.abort();
        }
    }
}

/// Shared by the passes of one leadership term.
struct PassContext {
    controller: Arc<PoolController>,
    snapshots: SnapshotHandle,
    /// Bounds the passes running at once over every watched scope.
    permits: Semaphore,
    /// Failed passes in a row, per pool, for [`retry_after`].
    failures: Mutex<HashMap<String, u32>>,
}

impl PassContext {
    /// How many passes hold a permit, out of `concurrency`.
    fn permits_in_use(&self, concurrency: usize) -> usize {
        concurrency.saturating_sub(self.permits.available_permits())
    }

    /// Records a pass's outcome; returns the failures in a row so far.
    fn record(&self, key: &str, failed: bool) -> u32 {
        let mut failures = self
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failed {
            let count = failures.entry(key.to_string()).or_default();
            *count = count.saturating_add(1);
            *count
        } else {
            failures.remove(key);
            0
        }
    }
}

/// Why a pass asks to be retried before its pool's next regular pass.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The pool could not be read.
    #[error("reading the NodePool: {0}")]
    Read(#[source] kube::Error),
    /// The status could not be written.
    #[error("writing the NodePool status: {0}")]
    Status(#[source] kube::Error),
    /// The Kubernetes API failed during the pass.
    #[error("{0}")]
    Api(String),
    /// The cloud refused or did not answer.
    #[error("{0}")]
    Backend(String),
}

/// First wait before retrying a failed pass; doubled per failure in a row, up to the
/// controller's interval.
const FIRST_RETRY: Duration = Duration::from_secs(2);

/// The controller's reconcile function: one pass over `pool`, after a permit.
async fn run_pass(pool: Arc<NodePool>, context: Arc<PassContext>) -> Result<Action, PassError> {
    let Ok(_permit) = context.permits.acquire().await else {
        return Ok(Action::await_change());
    };
    let this = &context.controller;
    let outside_backend = outside_backend(&context.snapshots, &pool);
    let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
    let outcome = this.reconcile(&namespace, &name, outside_backend).await;
    context.record(&pool_key(&pool), outcome.is_err());
    outcome.map(|()| Action::requeue(this.options.interval))
}

/// The controller's error policy: retries a failed pass after [`FIRST_RETRY`], doubled for
/// each failure in a row, at most the regular interval.
fn retry_after(pool: Arc<NodePool>, error: &PassError, context: Arc<PassContext>) -> Action {
    let failures = context
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&pool_key(&pool))
        .copied()
        .unwrap_or(1);
    let wait = backoff(failures, context.controller.options.interval);
    tracing::warn!(pool = %pool_key(&pool), %error, retry_in = ?wait, "NodePool pass failed");
    Action::requeue(wait)
}

/// The wait before retrying after `failures` failed passes in a row: [`FIRST_RETRY`] doubled
/// per failure after the first, at most `interval`.
fn backoff(failures: u32, interval: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_RETRY.saturating_mul(1 << doublings).min(interval)
}

/// Logs what the controller reports besides passes: watch errors, and passes for pools no
/// longer cached. Failed passes are logged by [`retry_after`].
fn log_controller_error(error: &controller::Error<PassError, watcher::Error>) {
    match error {
        controller::Error::ReconcilerFailed(..) => {}
        controller::Error::ObjectNotFound(object) => {
            tracing::debug!(%object, "NodePool gone before its pass");
        }
        controller::Error::QueueError(error) => {
            tracing::warn!(%error, "watching NodePools failed; retrying");
        }
        controller::Error::RunnerError(error) => {
            tracing::error!(%error, "the NodePool controller's scheduler failed");
        }
    }
}

/// Why a pass stopped early; reported on the pool.
#[derive(Debug)]
enum Blocked {
    /// The spec cannot be acted on (reason, message).
    Spec(&'static str, String),
    /// The backend refused or did not answer.
    Backend(BackendError),
    /// The Kubernetes API failed; retried next pass.
    Api(String),
}

impl PoolController {
    /// A reconciler using `client` for pools and Secrets, `watches` for pools and Nodes, and
    /// `connectors` for the clouds pools run on.
    pub fn new(
        client: Client,
        watches: Watches,
        events: EventPublisher,
        metrics: Arc<Metrics>,
        options: PoolControllerOptions,
        connectors: Vec<Box<dyn BackendConnector>>,
    ) -> Self {
        Self {
            client,
            watches,
            events,
            metrics,
            options,
            machine_types: Mutex::default(),
            connectors,
        }
    }

    /// Reconciles every pool for one leadership term (see [`super::leader::while_leading`]),
    /// until `term` is cancelled, with one kube-runtime [`Controller`] per watched scope:
    /// - a pass is due when a pool's generation, scale-down ledger or deletion changes
    ///   ([`pass_trigger`]; the pass's own status writes do not trigger one), and
    ///   [`PoolControllerOptions::interval`] after the last pass otherwise;
    /// - up to [`PoolControllerOptions::concurrency`] passes run at once over all scopes, never
    ///   two over one pool, so a pool whose cloud does not answer holds back no other pool;
    /// - a pass that fails on the Kubernetes API or the cloud is retried with a per-pool
    ///   backoff ([`retry_after`]);
    /// - at the end of the term no new pass starts and running passes get up to
    ///   [`SHUTDOWN_GRACE`] to end; the rest are dropped, which their pools' next pass (on any
    ///   replica) finishes like a crash.
    ///
    /// A term starts with a pass over every pool.
    pub async fn run(
        self: Arc<Self>,
        snapshots: SnapshotHandle,
        term: CancellationToken,
    ) -> anyhow::Result<()> {
        let concurrency = self.options.concurrency.max(1);
        let context = Arc::new(PassContext {
            controller: self.clone(),
            snapshots,
            permits: Semaphore::new(concurrency),
            failures: Mutex::default(),
        });
        let controllers = self.watches.node_pool_apis().into_iter().map(|api| {
            let (reader, writer) = reflector::store();
            let trigger = watcher(api, watcher::Config::default())
                .default_backoff()
                .modify(|pool: &mut NodePool| pool.managed_fields_mut().clear())
                .reflect(writer)
                .applied_objects()
                .predicate_filter(pass_trigger, PredicateConfig::default());
            Controller::for_stream(trigger, reader)
                .with_config(
                    controller::Config::default()
                        .concurrency(u16::try_from(concurrency).unwrap_or(u16::MAX))
                        .debounce(COALESCE),
                )
                .graceful_shutdown_on(term.clone().cancelled_owned())
                .run(run_pass, retry_after, context.clone())
                .for_each(|outcome| async move {
                    if let Err(error) = outcome {
                        log_controller_error(&error);
                    }
                })
        });
        let controllers = futures::future::join_all(controllers);
        tokio::pin!(controllers);
        tokio::select! {
            _ = &mut controllers => return Ok(()),
            () = self.housekeeping(&context, &term) => {}
        }
        // The term ended: no new pass starts; running ones get the grace period.
        if tokio::time::timeout(SHUTDOWN_GRACE, controllers)
            .await
            .is_err()
        {
            let running = context.permits_in_use(concurrency);
            tracing::warn!(running, grace = ?SHUTDOWN_GRACE, "NodePool passes still running at shutdown are cut off");
        }
        Ok(())
    }

    /// Every [`PoolControllerOptions::interval`] until `term` ends: forgets the pools that are
    /// gone (their metrics, failure counts and cached backend connections) and sweeps expired
    /// bootstrap tokens.
    async fn housekeeping(&self, context: &PassContext, term: &CancellationToken) {
        let mut known: HashSet<String> = HashSet::new();
        let mut token_sweeps = TokenSweeps::default();
        let mut ticks = tokio::time::interval(self.options.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = term.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let pools = self.watches.node_pools();
            let current: HashSet<String> = pools.iter().map(|p| pool_key(p)).collect();
            for gone in known.difference(&current) {
                context.record(gone, false);
                self.metrics.forget_pool(gone);
                for connector in &self.connectors {
                    connector.forget(gone);
                }
            }
            known = current;
            self.sweep_expired_tokens(&pools, &mut token_sweeps);
        }
    }

    /// Sweeps away the expired bootstrap tokens minted for `pools`, once per cluster their
    /// Nodes join (kube-controller-manager's token cleaner is off by default). Each cluster is
    /// swept by a task of its own ([`TokenSweeps`]): a cluster that does not answer holds back
    /// neither the other clusters nor this loop.
    fn sweep_expired_tokens(&self, pools: &[Arc<NodePool>], sweeps: &mut TokenSweeps) {
        sweeps.forget_finished();
        for pool in pools {
            let cluster = ClusterKey {
                namespace: pool.namespace().unwrap_or_default(),
                name: pool.spec.cluster_name.clone(),
            };
            // One Node view shared by every cluster: one sweep covers them all.
            let key = if self.watches.shares_node_view() {
                String::new()
            } else {
                cluster.to_string()
            };
            if sweeps.running(&key) {
                continue;
            }
            let Some((client, _)) = self.watches.node_cluster(&cluster) else {
                continue;
            };
            sweeps.start(key, cluster, client, TOKEN_SWEEP_TIMEOUT);
        }
    }

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

    /// Creates `decision.create` servers, recording each before its create call.
    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        nodes_client: &Client,
        key: &str,
        decision: &mut Decision,
        report: &mut PassReport,
    ) -> Result<(), Blocked> {
        let count = decision.create;
        // Fresh stock before ordering: no call is made for a plan that is known to be out.
        report.machine_type = self.machine_type(key, pool, backend, true).await;
        let in_stock = report.machine_type.as_ref().and_then(|t| t.in_stock);
        let now = Time(jiff::Timestamp::now());
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        if in_stock == Some(false) {
            let message = format!(
                "the backend reports no stock for the pool's machine type in its region; {count} server(s) not ordered"
            );
            for _ in 0..count {
                let request = request_id(&self.options.instance);
                decision.instances.push(failed_entry(
                    &namespace,
                    &name,
                    request,
                    now.clone(),
                    "OutOfStock",
                    &message,
                    crate::nodepool::backend::OUT_OF_RESOURCES,
                ));
            }
            report.create_failure = Some(("OutOfStock".into(), message.clone()));
            self.event(pool, Severity::Warning, "ScaleUpFailed", "Create", message);
            return Ok(());
        }

        let spec = ServerSpec::of(pool)?;
        let ttl = spec.token_ttl;
        let token = bootstrap::mint(
            nodes_client,
            &format!("{namespace}.{name}"),
            ttl,
            &spec.extra_groups,
        )
        .await
        .map_err(|e| {
            let hint = match &e {
                kube::Error::Api(status) if status.code == 403 => {
                    " (the chart grants it with nodePools.bootstrapTokens=true)"
                }
                _ => "",
            };
            Blocked::Api(format!("creating a bootstrap token: {e}{hint}"))
        })?;
        let mut labels = pool
            .spec
            .template
            .as_ref()
            .map(|t| t.labels.clone())
            .unwrap_or_default();
        labels.insert(NODE_POOL_LABEL.into(), format!("{namespace}.{name}"));
        let mut servers = Vec::with_capacity(count);
        for _ in 0..count {
            let hostname = render::hostname(&spec.hostname_pattern, &pool.spec.cluster_name, &name)
                .map_err(|m| Blocked::Spec("InvalidHostnamePattern", m))?;
            let values = BTreeMap::from([
                ("BootstrapToken", token.token()),
                ("BootstrapTokenID", token.id.clone()),
                ("BootstrapTokenSecret", token.secret.clone()),
                ("APIServerEndpoint", spec.api_server_endpoint.clone()),
                ("ClusterName", pool.spec.cluster_name.clone()),
                ("NodeGroup", name.clone()),
                ("NodePool", name.clone()),
                ("Hostname", hostname.clone()),
                ("NodeLabels", render::node_labels(&labels)),
            ]);
            let user_data = render::render(&spec.user_data, &values)
                .map_err(|m| Blocked::Spec("InvalidUserData", m))?;
            servers.push(NewServer {
                request: request_id(&self.options.instance),
                hostname,
                user_data,
            });
        }
        let first_new = decision.instances.len();
        for server in &servers {
            decision.instances.push(PoolInstance {
                hostname: server.hostname.clone(),
                state: Some(InstanceStateName::Creating),
                request: server.request.clone(),
                created: Some(now.clone()),
                ..Default::default()
            });
        }
        // Intent first: a server whose create answer is lost is found by its request tag.
        self.patch_instances(api, pool, report, &decision.instances)
            .await?;
        report.instances = Some(decision.instances.clone());
        fault::point("nodepool:after-recording-creations").await;

        let mut created = 0;
        let mut deferred = Vec::new();
        let outcomes = backend.create_many(&servers).await;
        for (k, (server, outcome)) in servers.iter().zip(outcomes).enumerate() {
            let entry = &mut decision.instances[first_new + k];
            match outcome {
                Created::Server(member) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "ok");
                    entry.id = Some(member.id.clone());
                    entry.provider_id = Some(member.provider_id.clone());
                    entry.hostname = member.hostname.clone();
                    created += 1;
                }
                Created::Failed {
                    class,
                    code,
                    message,
                } => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", &code);
                    *entry = failed_entry(
                        &namespace,
                        &name,
                        server.request.clone(),
                        now.clone(),
                        &code,
                        &message,
                        class,
                    );
                    report.create_failure = Some((code, message));
                }
                Created::Unknown(message) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "Unknown");
                    self.event(pool, Severity::Warning, "ServerCreateUnconfirmed", "Create",
                        format!("create of {} (request {}) got no answer: {message}; its server is looked for by its request (tag or scaling activity) until {}s after the request",
                            server.hostname, server.request, converge::CREATE_GRACE.as_secs()));
                }
                Created::Accepted(_) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "ok");
                    created += 1;
                }
                Created::Deferred(message) => {
                    self.metrics
                        .observe_backend_call(backend.name(), "create", "Deferred");
                    deferred.push((first_new + k, message));
                }
            }
        }
        if let Some((_, message)) = deferred.first() {
            self.event(
                pool,
                Severity::Normal,
                "ScaleUpDeferred",
                "Create",
                format!(
                    "{} server(s) not ordered yet: {message}; the next pass tries again",
                    deferred.len()
                ),
            );
        }
        // Nothing was sent for these: forget them, and record that.
        for (index, _) in deferred.iter().rev() {
            decision.instances.remove(*index);
        }
        if !deferred.is_empty() {
            self.patch_instances(api, pool, report, &decision.instances)
                .await?;
            report.instances = Some(decision.instances.clone());
        }
        fault::point("nodepool:after-creating-servers").await;
        report.created = created > 0;
        if created > 0 {
            report.scaled_up = true;
            self.event(
                pool,
                Severity::Normal,
                "ServersCreated",
                "Create",
                format!("ordered {created} server(s) for {count} missing"),
            );
        }
        if let Some((code, message)) = &report.create_failure {
            self.event(
                pool,
                Severity::Warning,
                "ScaleUpFailed",
                "Create",
                format!(
                    "{} server(s) not created: {code}: {message}",
                    count - created
                ),
            );
        }
        Ok(())
    }

    /// Deletes every server of a pool being deleted, then lets the pool go.
    async fn finalize(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        members: &[converge::Member],
        report: &mut PassReport,
    ) -> Result<(), Blocked> {
        let live: Vec<_> = members
            .iter()
            .filter(|m| m.phase != converge::MemberPhase::Terminating)
            .collect();
        // Drained first, as Cluster API drains the Machines of a deleted MachineDeployment;
        // Nodes that cannot be reached are not waited for.
        let (node_cluster, nodes) = self.pool_nodes(pool);
        let mut ids: Vec<String> = Vec::new();
        for member in &live {
            let node = nodes.get(providerid::normalize(&member.provider_id));
            let gate = match (node, &node_cluster) {
                (Some(node), Some((client, _))) => drain::prepare(client, &node.name, false).await,
                _ => Ok(Gate::Proceed),
            };
            match gate {
                Ok(Gate::Proceed) => ids.push(member.id.clone()),
                Ok(Gate::Draining(message) | Gate::NotHeld(message)) => {
                    self.event(pool, Severity::Normal, "DrainWaiting", "Delete", message);
                }
                Err(error) => {
                    self.event(
                        pool,
                        Severity::Warning,
                        "DrainFailed",
                        "Delete",
                        format!(
                            "draining the node of server {}: {error}; retrying next pass",
                            member.id
                        ),
                    );
                }
            }
        }
        for (_, result) in backend.delete_many(&ids).await {
            self.observe(backend, "delete", &result);
            result.map_err(Blocked::Backend)?;
        }
        report.scaled_down = !live.is_empty();
        if members.is_empty() && pool.finalizers().iter().any(|f| f == FINALIZER) {
            let finalizers: Vec<&String> = pool
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .collect();
            api.patch(
                &pool.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {
                    "finalizers": finalizers,
                    "resourceVersion": pool.resource_version(),
                }})),
            )
            .await
            .map_err(|e| Blocked::Api(format!("removing finalizer: {e}")))?;
        }
        Ok(())
    }

    /// The cluster `pool`'s Nodes join (its client and cached Nodes, when it can be reached)
    /// and those Nodes by normalized provider ID.
    #[allow(clippy::type_complexity)]
    fn pool_nodes(
        &self,
        pool: &NodePool,
    ) -> (
        Option<(Client, Vec<Arc<WatchedNode>>)>,
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

    /// Checks, cordons and drains the Node of each server `decision` deletes
    /// ([`drain::prepare`]), leaving in `decision.delete` only those ready to go: a server
    /// whose Node still has pods stays `Deleting` for a later pass. Returns the servers whose
    /// deletion cluster-autoscaler asked for and has given up since (id, why), to roll back.
    /// `nodes_client`: the cluster the pool's Nodes join, when it can be reached.
    async fn gate_deletions(
        &self,
        pool: &NodePool,
        nodes_client: Option<&Client>,
        ledger: &Ledger,
        decision: &mut Decision,
    ) -> Vec<(String, String)> {
        let mut held = Vec::new();
        let mut ready = Vec::new();
        for id in std::mem::take(&mut decision.delete) {
            let Some(entry) = decision
                .instances
                .iter()
                .find(|i| i.id.as_deref() == Some(id.as_str()))
            else {
                ready.push(id);
                continue;
            };
            let asked = entry
                .provider_id
                .as_deref()
                .and_then(|pid| ledger.get(&pool_instance_key(pid)));
            let accepted = entry.deletion.as_ref().is_some_and(|d| {
                d.outcome == DeletionOutcome::Accepted
                    && asked.is_some_and(|a| a.request == d.request)
            });
            // The cloud took the server already (a lost answer, or not yet listed as
            // terminating): nothing to drain any more.
            let node = entry.node.clone().filter(|_| !accepted);
            let Some(node) = node else {
                ready.push(id);
                continue;
            };
            let Some(client) = nodes_client else {
                self.event(
                    pool,
                    Severity::Warning,
                    "DrainWaiting",
                    "Delete",
                    format!("server {id} not deleted yet: the Nodes of its cluster cannot be reached to drain node {node}"),
                );
                continue;
            };
            match drain::prepare(client, &node, asked.is_some()).await {
                Ok(Gate::Proceed) => ready.push(id),
                Ok(Gate::NotHeld(why)) => {
                    tracing::warn!(pool = %pool_key(pool), server = %id, %why, "deletion undone");
                    held.push((id, why));
                }
                Ok(Gate::Draining(message)) => {
                    tracing::info!(pool = %pool_key(pool), server = %id, %message, "server waits for its node's drain");
                    self.event(pool, Severity::Normal, "DrainWaiting", "Delete", message);
                }
                Err(error) => {
                    tracing::warn!(pool = %pool_key(pool), server = %id, %error, "cannot drain the server's node; retrying next pass");
                    self.event(
                        pool,
                        Severity::Warning,
                        "DrainFailed",
                        "Delete",
                        format!("draining node {node} of server {id}: {error}; retrying next pass"),
                    );
                }
            }
        }
        decision.delete = ready;
        held
    }

    /// Records the deletions' outcomes ([`deletions::apply`]) and reports them: a metric per
    /// call, an Event per outcome.
    #[allow(clippy::too_many_arguments)]
    async fn apply_deletions(
        &self,
        api: &Api<NodePool>,
        pool: &NodePool,
        ledger: &Ledger,
        outcomes: Vec<(String, Result<(), BackendError>)>,
        held: Vec<(String, String)>,
        nodes_client: Option<&Client>,
        decision: &mut Decision,
        report: &mut PassReport,
    ) {
        let backend = pool.backend().unwrap_or_default();
        for (_, result) in &outcomes {
            let outcome = match result {
                Ok(()) => "ok",
                Err(e) => e.kind.as_str(),
            };
            self.metrics
                .observe_backend_call(backend, "delete", outcome);
        }
        let applied = deletions::apply(
            api,
            pool,
            ledger,
            outcomes,
            held,
            decision,
            report.nodes.as_ref(),
        )
        .await;
        report.scaled_down |= applied.deleted;
        if let Some(client) = nodes_client {
            for node in &applied.kept_nodes {
                if let Err(error) = drain::release(client, node).await {
                    tracing::warn!(pool = %pool_key(pool), node, %error, "cannot uncordon the node of a server kept; uncordon it by hand");
                }
            }
        }
        for note in applied.notes {
            self.event(pool, note.severity, note.reason, "Delete", note.message);
        }
    }

    /// Records in `report` (and reports, when it starts) a min/max outside the backend's own
    /// bounds: the pool's served bounds, or the spec's when it is not served.
    fn check_bounds(&self, pool: &NodePool, report: &mut PassReport) {
        let Some((backend_min, backend_max)) = report.backend_bounds else {
            return;
        };
        let message = match &report.outside_backend {
            Some(served) if served.is_empty() => None,
            Some(served) => Some(served.join("; ")),
            None => converge::size_outside(
                (pool.spec.min_size, pool.spec.max_size),
                (backend_min, backend_max),
            ),
        };
        let Some(message) = message else {
            return;
        };
        let already = pool.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "InvalidSpec" && c.reason == SIZE_OUTSIDE_BACKEND && c.message == message
            })
        });
        if !already {
            tracing::warn!(pool = %pool_key(pool), %message, "NodePool size bounds outside the backend's");
            self.event(
                pool,
                Severity::Warning,
                SIZE_OUTSIDE_BACKEND,
                "Reconcile",
                message.clone(),
            );
        }
        self.metrics.observe_backend_call(
            pool.backend().unwrap_or_default(),
            "bounds",
            SIZE_OUTSIDE_BACKEND,
        );
        report.size_violation = Some(message);
    }

    /// Turns the in-flight creations the backend reports failed into failed instances,
    /// reported to cluster-autoscaler (and as `ScaleUpFailed`) like a refused create.
    async fn apply_creation_failures(
        &self,
        pool: &NodePool,
        backend: &dyn PoolBackend,
        decision: &mut Decision,
        report: &mut PassReport,
    ) {
        let in_flight: Vec<String> = decision
            .instances
            .iter()
            .filter(|i| i.id.is_none() && i.state == Some(InstanceStateName::Creating))
            .map(|i| i.request.clone())
            .collect();
        if in_flight.is_empty() || !backend.reports_late_failures() {
            return;
        }
        let failures = backend.creation_failures(&in_flight).await;
        self.observe(backend, "activities", &failures);
        let failures: Vec<CreationFailure> = match failures {
            Ok(f) => f,
            Err(error) => {
                tracing::warn!(%error, pool = %pool_key(pool), "cannot tell which creations failed; asking again next pass");
                return;
            }
        };
        let (namespace, name) = (pool.namespace().unwrap_or_default(), pool.name_any());
        for failure in failures {
            let Some(entry) = decision
                .instances
                .iter_mut()
                .find(|i| i.id.is_none() && i.request == failure.request)
            else {
                continue;
            };
            let created = entry
                .created
                .clone()
                .unwrap_or(Time(jiff::Timestamp::now()));
            *entry = failed_entry(
                &namespace,
                &name,
                failure.request.clone(),
                created,
                &failure.code,
                &failure.message,
                failure.class,
            );
            self.event(
                pool,
                Severity::Warning,
                "ScaleUpFailed",
                "Create",
                format!(
                    "creation {} failed: {}: {}",
                    failure.request, failure.code, failure.message
                ),
            );
            report.create_failure = Some((failure.code, failure.message));
        }
    }

    /// The pool's machine type: cached for [`PoolControllerOptions::machine_type_ttl`] unless
    /// `fresh`; the last one known when the backend does not answer.
    async fn machine_type(
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

    fn observe<T>(
        &self,
        backend: &dyn PoolBackend,
        operation: &str,
        result: &Result<T, BackendError>,
    ) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.kind.as_str(),
        };
        self.metrics
            .observe_backend_call(backend.name(), operation, outcome);
    }

    /// Records `instances` as the pool's `status.instances`, over the list this pass last saw
    /// there only (see [`guarded_status_patch`]).
    async fn patch_instances(
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
    async fn write_status(
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

    fn report_blocked(&self, pool: &NodePool, blocked: &Blocked) {
        let key = pool_key(pool);
        match blocked {
            Blocked::Spec(reason, message) => {
                if reason.starts_with("Credentials") {
                    // No usable credentials: the backend cannot be called.
                    self.metrics.set_backend_available(&key, false);
                }
                tracing::warn!(pool = %key, reason, %message, "NodePool cannot be reconciled");
                self.event(
                    pool,
                    Severity::Warning,
                    reason,
                    "Reconcile",
                    message.clone(),
                );
            }
            Blocked::Backend(error) => {
                self.metrics.set_backend_available(&key, false);
                tracing::warn!(pool = %key, %error, "NodePool backend failed");
                self.event(
                    pool,
                    Severity::Warning,
                    "BackendUnavailable",
                    "Reconcile",
                    error.to_string(),
                );
            }
            Blocked::Api(message) => {
                tracing::warn!(pool = %key, %message, "Kubernetes API call failed; retrying next pass");
            }
        }
    }

    fn report_dropped(&self, pool: &NodePool, dropped: &[Dropped]) {
        for d in dropped {
            let (severity, reason, note) = match d {
                Dropped::CreationLost { request } => (
                    Severity::Warning,
                    "ServerCreationLost",
                    format!(
                        "no server appeared for creation request {request} within {}s; the pool may order another",
                        converge::CREATE_GRACE.as_secs()
                    ),
                ),
                Dropped::FailureDeleted { request } => (
                    Severity::Normal,
                    "FailedCreationRemoved",
                    format!("failed creation {request} removed by cluster-autoscaler"),
                ),
                Dropped::FailureExpired { request } => (
                    Severity::Normal,
                    "FailedCreationExpired",
                    format!(
                        "failed creation {request} forgotten after {}s",
                        converge::FAILED_RETENTION.as_secs()
                    ),
                ),
                Dropped::FailureScaledDown { request } => (
                    Severity::Normal,
                    "FailedCreationRemoved",
                    format!("failed creation {request} removed by a scale-down"),
                ),
                Dropped::ServerGone { id } => (
                    Severity::Normal,
                    "ServerGone",
                    format!("server {id} is no longer listed by the backend"),
                ),
            };
            self.event(pool, severity, reason, "Reconcile", note);
        }
    }

    fn event(&self, pool: &NodePool, severity: Severity, reason: &str, action: &str, note: String) {
        self.events
            .queue(&reference(pool), severity, reason, action, note);
    }
}

/// What a pass did, for the status.
#[derive(Default)]
struct PassReport {
    /// The pool's resourceVersion after this pass's last write (or its read).
    version: Option<String>,
    /// `status.instances` as this pass last saw or wrote them: status writes land only over
    /// this list, so two reconcilers (a handover, a stalled leader) never both record intents.
    recorded: Vec<PoolInstance>,
    backend: Option<&'static str>,
    machine_type: Option<MachineTypeInfo>,
    instances: Option<Vec<PoolInstance>>,
    scaled_up: bool,
    scaled_down: bool,
    /// Servers were ordered in this pass.
    created: bool,
    create_failure: Option<(String, String)>,
    /// Registered Nodes by normalized provider ID, as the pass saw them.
    nodes: Option<HashMap<String, SeenNode>>,
    /// How the index clamped the pool's served bounds into the backend's (`None`: not
    /// served).
    outside_backend: Option<Vec<String>>,
    /// The backend's own min/max, read this pass.
    backend_bounds: Option<(i32, i32)>,
    /// Why the pool's min/max do not fit the backend's.
    size_violation: Option<String>,
}

/// The settings of new servers, checked before anything is ordered.
struct ServerSpec {
    hostname_pattern: String,
    user_data: String,
    api_server_endpoint: String,
    token_ttl: Duration,
    extra_groups: Vec<String>,
}

impl ServerSpec {
    fn of(pool: &NodePool) -> Result<Self, Blocked> {
        let settings = pool
            .server_settings()
            .ok_or_else(|| Blocked::Spec("NoBackend", NO_BACKEND.into()))?;
        let field = settings.field;
        let user_data = settings.user_data.to_string();
        let api_server_endpoint = settings.api_server_endpoint.map(String::from);
        let hostname_pattern = settings.hostname_pattern.map(String::from);
        let hostname_pattern =
            hostname_pattern.unwrap_or_else(|| render::DEFAULT_HOSTNAME_PATTERN.into());
        render::check(&hostname_pattern, &render::HOSTNAME_PLACEHOLDERS).map_err(|m| {
            Blocked::Spec(
                "InvalidHostnamePattern",
                format!("spec.{field}.hostnamePattern: {m}"),
            )
        })?;
        render::check(&user_data, &render::USER_DATA_PLACEHOLDERS)
            .map_err(|m| Blocked::Spec("InvalidUserData", format!("spec.{field}.userData: {m}")))?;
        let bootstrap = pool.spec.bootstrap.clone().unwrap_or_default();
        let token_ttl = match &bootstrap.token_ttl {
            None => bootstrap::DEFAULT_TTL,
            Some(text) => duration::parse(text).map_err(|e| {
                Blocked::Spec("InvalidBootstrap", format!("spec.bootstrap.tokenTtl: {e}"))
            })?,
        };
        Ok(Self {
            hostname_pattern,
            user_data,
            api_server_endpoint: api_server_endpoint.unwrap_or_default(),
            token_ttl,
            extra_groups: bootstrap.extra_groups,
        })
    }
}

/// The pool's conditions after a pass that ended with `blocked` (see
/// [`NodePoolStatus::conditions`] for their polarity). What the pass did not get to check is
/// Unknown: a pass blocked before it connected the backend (`report.backend` unset: the spec
/// names no usable backend, or the credentials Secret could not be read) leaves the backend's
/// availability Unknown (`NotConnected`), and a Kubernetes API error before connecting leaves
/// the spec's credentials unchecked (`InvalidSpec` Unknown, `NotChecked`). A pass that
/// connected got the backend's members and bounds before anything else could block it, so
/// the backend is then known to answer.
fn conditions(
    blocked: &Option<Blocked>,
    report: &PassReport,
    previous_scale_up: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    desired: usize,
    replicas: usize,
    ready: usize,
) -> Vec<DesiredCondition> {
    let condition =
        |type_, status: ConditionStatus, reason: &str, message: String| DesiredCondition {
            type_,
            status,
            reason: reason.into(),
            message,
        };
    let connected = report.backend.is_some();
    let invalid = match (blocked, &report.size_violation) {
        (Some(Blocked::Spec(reason, message)), _) => condition(
            "InvalidSpec",
            ConditionStatus::True,
            reason,
            message.clone(),
        ),
        (_, Some(message)) => condition(
            "InvalidSpec",
            ConditionStatus::True,
            SIZE_OUTSIDE_BACKEND,
            message.clone(),
        ),
        (Some(Blocked::Api(message)), None) if !connected => condition(
            "InvalidSpec",
            ConditionStatus::Unknown,
            "NotChecked",
            format!("the pool's credentials could not be read: {message}"),
        ),
        _ => condition(
            "InvalidSpec",
            ConditionStatus::False,
            "Valid",
            "the pool's spec and credentials can be acted on".into(),
        ),
    };
    let backend = match blocked {
        Some(Blocked::Backend(e)) => condition(
            "BackendUnavailable",
            ConditionStatus::True,
            e.kind.as_str(),
            e.message.clone(),
        ),
        Some(Blocked::Spec(..)) if !connected => condition(
            "BackendUnavailable",
            ConditionStatus::Unknown,
            "NotConnected",
            "the backend is not called while the spec is invalid".into(),
        ),
        Some(Blocked::Api(_)) if !connected => condition(
            "BackendUnavailable",
            ConditionStatus::Unknown,
            "NotConnected",
            "the backend is not called before the pool's credentials are read".into(),
        ),
        _ => condition(
            "BackendUnavailable",
            ConditionStatus::False,
            "Available",
            "the backend answers".into(),
        ),
    };
    // Kept until the next scale-up, so a failure stays visible after the pass that saw it.
    let scale_up = match (&report.create_failure, report.created, previous_scale_up) {
        (Some((code, message)), _, _) => condition(
            "ScaleUpFailed",
            ConditionStatus::True,
            code,
            message.clone(),
        ),
        (None, true, _) | (None, false, None) => condition(
            "ScaleUpFailed",
            ConditionStatus::False,
            "NoFailure",
            "the last scale-up ordered every server it needed".into(),
        ),
        (None, false, Some(previous)) => DesiredCondition {
            type_: "ScaleUpFailed",
            status: ConditionStatus::parse(&previous.status),
            reason: previous.reason.clone(),
            message: previous.message.clone(),
        },
    };
    let ready_condition = match blocked {
        Some(Blocked::Api(message)) => {
            condition("Ready", ConditionStatus::False, "ApiError", message.clone())
        }
        Some(_) => condition(
            "Ready",
            ConditionStatus::False,
            "Blocked",
            "see the InvalidSpec and BackendUnavailable conditions".into(),
        ),
        None if replicas != desired => condition(
            "Ready",
            ConditionStatus::False,
            "Scaling",
            format!("{replicas} of {desired} servers"),
        ),
        None if ready < desired => condition(
            "Ready",
            ConditionStatus::False,
            "WaitingForNodes",
            format!("{ready} of {desired} Nodes Ready"),
        ),
        None => condition(
            "Ready",
            ConditionStatus::True,
            "Ready",
            format!("{desired} servers with Ready Nodes"),
        ),
    };
    vec![ready_condition, invalid, backend, scale_up]
}

fn failed_entry(
    namespace: &str,
    name: &str,
    request: String,
    created: Time,
    code: &str,
    message: &str,
    class: &str,
) -> PoolInstance {
    PoolInstance {
        id: None,
        provider_id: Some(view::failed_instance_id(namespace, name, &request)),
        hostname: String::new(),
        state: Some(InstanceStateName::Failed),
        request,
        node: None,
        created: Some(created),
        error: Some(InstanceErrorStatus {
            class: class.into(),
            code: code.into(),
            message: message.into(),
        }),
        deletion: None,
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

async fn add_finalizer(api: &Api<NodePool>, pool: &NodePool) -> Result<(), Blocked> {
    let mut finalizers = pool.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    api.patch(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": pool.resource_version(),
        }})),
    )
    .await
    .map(|_| ())
    .map_err(|e| Blocked::Api(format!("adding finalizer {FINALIZER}: {e}")))
}

fn seen_nodes(nodes: &[Arc<WatchedNode>]) -> HashMap<String, SeenNode> {
    nodes
        .iter()
        .filter_map(|n| {
            let pid = n.view.provider_id.as_deref()?;
            Some((
                providerid::normalize(pid).to_string(),
                SeenNode {
                    name: n.view.name.clone(),
                    ready: n.view.ready,
                },
            ))
        })
        .collect()
}

/// How the index serves `pool`'s bounds (a governing policy may supply them; they are
/// clamped into the backend's): what did not fit. `None` when the pool is not served.
fn outside_backend(snapshots: &SnapshotHandle, pool: &NodePool) -> Option<Vec<String>> {
    snapshots.current().and_then(|s| {
        s.group(&pool.group_id()).map(|g| {
            g.warnings
                .iter()
                .filter(|w| w.field == BACKEND_BOUNDS_FIELD)
                .map(|w| w.message.clone())
                .collect()
        })
    })
}

/// What makes a pass due, as a hash: the pool's generation (its spec), its scale-down ledger
/// and whether it is being deleted. Status writes, including the pass's own, change none of
/// them.
fn pass_trigger(pool: &NodePool) -> Option<u64> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        pool.metadata.generation,
        pool.annotations().get(LEDGER_ANNOTATION),
        pool.metadata.deletion_timestamp.is_some(),
    )
        .hash(&mut hasher);
    Some(hasher.finish())
}

fn reference(pool: &NodePool) -> ObjectReference {
    pool.object_ref(&())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conditions as (type, whether True, reason), and the message of `type_`.
    fn summary(conditions: &[DesiredCondition]) -> Vec<(&'static str, bool, String)> {
        conditions
            .iter()
            .map(|c| (c.type_, c.status == ConditionStatus::True, c.reason.clone()))
            .collect()
    }

    fn message<'a>(conditions: &'a [DesiredCondition], type_: &str) -> &'a str {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map_or("", |c| c.message.as_str())
    }

    fn cherry_pool(cherry: serde_json::Value, bootstrap: serde_json::Value) -> NodePool {
        let mut spec = json!({"credentialsSecretRef": {"name": "s", "key": "token"},
            "projectId": 1, "region": "r", "plan": "p", "image": "i", "userData": "#!/bin/sh"});
        if let (Some(spec), serde_json::Value::Object(extra)) = (spec.as_object_mut(), cherry) {
            spec.extend(extra);
        }
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": "workers", "namespace": "ns"},
            "spec": {"replicas": 1, "maxSize": 5, "clusterName": "c1",
                "cherryServers": spec, "bootstrap": bootstrap}
        }))
        .expect("pool")
    }

    fn blocked_reason(result: Result<ServerSpec, Blocked>) -> (&'static str, String) {
        match result {
            Err(Blocked::Spec(reason, message)) => (reason, message),
            Err(other) => panic!("not a spec problem: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn a_failed_pass_is_retried_sooner_than_the_interval_and_backs_off_up_to_it() {
        let interval = Duration::from_secs(15);
        let waits: Vec<u64> = [1, 2, 3, 4, 5, 40, u32::MAX]
            .into_iter()
            .map(|failures| backoff(failures, interval).as_secs())
            .collect();
        assert_eq!(waits, [2, 4, 8, 15, 15, 15, 15]);
    }

    #[test]
    fn only_the_spec_the_ledger_and_deletion_make_a_pass_due() {
        let pool = cherry_pool(json!({"projectId": 1}), json!({}));
        let trigger = pass_trigger(&pool);
        let mut written = pool.clone();
        written.status = Some(NodePoolStatus {
            replicas: 3,
            ..Default::default()
        });
        written.metadata.resource_version = Some("42".into());
        written.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert_eq!(
            pass_trigger(&written),
            trigger,
            "status and finalizer writes"
        );

        let mut changed = pool.clone();
        changed.metadata.generation = Some(2);
        assert_ne!(pass_trigger(&changed), trigger, "a new generation");
        let mut ledger = pool.clone();
        ledger
            .annotations_mut()
            .insert(LEDGER_ANNOTATION.into(), "{}".into());
        assert_ne!(pass_trigger(&ledger), trigger, "a ledger entry");
        let mut deleting = pool;
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
        assert_ne!(pass_trigger(&deleting), trigger, "deletion");
    }

    #[test]
    fn a_server_spec_takes_the_defaults_and_names_the_field_it_refuses() {
        let spec = ServerSpec::of(&cherry_pool(json!({}), json!({}))).expect("valid");
        assert_eq!(spec.hostname_pattern, render::DEFAULT_HOSTNAME_PATTERN);
        assert_eq!(spec.token_ttl, bootstrap::DEFAULT_TTL);
        let ttl = ServerSpec::of(&cherry_pool(json!({}), json!({"tokenTtl": "45m"})));
        assert_eq!(ttl.expect("valid").token_ttl, Duration::from_secs(45 * 60));

        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({"hostnamePattern": "{{.Nope}}"}),
            json!({}),
        )));
        assert_eq!(reason, "InvalidHostnamePattern");
        assert!(
            message.starts_with("spec.cherryServers.hostnamePattern: "),
            "{message}"
        );
        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({"userData": "{{.Unknown}}"}),
            json!({}),
        )));
        assert_eq!(reason, "InvalidUserData");
        assert!(
            message.starts_with("spec.cherryServers.userData: "),
            "{message}"
        );
        let (reason, message) = blocked_reason(ServerSpec::of(&cherry_pool(
            json!({}),
            json!({"tokenTtl": "soon"}),
        )));
        assert_eq!(reason, "InvalidBootstrap");
        assert!(
            message.starts_with("spec.bootstrap.tokenTtl: "),
            "{message}"
        );
        let mut neither = cherry_pool(json!({}), json!({}));
        neither.spec.cherry_servers = None;
        assert_eq!(blocked_reason(ServerSpec::of(&neither)).0, "NoBackend");
    }

    #[test]
    fn a_pool_is_ready_only_with_every_server_and_every_node_ready() {
        let report = PassReport::default();
        let ready = |replicas, nodes| conditions(&None, &report, None, 3, replicas, nodes);
        let scaling = ready(2, 2);
        assert_eq!(summary(&scaling)[0], ("Ready", false, "Scaling".into()));
        assert_eq!(message(&scaling, "Ready"), "2 of 3 servers");
        let waiting = ready(3, 1);
        assert_eq!(
            summary(&waiting)[0],
            ("Ready", false, "WaitingForNodes".into())
        );
        assert_eq!(message(&waiting, "Ready"), "1 of 3 Nodes Ready");
        assert_eq!(
            summary(&ready(3, 3)),
            vec![
                ("Ready", true, "Ready".into()),
                ("InvalidSpec", false, "Valid".into()),
                ("BackendUnavailable", false, "Available".into()),
                ("ScaleUpFailed", false, "NoFailure".into()),
            ]
        );
    }

    #[test]
    fn a_blocked_pass_says_why_on_the_condition_that_names_the_cause() {
        let report = PassReport::default();
        let spec = Some(Blocked::Spec(
            "MissingSecret",
            "Secret ns/x has no key".into(),
        ));
        assert_eq!(
            summary(&conditions(&spec, &report, None, 1, 1, 1))[..3],
            [
                ("Ready", false, "Blocked".into()),
                ("InvalidSpec", true, "MissingSecret".into()),
                ("BackendUnavailable", false, "NotConnected".into()),
            ]
        );
        assert_eq!(
            conditions(&spec, &report, None, 1, 1, 1)[2].status,
            ConditionStatus::Unknown,
            "the backend is not called while the spec is invalid"
        );
        let backend = Some(Blocked::Backend(BackendError {
            kind: crate::nodepool::backend::BackendErrorKind::Unauthorized,
            message: "401 from GET plans".into(),
        }));
        let blocked = conditions(&backend, &report, None, 1, 1, 1);
        assert_eq!(
            summary(&blocked)[..3],
            [
                ("Ready", false, "Blocked".into()),
                ("InvalidSpec", false, "Valid".into()),
                (
                    "BackendUnavailable",
                    true,
                    crate::nodepool::backend::BackendErrorKind::Unauthorized
                        .as_str()
                        .into()
                ),
            ]
        );
        assert_eq!(
            message(&blocked, "BackendUnavailable"),
            "401 from GET plans"
        );
        let api = Some(Blocked::Api("conflict".into()));
        let failed = conditions(&api, &report, None, 1, 1, 1);
        assert_eq!(summary(&failed)[0], ("Ready", false, "ApiError".into()));
        assert_eq!(message(&failed, "Ready"), "conflict");
        let outside = PassReport {
            size_violation: Some("maxSize 9 above the scaling group's 5".into()),
            ..Default::default()
        };
        assert_eq!(
            summary(&conditions(&None, &outside, None, 1, 1, 1))[1],
            ("InvalidSpec", true, SIZE_OUTSIDE_BACKEND.into())
        );
    }

    #[test]
    fn a_scale_up_failure_stays_visible_until_a_later_pass_orders_servers() {
        let failing = PassReport {
            create_failure: Some(("OutOfStock".into(), "no e5 in eu-1".into())),
            ..Default::default()
        };
        let first = conditions(&None, &failing, None, 2, 1, 1);
        assert_eq!(
            summary(&first)[3],
            ("ScaleUpFailed", true, "OutOfStock".into())
        );
        let previous = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "ScaleUpFailed".into(),
            status: "True".into(),
            reason: "OutOfStock".into(),
            message: "no e5 in eu-1".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        };
        let quiet = PassReport::default();
        let kept = conditions(&None, &quiet, Some(&previous), 2, 1, 1);
        assert_eq!(
            summary(&kept)[3],
            ("ScaleUpFailed", true, "OutOfStock".into())
        );
        assert_eq!(message(&kept, "ScaleUpFailed"), "no e5 in eu-1");
        let ordered = PassReport {
            created: true,
            ..Default::default()
        };
        assert_eq!(
            summary(&conditions(&None, &ordered, Some(&previous), 2, 2, 1))[3],
            ("ScaleUpFailed", false, "NoFailure".into())
        );
    }

    #[test]
    fn what_a_pass_did_not_get_to_check_is_unknown() {
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let statuses = |blocked: Option<Blocked>, report: &PassReport| {
            merge(
                &[],
                &conditions(&blocked, report, None, 1, 1, 1),
                None,
                &now,
            )
            .into_iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect::<Vec<_>>()
        };
        let triple = |t: &str, s: &str, r: &str| (t.to_string(), s.to_string(), r.to_string());
        // Blocked before the backend was connected: the credentials Secret could not be read.
        let unconnected = PassReport::default();
        let api = statuses(
            Some(Blocked::Api("reading Secret ns/s: 500".into())),
            &unconnected,
        );
        assert_eq!(api[1], triple("InvalidSpec", "Unknown", "NotChecked"));
        assert_eq!(
            api[2],
            triple("BackendUnavailable", "Unknown", "NotConnected")
        );
        // An invalid spec: the backend is not called, so its availability is not known.
        let spec = statuses(
            Some(Blocked::Spec("NoBackend", NO_BACKEND.into())),
            &unconnected,
        );
        assert_eq!(spec[1], triple("InvalidSpec", "True", "NoBackend"));
        assert_eq!(
            spec[2],
            triple("BackendUnavailable", "Unknown", "NotConnected")
        );
        // The backend answered (list and bounds), then the pass stopped: it is available.
        let connected = PassReport {
            backend: Some("cherryServers"),
            ..Default::default()
        };
        let late_api = statuses(
            Some(Blocked::Api("adding finalizer: 409".into())),
            &connected,
        );
        assert_eq!(late_api[0], triple("Ready", "False", "ApiError"));
        assert_eq!(late_api[1], triple("InvalidSpec", "False", "Valid"));
        assert_eq!(
            late_api[2],
            triple("BackendUnavailable", "False", "Available")
        );
        let late_spec = statuses(
            Some(Blocked::Spec(
                "NodesUnreachable",
                "cannot read Nodes".into(),
            )),
            &connected,
        );
        assert_eq!(
            late_spec[1],
            triple("InvalidSpec", "True", "NodesUnreachable")
        );
        assert_eq!(
            late_spec[2],
            triple("BackendUnavailable", "False", "Available")
        );
    }

    /// A client of a server that accepts connections and never answers.
    async fn unanswered_client() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        client_of(address)
    }

    /// A client of a port nothing listens on.
    async fn refused_client() -> Client {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        client_of(address)
    }

    fn client_of(address: std::net::SocketAddr) -> Client {
        let uri = format!("http://{address}").parse().expect("uri");
        Client::try_from(kube::Config::new(uri)).expect("client")
    }

    fn cluster(name: &str) -> ClusterKey {
        ClusterKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    async fn finished_within(sweeps: &TokenSweeps, key: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while sweeps.running(key) {
            if start.elapsed() > limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    #[tokio::test]
    async fn a_cluster_that_never_answers_holds_back_only_its_own_token_sweep() {
        let mut sweeps = TokenSweeps::default();
        let timeout = Duration::from_millis(800);
        assert!(sweeps.start(
            "hung".into(),
            cluster("hung"),
            unanswered_client().await,
            timeout
        ));
        assert!(sweeps.start(
            "down".into(),
            cluster("down"),
            refused_client().await,
            timeout
        ));
        assert!(
            finished_within(&sweeps, "down", Duration::from_millis(400)).await,
            "the other cluster's sweep ends on its own"
        );
        assert!(sweeps.running("hung"));
        assert!(
            !sweeps.start(
                "hung".into(),
                cluster("hung"),
                unanswered_client().await,
                timeout
            ),
            "no second sweep of a cluster while one runs"
        );
        assert!(
            finished_within(&sweeps, "hung", Duration::from_secs(5)).await,
            "the hung sweep is given up after its timeout"
        );
        sweeps.forget_finished();
        assert!(sweeps.running.is_empty());
        assert!(sweeps.start(
            "hung".into(),
            cluster("hung"),
            unanswered_client().await,
            timeout
        ));
    }
}
