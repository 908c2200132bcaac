//! NodePools on Alibaba Cloud Auto Scaling, end to end: one sandbox per test binary (control
//! plane, Cluster API, kwok), and per test a namespace with the `nodegroup-operator` binary,
//! an ESS/ECS emulator whose instances join the sandbox as kwok Nodes only with the
//! bootstrap token the operator minted into the scaling configuration's user data, and
//! (where the autoscaler decides) the real cluster-autoscaler 1.36.1 over externalgrpc.
//! Assertions are on what users see: NodePool spec and status, the scaling group's
//! instances, activities and desired capacity, Nodes, Pods and Events.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::sandbox;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use ngo_api::NodePool;
use ngo_sandbox::world::{POOL_LABEL as POOL, TestWorld};
use ngo_testbed::alicloud::{
    AccessKey, AliCloudEmulator, AliCloudOptions, FaultAction, InstanceState, ScalingGroupSpec,
};
use ngo_testbed::proxy::LatencyProxy;
use ngo_testbed::workload;
use serde_json::{Value, json};

/// 4 vCPUs, 16 GiB in the emulator's catalogue (listed past its first 100 types).
const INSTANCE_TYPE: &str = "ecs.g6.xlarge";
const REGION: &str = "cn-hangzhou";
const KEY_ID: &str = "LTAI5tE2eSandbox";
const KEY_SECRET: &str = "e2e-access-key-secret";
/// A kubeadm join script, as ACK-style node pools write theirs.
const USER_DATA: &str = "#!/bin/bash\n\
KUBELET_EXTRA_ARGS=\"--cloud-provider=external --provider-id=${REGION_ID}.${INSTANCE_ID} --node-labels={{.NodeLabels}}\"\n\
kubeadm join --discovery-token-unsafe-skip-ca-verification --token {{.BootstrapTokenID}}.{{.BootstrapTokenSecret}} {{.APIServerEndpoint}}\n";

/// One test's world: a namespace with a Cluster, the operator binary, an ESS emulator
/// with scaling groups whose instances join the sandbox, and the credentials Secret.
struct World {
    base: TestWorld,
    ess: AliCloudEmulator,
}

ngo_sandbox::deref_to_test_world!(World);

impl World {
    async fn new(prefix: &str, groups: &[&str]) -> Self {
        Self::with(prefix, groups, |_| {}).await
    }

    async fn with(prefix: &str, groups: &[&str], tweak: impl FnOnce(&mut AliCloudOptions)) -> Self {
        Self::with_operator_args(prefix, groups, &[], tweak).await
    }

    /// As [`World::with`], the operator started with `args` too.
    async fn with_operator_args(
        prefix: &str,
        groups: &[&str],
        args: &[String],
        tweak: impl FnOnce(&mut AliCloudOptions),
    ) -> Self {
        let binary = PathBuf::from(env!("CARGO_BIN_EXE_nodegroup-operator"));
        let base = TestWorld::start(sandbox(), prefix, &binary, |operator| {
            operator
                .extra_args
                .push("--node-pool-interval-secs=2".into());
            operator.extra_args.extend(args.iter().cloned());
        })
        .await;
        let mut options = AliCloudOptions {
            region: REGION.into(),
            access_keys: vec![AccessKey::new(KEY_ID, KEY_SECRET)],
            groups: groups
                .iter()
                .map(|g| {
                    let mut spec = ScalingGroupSpec::new(g, INSTANCE_TYPE);
                    spec.zones = vec![format!("{REGION}-k")];
                    spec
                })
                .collect(),
            activity_duration: Duration::from_millis(800),
            cluster: Some(base.client.clone()),
            // Instance ids and private IPs unique across the tests' emulators, as a cloud's
            // are: Nodes of all tests share the sandbox.
            first_id: 0x10_0000 + u64::from(rand::random::<u32>() % 4_000) * 0x1000,
            ..Default::default()
        };
        tweak(&mut options);
        let ess = AliCloudEmulator::start(options)
            .await
            .expect("ESS emulator");
        let world = Self { base, ess };
        world.secret("alicloud", KEY_ID, KEY_SECRET).await;
        world.log("namespace, Cluster, operator and ESS emulator ready");
        world
    }

    async fn secret(&self, name: &str, id: &str, secret: &str) {
        self.base
            .secret(
                name,
                &[("access-key-id", id), ("access-key-secret", secret)],
            )
            .await;
    }

    /// A NodePool `name` on scaling group `group` whose Nodes carry `POOL=<ns>-<name>`,
    /// with `extra` merged into its `aliCloud` block.
    async fn pool(&self, name: &str, group: &str, replicas: i32, max: i32, extra: Value) {
        let url = self.ess.url();
        let mut ali = json!({
            "credentialsSecretRef": {"name": "alicloud"},
            "regionId": REGION,
            "scalingGroupId": group,
            "endpoints": {"ess": url, "ecs": url, "vpc": url, "sts": url, "metadata": url},
            "userData": USER_DATA,
            "apiServerEndpoint": "127.0.0.1:6443",
        });
        if let (Some(a), Value::Object(e)) = (ali.as_object_mut(), extra) {
            a.extend(e);
        }
        let pool: NodePool = serde_json::from_value(json!({
            "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
            "kind": "NodePool",
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {
                "replicas": replicas,
                "minSize": 0,
                "maxSize": max,
                "clusterName": "c1",
                "template": {"labels": {POOL: self.label(name)}},
                "aliCloud": ali,
            },
        }))
        .expect("NodePool");
        self.pools()
            .create(&PostParams::default(), &pool)
            .await
            .unwrap_or_else(|e| panic!("creating NodePool {name}: {e}"));
        self.log(&format!(
            "NodePool {name} on {group} ({replicas} of max {max})"
        ));
    }

    /// Waits until pool `name`'s condition `type_` is True with `reason`; its message.
    async fn wait_condition(&self, name: &str, type_: &str, reason: &str) -> String {
        self.wait(&format!("{name}: {type_} {reason}"), || async move {
            let p = self.get_pool(name).await;
            match TestWorld::condition(&p, type_) {
                Some((s, r, m)) if s == "True" && r == reason => Ok(m),
                other => Err(format!("{other:?}")),
            }
        })
        .await
    }

    /// Instances of `group` not being removed.
    fn instances(&self, group: &str) -> Vec<String> {
        self.ess
            .instances(group)
            .iter()
            .filter(|i| i.state != InstanceState::Removing)
            .map(|i| i.id.clone())
            .collect()
    }

    fn calls(&self, action: &str) -> usize {
        self.ess
            .requests_of(action)
            .iter()
            .filter(|r| r.status == Some(200))
            .count()
    }

    /// Waits until pool `name` on `group` reports `n` Ready of `n` and the group has `n`
    /// instances.
    async fn wait_pool_ready(&self, name: &str, group: &str, n: usize) -> NodePool {
        self.base
            .wait_pool_ready(name, n, || self.instances(group))
            .await
    }
}

/// Pending pods scale an ESS group up from zero through cluster-autoscaler (the template
/// comes from the scaling configuration's instance type); instances boot with the token the
/// operator wrote into the configuration's user data, join as `<region>.<instance-id>`,
/// and run the pods; removing the load removes exactly the idle instance from the group.
/// `examples/nodepool-alicloud.yaml` as users apply it, with only what the sandbox needs
/// changed: the namespace, the cluster name, a label the test's pods select, and the endpoints
/// (the emulator's, which serves the example's scaling group); its Secret under its own name
/// with the emulator's AccessKey. cluster-autoscaler scales the pool up from zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_node_pool_scales_up_from_zero() {
    let example = crate::example("nodepool-alicloud.yaml");
    let group = example["NodePool"]["spec"]["aliCloud"]["scalingGroupId"]
        .as_str()
        .expect("scalingGroupId")
        .to_string();
    let mut w = World::new("ali-example", &[group.as_str()]).await;
    let secret = &example["Secret"];
    let secret_name = secret["metadata"]["name"].as_str().expect("Secret name");
    for key in ["access-key-id", "access-key-secret"] {
        assert!(secret["stringData"][key].is_string(), "{key} in {secret}");
    }
    w.secret(secret_name, KEY_ID, KEY_SECRET).await;
    let mut pool = example["NodePool"].clone();
    pool["metadata"]["namespace"] = json!(w.ns());
    pool["spec"]["clusterName"] = json!("c1");
    pool["spec"]["template"]["labels"][POOL] = json!(w.label("example"));
    let url = w.ess.url();
    pool["spec"]["aliCloud"]["endpoints"] =
        json!({"ess": url, "ecs": url, "vpc": url, "sts": url, "metadata": url});
    let pool: NodePool = serde_json::from_value(pool).expect("the example is a NodePool");
    let name = pool.name_any();
    w.pools()
        .create(&PostParams::default(), &pool)
        .await
        .unwrap_or_else(|e| panic!("applying the example: {e}"));
    let options = w.cluster.externalgrpc_autoscaler().expect("cloud-config");
    w.cluster
        .start_autoscaler(&options)
        .unwrap_or_else(|e| panic!("starting cluster-autoscaler: {e}"));
    w.app("web", 2, "example").await;
    w.wait_pool_ready(&name, &group, 2).await;
    w.wait_nodes_running("web", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_scale_a_scaling_group_from_zero_and_the_idle_instance_goes() {
    let mut w = World::new("ali-up", &["asg-workers"]).await;
    w.pool("workers", "asg-workers", 0, 3, json!({})).await;
    let machine_type = w
        .wait(
            "the instance type read into the pool's machine type",
            || async {
                let pool = w.get_pool("workers").await;
                match pool.status.and_then(|s| s.machine_type) {
                    Some(t) if t.capacity.get("cpu").map(String::as_str) == Some("4") => Ok(t),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    assert_eq!(machine_type.name, INSTANCE_TYPE);
    assert_eq!(
        machine_type.capacity["memory"],
        (16u64 << 30).to_string(),
        "16 GiB in bytes"
    );
    assert_eq!(machine_type.labels["topology.kubernetes.io/region"], REGION);

    let options = w.cluster.externalgrpc_autoscaler().expect("cloud-config");
    w.cluster
        .start_autoscaler(&options)
        .unwrap_or_else(|e| panic!("starting cluster-autoscaler: {e}"));
    w.log("cluster-autoscaler started");
    w.app("web", 2, "workers").await;

    let pool = w.wait_pool_ready("workers", "asg-workers", 2).await;
    let running = w.wait_nodes_running("web", 2).await;
    let nodes = w.ready_nodes("workers").await;
    assert_eq!(
        running,
        nodes.iter().map(|n| n.name_any()).collect::<Vec<_>>()
    );
    let instances = w.instances("asg-workers");
    for node in &nodes {
        let pid = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let id = pid
            .strip_prefix(&format!("{REGION}."))
            .unwrap_or_else(|| panic!("providerID {pid} is <region>.<instance-id>"));
        assert!(instances.iter().any(|i| i == id), "{id} in {instances:?}");
        assert_eq!(
            node.labels()
                .get("autoscaling.nodegroup.dev/node-pool")
                .map(String::as_str),
            Some(format!("{}.workers", w.ns()).as_str()),
            "the pool label from the rendered user data"
        );
    }
    let recorded = pool.status.clone().unwrap_or_default().instances;
    assert_eq!(recorded.len(), 2);
    assert!(
        recorded
            .iter()
            .all(|i| i.node.is_some() && i.id.is_some() && !i.request.starts_with("adopted-")),
        "every instance traced to the request that made it: {recorded:?}"
    );
    let scale_outs = w.calls("ScaleWithAdjustment");
    let activities = w.ess.activities("asg-workers");
    assert_eq!(
        activities.iter().map(|a| a.created.len()).sum::<usize>(),
        2,
        "exactly two instances launched: {activities:?}"
    );
    assert!((1..=2).contains(&scale_outs), "{scale_outs} scale-outs");
    assert!(
        w.ess
            .user_data("asg-workers")
            .is_some_and(|u| u.contains("kubeadm join") && !u.contains("{{")),
        "the rendered user data is in the scaling configuration"
    );
    assert_eq!(
        w.ess.group("asg-workers").expect("group").desired_capacity,
        Some(2)
    );

    // One pod goes: cluster-autoscaler removes exactly the instance whose node is idle.
    workload::scale(&w.client, w.ns(), "web", 1)
        .await
        .expect("scale app");
    let busy = w.wait_nodes_running("web", 1).await;
    w.wait_pool_ready("workers", "asg-workers", 1).await;
    w.wait("the idle node gone", || async {
        let left: Vec<String> = w
            .ready_nodes("workers")
            .await
            .iter()
            .map(|n| n.name_any())
            .collect();
        if left == busy {
            Ok(())
        } else {
            Err(format!("{left:?} (busy: {busy:?})"))
        }
    })
    .await;
    let removals = w.ess.requests_of("RemoveInstances");
    let removed: Vec<&String> = removals
        .iter()
        .filter(|r| r.status == Some(200))
        .flat_map(|r| {
            r.params
                .iter()
                .filter(|(k, _)| k.starts_with("InstanceId."))
        })
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        removed.len(),
        1,
        "exactly one instance removed: {removals:?}"
    );
    assert!(
        !instances.is_empty() && !w.instances("asg-workers").contains(removed[0]),
        "the removed instance left the group"
    );
    assert_eq!(
        w.ess.group("asg-workers").expect("group").desired_capacity,
        Some(1),
        "the removal lowered the desired capacity"
    );
    assert_eq!(
        w.ess
            .activities("asg-workers")
            .iter()
            .map(|a| a.created.len())
            .sum::<usize>(),
        2,
        "no instance launched on the way down"
    );
}

/// Throttling (`Throttling.User` injected on every kind of call, then the gateway's own
/// flow control) and a scale-out whose answer is lost: the pool still reaches its size with
/// exactly as many instances as wanted, every one traced to its request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_and_a_lost_answer_are_survived_without_a_second_scale_out() {
    let w = World::new("ali-throttle", &["asg-busy"]).await;
    w.ess.inject(None, 6, FaultAction::throttling());
    w.ess
        .inject(Some("ScaleWithAdjustment"), 2, FaultAction::throttling());
    w.ess
        .inject(Some("ScaleWithAdjustment"), 1, FaultAction::LoseAnswer);
    w.ess.set_rate_limit(Some(4));
    w.pool("busy", "asg-busy", 3, 5, json!({})).await;

    let pool = w.wait_pool_ready("busy", "asg-busy", 3).await;
    let throttled = w
        .ess
        .requests()
        .iter()
        .filter(|r| r.code.as_deref() == Some("Throttling.User"))
        .count();
    assert!(throttled >= 8, "{throttled} throttled requests");
    let activities = w.ess.activities("asg-busy");
    assert_eq!(
        activities.len(),
        1,
        "one scale-out, the lost answer not repeated into a second: {activities:?}"
    );
    assert_eq!(activities[0].created.len(), 3);
    let instances = pool.status.unwrap_or_default().instances;
    let mut requests: Vec<&str> = instances.iter().map(|i| i.request.as_str()).collect();
    requests.sort();
    requests.dedup();
    assert_eq!(requests.len(), 3, "{instances:?}");
    assert!(requests.iter().all(|r| !r.starts_with("adopted-")));
    assert_eq!(
        w.ess.group("asg-busy").expect("group").desired_capacity,
        Some(3)
    );
}

/// A wrong AccessKey secret and a Secret without the key id are each reported on their pool
/// (condition and Event) while a good pool next to them scales; the wrong key, once fixed
/// in its Secret, is picked up without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_reported_and_a_fixed_secret_is_picked_up() {
    let w = World::new("ali-bad", &["asg-good", "asg-wrong", "asg-partial"]).await;
    w.secret("wrong", KEY_ID, "not-the-secret").await;
    let partial: Secret = serde_json::from_value(json!({
        "metadata": {"name": "partial", "namespace": w.ns()},
        "stringData": {"access-key-secret": KEY_SECRET},
    }))
    .expect("secret");
    w.secrets()
        .create(&PostParams::default(), &partial)
        .await
        .expect("create secret");
    w.pool(
        "wrong",
        "asg-wrong",
        1,
        2,
        json!({"credentialsSecretRef": {"name": "wrong"}}),
    )
    .await;
    w.pool(
        "partial",
        "asg-partial",
        1,
        2,
        json!({"credentialsSecretRef": {"name": "partial"}}),
    )
    .await;
    w.pool("good", "asg-good", 1, 2, json!({})).await;

    w.wait_pool_ready("good", "asg-good", 1).await;
    for (pool, condition, reason, names) in [
        (
            "wrong",
            "BackendUnavailable",
            "Unauthorized",
            "SignatureDoesNotMatch",
        ),
        (
            "partial",
            "InvalidSpec",
            "CredentialsMissing",
            "access-key-id",
        ),
    ] {
        let w = &w;
        let message = w.wait_condition(pool, condition, reason).await;
        assert!(message.contains(names), "{pool}: {message}");
        w.wait(&format!("an Event on {pool}"), || async move {
            let events = w.events(pool).await;
            if events
                .iter()
                .any(|(r, _)| r == reason || r == "BackendUnavailable")
            {
                Ok(())
            } else {
                Err(format!("{events:?}"))
            }
        })
        .await;
        assert_eq!(
            TestWorld::condition(&w.get_pool(pool).await, "Ready").map(|r| r.0),
            Some("False".to_string()),
            "{pool} is not Ready"
        );
    }
    assert!(w.ess.instances("asg-wrong").is_empty() && w.ess.instances("asg-partial").is_empty());

    // The right secret written into the Secret: the next pass uses it.
    w.secrets()
        .patch(
            "wrong",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"access-key-secret": KEY_SECRET}})),
        )
        .await
        .expect("fix secret");
    w.log("Secret wrong fixed");
    w.wait_pool_ready("wrong", "asg-wrong", 1).await;
    let available = TestWorld::condition(&w.get_pool("wrong").await, "BackendUnavailable");
    assert_eq!(available.map(|c| c.0), Some("False".to_string()));

    // Scaling the good pool down to zero removes its instance and lowers the group.
    w.set_replicas("good", 0).await;
    w.wait("the good pool's instance removed", || async {
        let instances = w.ess.instances("asg-good");
        if instances.is_empty() {
            Ok(())
        } else {
            Err(format!("{instances:?}"))
        }
    })
    .await;
    assert_eq!(
        w.ess.group("asg-good").expect("group").desired_capacity,
        Some(0)
    );
}

/// Every ESS call of `ess` so far was signed by a temporary key (`STS.…`) with its token.
fn signed_by_temporary_keys(ess: &AliCloudEmulator) -> Result<usize, String> {
    let calls: Vec<_> = ess
        .requests()
        .into_iter()
        .filter(|r| r.action.starts_with("Describe") || r.action == "ScaleWithAdjustment")
        .collect();
    match calls.iter().find(|r| {
        !r.params
            .get("AccessKeyId")
            .is_some_and(|k| k.starts_with("STS."))
    }) {
        Some(r) => Err(format!(
            "{} signed by {:?}",
            r.action,
            r.params.get("AccessKeyId")
        )),
        None => Ok(calls.len()),
    }
}

/// A pool without a Secret (`ECSRAMRole`) signs with the RAM role's temporary credentials
/// from the metadata server, renews them before they expire (the emulator refuses expired
/// ones, so a late renewal would show as `InvalidSecurityToken.Expired`); a pool naming a
/// role the instance does not have, and one whose metadata server does not answer, are
/// reported (condition, Event, `nodegroup_nodepool_backend_available` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecs_ram_role_credentials_come_from_the_metadata_server_and_are_renewed_in_time() {
    let mut w = World::with(
        "ali-ecsrole",
        &["asg-role", "asg-norole", "asg-nometa"],
        |o| {
            o.ram_role = Some("ngo-node-role".into());
            o.temporary_key_lifetime = Duration::from_secs(6);
        },
    )
    .await;
    let role = json!({"credentialsMode": "ECSRAMRole", "credentialsSecretRef": null});
    w.pool("role", "asg-role", 1, 2, role.clone()).await;
    let mut wrong = role.clone();
    wrong["ramRoleName"] = json!("not-attached");
    w.pool("norole", "asg-norole", 1, 2, wrong).await;
    // Off ECS: nothing answers at the metadata address.
    let mut unreachable = role;
    unreachable["endpoints"]["metadata"] = json!("http://127.0.0.1:9");
    w.pool("nometa", "asg-nometa", 1, 2, unreachable).await;

    w.wait_pool_ready("role", "asg-role", 1).await;
    let message = w
        .wait_condition("norole", "BackendUnavailable", "Unauthorized")
        .await;
    assert!(message.contains("not-attached"), "{message}");
    w.wait("a BackendUnavailable Event on norole", || async {
        let events = w.events("norole").await;
        if events.iter().any(|(r, _)| r == "BackendUnavailable") {
            Ok(())
        } else {
            Err(format!("{events:?}"))
        }
    })
    .await;
    assert!(w.ess.instances("asg-norole").is_empty());
    let message = w
        .wait_condition("nometa", "BackendUnavailable", "Unavailable")
        .await;
    assert!(message.contains("127.0.0.1:9"), "{message}");
    let metrics = w
        .cluster
        .operator()
        .expect("operator running")
        .metrics()
        .expect("metrics");
    for (pool, up) in [("role", 1), ("norole", 0), ("nometa", 0)] {
        let line = format!(
            "nodegroup_nodepool_backend_available{{node_pool=\"{}/{pool}\"}} {up}",
            w.ns()
        );
        assert!(metrics.contains(&line), "{line} in metrics");
    }

    // Three lifetimes of 6 s: the key is renewed at least twice, never used expired.
    w.wait("the metadata credentials renewed twice", || async {
        let keys = w.ess.temporary_keys();
        if keys.len() >= 3 {
            Ok(())
        } else {
            Err(format!("{} temporary keys", keys.len()))
        }
    })
    .await;
    let metadata = w.ess.requests_of("Metadata");
    assert!(
        metadata.iter().any(|r| r.params["path"] == "/latest/meta-data/ram/security-credentials/ngo-node-role"),
        "{metadata:?}"
    );
    let expired: Vec<_> = w
        .ess
        .requests()
        .into_iter()
        .filter(|r| r.code.as_deref() == Some("InvalidSecurityToken.Expired"))
        .collect();
    assert!(
        expired.is_empty(),
        "a key was used after it expired: {expired:?}"
    );
    let signed = signed_by_temporary_keys(&w.ess).unwrap_or_else(|e| panic!("{e}"));
    assert!(signed > 0);
    let available = TestWorld::condition(&w.get_pool("role").await, "BackendUnavailable");
    assert_eq!(available.map(|c| c.0), Some("False".to_string()));
}

/// An `RRSA` pool assumes its RAM role with the service-account token file of the operator's
/// configuration (`--alicloud-oidc-token-file`; `AssumeRoleWithOIDC`), signs with the
/// temporary key, and reads the file again on every renewal: a token the issuer no longer
/// accepts is reported once the key must be renewed, and a good token written back is
/// picked up without a restart. A Secret missing the provider ARN is an `InvalidSpec` naming
/// the key. A Secret naming a file of the operator's pod (`oidc-token-file-path`, a canary
/// here) is refused, and an STS endpoint the operator does not allow too: the canary's
/// path and content reach no condition and no request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rrsa_pool_assumes_its_role_with_the_token_file_and_rereads_it() {
    const ROLE: &str = "acs:ram::1234567890:role/nodegroup-operator";
    const PROVIDER: &str = "acs:ram::1234567890:oidc-provider/ack-rrsa-c1";
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJuZ28ifQ.c2lnbmF0dXJl";
    const CANARY: &str = "canary-7f3a9c-operator-secret";
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).expect("token file");
    let canary_file = dir.path().join("operator-only");
    std::fs::write(&canary_file, CANARY).expect("canary file");
    let args = [format!(
        "--alicloud-oidc-token-file={}",
        token_file.display()
    )];
    let w = World::with_operator_args(
        "ali-rrsa",
        &["asg-rrsa", "asg-halfrrsa", "asg-pathrrsa"],
        &args,
        |o| {
            o.oidc_roles = vec![ngo_testbed::alicloud::OidcRole {
                role_arn: ROLE.into(),
                oidc_provider_arn: PROVIDER.into(),
                token: TOKEN.into(),
            }];
            o.temporary_key_lifetime = Duration::from_secs(6);
        },
    )
    .await;
    for (name, data) in [
        (
            "rrsa",
            json!({"role-arn": ROLE, "oidc-provider-arn": PROVIDER, "session-name": "ngo-e2e"}),
        ),
        ("half", json!({"role-arn": ROLE})),
        (
            "path",
            json!({"role-arn": ROLE, "oidc-provider-arn": PROVIDER,
                   "oidc-token-file-path": canary_file.display().to_string()}),
        ),
    ] {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": w.ns()},
            "stringData": data,
        }))
        .expect("secret");
        w.secrets()
            .create(&PostParams::default(), &secret)
            .await
            .expect("create secret");
    }
    w.pool(
        "rrsa",
        "asg-rrsa",
        1,
        2,
        json!({"credentialsMode": "RRSA", "credentialsSecretRef": {"name": "rrsa"}}),
    )
    .await;
    w.pool(
        "half",
        "asg-halfrrsa",
        1,
        2,
        json!({"credentialsMode": "RRSA", "credentialsSecretRef": {"name": "half"}}),
    )
    .await;

    w.pool(
        "path",
        "asg-pathrrsa",
        1,
        2,
        json!({"credentialsMode": "RRSA", "credentialsSecretRef": {"name": "path"}}),
    )
    .await;
    let url = w.ess.url();
    w.pool(
        "far",
        "asg-rrsa",
        1,
        2,
        json!({"credentialsMode": "RRSA", "credentialsSecretRef": {"name": "rrsa"},
               "endpoints": {"ess": url, "ecs": url, "vpc": url, "metadata": url,
                             "sts": "https://collector.example/sts"}}),
    )
    .await;

    w.wait_pool_ready("rrsa", "asg-rrsa", 1).await;
    let message = w
        .wait_condition("path", "InvalidSpec", "CredentialsMissing")
        .await;
    assert!(
        message.contains("oidc-token-file-path") && message.contains("refused"),
        "{message}"
    );
    let message = w
        .wait_condition("far", "InvalidSpec", "EndpointNotAllowed")
        .await;
    assert!(
        message.contains("spec.aliCloud.endpoints.sts") && message.contains("collector.example"),
        "{message}"
    );
    for pool in ["path", "far"] {
        let status = serde_json::to_string(&w.get_pool(pool).await.status).expect("status");
        assert!(
            !status.contains(CANARY) && !status.contains("operator-only"),
            "{pool}: {status}"
        );
    }
    assert!(
        w.ess
            .requests()
            .iter()
            .all(|r| !format!("{:?}", r.params).contains(CANARY)),
        "the canary reached the cloud"
    );
    let assumed = w.ess.requests_of("AssumeRoleWithOIDC");
    assert!(
        assumed
            .iter()
            .all(|r| r.params["RoleSessionName"] == "ngo-e2e"
                && r.params["RoleArn"] == ROLE
                && !r.params.contains_key("AccessKeyId")
                && !r.params.contains_key("Signature")),
        "anonymous AssumeRoleWithOIDC with the Secret's role and session: {assumed:?}"
    );
    signed_by_temporary_keys(&w.ess).unwrap_or_else(|e| panic!("{e}"));
    let message = w
        .wait_condition("half", "InvalidSpec", "CredentialsMissing")
        .await;
    assert!(message.contains("oidc-provider-arn"), "{message}");

    // A token the issuer refuses: the next renewal fails and the pool says why.
    std::fs::write(&token_file, "eyJ.revoked.token").expect("token file");
    w.log("token file replaced by a refused token");
    let message = w
        .wait_condition("rrsa", "BackendUnavailable", "Unauthorized")
        .await;
    assert!(
        message.contains("AuthenticationFail.OIDCToken.Invalid"),
        "{message}"
    );
    std::fs::write(&token_file, TOKEN).expect("token file");
    w.log("good token written back");
    w.wait("rrsa: the backend answers again", || async {
        let p = w.get_pool("rrsa").await;
        match TestWorld::condition(&p, "BackendUnavailable") {
            Some((s, _, _)) if s == "False" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let expired = w
        .ess
        .requests()
        .iter()
        .filter(|r| r.code.as_deref() == Some("InvalidSecurityToken.Expired"))
        .count();
    assert_eq!(expired, 0, "no call was signed with an expired key");
}

/// 20 cluster-autoscaler clients (CA's own externalgrpc client, one process each) call
/// IncreaseSize(1) on one pool at once: all succeed and the pool lands on exactly 20, with
/// exactly 20 instances launched. Before any instance exists the template already has the
/// zone of the group's single vSwitch (`DescribeVSwitches`), and CA prices the pool's
/// nodes from its NodeGroupPolicy. A pool whose max lies above its group's MaxSize reports
/// `SizeOutsideScalingGroup` with the group's bounds in its status, is offered to CA with
/// the group's MaxSize, and is kept within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_increases_land_exactly_priced_and_zoned_within_the_group_bounds() {
    let w = World::with("ali-burst", &["asg-burst", "asg-narrow"], |o| {
        for g in &mut o.groups {
            g.max_size = if g.id == "asg-burst" { 25 } else { 3 };
        }
        o.activity_duration = Duration::from_millis(300);
    })
    .await;
    let policy: ngo_api::NodeGroupPolicy = serde_json::from_value(json!({
        "apiVersion": "autoscaling.nodegroup.dev/v1alpha1",
        "kind": "NodeGroupPolicy",
        "metadata": {"name": "prices", "namespace": w.ns()},
        "spec": {
            "selector": {"kinds": ["NodePool"]},
            "pricing": {"nodeHourly": 0.5, "cpuCoreHourly": 0.1, "memoryGibHourly": 0.01},
        },
    }))
    .expect("policy");
    Api::<ngo_api::NodeGroupPolicy>::namespaced(w.client.clone(), w.ns())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create policy");
    w.pool("burst", "asg-burst", 0, 20, json!({})).await;
    w.pool("narrow", "asg-narrow", 4, 5, json!({})).await;

    // The group's bounds: reported, validated, and the pool kept within them.
    let message = w
        .wait_condition("narrow", "InvalidSpec", "SizeOutsideScalingGroup")
        .await;
    assert!(message.contains("MaxSize 3"), "{message}");
    let status = w.get_pool("narrow").await.status.unwrap_or_default();
    assert_eq!(
        (status.backend_min_size, status.backend_max_size),
        (Some(0), Some(3))
    );
    w.wait("narrow: three instances, no more", || async {
        let n = w.instances("asg-narrow").len();
        if n == 3 {
            Ok(())
        } else {
            Err(format!("{n} instances"))
        }
    })
    .await;
    assert!(
        w.events("narrow")
            .await
            .iter()
            .any(|(r, _)| r == "SizeOutsideScalingGroup"),
        "an Event says why"
    );

    // The template of an empty group: the zone from its vSwitch.
    let machine_type = w
        .wait("burst: machine type with the zone", || async {
            let p = w.get_pool("burst").await;
            match p.status.and_then(|s| s.machine_type) {
                Some(t) if t.labels.contains_key("topology.kubernetes.io/zone") => Ok(t),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert_eq!(
        machine_type.labels["topology.kubernetes.io/zone"],
        format!("{REGION}-k")
    );
    assert!(w.ess.instances("asg-burst").is_empty());
    assert!(w.calls("DescribeVSwitches") > 0);

    let config = w.cluster.cloud_config().expect("cloud-config");
    let dir = tempfile::tempdir().expect("tempdir");
    let id = w.get_pool("burst").await.group_id();
    let narrow_id = w.get_pool("narrow").await.group_id();
    let ca = ngo_testbed::ca_client::CaClient::start(&config, &dir.path().join("ca.log"))
        .expect("CA's client");
    let groups = ca.value(json!({"call": "NodeGroups"})).await;
    assert!(groups.to_string().contains(&id), "{groups}");
    assert_eq!(
        ca.value(json!({"call": "MaxSize", "group": narrow_id}))
            .await,
        json!(3),
        "CA is offered the group's MaxSize, not the spec's 5"
    );
    let template = ca
        .value(json!({"call": "TemplateNodeInfo", "group": id}))
        .await;
    assert_eq!(
        template["labels"]["topology.kubernetes.io/zone"],
        json!(format!("{REGION}-k")),
        "{template:#}"
    );
    // The policy's watch event may trail the pool's: priced once the index has both.
    let price = w
        .wait("the template node priced by the policy", || async {
            let result = ca
                .call(json!({"call": "NodePrice", "hours": 2,
                    "node": {"name": template["name"], "providerID": "",
                             "annotations": template["annotations"]}}))
                .await;
            match result.get("error") {
                None => Ok(result["value"].clone()),
                Some(e) => Err(e.to_string()),
            }
        })
        .await;
    assert!(
        (price.as_f64().unwrap_or_default() - 1.0).abs() < 1e-9,
        "2 h at 0.5: {price}"
    );

    let started = Instant::now();
    let calls = (0..20).map(|i| {
        let (config, id) = (config.clone(), id.clone());
        let log = dir.path().join(format!("ca-{i}.log"));
        async move {
            let ca = ngo_testbed::ca_client::CaClient::start(&config, &log).expect("CA's client");
            ca.value(json!({"call": "NodeGroups"})).await;
            let result = ca
                .call(json!({"call": "IncreaseSize", "group": id, "delta": 1}))
                .await;
            let _ = ca.finish().await;
            result
        }
    });
    let results = futures::future::join_all(calls).await;
    w.log(&format!(
        "20 concurrent IncreaseSize(1) answered in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    let failed: Vec<_> = results
        .iter()
        .filter(|r| r.get("error").is_some())
        .collect();
    assert!(failed.is_empty(), "every IncreaseSize succeeds: {failed:?}");
    assert_eq!(
        w.get_pool("burst").await.spec.replicas,
        20,
        "no lost update"
    );
    assert_eq!(ca.value(json!({"call": "Refresh"})).await, Value::Null);
    ca.value(json!({"call": "NodeGroups"})).await;
    assert_eq!(
        ca.value(json!({"call": "TargetSize", "group": id})).await,
        json!(20)
    );

    w.wait_pool_ready("burst", "asg-burst", 20).await;
    let launched: usize = w
        .ess
        .activities("asg-burst")
        .iter()
        .map(|a| a.created.len())
        .sum();
    assert_eq!(launched, 20, "exactly 20 instances launched");
    let node = w.ready_nodes("burst").await.remove(0);
    let pid = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.clone())
        .unwrap_or_default();
    let price = ca
        .value(json!({"call": "NodePrice", "node": {"name": node.name_any(), "providerID": pid}}))
        .await;
    assert!(
        (price.as_f64().unwrap_or_default() - 0.5).abs() < 1e-9,
        "1 h at 0.5: {price}"
    );
    let _ = ca.finish().await;

    // Meanwhile the narrow pool never asked its group for more than it holds.
    let narrow = w.get_pool("narrow").await.status.unwrap_or_default();
    assert_eq!(w.instances("asg-narrow").len(), 3);
    assert!(
        narrow.instances.iter().all(|i| i.error.is_none()) && narrow.instances.len() == 3,
        "no scale-out beyond MaxSize, so no failed creation: {:?}",
        narrow.instances
    );
}

/// cluster-autoscaler (its own externalgrpc client) deletes two nodes in one DeleteNodes;
/// one of them a user put in scale-in protection (`Protected`). ESS would release it if
/// named in RemoveInstances (SetInstancesProtection reference), so the operator removes the
/// other and refuses that one itself. The refused deletion is rolled back (replicas raised
/// back, the instance Running again) and the removed one is gone with the desired capacity
/// lowered; the protected one survives. The call answers OK: CA untaints every node of a
/// batch on an error, and one of them is going (U1; the auditor checks it). The protected
/// node stays tainted until CA names it again. Alone in a call, it is refused with an error
/// naming it and its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_refused_mid_batch_is_rolled_back_and_the_batch_answers_ok() {
    let w = World::new("ali-midbatch", &["asg-mid"]).await;
    w.pool("mid", "asg-mid", 3, 5, json!({})).await;
    w.wait_pool_ready("mid", "asg-mid", 3).await;
    let nodes = w.ready_nodes("mid").await;
    let victims: Vec<(String, String)> = nodes
        .iter()
        .take(2)
        .map(|n| {
            let pid = n.spec.as_ref().and_then(|s| s.provider_id.clone());
            (n.name_any(), pid.unwrap_or_default())
        })
        .collect();
    let instance = |pid: &str| pid.trim_start_matches(&format!("{REGION}.")).to_string();
    let (removable, protected) = (instance(&victims[0].1), instance(&victims[1].1));
    w.ess.set_protected(&protected, true);
    w.log(&format!("{protected} protected from scale-in"));

    let config = w.cluster.cloud_config().expect("cloud-config");
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = ngo_testbed::ca_client::CaClient::start(&config, &dir.path().join("ca.log"))
        .expect("CA's client");
    let id = w.get_pool("mid").await.group_id();
    ca.value(json!({"call": "NodeGroups"})).await;
    let auditor = ngo_testbed::auditor::DeletionAuditor::start_for_nodes(
        w.client.clone(),
        &format!("{POOL}={}", w.label("mid")),
    );
    let named: Vec<String> = victims.iter().map(|(name, _)| name.clone()).collect();
    auditor.taint(&named).await;
    let started = Instant::now();
    let result = ca
        .call(json!({"call": "DeleteNodes", "group": id, "nodes": victims
            .iter()
            .map(|(name, pid)| json!({"name": name, "providerID": pid}))
            .collect::<Vec<_>>()}))
        .await;
    w.log(&format!(
        "DeleteNodes answered in {:.1}s: {result}",
        started.elapsed().as_secs_f64()
    ));
    auditor
        .answered(&named, result.get("error").is_none())
        .await;
    assert!(
        result.get("error").is_none(),
        "one removal of the batch went ahead: OK, {result}"
    );

    w.wait(
        "the removable instance gone, the protected one kept",
        || async {
            let left = w.instances("asg-mid");
            if !left.contains(&removable) && left.contains(&protected) && left.len() == 2 {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
    let pool = w.get_pool("mid").await;
    assert_eq!(pool.spec.replicas, 2, "3 - 2 removals + 1 rolled back");
    let entry = pool
        .status
        .unwrap_or_default()
        .instances
        .into_iter()
        .find(|i| i.id.as_deref() == Some(protected.as_str()))
        .expect("the protected instance's entry");
    assert_eq!(
        entry.state,
        Some(ngo_api::nodepool::InstanceStateName::Running)
    );
    assert_eq!(
        entry.deletion.map(|d| d.outcome),
        Some(ngo_api::nodepool::DeletionOutcome::Refused)
    );
    assert!(
        w.events("mid")
            .await
            .iter()
            .any(|(r, _)| r == "ServerDeleteRefused"),
        "an Event says the deletion was refused"
    );
    ca.value(json!({"call": "Refresh"})).await;
    ca.value(json!({"call": "NodeGroups"})).await;
    assert_eq!(
        ca.value(json!({"call": "TargetSize", "group": id})).await,
        json!(2)
    );
    let instances = ca.value(json!({"call": "Nodes", "group": id})).await;
    assert!(
        instances.to_string().contains(&victims[1].1),
        "CA still sees the protected instance: {instances}"
    );
    assert_eq!(
        w.ess.group("asg-mid").expect("group").desired_capacity,
        Some(2)
    );

    // Named alone, the protected node is refused: an error naming it and its state.
    let alone = vec![victims[1].0.clone()];
    auditor.taint(&alone).await;
    let result = ca
        .call(json!({"call": "DeleteNodes", "group": id,
            "nodes": [{"name": victims[1].0, "providerID": victims[1].1}]}))
        .await;
    auditor
        .answered(&alone, result.get("error").is_none())
        .await;
    let error = result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("CA sees an error: {result}"));
    assert_eq!(result["code"], "FailedPrecondition", "{result}");
    assert!(
        error.contains(&protected) && error.contains("Protected"),
        "the refused instance and its state: {error}"
    );
    assert_eq!(
        w.get_pool("mid").await.spec.replicas,
        2,
        "rolled back again"
    );
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(w.client.clone())
        .get(&victims[1].0)
        .await
        .expect("the protected node stays");
    assert_ne!(
        node.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true),
        "uncordoned once its deletion was rolled back"
    );
    assert_eq!(auditor.violations(), Vec::<String>::new());
    let _ = ca.finish().await;
}

/// A scaling group whose API never answers in time (a proxy holds every request back)
/// holds back no other pool: while the reconciler waits out the silent pool's timeouts (four
/// 10 s attempts per call), each change of a pool next to it reaches ESS at once, and the
/// silent pool is reported unavailable in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaling_group_whose_api_never_answers_holds_back_no_other_pool() {
    let w = World::new("ali-silent", &["asg-silent", "asg-next"]).await;
    let url = w.ess.url();
    let emulator = url
        .trim_start_matches("http://")
        .parse()
        .expect("emulator address");
    let proxy = LatencyProxy::start(emulator, Duration::from_secs(600))
        .await
        .expect("proxy");
    let silent = format!("http://{}", proxy.address);
    let endpoints =
        json!({"ess": silent, "ecs": silent, "vpc": silent, "sts": url, "metadata": url});
    w.pool(
        "silent",
        "asg-silent",
        1,
        2,
        json!({"endpoints": endpoints}),
    )
    .await;
    w.pool("next", "asg-next", 1, 4, json!({})).await;
    w.wait_pool_ready("next", "asg-next", 1).await;

    for replicas in [2, 3, 4] {
        let asked = Instant::now();
        w.set_replicas("next", replicas).await;
        w.wait(&format!("asg-next asked for {replicas}"), || async {
            let desired = w.ess.group("asg-next").and_then(|g| g.desired_capacity);
            (desired == Some(replicas as u32))
                .then_some(())
                .ok_or(format!("desired capacity {desired:?}"))
        })
        .await;
        let took = asked.elapsed();
        assert!(
            took < Duration::from_secs(8),
            "the change to {replicas} took {took:?}: held back behind the silent pool"
        );
    }
    let message = w
        .wait_condition("silent", "BackendUnavailable", "Unavailable")
        .await;
    assert!(message.contains("no answer within"), "{message}");
    assert!(
        w.ess
            .requests_of("ScaleWithAdjustment")
            .iter()
            .all(|r| r.params["ScalingGroupId"] != "asg-silent"),
        "the silent pool changed nothing"
    );
}

/// Out of stock on a group with expected capacity: ESS keeps the desired capacity the
/// scale-out raised and launches toward it once stock returns (the expected-number-of-
/// instances feature), which would bring instances nothing asked for after the creations
/// were reported failed. The operator sets the desired capacity back once the launch ended
/// short, so when stock returns nothing appears on its own; the pool then converges on what
/// it is asked for, with exactly as many instances launched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_stock_then_late_stock_brings_no_instance_nobody_asked_for() {
    let w = World::new("ali-nostock", &["asg-stock"]).await;
    w.pool("stock", "asg-stock", 1, 5, json!({})).await;
    w.wait_pool_ready("stock", "asg-stock", 1).await;
    w.ess.set_stock(INSTANCE_TYPE, Some(0));
    w.set_replicas("stock", 3).await;
    w.wait(
        "the creations failed OutOfStock and the desired capacity set back",
        || async {
            let status = w.get_pool("stock").await.status.unwrap_or_default();
            let failed = status
                .instances
                .iter()
                .filter(|i| i.error.as_ref().is_some_and(|e| e.code == "OutOfStock"))
                .count();
            let desired = w.ess.group("asg-stock").and_then(|g| g.desired_capacity);
            if failed == 2 && desired == Some(1) {
                Ok(())
            } else {
                Err(format!("{failed} failed, desired capacity {desired:?}"))
            }
        },
    )
    .await;

    // Stock returns: no instance without a request.
    w.ess.set_stock(INSTANCE_TYPE, None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        w.instances("asg-stock").len(),
        1,
        "no late instance: {:?}",
        w.ess.activities("asg-stock")
    );

    // The failures dropped (as cluster-autoscaler's DecreaseTargetSize would) and asked again.
    w.set_replicas("stock", 1).await;
    w.wait_pool_ready("stock", "asg-stock", 1).await;
    w.set_replicas("stock", 3).await;
    w.wait_pool_ready("stock", "asg-stock", 3).await;
    let launched: usize = w
        .ess
        .activities("asg-stock")
        .iter()
        .map(|a| a.created.len())
        .sum();
    assert_eq!(launched, 3, "one at first, two when asked again");
}

/// A scale-out that changes nothing: an administrator lowers the scaling group's MaxSize to
/// what it holds while the pool's scale-out is on its way (after the pass read the bounds).
/// ESS records a `Rejected` activity for it (DescribeScalingActivities `StatusCode`), and the
/// creation fails with that activity's reason, reported on the pool as a `ScaleUpFailed`
/// Event naming the activity (`ScaleOutRejected`). No instance appears, and the pool reports
/// that its max size now lies outside the group's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_out_that_changes_nothing_fails_with_the_rejected_activity() {
    let w = World::new("ali-rejected", &["asg-rej"]).await;
    w.pool("rej", "asg-rej", 1, 5, json!({})).await;
    w.wait_pool_ready("rej", "asg-rej", 1).await;
    let written = w.ess.requests_of("ModifyScalingConfiguration").len();
    w.ess.inject(
        Some("ScaleWithAdjustment"),
        1,
        FaultAction::Hang(Duration::from_secs(3)),
    );
    w.set_replicas("rej", 2).await;
    // The user data is written just before the scale-out, which then hangs for 3 s.
    w.wait("the user data written for the scale-out", || async {
        let now = w.ess.requests_of("ModifyScalingConfiguration").len();
        if now > written {
            Ok(())
        } else {
            Err(format!("{now} writes"))
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(w.ess.set_size_bounds("asg-rej", 0, 1));
    w.log("MaxSize lowered to 1 while the scale-out is on its way");

    let event = w
        .wait(
            "a ScaleUpFailed Event with the Rejected activity",
            || async {
                let events = w.events("rej").await;
                events
                    .iter()
                    .find(|(r, m)| r == "ScaleUpFailed" && m.contains("ScaleOutRejected"))
                    .map(|(_, m)| m.clone())
                    .ok_or_else(|| format!("{events:?}"))
            },
        )
        .await;
    let rejected = w
        .ess
        .activities("asg-rej")
        .into_iter()
        .find(|a| a.status == ngo_testbed::alicloud::ActivityStatus::Rejected)
        .expect("ESS recorded a Rejected activity");
    assert!(event.contains(&rejected.id), "{event}");
    assert_eq!(w.instances("asg-rej").len(), 1, "no instance appeared");
    w.wait(
        "the pool reports its max size outside the group's",
        || async {
            let status = w.get_pool("rej").await.status.unwrap_or_default();
            let invalid = status
                .conditions
                .iter()
                .find(|c| c.type_ == "InvalidSpec")
                .map(|c| (c.status.clone(), c.reason.clone()));
            match invalid {
                Some((s, r)) if s == "True" && r == "SizeOutsideScalingGroup" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// The operator's resident memory, from `/proc/<pid>/status` (`VmRSS`), in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_default()
}

/// A hostile cloud endpoint on loopback (a host the sandbox allows): every other answer is an
/// endless body, the others a 500 with a fresh megabyte of text that is not the API's JSON.
async fn hostile_cloud_endpoint() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut byte).await {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                if n.is_multiple_of(2) {
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                        .await;
                    let chunk = format!("10000\r\n{}\r\n", "z".repeat(0x10000));
                    while stream.write_all(chunk.as_bytes()).await.is_ok() {}
                } else {
                    let body: String = (0..1 << 20)
                        .map(|i| char::from(b'a' + ((i * 7 + n) % 26) as u8))
                        .collect();
                    let _ = stream
                        .write_all(
                            format!(
                                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                }
            });
        }
    });
    (url, requests)
}

/// A pool whose cloud endpoint is hostile (endless answers, megabytes of fresh error text)
/// costs the operator bounded memory and another pool nothing: the other pool's changes reach
/// its scaling group as fast as before the hostile one existed (within twice, or 8 s), the
/// operator's RSS stays under the chart's memory limit, and the hostile pool is reported with
/// a short message that quotes none of the endpoint's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_cloud_endpoint_costs_bounded_memory_and_other_pools_nothing() {
    /// The chart's memory limit (`resources.limits.memory`).
    const CHART_LIMIT_KIB: u64 = 512 * 1024;
    let mut w = World::new("ali-hostile", &["asg-next"]).await;
    let pid = w.cluster.operator().expect("operator").pid();
    w.pool("next", "asg-next", 1, 6, json!({})).await;
    w.wait_pool_ready("next", "asg-next", 1).await;
    let change = |replicas: i32| {
        let w = &w;
        async move {
            let asked = Instant::now();
            w.set_replicas("next", replicas).await;
            w.wait(&format!("asg-next asked for {replicas}"), || async {
                let desired = w.ess.group("asg-next").and_then(|g| g.desired_capacity);
                (desired == Some(replicas as u32))
                    .then_some(())
                    .ok_or(format!("desired capacity {desired:?}"))
            })
            .await;
            asked.elapsed()
        }
    };
    let baseline = change(2).await;
    let baseline_rss = rss_kib(pid);

    let (hostile, requests) = hostile_cloud_endpoint().await;
    let url = w.ess.url();
    let endpoints =
        json!({"ess": hostile, "ecs": hostile, "vpc": hostile, "sts": url, "metadata": url});
    w.pool(
        "hostile",
        "asg-hostile",
        0,
        2,
        json!({"endpoints": endpoints}),
    )
    .await;
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampled = peak.clone();
    let sampler = tokio::spawn(async move {
        loop {
            sampled.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let message = w
        .wait_condition("hostile", "BackendUnavailable", "Unavailable")
        .await;
    let mut with_hostile = Vec::new();
    for replicas in [3, 4] {
        with_hostile.push(change(replicas).await);
    }
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let slowest = with_hostile.iter().max().copied().unwrap_or_default();
    let served = requests.load(std::sync::atomic::Ordering::SeqCst);
    w.log(&format!(
        "hostile endpoint: {served} requests; operator RSS {baseline_rss} KiB before, peak {peak} KiB; \
         the other pool's change took {baseline:?} before, at most {slowest:?} beside it"
    ));
    assert!(served > 0, "the hostile endpoint was asked nothing");
    assert!(
        peak < CHART_LIMIT_KIB,
        "RSS {peak} KiB reached the chart's limit"
    );
    assert!(
        slowest <= (baseline * 2).max(Duration::from_secs(8)),
        "the other pool's change took {slowest:?} against {baseline:?} before"
    );
    assert!(
        message.len() < 600 && !message.contains("zzzzzzzz") && !message.contains("abcdefgh"),
        "the condition quotes the endpoint's text: {message:.600}"
    );
    let pool = w.get_pool("hostile").await;
    let status = serde_json::to_string(&pool.status).expect("status");
    assert!(status.len() < 8_192, "{} bytes of status", status.len());
}
