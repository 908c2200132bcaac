//! Scaling activities: how `DescribeScalingActivities` lists them, and how one ends (launched
//! instances go `InService`, removed ones are released, a short launch is retried when stock
//! returns).

use jiff::Timestamp;
use serde_json::{Value, json};

use super::account::Account;
use super::errors::ApiError;
use super::params::{Params, page_of, paging, repeated};
use super::types::{Activity, ActivityStatus, Finished, InstanceState};

impl Account {
    fn activity_json(a: &Activity) -> Value {
        let mut value = json!({
            "ScalingActivityId": a.id,
            "ScalingGroupId": a.group_id,
            "StatusCode": a.status.as_str(),
            "StatusMessage": a.status_message,
            "Description": a.description,
            "Cause": a.cause,
            "Progress": if a.status == ActivityStatus::InProgress { 50 } else { 100 },
            "StartTime": a.started.strftime("%Y-%m-%dT%H:%MZ").to_string(),
            "TotalCapacity": a.total_after.to_string(),
            // Every instance is created by the group (none attached), so the automatically
            // created ones are all of them.
            "AttachedCapacity": "0",
            "AutoCreatedCapacity": a.total_after.to_string(),
            "ScalingInstanceNumber": a.requested,
            "CreatedCapacity": a.created.len(),
            "DestroyedCapacity": a.removed.len(),
            "CreatedInstances": {"CreatedInstance": a.created},
            "DestroyedInstances": {"DestroyedInstance": a.removed},
        });
        if let Some(ended) = a.ended {
            value["EndTime"] = json!(ended.strftime("%Y-%m-%dT%H:%MZ").to_string());
        }
        if let Some(m) = &a.metadata {
            value["ActivityMetadata"] = json!(m);
        }
        if let Some(code) = &a.error_code {
            value["ErrorCode"] = json!(code);
            value["ErrorMessage"] = json!(a.status_message);
        }
        value
    }

    pub(super) fn describe_activities(&self, params: &Params) -> Result<Value, ApiError> {
        let group_id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?;
        self.group(group_id)?;
        let ids = repeated(params, "ScalingActivityId", 20)?;
        let status = params.get("StatusCode");
        let (number, size) = paging(params)?;
        let mut listed: Vec<&Activity> = self.activities.iter().collect();
        if !self.activities_oldest_first {
            listed.reverse();
        }
        let activities: Vec<Value> = listed
            .into_iter()
            .filter(|a| a.group_id == *group_id)
            .filter(|a| ids.is_empty() || ids.contains(&a.id))
            .filter(|a| status.is_none_or(|s| s == a.status.as_str()))
            .map(Self::activity_json)
            .collect();
        Ok(page_of(
            activities,
            number,
            size,
            "ScalingActivities",
            "ScalingActivity",
        ))
    }

    /// Ends activity `id`: launched instances go `InService`, removed ones are released.
    pub fn finish(&mut self, id: &str) -> Finished {
        let mut finished = Finished::default();
        let Some(index) = self
            .activities
            .iter()
            .position(|a| a.id == id && a.status == ActivityStatus::InProgress)
        else {
            return finished;
        };
        let activity = self.activities[index].clone();
        for instance in &activity.created {
            if let Some(i) = self.instances.get_mut(instance)
                && i.state == InstanceState::Pending
            {
                i.state = InstanceState::InService;
                finished.launched.push(i.clone());
            }
        }
        for instance in &activity.removed {
            if let Some(i) = self.instances.remove(instance) {
                finished.released.push(i);
            }
        }
        let launched = u32::try_from(activity.created.len()).unwrap_or(u32::MAX);
        let short = activity.removed.is_empty() && launched < activity.requested;
        let a = &mut self.activities[index];
        a.ended = Some(Timestamp::now());
        if short {
            a.status = if launched == 0 {
                ActivityStatus::Failed
            } else {
                ActivityStatus::Warning
            };
            a.status_message = format!(
                "Fail to create Instance: Code=\"OperationDenied.NoStock\", Message=\"The resource is out of stock in the specified zone. Please try other types, or choose other regions and zones.\" ({launched} of {} created)",
                activity.requested
            );
        } else {
            a.status = ActivityStatus::Successful;
            a.status_message = "\"succeeded\"".into();
        }
        // A group with expected capacity keeps its desired capacity after a short launch and
        // tries again when stock returns ([`Account::retry_short_groups`]), not at once.
        if !short {
            finished.started = self.converge(&activity.group_id).into_iter().collect();
        }
        finished
    }

    /// Starts, for each group with expected capacity below its desired capacity and no
    /// activity running, an activity launching the rest: ESS's retry after a short launch.
    pub fn retry_short_groups(&mut self) -> Vec<String> {
        let ids: Vec<String> = self.groups.keys().cloned().collect();
        ids.iter().filter_map(|id| self.converge(id)).collect()
    }
}
