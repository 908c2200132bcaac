//! A NodePool's instances in its scaling group: the pool's
//! [`PoolBackend`](crate::nodepool::backend::PoolBackend) (see the module above for how
//! creations and removals map onto ESS).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;

use super::activities::{
    REQUESTS_KEY, activity_requests, client_token, failure_class, parse_time, phase,
    requests_by_instance,
};
use super::errors::{backend_error, not_sent, removal_error};
use crate::nodepool::backend::{
    BackendError, BackendErrorKind, Created, CreationFailure, MachineTypeInfo, NewServer,
    OTHER_ERROR, PoolBackend,
};
use crate::nodepool::converge::Member;
use ngo_api::nodepool::{AliCloudSpec, MachineType};
use ngo_cloud_alicloud::{
    ActivityStatus, Client, ClientOptions, CredentialsProvider, Error, RemovalFailureReason,
    RemoveOptions, ScalingActivity, ScalingInstance, provider_id,
};
use ngo_index::template::labels::{valid_label_key, valid_label_value};

/// The backend's name (`status.backend`), the spec field naming it.
pub const BACKEND_NAME: &str = "aliCloud";

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

/// A scaling group's own size bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupBounds {
    /// `MinSize`.
    pub min: u32,
    /// `MaxSize`.
    pub max: u32,
}

impl AliCloudPool {
    /// Connects to the group of `spec` with `options` ([`client_options`](super::client_options)) and
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
            && a.status == ActivityStatus::Rejected
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
