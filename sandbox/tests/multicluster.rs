//! The standard Cluster API topology in the sandbox: one management cluster (Cluster API,
//! the test infrastructure provider, the operator) and workload clusters with API servers
//! of their own, reached through each Cluster's `<cluster>-kubeconfig` Secret.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use ngo_sandbox::environment::{
    Sandbox, SandboxOptions, WORKER_TEMPLATE, create_cluster, wait_for,
};
use ngo_sandbox::stack::AutoscaledCluster;
use ngo_testbed::capi;
use ngo_testbed::infra_provider::{self, InfraProvider};
use ngo_testbed::workload;
use serde_json::json;

/// Each test starts a whole sandbox: on a small machine they run one at a time.
static ONE_SANDBOX_AT_A_TIME: Mutex<()> = Mutex::new(());

const WAIT: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn start(workload_clusters: usize) -> Sandbox {
    let started = Instant::now();
    let sandbox = Sandbox::start_with(&SandboxOptions { workload_clusters })
        .unwrap_or_else(|e| panic!("starting the sandbox: {e:#}"));
    eprintln!(
        "management + {workload_clusters} workload clusters up in {:.1}s (logs: {})",
        started.elapsed().as_secs_f64(),
        sandbox.log_dir().display()
    );
    sandbox
}

/// Names of the Nodes whose name starts with `prefix`, sorted.
async fn nodes(client: &Client, prefix: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .map(|n| n.name_any())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    Ok(names)
}

/// The Nodes of the Machines of MachineDeployment `namespace/md` (sorted), once every
/// Machine has a `status.nodeRef` and there are `replicas` of them.
async fn node_refs(
    client: &Client,
    namespace: &str,
    md: &str,
    replicas: usize,
) -> Result<Vec<String>, String> {
    let machines =
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machines())
            .list(&ListParams::default().labels(&format!("{}={md}", capi::DEPLOYMENT_NAME_LABEL)))
            .await
            .map_err(|e| e.to_string())?
            .items;
    let mut refs: Vec<String> = machines
        .iter()
        .filter_map(|m| {
            m.data["status"]["nodeRef"]["name"]
                .as_str()
                .map(String::from)
        })
        .collect();
    refs.sort();
    if machines.len() == replicas && refs.len() == replicas {
        Ok(refs)
    } else {
        Err(format!(
            "{} machines, node refs {refs:?}, want {replicas}",
            machines.len()
        ))
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn create_md(client: &Client, namespace: &str, cluster: &str, name: &str, template: &str) {
    let md = capi::machine_deployment(namespace, cluster, name, 1, json!({}), template)
        .expect("MachineDeployment");
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machine_deployments())
        .create(&PostParams::default(), &md)
        .await
        .unwrap_or_else(|e| panic!("creating {namespace}/{name}: {e}"));
}

async fn scale(client: &Client, namespace: &str, md: &str, replicas: i32) {
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &capi::machine_deployments())
        .patch(
            md,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap_or_else(|e| panic!("scaling {namespace}/{md}: {e}"));
}

/// Waits until the Machines of `namespace/md` have `replicas` nodeRefs and returns them,
/// after checking that exactly those Nodes of `namespace` exist in `home` and none in
/// `elsewhere`.
async fn nodes_only_in(
    management: &Client,
    namespace: &str,
    md: &str,
    replicas: usize,
    home: &Client,
    elsewhere: &[&Client],
) -> Vec<String> {
    let prefix = format!("{namespace}-");
    let refs = wait_for(
        &format!("{replicas} Machines of {namespace}/{md} with nodeRefs in their cluster"),
        WAIT,
        Duration::from_millis(200),
        || async {
            let refs = node_refs(management, namespace, md, replicas).await?;
            let found = nodes(home, &prefix).await?;
            if found == refs {
                Ok(refs)
            } else {
                Err(format!(
                    "nodeRefs {refs:?}, Nodes in the workload cluster {found:?}"
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    for other in elsewhere {
        let stray = nodes(other, &prefix).await.expect("listing Nodes");
        assert!(
            stray.is_empty(),
            "Nodes of {namespace} elsewhere: {stray:?}"
        );
    }
    refs
}

#[test]
fn machines_become_nodes_of_their_own_workload_cluster_which_survives_a_restart() {
    let _one = ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let test_started = Instant::now();
    let sandbox = start(2);
    let info = sandbox.info();
    runtime().block_on(async {
        let management = info.client().await.expect("management client");
        let (wa, wb) = (&info.workload_clusters[0], &info.workload_clusters[1]);
        let a = wa.client().await.expect("client of workload-0");
        let b = wb.client().await.expect("client of workload-1");
        let _provider = InfraProvider::start(management.clone(), None);

        let created = Instant::now();
        let (ra, rb, rc) = tokio::join!(
            create_cluster(&management, &wa.capi_kubeconfig, "team-a", "a", json!({})),
            create_cluster(&management, &wb.capi_kubeconfig, "team-b", "b", json!({})),
            create_cluster(&management, &wb.capi_kubeconfig, "team-c", "c", json!({})),
        );
        ra.expect("Cluster team-a/a connected to workload-0");
        rb.expect("Cluster team-b/b connected to workload-1");
        rc.expect("Cluster team-c/c connected to workload-1");
        eprintln!(
            "three Clusters connected in {:.1}s",
            created.elapsed().as_secs_f64()
        );
        create_md(&management, "team-a", "a", "workers", WORKER_TEMPLATE).await;
        create_md(&management, "team-b", "b", "workers", WORKER_TEMPLATE).await;
        // team-c: a machine whose Node registers in workload-1 but whose providerID the
        // infrastructure never reports.
        let unlinked = capi::test_machine_template(
            "team-c",
            "unlinked",
            json!({}),
            json!({infra_provider::OMIT_PROVIDER_ID_ANNOTATION: "true"}),
        )
        .expect("TestMachineTemplate");
        Api::<DynamicObject>::namespaced_with(
            management.clone(),
            "team-c",
            &capi::test_machine_templates(),
        )
        .create(&PostParams::default(), &unlinked)
        .await
        .expect("creating team-c/unlinked");
        create_md(&management, "team-c", "c", "unlinked", "unlinked").await;

        let in_a = nodes_only_in(&management, "team-a", "workers", 1, &a, &[&management, &b]).await;
        let in_b = nodes_only_in(&management, "team-b", "workers", 1, &b, &[&management, &a]).await;
        let node = Api::<Node>::all(a.clone())
            .get(&in_a[0])
            .await
            .expect("Node in workload-0");
        let machine = in_a[0].trim_start_matches("team-a-");
        assert_eq!(
            node.spec.and_then(|s| s.provider_id).as_deref(),
            Some(infra_provider::provider_id("team-a", machine).as_str())
        );
        eprintln!(
            "one Node each, in its own cluster: {in_a:?} {in_b:?} ({:.1}s)",
            test_started.elapsed().as_secs_f64()
        );

        scale(&management, "team-a", "workers", 2).await;
        let in_a = nodes_only_in(&management, "team-a", "workers", 2, &a, &[&management, &b]).await;
        assert_eq!(
            nodes(&b, "team-b-").await.expect("Nodes of workload-1"),
            in_b
        );
        eprintln!(
            "team-a scaled to 2 in workload-0 only: {in_a:?} ({:.1}s)",
            test_started.elapsed().as_secs_f64()
        );

        wb.api_server
            .stop()
            .await
            .expect("stopping workload-1's API server");
        assert!(
            Api::<Node>::all(b.clone())
                .list(&ListParams::default())
                .await
                .is_err(),
            "workload-1 is unreachable while its API server is stopped"
        );
        scale(&management, "team-a", "workers", 3).await;
        nodes_only_in(&management, "team-a", "workers", 3, &a, &[&management]).await;
        eprintln!(
            "team-a scaled to 3 while workload-1 is down ({:.1}s)",
            test_started.elapsed().as_secs_f64()
        );

        wb.api_server
            .start()
            .await
            .expect("restarting workload-1's API server");
        assert_eq!(
            nodes(&b, "team-b-")
                .await
                .expect("Nodes of workload-1 after its restart"),
            in_b,
            "the restarted API server has its data"
        );
        capi::wait_cluster_connected(&management, "team-b", "b", WAIT)
            .await
            .expect("Cluster team-b/b connected again");
        scale(&management, "team-b", "workers", 2).await;
        let in_b = nodes_only_in(&management, "team-b", "workers", 2, &b, &[&management, &a]).await;
        wait_for(
            "kwok of workload-1 to make its Nodes Ready after the restart",
            WAIT,
            Duration::from_millis(200),
            || async {
                let listed = Api::<Node>::all(b.clone())
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let not_ready: Vec<String> = listed
                    .items
                    .iter()
                    .filter(|n| !is_ready(n))
                    .map(|n| n.name_any())
                    .collect();
                if not_ready.is_empty() {
                    Ok(())
                } else {
                    Err(format!("not Ready: {not_ready:?}"))
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "team-b scaled to 2 after workload-1's restart: {in_b:?} ({:.1}s)",
            test_started.elapsed().as_secs_f64()
        );

        // Cluster API finds Nodes only by the Machine's providerID, which it copies from the
        // infrastructure machine: the team-c Machine has a Node in workload-1 but never
        // gets a providerID or a nodeRef.
        let machines =
            Api::<DynamicObject>::namespaced_with(management.clone(), "team-c", &capi::machines())
                .list(&ListParams::default())
                .await
                .expect("Machines of team-c")
                .items;
        assert_eq!(machines.len(), 1);
        let machine = &machines[0];
        let infra = machine.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .expect("infrastructureRef");
        let node = Api::<Node>::all(b.clone())
            .get(&infra_provider::node_name("team-c", infra))
            .await
            .expect("the team-c Node in workload-1");
        assert_eq!(
            node.spec.and_then(|s| s.provider_id).as_deref(),
            Some(infra_provider::provider_id("team-c", infra).as_str())
        );
        assert!(machine.data["spec"]["providerID"].is_null(), "{machine:?}");
        assert!(machine.data["status"]["nodeRef"].is_null(), "{machine:?}");
    });
    drop(sandbox);
    eprintln!(
        "test finished in {:.1}s",
        test_started.elapsed().as_secs_f64()
    );
}

/// cluster-autoscaler watches the workload cluster (`--kubeconfig`) and reaches the
/// operator, which runs against the management cluster, through externalgrpc with a client
/// certificate naming its Cluster; a pending pod in the workload cluster makes it scale the
/// MachineDeployment up, and the new Node appears in the workload cluster. Needs the
/// operator binary next to this test's (`target/debug/nodegroup-operator`, built by
/// `cargo test --workspace`) or `$NGO_OPERATOR_BIN`.
#[test]
fn externalgrpc_autoscaler_on_a_workload_cluster_scales_its_machine_deployment() {
    let _one = ONE_SANDBOX_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let test_started = Instant::now();
    let sandbox = start(1);
    let info = sandbox.info();
    let workload = &info.workload_clusters[0];
    let pool = BTreeMap::from([("pool".to_string(), "workers".to_string())]);
    // The infrastructure provider runs on this runtime; the processes are started from this
    // (test) thread, outside it.
    let rt = runtime();
    let mut cluster = rt
        .block_on(AutoscaledCluster::create_on(
            &info,
            workload,
            "team-a",
            "a",
            json!(pool),
        ))
        .unwrap_or_else(|e| panic!("creating team-a/a on workload-0: {e:#}"));
    cluster
        .start_operator(&cluster.operator_options())
        .unwrap_or_else(|e| panic!("starting the operator: {e:#}"));
    let options = cluster.externalgrpc_autoscaler().expect("cloud-config");
    cluster
        .start_autoscaler(&options)
        .unwrap_or_else(|e| panic!("starting cluster-autoscaler: {e}"));
    rt.block_on(async {
        let management = cluster.client().await.expect("management client");
        let nodes_client = cluster.nodes_client().await.expect("workload client");
        let md = capi::machine_deployment(
            "team-a",
            "a",
            "workers",
            1,
            json!({
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "3",
            }),
            WORKER_TEMPLATE,
        )
        .expect("MachineDeployment");
        Api::<DynamicObject>::namespaced_with(
            management.clone(),
            "team-a",
            &capi::machine_deployments(),
        )
        .create(&PostParams::default(), &md)
        .await
        .expect("creating team-a/workers");
        nodes_only_in(
            &management,
            "team-a",
            "workers",
            1,
            &nodes_client,
            &[&management],
        )
        .await;

        // Two pods of 3 CPUs on 4-CPU nodes: the second needs a second node.
        let app = workload::deployment("default", "app", 2, "3", &pool).expect("Deployment");
        workload::create(&nodes_client, &app)
            .await
            .expect("creating the Deployment in workload-0");
        let grown = nodes_only_in(
            &management,
            "team-a",
            "workers",
            2,
            &nodes_client,
            &[&management],
        )
        .await;
        let status = cluster
            .autoscaler()
            .expect("cluster-autoscaler running")
            .status(&nodes_client)
            .await
            .expect("status ConfigMap in workload-0's kube-system")
            .expect("cluster-autoscaler wrote its status");
        let groups: Vec<&str> = status.node_groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(groups, ["MachineDeployment/team-a/workers"]);
        wait_for(
            "both pods Running in workload-0",
            WAIT,
            Duration::from_millis(200),
            || async {
                let pods = workload::pod_counts(&nodes_client, "default", "app")
                    .await
                    .map_err(|e| e.to_string())?;
                if pods.running == 2 {
                    Ok(())
                } else {
                    Err(format!("{pods:?}"))
                }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        eprintln!(
            "cluster-autoscaler on workload-0 scaled team-a/workers to {grown:?} ({:.1}s)",
            test_started.elapsed().as_secs_f64()
        );
        cluster
            .check_alive()
            .expect("operator and cluster-autoscaler alive");
    });
    drop(cluster);
    drop(sandbox);
}
