//! `ScaleWithAdjustment`, and the activities that launch and remove instances, started by a
//! call or by a group converging to its desired capacity.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::account::Account;
use super::errors::ApiError;
use super::params::{Params, int};
use super::types::{Activity, ActivityStatus, Effects, EmulatedInstance, InstanceState};
use crate::boot::BootOutcome;

impl Account {
    pub(super) fn scale_with_adjustment(
        &mut self,
        params: &Params,
    ) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let kind = params
            .get("AdjustmentType")
            .ok_or_else(|| ApiError::missing("AdjustmentType"))?;
        let value =
            int(params, "AdjustmentValue")?.ok_or_else(|| ApiError::missing("AdjustmentValue"))?;
        if let Some(m) = params.get("ActivityMetadata") {
            let object = serde_json::from_str::<Value>(m)
                .ok()
                .filter(Value::is_object);
            if object.is_none() || m.len() > 4096 {
                return Err(ApiError::invalid(
                    "ActivityMetadata",
                    "must be a JSON object of at most 4096 characters",
                ));
            }
        }
        let group = self.writable(&id)?;
        let (min, max) = (group.spec.min_size, group.spec.max_size);
        let total = i64::from(self.total(&id));
        let wanted = match kind.as_str() {
            "QuantityChangeInCapacity" => total + value,
            "TotalCapacity" => value,
            "PercentChangeInCapacity" => total + total * value / 100,
            _ => {
                return Err(ApiError::invalid(
                    "AdjustmentType",
                    "must be QuantityChangeInCapacity, PercentChangeInCapacity or TotalCapacity",
                ));
            }
        };
        let target = u32::try_from(wanted.clamp(i64::from(min), i64::from(max))).unwrap_or(min);
        let enabled = group.spec.desired_capacity.is_some();
        if let Some(g) = self.groups.get_mut(&id)
            && enabled
        {
            g.spec.desired_capacity = Some(target);
        }
        let current = self.total(&id);
        let metadata = params.get("ActivityMetadata").cloned();
        let cause = format!(
            "A user requested to execute scaling rule, changing the Total Capacity from \"{current}\" to \"{target}\"."
        );
        let activity = match target.cmp(&current) {
            std::cmp::Ordering::Equal => {
                let rejected = self.reject(&id, cause, metadata, kind, value);
                return Ok((json!({"ScalingActivityId": rejected}), Effects::default()));
            }
            std::cmp::Ordering::Greater => {
                self.start_scale_out(&id, target - current, cause, metadata)
            }
            std::cmp::Ordering::Less => self.start_scale_in(&id, current - target, cause, metadata),
        };
        Ok((
            json!({"ScalingActivityId": activity}),
            Effects {
                started: vec![activity],
            },
        ))
    }

    /// Records a `Rejected` activity: the adjustment would leave the total where it is
    /// (already at MaxSize for a scale-out, MinSize for a scale-in).
    fn reject(
        &mut self,
        group_id: &str,
        cause: String,
        metadata: Option<String>,
        kind: &str,
        value: i64,
    ) -> String {
        let activity_id = self.id("asa");
        let total = self.total(group_id);
        let now = Timestamp::now();
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::Rejected,
            description: format!("{kind} {value}"),
            cause,
            status_message: format!(
                "The scaling activity was rejected: the total capacity \"{total}\" would not change (MinSize/MaxSize reached)."
            ),
            error_code: None,
            metadata,
            created: Vec::new(),
            removed: Vec::new(),
            requested: 0,
            total_after: total,
            started: now,
            ended: Some(now),
        });
        activity_id
    }

    /// Starts an activity launching `count` instances (as many as the stock allows).
    pub(super) fn start_scale_out(
        &mut self,
        group_id: &str,
        count: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let activity_id = self.id("asa");
        let Some(group) = self.groups.get(group_id).cloned() else {
            return activity_id;
        };
        let instance_type = group.configuration.instance_type.clone();
        let available = self.stock.get(&instance_type).copied().unwrap_or(u32::MAX);
        let launch = count.min(available);
        if let Some(s) = self.stock.get_mut(&instance_type) {
            *s -= launch;
        }
        let mut created = Vec::new();
        let zones = if group.spec.zones.is_empty() {
            vec![format!("{}-a", self.region)]
        } else {
            group.spec.zones.clone()
        };
        for k in 0..launch {
            let id = self.id("i-emu");
            let n = self.next_id;
            let instance = EmulatedInstance {
                id: id.clone(),
                group_id: group_id.into(),
                configuration_id: group.configuration.id.clone(),
                instance_type: instance_type.clone(),
                zone: zones[k as usize % zones.len()].clone(),
                state: InstanceState::Pending,
                activity_id: activity_id.clone(),
                created_at: Timestamp::now(),
                private_ip: format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff),
                user_data: group.configuration.user_data.clone(),
                boot: BootOutcome::Pending,
            };
            self.instances.insert(id.clone(), instance);
            created.push(id);
        }
        let total_after = self.total(group_id);
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::InProgress,
            description: format!("Add \"{count}\" ECS instance(s)"),
            cause,
            status_message: String::new(),
            error_code: (launch < count).then(|| "OperationDenied.NoStock".to_string()),
            metadata,
            created,
            removed: Vec::new(),
            requested: count,
            total_after,
            started: Timestamp::now(),
            ended: None,
        });
        activity_id
    }

    /// Starts an activity removing the `count` oldest `InService` instances.
    pub(super) fn start_scale_in(
        &mut self,
        group_id: &str,
        count: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let mut candidates: Vec<(Timestamp, String)> = self
            .members(group_id)
            .iter()
            .filter(|i| i.state == InstanceState::InService)
            .filter(|i| !self.protected.contains(&i.id) && !self.standby.contains(&i.id))
            .map(|i| (i.created_at, i.id.clone()))
            .collect();
        candidates.sort();
        let ids: Vec<String> = candidates
            .into_iter()
            .take(count as usize)
            .map(|(_, id)| id)
            .collect();
        self.start_removal(group_id, &ids, count, cause, metadata)
    }

    pub(super) fn start_removal(
        &mut self,
        group_id: &str,
        ids: &[String],
        requested: u32,
        cause: String,
        metadata: Option<String>,
    ) -> String {
        let activity_id = self.id("asa");
        for id in ids {
            if let Some(i) = self.instances.get_mut(id) {
                i.state = InstanceState::Removing;
            }
            self.protected.remove(id);
            self.standby.remove(id);
        }
        let total_after = self
            .total(group_id)
            .saturating_sub(u32::try_from(ids.len()).unwrap_or(u32::MAX));
        self.activities.push(Activity {
            id: activity_id.clone(),
            group_id: group_id.into(),
            status: ActivityStatus::InProgress,
            description: format!("Remove \"{}\" ECS instance(s)", ids.len()),
            cause,
            status_message: String::new(),
            error_code: None,
            metadata,
            created: Vec::new(),
            removed: ids.to_vec(),
            requested,
            total_after,
            started: Timestamp::now(),
            ended: None,
        });
        activity_id
    }
}
