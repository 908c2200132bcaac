//! NodeGroupPolicy end to end against a real kube-apiserver: validation by the API server,
//! rules merged with annotations, conflicts, status, printer columns, events, pricing, options.

use std::time::Duration;

use crate::support::rpc::Rpc;
use crate::support::*;
use ngo_service::proto;
use serde_json::json;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn the_api_server_rejects_invalid_policies_with_clear_messages() {
    let ns = TestNs::new("ngp-invalid").await;
    let cases = [
        (
            json!({"selector": {}, "minSize": 5, "maxSize": 2}),
            "minSize must not be greater than maxSize",
        ),
        (json!({"selector": {}, "maxSize": 0}), "spec.maxSize"),
        (
            json!({"selector": {}, "options": {"scaleDownUtilizationThreshold": 1.5}}),
            "scaleDownUtilizationThreshold",
        ),
        (
            json!({"selector": {}, "options": {"scaleDownUnneededTime": "ten minutes"}}),
            "scaleDownUnneededTime",
        ),
        (
            json!({"selector": {}, "scaleFromZero": {"capacity": {"cpu": "lots"}}}),
            "must be a Kubernetes quantity",
        ),
        (
            json!({"selector": {"kinds": ["Deployment"]}}),
            "spec.selector.kinds",
        ),
        (
            json!({"selector": {}, "scaleFromZero": {"taints": [{"key": "k", "effect": "Sometimes"}]}}),
            "effect",
        ),
        (
            json!({"selector": {}, "pricing": {"nodeHourly": -1}}),
            "nodeHourly",
        ),
    ];
    for (i, (spec, expected)) in cases.into_iter().enumerate() {
        let err = ns
            .policy(&format!("bad-{i}"), spec.clone())
            .await
            .expect_err(&format!("{spec} must be rejected"));
        let kube::Error::Api(status) = err else {
            panic!("{spec}: not an API error")
        };
        assert_eq!(status.code, 422, "{spec}: {}", status.message);
        assert!(
            status.message.contains(expected),
            "{spec}: {:?} does not mention {expected:?}",
            status.message
        );
    }
    ns.policy("good", json!({"selector": {}, "minSize": 0, "maxSize": 3}))
        .await
        .expect("a valid policy is accepted");
}

#[tokio::test]
async fn a_policy_governs_several_deployments_and_annotations_win_field_by_field() {
    let ns = TestNs::new("ngp-merge").await;
    for name in ["a", "b", "c"] {
        ns.machine_deployment(name, 1, json!({})).await;
    }
    ns.label(&machine_deployments(), "a", json!({"pool": "general"}))
        .await;
    ns.label(&machine_deployments(), "b", json!({"pool": "general"}))
        .await;
    // b overrides max only; c is not selected.
    ns.api(&machine_deployments())
        .patch(
            "b",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {MAX: "4"}}})),
        )
        .await
        .unwrap();
    ns.apply_example("nodegrouppolicy.yaml").await;
    let (operator, client) = ns.operator().await;
    let found = wait_groups(&client, 2).await;
    let a = found.iter().find(|g| g.id.ends_with("/a")).unwrap();
    let b = found.iter().find(|g| g.id.ends_with("/b")).unwrap();
    assert_eq!((a.min_size, a.max_size), (1, 10), "from the policy");
    assert_eq!(
        (b.min_size, b.max_size),
        (1, 4),
        "max from the annotation, min from the policy"
    );

    let status = ns.policy_status("general", |s| s.group_count == 2).await;
    let gb = status.groups.iter().find(|g| g.id.ends_with("/b")).unwrap();
    assert_eq!(
        (gb.min_source.as_str(), gb.max_source.as_str()),
        ("Policy", "Annotation")
    );
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "GroupsServed")
    );
    assert_eq!(status.target_nodes, 2);

    // kubectl shows the printer columns.
    let table = ns.kubectl(&["get", "ngp"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "GROUPS", "MIN", "MAX", "TARGET", "READY", "STATUS", "AGE"
        ]
    );
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        &row[..7],
        ["general", "2", "1", "10", "2", "0", "GroupsServed"]
    );
    let described = ns.kubectl(&["describe", "ngp", "general"]);
    assert!(
        described.contains("Groups Served") || described.contains("GroupsServed"),
        "{described}"
    );
    assert!(
        described
            .lines()
            .any(|l| l.contains("Max Source:") && l.ends_with("Annotation")),
        "{described}"
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn two_policies_on_one_resource_the_older_governs_and_the_other_reports_conflict() {
    let ns = TestNs::new("ngp-conflict").await;
    ns.machine_deployment("md", 1, json!({})).await;
    ns.policy("older", json!({"selector": {}, "maxSize": 3}))
        .await
        .unwrap();
    // Creation timestamps have one-second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ns.policy(
        "newer",
        json!({"selector": {"kinds": ["MachineDeployment"]}, "maxSize": 8}),
    )
    .await
    .unwrap();
    let (operator, client) = ns.operator().await;
    let found = wait_groups(&client, 1).await;
    assert_eq!(found[0].max_size, 3, "the older policy governs");
    let newer = ns
        .policy_status("newer", |s| {
            condition(s, "Conflict").is_some_and(|c| c.status == "True")
        })
        .await;
    let conflict = condition(&newer, "Conflict").unwrap();
    assert!(
        conflict.message.contains(&format!(
            "MachineDeployment/{}/md (by {}/older)",
            ns.name, ns.name
        )),
        "{}",
        conflict.message
    );
    assert_eq!(condition(&newer, "Ready").unwrap().reason, "Conflict");
    let older = ns.policy_status("older", |s| s.group_count == 1).await;
    assert_eq!(condition(&older, "Conflict").unwrap().status, "False");
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_policy_that_selects_nothing_says_so() {
    let ns = TestNs::new("ngp-empty").await;
    ns.policy(
        "lonely",
        json!({"selector": {"matchLabels": {"pool": "none"}}, "maxSize": 3}),
    )
    .await
    .unwrap();
    let (operator, _client) = ns.operator().await;
    let status = ns
        .policy_status("lonely", |s| condition(s, "Ready").is_some())
        .await;
    let ready = condition(&status, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "NoMatchingResources")
    );
    assert_eq!(status.observed_generation, Some(1));
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_invalid_annotation_shows_on_the_policy_while_other_groups_work() {
    let ns = TestNs::new("ngp-badann").await;
    ns.machine_deployment("good", 1, json!({})).await;
    ns.machine_deployment("bad", 1, json!({MAX: "a lot"})).await;
    ns.policy("all", json!({"selector": {}, "maxSize": 5}))
        .await
        .unwrap();
    let (operator, client) = ns.operator().await;
    let found = wait_groups(&client, 1).await;
    assert!(found[0].id.ends_with("/good"));
    let status = ns
        .policy_status("all", |s| {
            condition(s, "ResourcesValid").is_some_and(|c| c.status == "False")
        })
        .await;
    let valid = condition(&status, "ResourcesValid").unwrap();
    assert_eq!(valid.reason, "InvalidConfiguration");
    assert!(
        valid.message.contains(MAX) && valid.message.contains("a lot"),
        "{}",
        valid.message
    );
    assert_eq!(condition(&status, "Ready").unwrap().status, "True");
    let events = eventually("events on the policy and the resource", WAIT, || {
        let ns = &ns;
        async move {
            let on_policy = ns.events_for("all").await;
            let on_resource = ns.events_for("bad").await;
            (!on_policy.is_empty() && !on_resource.is_empty()).then_some((on_policy, on_resource))
        }
    })
    .await;
    assert!(
        events
            .0
            .iter()
            .any(|(r, n)| r == "InvalidAutoscalerConfiguration" && n.contains("/bad")),
        "{:?}",
        events.0
    );
    assert!(
        events
            .1
            .iter()
            .any(|(r, _)| r == "InvalidAutoscalerConfiguration"),
        "{:?}",
        events.1
    );
    operator.shutdown().await.unwrap();
}

/// Only unusable bounds exclude a group. Bad option, capacity, label and taint values leave it
/// served, with the defaults (or the policy's values) in their place, and are reported on the
/// resource (Event) and on the governing policy (status).
#[tokio::test]
async fn bad_option_capacity_label_and_taint_values_keep_the_group_served_and_reported() {
    let ns = TestNs::new("ngp-tolerant").await;
    ns.machine_deployment(
        "md",
        0,
        json!({
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime": "10",
            "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold": "1.1",
            "capacity.cluster-autoscaler.kubernetes.io/cpu": "2",
            "capacity.cluster-autoscaler.kubernetes.io/memory": "16GB",
            "capacity.cluster-autoscaler.kubernetes.io/labels": "pool=a,foo",
            "capacity.cluster-autoscaler.kubernetes.io/taints": "a=b:noschedule",
        }),
    )
    .await;
    ns.policy(
        "p",
        json!({"selector": {}, "maxSize": 3, "scaleFromZero": {"capacity": {"memory": "8Gi"}}}),
    )
    .await
    .unwrap();
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = format!("MachineDeployment/{}/md", ns.name);
    let served = wait_groups(&rpc.raw(), 1).await;
    assert_eq!(
        (served[0].id.as_str(), served[0].max_size),
        (id.as_str(), 3)
    );

    // Scale from zero works with cpu from the annotation and memory from the policy, the
    // good label and the taint as written.
    let node = rpc
        .node_group_template_node_info(&id)
        .await
        .expect("template");
    let capacity = node.status.unwrap().capacity;
    assert_eq!(capacity["cpu"].string.as_deref(), Some("2"));
    assert_eq!(capacity["memory"].string.as_deref(), Some("8Gi"));
    let labels = node.metadata.unwrap().labels;
    assert_eq!(labels.get("pool").map(String::as_str), Some("a"));
    assert!(!labels.contains_key("foo"));
    let taints = node.spec.unwrap().taints;
    assert_eq!(
        taints
            .iter()
            .map(|t| (t.key.as_deref(), t.value.as_deref(), t.effect.as_deref()))
            .collect::<Vec<_>>(),
        vec![(Some("a"), Some("b"), Some("noschedule"))]
    );

    // No usable option override: CA's defaults apply (UNIMPLEMENTED means "use yours").
    let defaults = proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        ..Default::default()
    };
    let options = rpc.node_group_get_options(&id, defaults).await.unwrap_err();
    assert_eq!(options.code(), Code::Unimplemented);

    let status = ns
        .policy_status("p", |s| {
            condition(s, "ResourcesValid").is_some_and(|c| c.reason == "InvalidValuesIgnored")
        })
        .await;
    assert_eq!(condition(&status, "Ready").unwrap().status, "True");
    let group = &status.groups[0];
    assert_eq!(group.problem, None);
    let warnings = group.warnings.join("\n");
    for needle in [
        "autoscaling-options-scaledownunneededtime=\"10\"",
        "autoscaling-options-scaledownutilizationthreshold=\"1.1\"",
        "capacity.cluster-autoscaler.kubernetes.io/memory=\"16GB\"",
        "item \"foo\" skipped",
        "item \"a=b:noschedule\" kept as written",
    ] {
        assert!(warnings.contains(needle), "{needle} in {warnings}");
    }
    let events = eventually("a warning event on the resource", WAIT, || {
        let ns = &ns;
        async move {
            let events = ns.events_for("md").await;
            events
                .into_iter()
                .find(|(reason, _)| reason == "AutoscalerConfigurationWarning")
        }
    })
    .await;
    assert!(
        events.1.starts_with("served as a node group") && events.1.contains("16GB"),
        "{}",
        events.1
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn scaling_shows_in_status_and_events_on_the_policy() {
    let ns = TestNs::new("ngp-scale").await;
    ns.machine_deployment("md", 1, json!({})).await;
    ns.policy("p", json!({"selector": {}, "minSize": 1, "maxSize": 2}))
        .await
        .unwrap();
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = wait_groups(&rpc.raw(), 1).await[0].id.clone();
    rpc.node_group_increase_size(&id, 1).await.unwrap();
    let over = rpc.node_group_increase_size(&id, 1).await.unwrap_err();
    assert_eq!(over.code(), Code::FailedPrecondition);
    let status = ns
        .policy_status("p", |s| {
            s.groups
                .first()
                .is_some_and(|g| g.last_scale_up.is_some() && g.target == 2)
        })
        .await;
    assert_eq!(status.target_nodes, 2);
    let expected = |events: &[(String, String)]| {
        events
            .iter()
            .any(|(r, n)| r == "ScaleUp" && n.contains("from 1 to 2"))
            && events
                .iter()
                .any(|(r, n)| r == "ScaleUpRejected" && n.contains("max:2"))
    };
    let events = ns.wait_events_for("p", expected).await;
    assert!(expected(&events), "{events:?}");
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn pricing_and_options_come_from_the_policy() {
    let ns = TestNs::new("ngp-price").await;
    ns.machine_deployment("md", 0, json!({})).await;
    ns.label(&machine_deployments(), "md", json!({"pool": "general"}))
        .await;
    ns.apply_example("nodegrouppolicy.yaml").await;
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    let id = wait_groups(&rpc.raw(), 1).await[0].id.clone();
    let hour = 3600;

    // The template node carries its group, so CA's price expander can price it.
    let node = rpc.node_group_template_node_info(&id).await.unwrap();
    let meta = node.metadata.unwrap();
    assert_eq!(
        meta.labels["node.kubernetes.io/instance-type"],
        "general-4x16"
    );
    let template_node = proto::ExternalGrpcNode {
        name: "template-node".into(),
        annotations: meta.annotations.into_iter().collect(),
        ..Default::default()
    };
    let price = rpc
        .pricing_node_price(template_node, 0..2 * hour)
        .await
        .unwrap();
    assert!((price - 0.38).abs() < 1e-9, "2 hours at 0.19: {price}");
    // CA <= 1.34 sends the window in the legacy metav1.Time fields.
    let legacy = |h: i64| {
        Some(proto::LegacyTime {
            seconds: h * 3600,
            nanos: 0,
        })
    };
    let node = || proto::ExternalGrpcNode {
        name: "template-node".into(),
        annotations: [(
            "autoscaling.nodegroup.dev/node-group".to_string(),
            id.clone(),
        )]
        .into(),
        ..Default::default()
    };
    let legacy_price = rpc
        .raw()
        .pricing_node_price(proto::PricingNodePriceRequest {
            node: Some(node()),
            start_time: legacy(0),
            end_time: legacy(1),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .price;
    assert!((legacy_price - 0.19).abs() < 1e-9, "{legacy_price}");
    let overflow = rpc
        .pricing_node_price(node(), i64::MIN..i64::MAX)
        .await
        .unwrap_err();
    assert_eq!(overflow.code(), Code::InvalidArgument, "{overflow:?}");

    // A pod requesting 2 cores and 4Gi for one hour: 2*0.04 + 4*0.005.
    let pod: k8s_pb::api::core::v1::Pod = k8s_pb::api::core::v1::Pod {
        spec: Some(k8s_pb::api::core::v1::PodSpec {
            containers: vec![k8s_pb::api::core::v1::Container {
                name: Some("app".into()),
                resources: Some(k8s_pb::api::core::v1::ResourceRequirements {
                    requests: [("cpu", "2"), ("memory", "4Gi")]
                        .into_iter()
                        .map(|(k, v)| {
                            (
                                k.to_string(),
                                k8s_pb::apimachinery::pkg::api::resource::Quantity {
                                    string: Some(v.into()),
                                },
                            )
                        })
                        .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let pod_price = rpc.pricing_pod_price(&pod, 0..hour).await.unwrap();
    assert!((pod_price - 0.1).abs() < 1e-9, "{pod_price}");
    // Raw: bytes that are no pod.
    let garbage = rpc
        .raw()
        .pricing_pod_price(proto::PricingPodPriceRequest {
            pod_bytes: vec![0xff, 0xff, 0xff],
            start_timestamp: Some(prost_types::Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            end_timestamp: Some(prost_types::Timestamp {
                seconds: 3600,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(garbage.code(), Code::InvalidArgument);

    let defaults = proto::NodeGroupAutoscalingOptions {
        scale_down_utilization_threshold: 0.5,
        scale_down_gpu_utilization_threshold: 0.5,
        scale_down_unneeded_duration: Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        }),
        max_node_provision_duration: Some(prost_types::Duration {
            seconds: 900,
            nanos: 0,
        }),
        ..Default::default()
    };
    let options = rpc.node_group_get_options(&id, defaults).await.unwrap();
    assert_eq!(options.scale_down_utilization_threshold, 0.6);
    assert_eq!(
        options.scale_down_unneeded_duration,
        Some(prost_types::Duration {
            seconds: 300,
            nanos: 0
        })
    );
    assert_eq!(
        options.max_node_provision_duration,
        Some(prost_types::Duration {
            seconds: 900,
            nanos: 0
        })
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn policy_changes_reach_answers_within_a_loop() {
    let ns = TestNs::new("ngp-latency").await;
    ns.machine_deployment("md", 1, json!({})).await;
    ns.policy("p", json!({"selector": {}, "maxSize": 3}))
        .await
        .unwrap();
    let (operator, client) = ns.operator().await;
    let rpc = Rpc::from(client);
    wait_groups(&rpc.raw(), 1).await;
    let start = std::time::Instant::now();
    policies_api(&ns)
        .patch(
            "p",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"maxSize": 9}})),
        )
        .await
        .unwrap();
    eventually("max 9", Duration::from_secs(10), || async {
        rpc.node_groups()
            .await
            .unwrap()
            .first()
            .filter(|g| g.max_size == 9)
            .map(|_| ())
    })
    .await;
    eprintln!("policy watch-to-answer latency: {:?}", start.elapsed());
    operator.shutdown().await.unwrap();
}

/// A NodePool's `bootstrap.extraGroups` becomes its bootstrap token's `auth-extra-groups`:
/// the API server refuses, in the CRD schema, any group the bootstrap token authenticator
/// would not accept (only `system:bootstrappers:` groups), so no tenant can write
/// `system:masters` there.
#[tokio::test]
async fn the_api_server_refuses_bootstrap_groups_outside_system_bootstrappers() {
    let ns = TestNs::new("np-groups").await;
    let pools = ns.api(&kube::discovery::ApiResource::erase::<ngo_api::NodePool>(
        &(),
    ));
    let pool = |name: &str, groups: serde_json::Value| -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1", "kind": "NodePool",
            "metadata": {"name": name},
            "spec": {"replicas": 0, "minSize": 0, "maxSize": 1, "clusterName": "c1",
                "bootstrap": {"extraGroups": groups},
                "cherryServers": {"credentialsSecretRef": {"name": "cherry", "key": "token"},
                    "projectId": 1, "region": "eu_nord_1", "plan": "B1-1-1gb-20s-shared",
                    "image": "ubuntu_22_04", "userData": "#cloud-config"}}
        }))
        .expect("pool")
    };
    let too_many: Vec<String> = (0..17)
        .map(|i| format!("system:bootstrappers:g{i}"))
        .collect();
    for (i, groups) in [
        json!(["system:masters"]),
        json!(["system:bootstrappers:"]),
        json!(["system:bootstrappers:Upper"]),
        json!(too_many),
    ]
    .into_iter()
    .enumerate()
    {
        let err = pools
            .create(
                &Default::default(),
                &pool(&format!("bad-{i}"), groups.clone()),
            )
            .await
            .expect_err(&format!("{groups} must be refused"));
        let kube::Error::Api(status) = err else {
            panic!("{groups}: not an API error")
        };
        assert_eq!(status.code, 422, "{groups}: {}", status.message);
        assert!(
            status.message.contains("spec.bootstrap.extraGroups"),
            "{groups}: {}",
            status.message
        );
    }
    pools
        .create(
            &Default::default(),
            &pool(
                "good",
                json!(["system:bootstrappers:kubeadm:default-node-token"]),
            ),
        )
        .await
        .expect("kubeadm's group is accepted");
}
