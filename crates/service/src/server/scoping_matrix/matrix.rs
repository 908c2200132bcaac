//! Every RPC in every scenario: the exact code, and no message naming anything of another
//! tenant.

use super::*;

/// One column of the matrix: who calls, with which group id and node provider ID.
struct Scenario {
    name: &'static str,
    caller: IssuedCert,
    group: String,
    node: String,
}

/// The node group id a node of `provider_id` claims in the annotation this operator puts on
/// template nodes: the group that owns it, or (unknown node) one that does not exist.
fn annotated_group(provider_id: &str) -> String {
    let owner = TENANTS
        .iter()
        .find(|(_, cluster)| self::provider_id(cluster) == provider_id)
        .map_or("tenant-z", |(namespace, _)| namespace);
    group_id(owner)
}

const RPCS: [&str; 15] = [
    "NodeGroups",
    "NodeGroupForNode",
    "PricingNodePrice",
    "PricingPodPrice",
    "GPULabel",
    "GetAvailableGPUTypes",
    "Cleanup",
    "Refresh",
    "NodeGroupTargetSize",
    "NodeGroupIncreaseSize",
    "NodeGroupDeleteNodes",
    "NodeGroupDecreaseTargetSize",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
    "NodeGroupGetOptions",
];

/// What an RPC answered: its code and message, or on success a summary of what it returned.
#[derive(Clone, Debug, PartialEq)]
struct Answer {
    code: Code,
    text: String,
}

fn hour(h: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: 1_700_000_000 + h * 3600,
        nanos: 0,
    })
}

/// A pod requesting one core.
fn pod_bytes() -> Vec<u8> {
    use k8s_pb::api::core::v1 as pb;
    let pod = pb::Pod {
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                resources: Some(pb::ResourceRequirements {
                    requests: BTreeMap::from([(
                        "cpu".to_string(),
                        k8s_pb::apimachinery::pkg::api::resource::Quantity {
                            string: Some("1".into()),
                        },
                    )]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    prost::Message::encode_to_vec(&pod)
}

async fn call(client: &mut CloudProviderClient<Channel>, rpc: &str, s: &Scenario) -> Answer {
    let node = || proto::ExternalGrpcNode {
        provider_id: s.node.clone(),
        annotations: [(
            crate::server::service::TEMPLATE_GROUP_ANNOTATION.to_string(),
            annotated_group(&s.node),
        )]
        .into(),
        ..Default::default()
    };
    let id = s.group.clone();
    let ok = |text: String| Ok::<String, tonic::Status>(text);
    let result = match rpc {
        "NodeGroups" => client
            .node_groups(proto::NodeGroupsRequest {})
            .await
            .and_then(|r| {
                let ids: Vec<String> = r
                    .into_inner()
                    .node_groups
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
                ok(ids.join(","))
            }),
        "NodeGroupForNode" => client
            .node_group_for_node(proto::NodeGroupForNodeRequest { node: Some(node()) })
            .await
            .and_then(|r| ok(r.into_inner().node_group.unwrap_or_default().id)),
        "PricingNodePrice" => client
            .pricing_node_price(proto::PricingNodePriceRequest {
                node: Some(node()),
                start_timestamp: hour(0),
                end_timestamp: hour(1),
                ..Default::default()
            })
            .await
            .and_then(|r| ok(r.into_inner().price.to_string())),
        "PricingPodPrice" => client
            .pricing_pod_price(proto::PricingPodPriceRequest {
                pod_bytes: pod_bytes(),
                start_timestamp: hour(0),
                end_timestamp: hour(1),
                ..Default::default()
            })
            .await
            .and_then(|r| ok(r.into_inner().price.to_string())),
        "GPULabel" => client
            .gpu_label(proto::GpuLabelRequest {})
            .await
            .and_then(|r| ok(r.into_inner().label)),
        "GetAvailableGPUTypes" => client
            .get_available_gpu_types(proto::GetAvailableGpuTypesRequest {})
            .await
            .and_then(|r| {
                let types: Vec<String> = r.into_inner().gpu_types.into_keys().collect();
                ok(types.join(","))
            }),
        "Cleanup" => client
            .cleanup(proto::CleanupRequest {})
            .await
            .and_then(|_| ok(String::new())),
        "Refresh" => client
            .refresh(proto::RefreshRequest {})
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupTargetSize" => client
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
            .await
            .and_then(|r| ok(r.into_inner().target_size.to_string())),
        "NodeGroupIncreaseSize" => client
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest { id, delta: 1 })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupDeleteNodes" => client
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id,
                nodes: vec![node()],
            })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupDecreaseTargetSize" => client
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id,
                delta: -1,
            })
            .await
            .and_then(|_| ok(String::new())),
        "NodeGroupNodes" => client
            .node_group_nodes(proto::NodeGroupNodesRequest { id })
            .await
            .and_then(|r| {
                let ids: Vec<String> = r.into_inner().instances.into_iter().map(|i| i.id).collect();
                ok(ids.join(","))
            }),
        "NodeGroupTemplateNodeInfo" => client
            .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id })
            .await
            .and_then(|r| ok(format!("{} bytes", r.into_inner().node_bytes.len()))),
        "NodeGroupGetOptions" => client
            .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                id,
                defaults: Some(Default::default()),
            })
            .await
            .and_then(|_| ok(String::new())),
        other => panic!("no RPC {other}"),
    };
    match result {
        Ok(text) => Answer {
            code: Code::Ok,
            text,
        },
        Err(status) => Answer {
            code: status.code(),
            text: status.message().to_string(),
        },
    }
}

/// The expected code of `rpc` in scenario `scenario`.
fn expected(scenario: &str, rpc: &str) -> Code {
    let names_group =
        rpc.starts_with("NodeGroup") && rpc != "NodeGroups" && rpc != "NodeGroupForNode";
    match scenario {
        "unknown cluster" | "no identity" => Code::PermissionDenied,
        "cluster deleting" | "cluster not synced" | "cluster not connected" => Code::Unavailable,
        "another cluster's group" | "unknown group" if names_group => Code::NotFound,
        "another cluster's node"
        | "unknown node"
        | "another cluster's machine"
        | "unknown machine"
            if rpc == "NodeGroupDeleteNodes" =>
        {
            Code::NotFound
        }
        "another cluster's group"
        | "unknown group"
        | "another cluster's node"
        | "unknown node"
        | "another cluster's machine"
        | "unknown machine"
            if rpc == "PricingNodePrice" =>
        {
            Code::Unimplemented
        }
        _ => match rpc {
            // Past every check, the mutation reaches the API server, which this test has not.
            "NodeGroupIncreaseSize" | "NodeGroupDeleteNodes" | "NodeGroupDecreaseTargetSize" => {
                Code::Unavailable
            }
            // The group has no option overrides.
            "NodeGroupGetOptions" => Code::Unimplemented,
            _ => Code::Ok,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoping_matrix_every_rpc_in_every_scenario() {
    let endpoint = Endpoint::start().await;
    let own = endpoint.naming("tenant-a", "alpha");
    let scenario = |name, caller: &IssuedCert, group: String, node: String| Scenario {
        name,
        caller: caller.clone(),
        group,
        node,
    };
    let scenarios = [
        scenario("own", &own, group_id("tenant-a"), provider_id("alpha")),
        scenario(
            "another cluster's group",
            &own,
            group_id("tenant-b"),
            provider_id("bravo"),
        ),
        scenario(
            "another cluster's node",
            &own,
            group_id("tenant-a"),
            provider_id("bravo"),
        ),
        scenario(
            "unknown cluster",
            &endpoint.naming("tenant-x", "xray"),
            group_id("tenant-a"),
            provider_id("alpha"),
        ),
        scenario(
            "no identity",
            &endpoint
                .ca
                .issue_client("cluster-autoscaler", &["https://example.com/ca"])
                .expect("cert"),
            group_id("tenant-a"),
            provider_id("alpha"),
        ),
        scenario(
            "cluster deleting",
            &endpoint.naming("tenant-d", "delta"),
            group_id("tenant-d"),
            provider_id("delta"),
        ),
        scenario(
            "cluster not synced",
            &endpoint.naming("tenant-n", "november"),
            group_id("tenant-n"),
            provider_id("november"),
        ),
        scenario(
            "cluster not connected",
            &endpoint.naming("tenant-c", "charlie"),
            group_id("tenant-c"),
            provider_id("charlie"),
        ),
        // What another tenant's objects must be indistinguishable from.
        scenario(
            "unknown group",
            &own,
            group_id("tenant-z"),
            provider_id("zulu"),
        ),
        scenario(
            "unknown node",
            &own,
            group_id("tenant-a"),
            provider_id("zulu"),
        ),
        // A synthetic instance id names a Machine: another cluster's must be unknown too.
        scenario(
            "another cluster's machine",
            &own,
            group_id("tenant-a"),
            FOREIGN_MACHINE.into(),
        ),
        scenario(
            "unknown machine",
            &own,
            group_id("tenant-a"),
            UNKNOWN_MACHINE.into(),
        ),
    ];
    let mut answers: BTreeMap<(&str, &str), Answer> = BTreeMap::new();
    let mut wrong = Vec::new();
    for s in &scenarios {
        let mut client = endpoint.client(&s.caller).await;
        for rpc in RPCS {
            let answer = call(&mut client, rpc, s).await;
            let want = expected(s.name, rpc);
            if answer.code != want {
                wrong.push(format!("{rpc} / {}: want {want:?}, got {answer:?}", s.name));
            }
            // What the request itself carried may be echoed; nothing else of bravo.
            let unechoed = answer.text.replace(&s.node, "").replace(&s.group, "");
            if let Some(secret) = BRAVO_SECRETS.iter().find(|x| unechoed.contains(*x)) {
                wrong.push(format!(
                    "{rpc} / {}: the answer names {secret:?}: {}",
                    s.name, answer.text
                ));
            }
            answers.insert((s.name, rpc), answer);
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));

    // Another tenant's group or node is answered as one that does not exist.
    let anonymous = |a: &Answer| {
        let mut text = a.text.clone();
        for (foreign, unknown) in [
            (group_id("tenant-b"), group_id("tenant-z")),
            (provider_id("bravo"), provider_id("zulu")),
            (FOREIGN_MACHINE.into(), UNKNOWN_MACHINE.into()),
        ] {
            text = text.replace(&foreign, &unknown);
        }
        (a.code, text)
    };
    for rpc in RPCS {
        for (foreign, unknown) in [
            ("another cluster's group", "unknown group"),
            ("another cluster's node", "unknown node"),
            ("another cluster's machine", "unknown machine"),
        ] {
            let (a, b) = (&answers[&(foreign, rpc)], &answers[&(unknown, rpc)]);
            assert_eq!(anonymous(a), anonymous(b), "{rpc}: {foreign} / {unknown}");
        }
    }

    // What the own Cluster's caller sees is its own, and all of it.
    let own_answer = |rpc| answers[&("own", rpc)].text.clone();
    assert_eq!(own_answer("NodeGroups"), group_id("tenant-a"));
    assert_eq!(
        own_answer("NodeGroupForNode"),
        group_id("tenant-a"),
        "bravo's Machine with alpha's provider ID neither hides nor takes alpha's node"
    );
    assert_eq!(own_answer("NodeGroupNodes"), provider_id("alpha"));
    assert_eq!(own_answer("GetAvailableGPUTypes"), "alpha-gpu");
    assert_eq!(own_answer("NodeGroupTargetSize"), "1");
    assert_eq!(
        own_answer("PricingPodPrice"),
        "1",
        "one core at alpha's price, not bravo's cheaper one"
    );
    assert_eq!(
        own_answer("PricingNodePrice"),
        "2",
        "two cores at alpha's price"
    );
    assert_eq!(
        answers[&("another cluster's node", "NodeGroupForNode")].text,
        ""
    );
    for rpc in [
        "NodeGroupIncreaseSize",
        "NodeGroupDeleteNodes",
        "NodeGroupDecreaseTargetSize",
    ] {
        assert!(
            own_answer(rpc).contains("could not reach the Kubernetes API server"),
            "{rpc} passed every check: {}",
            own_answer(rpc)
        );
    }
    for (scenario, cluster) in [
        ("cluster deleting", "tenant-d/delta"),
        ("cluster not synced", "tenant-n/november"),
        ("cluster not connected", "tenant-c/charlie"),
        ("unknown cluster", "tenant-x/xray"),
    ] {
        let text = &answers[&(scenario, "Refresh")].text;
        assert!(text.contains(cluster), "{scenario}: {text}");
    }
}
