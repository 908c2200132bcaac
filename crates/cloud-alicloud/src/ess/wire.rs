//! The JSON shapes of ESS's answers, tolerant per [`lenient`] (see the crate's
//! documentation), and what they become in the crate's model.

use std::collections::BTreeMap;

use ngo_cloud_http::lenient;
use serde::Deserialize;

use crate::model::{self, ActivityStatus, GroupLifecycleState, InstanceLifecycleState};

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

impl From<ScalingGroup> for model::ScalingGroup {
    fn from(g: ScalingGroup) -> Self {
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

impl From<ScalingInstance> for model::ScalingInstance {
    fn from(i: ScalingInstance) -> Self {
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

impl From<ScalingConfiguration> for model::ScalingConfiguration {
    fn from(c: ScalingConfiguration) -> Self {
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

impl From<ScalingActivity> for model::ScalingActivity {
    fn from(a: ScalingActivity) -> Self {
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
