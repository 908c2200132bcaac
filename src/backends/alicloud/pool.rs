//! A NodePool's instances in an Alibaba Cloud Auto Scaling (ESS) scaling group.
//!
//! ESS launches instances itself, so a creation is not one call per server: the pool asks
//! for several at once (`ScaleWithAdjustment` by a quantity) and recognises them afterwards.
//! Every scale-out carries
//! - `ClientToken` = a digest of its creation requests: ESS answers a repeated call with the
//!   first call's activity, so a retry after a lost answer never scales twice; and as the
//!   other parameters follow from the requests, a token is never reused with different
//!   ones (which Alibaba's idempotence rules refuse, `IdempotentParameterMismatch`; the ESS
//!   reference does not say how long it keeps a token);
//! - `ActivityMetadata` = `{"nodegroup.dev/requests": "<r1>,<r2>,..."}`: the activity keeps
//!   the requests it serves, and each instance names its activity (`ScalingActivityId`), so
//!   a listed instance is traced to its request. An activity's instances are given to its
//!   requests in the order ESS reports them (`CreatedInstances`, else creation time).
//!
//! Before scaling, the recent activities are read: a request one of them already serves is
//! not sent again. A request whose activity ended without an instance for it (out of stock,
//! clamped by MaxSize) is a failed creation ([`AliCloudPool::creation_failures`]). A
//! scale-out that would change nothing is recorded by ESS as a `Rejected` activity
//! (`StatusCode`, DescribeScalingActivities reference): its creations fail at once with the
//! activity's `StatusMessage`. While another activity runs ESS refuses to scale: nothing is
//! sent and the creations are [`Created::Deferred`].
//!
//! A group with expected capacity keeps the desired capacity a scale-out raised even when
//! the launch falls short (out of stock), and keeps launching toward it: instances would
//! appear later with no request behind them, after cluster-autoscaler was told the
//! creations failed. So when the newest of this operator's scale-outs ended short and no
//! activity runs, [`AliCloudPool::members`] sets the desired capacity back to the
//! instances the group holds (`ModifyScalingGroup`). cluster-autoscaler's in-tree provider
//! reads that desired capacity as the group's size (`alicloud_manager.go` `GetAsgSize`) and
//! lowers it through `DecreaseTargetSize` once its node-provisioning timeout passes; the
//! pool does the same as soon as the launch has ended.
//!
//! Removal is `RemoveInstances` of exactly the given instances, at most 20 per call,
//! lowering the desired capacity by as many (`DecreaseDesiredCapacity=true`) and releasing
//! them (`RemovePolicy=release`). An instance a user put in `Protected` (scale-in
//! protection) or `Standby` is never removed: ESS would release a protected instance named
//! in `RemoveInstances`, so the pool refuses its removal itself, as cluster-autoscaler's
//! providers leave protected nodes alone.
//!
//! Instances created by others (ESS health replacements, cluster-autoscaler's in-tree
//! provider) are members too, without a request: the reconciler adopts them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;

use std::path::PathBuf;

use super::auth::{CredentialsSource, ProviderCache, metadata_endpoint};
use super::{
    Client, ClientOptions, CredentialsProvider, Endpoints, Error, InstanceLifecycleState,
    RemovalFailureReason, RemoveOptions, ScalingActivity, ScalingInstance, Scheme, provider_id,
};
use crate::backends::{BackendOptions, EndpointPolicy};
use crate::nodepool::ambient::AmbientPolicy;
use crate::nodepool::backend::{
    BackendConnector, BackendError, BackendErrorKind, ConnectError, Created, CreationFailure,
    MachineTypeInfo, NewServer, OTHER_ERROR, OUT_OF_RESOURCES, PoolBackend, Secrets, pool_key,
};
use crate::nodepool::converge::{Member, MemberPhase};
use ngo_api::nodepool::{AliCloudCredentialsMode, AliCloudSpec, MachineType, NodePool, UrlScheme};
use ngo_index::template::labels::{valid_label_key, valid_label_value};

/// `ActivityMetadata` key listing the creation requests a scale-out serves.
pub const REQUESTS_KEY: &str = "nodegroup.dev/requests";
/// Label of GPU Nodes naming the GPU model (cluster-autoscaler's alicloud `GPULabel`).
pub const GPU_LABEL: &str = "aliyun.accelerator/nvidia_name";
/// Activities read to trace instances and outcomes to requests (the most recent, over
/// pages of 50).
const RECENT_ACTIVITIES: u32 = 100;

/// A pool's view of its scaling group.
pub struct AliCloudPool {
    client: Client,
    spec: AliCloudSpec,
}

/// The client options of `spec`: its region, and its endpoints with the defaults
/// (`<scheme>://<product>.<region>.aliyuncs.com`, HTTPS unless `endpoints.scheme` says
/// `http`) filled in.
pub fn client_options(spec: &AliCloudSpec) -> ClientOptions {
    let mut options = ClientOptions::for_region(&spec.region_id);
    let overrides = spec.endpoints.clone().unwrap_or_default();
    let scheme = match overrides.scheme.unwrap_or_default() {
        UrlScheme::Https => Scheme::Https,
        UrlScheme::Http => Scheme::Http,
    };
    let defaults = Endpoints::for_region(&spec.region_id, scheme);
    options.endpoints = Endpoints {
        ess: overrides.ess.unwrap_or(defaults.ess),
        ecs: overrides.ecs.unwrap_or(defaults.ecs),
        vpc: overrides.vpc.unwrap_or(defaults.vpc),
        sts: overrides.sts.unwrap_or(defaults.sts),
    };
    options
}

/// The backend's name (`status.backend`), the spec field naming it.
pub const BACKEND_NAME: &str = "aliCloud";

/// Connects the pools whose spec sets `aliCloud`, with the credentials its
/// `credentialsMode` names; keeps one credentials provider per pool
/// ([`ProviderCache`]), so temporary credentials are renewed, not fetched every pass.
#[derive(Default)]
pub struct AliCloudConnector {
    credentials: ProviderCache,
    endpoints: EndpointPolicy,
    oidc_token_file: Option<PathBuf>,
    ambient: AmbientPolicy,
}

impl AliCloudConnector {
    /// A connector with the operator's endpoint policy and RRSA token file.
    pub fn new(options: &BackendOptions) -> Self {
        Self {
            credentials: ProviderCache::default(),
            endpoints: options.endpoints.clone(),
            oidc_token_file: options.alicloud_oidc_token_file.clone(),
            ambient: options.ambient.clone(),
        }
    }
}

/// Checks `spec`'s endpoint overrides against the operator's `policy`.
fn check_endpoints(spec: &AliCloudSpec, policy: &EndpointPolicy) -> Result<(), String> {
    let Some(endpoints) = &spec.endpoints else {
        return Ok(());
    };
    if endpoints.scheme == Some(UrlScheme::Http) {
        policy.check_http("spec.aliCloud.endpoints.scheme")?;
    }
    for (field, url) in [
        ("ess", &endpoints.ess),
        ("ecs", &endpoints.ecs),
        ("vpc", &endpoints.vpc),
        ("sts", &endpoints.sts),
        ("metadata", &endpoints.metadata),
    ] {
        if let Some(url) = url {
            policy.check(&format!("spec.aliCloud.endpoints.{field}"), url)?;
        }
    }
    Ok(())
}

#[async_trait]
impl BackendConnector for AliCloudConnector {
    fn field(&self) -> &'static str {
        BACKEND_NAME
    }

    fn serves(&self, pool: &NodePool) -> bool {
        pool.spec.ali_cloud.is_some()
    }

    async fn connect(
        &self,
        pool: &NodePool,
        secrets: &Secrets,
    ) -> Result<Box<dyn PoolBackend>, ConnectError> {
        let ali =
            pool.spec.ali_cloud.as_ref().ok_or_else(|| {
                ConnectError::Spec("NoBackend", "spec.aliCloud is not set".into())
            })?;
        check_endpoints(ali, &self.endpoints)
            .map_err(|m| ConnectError::Spec("EndpointNotAllowed", m))?;
        if ali.credentials_mode == Some(AliCloudCredentialsMode::EcsRamRole) {
            self.ambient
                .check(
                    &kube::ResourceExt::namespace(pool).unwrap_or_default(),
                    "credentialsMode ECSRAMRole (the RAM role of the ECS instance the operator runs on)",
                )
                .map_err(|m| ConnectError::Spec(crate::nodepool::ambient::NOT_ALLOWED, m))?;
        }
        let secret = match &ali.credentials_secret_ref {
            Some(reference) => Some(
                secrets
                    .get(&reference.name, "spec.aliCloud.credentialsSecretRef")
                    .await?,
            ),
            None => None,
        };
        let source = CredentialsSource::of(
            ali,
            secret.as_ref().and_then(|s| s.data.as_ref()),
            self.oidc_token_file.as_deref(),
        )
        .map_err(|m| {
            let name = ali
                .credentials_secret_ref
                .as_ref()
                .map_or("", |r| r.name.as_str());
            ConnectError::Spec(
                "CredentialsMissing",
                format!(
                    "Secret {}/{name} (credentialsMode {:?}) {m}",
                    secrets.namespace(),
                    ali.credentials_mode.unwrap_or_default(),
                ),
            )
        })?;
        let options = client_options(ali);
        let credentials = self
            .credentials
            .provider(
                &pool_key(pool),
                &source,
                &options.endpoints.sts,
                &metadata_endpoint(ali),
                &options.transport,
                &options.retry,
            )
            .map_err(|e| ConnectError::Spec("InvalidBackendConfig", e.to_string()))?;
        let backend = AliCloudPool::new(ali, options, credentials)
            .map_err(|e| ConnectError::Spec("InvalidBackendConfig", e.message))?;
        Ok(Box::new(backend))
    }

    fn forget(&self, key: &str) {
        self.credentials.forget(key);
    }
}

/// A scaling group's own size bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupBounds {
    /// `MinSize`.
    pub min: u32,
    /// `MaxSize`.
    pub max: u32,
}

impl AliCloudPool {
    /// Connects to the group of `spec` with `options` ([`client_options`]) and
    /// `credentials`.
    pub fn new(
        spec: &AliCloudSpec,
        options: ClientOptions,
        credentials: Arc<dyn CredentialsProvider>,
    ) -> Result<Self, BackendError> {
        let client = Client::new(options, credentials).map_err(|e| backend_error(&e))?;
        Ok(Self {
            client,
            spec: spec.clone(),
        })
    }

    /// The group's `MinSize` and `MaxSize`, read now.
    pub async fn group_bounds(&self) -> Result<GroupBounds, BackendError> {
        let group = self
            .client
            .ess()
            .scaling_group(self.group())
            .await
            .map_err(|e| backend_error(&e))?;
        Ok(GroupBounds {
            min: group.min_size,
            max: group.max_size,
        })
    }

    /// The zone every instance of the group lands in, when there is one: the zone of its
    /// vSwitches when they are all in one (`DescribeVSwitches`), else none. When the VPC API
    /// does not answer, the zone a listed instance reports, if the group has one vSwitch.
    async fn single_zone(&self, vswitch_ids: &[String]) -> Option<String> {
        if vswitch_ids.is_empty() {
            return None;
        }
        match self.client.vpc().vswitch_zones(vswitch_ids).await {
            Ok(zones) => {
                let first = zones.first().cloned().flatten()?;
                zones
                    .iter()
                    .all(|z| z.as_deref() == Some(first.as_str()))
                    .then_some(first)
            }
            Err(error) => {
                tracing::warn!(%error, group = self.group(), "cannot read the zones of the group's vSwitches");
                if vswitch_ids.len() != 1 {
                    return None;
                }
                self.client
                    .ess()
                    .scaling_instances(self.group())
                    .await
                    .ok()
                    .and_then(|instances| instances.into_iter().find_map(|i| i.zone_id))
            }
        }
    }

    fn group(&self) -> &str {
        &self.spec.scaling_group_id
    }

    /// When the newest of this operator's scale-outs ended short of its requests and no
    /// activity runs, a group with expected capacity above what it holds gets
    /// its desired capacity set back to what it holds: ESS would otherwise keep launching
    /// instances nothing asked for. Failures are logged; the next pass tries again.
    async fn lower_desired_after_short_launch(
        &self,
        activities: &[ScalingActivity],
        instances: &[ScalingInstance],
    ) {
        // The most recent of this operator's activities (`activities` is newest first).
        let Some(newest) = activities.iter().find(|a| !activity_requests(a).is_empty()) else {
            return;
        };
        let requests = activity_requests(newest);
        if !newest.is_finished()
            || newest.launched() >= requests.len()
            || activities.iter().any(|a| !a.is_finished())
        {
            return;
        }
        let ess = self.client.ess();
        let group = match ess.scaling_group(self.group()).await {
            Ok(g) => g,
            Err(error) => {
                tracing::warn!(%error, group = self.group(), "reading the group after a short launch");
                return;
            }
        };
        let held = u32::try_from(instances.len()).unwrap_or(u32::MAX);
        let Some(desired) = group.desired_capacity.filter(|d| *d > held) else {
            return;
        };
        let target = held.max(group.min_size);
        if target >= desired {
            return;
        }
        match ess.set_desired_capacity(self.group(), target).await {
            Ok(()) => tracing::info!(
                group = self.group(),
                activity = %newest.id,
                from = desired,
                to = target,
                "scale-out ended short: desired capacity set back to the instances held"
            ),
            Err(error) => {
                tracing::warn!(%error, group = self.group(), "setting the desired capacity back after a short launch");
            }
        }
    }

    /// What became of `requests` served by `activity` so far: the instance each got, or
    /// accepted (its instance is not listed yet).
    async fn outcomes(&self, activity: &str, requests: &[&str]) -> Vec<Created> {
        if let Ok(Some(a)) = self
            .client
            .ess()
            .scaling_activity(self.group(), activity)
            .await
            && a.status == super::ActivityStatus::Rejected
        {
            let (class, code) = failure_class(&a);
            return vec![
                Created::Failed {
                    class,
                    code: code.into(),
                    message: format!(
                        "scaling activity {} of group {} was Rejected: {}",
                        a.id,
                        self.group(),
                        a.status_message
                    ),
                };
                requests.len()
            ];
        }
        let instances = self
            .client
            .ess()
            .scaling_instances(self.group())
            .await
            .unwrap_or_default();
        let mut launched: Vec<&ScalingInstance> = instances
            .iter()
            .filter(|i| i.scaling_activity_id.as_deref() == Some(activity))
            .collect();
        launched.sort_by(|a, b| {
            (&a.creation_time, &a.instance_id).cmp(&(&b.creation_time, &b.instance_id))
        });
        requests
            .iter()
            .enumerate()
            .map(|(k, _)| match launched.get(k) {
                Some(i) => Created::Server(Member {
                    id: i.instance_id.clone(),
                    provider_id: provider_id(&self.spec.region_id, &i.instance_id),
                    hostname: i.instance_id.clone(),
                    phase: phase(&i.lifecycle_state),
                    request: None,
                    created: i.creation_time.as_deref().and_then(parse_time),
                }),
                None => Created::Accepted(format!("scaling activity {activity}")),
            })
            .collect()
    }
}

#[async_trait]
impl PoolBackend for AliCloudPool {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    /// The group's `MinSize` and `MaxSize`, read now.
    async fn bounds(&self) -> Result<Option<(i32, i32)>, BackendError> {
        let bounds = self.group_bounds().await?;
        Ok(Some((
            i32::try_from(bounds.min).unwrap_or(i32::MAX),
            i32::try_from(bounds.max).unwrap_or(i32::MAX),
        )))
    }

    /// Scale-outs run as activities that can end short after ESS accepted them.
    fn reports_late_failures(&self) -> bool {
        true
    }

    /// The group's instances, each traced to its creation request when a recent activity
    /// of this operator launched it.
    async fn members(&self) -> Result<Vec<Member>, BackendError> {
        let ess = self.client.ess();
        let instances = ess
            .scaling_instances(self.group())
            .await
            .map_err(|e| backend_error(&e))?;
        let activities = ess
            .scaling_activities(self.group(), None, RECENT_ACTIVITIES)
            .await
            .map_err(|e| backend_error(&e))?;
        let requests = requests_by_instance(&activities, &instances);
        self.lower_desired_after_short_launch(&activities, &instances)
            .await;
        Ok(instances
            .iter()
            .map(|i| Member {
                id: i.instance_id.clone(),
                provider_id: provider_id(&self.spec.region_id, &i.instance_id),
                hostname: i.instance_id.clone(),
                phase: phase(&i.lifecycle_state),
                request: requests.get(i.instance_id.as_str()).cloned(),
                created: i.creation_time.as_deref().and_then(parse_time),
            })
            .collect())
    }

    /// The instance type of the group's active scaling configuration: vCPUs, memory and
    /// GPUs as capacity; instance type, region, the zone when the group's vSwitches are all
    /// in one, the GPU model and the configuration's tags as labels.
    async fn machine_type(&self) -> Result<MachineTypeInfo, BackendError> {
        let ess = self.client.ess();
        let group = ess
            .scaling_group(self.group())
            .await
            .map_err(|e| backend_error(&e))?;
        let configuration_id = group.active_scaling_configuration_id.clone().ok_or_else(|| BackendError {
            kind: BackendErrorKind::Rejected,
            message: format!(
                "scaling group {} has no active scaling configuration (groups launching from a launch template are not supported)",
                self.group()
            ),
        })?;
        let configuration = ess
            .scaling_configuration(self.group(), &configuration_id)
            .await
            .map_err(|e| backend_error(&e))?
            .ok_or_else(|| BackendError {
                kind: BackendErrorKind::Rejected,
                message: format!("scaling configuration {configuration_id} is not found"),
            })?;
        let type_id = configuration
            .launch_types()
            .first()
            .map(|t| t.to_string())
            .ok_or_else(|| BackendError {
                kind: BackendErrorKind::Rejected,
                message: format!("scaling configuration {configuration_id} names no instance type"),
            })?;
        let types = self
            .client
            .ecs()
            .instance_types(&[type_id.as_str()])
            .await
            .map_err(|e| backend_error(&e))?;
        let instance_type = types.first().ok_or_else(|| BackendError {
            kind: BackendErrorKind::Rejected,
            message: format!(
                "instance type {type_id} is not offered in region {}",
                self.spec.region_id
            ),
        })?;
        let zone = self.single_zone(&group.vswitch_ids).await;
        let mut capacity = BTreeMap::from([
            ("cpu".to_string(), instance_type.cpu_cores.to_string()),
            (
                "memory".to_string(),
                instance_type.memory_bytes().to_string(),
            ),
            ("pods".to_string(), "110".to_string()),
        ]);
        let mut labels: BTreeMap<String, String> = configuration
            .tags
            .iter()
            .filter(|(k, v)| valid_label_key(k) && valid_label_value(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if instance_type.gpu_amount > 0 {
            capacity.insert(
                "nvidia.com/gpu".into(),
                instance_type.gpu_amount.to_string(),
            );
            if let Some(spec) = &instance_type.gpu_spec {
                let value = spec.replace(' ', "-");
                if valid_label_value(&value) {
                    labels.insert(GPU_LABEL.into(), value);
                }
            }
        }
        labels.insert(
            "node.kubernetes.io/instance-type".into(),
            instance_type.id.clone(),
        );
        labels.insert(
            "topology.kubernetes.io/region".into(),
            self.spec.region_id.clone(),
        );
        labels.insert(
            "kubernetes.io/arch".into(),
            instance_type.kubernetes_arch().into(),
        );
        if let Some(zone) = zone {
            labels.insert("topology.kubernetes.io/zone".into(), zone);
        }
        Ok(MachineTypeInfo {
            machine_type: MachineType {
                name: instance_type.id.clone(),
                capacity,
                hourly_price: None,
                currency: None,
                labels,
            },
            in_stock: None,
        })
    }

    /// One creation: [`AliCloudPool::create_many`] of one.
    async fn create(&self, server: &NewServer) -> Created {
        self.create_many(std::slice::from_ref(server))
            .await
            .pop()
            .unwrap_or_else(|| Created::Unknown("no outcome".into()))
    }

    /// Creates `servers` in one scale-out, one outcome per server in order. The first
    /// server's user data goes into the scaling configuration when the spec has user data
    /// (all of them share the pass's bootstrap token; ESS names the instances, so the
    /// hostnames are not used).
    async fn create_many(&self, servers: &[NewServer]) -> Vec<Created> {
        if servers.is_empty() {
            return Vec::new();
        }
        let ess = self.client.ess();
        let requests: Vec<&str> = servers.iter().map(|s| s.request.as_str()).collect();
        let all = |outcome: Created| vec![outcome; servers.len()];

        // Read before acting: a request a recent activity serves is not sent again.
        let activities = match ess
            .scaling_activities(self.group(), None, RECENT_ACTIVITIES)
            .await
        {
            Ok(a) => a,
            Err(e) => {
                return all(Created::Deferred(format!(
                    "reading the group's activities: {e}"
                )));
            }
        };
        if let Some(activity) = activities
            .iter()
            .find(|a| activity_requests(a).iter().any(|r| requests.contains(r)))
        {
            tracing::info!(activity = %activity.id, "a scale-out for these creations exists already; not sent again");
            return self.outcomes(&activity.id, &requests).await;
        }
        if let Some(running) = activities.iter().find(|a| !a.is_finished()) {
            return all(Created::Deferred(format!(
                "scaling group {} runs activity {} ({}); ESS refuses to scale until it ends",
                self.group(),
                running.id,
                running.description
            )));
        }

        if let Some(first) = self.spec.user_data.as_ref().and(servers.first()) {
            let group = match ess.scaling_group(self.group()).await {
                Ok(g) => g,
                Err(e) => return all(not_sent(&e)),
            };
            let Some(configuration) = group.active_scaling_configuration_id else {
                return all(Created::Failed {
                    class: OTHER_ERROR,
                    code: "Rejected".into(),
                    message: format!(
                        "scaling group {} has no active scaling configuration to write the user data into",
                        self.group()
                    ),
                });
            };
            if let Err(e) = ess.set_user_data(&configuration, &first.user_data).await {
                return all(not_sent(&e));
            }
        }

        let metadata = BTreeMap::from([(REQUESTS_KEY.to_string(), requests.join(","))]);
        let token = client_token(&requests);
        let count = u32::try_from(servers.len()).unwrap_or(u32::MAX);
        match ess.scale_out(self.group(), count, &token, &metadata).await {
            Ok(started) => match started.scaling_activity_id {
                Some(activity) => self.outcomes(&activity, &requests).await,
                // No activity to read the outcome from: nothing was started.
                None => all(Created::Failed {
                    class: OTHER_ERROR,
                    code: "ScaleOutRejected".into(),
                    message: format!(
                        "scaling group {} started no scaling activity (ActivityType {})",
                        self.group(),
                        started.activity_type.as_deref().unwrap_or("none")
                    ),
                }),
            },
            // Refused before it ran: nothing happened, ask again next pass.
            Err(e @ Error::Throttled { .. }) => all(Created::Deferred(e.to_string())),
            Err(e) if e.is_activity_in_progress() => all(Created::Deferred(e.to_string())),
            // The token was used with other parameters: an earlier call for these requests
            // reached ESS. Read the activities again next pass.
            Err(Error::Api { ref error, .. }) if error.code == "IdempotentParameterMismatch" => {
                all(Created::Deferred(error.to_string()))
            }
            Err(e) => match backend_error(&e).kind {
                BackendErrorKind::Unavailable => all(Created::Unknown(e.to_string())),
                _ => all(Created::from_error(backend_error(&e))),
            },
        }
    }

    /// The creations among `in_flight` (requests without a server yet) whose scale-out
    /// ended without an instance for them, with why.
    async fn creation_failures(
        &self,
        in_flight: &[String],
    ) -> Result<Vec<CreationFailure>, BackendError> {
        let activities = self
            .client
            .ess()
            .scaling_activities(self.group(), None, RECENT_ACTIVITIES)
            .await
            .map_err(|e| backend_error(&e))?;
        let wanted: HashSet<&str> = in_flight.iter().map(String::as_str).collect();
        let mut failures = Vec::new();
        for activity in activities.iter().filter(|a| a.is_finished()) {
            let requests = activity_requests(activity);
            if !requests.iter().any(|r| wanted.contains(r)) {
                continue;
            }
            let served = activity.launched();
            for request in requests.iter().skip(served).filter(|r| wanted.contains(*r)) {
                let (class, code) = failure_class(activity);
                failures.push(CreationFailure {
                    request: request.to_string(),
                    class,
                    code: code.into(),
                    message: format!(
                        "scaling activity {} ended {} with {served} of {} instances: {}",
                        activity.id,
                        activity.status,
                        requests.len(),
                        if activity.status_message.is_empty() {
                            activity.error_message.clone().unwrap_or_default()
                        } else {
                            activity.status_message.clone()
                        }
                    ),
                });
            }
        }
        Ok(failures)
    }

    /// Removes instance `id` ([`AliCloudPool::delete_many`] of one).
    async fn delete(&self, id: &str) -> Result<(), BackendError> {
        self.delete_many(&[id.to_string()])
            .await
            .pop()
            .map_or(Ok(()), |(_, result)| result)
    }

    /// Removes exactly `ids` from the group (released, desired capacity lowered), one
    /// outcome per id; an instance already gone or being removed is not an error.
    async fn delete_many(&self, ids: &[String]) -> Vec<(String, Result<(), BackendError>)> {
        let options = RemoveOptions {
            decrease_desired_capacity: true,
            remove_policy: Some("release".into()),
        };
        let report = match self
            .client
            .ess()
            .remove_instances(self.group(), ids, options)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                let error = backend_error(&e);
                return ids
                    .iter()
                    .map(|id| (id.clone(), Err(error.clone())))
                    .collect();
            }
        };
        let failed: HashMap<&str, &RemovalFailureReason> = report
            .failed
            .iter()
            .map(|f| (f.instance_id.as_str(), &f.reason))
            .collect();
        ids.iter()
            .map(|id| {
                let result = match failed.get(id.as_str()) {
                    None => Ok(()),
                    Some(
                        RemovalFailureReason::NotInGroup | RemovalFailureReason::AlreadyRemoving,
                    ) => Ok(()),
                    Some(reason) => Err(removal_error(self.group(), id, reason)),
                };
                (id.clone(), result)
            })
            .collect()
    }
}

/// The requests an activity's metadata lists, in order.
fn activity_requests(activity: &ScalingActivity) -> Vec<&str> {
    activity
        .metadata
        .get(REQUESTS_KEY)
        .map(|r| r.split(',').filter(|r| !r.is_empty()).collect())
        .unwrap_or_default()
}

/// Instance id -> the request it serves: each activity's instances (its `CreatedInstances`,
/// else those naming it, oldest first) go to its requests in order.
fn requests_by_instance<'a>(
    activities: &'a [ScalingActivity],
    instances: &'a [ScalingInstance],
) -> HashMap<&'a str, String> {
    let mut map = HashMap::new();
    for activity in activities {
        let requests = activity_requests(activity);
        if requests.is_empty() {
            continue;
        }
        let launched: Vec<&str> = if activity.created_instances.is_empty() {
            let mut named: Vec<&ScalingInstance> = instances
                .iter()
                .filter(|i| i.scaling_activity_id.as_deref() == Some(activity.id.as_str()))
                .collect();
            named.sort_by(|a, b| {
                (&a.creation_time, &a.instance_id).cmp(&(&b.creation_time, &b.instance_id))
            });
            named.iter().map(|i| i.instance_id.as_str()).collect()
        } else {
            activity
                .created_instances
                .iter()
                .map(String::as_str)
                .collect()
        };
        for (instance, request) in launched.into_iter().zip(requests) {
            map.insert(instance, request.to_string());
        }
    }
    map
}

fn phase(state: &InstanceLifecycleState) -> MemberPhase {
    match state {
        InstanceLifecycleState::Pending | InstanceLifecycleState::PendingWait => {
            MemberPhase::Provisioning
        }
        InstanceLifecycleState::Removing | InstanceLifecycleState::RemovingWait => {
            MemberPhase::Terminating
        }
        _ => MemberPhase::Active,
    }
}

/// ESS times: `2024-01-02T03:04Z` (`CreationTime`) or with seconds.
fn parse_time(text: &str) -> Option<jiff::Timestamp> {
    text.parse().ok().or_else(|| {
        text.strip_suffix('Z')
            .and_then(|t| format!("{t}:00Z").parse().ok())
    })
}

/// Out of stock is `OutOfResources` (cluster-autoscaler tries another group); anything
/// else, a MaxSize clamp included, is `OtherError`.
fn failure_class(activity: &ScalingActivity) -> (&'static str, &'static str) {
    let text = format!(
        "{} {} {}",
        activity.error_code.as_deref().unwrap_or_default(),
        activity.status_message,
        activity.error_message.as_deref().unwrap_or_default()
    );
    if activity.status == super::ActivityStatus::Rejected {
        (OTHER_ERROR, "ScaleOutRejected")
    } else if text.contains("NoStock")
        || text.contains("out of stock")
        || text.contains("OutOfStock")
    {
        (OUT_OF_RESOURCES, "OutOfStock")
    } else if activity.status == super::ActivityStatus::Successful {
        (OTHER_ERROR, "MaxSizeReached")
    } else {
        (OTHER_ERROR, "ScaleOutFailed")
    }
}

fn removal_error(group: &str, id: &str, reason: &RemovalFailureReason) -> BackendError {
    let kind = match reason {
        RemovalFailureReason::HeldByUser(_) => BackendErrorKind::Rejected,
        RemovalFailureReason::Rejected(e) => match e.kind() {
            super::ApiErrorKind::SignatureDoesNotMatch
            | super::ApiErrorKind::InvalidAccessKey
            | super::ApiErrorKind::InvalidSecurityToken
            | super::ApiErrorKind::Forbidden => BackendErrorKind::Unauthorized,
            super::ApiErrorKind::IncorrectCapacity
            | super::ApiErrorKind::IncorrectInstanceStatus
            | super::ApiErrorKind::InvalidRequest => BackendErrorKind::Rejected,
            _ => BackendErrorKind::Unavailable,
        },
        _ => BackendErrorKind::Unavailable,
    };
    let message = match reason {
        RemovalFailureReason::HeldByUser(_) => format!("{id} of {group} not removed: {reason}"),
        _ => format!("RemoveInstances {id} from {group}: {reason}"),
    };
    BackendError { kind, message }
}

/// The `ClientToken` of a scale-out for `requests`: `ngo-` and 48 hex digits of their
/// SHA-256 (ESS takes at most 64 ASCII characters). The same requests give the same token
/// and the same parameters.
fn client_token(requests: &[&str]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, requests.join(",").as_bytes());
    let hex: String = digest.as_ref()[..24]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("ngo-{hex}")
}

fn not_sent(e: &Error) -> Created {
    match backend_error(e).kind {
        BackendErrorKind::Unavailable => Created::Deferred(e.to_string()),
        _ => Created::from_error(backend_error(e)),
    }
}

fn backend_error(error: &Error) -> BackendError {
    use super::ApiErrorKind as K;
    let kind = match error {
        Error::Api { error: api, .. } => match api.kind() {
            K::SignatureDoesNotMatch
            | K::InvalidAccessKey
            | K::InvalidSecurityToken
            | K::Forbidden => BackendErrorKind::Unauthorized,
            K::Throttling | K::ServiceUnavailable | K::ScalingActivityInProgress => {
                BackendErrorKind::Unavailable
            }
            _ => BackendErrorKind::Rejected,
        },
        Error::Credentials(e) if e.is_transient() => BackendErrorKind::Unavailable,
        Error::Credentials(_) => BackendErrorKind::Unauthorized,
        Error::Throttled { .. }
        | Error::Timeout { .. }
        | Error::Transport { .. }
        | Error::Decode { .. } => BackendErrorKind::Unavailable,
        Error::Config(_) | Error::GroupNotFound { .. } => BackendErrorKind::Rejected,
    };
    BackendError {
        kind,
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::alicloud::ActivityStatus;

    fn activity(
        id: &str,
        status: ActivityStatus,
        requests: &str,
        created: &[&str],
    ) -> ScalingActivity {
        ScalingActivity {
            id: id.into(),
            status,
            status_message: String::new(),
            cause: String::new(),
            description: String::new(),
            start_time: None,
            end_time: None,
            progress: 100,
            error_code: None,
            error_message: None,
            metadata: BTreeMap::from([(REQUESTS_KEY.to_string(), requests.to_string())]),
            created_instances: created.iter().map(|s| s.to_string()).collect(),
            scaling_instance_number: 0,
            created_capacity: 0,
        }
    }

    fn instance(id: &str, activity: &str, created: &str) -> ScalingInstance {
        ScalingInstance {
            instance_id: id.into(),
            lifecycle_state: InstanceLifecycleState::InService,
            health_status: "Healthy".into(),
            creation_type: "AutoCreated".into(),
            zone_id: None,
            instance_type: None,
            scaling_configuration_id: None,
            scaling_activity_id: Some(activity.into()),
            creation_time: Some(created.into()),
            entrusted: false,
        }
    }

    #[test]
    fn instances_are_traced_to_requests_through_their_activity() {
        let activities = [
            activity(
                "asa-1",
                ActivityStatus::Successful,
                "r1,r2",
                &["i-b", "i-a"],
            ),
            // No CreatedInstances: instances naming it, oldest first.
            activity("asa-2", ActivityStatus::InProgress, "r3,r4", &[]),
            // Someone else's activity.
            ScalingActivity {
                metadata: BTreeMap::new(),
                ..activity("asa-3", ActivityStatus::Successful, "", &["i-z"])
            },
        ];
        let instances = [
            instance("i-a", "asa-1", "2024-01-01T00:00Z"),
            instance("i-b", "asa-1", "2024-01-01T00:00Z"),
            instance("i-d", "asa-2", "2024-01-01T00:02Z"),
            instance("i-c", "asa-2", "2024-01-01T00:01Z"),
            instance("i-z", "asa-3", "2024-01-01T00:00Z"),
        ];
        let map = requests_by_instance(&activities, &instances);
        assert_eq!(map["i-b"], "r1");
        assert_eq!(map["i-a"], "r2");
        assert_eq!(map["i-c"], "r3");
        assert_eq!(map["i-d"], "r4");
        assert!(!map.contains_key("i-z"));
    }

    #[test]
    fn requests_without_an_instance_fail_by_why_the_activity_ended() {
        let mut stock = activity("asa-1", ActivityStatus::Warning, "r1,r2", &["i-a"]);
        stock.error_code = Some("OperationDenied.NoStock".into());
        assert_eq!(failure_class(&stock), (OUT_OF_RESOURCES, "OutOfStock"));
        let clamped = activity("asa-2", ActivityStatus::Successful, "r1,r2", &["i-a"]);
        assert_eq!(failure_class(&clamped), (OTHER_ERROR, "MaxSizeReached"));
        // An answer without CreatedInstances still counts what it launched.
        let counted = ScalingActivity {
            created_capacity: 2,
            ..activity("asa-4", ActivityStatus::Successful, "r1,r2", &[])
        };
        assert_eq!(counted.launched(), 2);
        let mut quota = activity("asa-3", ActivityStatus::Failed, "r1", &[]);
        quota.status_message = "QuotaExceed.ElasticQuota".into();
        assert_eq!(failure_class(&quota), (OTHER_ERROR, "ScaleOutFailed"));
    }

    #[test]
    fn rejected_activities_fail_as_rejected() {
        let mut rejected = activity("asa-5", ActivityStatus::Rejected, "r1", &[]);
        rejected.status_message = "out of stock".into();
        assert_eq!(failure_class(&rejected), (OTHER_ERROR, "ScaleOutRejected"));
    }

    /// A scale-out carrying other requests gets another token, even when they begin with the
    /// same request (the token used to be the first request's id, so ESS answered the second
    /// scale-out with the first one's activity, or refused it as a parameter mismatch).
    #[test]
    fn client_tokens_follow_the_whole_set_of_requests() {
        let token = client_token(&["r1", "r2"]);
        assert_eq!(token.len(), 52);
        assert_eq!(token, client_token(&["r1", "r2"]));
        assert_ne!(token, client_token(&["r1"]));
    }

    #[test]
    fn lifecycle_states_map_to_phases_and_times_parse() {
        assert_eq!(
            phase(&InstanceLifecycleState::PendingWait),
            MemberPhase::Provisioning
        );
        assert_eq!(
            phase(&InstanceLifecycleState::Protected),
            MemberPhase::Active
        );
        assert_eq!(
            phase(&InstanceLifecycleState::RemovingWait),
            MemberPhase::Terminating
        );
        assert_eq!(
            parse_time("2024-01-02T03:04Z"),
            "2024-01-02T03:04:00Z".parse().ok()
        );
        assert!(parse_time("2024-01-02T03:04:05Z").is_some());
        assert!(parse_time("yesterday").is_none());
    }

    #[test]
    fn endpoints_default_to_https_regional_hosts_unless_overridden_or_http() {
        let mut spec = AliCloudSpec {
            region_id: "cn-shanghai".into(),
            scaling_group_id: "asg-1".into(),
            ..Default::default()
        };
        let e = client_options(&spec).endpoints;
        assert_eq!(e.ess, "https://ess.cn-shanghai.aliyuncs.com");
        assert_eq!(e.vpc, "https://vpc.cn-shanghai.aliyuncs.com");
        assert_eq!(e.sts, "https://sts.cn-shanghai.aliyuncs.com");
        spec.endpoints = Some(ngo_api::nodepool::AliCloudEndpoints {
            scheme: Some(UrlScheme::Http),
            ess: Some("https://ess-vpc.cn-shanghai.aliyuncs.com".into()),
            ..Default::default()
        });
        let e = client_options(&spec).endpoints;
        assert_eq!(
            e.ess, "https://ess-vpc.cn-shanghai.aliyuncs.com",
            "an override wins"
        );
        assert_eq!(
            e.ecs, "http://ecs.cn-shanghai.aliyuncs.com",
            "the scheme of defaults"
        );
        assert_eq!(e.sts, "http://sts.cn-shanghai.aliyuncs.com");
    }
}
