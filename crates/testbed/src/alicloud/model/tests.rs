//! The account's actions, driven as the gateway calls them.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde_json::Value;

use super::*;

fn account() -> Account {
    let mut g = ScalingGroupSpec::new("asg-1", "ecs.g6.large");
    g.max_size = 5;
    let mut plain = ScalingGroupSpec::new("asg-2", "ecs.g6.large");
    plain.desired_capacity = None;
    Account::new("cn-hangzhou", vec![g, plain], default_instance_types(), 100)
}

fn scale(a: &mut Account, group: &str, n: i64, token: &str) -> Result<(Value, Effects), ApiError> {
    a.act(
        "ScaleWithAdjustment",
        &params(&[
            ("ScalingGroupId", group),
            ("AdjustmentType", "QuantityChangeInCapacity"),
            ("AdjustmentValue", &n.to_string()),
            ("ClientToken", token),
            ("ActivityMetadata", r#"{"r":"1"}"#),
        ]),
    )
}

#[test]
fn scale_out_launches_in_an_activity_and_blocks_writes_until_it_ends() {
    let mut a = account();
    let (answer, effects) = scale(&mut a, "asg-1", 2, "t1").unwrap();
    let activity = answer["ScalingActivityId"].as_str().unwrap().to_string();
    assert_eq!(effects.started, vec![activity.clone()]);
    assert_eq!(a.total("asg-1"), 2);
    assert_eq!(a.groups["asg-1"].spec.desired_capacity, Some(2));
    let busy = scale(&mut a, "asg-1", 1, "t2").unwrap_err();
    assert_eq!(busy.code, "ScalingActivityInProgress");
    // The same token answers the same activity, and starts nothing.
    let (again, effects) = scale(&mut a, "asg-1", 2, "t1").unwrap();
    assert_eq!(again["ScalingActivityId"], activity.as_str());
    assert!(effects.started.is_empty());
    let finished = a.finish(&activity);
    assert_eq!(finished.launched.len(), 2);
    assert!(finished.started.is_empty());
    let listed = a
        .describe_activities(&params(&[("ScalingGroupId", "asg-1")]))
        .unwrap();
    let first = &listed["ScalingActivities"]["ScalingActivity"][0];
    assert_eq!(first["StatusCode"], "Successful");
    assert_eq!(first["ActivityMetadata"], r#"{"r":"1"}"#);
    assert_eq!(
        first["CreatedInstances"]["CreatedInstance"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn scale_out_is_clamped_to_max_size_and_short_stock_fails_the_rest() {
    let mut a = account();
    let (answer, _) = scale(&mut a, "asg-1", 9, "t").unwrap();
    assert_eq!(a.total("asg-1"), 5, "clamped to MaxSize");
    a.finish(answer["ScalingActivityId"].as_str().unwrap());

    let mut a = account();
    a.stock.insert("ecs.g6.large".into(), 1);
    let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
    let id = answer["ScalingActivityId"].as_str().unwrap().to_string();
    a.finish(&id);
    let activity = a.activities.iter().find(|x| x.id == id).unwrap();
    assert_eq!(activity.status, ActivityStatus::Warning);
    assert!(activity.status_message.contains("NoStock"));
    assert_eq!(
        a.groups["asg-1"].spec.desired_capacity,
        Some(3),
        "expected capacity keeps the raised desired capacity"
    );
    // Stock returns: the group launches the rest with no request behind it.
    a.stock.remove("ecs.g6.large");
    let retried = a.retry_short_groups();
    assert_eq!(retried.len(), 1);
    a.finish(&retried[0]);
    assert_eq!(a.total("asg-1"), 3);
    let retry = a.activities.iter().find(|x| x.id == retried[0]).unwrap();
    assert_eq!(retry.metadata, None);
}

#[test]
fn a_scale_out_that_changes_nothing_records_a_rejected_activity() {
    let mut a = account();
    let (answer, _) = scale(&mut a, "asg-1", 5, "t1").unwrap();
    a.finish(answer["ScalingActivityId"].as_str().unwrap());
    let (answer, effects) = scale(&mut a, "asg-1", 1, "t2").unwrap();
    assert!(effects.started.is_empty());
    assert!(answer.get("ActivityType").is_none());
    let id = answer["ScalingActivityId"].as_str().unwrap();
    let listed = a
        .describe_activities(&params(&[
            ("ScalingGroupId", "asg-1"),
            ("ScalingActivityId.1", id),
        ]))
        .unwrap();
    let rejected = &listed["ScalingActivities"]["ScalingActivity"][0];
    assert_eq!(rejected["StatusCode"], "Rejected");
    assert_eq!(rejected["ActivityMetadata"], r#"{"r":"1"}"#);
    assert_eq!(a.total("asg-1"), 5);
}

#[test]
fn a_reused_client_token_with_other_parameters_is_a_mismatch() {
    let mut a = account();
    let (answer, _) = scale(&mut a, "asg-1", 1, "t1").unwrap();
    a.finish(answer["ScalingActivityId"].as_str().unwrap());
    let (again, _) = scale(&mut a, "asg-1", 1, "t1").unwrap();
    assert_eq!(again, answer);
    let err = scale(&mut a, "asg-1", 2, "t1").unwrap_err();
    assert_eq!(err.code, "IdempotentParameterMismatch");
}

#[test]
fn protected_and_standby_instances_are_removed_by_name_but_never_by_a_scale_in() {
    let mut a = account();
    let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
    a.finish(answer["ScalingActivityId"].as_str().unwrap());
    let mut ids: Vec<(Timestamp, String)> = a
        .members("asg-1")
        .iter()
        .map(|i| (i.created_at, i.id.clone()))
        .collect();
    ids.sort();
    let ids: Vec<String> = ids.into_iter().map(|(_, id)| id).collect();
    a.protected.insert(ids[0].clone());
    a.standby.insert(ids[1].clone());
    let listed = a
        .describe_instances(&params(&[("ScalingGroupId", "asg-1")]))
        .unwrap();
    let states: BTreeSet<String> = listed["ScalingInstances"]["ScalingInstance"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["LifecycleState"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        states,
        BTreeSet::from(["InService".into(), "Protected".into(), "Standby".into()])
    );
    // The group's own scale-in takes the unprotected one although it is the newest.
    let (answer, _) = scale(&mut a, "asg-1", -1, "t-in").unwrap();
    let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
    assert_eq!(finished.released[0].id, ids[2]);
    // RemoveInstances naming them removes them.
    let (answer, _) = a
        .act(
            "RemoveInstances",
            &params(&[
                ("ScalingGroupId", "asg-1"),
                ("InstanceId.1", &ids[0]),
                ("InstanceId.2", &ids[1]),
            ]),
        )
        .unwrap();
    let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
    assert_eq!(finished.released.len(), 2);
    assert_eq!(a.total("asg-1"), 0);
}

#[test]
fn removal_checks_members_states_and_min_size() {
    let mut a = account();
    let (answer, _) = scale(&mut a, "asg-1", 3, "t").unwrap();
    let activity = answer["ScalingActivityId"].as_str().unwrap().to_string();
    let ids: Vec<String> = a.members("asg-1").iter().map(|i| i.id.clone()).collect();
    let remove = |a: &mut Account, id: &str, token: &str| {
        a.act(
            "RemoveInstances",
            &params(&[
                ("ScalingGroupId", "asg-1"),
                ("InstanceId.1", id),
                ("ClientToken", token),
            ]),
        )
    };
    assert_eq!(
        remove(&mut a, &ids[0], "r0").unwrap_err().code,
        "ScalingActivityInProgress"
    );
    a.finish(&activity);
    assert_eq!(
        remove(&mut a, "i-nope", "r1").unwrap_err().code,
        "InvalidInstanceId.NotFound"
    );
    let (answer, _) = remove(&mut a, &ids[0], "r2").unwrap();
    assert_eq!(a.groups["asg-1"].spec.desired_capacity, Some(2));
    assert_eq!(a.instances[&ids[0]].state, InstanceState::Removing);
    let finished = a.finish(answer["ScalingActivityId"].as_str().unwrap());
    assert_eq!(finished.released.len(), 1);
    assert!(finished.started.is_empty(), "desired capacity already met");
    a.groups.get_mut("asg-1").unwrap().spec.min_size = 2;
    assert_eq!(
        remove(&mut a, &ids[1], "r3").unwrap_err().code,
        "IncorrectCapacity.MinSize"
    );
}

#[test]
fn a_desired_capacity_change_converges_in_activities() {
    let mut a = account();
    let (_, effects) = a
        .act(
            "ModifyScalingGroup",
            &params(&[("ScalingGroupId", "asg-1"), ("DesiredCapacity", "2")]),
        )
        .unwrap();
    assert_eq!(effects.started.len(), 1);
    a.finish(&effects.started[0]);
    assert_eq!(a.count("asg-1", InstanceState::InService), 2);
    let err = a
        .act(
            "ModifyScalingGroup",
            &params(&[("ScalingGroupId", "asg-1"), ("DesiredCapacity", "9")]),
        )
        .unwrap_err();
    assert_eq!(err.code, "InvalidParameter.Conflict");
}

#[test]
fn groups_page_and_unknown_ids_list_nothing() {
    let a = account();
    let all = a.describe_groups(&Params::new()).unwrap();
    assert_eq!(all["TotalCount"], 2);
    let none = a
        .describe_groups(&params(&[("ScalingGroupId.1", "asg-x")]))
        .unwrap();
    assert_eq!(
        none["ScalingGroups"]["ScalingGroup"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let plain = a
        .describe_groups(&params(&[("ScalingGroupId.1", "asg-2")]))
        .unwrap();
    assert_eq!(
        plain["ScalingGroups"]["ScalingGroup"][0]["EnableDesiredCapacity"],
        false
    );
    assert!(a.describe_groups(&params(&[("PageSize", "51")])).is_err());
}

#[test]
fn instance_types_page_by_100_with_a_next_token() {
    let a = account();
    let first = a.describe_types(&Params::new()).unwrap();
    assert_eq!(
        first["InstanceTypes"]["InstanceType"]
            .as_array()
            .unwrap()
            .len(),
        100
    );
    assert_eq!(first["NextToken"], "tok-100");
    let ids: Vec<&str> = first["InstanceTypes"]["InstanceType"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["InstanceTypeId"].as_str())
        .collect();
    assert!(!ids.contains(&"ecs.g6.large"), "real types are past page 1");
    let second = a
        .describe_types(&params(&[("NextToken", "tok-100")]))
        .unwrap();
    assert_eq!(second["NextToken"], "");
    let named = a
        .describe_types(&params(&[("InstanceTypes.1", "ecs.gn6i-c4g1.xlarge")]))
        .unwrap();
    assert_eq!(named["InstanceTypes"]["InstanceType"][0]["GPUAmount"], 1);
}
