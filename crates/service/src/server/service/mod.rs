//! The tonic service. Read RPCs take one snapshot and answer from it; writes go to the actuator.
//!
//! This file holds the service and the steps every RPC goes through (admission, the caller's
//! scope, the group lookup, the mutation's deadline, metrics and logs); `rpcs.rs` answers each
//! RPC of cluster-autoscaler's `externalgrpc` protocol with them.

mod rpcs;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status};

use super::error::ProviderError;
use super::identity::{self, IdentityError, IdentitySource, Scope};
use super::in_flight::{InFlight, InFlightCall, MAX_CALLS_IN_FLIGHT};
use super::rate_limit::{Admission, RateLimit, RateLimiter};
use super::request_id;
use crate::actuate::deadline::parse_grpc_timeout;
use crate::actuate::{ActuateError, CapiActuator, MutationDeadline};
use crate::metrics::ServiceMetrics;
use crate::proto;
use crate::relay::follower::Freshness;
use crate::relay::forward::Forwarder;
use ngo_index::index::{NodeGroup, NodeGroupLookup, Snapshot, SnapshotHandle};
use tracing::Instrument as _;

/// How long a mutating RPC waits, at most, for the watch to show the new target size. The
/// protocol says mutations "should wait until node group size is updated", and CA reads
/// TargetSize right after; the wait never outlasts the client's deadline.
const TARGET_SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Annotation on template nodes naming their group, so pricing can find it again.
pub const TEMPLATE_GROUP_ANNOTATION: &str = "autoscaling.nodegroup.dev/node-group";

/// Most bytes of what a mutation asked for (its group and node ids) in its log lines: one
/// DeleteNodes may name nodes up to the 4 MiB request limit.
const MAX_ASKED_LOG_BYTES: usize = 1024;

/// The longest node group id that can exist: `<Kind>/<namespace>/<name>` with the longest
/// kind, a namespace (a DNS label, 63 bytes) and an object name (a DNS subdomain, 253 bytes).
/// Longer ids are refused as malformed instead of looked up and echoed back.
const MAX_GROUP_ID_BYTES: usize = "MachineDeployment".len() + 1 + 63 + 1 + 253;

/// Serves cluster-autoscaler's `externalgrpc` protocol.
///
/// Mutations run detached from their RPC (see [`CloudProviderService::detached`]): tonic
/// drops an RPC's future when the client's deadline passes or its stream is reset, and a
/// mutation stopped between two writes is exactly what must not happen.
pub struct CloudProviderService {
    snapshots: SnapshotHandle,
    writes: Writes,
    metrics: Arc<ServiceMetrics>,
    mutations: TaskTracker,
    identity: IdentitySource,
    /// Each certificate-named Cluster's request budget; `None`: unlimited.
    rate_limits: Option<RateLimiter>,
    /// Each certificate-named Cluster's calls under way (with `rate_limits`).
    in_flight: Option<Arc<InFlight>>,
}

type RpcResult<T> = Result<Response<T>, Status>;

/// Where mutations are carried out.
enum Writes {
    /// Here, on the API server and the clouds.
    Local(Arc<CapiActuator>),
    /// By the operator this relay streams its view from; reads answer from that copy while
    /// `freshness` allows.
    Relayed {
        forwarder: Forwarder,
        freshness: Freshness,
    },
}

/// Who calls an RPC and how long it waits for the answer. Reads as its scope (`Deref`), which
/// is what the handlers check.
struct Caller {
    /// The scope the client certificate grants, or why it grants none.
    scope: Result<Scope, IdentityError>,
    /// The client's `grpc-timeout`, if it sent one.
    timeout: Option<std::time::Duration>,
    /// The id the client gave this request (`x-request-id`), if any ([`request_id::of`]).
    client_request_id: Option<String>,
}

/// Who called, for logs, written without allocating.
struct Who<'a>(&'a Result<Scope, IdentityError>);

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Ok(Scope::All) => f.write_str("a client (scoping off)"),
            Ok(Scope::Cluster(cluster)) => write!(f, "Cluster {cluster}"),
            Err(_) => f.write_str("an unidentified client"),
        }
    }
}

impl std::ops::Deref for Caller {
    type Target = Result<Scope, IdentityError>;

    fn deref(&self) -> &Self::Target {
        &self.scope
    }
}

impl CloudProviderService {
    /// A service reading `snapshots` and writing through `actuator`.
    /// Mutations are spawned on `mutations`, which shutdown waits for. With scoping off, every
    /// authenticated client sees every group; see [`Self::scoped`].
    pub fn new(
        snapshots: SnapshotHandle,
        actuator: Arc<CapiActuator>,
        metrics: Arc<ServiceMetrics>,
        mutations: TaskTracker,
    ) -> Self {
        Self {
            snapshots,
            writes: Writes::Local(actuator),
            metrics,
            mutations,
            identity: IdentitySource::Off,
            rate_limits: None,
            in_flight: None,
        }
    }

    /// A relay's service: reads answer from `snapshots`, a copy of one Cluster's view kept by
    /// the relay's stream, while `freshness` allows; mutations go to the operator through
    /// `forwarder`. Every caller is `cluster`'s cluster-autoscaler.
    pub fn relay(
        snapshots: SnapshotHandle,
        forwarder: Forwarder,
        freshness: Freshness,
        cluster: ngo_index::index::ClusterKey,
        metrics: Arc<ServiceMetrics>,
    ) -> Self {
        Self {
            snapshots,
            writes: Writes::Relayed {
                forwarder,
                freshness,
            },
            metrics,
            mutations: TaskTracker::new(),
            identity: IdentitySource::Fixed(cluster),
            rate_limits: None,
            in_flight: None,
        }
    }

    /// Gives each Cluster a client certificate names `limit` requests (one budget per
    /// Cluster, whichever method); a caller over it gets `RESOURCE_EXHAUSTED` before anything
    /// is read or written. Callers not scoped by a certificate (scoping off, `--cluster`) are
    /// not limited: they are the only tenant there.
    /// Each such Cluster may also have at most [`MAX_CALLS_IN_FLIGHT`] calls under way at once.
    pub fn rate_limited(mut self, limit: RateLimit) -> Self {
        self.rate_limits = Some(RateLimiter::new(limit));
        self.in_flight = Some(InFlight::new(MAX_CALLS_IN_FLIGHT));
        self
    }

    /// Spends one request of the caller's budget, or says why it may not be served now.
    /// The call counts as under way until the returned guard is dropped.
    fn admit(&self, method: &str, caller: &Caller) -> Result<Option<InFlightCall>, Status> {
        let (Some(limiter), Ok(Scope::Cluster(cluster))) = (&self.rate_limits, &caller.scope)
        else {
            return Ok(None);
        };
        if !self.identity.needs_certificate() {
            return Ok(None);
        }
        match limiter.admit(cluster, Instant::now()) {
            Admission::Admitted => match &self.in_flight {
                None => Ok(None),
                Some(table) => table.enter(cluster).map(Some).ok_or_else(|| {
                    Status::resource_exhausted(format!(
                        "Cluster {cluster} has {} calls under way, the most one Cluster may have at once; retry when one has ended",
                        table.max()
                    ))
                }),
            },
            Admission::Refused { retry_after, first } => {
                let limit = limiter.limit();
                if first {
                    tracing::warn!(%cluster, method, per_second = limit.per_second, burst = limit.burst,
                        "a tenant is over its gRPC request budget; its requests are refused until it slows down");
                }
                Err(Status::resource_exhausted(format!(
                    "Cluster {cluster} is over its request budget of {} per second (burst {}); retry in {} ms",
                    limit.per_second,
                    limit.burst,
                    retry_after.as_millis().max(1)
                )))
            }
        }
    }

    /// Scopes every caller to the Cluster its client certificate names (`identity`): it sees
    /// and scales only that Cluster's node groups.
    pub fn scoped(mut self, identity: IdentitySource) -> Self {
        self.identity = identity;
        self
    }

    /// Who calls and how long it waits: the scope a request's client certificate grants
    /// (certificates are parsed here, before the request is consumed) and its `grpc-timeout`.
    fn caller<T>(&self, request: &Request<T>) -> Caller {
        let scope = if self.identity == IdentitySource::Off {
            Ok(Scope::All)
        } else {
            let certs = request.peer_certs();
            identity::scope(&self.identity, certs.as_deref().map(Vec::as_slice))
        };
        Caller {
            scope,
            timeout: Self::client_timeout(request),
            client_request_id: request_id::from_client(request),
        }
    }

    /// The time the client allows `request` (its `grpc-timeout`), if it says.
    fn client_timeout<T>(request: &Request<T>) -> Option<std::time::Duration> {
        request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
    }

    /// Checks the caller's scope against what is served: its Cluster must exist, must not be
    /// being deleted, and (in the management topology) its Nodes must have been read. Until
    /// then the caller's answer is UNAVAILABLE, never OK with no groups: cluster-autoscaler
    /// would take that for a cluster without node groups.
    fn authorize(
        caller: &Result<Scope, IdentityError>,
        snapshot: &Snapshot,
    ) -> Result<Scope, ProviderError> {
        let scope = caller
            .clone()
            .map_err(|e| ProviderError::PermissionDenied(e.to_string()))?;
        if let Scope::Cluster(cluster) = &scope {
            if !snapshot.clusters.contains(cluster) {
                return Err(ProviderError::PermissionDenied(format!(
                    "the caller is scoped to Cluster {cluster} (by its client certificate, or --cluster), which this operator does not serve"
                )));
            }
            if snapshot.deleting_clusters.contains(cluster) {
                return Err(ProviderError::ClusterNotSynced(format!(
                    "Cluster {cluster} is being deleted; its node groups are no longer served"
                )));
            }
            match snapshot.workload.get(cluster) {
                Some(state) if !state.ever_synced() => {
                    return Err(ProviderError::ClusterNotSynced(format!(
                        "the Nodes of workload cluster {cluster} are not read yet ({state:?})"
                    )));
                }
                None if snapshot.nodes_per_cluster => {
                    return Err(ProviderError::ClusterNotSynced(format!(
                        "workload cluster {cluster} is not connected yet"
                    )));
                }
                _ => {}
            }
        }
        Ok(scope)
    }

    /// Runs `mutation` as a task of its own and waits for its result. If this RPC is dropped
    /// meanwhile, the task still runs to completion or rollback within its
    /// [`MutationDeadline`]; graceful shutdown waits for it.
    async fn detached<T: Send + 'static>(
        &self,
        mutation: impl Future<Output = Result<T, ActuateError>> + Send + 'static,
    ) -> Result<T, ProviderError> {
        self.mutations
            .spawn(mutation.instrument(tracing::Span::current()))
            .await
            .map_err(|e| ProviderError::Internal(format!("mutation task failed: {e}")))?
            .map_err(ProviderError::from)
    }

    /// The bounds of a mutation asked for by `request` (its `grpc-timeout`).
    fn deadline<T>(request: &Request<T>) -> MutationDeadline {
        MutationDeadline::new(Self::client_timeout(request))
    }

    /// The current snapshot and what the caller may see in it.
    fn visible_snapshot(
        &self,
        caller: &Result<Scope, IdentityError>,
    ) -> Result<(Arc<Snapshot>, Scope), ProviderError> {
        if let Writes::Relayed { freshness, .. } = &self.writes
            && let Some(stale) = freshness.stale()
        {
            return Err(ProviderError::Stale(stale));
        }
        let snapshot = self.snapshots.current().ok_or(ProviderError::NotSynced)?;
        let scope = Self::authorize(caller, &snapshot)?;
        Ok((snapshot, scope))
    }

    /// The current snapshot and group `id`, which the caller must be allowed to see.
    fn scoped_group(
        &self,
        caller: &Result<Scope, IdentityError>,
        id: &str,
    ) -> Result<(Arc<Snapshot>, Arc<NodeGroup>), ProviderError> {
        let (snapshot, scope) = self.visible_snapshot(caller)?;
        let group = Self::group(&snapshot, id, &scope)?;
        Ok((snapshot, group))
    }

    /// The group `id`, which the caller's `scope` must include.
    fn group(
        snapshot: &Snapshot,
        id: &str,
        scope: &Scope,
    ) -> Result<Arc<NodeGroup>, ProviderError> {
        if id.is_empty() {
            return Err(ProviderError::InvalidArgument(
                "request has an empty node group id".into(),
            ));
        }
        if id.len() > MAX_GROUP_ID_BYTES {
            return Err(ProviderError::InvalidArgument(format!(
                "node group id is {} bytes long; ids are <Kind>/<namespace>/<name>, at most {MAX_GROUP_ID_BYTES} bytes",
                id.len()
            )));
        }
        // Another cluster's group is answered exactly as one that does not exist: a tenant
        // cannot learn what exists outside its own Cluster.
        snapshot
            .group(id)
            .filter(|g| Self::visible(scope, g))
            .cloned()
            .ok_or_else(|| ProviderError::GroupNotFound(id.into()))
    }

    /// Whether `scope` includes `group`.
    fn visible(scope: &Scope, group: &NodeGroup) -> bool {
        match scope {
            Scope::All => true,
            Scope::Cluster(cluster) => *cluster == group.cluster,
        }
    }

    /// Runs one RPC body, records its latency and code, and logs failures, and mutations
    /// carried out, with who called (`caller`) and what it asked for (`asked`, mutations only).
    /// An RPC dropped before it answers is recorded too: as `DeadlineExceeded` when the
    /// client's deadline had passed, as `Canceled` (a reset stream, shutdown) otherwise.
    async fn rpc<T>(
        &self,
        method: &'static str,
        caller: &Caller,
        asked: Option<String>,
        body: impl Future<Output = Result<T, ProviderError>>,
    ) -> RpcResult<T> {
        let who = Who(&caller.scope);
        // Mutations always run in an info span, so every line they log says who asked and
        // which request; reads only when debug is on (their span and id would cost every call).
        let span = if asked.is_some() {
            tracing::info_span!("rpc", method, request_id = %request_id::of(caller.client_request_id.as_deref()), caller = %who)
        } else {
            tracing::debug_span!("rpc", method, request_id = %request_id::of(caller.client_request_id.as_deref()), caller = %who)
        };
        let start = Instant::now();
        // Held until the call is answered (or its future dropped).
        let _under_way = match self.admit(method, caller) {
            Ok(call) => call,
            Err(refused) => {
                self.metrics
                    .observe_rpc(method, refused.code(), start.elapsed());
                return Err(refused);
            }
        };
        let mut unanswered = self
            .metrics
            .unanswered(method)
            .client_deadline(caller.timeout);
        // What a tenant's CA asked (group ids, node ids), as logged: up to 4 MiB as sent.
        let asked = asked.map(|text| super::error::cut_to(text, MAX_ASKED_LOG_BYTES));
        let asked_text = asked.as_deref().unwrap_or_default();
        let result = body.instrument(span.clone()).await.map_err(|error| {
            let status = Status::from(error);
            let _in_rpc = span.enter();
            match status.code() {
                tonic::Code::Unimplemented | tonic::Code::NotFound => {
                    tracing::debug!(method, caller = %who, asked = asked_text, code = ?status.code(), detail = status.message(), "rpc refused")
                }
                _ => tracing::warn!(method, caller = %who, asked = asked_text, code = ?status.code(), detail = status.message(), "rpc failed"),
            }
            status
        });
        let code = result
            .as_ref()
            .map_or_else(Status::code, |_| tonic::Code::Ok);
        unanswered.answered();
        self.metrics.observe_rpc(method, code, start.elapsed());
        if result.is_ok() && asked.is_some() {
            let elapsed_ms = start.elapsed().as_millis() as u64;
            let _in_rpc = span.enter();
            tracing::info!(asked = asked_text, elapsed_ms, "carried out");
        }
        result.map(Response::new)
    }

    /// Waits (bounded by [`TARGET_SYNC_TIMEOUT`] and the client's deadline less the answer's
    /// margin) until the snapshot shows `target` for group `id`.
    async fn await_target(&self, id: &str, target: i32, bounds: &MutationDeadline) {
        let mut snapshots = self.snapshots.clone();
        let deadline = tokio::time::sleep(TARGET_SYNC_TIMEOUT.min(bounds.answer_remaining()));
        tokio::pin!(deadline);
        loop {
            let seen = snapshots
                .current()
                .and_then(|s| s.group(id).map(|g| g.target));
            if seen == Some(target) {
                return;
            }
            tokio::select! {
                _ = &mut deadline => {
                    tracing::debug!(group = id, target, ?seen, "watch did not show the new target in time");
                    return;
                }
                alive = snapshots.changed() => if !alive { return },
            }
        }
    }

    /// `response` telling a relay the group's new `target` size, when there is one.
    fn with_target<T>(response: RpcResult<(T, Option<i32>)>) -> RpcResult<T> {
        let (message, target) = response?.into_inner();
        let mut response = Response::new(message);
        if let Some(target) = target {
            response.metadata_mut().insert(
                crate::relay::TARGET_SIZE_KEY,
                tonic::metadata::MetadataValue::from(target),
            );
        }
        Ok(response)
    }

    /// The group of `node` among the caller's Cluster's objects: by provider ID, else (template
    /// nodes) by the group annotation this operator puts on them.
    fn group_for_node(
        snapshot: &Snapshot,
        node: &proto::ExternalGrpcNode,
        scope: &Scope,
    ) -> Result<Option<Arc<NodeGroup>>, ProviderError> {
        match snapshot.group_for_provider_id(&node.provider_id, scope.cluster()) {
            NodeGroupLookup::Group(g) => Ok(Some(g)),
            NodeGroupLookup::Ambiguous(n) => Err(ProviderError::FailedPrecondition(format!(
                "node {:?} (providerID {:?}): {n} machines or MachinePools share this provider ID; fix the duplicate provider IDs",
                node.name, node.provider_id
            ))),
            NodeGroupLookup::None => Ok(node
                .annotations
                .get(TEMPLATE_GROUP_ANNOTATION)
                .and_then(|id| snapshot.group(id))
                .filter(|g| Self::visible(scope, g))
                .cloned()),
        }
    }
}
