//! Hostile and malformed input: every answer is an honest gRPC status with a precise message,
//! nothing changes in the API server, and the server keeps serving the next real client.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use k8s_pb::api::core::v1 as pb;
use kube::ResourceExt;
use ngo_service::proto::{self, ExternalGrpcNode, cloud_provider_client::CloudProviderClient};
use ngo_service::server::tls::TlsFiles;
use ngo_testbed::pki::{CertificateAuthority, IssuedCert};
use prost::Message as _;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Status};

type Client = CloudProviderClient<Channel>;

fn node(provider_id: &str, name: &str) -> ExternalGrpcNode {
    ExternalGrpcNode {
        provider_id: provider_id.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn hour(h: i64) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp {
        seconds: h * 3600,
        nanos: 0,
    })
}

/// The resourceVersion of every Cluster API object in the namespace and of its Nodes: equal
/// before and after means nothing was written.
async fn state(ns: &TestNs) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for ar in [machine_deployments(), machine_sets(), machines()] {
        for obj in ns.api(&ar).list(&Default::default()).await.unwrap() {
            out.insert(
                format!("{}/{}", ar.kind, obj.name_any()),
                obj.resource_version().unwrap_or_default(),
            );
        }
    }
    let nodes = kube::Api::<k8s_openapi::api::core::v1::Node>::all(ns.client.clone())
        .list(&Default::default())
        .await
        .unwrap();
    for n in nodes
        .items
        .iter()
        .filter(|n| n.name_any().starts_with(&ns.name))
    {
        out.insert(
            format!("Node/{}", n.name_any()),
            n.resource_version().unwrap_or_default(),
        );
    }
    out
}

#[track_caller]
fn assert_status<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, message: &str) {
    match result {
        Ok(v) => panic!("expected {code:?} {message:?}, got {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{}", s.message());
            assert_eq!(s.message(), message);
        }
    }
}

/// Every RPC that takes a node group id.
#[derive(Clone, Copy, Debug)]
enum ById {
    TargetSize,
    IncreaseSize,
    DeleteNodes,
    DecreaseTargetSize,
    Nodes,
    TemplateNodeInfo,
    GetOptions,
}

const BY_ID: [ById; 7] = [
    ById::TargetSize,
    ById::IncreaseSize,
    ById::DeleteNodes,
    ById::DecreaseTargetSize,
    ById::Nodes,
    ById::TemplateNodeInfo,
    ById::GetOptions,
];

/// Calls `rpc` for group `id` with an otherwise valid request (`member` is a node of the real
/// group, so only the id can be wrong).
async fn call_by_id(client: &Client, rpc: ById, id: &str, member: &str) -> Result<(), Status> {
    let mut c = client.clone();
    let id = id.to_string();
    match rpc {
        ById::TargetSize => c
            .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
            .await
            .map(drop),
        ById::IncreaseSize => c
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest { id, delta: 1 })
            .await
            .map(drop),
        ById::DeleteNodes => c
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id,
                nodes: vec![node(member, "")],
            })
            .await
            .map(drop),
        ById::DecreaseTargetSize => c
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id,
                delta: -1,
            })
            .await
            .map(drop),
        ById::Nodes => c
            .node_group_nodes(proto::NodeGroupNodesRequest { id })
            .await
            .map(drop),
        ById::TemplateNodeInfo => c
            .node_group_template_node_info(proto::NodeGroupTemplateNodeInfoRequest { id })
            .await
            .map(drop),
        ById::GetOptions => c
            .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
                id,
                defaults: Some(Default::default()),
            })
            .await
            .map(drop),
    }
}

#[tokio::test]
async fn empty_unknown_and_oversized_group_ids_are_refused_by_every_rpc_that_takes_one() {
    let ns = TestNs::new("hostile-ids").await;
    let pids = deployment_with_nodes(&ns, "md", 1, 5, 2).await;
    let (operator, client) = ns.operator().await;
    wait_groups(&client, 1).await;
    let before = state(&ns).await;
    let unknown = format!("MachineDeployment/{}/nope", ns.name);
    let huge = "x".repeat(1 << 20);
    let cases = [
        ("", Code::InvalidArgument, "request has an empty node group id".to_string()),
        (unknown.as_str(), Code::NotFound, format!("node group {unknown:?} not found")),
        (
            huge.as_str(),
            Code::InvalidArgument,
            "node group id is 1048576 bytes long; ids are <Kind>/<namespace>/<name>, at most 335 bytes".into(),
        ),
    ];
    for rpc in BY_ID {
        for (id, code, message) in &cases {
            let result = call_by_id(&client, rpc, id, &pids[0]).await;
            match result {
                Ok(()) => panic!("{rpc:?} with id of {} bytes succeeded", id.len()),
                Err(s) => {
                    assert_eq!(s.code(), *code, "{rpc:?}: {}", s.message());
                    assert_eq!(s.message(), message, "{rpc:?}");
                }
            }
        }
    }
    assert_eq!(state(&ns).await, before, "nothing was written");
    operator.shutdown().await.unwrap();
}

/// A request whose `id` (field 1, a string) is not UTF-8: prost refuses it while decoding.
#[derive(Clone, PartialEq, prost::Message)]
struct NonUtf8IdRequest {
    #[prost(bytes = "vec", tag = "1")]
    id: Vec<u8>,
}

#[tokio::test]
async fn an_undecodable_request_body_is_refused_and_the_server_keeps_serving() {
    let ns = TestNs::new("hostile-body").await;
    deployment_with_nodes(&ns, "md", 1, 5, 1).await;
    let (operator, client) = ns.operator().await;
    wait_groups(&client, 1).await;
    let channel = Channel::from_shared(format!(
        "http://{}",
        operator.grpc_address.expect("a TCP listener")
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut raw = tonic::client::Grpc::new(channel);
    raw.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/NodeGroupTargetSize",
    );
    let refused: Result<tonic::Response<proto::NodeGroupTargetSizeResponse>, Status> = raw
        .unary(
            tonic::Request::new(NonUtf8IdRequest {
                id: vec![0xff, 0xfe, 0xfd],
            }),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await;
    // tonic answers undecodable messages with INTERNAL, as grpc-go does.
    let status = refused.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{}", status.message());
    assert!(
        status
            .message()
            .contains("invalid string value: data is not UTF-8 encoded"),
        "{}",
        status.message()
    );
    assert_eq!(wait_groups(&client, 1).await.len(), 1, "still serving");
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn negative_zero_and_huge_deltas_are_refused() {
    let ns = TestNs::new("hostile-delta").await;
    deployment_with_nodes(&ns, "md", 1, 5, 2).await;
    // Replicas without machines: decreasing the target reaches the min check.
    ns.machine_deployment("ghost", 3, bounds(1, 5)).await;
    let (operator, mut client) = ns.operator().await;
    wait_groups(&client, 2).await;
    let md = format!("MachineDeployment/{}/md", ns.name);
    let ghost = format!("MachineDeployment/{}/ghost", ns.name);
    let before = state(&ns).await;

    for delta in [0, -1, i32::MIN] {
        let r = client
            .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
                id: md.clone(),
                delta,
            })
            .await;
        assert_status(
            r,
            Code::InvalidArgument,
            &format!("size increase must be positive, got delta {delta}"),
        );
    }
    let r = client
        .node_group_increase_size(proto::NodeGroupIncreaseSizeRequest {
            id: md.clone(),
            delta: i32::MAX,
        })
        .await;
    assert_status(
        r,
        Code::FailedPrecondition,
        &format!("node group {md}: size increase too large - desired:2147483649 max:5"),
    );

    for delta in [0, 1, i32::MAX] {
        let r = client
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id: md.clone(),
                delta,
            })
            .await;
        assert_status(
            r,
            Code::InvalidArgument,
            &format!("size decrease must be negative, got delta {delta}"),
        );
    }
    for delta in [-1, i32::MIN] {
        let r = client
            .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
                id: md.clone(),
                delta,
            })
            .await;
        assert_status(
            r,
            Code::FailedPrecondition,
            &format!(
                "node group {md}: attempt to delete existing nodes currentReplicas:2 delta:{delta} existingNodes: 2"
            ),
        );
    }
    let r = client
        .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
            id: ghost.clone(),
            delta: -3,
        })
        .await;
    assert_status(
        r,
        Code::FailedPrecondition,
        &format!("node group {ghost}: size decrease too large - desired:0 min:1"),
    );
    let r = client
        .node_group_decrease_target_size(proto::NodeGroupDecreaseTargetSizeRequest {
            id: ghost.clone(),
            delta: i32::MIN,
        })
        .await;
    assert_status(
        r,
        Code::FailedPrecondition,
        // cluster-autoscaler's clusterapi provider words it so too (existing nodes first).
        &format!(
            "node group {ghost}: attempt to delete existing nodes currentReplicas:3 delta:-2147483648 existingNodes: 0"
        ),
    );
    assert_eq!(state(&ns).await, before, "nothing was written");
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_nodes_refuses_nodes_it_cannot_attribute_to_the_group() {
    let ns = TestNs::new("hostile-del").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 2).await;
    let others = deployment_with_nodes(&ns, "other", 0, 5, 1).await;
    // Machines the operator does not serve: another namespace.
    let elsewhere = TestNs::new("hostile-del-else").await;
    deployment_with_nodes(&elsewhere, "md", 0, 5, 1).await;
    let (operator, mut client) = ns.operator().await;
    wait_groups(&client, 2).await;
    let id = format!("MachineDeployment/{}/md", ns.name);
    let other_id = format!("MachineDeployment/{}/other", ns.name);
    let before = state(&ns).await;
    let before_elsewhere = state(&elsewhere).await;

    let nobody = "no node group found for node";
    let cases: Vec<(Vec<ExternalGrpcNode>, Code, String)> = vec![
        (
            vec![node(&pids[0], ""), node("", "")],
            Code::InvalidArgument,
            "node 2 of 2 has neither providerID nor name".into(),
        ),
        (
            vec![node("aws:///us-east-1a/i-0123456789abcdef0", "ip-10-0-0-1")],
            Code::NotFound,
            format!("{nobody} \"aws:///us-east-1a/i-0123456789abcdef0\""),
        ),
        (
            vec![node(&others[0], "")],
            Code::FailedPrecondition,
            format!(
                "node {:?} doesn't belong to node group {id} (it belongs to {other_id})",
                others[0]
            ),
        ),
        (
            vec![node(
                &format!("pending-machine-{}_md-m0", elsewhere.name),
                "",
            )],
            Code::NotFound,
            format!("{nobody} \"pending-machine-{}_md-m0\"", elsewhere.name),
        ),
        (
            vec![node(&format!("failed-machine-{}_nope", ns.name), "")],
            Code::NotFound,
            format!("{nobody} \"failed-machine-{}_nope\"", ns.name),
        ),
        (
            vec![node(&format!("deleting-machine-{}_nope", ns.name), "")],
            Code::NotFound,
            format!("{nobody} \"deleting-machine-{}_nope\"", ns.name),
        ),
        // One bad node refuses the whole request before anything is written.
        (
            vec![
                node(&pids[0], ""),
                node(&format!("pending-machine-{}_nope", ns.name), ""),
            ],
            Code::NotFound,
            format!("{nobody} \"pending-machine-{}_nope\"", ns.name),
        ),
    ];
    for (nodes, code, message) in cases {
        let r = client
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id: id.clone(),
                nodes: nodes.clone(),
            })
            .await;
        match r {
            Ok(_) => panic!("DeleteNodes {nodes:?} succeeded"),
            Err(s) => {
                assert_eq!(s.code(), code, "{nodes:?}: {}", s.message());
                assert_eq!(s.message(), message, "{nodes:?}");
            }
        }
    }
    // A 1 MiB provider ID: the answer quotes it, cut to a size HTTP/2 peers accept.
    let huge = format!("aws:///{}", "i".repeat(1 << 20));
    let s = client
        .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: id.clone(),
            nodes: vec![node(&huge, "")],
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound, "{}", &s.message()[..64]);
    assert!(s.message().starts_with(&format!("{nobody} \"aws:///iii")));
    let total = nobody.len() + huge.len() + 3;
    let tail = format!("... ({} of {total} bytes cut)", total - 4096);
    assert!(s.message().ends_with(&tail), "{}", &s.message()[4000..]);
    assert!(s.message().len() < 4200, "{}", s.message().len());
    assert_eq!(state(&ns).await, before, "nothing was written");
    assert_eq!(state(&elsewhere).await, before_elsewhere);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_same_node_twice_in_one_delete_nodes_lowers_replicas_once() {
    let ns = TestNs::new("hostile-twice").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 3).await;
    let (operator, mut client) = ns.operator().await;
    wait_groups(&client, 1).await;
    client
        .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
            id: format!("MachineDeployment/{}/md", ns.name),
            nodes: vec![node(&pids[0], "a"), node(&pids[0], "a"), node(&pids[0], "")],
        })
        .await
        .unwrap();
    assert_eq!(ns.replicas(&machine_deployments(), "md").await, 2);
    assert!(
        ns.annotations(&machines(), "md-m0")
            .await
            .contains_key(DELETE_MACHINE)
    );
    for other in ["md-m1", "md-m2"] {
        assert!(
            !ns.annotations(&machines(), other)
                .await
                .contains_key(DELETE_MACHINE),
            "{other} is not marked"
        );
    }
    operator.shutdown().await.unwrap();
}

fn pod_requesting(cpu: &str, memory: &str) -> pb::Pod {
    let quantity = |v: &str| k8s_pb::apimachinery::pkg::api::resource::Quantity {
        string: Some(v.into()),
    };
    pb::Pod {
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                name: Some("app".into()),
                resources: Some(pb::ResourceRequirements {
                    requests: BTreeMap::from([
                        ("cpu".into(), quantity(cpu)),
                        ("memory".into(), quantity(memory)),
                    ]),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn pricing_refuses_garbage_empty_and_absurd_pods() {
    let ns = TestNs::new("hostile-pod").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    ns.policy(
        "prices",
        json!({"selector": {}, "pricing": {"nodeHourly": 0.19, "cpuCoreHourly": 0.04, "memoryGibHourly": 0.005}}),
    )
    .await
    .unwrap();
    let (operator, mut client) = ns.operator().await;
    wait_groups(&client, 1).await;
    let request = |pod: Vec<u8>, pod_bytes: Vec<u8>| proto::PricingPodPriceRequest {
        pod,
        pod_bytes,
        start_timestamp: hour(0),
        end_timestamp: hour(1),
        ..Default::default()
    };
    // The decoder is reached: a real pod has a price (2 * 0.04 + 4 * 0.005).
    let valid = pod_requesting("2", "4Gi").encode_to_vec();
    let price = eventually("the policy's prices", Duration::from_secs(20), || {
        let (mut c, r) = (client.clone(), request(Vec::new(), valid.clone()));
        async move { Some(c.pricing_pod_price(r).await.ok()?.into_inner().price) }
    })
    .await;
    assert!((price - 0.1).abs() < 1e-9, "{price}");

    let garbage = vec![0xff_u8; 64];
    let r = client
        .pricing_pod_price(request(Vec::new(), garbage.clone()))
        .await;
    assert_status(
        r,
        Code::InvalidArgument,
        "pod_bytes (64 bytes) is not a protobuf v1.Pod: failed to decode Protobuf message: invalid varint",
    );
    let r = client.pricing_pod_price(request(garbage, Vec::new())).await;
    assert_status(
        r,
        Code::InvalidArgument,
        "pod (64 bytes) is not a protobuf v1.Pod: failed to decode Protobuf message: invalid varint",
    );
    // 1 MiB: a length-delimited field 1 (metadata) claiming more bytes than follow.
    let mut oversized = vec![0x0a, 0xff, 0xff, 0xff, 0x7f];
    oversized.resize(1 << 20, 0x41);
    let r = client
        .pricing_pod_price(request(Vec::new(), oversized))
        .await;
    assert_status(
        r,
        Code::InvalidArgument,
        "pod_bytes (1048576 bytes) is not a protobuf v1.Pod: failed to decode Protobuf message: Pod.metadata: buffer underflow",
    );
    let r = client
        .pricing_pod_price(request(Vec::new(), Vec::new()))
        .await;
    assert_status(
        r,
        Code::InvalidArgument,
        "request has no pod (neither pod_bytes nor pod is set)",
    );
    // A negative request (the API server never admits one) would be a negative price.
    let pod = pod_requesting("-4", "4Gi").encode_to_vec();
    let r = client.pricing_pod_price(request(Vec::new(), pod)).await;
    assert_status(
        r,
        Code::InvalidArgument,
        "the pod's resource requests price at -0.14; requests must be finite, non-negative quantities",
    );
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn missing_fields_and_invalid_timestamps_are_refused() {
    let ns = TestNs::new("hostile-missing").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 1).await;
    ns.policy(
        "prices",
        json!({"selector": {}, "pricing": {"nodeHourly": 0.19, "cpuCoreHourly": 0.04, "memoryGibHourly": 0.005}}),
    )
    .await
    .unwrap();
    let (operator, mut client) = ns.operator().await;
    let id = wait_groups(&client, 1).await[0].id.clone();
    let member = node(&pids[0], "");
    let node_price = |start, end| proto::PricingNodePriceRequest {
        node: Some(member.clone()),
        start_timestamp: start,
        end_timestamp: end,
        ..Default::default()
    };
    // The node's price is served at all (2 hours at 0.19).
    let price = eventually("the node's price", Duration::from_secs(20), || {
        let (mut c, r) = (client.clone(), node_price(hour(0), hour(2)));
        async move { Some(c.pricing_node_price(r).await.ok()?.into_inner().price) }
    })
    .await;
    assert!((price - 0.38).abs() < 1e-9, "{price}");

    let r = client
        .node_group_for_node(proto::NodeGroupForNodeRequest { node: None })
        .await;
    assert_status(r, Code::InvalidArgument, "request has no node");
    let r = client
        .pricing_node_price(proto::PricingNodePriceRequest {
            node: None,
            start_timestamp: hour(0),
            end_timestamp: hour(1),
            ..Default::default()
        })
        .await;
    assert_status(r, Code::InvalidArgument, "request has no node");
    let r = client
        .node_group_get_options(proto::NodeGroupAutoscalingOptionsRequest {
            id: id.clone(),
            defaults: None,
        })
        .await;
    assert_status(r, Code::InvalidArgument, "request has no defaults");

    let at = |seconds, nanos| Some(prost_types::Timestamp { seconds, nanos });
    let required = |which: &str| {
        format!(
            "{which} is required (or, from cluster-autoscaler 1.34 and older, its legacy field)"
        )
    };
    let invalid = |which: &str, seconds: i64, nanos: i32| {
        format!(
            "{which} is out of range: seconds {seconds}, nanos {nanos} (seconds must lie in years 1 to 9999, nanos in 0..=999999999)"
        )
    };
    let cases = [
        (None, hour(1), required("startTimestamp")),
        (hour(0), None, required("endTimestamp")),
        (None, None, required("startTimestamp")),
        (
            hour(2),
            hour(1),
            "endTimestamp is before startTimestamp".to_string(),
        ),
        (
            at(i64::MIN, 0),
            at(i64::MAX, 0),
            invalid("startTimestamp", i64::MIN, 0),
        ),
        (
            hour(0),
            at(i64::MAX, 0),
            invalid("endTimestamp", i64::MAX, 0),
        ),
        (at(0, -1), hour(1), invalid("startTimestamp", 0, -1)),
        (
            hour(0),
            at(0, i32::MAX),
            invalid("endTimestamp", 0, i32::MAX),
        ),
        (
            at(0, i32::MIN),
            at(0, i32::MAX),
            invalid("startTimestamp", 0, i32::MIN),
        ),
    ];
    let pod = pod_requesting("1", "1Gi").encode_to_vec();
    for (start, end, message) in cases {
        let r = client.pricing_node_price(node_price(start, end)).await;
        assert_status(r, Code::InvalidArgument, &message);
        let r = client
            .pricing_pod_price(proto::PricingPodPriceRequest {
                pod_bytes: pod.clone(),
                start_timestamp: start,
                end_timestamp: end,
                ..Default::default()
            })
            .await;
        assert_status(r, Code::InvalidArgument, &message);
    }
    operator.shutdown().await.unwrap();
}

/// Writes `bytes` to a fresh connection and waits until the server closes it; returns
/// whether it did within 5 s.
async fn send_garbage(address: SocketAddr, bytes: &[u8]) -> bool {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    // The server may close before reading everything: a failed write is fine.
    let _ = stream.write_all(bytes).await;
    let mut sink = vec![0; 64 * 1024];
    let closed = async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .is_ok()
}

fn garbage_payloads() -> Vec<(&'static str, Vec<u8>)> {
    let mut noise = vec![0u8; 1 << 20];
    for (i, b) in noise.iter_mut().enumerate() {
        *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
    }
    vec![
        (
            "HTTP/1.1 request",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        (
            "HTTP/2 preface then a garbage frame",
            [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(), &[0xff; 64]].concat(),
        ),
        ("1 MiB of noise", noise),
    ]
}

#[tokio::test]
async fn garbage_on_the_plaintext_port_is_dropped_and_the_server_keeps_serving() {
    let ns = TestNs::new("hostile-raw").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let (operator, client) = ns.operator().await;
    wait_groups(&client, 1).await;
    // Half an HTTP/2 preface is a slow client, not garbage: it may wait, beside the others.
    let mut slow = tokio::net::TcpStream::connect(operator.grpc_address.expect("a TCP listener"))
        .await
        .unwrap();
    slow.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    for (what, bytes) in garbage_payloads() {
        assert!(
            send_garbage(operator.grpc_address.expect("a TCP listener"), &bytes).await,
            "the server closes a connection that sent {what}"
        );
        let fresh = Channel::from_shared(format!(
            "http://{}",
            operator.grpc_address.expect("a TCP listener")
        ))
        .unwrap()
        .connect()
        .await
        .unwrap();
        let groups = CloudProviderClient::new(fresh)
            .node_groups(proto::NodeGroupsRequest {})
            .await
            .unwrap_or_else(|e| panic!("after {what}: {e}"));
        assert_eq!(groups.into_inner().node_groups.len(), 1, "after {what}");
    }
    drop(slow);
    operator.shutdown().await.unwrap();
}

struct Mtls {
    ca: CertificateAuthority,
    client: IssuedCert,
    files: TlsFiles,
    _dir: tempfile::TempDir,
}

fn mtls() -> Mtls {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::new("ngo-hostile-ca").unwrap();
    let server = ca
        .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
        .unwrap();
    let client = ca.issue("cluster-autoscaler", &[], None).unwrap();
    let (cert, key) = server.write(dir.path(), "server").unwrap();
    let client_ca = dir.path().join("client-ca.crt");
    ca.write_cert(&client_ca).unwrap();
    Mtls {
        ca,
        client,
        files: TlsFiles {
            cert,
            key,
            client_ca,
        },
        _dir: dir,
    }
}

/// NodeGroups over a new mTLS connection.
async fn mtls_groups(address: SocketAddr, tls: &Mtls) -> Result<usize, String> {
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca.cert_pem))
        .identity(Identity::from_pem(
            &tls.client.cert_pem,
            &tls.client.key_pem,
        ))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(config)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let groups = CloudProviderClient::new(channel)
        .node_groups(proto::NodeGroupsRequest {})
        .await
        .map_err(|e| format!("rpc: {e}"))?;
    Ok(groups.into_inner().node_groups.len())
}

async fn mtls_operator(ns: &TestNs, tls: &Mtls) -> nodegroup_operator::runtime::Running {
    let (operator, _) = ns
        .operator_with(
            shared().operator_kubeconfig.clone(),
            Some(tls.files.clone()),
        )
        .await;
    let address = operator.grpc_address.expect("a TCP listener");
    eventually("served over mTLS", Duration::from_secs(20), || async move {
        mtls_groups(address, tls).await.ok().filter(|n| *n == 1)
    })
    .await;
    operator
}

#[tokio::test]
async fn garbage_on_the_mtls_port_is_dropped_and_the_server_keeps_serving() {
    let ns = TestNs::new("hostile-tls").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let tls = mtls();
    let operator = mtls_operator(&ns, &tls).await;
    let mut payloads = garbage_payloads();
    // A TLS record header announcing a ClientHello, then noise.
    payloads.push((
        "a broken ClientHello",
        [[0x16, 0x03, 0x01, 0x00, 0x40, 0x01].as_slice(), &[0xff; 64]].concat(),
    ));
    for (what, bytes) in payloads {
        assert!(
            send_garbage(operator.grpc_address.expect("a TCP listener"), &bytes).await,
            "the server closes a connection that sent {what}"
        );
        assert_eq!(
            mtls_groups(operator.grpc_address.expect("a TCP listener"), &tls).await,
            Ok(1),
            "after {what}"
        );
    }
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn connections_that_never_send_a_client_hello_do_not_starve_real_clients() {
    let ns = TestNs::new("hostile-halfopen").await;
    ns.machine_deployment("md", 1, bounds(0, 3)).await;
    let tls = mtls();
    let operator = mtls_operator(&ns, &tls).await;
    let mut idle = Vec::new();
    for _ in 0..256 {
        idle.push(
            tokio::net::TcpStream::connect(operator.grpc_address.expect("a TCP listener"))
                .await
                .unwrap(),
        );
    }
    let start = Instant::now();
    let served = tokio::time::timeout(
        Duration::from_secs(1),
        mtls_groups(operator.grpc_address.expect("a TCP listener"), &tls),
    )
    .await;
    let took = start.elapsed();
    eprintln!(
        "a real client was served in {took:?} beside {} idle connections",
        idle.len()
    );
    assert_eq!(
        served,
        Ok(Ok(1)),
        "a real client must be served within 1 s beside {} connections that never send a ClientHello",
        idle.len()
    );
    drop(idle);
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn requests_above_the_message_size_limit_are_refused_and_the_server_keeps_serving() {
    let ns = TestNs::new("hostile-size").await;
    let pids = deployment_with_nodes(&ns, "md", 0, 5, 1).await;
    let (operator, mut client) = ns.operator().await;
    wait_groups(&client, 1).await;
    let before = state(&ns).await;
    let id = format!("MachineDeployment/{}/md", ns.name);
    let five_mib = 5 << 20;
    let too_large = |status: Status| {
        assert_eq!(status.code(), Code::OutOfRange, "{}", status.message());
        assert!(
            status
                .message()
                .starts_with("Error, decoded message length too large: found ")
                && status.message().ends_with("the limit is: 4194304 bytes"),
            "{}",
            status.message()
        );
    };
    too_large(
        client
            .node_group_target_size(proto::NodeGroupTargetSizeRequest {
                id: "x".repeat(five_mib),
            })
            .await
            .unwrap_err(),
    );
    too_large(
        client
            .node_group_delete_nodes(proto::NodeGroupDeleteNodesRequest {
                id: id.clone(),
                nodes: vec![node(&pids[0], &"n".repeat(five_mib))],
            })
            .await
            .unwrap_err(),
    );
    too_large(
        client
            .pricing_pod_price(proto::PricingPodPriceRequest {
                pod_bytes: vec![0; five_mib],
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    // The same connection keeps serving.
    let target = client
        .node_group_target_size(proto::NodeGroupTargetSizeRequest { id })
        .await
        .unwrap()
        .into_inner()
        .target_size;
    assert_eq!(target, 1);
    assert_eq!(state(&ns).await, before, "nothing was written");
    operator.shutdown().await.unwrap();
}
