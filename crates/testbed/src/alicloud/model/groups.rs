//! Scaling groups, their active scaling configurations and vSwitches: what
//! `DescribeScalingGroups`, `DescribeScalingConfigurations` and `DescribeVSwitches` list, and
//! what `ModifyScalingConfiguration` and `ModifyScalingGroup` change (a new desired capacity is
//! reached in activities of the group's own).

use serde_json::{Value, json};

use super::account::Account;
use super::errors::ApiError;
use super::params::{Params, int, page_of, paging, repeated};
use super::types::{Effects, Group, InstanceState};

impl Account {
    fn group_json(&self, group: &Group) -> Value {
        let id = &group.spec.id;
        let vswitches: Vec<String> = group
            .spec
            .zones
            .iter()
            .enumerate()
            .map(|(i, _)| format!("vsw-{id}-{i}"))
            .collect();
        json!({
            "ScalingGroupId": id,
            "ScalingGroupName": group.spec.name,
            "RegionId": self.region,
            "LifecycleState": group.lifecycle_state,
            "MinSize": group.spec.min_size,
            "MaxSize": group.spec.max_size,
            "DesiredCapacity": group.spec.desired_capacity.unwrap_or(0),
            "EnableDesiredCapacity": group.spec.desired_capacity.is_some(),
            "TotalCapacity": self.total(id),
            "TotalInstanceCount": self.total(id),
            "ActiveCapacity": self.count(id, InstanceState::InService),
            "PendingCapacity": self.count(id, InstanceState::Pending),
            "RemovingCapacity": self.count(id, InstanceState::Removing),
            "InitCapacity": 0,
            "StandbyCapacity": 0,
            "ActiveScalingConfigurationId": group.configuration.id,
            "VSwitchId": vswitches.first().cloned().unwrap_or_default(),
            "VSwitchIds": {"VSwitchId": vswitches},
            "RemovalPolicies": {"RemovalPolicy": ["OldestScalingConfiguration", "OldestInstance"]},
            "DefaultCooldown": 300,
            "MultiAZPolicy": "PRIORITY",
            "CreationTime": group.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
            // No load balancers or databases in the sandbox.
            "LoadBalancerIds": {"LoadBalancerId": []},
            "DBInstanceIds": {"DBInstanceId": []},
        })
    }

    pub(super) fn describe_groups(&self, params: &Params) -> Result<Value, ApiError> {
        let ids = repeated(params, "ScalingGroupId", 20)?;
        let (number, size) = paging(params)?;
        let groups: Vec<Value> = self
            .groups
            .values()
            .filter(|g| ids.is_empty() || ids.contains(&g.spec.id))
            .map(|g| self.group_json(g))
            .collect();
        Ok(page_of(
            groups,
            number,
            size,
            "ScalingGroups",
            "ScalingGroup",
        ))
    }

    pub(super) fn describe_configurations(&self, params: &Params) -> Result<Value, ApiError> {
        let ids = repeated(params, "ScalingConfigurationId", 10)?;
        let group = params.get("ScalingGroupId");
        if let Some(g) = group {
            self.group(g)?;
        }
        let (number, size) = paging(params)?;
        let configurations: Vec<Value> = self
            .groups
            .values()
            .filter(|g| group.is_none_or(|id| *id == g.spec.id))
            .filter(|g| ids.is_empty() || ids.contains(&g.configuration.id))
            .map(|g| {
                let c = &g.configuration;
                let tags: Vec<Value> = c
                    .tags
                    .iter()
                    .map(|(k, v)| json!({"Key": k, "Value": v}))
                    .collect();
                json!({
                    "ScalingConfigurationId": c.id,
                    "ScalingConfigurationName": format!("{}-config", g.spec.name),
                    "ScalingGroupId": g.spec.id,
                    "InstanceType": c.instance_type,
                    "InstanceTypes": {"InstanceType": [c.instance_type]},
                    "LifecycleState": "Active",
                    "ImageId": "aliyun_3_x64_20G_alibase_20240819.vhd",
                    "Tags": {"Tag": tags},
                    "CreationTime": g.created_at.strftime("%Y-%m-%dT%H:%MZ").to_string(),
                    "SecurityGroupId": format!("sg-{}", g.spec.id),
                    "InternetChargeType": "PayByTraffic",
                    "InternetMaxBandwidthIn": 200,
                    "InternetMaxBandwidthOut": 0,
                    "SystemDiskCategory": "cloud_essd",
                    "DataDisks": {"DataDisk": []},
                })
            })
            .collect();
        Ok(page_of(
            configurations,
            number,
            size,
            "ScalingConfigurations",
            "ScalingConfiguration",
        ))
    }

    /// VPC `DescribeVSwitches` (`2016-04-28`): the vSwitches of every group (`vsw-<group>-<k>`
    /// in the group's k-th zone), filtered by `VSwitchId`, paged like ESS.
    pub(super) fn describe_vswitches(&self, params: &Params) -> Result<Value, ApiError> {
        let (number, size) = paging(params)?;
        let wanted = params.get("VSwitchId").filter(|v| !v.is_empty());
        let mut items = Vec::new();
        for group in self.groups.values() {
            for (k, zone) in group.spec.zones.iter().enumerate() {
                let id = format!("vsw-{}-{k}", group.spec.id);
                if wanted.is_some_and(|w| *w != id) {
                    continue;
                }
                items.push(json!({
                    "VSwitchId": id,
                    "VpcId": "vpc-sandbox",
                    "ZoneId": zone,
                    "Status": "Available",
                    "CidrBlock": format!("172.16.{k}.0/24"),
                    "VSwitchName": format!("{}-{zone}", group.spec.id),
                }));
            }
        }
        Ok(page_of(items, number, size, "VSwitches", "VSwitch"))
    }

    pub(super) fn modify_configuration(&mut self, params: &Params) -> Result<Value, ApiError> {
        let id = params
            .get("ScalingConfigurationId")
            .ok_or_else(|| ApiError::missing("ScalingConfigurationId"))?;
        let group = self
            .groups
            .values_mut()
            .find(|g| g.configuration.id == *id)
            .ok_or_else(|| {
                ApiError::new(
                    404,
                    "InvalidScalingConfigurationId.NotFound",
                    format!("The specified scaling configuration \"{id}\" does not exist."),
                )
            })?;
        if let Some(data) = params.get("UserData") {
            let decoded = crate::boot::decode_user_data(data).ok_or_else(|| {
                ApiError::new(
                    400,
                    "InvalidUserData.Base64FormatInvalid",
                    "The specified parameter UserData must be base64 encoded.",
                )
            })?;
            if decoded.len() > 32 * 1024 {
                return Err(ApiError::new(
                    400,
                    "InvalidUserData.SizeExceeded",
                    "The specified parameter UserData exceeds the size limit of 32 KB.",
                ));
            }
            group.configuration.user_data = data.clone();
        }
        if let Some(t) = params.get("InstanceType") {
            group.configuration.instance_type = t.clone();
        }
        Ok(json!({}))
    }

    pub(super) fn modify_group(&mut self, params: &Params) -> Result<(Value, Effects), ApiError> {
        let id = params
            .get("ScalingGroupId")
            .ok_or_else(|| ApiError::missing("ScalingGroupId"))?
            .clone();
        let group = self.group(&id)?.clone();
        let as_u32 = |v: Option<i64>, name: &str| -> Result<Option<u32>, ApiError> {
            v.map(|v| u32::try_from(v).map_err(|_| ApiError::invalid(name, "must not be negative")))
                .transpose()
        };
        let min = as_u32(int(params, "MinSize")?, "MinSize")?.unwrap_or(group.spec.min_size);
        let max = as_u32(int(params, "MaxSize")?, "MaxSize")?.unwrap_or(group.spec.max_size);
        let desired = as_u32(int(params, "DesiredCapacity")?, "DesiredCapacity")?;
        if min > max {
            return Err(ApiError::new(
                400,
                "InvalidParameter.Conflict",
                "The specified value of parameter \"MinSize\" must not be greater than \"MaxSize\".",
            ));
        }
        let desired = desired.or(group.spec.desired_capacity);
        if let Some(d) = desired
            && !(min..=max).contains(&d)
        {
            return Err(ApiError::new(
                400,
                "InvalidParameter.Conflict",
                "The specified value of parameter \"DesiredCapacity\" must be between MinSize and MaxSize.",
            ));
        }
        if let Some(g) = self.groups.get_mut(&id) {
            g.spec.min_size = min;
            g.spec.max_size = max;
            g.spec.desired_capacity = desired;
        }
        let started = self.converge(&id).into_iter().collect();
        Ok((json!({}), Effects { started }))
    }

    /// Starts an activity bringing group `id` to its desired capacity, when it has one, it
    /// differs from the total, and no activity runs.
    pub(super) fn converge(&mut self, id: &str) -> Option<String> {
        let group = self.groups.get(id)?;
        let desired = group.spec.desired_capacity?;
        if group.lifecycle_state != "Active" || self.in_progress(id).is_some() {
            return None;
        }
        let total = self.total(id);
        let cause = format!(
            "The expected number of instances changed, changing the Total Capacity from \"{total}\" to \"{desired}\"."
        );
        match desired.cmp(&total) {
            std::cmp::Ordering::Greater => {
                Some(self.start_scale_out(id, desired - total, cause, None))
            }
            std::cmp::Ordering::Less => Some(self.start_scale_in(id, total - desired, cause, None)),
            std::cmp::Ordering::Equal => None,
        }
    }
}
