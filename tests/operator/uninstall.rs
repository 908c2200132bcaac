//! `nodegroup-operator release-finalizers` against the real API server, as the chart's
//! ServiceAccount: it frees what would outlive the operator and touches nothing else.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use nodegroup_operator::ngo_index::capi::scale_down::{
    FINALIZER, LEDGER_ANNOTATION, Ledger, MARK_ANNOTATION, ScaleDownMark,
};
use nodegroup_operator::nodepool::reconciler::FINALIZER as POOL_FINALIZER;
use nodegroup_operator::uninstall::{self, Options, Report};
use serde_json::json;

use crate::support::*;

fn mark(deadline: i64) -> String {
    ScaleDownMark {
        request: "r1".into(),
        group: "MachineDeployment/ns/md".into(),
        deadline,
        preexisting: false,
        released: false,
    }
    .to_annotation()
}

async fn dress(ns: &TestNs, name: &str, finalizers: &[&str], annotations: serde_json::Value) {
    ns.api(&machines())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": finalizers, "annotations": annotations}}),
            ),
        )
        .await
        .unwrap_or_else(|e| panic!("dressing {name}: {e}"));
}

async fn release(ns: &TestNs, orphan: bool) -> Report {
    let client = ngo_testbed::controlplane::client_for(&shared().operator_kubeconfig)
        .await
        .expect("the operator's client");
    let report = uninstall::release(
        &client,
        &Options {
            capi_group: "cluster.x-k8s.io".into(),
            capi_version: Some(CAPI_VERSION.into()),
            namespaces: vec![ns.name.clone()],
            orphan_cloud_servers: orphan,
            clock_margin_secs: 30,
        },
    )
    .await
    .expect("release-finalizers runs with the chart's RBAC");
    eprintln!("{report}");
    report
}

fn versions(objects: &[Option<DynamicObject>]) -> Vec<Option<String>> {
    objects
        .iter()
        .map(|o| o.as_ref().and_then(|o| o.resource_version()))
        .collect()
}

/// A Machine being deleted under our scale-down finalizer (its request long stopped) and a
/// ledger whose machine is gone are released; a NodePool only with `--orphan-cloud-servers`,
/// its servers listed; a Machine whose scale-down may still complete, another controller's
/// finalizer and a group's live claim are left exactly as they were.
#[tokio::test]
async fn release_finalizers_frees_what_outlives_the_operator_and_nothing_else() {
    let ns = TestNs::new("release").await;
    let now = jiff::Timestamp::now().as_second();
    let md = ns.machine_deployment("md", 3, json!({})).await;
    let ms = ns.machine_set("ms", 3, json!({}), Some(&md)).await;
    for name in ["m-deleting", "m-live", "m-other"] {
        ns.machine(name, &ms, None, None, json!({})).await;
    }
    dress(
        &ns,
        "m-deleting",
        &[FINALIZER],
        json!({MARK_ANNOTATION: mark(now - 600), DELETE_MACHINE: "yes"}),
    )
    .await;
    dress(
        &ns,
        "m-live",
        &[FINALIZER],
        json!({MARK_ANNOTATION: mark(now + 600), DELETE_MACHINE: "yes"}),
    )
    .await;
    dress(&ns, "m-other", &["example.com/keep"], json!({})).await;
    for name in ["m-deleting", "m-other"] {
        ns.api(&machines())
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    let mut gone = Ledger::default();
    gone.record("m-gone", "r0", now - 900, |_| true);
    let mut claimed = Ledger::default();
    claimed.record_claim("m-live", "r1", now, now + 600, |_| true);
    for (ar, name, ledger) in [
        (machine_deployments(), "md", &gone),
        (machine_sets(), "ms", &claimed),
    ] {
        ns.api(&ar)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {LEDGER_ANNOTATION: ledger.to_annotation()}}})),
            )
            .await
            .expect("ledger");
    }
    let pools = ns.node_pool_with_a_server().await;

    let untouched = || async {
        vec![
            ns.api(&machines()).get_opt("m-live").await.unwrap(),
            ns.api(&machines()).get_opt("m-other").await.unwrap(),
            ns.api(&machine_sets()).get_opt("ms").await.unwrap(),
        ]
    };
    let before = untouched().await;

    // By default the NodePool is refused, named with its server, and keeps its finalizer.
    let first = release(&ns, false).await;
    let names = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.split(':').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&first.released),
        [
            format!("Machine {}/m-deleting", ns.name),
            format!("MachineDeployment {}/md", ns.name)
        ]
    );
    let held = names(&first.held);
    for expected in [
        format!("Machine {}/m-live", ns.name),
        format!("MachineSet {}/ms", ns.name),
        format!("NodePool {}/np", ns.name),
    ] {
        assert!(
            held.contains(&expected),
            "{expected} held: {:?}",
            first.held
        );
    }
    assert_eq!(held.len(), 3, "{:?}", first.held);
    assert!(
        first.held.iter().any(|l| l.contains("cherryservers://42")),
        "{:?}",
        first.held
    );
    assert!(first.orphaned_servers.is_empty());
    assert_eq!(
        ns.api(&machines())
            .get_opt("m-deleting")
            .await
            .unwrap()
            .map(|m| m.name_any()),
        None,
        "the deleting Machine went once our finalizer was released"
    );
    let md_annotations: BTreeMap<_, _> = ns.annotations(&machine_deployments(), "md").await;
    assert!(!md_annotations.contains_key(LEDGER_ANNOTATION));
    assert_eq!(
        pools.get("np").await.unwrap().finalizers(),
        [POOL_FINALIZER]
    );
    assert_eq!(versions(&untouched().await), versions(&before));

    // With --orphan-cloud-servers the pool's finalizer goes, and its server is listed.
    let second = release(&ns, true).await;
    assert_eq!(
        names(&second.released),
        [format!("NodePool {}/np", ns.name)]
    );
    assert_eq!(second.held.len(), 2, "{:?}", second.held);
    assert_eq!(second.orphaned_servers.len(), 1);
    assert!(second.orphaned_servers[0].contains("cherryservers://42"));
    assert!(pools.get("np").await.unwrap().finalizers().is_empty());
    assert_eq!(versions(&untouched().await), versions(&before));

    // Idempotent: nothing more to release.
    let third = release(&ns, true).await;
    assert!(third.released.is_empty(), "{:?}", third.released);

    // Let the other controller's Machine go.
    dress(&ns, "m-other", &[], json!({})).await;
}
