//! Auto Scaling (ESS, `2014-08-28`): reads of scaling groups, their instances, scaling
//! configurations and activities, and the writes a node-group reconciler makes — scale out by
//! a quantity, remove exact instances, and lower a desired capacity a short launch left
//! raised. Wire shapes follow the SDK's
//! `services/ess/*.go` (cluster-autoscaler vendors `describe_scaling_groups.go`,
//! `describe_scaling_instances.go`, `describe_scaling_configurations.go`,
//! `modify_scaling_group.go`, `remove_instances.go`; the newer `DesiredCapacity`,
//! `DecreaseDesiredCapacity`, `ClientToken`, `VSwitchIds`, `ZoneId` and
//! `DescribeScalingActivities` come from the current aliyun/alibaba-cloud-sdk-go).

mod wire;

use std::collections::{BTreeMap, HashSet};

use super::client::{Client, Product};
use super::error::Error;
use super::model::{
    ActivityStatus, InstanceLifecycleState, RemovalFailure, RemovalFailureReason, RemovalReport,
    RemoveOptions, ScaleOutStarted, ScalingActivity, ScalingConfiguration, ScalingGroup,
    ScalingInstance,
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

#[cfg(test)]
mod tests;
