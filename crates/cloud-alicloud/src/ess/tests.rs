use super::*;
use crate::model::GroupLifecycleState;

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
