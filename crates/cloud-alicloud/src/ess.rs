//! Auto Scaling (ESS, `2014-08-28`): reads of scaling groups, their instances, scaling
//! configurations and activities, and the writes a node-group reconciler makes — scale out by
//! a quantity, remove exact instances, and lower a desired capacity a short launch left
//! raised. Wire shapes follow the SDK's
//! `services/ess/*.go` (cluster-autoscaler vendors `describe_scaling_groups.go`,
//! `describe_scaling_instances.go`, `describe_scaling_configurations.go`,
//! `modify_scaling_group.go`, `remove_instances.go`; the newer `DesiredCapacity`,
//! `DecreaseDesiredCapacity`, `ClientToken`, `VSwitchIds`, `ZoneId` and
//! `DescribeScalingActivities` come from the current aliyun/alibaba-cloud-sdk-go).

use std::collections::{BTreeMap, HashSet};

use ngo_cloud_http::lenient;
use serde::Deserialize;

use super::client::{Client, Product};
use super::error::Error;
use super::model::{
    ActivityStatus, GroupLifecycleState, InstanceLifecycleState, RemovalFailure,
    RemovalFailureReason, RemovalReport, RemoveOptions, ScaleOutStarted, ScalingActivity,
    ScalingConfiguration, ScalingGroup, ScalingInstance,
};
use super::signature::nonce;

/// Largest page ESS serves (`PageSize` of the Describe calls).
pub const MAX_PAGE_SIZE: u32 = 50;
/// Most instances one `RemoveInstances` call takes (`InstanceId.N`, N in 1..=20).
pub const REMOVE_BATCH_LIMIT: usize = 20;
/// Most activities one `DescribeScalingActivities` call names (`ScalingActivityId.N`).
pub const ACTIVITIES_PER_CALL: usize = 20;

/// Typed ESS calls; from [`Client::ess`].
#[derive(Clone)]
pub struct Ess {
    client: Client,
}

impl Client {
    /// Typed ESS calls.
    pub fn ess(&self) -> Ess {
        Ess::new(self.clone())
    }
}

fn p(key: impl Into<String>, value: impl Into<String>) -> (String, String) {
    (key.into(), value.into())
}

impl Ess {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        action: &str,
        params: &[(String, String)],
    ) -> Result<T, Error> {
        self.client.call(Product::Ess, action, params).await
    }

    /// The group, read now (`DescribeScalingGroups` with `ScalingGroupId.1`). An unknown id
    /// is [`Error::GroupNotFound`]: the API answers an empty list, not an error.
    pub async fn scaling_group(&self, group_id: &str) -> Result<ScalingGroup, Error> {
        let response: wire::DescribeScalingGroups = self
            .call(
                "DescribeScalingGroups",
                &[p("ScalingGroupId.1", group_id), p("PageSize", "10")],
            )
            .await?;
        response
            .groups
            .items
            .into_iter()
            .find(|g| g.id == group_id)
            .map(ScalingGroup::from)
            .ok_or_else(|| Error::GroupNotFound {
                group_id: group_id.to_string(),
            })
    }

    /// Every instance of the group in every lifecycle state (`DescribeScalingInstances`,
    /// pages of 50 until `TotalCount`). Pages are read one after the other, so an instance
    /// that joins or leaves meanwhile may be missed or seen twice; it is listed once.
    pub async fn scaling_instances(&self, group_id: &str) -> Result<Vec<ScalingInstance>, Error> {
        let mut instances: Vec<ScalingInstance> = Vec::new();
        let mut seen = HashSet::new();
        for page in 1u32.. {
            let response: wire::DescribeScalingInstances = self
                .call(
                    "DescribeScalingInstances",
                    &[
                        p("ScalingGroupId", group_id),
                        p("PageNumber", page.to_string()),
                        p("PageSize", MAX_PAGE_SIZE.to_string()),
                    ],
                )
                .await?;
            let got = response.instances.items.len();
            for instance in response.instances.items {
                if seen.insert(instance.instance_id.clone()) {
                    instances.push(ScalingInstance::from(instance));
                }
            }
            let read = u64::from(page) * u64::from(MAX_PAGE_SIZE);
            if got == 0 || read >= u64::from(response.total_count) {
                break;
            }
        }
        Ok(instances)
    }

    /// One scaling configuration of the group (`DescribeScalingConfigurations` with
    /// `ScalingConfigurationId.1`), `None` if the group has no such configuration.
    pub async fn scaling_configuration(
        &self,
        group_id: &str,
        configuration_id: &str,
    ) -> Result<Option<ScalingConfiguration>, Error> {
        let response: wire::DescribeScalingConfigurations = self
            .call(
                "DescribeScalingConfigurations",
                &[
                    p("ScalingGroupId", group_id),
                    p("ScalingConfigurationId.1", configuration_id),
                ],
            )
            .await?;
        Ok(response
            .configurations
            .items
            .into_iter()
            .find(|c| c.id == configuration_id)
            .map(ScalingConfiguration::from))
    }

    /// Each instance's `LifecycleState`, by id.
    async fn lifecycle_states(
        &self,
        group_id: &str,
    ) -> Result<BTreeMap<String, InstanceLifecycleState>, Error> {
        Ok(self
            .scaling_instances(group_id)
            .await?
            .into_iter()
            .map(|i| (i.instance_id, i.lifecycle_state))
            .collect())
    }

    /// Sets the group's expected number of instances (`ModifyScalingGroup`
    /// `DesiredCapacity`), an absolute value: callers set one they have just read the group
    /// for. A group with expected capacity starts activities of its own to reach it.
    pub async fn set_desired_capacity(&self, group_id: &str, desired: u32) -> Result<(), Error> {
        let _: wire::Empty = self
            .call(
                "ModifyScalingGroup",
                &[
                    p("ScalingGroupId", group_id),
                    p("DesiredCapacity", desired.to_string()),
                ],
            )
            .await?;
        Ok(())
    }

    /// Removes exactly `instance_ids` from the group, reporting what happened to each.
    ///
    /// The group's instances are listed first: an id that is not in the group, or not in a
    /// state ESS removes (`Pending`, `Pending:Wait`), fails without a call; one already
    /// `Removing` is reported as such; a `Protected` or `Standby` one is never sent
    /// ([`RemovalFailureReason::HeldByUser`]): ESS removes those when named, and a user set
    /// them aside. The rest go in one `RemoveInstances` call of at most
    /// [`REMOVE_BATCH_LIMIT`]; any beyond it are [`RemovalFailureReason::Deferred`]: the
    /// accepted call starts a scaling activity, and ESS rejects further removals until it
    /// ends (`ScalingActivityInProgress`), so send them on a later pass. When ESS rejects the
    /// call for an instance's state or membership (`InvalidInstanceId.NotFound`,
    /// `IncorrectInstanceStatus`: one changed since the listing), the instances are listed
    /// again and those now not removable are taken out by their `LifecycleState`; the error
    /// answer's wording is not read. If none changed, or on any other rejection, the whole
    /// batch fails with ESS's error (`IncorrectCapacity.MinSize`,
    /// `ScalingActivityInProgress`...).
    ///
    /// The call carries a `ClientToken` that stays the same across its retries, so a retry
    /// after a lost answer cannot remove twice. If no answer came at all, the batch is
    /// [`RemovalFailureReason::OutcomeUnknown`]: list the instances again.
    ///
    /// Returns `Err` only when nothing was attempted (the listing failed, no credentials).
    pub async fn remove_instances(
        &self,
        group_id: &str,
        instance_ids: &[String],
        options: RemoveOptions,
    ) -> Result<RemovalReport, Error> {
        let listed = self.lifecycle_states(group_id).await?;
        let mut report = RemovalReport::default();
        let mut batch = Vec::new();
        let mut requested = HashSet::new();
        for id in instance_ids {
            if !requested.insert(id.as_str()) {
                continue;
            }
            let reason = match not_removable(listed.get(id)) {
                Some(reason) => Some(reason),
                None if batch.len() >= REMOVE_BATCH_LIMIT => Some(RemovalFailureReason::Deferred),
                None => None,
            };
            match reason {
                Some(reason) => report.failed.push(RemovalFailure {
                    instance_id: id.clone(),
                    reason,
                }),
                None => batch.push(id.clone()),
            }
        }
        while !batch.is_empty() {
            let mut params = vec![
                p("ScalingGroupId", group_id),
                p(
                    "DecreaseDesiredCapacity",
                    options.decrease_desired_capacity.to_string(),
                ),
                p("ClientToken", nonce()),
            ];
            if let Some(policy) = &options.remove_policy {
                params.push(p("RemovePolicy", policy.clone()));
            }
            params.extend(
                batch
                    .iter()
                    .enumerate()
                    .map(|(i, id)| p(format!("InstanceId.{}", i + 1), id.clone())),
            );
            match self
                .call::<wire::ActivityStarted>("RemoveInstances", &params)
                .await
            {
                Ok(started) => {
                    report.scaling_activity_id = started.scaling_activity_id;
                    report.removed = std::mem::take(&mut batch);
                }
                Err(Error::Api { error, .. }) => {
                    let about_instances = matches!(
                        error.code.as_str(),
                        "InvalidInstanceId.NotFound" | "IncorrectInstanceStatus"
                    );
                    // Which instance: listed again, by its documented LifecycleState.
                    let changed: Vec<(String, RemovalFailureReason)> = if about_instances {
                        match self.lifecycle_states(group_id).await {
                            Ok(now) => batch
                                .iter()
                                .filter_map(|id| {
                                    not_removable(now.get(id)).map(|r| (id.clone(), r))
                                })
                                .collect(),
                            Err(_) => Vec::new(),
                        }
                    } else {
                        Vec::new()
                    };
                    if changed.is_empty() {
                        fail_all(&mut report, &mut batch, |_| {
                            RemovalFailureReason::Rejected((*error).clone())
                        });
                    } else {
                        for (id, reason) in changed {
                            batch.retain(|b| *b != id);
                            report.failed.push(RemovalFailure {
                                instance_id: id,
                                reason,
                            });
                        }
                    }
                }
                Err(Error::Throttled { last, .. }) => fail_all(&mut report, &mut batch, |_| {
                    RemovalFailureReason::Rejected((*last).clone())
                }),
                // Nothing was sent.
                Err(e @ (Error::Credentials(_) | Error::Config(_))) => return Err(e),
                Err(e) => {
                    let message = e.to_string();
                    fail_all(&mut report, &mut batch, |_| {
                        RemovalFailureReason::OutcomeUnknown(message.clone())
                    });
                }
            }
        }
        Ok(report)
    }

    /// Starts a scale-out of `count` instances (`ScaleWithAdjustment`,
    /// `AdjustmentType=QuantityChangeInCapacity`), as cluster-autoscaler's alicloud provider
    /// resizes (`alicloud_auto_scaling.go` `setCapacityInstanceSize`, which sends an absolute
    /// `TotalCapacity` instead; a relative change cannot undo a concurrent one).
    ///
    /// `client_token` (at most 64 ASCII characters) is ESS's idempotency key: a repeated
    /// call with the same token starts nothing new and answers the first call's activity,
    /// so a retry after a lost answer never scales twice. `metadata` becomes the activity's
    /// `ActivityMetadata` (JSON), which [`Ess::scaling_activities_by_id`] reads back:
    /// instances name their activity (`ScalingActivityId`), so an instance can be traced to
    /// the request that made it. `SyncActivity=true` makes a group with expected capacity
    /// start the activity now (rather than only raise its desired capacity).
    ///
    /// ESS refuses the call while another activity runs (`ScalingActivityInProgress`) and
    /// clamps the result to MaxSize instead of failing.
    pub async fn scale_out(
        &self,
        group_id: &str,
        count: u32,
        client_token: &str,
        metadata: &BTreeMap<String, String>,
    ) -> Result<ScaleOutStarted, Error> {
        let metadata = serde_json::to_string(metadata)
            .map_err(|e| Error::Config(format!("ActivityMetadata: {e}")))?;
        let started: wire::ScaleStarted = self
            .call(
                "ScaleWithAdjustment",
                &[
                    p("ScalingGroupId", group_id),
                    p("AdjustmentType", "QuantityChangeInCapacity"),
                    p("AdjustmentValue", count.to_string()),
                    p("ClientToken", client_token),
                    p("ActivityMetadata", metadata),
                    p("SyncActivity", "true"),
                ],
            )
            .await?;
        Ok(ScaleOutStarted {
            scaling_activity_id: started.scaling_activity_id,
            activity_type: started.activity_type,
        })
    }

    /// Writes `user_data` (plain text; sent Base64-encoded, as the API wants it) into
    /// scaling configuration `configuration_id` (`ModifyScalingConfiguration`): instances
    /// ESS launches from then on boot with it.
    pub async fn set_user_data(
        &self,
        configuration_id: &str,
        user_data: &str,
    ) -> Result<(), Error> {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_data);
        let _: wire::Empty = self
            .call(
                "ModifyScalingConfiguration",
                &[
                    p("ScalingConfigurationId", configuration_id),
                    p("UserData", encoded),
                ],
            )
            .await?;
        Ok(())
    }

    /// The named activities of the group (`DescribeScalingActivities` with
    /// `ScalingActivityId.N`, twenty per call); unknown ids are left out.
    pub async fn scaling_activities_by_id(
        &self,
        group_id: &str,
        ids: &[&str],
    ) -> Result<Vec<ScalingActivity>, Error> {
        let mut wanted: Vec<&str> = Vec::new();
        for id in ids {
            if !id.is_empty() && !wanted.contains(id) {
                wanted.push(id);
            }
        }
        let mut found = Vec::new();
        for chunk in wanted.chunks(ACTIVITIES_PER_CALL) {
            let mut params = vec![
                p("ScalingGroupId", group_id),
                p("PageSize", MAX_PAGE_SIZE.to_string()),
            ];
            params.extend(
                chunk
                    .iter()
                    .enumerate()
                    .map(|(i, id)| p(format!("ScalingActivityId.{}", i + 1), *id)),
            );
            let response: wire::DescribeScalingActivities =
                self.call("DescribeScalingActivities", &params).await?;
            found.extend(
                response
                    .activities
                    .items
                    .into_iter()
                    .filter(|a| chunk.contains(&a.id.as_str()))
                    .map(ScalingActivity::from),
            );
        }
        Ok(found)
    }

    /// The group's `max` most recent scaling activities (`DescribeScalingActivities`, pages
    /// of 50 by `PageNumber` until `TotalCount`), newest first, only those with `status`
    /// when given. ESS keeps 30 days of activities.
    ///
    /// The API reference does not say in which order activities are listed. The first and
    /// last pages tell: when the first `StartTime` listed is earlier than the last, the
    /// newest are on the last pages, which are read from the last backwards; otherwise
    /// pages are read from the first. `StartTime` has minutes only: when every activity
    /// started in the same minute the order cannot be told from documented fields, and the
    /// listing order is taken as newest first (all of them are read when there are at most
    /// `max`). The result is sorted by `StartTime`, newest first, ties in the order read.
    pub async fn scaling_activities(
        &self,
        group_id: &str,
        status: Option<ActivityStatus>,
        max: u32,
    ) -> Result<Vec<ScalingActivity>, Error> {
        let max = usize::try_from(max).unwrap_or(usize::MAX);
        let page = |number: u32| {
            let mut params = vec![
                p("ScalingGroupId", group_id),
                p("PageNumber", number.to_string()),
                p("PageSize", MAX_PAGE_SIZE.to_string()),
            ];
            if let Some(status) = &status {
                params.push(p("StatusCode", status.to_string()));
            }
            async move {
                let response: wire::DescribeScalingActivities =
                    self.call("DescribeScalingActivities", &params).await?;
                Ok::<_, Error>((
                    response.total_count,
                    response
                        .activities
                        .items
                        .into_iter()
                        .map(ScalingActivity::from)
                        .collect::<Vec<_>>(),
                ))
            }
        };
        let (total, first) = page(1).await?;
        let pages = total.div_ceil(MAX_PAGE_SIZE).max(1);
        let mut read: BTreeMap<u32, Vec<ScalingActivity>> = BTreeMap::from([(1, first)]);
        if pages > 1 {
            read.insert(pages, page(pages).await?.1);
        }
        let earliest_listed = read[&1].first().map(|a| a.start_time.clone());
        let latest_listed = read
            .values()
            .next_back()
            .and_then(|items| items.last())
            .map(|a| a.start_time.clone());
        let oldest_first = matches!(
            (earliest_listed, latest_listed),
            (Some(a), Some(b)) if a < b
        );
        let order: Vec<u32> = if oldest_first {
            (1..=pages).rev().collect()
        } else {
            (1..=pages).collect()
        };
        let mut seen: HashSet<String> = HashSet::new();
        let mut found: Vec<ScalingActivity> = Vec::new();
        for number in order {
            if found.len() >= max {
                break;
            }
            let mut items = match read.remove(&number) {
                Some(items) => items,
                None => page(number).await?.1,
            };
            if oldest_first {
                items.reverse();
            }
            found.extend(items.into_iter().filter(|a| seen.insert(a.id.clone())));
        }
        found.sort_by(|a, b| b.start_time.cmp(&a.start_time));
        found.truncate(max);
        Ok(found)
    }

    /// The group's failed activities (out of stock, quota, ...), newest first, at most `max`.
    pub async fn failed_activities(
        &self,
        group_id: &str,
        max: u32,
    ) -> Result<Vec<ScalingActivity>, Error> {
        self.scaling_activities(group_id, Some(ActivityStatus::Failed), max)
            .await
    }

    /// One activity by id (`ScalingActivityId.1`), e.g. the one a removal started.
    pub async fn scaling_activity(
        &self,
        group_id: &str,
        activity_id: &str,
    ) -> Result<Option<ScalingActivity>, Error> {
        let response: wire::DescribeScalingActivities = self
            .call(
                "DescribeScalingActivities",
                &[
                    p("ScalingGroupId", group_id),
                    p("ScalingActivityId.1", activity_id),
                ],
            )
            .await?;
        Ok(response
            .activities
            .items
            .into_iter()
            .find(|a| a.id == activity_id)
            .map(ScalingActivity::from))
    }
}

/// Why an instance in `state` (`None`: not listed) is not sent for removal, if it is not.
fn not_removable(state: Option<&InstanceLifecycleState>) -> Option<RemovalFailureReason> {
    match state {
        None => Some(RemovalFailureReason::NotInGroup),
        Some(InstanceLifecycleState::Removing | InstanceLifecycleState::RemovingWait) => {
            Some(RemovalFailureReason::AlreadyRemoving)
        }
        Some(state @ (InstanceLifecycleState::Pending | InstanceLifecycleState::PendingWait)) => {
            Some(RemovalFailureReason::NotRemovable(state.clone()))
        }
        Some(state @ (InstanceLifecycleState::Protected | InstanceLifecycleState::Standby)) => {
            Some(RemovalFailureReason::HeldByUser(state.clone()))
        }
        Some(_) => None,
    }
}

fn fail_all(
    report: &mut RemovalReport,
    batch: &mut Vec<String>,
    reason: impl Fn(&str) -> RemovalFailureReason,
) {
    for id in batch.drain(..) {
        let reason = reason(&id);
        report.failed.push(RemovalFailure {
            instance_id: id,
            reason,
        });
    }
}

/// The JSON shapes, tolerant per [`lenient`] (see the crate's documentation).
pub(super) mod wire {
    use super::*;

    /// An answer whose content does not matter (`RequestId` only).
    #[derive(Deserialize, Default)]
    pub struct Empty {}

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScaleStarted {
        #[serde(deserialize_with = "lenient::opt_string")]
        pub scaling_activity_id: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub activity_type: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ActivityStarted {
        #[serde(deserialize_with = "lenient::opt_string")]
        pub scaling_activity_id: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeScalingGroups {
        #[serde(rename = "ScalingGroups", deserialize_with = "lenient::object")]
        pub groups: ScalingGroups,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingGroups {
        #[serde(rename = "ScalingGroup", deserialize_with = "lenient::list")]
        pub items: Vec<ScalingGroup>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingGroup {
        #[serde(rename = "ScalingGroupId", deserialize_with = "lenient::string")]
        pub id: String,
        #[serde(rename = "ScalingGroupName", deserialize_with = "lenient::string")]
        pub name: String,
        #[serde(deserialize_with = "lenient::string")]
        pub region_id: String,
        #[serde(deserialize_with = "lenient::string")]
        pub lifecycle_state: String,
        #[serde(deserialize_with = "lenient::int")]
        pub min_size: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub max_size: u32,
        #[serde(deserialize_with = "lenient::opt_int")]
        pub desired_capacity: Option<u32>,
        #[serde(deserialize_with = "lenient::opt_bool")]
        pub enable_desired_capacity: Option<bool>,
        #[serde(deserialize_with = "lenient::int")]
        pub total_capacity: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub active_capacity: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub pending_capacity: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub removing_capacity: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub init_capacity: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub standby_capacity: u32,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub active_scaling_configuration_id: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub launch_template_id: Option<String>,
        #[serde(rename = "VSwitchId", deserialize_with = "lenient::opt_string")]
        pub vswitch_id: Option<String>,
        #[serde(rename = "VSwitchIds", deserialize_with = "lenient::object")]
        pub vswitch_ids: VSwitchIds,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct VSwitchIds {
        #[serde(rename = "VSwitchId", deserialize_with = "lenient::list")]
        pub items: Vec<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeScalingInstances {
        #[serde(deserialize_with = "lenient::int")]
        pub total_count: u32,
        #[serde(rename = "ScalingInstances", deserialize_with = "lenient::object")]
        pub instances: ScalingInstances,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingInstances {
        #[serde(rename = "ScalingInstance", deserialize_with = "lenient::list")]
        pub items: Vec<ScalingInstance>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingInstance {
        #[serde(deserialize_with = "lenient::string")]
        pub instance_id: String,
        #[serde(deserialize_with = "lenient::string")]
        pub lifecycle_state: String,
        #[serde(deserialize_with = "lenient::string")]
        pub health_status: String,
        #[serde(deserialize_with = "lenient::string")]
        pub creation_type: String,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub zone_id: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub instance_type: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub scaling_configuration_id: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub scaling_activity_id: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub creation_time: Option<String>,
        #[serde(deserialize_with = "lenient::bool")]
        pub entrusted: bool,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeScalingConfigurations {
        #[serde(rename = "ScalingConfigurations", deserialize_with = "lenient::object")]
        pub configurations: ScalingConfigurations,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingConfigurations {
        #[serde(rename = "ScalingConfiguration", deserialize_with = "lenient::list")]
        pub items: Vec<ScalingConfiguration>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingConfiguration {
        #[serde(
            rename = "ScalingConfigurationId",
            deserialize_with = "lenient::string"
        )]
        pub id: String,
        #[serde(
            rename = "ScalingConfigurationName",
            deserialize_with = "lenient::string"
        )]
        pub name: String,
        #[serde(deserialize_with = "lenient::string")]
        pub lifecycle_state: String,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub instance_type: Option<String>,
        #[serde(deserialize_with = "lenient::object")]
        pub instance_types: InstanceTypes,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub image_id: Option<String>,
        #[serde(deserialize_with = "lenient::object")]
        pub tags: Tags,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct InstanceTypes {
        #[serde(rename = "InstanceType", deserialize_with = "lenient::list")]
        pub items: Vec<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct Tags {
        #[serde(rename = "Tag", deserialize_with = "lenient::list")]
        pub items: Vec<Tag>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct Tag {
        #[serde(deserialize_with = "lenient::string")]
        pub key: String,
        #[serde(deserialize_with = "lenient::string")]
        pub value: String,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct DescribeScalingActivities {
        #[serde(deserialize_with = "lenient::int")]
        pub total_count: u32,
        #[serde(rename = "ScalingActivities", deserialize_with = "lenient::object")]
        pub activities: ScalingActivities,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingActivities {
        #[serde(rename = "ScalingActivity", deserialize_with = "lenient::list")]
        pub items: Vec<ScalingActivity>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct ScalingActivity {
        #[serde(rename = "ScalingActivityId", deserialize_with = "lenient::string")]
        pub id: String,
        #[serde(deserialize_with = "lenient::string")]
        pub status_code: String,
        #[serde(deserialize_with = "lenient::string")]
        pub status_message: String,
        #[serde(deserialize_with = "lenient::string")]
        pub cause: String,
        #[serde(deserialize_with = "lenient::string")]
        pub description: String,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub start_time: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub end_time: Option<String>,
        #[serde(deserialize_with = "lenient::int")]
        pub progress: u32,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub error_code: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub error_message: Option<String>,
        #[serde(deserialize_with = "lenient::opt_string")]
        pub activity_metadata: Option<String>,
        #[serde(deserialize_with = "lenient::object")]
        pub created_instances: CreatedInstances,
        #[serde(deserialize_with = "lenient::int")]
        pub scaling_instance_number: u32,
        #[serde(deserialize_with = "lenient::int")]
        pub created_capacity: u32,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "PascalCase", default)]
    pub struct CreatedInstances {
        #[serde(rename = "CreatedInstance", deserialize_with = "lenient::list")]
        pub items: Vec<String>,
    }
}

impl From<wire::ScalingGroup> for ScalingGroup {
    fn from(g: wire::ScalingGroup) -> Self {
        // Groups without expected capacity report no (or a meaningless) DesiredCapacity.
        let desired_capacity = match g.enable_desired_capacity {
            Some(false) => None,
            _ => g.desired_capacity,
        };
        let mut vswitch_ids = g.vswitch_ids.items;
        if vswitch_ids.is_empty()
            && let Some(one) = g.vswitch_id
        {
            vswitch_ids.push(one);
        }
        Self {
            id: g.id,
            name: g.name,
            region_id: g.region_id,
            lifecycle_state: GroupLifecycleState::from(g.lifecycle_state.as_str()),
            min_size: g.min_size,
            max_size: g.max_size,
            desired_capacity,
            total_capacity: g.total_capacity,
            active_capacity: g.active_capacity,
            pending_capacity: g.pending_capacity,
            removing_capacity: g.removing_capacity,
            init_capacity: g.init_capacity,
            standby_capacity: g.standby_capacity,
            active_scaling_configuration_id: g.active_scaling_configuration_id,
            launch_template_id: g.launch_template_id,
            vswitch_ids,
        }
    }
}

impl From<wire::ScalingInstance> for ScalingInstance {
    fn from(i: wire::ScalingInstance) -> Self {
        Self {
            lifecycle_state: InstanceLifecycleState::from(i.lifecycle_state.as_str()),
            instance_id: i.instance_id,
            health_status: i.health_status,
            creation_type: i.creation_type,
            zone_id: i.zone_id,
            instance_type: i.instance_type,
            scaling_configuration_id: i.scaling_configuration_id,
            scaling_activity_id: i.scaling_activity_id,
            creation_time: i.creation_time,
            entrusted: i.entrusted,
        }
    }
}

impl From<wire::ScalingConfiguration> for ScalingConfiguration {
    fn from(c: wire::ScalingConfiguration) -> Self {
        Self {
            id: c.id,
            name: c.name,
            lifecycle_state: c.lifecycle_state,
            instance_type: c.instance_type,
            instance_types: c.instance_types.items,
            image_id: c.image_id,
            tags: c.tags.items.into_iter().map(|t| (t.key, t.value)).collect(),
        }
    }
}

impl From<wire::ScalingActivity> for ScalingActivity {
    fn from(a: wire::ScalingActivity) -> Self {
        Self {
            id: a.id,
            status: ActivityStatus::from(a.status_code.as_str()),
            status_message: a.status_message,
            cause: a.cause,
            description: a.description,
            start_time: a.start_time,
            end_time: a.end_time,
            progress: a.progress,
            error_code: a.error_code,
            error_message: a.error_message,
            metadata: a
                .activity_metadata
                .as_deref()
                .and_then(|m| serde_json::from_str::<BTreeMap<String, serde_json::Value>>(m).ok())
                .map(|m| {
                    m.into_iter()
                        .map(|(k, v)| match v {
                            serde_json::Value::String(s) => (k, s),
                            other => (k, other.to_string()),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            created_instances: a.created_instances.items,
            scaling_instance_number: a.scaling_instance_number,
            created_capacity: a.created_capacity,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_scaling_group_with_loose_types() {
        let body = br#"{"RequestId":"R1","PageNumber":1,"PageSize":10,"TotalCount":"1","ScalingGroups":
            {"ScalingGroup":[{"ScalingGroupId":"asg-1","ScalingGroupName":"workers","RegionId":"cn-hangzhou",
            "LifecycleState":"Active","MinSize":"0","MaxSize":10,"DesiredCapacity":2,"EnableDesiredCapacity":"true",
            "ActiveCapacity":2,"PendingCapacity":null,"TotalCapacity":2.0,"ActiveScalingConfigurationId":"asc-1",
            "VSwitchIds":{"VSwitchId":["vsw-a","vsw-b"]}}]}}"#;
        let response: wire::DescribeScalingGroups = serde_json::from_slice(body).unwrap();
        let group = ScalingGroup::from(response.groups.items.into_iter().next().unwrap());
        assert_eq!(group.lifecycle_state, GroupLifecycleState::Active);
        assert_eq!((group.min_size, group.max_size), (0, 10));
        assert_eq!(group.desired_capacity, Some(2));
        assert_eq!(group.total_capacity, 2);
        assert_eq!(group.pending_capacity, 0);
        assert_eq!(group.vswitch_ids, ["vsw-a", "vsw-b"]);
        assert_eq!(
            group.active_scaling_configuration_id.as_deref(),
            Some("asc-1")
        );
    }

    #[test]
    fn a_group_without_expected_capacity_has_no_desired_capacity() {
        let body = br#"{"ScalingGroups":{"ScalingGroup":[{"ScalingGroupId":"asg-1","DesiredCapacity":0,
            "EnableDesiredCapacity":false,"ActiveCapacity":2,"PendingCapacity":1,"InitCapacity":1}]}}"#;
        let response: wire::DescribeScalingGroups = serde_json::from_slice(body).unwrap();
        let group = ScalingGroup::from(response.groups.items.into_iter().next().unwrap());
        assert_eq!(group.desired_capacity, None);
        assert_eq!(group.target_size(), 4);
    }

    #[test]
    fn an_empty_group_list_and_missing_wrappers_decode() {
        for body in [
            &br#"{"RequestId":"R","TotalCount":0,"ScalingGroups":{"ScalingGroup":[]}}"#[..],
            br#"{"RequestId":"R","ScalingGroups":[]}"#,
            br#"{"RequestId":"R"}"#,
        ] {
            let response: wire::DescribeScalingGroups = serde_json::from_slice(body).unwrap();
            assert!(response.groups.items.is_empty());
        }
    }

    #[test]
    fn decodes_instances_configurations_and_activities() {
        let body = br#"{"TotalCount":1,"ScalingInstances":{"ScalingInstance":{"InstanceId":"i-1",
            "LifecycleState":"Pending:Wait","HealthStatus":"Healthy","CreationType":"AutoCreated","ZoneId":"cn-hangzhou-k"}}}"#;
        let r: wire::DescribeScalingInstances = serde_json::from_slice(body).unwrap();
        let i = ScalingInstance::from(r.instances.items.into_iter().next().unwrap());
        assert_eq!(i.lifecycle_state, InstanceLifecycleState::PendingWait);
        assert_eq!(i.zone_id.as_deref(), Some("cn-hangzhou-k"));

        let body = br#"{"ScalingConfigurations":{"ScalingConfiguration":[{"ScalingConfigurationId":"asc-1",
            "InstanceType":"ecs.g6.large","InstanceTypes":{"InstanceType":["ecs.g6.large","ecs.g7.large"]},
            "Tags":{"Tag":[{"Key":"workload_type","Value":"cpu"}]}}]}}"#;
        let r: wire::DescribeScalingConfigurations = serde_json::from_slice(body).unwrap();
        let c = ScalingConfiguration::from(r.configurations.items.into_iter().next().unwrap());
        assert_eq!(c.instance_types, ["ecs.g6.large", "ecs.g7.large"]);
        assert_eq!(c.tags.get("workload_type").map(String::as_str), Some("cpu"));

        let body = br#"{"ScalingActivities":{"ScalingActivity":[{"ScalingActivityId":"asa-1","StatusCode":"Failed",
            "StatusMessage":"out of stock","Progress":"100"}]}}"#;
        let r: wire::DescribeScalingActivities = serde_json::from_slice(body).unwrap();
        let a = ScalingActivity::from(r.activities.items.into_iter().next().unwrap());
        assert_eq!(a.status, ActivityStatus::Failed);
        assert_eq!(a.progress, 100);
        assert!(a.metadata.is_empty());

        // The metadata a scale-out sent comes back as a JSON string.
        let body = br#"{"ScalingActivities":{"ScalingActivity":[{"ScalingActivityId":"asa-2","StatusCode":"Successful",
            "ActivityMetadata":"{\"nodegroup.dev/requests\":\"r1,r2\",\"n\":2}","ScalingInstanceNumber":2,
            "CreatedInstances":{"CreatedInstance":["i-a","i-b"]}}]}}"#;
        let r: wire::DescribeScalingActivities = serde_json::from_slice(body).unwrap();
        let a = ScalingActivity::from(r.activities.items.into_iter().next().unwrap());
        assert_eq!(a.metadata["nodegroup.dev/requests"], "r1,r2");
        assert_eq!(a.metadata["n"], "2");
        assert_eq!(a.created_instances, ["i-a", "i-b"]);
        assert_eq!(a.scaling_instance_number, 2);
        let started: wire::ScaleStarted = serde_json::from_slice(
            br#"{"RequestId":"R4","ScalingActivityId":"asa-1","ActivityType":"CapacityChange"}"#,
        )
        .unwrap();
        assert_eq!(started.activity_type.as_deref(), Some("CapacityChange"));
    }
}
