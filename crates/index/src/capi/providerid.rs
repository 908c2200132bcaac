//! Provider-ID normalisation and the synthetic instance ids for machines without nodes.

use super::keys::{DELETING_PREFIX, FAILED_PREFIX, PENDING_PREFIX};

/// The part of a provider ID used for matching: everything after the last `/`, except Azure
/// VMSS ids, which are kept whole (their tail alone is not unique). Mirrors upstream.
pub fn normalize(provider_id: &str) -> &str {
    if provider_id.starts_with("azure://") && provider_id.contains("virtualMachineScaleSets") {
        return provider_id;
    }
    match provider_id.rfind('/') {
        Some(i) => &provider_id[i + 1..],
        None => provider_id,
    }
}

/// Why a machine is reported under a synthetic id instead of its provider ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyntheticKind {
    /// No node yet.
    Pending,
    /// Failed to provision.
    Failed,
    /// Being deleted.
    Deleting,
}

impl SyntheticKind {
    fn prefix(self) -> &'static str {
        match self {
            SyntheticKind::Pending => PENDING_PREFIX,
            SyntheticKind::Failed => FAILED_PREFIX,
            SyntheticKind::Deleting => DELETING_PREFIX,
        }
    }
}

/// `<prefix><namespace>_<name>`; namespaces cannot contain `_`, so the first `_` separates.
pub fn synthetic_id(kind: SyntheticKind, namespace: &str, name: &str) -> String {
    format!("{}{namespace}_{name}", kind.prefix())
}

/// A parsed synthetic id: the kind and the Machine's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntheticId<'a> {
    /// Why the id is synthetic.
    pub kind: SyntheticKind,
    /// Machine namespace.
    pub namespace: &'a str,
    /// Machine name.
    pub name: &'a str,
}

/// Parses a synthetic id; `None` for real provider IDs and malformed synthetic ones.
pub fn parse_synthetic(id: &str) -> Option<SyntheticId<'_>> {
    for kind in [
        SyntheticKind::Pending,
        SyntheticKind::Failed,
        SyntheticKind::Deleting,
    ] {
        if let Some(rest) = id.strip_prefix(kind.prefix()) {
            let (namespace, name) = rest.split_once('_')?;
            if namespace.is_empty() || name.is_empty() {
                return None;
            }
            return Some(SyntheticId {
                kind,
                namespace,
                name,
            });
        }
    }
    None
}

/// True when the id uses one of the synthetic prefixes (even if malformed).
pub fn has_synthetic_prefix(id: &str) -> bool {
    [PENDING_PREFIX, FAILED_PREFIX, DELETING_PREFIX]
        .iter()
        .any(|p| id.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_keeps_the_last_segment() {
        assert_eq!(normalize("aws:////i-123"), "i-123");
        assert_eq!(normalize("test:////ns-x-nodeid-0"), "ns-x-nodeid-0");
        assert_eq!(normalize("openstack:///region/abc"), "abc");
        assert_eq!(normalize("plain-id"), "plain-id");
        assert_eq!(normalize(""), "");
    }

    #[test]
    fn azure_vmss_ids_are_kept_whole() {
        let id = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/vmss/virtualMachines/0";
        assert_eq!(normalize(id), id);
        assert_eq!(
            normalize("azure:///subscriptions/s/virtualMachines/vm-1"),
            "vm-1"
        );
    }

    #[test]
    fn synthetic_ids_round_trip_on_the_first_underscore() {
        let id = synthetic_id(SyntheticKind::Pending, "ns", "m_1");
        assert_eq!(id, "pending-machine-ns_m_1");
        let parsed = parse_synthetic(&id).unwrap();
        assert_eq!(parsed.kind, SyntheticKind::Pending);
        assert_eq!(parsed.namespace, "ns");
        assert_eq!(parsed.name, "m_1");
        let failed = parse_synthetic("failed-machine-a_b").unwrap();
        assert_eq!(failed.kind, SyntheticKind::Failed);
        let deleting = parse_synthetic("deleting-machine-a_b").unwrap();
        assert_eq!(deleting.kind, SyntheticKind::Deleting);
    }

    #[test]
    fn malformed_or_real_ids_are_not_synthetic() {
        assert!(parse_synthetic("aws:///i-1").is_none());
        assert!(parse_synthetic("pending-machine-nounderscore").is_none());
        assert!(parse_synthetic("pending-machine-_name").is_none());
        assert!(has_synthetic_prefix("pending-machine-nounderscore"));
        assert!(!has_synthetic_prefix("kwok://node"));
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        fn kind() -> impl Strategy<Value = SyntheticKind> {
            prop_oneof![
                Just(SyntheticKind::Pending),
                Just(SyntheticKind::Failed),
                Just(SyntheticKind::Deleting),
            ]
        }

        proptest! {
            #[test]
            fn normalize_is_an_idempotent_suffix(id in any::<String>()) {
                let n = normalize(&id);
                prop_assert!(id.ends_with(n));
                prop_assert_eq!(normalize(n), n);
            }

            #[test]
            fn normalize_keeps_only_the_last_segment(segments in proptest::collection::vec("[a-z0-9:.-]{0,8}", 1..6)) {
                let id = segments.join("/");
                prop_assert_eq!(normalize(&id), segments.last().unwrap().as_str());
            }

            #[test]
            fn synthetic_ids_round_trip(
                kind in kind(),
                namespace in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?",
                name in "[a-z0-9_.-]{1,30}",
            ) {
                let id = synthetic_id(kind, &namespace, &name);
                prop_assert!(has_synthetic_prefix(&id));
                let parsed = parse_synthetic(&id).unwrap();
                prop_assert_eq!(parsed, SyntheticId { kind, namespace: &namespace, name: &name });
            }

            #[test]
            fn parsing_arbitrary_ids_never_panics_and_is_consistent(id in any::<String>()) {
                if let Some(parsed) = parse_synthetic(&id) {
                    prop_assert!(has_synthetic_prefix(&id));
                    prop_assert_eq!(synthetic_id(parsed.kind, parsed.namespace, parsed.name), id.clone());
                }
            }

            #[test]
            fn prefixed_arbitrary_ids_never_panic(kind in kind(), rest in any::<String>()) {
                let id = synthetic_id(kind, "", "").replace('_', "") + &rest;
                if let Some(parsed) = parse_synthetic(&id) {
                    prop_assert_eq!(parsed.kind, kind);
                    prop_assert!(!parsed.namespace.is_empty() && !parsed.name.is_empty());
                    prop_assert!(!parsed.namespace.contains('_'));
                }
            }
        }
    }
}
