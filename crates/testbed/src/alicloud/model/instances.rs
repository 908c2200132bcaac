//! The instances of scaling groups: their lifecycle states as `DescribeScalingInstances` lists
//! them, and `RemoveInstances`.

use serde_json::{Value, json};

use super::account::Account;
use super::errors::ApiError;
use super::params::{Params, page_of, paging, repeated};
use super::types::{Effects, EmulatedInstance, InstanceState};

impl Account {
    /// The `LifecycleState` instance `i` is listed in.
    fn state_of(&self, i: &EmulatedInstance) -> &'static str {
        if i.state != InstanceState::InService {
            i.state.as_str()
        } else if self.protected.contains(&i.id) {
            "Protected"
        } else if self.standby.contains(&i.id) {
            "Standby"
        } else {
            "InService"
        }
    }

    pub(super) fn describe_instances(&self, params: &Params) -> Result<Value, ApiError> {
        let group_id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?;
        self.group(group_id)?;
        let ids = repeated(params, "InstanceId", 20)?;
        let state = params.get("LifecycleState");
        let (number, size) = paging(params)?;
        let instances: Vec<Value> = self
            .members(group_id)
            .into_iter()
            .filter(|i| ids.is_empty() || ids.contains(&i.id))
            .filter(|i| state.is_none_or(|s| s == self.state_of(i)))
            .map(|i| {
                json!({
                    "InstanceId": i.id,
                    "ScalingGroupId": i.group_id,
                    "ScalingConfigurationId": i.configuration_id,
                    "LifecycleState": self.state_of(i),
                    "HealthStatus": "Healthy",
                    "CreationType": "AutoCreated",
                    "ZoneId": i.zone,
                    "InstanceType": i.instance_type,
                    "ScalingActivityId": i.activity_id,
                    "CreationTime": i.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
                    "CreatedTime": i.created_at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                    "PrivateIpAddress": i.private_ip,
                    "Entrusted": false,
                    "WeightedCapacity": 1,
                    "LoadBalancerWeight": 50,
                    "WarmupState": "NoNeedWarmup",
                })
            })
            .collect();
        let mut page = page_of(
            instances,
            number,
            size,
            "ScalingInstances",
            "ScalingInstance",
        );
        // Every instance is pay-as-you-go: none preemptible.
        page["TotalSpotCount"] = json!(0);
        Ok(page)
    }

    pub(super) fn remove_instances(
        &mut self,
        params: &Params,
    ) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let requested = repeated(params, "InstanceId", 20)?;
        if requested.is_empty() {
            return Err(ApiError::missing("InstanceId.1"));
        }
        let decrease = params
            .get("DecreaseDesiredCapacity")
            .is_none_or(|v| v != "false");
        let ignore_invalid = params
            .get("IgnoreInvalidInstance")
            .is_some_and(|v| v == "true");
        if let Some(policy) = params.get("RemovePolicy")
            && !["release", "recycle", "remove"].contains(&policy.as_str())
        {
            return Err(ApiError::invalid(
                "RemovePolicy",
                "must be release, recycle or remove",
            ));
        }
        let group = self.writable(&id)?;
        let min = group.spec.min_size;
        let enabled = group.spec.desired_capacity.is_some();
        let mut ids = Vec::new();
        let named = |instance: &str| {
            if self.instance_errors_name_the_instance {
                format!(" \"{instance}\"")
            } else {
                String::new()
            }
        };
        for instance in &requested {
            // InService and Protected members are removed, Standby ones unless
            // `standby_removable` is off (see the module docs).
            let removable = |i: &EmulatedInstance| {
                i.state == InstanceState::InService
                    && (self.standby_removable || !self.standby.contains(&i.id))
            };
            match self.instances.get(instance) {
                Some(i) if i.group_id == id && removable(i) => {
                    if !ids.contains(instance) {
                        ids.push(instance.clone());
                    }
                }
                Some(i) if i.group_id == id => {
                    if !ignore_invalid {
                        // Wording of the other ESS pages (AttachInstances,
                        // EnableScalingGroup); RemoveInstances lists none.
                        return Err(ApiError::new(
                            400,
                            "IncorrectInstanceStatus",
                            format!(
                                "The current status of instance{} does not support this action.",
                                named(instance)
                            ),
                        ));
                    }
                }
                _ => {
                    if !ignore_invalid {
                        // RemoveInstances reference, error codes.
                        return Err(ApiError::new(
                            404,
                            "InvalidInstanceId.NotFound",
                            format!("Instance{} does not exist.", named(instance)),
                        ));
                    }
                }
            }
        }
        let total = self.total(&id);
        let n = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        if total.saturating_sub(n) < min {
            return Err(ApiError::new(
                400,
                "IncorrectCapacity.MinSize",
                // RemoveInstances reference, error codes.
                "To remove the instances, the total capacity will be lesser than the MinSize."
                    .to_string(),
            ));
        }
        if ids.is_empty() {
            return Ok((json!({}), Effects::default()));
        }
        if decrease
            && enabled
            && let Some(g) = self.groups.get_mut(&id)
        {
            g.spec.desired_capacity = Some(
                g.spec
                    .desired_capacity
                    .unwrap_or(0)
                    .saturating_sub(n)
                    .max(g.spec.min_size),
            );
        }
        let activity = self.start_removal(
            &id,
            &ids,
            n,
            format!("A user removed ECS instance(s) \"{}\".", ids.join(",")),
            None,
        );
        Ok((
            json!({"ScalingActivityId": activity}),
            Effects {
                started: vec![activity],
            },
        ))
    }
}
