//! The account: its state, and the lookups every action shares (a group, its members and
//! counts, the activity in progress, whether a group may be scaled now).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use base64::Engine as _;
use jiff::Timestamp;
use serde_json::Value;

use super::errors::ApiError;
use super::params::Params;
use super::types::{
    Activity, ActivityStatus, Configuration, EmulatedInstance, Group, InstanceState,
    InstanceTypeSpec, ScalingGroupSpec,
};

/// The account.
#[derive(Debug)]
pub struct Account {
    /// `RegionId` of everything.
    pub region: String,
    /// Groups by id.
    pub groups: BTreeMap<String, Group>,
    /// Instances by id, released ones gone.
    pub instances: BTreeMap<String, EmulatedInstance>,
    /// Activities, oldest first.
    pub activities: Vec<Activity>,
    /// The ECS catalogue, in its listing order.
    pub instance_types: Vec<InstanceTypeSpec>,
    /// Instances of each type that can still be launched (absent: unlimited).
    pub stock: BTreeMap<String, u32>,
    /// InService instances put in the `Protected` state (scale-in protection): listed as
    /// such, never picked by a scale-in of the group, removed by `RemoveInstances`.
    pub protected: BTreeSet<String>,
    /// InService instances put in the `Standby` state: listed as such, never picked by a
    /// scale-in of the group, removed by `RemoveInstances`.
    pub standby: BTreeSet<String>,
    /// Lists activities oldest first instead of newest first. The reference does not
    /// document the order, so tests run the client against both.
    pub activities_oldest_first: bool,
    /// What `RemoveInstances` does with a `Standby` instance it is named: remove it (`true`,
    /// default) or refuse the call with `IncorrectInstanceStatus` (`false`). The
    /// RemoveInstances reference is silent; tests run the client against both.
    pub standby_removable: bool,
    /// Whether a refusal about one instance names it in its `Message`. The RemoveInstances
    /// reference gives `Instance "XXX" does not exist.` for `InvalidInstanceId.NotFound`
    /// and lists no wording for `IncorrectInstanceStatus` (other ESS pages name the
    /// instance); `false` answers both without the id, which the client must not need.
    pub instance_errors_name_the_instance: bool,
    /// Answers to writes by `<action>|<ClientToken>`, with the parameters that made them.
    pub(super) tokens: HashMap<String, (Params, Value)>,
    pub(super) next_id: u64,
}

impl Account {
    /// An account in `region` with `groups` and `instance_types`; ids start at `first_id`.
    pub fn new(
        region: &str,
        groups: Vec<ScalingGroupSpec>,
        instance_types: Vec<InstanceTypeSpec>,
        first_id: u64,
    ) -> Self {
        let mut account = Self {
            region: region.into(),
            groups: BTreeMap::new(),
            instances: BTreeMap::new(),
            activities: Vec::new(),
            instance_types,
            stock: BTreeMap::new(),
            protected: BTreeSet::new(),
            standby: BTreeSet::new(),
            activities_oldest_first: false,
            standby_removable: true,
            instance_errors_name_the_instance: true,
            tokens: HashMap::new(),
            next_id: first_id,
        };
        for spec in groups {
            account.add_group(spec);
        }
        account
    }

    pub(super) fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}-{:x}", self.next_id)
    }

    /// Adds (or replaces) a group, with a fresh active configuration.
    pub fn add_group(&mut self, spec: ScalingGroupSpec) {
        let configuration = Configuration {
            id: self.id("asc"),
            instance_type: spec.instance_type.clone(),
            tags: spec.tags.clone(),
            user_data: base64::engine::general_purpose::STANDARD.encode(&spec.user_data),
        };
        self.groups.insert(
            spec.id.clone(),
            Group {
                spec,
                lifecycle_state: "Active".into(),
                configuration,
                created_at: Timestamp::now(),
            },
        );
    }

    pub(super) fn group(&self, id: &str) -> Result<&Group, ApiError> {
        self.groups
            .get(id)
            .ok_or_else(|| ApiError::group_not_found(id))
    }

    /// Members of group `id` (every state).
    pub fn members(&self, id: &str) -> Vec<&EmulatedInstance> {
        self.instances
            .values()
            .filter(|i| i.group_id == id)
            .collect()
    }

    pub(super) fn count(&self, id: &str, state: InstanceState) -> u32 {
        let n = self.members(id).iter().filter(|i| i.state == state).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Instances of group `id` in every state.
    pub fn total(&self, id: &str) -> u32 {
        u32::try_from(self.members(id).len()).unwrap_or(u32::MAX)
    }

    /// The activity of group `id` in progress, if any.
    pub fn in_progress(&self, id: &str) -> Option<&Activity> {
        self.activities
            .iter()
            .find(|a| a.group_id == id && a.status == ActivityStatus::InProgress)
    }

    /// The group must be `Active` with no activity in progress to be scaled.
    pub(super) fn writable(&self, id: &str) -> Result<&Group, ApiError> {
        let group = self.group(id)?;
        if group.lifecycle_state != "Active" {
            return Err(ApiError::new(
                400,
                "IncorrectScalingGroupStatus",
                "The current status of the specified scaling group does not support this action.",
            ));
        }
        if self.in_progress(id).is_some() {
            return Err(ApiError::new(
                400,
                "ScalingActivityInProgress",
                "You cannot delete a scaling group or launch a new scaling activity while there is a scaling activity in progress for the specified scaling group.",
            ));
        }
        Ok(group)
    }
}
