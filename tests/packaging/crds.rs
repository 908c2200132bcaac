//! The checked-in CRDs and examples stay in step with the Rust types.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn checked_in_crds_match_the_rust_types() {
    let generated = ngo_api::crds_yaml().expect("serialise CRDs");
    let checked_in = std::fs::read_to_string(root().join("crds/nodegroup-operator.yaml"))
        .expect("crds/nodegroup-operator.yaml");
    assert!(
        generated == checked_in,
        "crds/ is stale: run `cargo run -- crd > crds/nodegroup-operator.yaml`"
    );
}

#[test]
fn examples_are_valid_policies() {
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        let is_policy = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("nodegrouppolicy"));
        if !is_policy {
            continue; // e.g. cluster-autoscaler-values.yaml
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let policy: ngo_api::NodeGroupPolicy =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let rules = ngo_index::index::policy_rules(&policy);
        assert_eq!(rules.invalid, None, "{}", path.display());
    }
}

#[test]
fn both_crds_are_in_one_category_apart_from_other_projects_nodepools() {
    // `kubectl get nodegroup` lists policies and pools together; `nodepools` alone is also
    // Karpenter's plural.
    for crd in ngo_api::crds() {
        assert_eq!(
            crd.spec.names.categories.as_deref(),
            Some(&["nodegroup".to_string()][..]),
            "{}",
            crd.spec.names.kind
        );
    }
}
