//! The Alibaba Cloud client (`ngo_cloud_alicloud`) against the sandbox's ESS/ECS emulator:
//! the calls a node pool makes, paging, the signature and credential checks of the gateway,
//! throttling, activities in progress, outages, hung requests, lost answers and idempotent
//! scale-outs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ngo_api::nodepool::AliCloudSpec;
use ngo_cloud_alicloud::ess::Ess;
use ngo_cloud_alicloud::{
    ActivityStatus, ApiErrorKind, Client, ClientOptions, Credentials, EcsRamRoleCredentials,
    Endpoints, Error, GroupLifecycleState, InstanceLifecycleState, RefreshPolicy,
    RemovalFailureReason, RemoveOptions, RetryPolicy, StaticCredentials, TransportOptions,
};
use ngo_testbed::alicloud::{
    AccessKey, AliCloudEmulator, AliCloudOptions, FaultAction, InstanceState, ScalingGroupSpec,
};
use nodegroup_operator::backends::alicloud::pool::AliCloudPool;
use nodegroup_operator::nodepool::backend::{BackendErrorKind, Created, NewServer, PoolBackend};

const GROUP: &str = "asg-workers";

async fn emulator(tweak: impl FnOnce(&mut AliCloudOptions)) -> AliCloudEmulator {
    let mut group = ScalingGroupSpec::new(GROUP, "ecs.g6.xlarge");
    group.max_size = 60;
    group.tags = BTreeMap::from([("workload_type".into(), "cpu".into())]);
    let mut options = AliCloudOptions {
        groups: vec![group],
        activity_duration: Duration::from_millis(200),
        ..Default::default()
    };
    tweak(&mut options);
    AliCloudEmulator::start(options).await.expect("emulator")
}

fn options(emulator: &AliCloudEmulator) -> ClientOptions {
    ClientOptions {
        region_id: emulator.region().into(),
        endpoints: Endpoints {
            ess: emulator.url(),
            ecs: emulator.url(),
            vpc: emulator.url(),
            sts: emulator.url(),
        },
        transport: TransportOptions {
            timeout: Duration::from_secs(5),
            ..Default::default()
        },
        retry: RetryPolicy {
            max_retries: 3,
            backoff: Duration::from_millis(20),
            throttle_retries: 3,
            throttle_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(200),
        },
    }
}

fn client_with(emulator: &AliCloudEmulator, credentials: Credentials) -> Client {
    Client::new(
        options(emulator),
        Arc::new(StaticCredentials::from_credentials(credentials)),
    )
    .expect("client")
}

fn client(emulator: &AliCloudEmulator) -> Client {
    let key = &emulator.access_keys()[0];
    client_with(emulator, Credentials::new(&key.id, &key.secret))
}

async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn metadata(request: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("nodegroup.dev/requests".to_string(), request.to_string())])
}

/// Waits until no activity of the group runs.
async fn settled(emulator: &AliCloudEmulator) {
    eventually("the group's activities to end", || {
        emulator
            .activities(GROUP)
            .iter()
            .all(|a| a.ended.is_some())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_scale_out_is_traced_from_instances_to_its_activity_and_request() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();

    let group = ess.scaling_group(GROUP).await.expect("group");
    assert_eq!(group.lifecycle_state, GroupLifecycleState::Active);
    assert_eq!((group.min_size, group.max_size), (0, 60));
    assert_eq!(group.desired_capacity, Some(0));
    assert_eq!(group.region_id, "cn-hangzhou");

    let started = ess
        .scale_out(GROUP, 2, "token-r1", &metadata("r1,r2"))
        .await
        .expect("scale out");
    let activity = started.scaling_activity_id.expect("an activity");
    let instances = ess.scaling_instances(GROUP).await.expect("instances");
    assert_eq!(instances.len(), 2);
    assert!(
        instances
            .iter()
            .all(|i| i.lifecycle_state == InstanceLifecycleState::Pending
                && i.scaling_activity_id.as_deref() == Some(activity.as_str()))
    );
    let found = ess
        .scaling_activities_by_id(GROUP, &[activity.as_str(), "asa-unknown"])
        .await
        .expect("activities");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].metadata["nodegroup.dev/requests"], "r1,r2");
    assert_eq!(found[0].scaling_instance_number, 2);

    settled(&emulator).await;
    let instances = ess.scaling_instances(GROUP).await.expect("instances");
    assert!(
        instances
            .iter()
            .all(|i| i.lifecycle_state == InstanceLifecycleState::InService)
    );
    let done = ess
        .scaling_activity(GROUP, &activity)
        .await
        .expect("activity")
        .expect("known");
    assert_eq!(done.status, ActivityStatus::Successful);
    assert_eq!(done.created_instances.len(), 2);
    assert_eq!(
        ess.scaling_group(GROUP).await.expect("group").target_size(),
        2
    );
}

#[tokio::test]
async fn a_lost_scale_out_answer_repeated_with_its_client_token_scales_once() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    emulator.inject(Some("ScaleWithAdjustment"), 1, FaultAction::LoseAnswer);
    let lost = ess.scale_out(GROUP, 3, "token-lost", &metadata("r")).await;
    assert!(
        matches!(lost, Err(Error::Transport { .. })),
        "the answer was lost: {lost:?}"
    );
    // The activity runs: a repeat with the same token answers it instead of refusing or
    // starting another.
    let repeat = ess
        .scale_out(GROUP, 3, "token-lost", &metadata("r"))
        .await
        .expect("repeat");
    assert_eq!(emulator.activities(GROUP).len(), 1);
    assert_eq!(
        repeat.scaling_activity_id.as_deref(),
        Some(emulator.activities(GROUP)[0].id.as_str())
    );
    assert_eq!(emulator.instances(GROUP).len(), 3);

    // A different token while the activity runs is refused, as ESS refuses it.
    let busy = ess
        .scale_out(GROUP, 1, "token-other", &metadata("s"))
        .await
        .expect_err("activity in progress");
    assert!(busy.is_activity_in_progress(), "{busy}");
    assert!(busy.is_transient());
}

#[tokio::test]
async fn instances_page_past_fifty_and_types_are_found_beyond_the_first_page() {
    let emulator = emulator(|_| {}).await;
    let client = client(&emulator);
    client
        .ess()
        .scale_out(GROUP, 55, "token-55", &BTreeMap::new())
        .await
        .expect("scale out");
    let instances = client
        .ess()
        .scaling_instances(GROUP)
        .await
        .expect("instances");
    assert_eq!(instances.len(), 55);
    let pages = emulator.requests_of("DescribeScalingInstances");
    assert_eq!(pages.len(), 2, "two pages of 50");
    assert!(pages.iter().all(|r| r.params["PageSize"] == "50"));

    // The group's type is listed after the first 100 (where cluster-autoscaler stops).
    let types = client
        .ecs()
        .instance_types(&["ecs.g6.xlarge", "ecs.gn6i-c4g1.xlarge", "ecs.nope"])
        .await
        .expect("types");
    assert_eq!(types.len(), 2);
    assert_eq!((types[0].cpu_cores, types[0].memory_gib), (4, 16.0));
    assert_eq!(types[1].gpu_amount, 1);
    assert_eq!(types[1].gpu_spec.as_deref(), Some("NVIDIA T4"));
    let all = client.ecs().all_instance_types().await.expect("all types");
    assert_eq!(all.len(), 115, "every page, following NextToken");

    let configuration = client
        .ess()
        .scaling_configuration(
            GROUP,
            client
                .ess()
                .scaling_group(GROUP)
                .await
                .expect("group")
                .active_scaling_configuration_id
                .as_deref()
                .expect("active configuration"),
        )
        .await
        .expect("configuration")
        .expect("found");
    assert_eq!(configuration.launch_types(), ["ecs.g6.xlarge"]);
    assert_eq!(configuration.tags["workload_type"], "cpu");
}

#[tokio::test]
async fn removal_takes_exactly_the_named_instances_and_reports_each_failure() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    ess.scale_out(GROUP, 3, "token-3", &BTreeMap::new())
        .await
        .expect("scale out");
    let ids: Vec<String> = emulator
        .instances(GROUP)
        .iter()
        .map(|i| i.id.clone())
        .collect();

    // While the launch runs, ESS refuses: the whole batch fails with that reason.
    let refused = ess
        .remove_instances(GROUP, &ids[..1], RemoveOptions::default())
        .await
        .expect("report");
    assert!(refused.removed.is_empty());
    assert!(matches!(
        &refused.failed[0].reason,
        RemovalFailureReason::NotRemovable(InstanceLifecycleState::Pending)
    ));
    settled(&emulator).await;

    let options = RemoveOptions {
        remove_policy: Some("release".into()),
        ..RemoveOptions::default()
    };
    let report = ess
        .remove_instances(
            GROUP,
            &[ids[0].clone(), "i-unknown".into(), ids[1].clone()],
            options.clone(),
        )
        .await
        .expect("report");
    assert_eq!(report.removed, vec![ids[0].clone(), ids[1].clone()]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].instance_id, "i-unknown");
    assert_eq!(report.failed[0].reason, RemovalFailureReason::NotInGroup);
    let sent = emulator.requests_of("RemoveInstances");
    let last = &sent.last().expect("a call").params;
    assert_eq!(last["RemovePolicy"], "release");
    assert_eq!(last["DecreaseDesiredCapacity"], "true");
    assert!(last.contains_key("ClientToken"));

    // A second removal while the first one's activity runs.
    let busy = ess
        .remove_instances(GROUP, &ids[2..], options)
        .await
        .expect("report");
    match &busy.failed[0].reason {
        RemovalFailureReason::Rejected(e) => {
            assert_eq!(e.kind(), ApiErrorKind::ScalingActivityInProgress)
        }
        other => panic!("expected a rejection, got {other}"),
    }
    settled(&emulator).await;
    assert_eq!(
        emulator
            .instances(GROUP)
            .iter()
            .map(|i| i.id.clone())
            .collect::<Vec<_>>(),
        vec![ids[2].clone()]
    );
    assert_eq!(
        emulator.group(GROUP).expect("group").desired_capacity,
        Some(1)
    );
}

#[tokio::test]
async fn server_errors_and_throttling_are_retried_with_fresh_nonces() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    emulator.inject(Some("DescribeScalingGroups"), 2, FaultAction::unavailable());
    emulator.inject(Some("DescribeScalingGroups"), 2, FaultAction::throttling());
    ess.scaling_group(GROUP).await.expect("group after retries");
    let calls = emulator.requests_of("DescribeScalingGroups");
    assert_eq!(calls.len(), 5);
    let nonces: std::collections::BTreeSet<&String> =
        calls.iter().map(|r| &r.params["SignatureNonce"]).collect();
    assert_eq!(nonces.len(), 5, "every attempt signed anew");
    assert_eq!(
        calls
            .iter()
            .filter_map(|r| r.code.as_deref())
            .collect::<Vec<_>>(),
        vec![
            "ServiceUnavailable",
            "ServiceUnavailable",
            "Throttling.User",
            "Throttling.User"
        ]
    );

    // Throttled beyond the retries: reported as such, with the last answer.
    emulator.inject(Some("DescribeScalingGroups"), 4, FaultAction::throttling());
    let throttled = ess.scaling_group(GROUP).await.expect_err("throttled");
    assert!(
        matches!(throttled, Error::Throttled { attempts: 4, .. }),
        "{throttled}"
    );
    assert!(throttled.is_transient());

    // The gateway's own flow control, per AccessKey: waited out.
    emulator.set_rate_limit(Some(2));
    let mut patient = options(&emulator);
    patient.retry.throttle_backoff = Duration::from_millis(600);
    patient.retry.max_backoff = Duration::from_secs(1);
    let key = &emulator.access_keys()[0];
    let patient = Client::new(
        patient,
        Arc::new(StaticCredentials::new(&key.id, &key.secret)),
    )
    .expect("client");
    let started = Instant::now();
    for _ in 0..3 {
        patient
            .ess()
            .scaling_group(GROUP)
            .await
            .expect("paced by back-off");
    }
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert!(
        emulator
            .requests_of("DescribeScalingGroups")
            .iter()
            .filter(|r| r.code.as_deref() == Some("Throttling.User"))
            .count()
            > 6
    );
}

#[tokio::test]
async fn hung_requests_time_out_and_reads_are_retried() {
    let emulator = emulator(|_| {}).await;
    let mut options = options(&emulator);
    options.transport.timeout = Duration::from_millis(300);
    let key = &emulator.access_keys()[0];
    let client = Client::new(
        options,
        Arc::new(StaticCredentials::new(&key.id, &key.secret)),
    )
    .expect("client");
    emulator.inject(
        Some("DescribeScalingInstances"),
        1,
        FaultAction::Hang(Duration::from_secs(2)),
    );
    let started = Instant::now();
    client
        .ess()
        .scaling_instances(GROUP)
        .await
        .expect("retried");
    assert!(started.elapsed() < Duration::from_secs(2));
    emulator.inject(
        Some("DescribeScalingInstances"),
        4,
        FaultAction::Hang(Duration::from_secs(2)),
    );
    let timed_out = client
        .ess()
        .scaling_instances(GROUP)
        .await
        .expect_err("timeout");
    assert!(
        matches!(timed_out, Error::Timeout { attempts: 4, .. }),
        "{timed_out}"
    );
}

#[tokio::test]
async fn the_gateway_refuses_bad_secrets_unknown_keys_and_missing_sts_tokens() {
    let emulator = emulator(|o| {
        o.access_keys = vec![
            AccessKey::new("LTAIgood", "right-secret"),
            AccessKey {
                id: "STS.temporary".into(),
                secret: "sts-secret".into(),
                security_token: Some("CAIS-token".into()),
                expiration: None,
            },
        ];
    })
    .await;
    let kind = |e: &Error| e.kind();

    let wrong = client_with(&emulator, Credentials::new("LTAIgood", "wrong-secret"));
    let e = wrong.ess().scaling_group(GROUP).await.expect_err("refused");
    assert_eq!(kind(&e), Some(ApiErrorKind::SignatureDoesNotMatch), "{e}");
    assert!(
        e.api()
            .expect("api error")
            .message
            .contains("server string to sign is:POST&%2F&AccessKeyId%3DLTAIgood"),
        "{e}"
    );
    assert!(!e.is_transient());

    let unknown = client_with(&emulator, Credentials::new("LTAInobody", "x"));
    let e = unknown
        .ess()
        .scaling_group(GROUP)
        .await
        .expect_err("refused");
    assert_eq!(kind(&e), Some(ApiErrorKind::InvalidAccessKey), "{e}");
    assert_eq!(e.api().map(|a| a.status), Some(404));

    let no_token = client_with(&emulator, Credentials::new("STS.temporary", "sts-secret"));
    let e = no_token
        .ess()
        .scaling_group(GROUP)
        .await
        .expect_err("refused");
    assert_eq!(
        e.api().map(|a| a.code.as_str()),
        Some("MissingSecurityToken")
    );

    let sts = client_with(
        &emulator,
        Credentials::new("STS.temporary", "sts-secret").with_security_token("CAIS-token"),
    );
    sts.ess()
        .scaling_group(GROUP)
        .await
        .expect("signed with the token");
    let last = emulator.requests().pop().expect("logged");
    assert!(
        !last.params.contains_key("SecurityToken"),
        "the log never keeps the token"
    );

    // A key rotated away: the same client is refused from then on.
    emulator.set_access_keys(vec![AccessKey::new("LTAInew", "new-secret")]);
    let good = client_with(&emulator, Credentials::new("LTAIgood", "right-secret"));
    let e = good.ess().scaling_group(GROUP).await.expect_err("revoked");
    assert_eq!(kind(&e), Some(ApiErrorKind::InvalidAccessKey));
    good.set_credentials(Arc::new(StaticCredentials::new("LTAInew", "new-secret")));
    good.ess().scaling_group(GROUP).await.expect("new key");
}

#[tokio::test]
async fn user_data_goes_into_the_active_configuration_and_unknown_groups_are_not_found() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    let group = ess.scaling_group(GROUP).await.expect("group");
    let configuration = group
        .active_scaling_configuration_id
        .expect("active configuration");
    let script = "#!/bin/bash\nkubeadm join --token abcdef.0123456789abcdef 10.0.0.1:6443\n";
    ess.set_user_data(&configuration, script)
        .await
        .expect("user data");
    assert_eq!(emulator.user_data(GROUP).as_deref(), Some(script));
    let sent = &emulator.requests_of("ModifyScalingConfiguration")[0].params["UserData"];
    assert_ne!(sent, script, "sent Base64-encoded");

    let missing = ess.scaling_group("asg-missing").await.expect_err("unknown");
    assert!(matches!(missing, Error::GroupNotFound { .. }), "{missing}");

    emulator.set_group_state(GROUP, "Inactive");
    let inactive = ess
        .scale_out(GROUP, 1, "token-inactive", &BTreeMap::new())
        .await
        .expect_err("inactive");
    assert_eq!(
        inactive.api().map(|a| a.code.as_str()),
        Some("IncorrectScalingGroupStatus")
    );
    assert!(emulator.instances(GROUP).is_empty());
    assert!(
        emulator
            .instances(GROUP)
            .iter()
            .all(|i| i.state != InstanceState::Pending)
    );
}

fn pool(emulator: &AliCloudEmulator, group: &str) -> AliCloudPool {
    let key = &emulator.access_keys()[0];
    let spec = AliCloudSpec {
        region_id: emulator.region().into(),
        scaling_group_id: group.into(),
        ..Default::default()
    };
    AliCloudPool::new(
        &spec,
        options(emulator),
        Arc::new(StaticCredentials::new(&key.id, &key.secret)),
    )
    .expect("pool")
}

fn new_server(request: &str) -> NewServer {
    NewServer {
        request: request.into(),
        hostname: request.into(),
        user_data: String::new(),
    }
}

/// Instance ids of the group, oldest first, once its activities ended.
async fn launched(emulator: &AliCloudEmulator, ess: &Ess, n: u32) -> Vec<String> {
    ess.scale_out(GROUP, n, &format!("launch-{n}"), &BTreeMap::new())
        .await
        .expect("scale out");
    settled(emulator).await;
    emulator
        .instances(GROUP)
        .iter()
        .map(|i| i.id.clone())
        .collect()
}

/// ESS removes a Protected instance named in RemoveInstances (SetInstancesProtection
/// reference), so the client never names one, nor a Standby one: both are reported, with
/// their state, and stay in the group; the rest of the batch goes.
#[tokio::test]
async fn protected_and_standby_instances_are_never_removed_and_are_reported() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    let ids = launched(&emulator, &ess, 3).await;
    emulator.set_protected(&ids[0], true);
    emulator.set_standby(&ids[1], true);

    let report = ess
        .remove_instances(GROUP, &ids, RemoveOptions::default())
        .await
        .expect("report");
    assert_eq!(report.removed, vec![ids[2].clone()]);
    let reasons: BTreeMap<&str, String> = report
        .failed
        .iter()
        .map(|f| (f.instance_id.as_str(), f.reason.to_string()))
        .collect();
    assert!(
        reasons[ids[0].as_str()].starts_with("Protected"),
        "{reasons:?}"
    );
    assert!(
        reasons[ids[1].as_str()].starts_with("Standby"),
        "{reasons:?}"
    );
    settled(&emulator).await;
    let left: Vec<String> = emulator
        .instances(GROUP)
        .iter()
        .map(|i| i.id.clone())
        .collect();
    assert_eq!(left, ids[..2]);

    // Through the pool: a refusal, as other refusals of a removal are reported.
    let outcomes = pool(&emulator, GROUP).delete_many(&ids[..1]).await;
    let error = outcomes[0].1.as_ref().expect_err("refused");
    assert_eq!(error.kind, BackendErrorKind::Rejected);
    assert!(error.message.contains("Protected"), "{}", error.message);
    settled(&emulator).await;
    assert!(emulator.instances(GROUP).iter().any(|i| i.id == ids[0]));
}

/// An instance put in Standby between the client's listing and its RemoveInstances call:
/// where ESS refuses the call for it (`IncorrectInstanceStatus`; the RemoveInstances
/// reference is silent on Standby), the client finds it by listing the group again, reports
/// it, and removes the rest, whether the refusal names the instance or not. Before, the
/// client searched the message for the id and, not finding it, failed the whole batch.
#[tokio::test]
async fn an_instance_set_aside_during_a_removal_is_found_by_its_state_not_the_message() {
    for named in [true, false] {
        let emulator = emulator(|_| {}).await;
        emulator.set_standby_removable(false);
        emulator.set_instance_errors_name_the_instance(named);
        let ess = client(&emulator).ess();
        let ids = launched(&emulator, &ess, 3).await;
        emulator.inject(
            Some("RemoveInstances"),
            1,
            FaultAction::Hang(Duration::from_millis(700)),
        );
        let listings = emulator.requests_of("DescribeScalingInstances").len();
        let removal = ess.remove_instances(GROUP, &ids[..2], RemoveOptions::default());
        // Requests are recorded when answered: once the client's listing is, its
        // RemoveInstances follows at once and hangs for 700 ms.
        let set_aside = async {
            eventually("the client's listing", || {
                (emulator.requests_of("DescribeScalingInstances").len() > listings).then_some(())
            })
            .await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            emulator.set_standby(&ids[1], true);
        };
        let (report, ()) = tokio::join!(removal, set_aside);
        let report = report.expect("report");
        let refusals = emulator.requests_of("RemoveInstances");
        assert_eq!(
            refusals.len(),
            2,
            "named {named}: refused once, then sent again"
        );
        assert_eq!(report.removed, vec![ids[0].clone()], "named {named}");
        assert_eq!(report.failed.len(), 1, "named {named}: {:?}", report.failed);
        assert_eq!(report.failed[0].instance_id, ids[1]);
        assert!(
            report.failed[0].reason.to_string().starts_with("Standby"),
            "named {named}: {}",
            report.failed[0].reason
        );
        settled(&emulator).await;
        let left: Vec<String> = emulator
            .instances(GROUP)
            .iter()
            .map(|i| i.id.clone())
            .collect();
        assert_eq!(left, ids[1..], "named {named}");
    }
}

/// A scale-out ESS could not fill for want of stock leaves a group with expected capacity
/// wanting more, and ESS keeps trying: the pool lowers the desired capacity back to what
/// the group holds, so instances do not appear later with no request behind them.
#[tokio::test]
async fn a_scale_out_short_of_stock_lowers_the_desired_capacity_it_raised() {
    let emulator = emulator(|_| {}).await;
    emulator.set_stock("ecs.g6.xlarge", Some(1));
    let pool = pool(&emulator, GROUP);
    let outcomes = pool
        .create_many(&[new_server("r-1"), new_server("r-2")])
        .await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Created::Accepted(_) | Created::Server(_))),
        "{outcomes:?}"
    );
    settled(&emulator).await;
    let failures = pool
        .creation_failures(&["r-1".to_string(), "r-2".to_string()])
        .await
        .expect("failures");
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].code, "OutOfStock");
    pool.members().await.expect("members");
    assert_eq!(
        emulator.group(GROUP).expect("group").desired_capacity,
        Some(1),
        "the desired capacity follows what was launched"
    );

    // Stock returns: nothing launches, as nothing was asked for.
    emulator.set_stock("ecs.g6.xlarge", None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    settled(&emulator).await;
    assert_eq!(emulator.instances(GROUP).len(), 1);
}

/// At MaxSize a scale-out changes nothing and ESS records a `Rejected` activity: the
/// creations fail with that, at once, rather than waiting for instances that never come.
#[tokio::test]
async fn a_scale_out_at_max_size_fails_with_the_rejected_activity() {
    let emulator = emulator(|o| o.groups[0].max_size = 1).await;
    let ess = client(&emulator).ess();
    launched(&emulator, &ess, 1).await;
    let pool = pool(&emulator, GROUP);
    let outcomes = pool.create_many(&[new_server("r-over")]).await;
    match &outcomes[0] {
        Created::Failed { code, message, .. } => {
            assert_eq!(code, "ScaleOutRejected");
            assert!(message.contains("Rejected"), "{message}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    // Asked again (a lost answer): the activity is found, with the same outcome.
    let again = pool.create_many(&[new_server("r-over")]).await;
    assert!(matches!(&again[0], Created::Failed { code, .. } if code == "ScaleOutRejected"));
}

/// More activities than one page: they are all read (`PageNumber` until `TotalCount`), so
/// a request served by an activity beyond the first 50 is still traced.
#[tokio::test]
async fn activities_are_read_past_the_first_page() {
    activities_past_the_first_page(false).await;
}

/// The reference does not say in which order activities are listed: listed oldest first,
/// the most recent are still the ones read, newest first.
#[tokio::test]
async fn activities_listed_oldest_first_are_all_read() {
    activities_past_the_first_page(true).await;
}

async fn activities_past_the_first_page(oldest_first: bool) {
    let emulator = emulator(|o| o.activity_duration = Duration::from_millis(1)).await;
    emulator.set_activities_oldest_first(oldest_first);
    let ess = client(&emulator).ess();
    let pool = pool(&emulator, GROUP);
    let first = pool.create_many(&[new_server("r-first")]).await;
    assert!(matches!(
        first[0],
        Created::Accepted(_) | Created::Server(_)
    ));
    settled(&emulator).await;
    for k in 0..55 {
        let ids = emulator
            .instances(GROUP)
            .iter()
            .map(|i| i.id.clone())
            .collect::<Vec<_>>();
        // Alternate launches and removals of another instance, keeping r-first's.
        if k % 2 == 0 {
            ess.scale_out(GROUP, 1, &format!("other-{k}"), &BTreeMap::new())
                .await
                .expect("scale out");
        } else {
            let report = ess
                .remove_instances(GROUP, &ids[1..], RemoveOptions::default())
                .await
                .expect("remove");
            assert!(report.failed.is_empty(), "{:?}", report.failed);
        }
        settled(&emulator).await;
    }
    let activities = ess
        .scaling_activities(GROUP, None, 200)
        .await
        .expect("activities");
    assert_eq!(activities.len(), 56);
    let recent = ess
        .scaling_activities(GROUP, None, 3)
        .await
        .expect("activities");
    assert_eq!(recent.len(), 3);
    if !oldest_first {
        // Listed newest first, the first three are the newest. (Listed oldest first within
        // one minute, `StartTime` cannot tell which are newest.)
        let newest = emulator.activities(GROUP).last().expect("one").id.clone();
        assert_eq!(recent[0].id, newest);
    }
    let members = pool.members().await.expect("members");
    assert!(
        members
            .iter()
            .any(|m| m.request.as_deref() == Some("r-first")),
        "{members:?}"
    );
}

/// The ECS RAM role's credentials are read in security hardening mode: a session token
/// from `PUT /latest/api/token` (with `X-aliyun-ecs-metadata-token-ttl-seconds`), sent as
/// `X-aliyun-ecs-metadata-token`. An instance created with `HttpTokens=required` answers
/// only such reads; one in normal mode answers them too.
#[tokio::test]
async fn ram_role_credentials_are_read_with_a_metadata_session_token_in_both_modes() {
    for required in [true, false] {
        let emulator = emulator(|o| o.ram_role = Some("worker-role".into())).await;
        emulator.set_metadata_tokens_required(required);
        let provider = EcsRamRoleCredentials::new(
            emulator.url(),
            None,
            TransportOptions::default(),
            RefreshPolicy::default(),
        )
        .expect("provider");
        let client = Client::new(options(&emulator), Arc::new(provider)).expect("client");
        let group = client
            .ess()
            .scaling_group(GROUP)
            .await
            .unwrap_or_else(|e| panic!("HttpTokens required={required}: {e}"));
        assert_eq!(group.id, GROUP);
        let reads = emulator.requests_of("Metadata");
        assert!(!reads.is_empty());
        let token_puts = reads
            .iter()
            .filter(|r| r.params.get("path").map(String::as_str) == Some("/latest/api/token"))
            .count();
        assert_eq!(token_puts, 1, "one session token for every read: {reads:?}");
        assert!(reads.iter().all(|r| r.status == Some(200)), "{reads:?}");
    }
}

/// A `ClientToken` reused with other parameters is refused (`IdempotentParameterMismatch`,
/// Alibaba's idempotence rule); with the same parameters it answers the first call.
#[tokio::test]
async fn a_client_token_reused_with_other_parameters_is_refused() {
    let emulator = emulator(|_| {}).await;
    let ess = client(&emulator).ess();
    let first = ess
        .scale_out(GROUP, 1, "token-x", &metadata("r-x"))
        .await
        .expect("scale out");
    settled(&emulator).await;
    let again = ess
        .scale_out(GROUP, 1, "token-x", &metadata("r-x"))
        .await
        .expect("same parameters");
    assert_eq!(again.scaling_activity_id, first.scaling_activity_id);
    match ess.scale_out(GROUP, 2, "token-x", &metadata("r-x")).await {
        Err(Error::Api { error, .. }) => assert_eq!(error.code, "IdempotentParameterMismatch"),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// cluster-autoscaler's in-tree alicloud provider, with the Alibaba Cloud SDK it vendors,
/// drives the emulator through CA's NodeGroup interface: lists the group, scales out, reads
/// the template, deletes a node (scale-in) and is refused a target-size decrease below its
/// instances (`alicloud-check-intree`, a test of that package built by
/// `tests/upstream/build.sh alicloud-check`). The provider is unmodified: the SDK's endpoint
/// mapping names hosts that only exist through `HTTP_PROXY`, which is the emulator. It fails
/// when the SDK cannot parse an answer or the provider gets an error.
#[tokio::test]
async fn cluster_autoscalers_in_tree_provider_drives_the_emulator() {
    let bin = ngo_testbed::upstream_check("alicloud-check-intree", "alicloud-check")
        .unwrap_or_else(|e| panic!("{e}"));
    // A type on the first page of DescribeInstanceTypes: the provider reads only that page
    // (no NextToken), so it never finds a type beyond the first 100.
    const INTREE: &str = "asg-intree";
    let emulator = emulator(|o| {
        let mut group = ScalingGroupSpec::new(INTREE, "ecs.a0-n001.small");
        group.max_size = 5;
        o.groups.push(group);
    })
    .await;
    let key = &emulator.access_keys()[0];
    let stdout = ngo_testbed::check_output(
        tokio::process::Command::new(&bin)
            .args([
                "-test.run",
                "TestInTreeProviderAgainstTheEmulator",
                "-test.v",
            ])
            .env("HTTP_PROXY", emulator.url())
            .env("http_proxy", emulator.url())
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env("ACCESS_KEY_ID", &key.id)
            .env("ACCESS_KEY_SECRET", &key.secret)
            .env("REGION_ID", emulator.region())
            .env("ALICLOUD_CHECK_GROUP", INTREE)
            .env("ALICLOUD_CHECK_INSTANCE_TYPE", "ecs.a0-n001.small"),
    )
    .await
    .unwrap_or_else(|e| panic!("alicloud-check-intree: {e}"));
    assert!(stdout.contains("--- PASS"), "{stdout}");
    // What it did, on the emulator's side: CA's own calls, as CA makes them.
    let scale = emulator.requests_of("ScaleWithAdjustment");
    assert_eq!(scale[0].params["AdjustmentType"], "TotalCapacity");
    let removals = emulator.requests_of("RemoveInstances");
    assert!(
        removals
            .iter()
            .all(|r| r.params["InstanceId.1"] == removals[0].params["InstanceId.1"])
            && removals.iter().any(|r| r.status == Some(200)),
        "one instance, per call, removed once ESS let it: {removals:?}"
    );
    assert_eq!(emulator.instances(INTREE).len(), 1);
}

/// A published example of `tests/fixtures/alicloud` (`{source, request, status, documented,
/// body}`; `documented`: the response parameters its page lists).
fn published(name: &str) -> serde_json::Value {
    let path = format!(
        "{}/tests/fixtures/alicloud/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        value["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("https://")),
        "{name} names no source"
    );
    assert!(
        value["status"].is_u64() && value["body"].is_object(),
        "{name}"
    );
    value
}

/// Makes the emulator answer the next request of `action` with `example` as published.
fn serve_published(
    emulator: &ngo_testbed::alicloud::AliCloudEmulator,
    action: &str,
    example: &serde_json::Value,
) {
    let status = u16::try_from(example["status"].as_u64().unwrap()).unwrap();
    emulator.inject(
        Some(action),
        1,
        ngo_testbed::alicloud::FaultAction::Respond {
            status,
            body: example["body"].to_string(),
        },
    );
}

/// One request to the emulator without the operator's client, signed with the emulator's
/// own signature functions, so the answer's JSON is seen as sent: status and body.
async fn signed_request(
    emulator: &ngo_testbed::alicloud::AliCloudEmulator,
    version: &str,
    params: &[(&str, &str)],
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let key = &emulator.access_keys()[0];
    let mut query: std::collections::BTreeMap<String, String> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let timestamp = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    for (k, v) in [
        ("Version", version.to_string()),
        ("Format", "JSON".to_string()),
        ("Timestamp", timestamp),
        ("SignatureMethod", "HMAC-SHA1".to_string()),
        ("SignatureVersion", "1.0".to_string()),
        ("SignatureNonce", format!("{:032x}", rand::random::<u128>())),
        ("AccessKeyId", key.id.clone()),
        ("RegionId", emulator.region().to_string()),
    ] {
        query.insert(k.to_string(), v);
    }
    let signature = ngo_testbed::alicloud::signature(
        &key.secret,
        &ngo_testbed::alicloud::string_to_sign("POST", &query),
    );
    query.insert("Signature".to_string(), signature);
    let query = ngo_cloud_alicloud::signature::canonical_query(&query);
    let addr = emulator.url().trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "POST /?{query} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 0\r\n\
         Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let text = String::from_utf8(answer).unwrap();
    let (head, payload) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let mut body = payload.to_string();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.clear();
        let mut rest = payload;
        loop {
            let (size, tail) = rest.split_once("\r\n").unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            body.push_str(&tail[..size]);
            rest = &tail[size + 2..];
        }
    }
    (status, serde_json::from_str(&body).unwrap())
}

/// Checks the emulator's answer `ours` (`status`) against the published `example`: the same
/// status; the example's shape (`ngo_testbed::json_shape::differences`) but at `exempt`
/// paths; no key the example lacks (`ngo_testbed::json_shape::extra_keys`) unless its page
/// lists it or it is `undocumented`. Every exemption must be needed, so the lists stay true.
fn same_shape(
    example: &serde_json::Value,
    status: u16,
    ours: &serde_json::Value,
    at: &str,
    exempt: &[&str],
    undocumented: &[&str],
) {
    use ngo_testbed::json_shape::{differences, extra_keys};
    assert_eq!(u64::from(status), example["status"], "{at}: {ours}");
    let body = &example["body"];
    let found = differences(body, ours, at, exempt);
    assert!(found.is_empty(), "{at}: {found:#?}");
    let all = differences(body, ours, at, &[]);
    for path in exempt {
        assert!(
            all.iter().any(|d| d.starts_with(&format!("{path}:"))),
            "{path} is exempt but has the example's shape: {all:#?}"
        );
    }
    let documented: Vec<&str> = example["documented"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    let extras = extra_keys(body, ours, at, &documented);
    let name = |path: &str| -> String {
        let last = path.rsplit('.').next().unwrap_or(path);
        last.trim_end_matches("[0]").to_string()
    };
    let unlisted: Vec<&String> = extras
        .iter()
        .filter(|p| !undocumented.contains(&name(p).as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "{at}: keys neither in the example nor in its page's parameters: {unlisted:#?}"
    );
    for key in undocumented {
        assert!(
            extras.iter().any(|p| name(p) == *key),
            "{key} is allowed undocumented in {at} but not sent: {extras:#?}"
        );
    }
}

/// Alibaba Cloud's published examples (`tests/fixtures/alicloud`, each with its source: the
/// API reference pages of the ESS and ECS documentation repositories) decode with the
/// operator's client, and the emulator answers the same requests in their shape. Where the
/// emulator and a page differ, the exemptions below say why; `tests/fixtures/alicloud/README.md`
/// lists every difference and the actions without a published example.
#[tokio::test]
async fn published_examples_decode_and_the_emulator_answers_their_shape() {
    use base64::Engine as _;
    use ngo_cloud_alicloud::{
        ActivityStatus, ApiErrorKind, Error, GroupLifecycleState, InstanceLifecycleState,
        RemoveOptions,
    };
    use ngo_testbed::alicloud::FaultAction;
    const ESS: &str = "2014-08-28";
    const ECS: &str = "2014-05-26";
    let emulator = emulator(|_| {}).await;
    let client = client(&emulator);
    let ess = client.ess();
    // Something for the emulator to describe: an instance, launched by an activity that ended.
    ess.scale_out(GROUP, 1, "token-published", &metadata("published"))
        .await
        .expect("scale out");
    settled(&emulator).await;
    let instance = emulator.instances(GROUP)[0].id.clone();
    let configuration = ess
        .scaling_group(GROUP)
        .await
        .expect("group")
        .active_scaling_configuration_id
        .expect("a scaling configuration");

    // DescribeScalingGroups.
    let example = published("DescribeScalingGroups.json");
    serve_published(&emulator, "DescribeScalingGroups", &example);
    let group = ess
        .scaling_group("asg-bp14wlu85wrpchm0****")
        .await
        .expect("the example decodes");
    assert_eq!(
        (group.name.as_str(), group.region_id.as_str()),
        ("scalinggroup****", "cn-qingdao")
    );
    assert_eq!(group.lifecycle_state, GroupLifecycleState::Inactive);
    assert_eq!((group.min_size, group.max_size), (1, 2));
    // The example has no DesiredCapacity: a group without expected capacity.
    assert_eq!(group.desired_capacity, None);
    assert_eq!(
        (
            group.total_capacity,
            group.active_capacity,
            group.pending_capacity,
            group.removing_capacity
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(
        group.active_scaling_configuration_id.as_deref(),
        Some("asc-bp1et2qekq3ojr33****")
    );
    assert_eq!(group.vswitch_ids, ["vsw-bp1whw2u46cn8zubm****"]);
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "DescribeScalingGroups"),
            ("ScalingGroupId.1", GROUP),
            ("PageSize", "10"),
        ],
    )
    .await;
    assert!(
        ours["ScalingGroups"]["ScalingGroup"][0].is_object(),
        "{ours}"
    );
    // The client reads both; the page (2021-04) does not list them.
    same_shape(
        &example,
        status,
        &ours,
        "DescribeScalingGroups",
        &[],
        &["EnableDesiredCapacity", "InitCapacity"],
    );

    // DescribeScalingInstances.
    let example = published("DescribeScalingInstances.json");
    serve_published(&emulator, "DescribeScalingInstances", &example);
    let instances = ess
        .scaling_instances(GROUP)
        .await
        .expect("the example decodes");
    assert_eq!(instances.len(), 1, "{instances:?}");
    let i = &instances[0];
    assert_eq!(i.instance_id, "i-m5e3z5l951fibnd9****");
    assert_eq!(i.lifecycle_state, InstanceLifecycleState::InService);
    assert_eq!(
        (i.health_status.as_str(), i.creation_type.as_str()),
        ("Healthy", "AutoCreated")
    );
    assert_eq!(i.zone_id.as_deref(), Some("cn-hangzhou-g"));
    assert_eq!(
        i.scaling_activity_id.as_deref(),
        Some("asa-bp1c9djwrgxjyk31****")
    );
    assert_eq!(
        i.scaling_configuration_id.as_deref(),
        Some("asc-m5e9vcoen45jspz7****")
    );
    assert_eq!(i.creation_time.as_deref(), Some("2020-12-21T03:11Z"));
    assert!(i.entrusted);
    // Neither the example nor the page's parameters have an instance's type.
    assert_eq!(i.instance_type, None);
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "DescribeScalingInstances"),
            ("ScalingGroupId", GROUP),
        ],
    )
    .await;
    assert!(
        ours["ScalingInstances"]["ScalingInstance"][0].is_object(),
        "{ours}"
    );
    // `InstanceType`: the client reads it (a Node template's type), the page (2021-06) does
    // not list it. `PrivateIpAddress`: the emulator's Node names; the client does not read it.
    same_shape(
        &example,
        status,
        &ours,
        "DescribeScalingInstances",
        &[],
        &["InstanceType", "PrivateIpAddress"],
    );

    // DescribeScalingConfigurations.
    let mut example = published("DescribeScalingConfigurations.json");
    serve_published(&emulator, "DescribeScalingConfigurations", &example);
    let c = ess
        .scaling_configuration(GROUP, "asc-bp1ezrfgoyn5kijl****")
        .await
        .expect("the example decodes")
        .expect("the example's configuration");
    assert_eq!(
        (c.name.as_str(), c.lifecycle_state.as_str()),
        ("scalingconfig****", "Active")
    );
    assert_eq!(c.instance_type.as_deref(), Some("ecs.g6.large"));
    assert_eq!(
        c.image_id.as_deref(),
        Some("centos6u5_64_20G_aliaegis_2014****.vhd")
    );
    assert!(c.instance_types.is_empty() && c.tags.is_empty());
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "DescribeScalingConfigurations"),
            ("ScalingGroupId", GROUP),
            ("ScalingConfigurationId.1", &configuration),
        ],
    )
    .await;
    // This example is the page's XML example turned into JSON: one-item lists are lone
    // objects and every number is a string. The page's parameters say otherwise (`Array of
    // ScalingConfiguration`, `DataDisks`, `Integer`), as the other pages' examples have it,
    // and the emulator follows them; the client decodes both.
    for list in [
        "/ScalingConfigurations/ScalingConfiguration",
        "/ScalingConfigurations/ScalingConfiguration/0/DataDisks/DataDisk",
    ] {
        let item = example["body"].pointer_mut(list).unwrap();
        assert!(item.is_object(), "{list}: {item}");
        *item = serde_json::Value::Array(vec![item.take()]);
    }
    same_shape(
        &example,
        status,
        &ours,
        "DescribeScalingConfigurations",
        &[
            "DescribeScalingConfigurations.TotalCount",
            "DescribeScalingConfigurations.PageNumber",
            "DescribeScalingConfigurations.PageSize",
            "DescribeScalingConfigurations.ScalingConfigurations.ScalingConfiguration[0].InternetMaxBandwidthIn",
            "DescribeScalingConfigurations.ScalingConfigurations.ScalingConfiguration[0].InternetMaxBandwidthOut",
        ],
        &[],
    );

    // DescribeScalingActivities.
    let example = published("DescribeScalingActivities.json");
    serve_published(&emulator, "DescribeScalingActivities", &example);
    let a = ess
        .scaling_activity(GROUP, "asa-bp161xudmuxdzofe****")
        .await
        .expect("the example decodes")
        .expect("the example's activity");
    assert_eq!(a.status, ActivityStatus::Successful);
    assert_eq!((a.progress, a.scaling_instance_number), (100, 1));
    assert_eq!(a.status_message, "\"1\" ECS instances are added");
    assert_eq!(a.description, "Add \"1\" ECS instance");
    assert!(
        a.cause
            .starts_with("A user requests to execute scaling rule \"asr-bp12tcnol686y1ik****\""),
        "{}",
        a.cause
    );
    assert_eq!(
        (a.start_time.as_deref(), a.end_time.as_deref()),
        (Some("2020-09-10T09:54Z"), Some("2020-09-10T09:54Z"))
    );
    assert!(a.created_instances.is_empty() && a.metadata.is_empty() && a.error_code.is_none());
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "DescribeScalingActivities"),
            ("ScalingGroupId", GROUP),
        ],
    )
    .await;
    assert_eq!(
        ours["ScalingActivities"]["ScalingActivity"][0]["StatusCode"], "Successful",
        "{ours}"
    );
    let activity = "DescribeScalingActivities.ScalingActivities.ScalingActivity[0]";
    same_shape(
        &example,
        status,
        &ours,
        "DescribeScalingActivities",
        // The page types these three `String`, its example has numbers; the emulator
        // follows the parameters. The client reads none of them.
        &[
            &format!("{activity}.TotalCapacity"),
            &format!("{activity}.AttachedCapacity"),
            &format!("{activity}.AutoCreatedCapacity"),
        ],
        // The client reads all but `Destroyed*` (a scale-out's instances and request, a
        // launch's created capacity); the page (2021-02) lists none of them.
        &[
            "CreatedCapacity",
            "DestroyedCapacity",
            "CreatedInstances",
            "DestroyedInstances",
            "ActivityMetadata",
        ],
    );

    // DescribeInstanceTypes.
    let example = published("DescribeInstanceTypes.json");
    serve_published(&emulator, "DescribeInstanceTypes", &example);
    let types = client
        .ecs()
        .instance_types(&["ecs.g6.large"])
        .await
        .expect("the example decodes");
    assert_eq!(types.len(), 1, "{types:?}");
    let t = &types[0];
    assert_eq!(
        (t.id.as_str(), t.family.as_str()),
        ("ecs.g6.large", "ecs.g6")
    );
    assert_eq!((t.cpu_cores, t.memory_gib, t.gpu_amount), (2, 8.0, 0));
    assert_eq!(
        (t.gpu_spec.as_deref(), t.cpu_architecture.as_deref()),
        (None, None)
    );
    let (status, ours) = signed_request(
        &emulator,
        ECS,
        &[
            ("Action", "DescribeInstanceTypes"),
            ("InstanceTypes.1", "ecs.g6.large"),
        ],
    )
    .await;
    assert_eq!(
        ours["InstanceTypes"]["InstanceType"][0]["InstanceTypeId"],
        "ecs.g6.large"
    );
    let instance_type = "DescribeInstanceTypes.InstanceTypes.InstanceType[0]";
    let mut exempt = vec![
        // `Float` in the page's parameters (`8.0`), `8` in its example; the client reads
        // either.
        format!("{instance_type}.MemorySize"),
    ];
    // Network and disk limits, which differ per type: the emulator's catalogue does not
    // model them and the client reads none of them.
    exempt.extend(
        [
            "DiskQuantity",
            "EniIpv6AddressQuantity",
            "EniPrivateIpAddressQuantity",
            "EniQuantity",
            "EniTotalQuantity",
            "InstanceBandwidthRx",
            "InstanceBandwidthTx",
            "InstancePpsRx",
            "InstancePpsTx",
            "MaximumQueueNumberPerEni",
            "PrimaryEniQueueNumber",
            "SecondaryEniQueueNumber",
            "TotalEniQueueQuantity",
        ]
        .map(|k| format!("{instance_type}.{k}")),
    );
    let exempt: Vec<&str> = exempt.iter().map(String::as_str).collect();
    same_shape(
        &example,
        status,
        &ours,
        "DescribeInstanceTypes",
        &exempt,
        // The client reads `NextToken` (pages of `MaxResults`) and `CpuArchitecture`; the
        // page (2021-05) lists neither, nor those request parameters. `InstanceCategory` is
        // the emulator's alone.
        &["NextToken", "CpuArchitecture", "InstanceCategory"],
    );

    // ModifyScalingConfiguration: `{RequestId}`.
    let example = published("ModifyScalingConfiguration.json");
    serve_published(&emulator, "ModifyScalingConfiguration", &example);
    ess.set_user_data(&configuration, "#!/bin/sh\n")
        .await
        .expect("the example decodes");
    let user_data = base64::engine::general_purpose::STANDARD.encode("#!/bin/sh\n");
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "ModifyScalingConfiguration"),
            ("ScalingConfigurationId", &configuration),
            ("UserData", &user_data),
        ],
    )
    .await;
    same_shape(
        &example,
        status,
        &ours,
        "ModifyScalingConfiguration",
        &[],
        &[],
    );

    // ModifyScalingGroup: `{RequestId}`.
    let example = published("ModifyScalingGroup.json");
    serve_published(&emulator, "ModifyScalingGroup", &example);
    ess.set_desired_capacity(GROUP, 1)
        .await
        .expect("the example decodes");
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "ModifyScalingGroup"),
            ("ScalingGroupId", GROUP),
            ("MaxSize", "60"),
        ],
    )
    .await;
    same_shape(&example, status, &ours, "ModifyScalingGroup", &[], &[]);

    // RemoveInstances: the client lists the group's instances (the emulator's), then the
    // removal answers the example.
    let example = published("RemoveInstances.json");
    serve_published(&emulator, "RemoveInstances", &example);
    let report = ess
        .remove_instances(
            GROUP,
            std::slice::from_ref(&instance),
            RemoveOptions::default(),
        )
        .await
        .expect("the example decodes");
    assert_eq!(
        report.scaling_activity_id.as_deref(),
        Some("asa-bp175o6f6ego3r2j****")
    );
    assert_eq!(report.removed, std::slice::from_ref(&instance));
    assert!(report.failed.is_empty(), "{report:?}");
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "RemoveInstances"),
            ("ScalingGroupId", GROUP),
            ("InstanceId.1", &instance),
        ],
    )
    .await;
    same_shape(&example, status, &ours, "RemoveInstances", &[], &[]);

    // The common error body, ESS's (`InternalError`, HTTP 500: retried, then reported).
    let example = published("error-ess.json");
    let attempts = usize::try_from(options(&emulator).retry.max_retries).unwrap() + 1;
    emulator.inject(
        Some("DescribeScalingGroups"),
        attempts,
        FaultAction::Respond {
            status: 500,
            body: example["body"].to_string(),
        },
    );
    let error = match ess.scaling_group(GROUP).await {
        Err(Error::Api { error, .. }) => error,
        other => panic!("{other:?}"),
    };
    assert_eq!((error.status, error.code.as_str()), (500, "InternalError"));
    assert_eq!(
        error.message,
        "The request processing has failed due to some unknown error, exception or failure."
    );
    assert_eq!(
        error.request_id.as_deref(),
        Some("540CFF28-407A-40B5-B6A5-74Bxxxxxxxxx")
    );
    assert_eq!(error.host_id.as_deref(), Some("ess.aliyuncs.com"));
    assert_eq!(error.recommend, None);
    assert_eq!(error.kind(), ApiErrorKind::ServiceUnavailable);
    emulator.inject(
        Some("DescribeScalingGroups"),
        1,
        FaultAction::Error {
            status: 500,
            code: "InternalError".into(),
            message:
                "The request processing has failed due to some unknown error, exception or failure."
                    .into(),
        },
    );
    let (status, ours) = signed_request(
        &emulator,
        ESS,
        &[
            ("Action", "DescribeScalingGroups"),
            ("ScalingGroupId.1", GROUP),
        ],
    )
    .await;
    // `Recommend` (a troubleshooting link): the client keeps it; the page (2018) names
    // `RequestId`, `HostId`, `Code` and `Message` only.
    same_shape(&example, status, &ours, "error", &[], &["Recommend"]);

    // ECS's (`MissingParameter.CommandId`, HTTP 400), against an ECS request the emulator
    // refuses itself.
    let example = published("error-ecs.json");
    serve_published(&emulator, "DescribeInstanceTypes", &example);
    let error = match client.ecs().instance_types(&["ecs.g6.large"]).await {
        Err(Error::Api { error, .. }) => error,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (error.status, error.code.as_str()),
        (400, "MissingParameter.CommandId")
    );
    assert_eq!(
        error.message,
        "The input parameter \u{201c}CommandId\u{201d} that is required for processing this request is not supplied."
    );
    assert_eq!(error.host_id.as_deref(), Some("ecs.aliyuncs.com"));
    assert_eq!(error.kind(), ApiErrorKind::InvalidRequest);
    let (status, ours) = signed_request(
        &emulator,
        ECS,
        &[("Action", "DescribeInstanceTypes"), ("MaxResults", "0")],
    )
    .await;
    assert_eq!(ours["HostId"], "ecs.aliyuncs.com", "{ours}");
    same_shape(&example, status, &ours, "error", &[], &["Recommend"]);
}
