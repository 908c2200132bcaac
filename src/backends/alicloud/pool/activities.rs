//! What ESS's activities and instances mean for the pool's creation requests: the requests
//! a scale-out serves (its `ActivityMetadata`), the instance each request got, why a request
//! got none, and an instance's phase.

use std::collections::HashMap;

use crate::nodepool::backend::{OTHER_ERROR, OUT_OF_RESOURCES};
use crate::nodepool::converge::MemberPhase;
use ngo_cloud_alicloud::{
    ActivityStatus, InstanceLifecycleState, ScalingActivity, ScalingInstance,
};

/// `ActivityMetadata` key listing the creation requests a scale-out serves.
pub const REQUESTS_KEY: &str = "nodegroup.dev/requests";
/// The requests an activity's metadata lists, in order.
pub(super) fn activity_requests(activity: &ScalingActivity) -> Vec<&str> {
    activity
        .metadata
        .get(REQUESTS_KEY)
        .map(|r| r.split(',').filter(|r| !r.is_empty()).collect())
        .unwrap_or_default()
}

/// Instance id -> the request it serves: each activity's instances (its `CreatedInstances`,
/// else those naming it, oldest first) go to its requests in order.
pub(super) fn requests_by_instance<'a>(
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

pub(super) fn phase(state: &InstanceLifecycleState) -> MemberPhase {
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
pub(super) fn parse_time(text: &str) -> Option<jiff::Timestamp> {
    text.parse().ok().or_else(|| {
        text.strip_suffix('Z')
            .and_then(|t| format!("{t}:00Z").parse().ok())
    })
}

/// Out of stock is `OutOfResources` (cluster-autoscaler tries another group); anything
/// else, a MaxSize clamp included, is `OtherError`.
pub(super) fn failure_class(activity: &ScalingActivity) -> (&'static str, &'static str) {
    let text = format!(
        "{} {} {}",
        activity.error_code.as_deref().unwrap_or_default(),
        activity.status_message,
        activity.error_message.as_deref().unwrap_or_default()
    );
    if activity.status == ActivityStatus::Rejected {
        (OTHER_ERROR, "ScaleOutRejected")
    } else if text.contains("NoStock")
        || text.contains("out of stock")
        || text.contains("OutOfStock")
    {
        (OUT_OF_RESOURCES, "OutOfStock")
    } else if activity.status == ActivityStatus::Successful {
        (OTHER_ERROR, "MaxSizeReached")
    } else {
        (OTHER_ERROR, "ScaleOutFailed")
    }
}

/// The `ClientToken` of a scale-out for `requests`: `ngo-` and 48 hex digits of their
/// SHA-256 (ESS takes at most 64 ASCII characters). The same requests give the same token
/// and the same parameters.
pub(super) fn client_token(requests: &[&str]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, requests.join(",").as_bytes());
    let hex: String = digest.as_ref()[..24]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("ngo-{hex}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use ngo_cloud_alicloud::ActivityStatus;

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
}
