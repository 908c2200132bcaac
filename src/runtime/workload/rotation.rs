//! Make before break: what a kubeconfig read from a Cluster's Secret calls for, and when the
//! connection made from a rotated one takes over. Pure decisions; the cluster set acts on
//! them.

use std::time::Duration;

use super::kubeconfig::KubeconfigDigest;
use ngo_index::index::WorkloadState;

/// How long a connection made from a rotated kubeconfig may take to list the Nodes before a
/// warning says so.
pub(super) const ROTATION_WARN_AFTER: Duration = Duration::from_secs(30);

/// What a kubeconfig read from a Cluster's Secret calls for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SecretAction {
    /// It is the one in use, or the one being connected with (a Secret whose metadata alone
    /// changed lands here).
    Unchanged,
    /// It went back to the one in use: the connection made from the rotated one is closed.
    DropRotation,
    /// Nothing worth keeping is served: a connection with it serves at once.
    Serve,
    /// A rotation: a connection with it is made beside the serving one, and replaces it once
    /// it has listed the Nodes.
    Rotate,
}

/// What kubeconfig `read` calls for, given the kubeconfig of the serving connection (and
/// whether that connection ever listed the Nodes) and of a connection made from a rotated
/// kubeconfig, when there are such connections.
pub(super) fn secret_action(
    read: &KubeconfigDigest,
    serving: Option<(&KubeconfigDigest, bool)>,
    rotating: Option<&KubeconfigDigest>,
) -> SecretAction {
    match serving {
        Some((current, _)) if current == read => {
            if rotating.is_some() {
                SecretAction::DropRotation
            } else {
                SecretAction::Unchanged
            }
        }
        _ if rotating == Some(read) => SecretAction::Unchanged,
        Some((_, true)) => SecretAction::Rotate,
        _ => SecretAction::Serve,
    }
}

/// What becomes of a connection made from a rotated kubeconfig.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RotationStep {
    /// It has listed the Nodes: it serves from now on.
    Promote,
    /// It has not synced after [`ROTATION_WARN_AFTER`]: say so, once.
    Warn,
    /// Keep waiting.
    Wait,
}

/// The step for a rotated connection in `state`, made `age` ago, already `warned` about.
pub(super) fn rotation_step(state: &WorkloadState, age: Duration, warned: bool) -> RotationStep {
    if state.ever_synced() {
        RotationStep::Promote
    } else if age >= ROTATION_WARN_AFTER && !warned {
        RotationStep::Warn
    } else {
        RotationStep::Wait
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Secret;

    use super::super::kubeconfig::kubeconfig_value;
    use super::*;

    fn digest(text: &str) -> KubeconfigDigest {
        KubeconfigDigest::of(text.as_bytes())
    }

    fn secret(labels: &[(&str, &str)], resource_version: &str, value: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "c1-kubeconfig",
                "namespace": "ns",
                "resourceVersion": resource_version,
                "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            },
            "data": {"value": k8s_openapi::ByteString(value.as_bytes().to_vec())},
        }))
        .expect("a Secret")
    }

    #[test]
    fn only_a_change_of_the_kubeconfig_itself_reconnects() {
        let before = secret(&[], "1", "kubeconfig one");
        let relabeled = secret(&[("team", "blue")], "2", "kubeconfig one");
        let rotated = secret(&[("team", "blue")], "3", "kubeconfig two");
        let of = |s: &Secret| KubeconfigDigest::of(kubeconfig_value(s).expect("a value"));
        let serving = of(&before);
        assert_eq!(
            secret_action(&of(&relabeled), Some((&serving, true)), None),
            SecretAction::Unchanged
        );
        assert_eq!(
            secret_action(&of(&rotated), Some((&serving, true)), None),
            SecretAction::Rotate
        );
        let mut missing = before.clone();
        missing.data = None;
        assert_eq!(
            kubeconfig_value(&missing),
            Err("it has no key \"value\"".to_string())
        );
    }

    #[test]
    fn a_rotation_is_made_beside_a_connection_that_synced_and_replaces_one_that_never_did() {
        let (one, two, three) = (digest("one"), digest("two"), digest("three"));
        assert_eq!(
            secret_action(&two, Some((&one, true)), None),
            SecretAction::Rotate
        );
        assert_eq!(
            secret_action(&two, Some((&one, false)), None),
            SecretAction::Serve,
            "a connection that never synced is not worth keeping"
        );
        assert_eq!(
            secret_action(&one, None, None),
            SecretAction::Serve,
            "no connection yet, or none from a Secret"
        );
        assert_eq!(
            secret_action(&two, Some((&one, true)), Some(&two)),
            SecretAction::Unchanged,
            "already connecting with it"
        );
        assert_eq!(
            secret_action(&three, Some((&one, true)), Some(&two)),
            SecretAction::Rotate,
            "a newer rotation replaces the pending one"
        );
        assert_eq!(
            secret_action(&one, Some((&one, true)), Some(&two)),
            SecretAction::DropRotation,
            "the Secret went back to the kubeconfig in use"
        );
    }

    #[test]
    fn a_rotated_connection_serves_once_it_listed_the_nodes_and_is_reported_once_when_slow() {
        let early = ROTATION_WARN_AFTER / 2;
        let late = ROTATION_WARN_AFTER;
        assert_eq!(
            rotation_step(&WorkloadState::Syncing, early, false),
            RotationStep::Wait
        );
        assert_eq!(
            rotation_step(&WorkloadState::Synced, early, false),
            RotationStep::Promote
        );
        let unanswered = WorkloadState::NeverSynced("no answer within 5s".into());
        assert_eq!(rotation_step(&unanswered, late, false), RotationStep::Warn);
        assert_eq!(rotation_step(&unanswered, late, true), RotationStep::Wait);
        assert_eq!(
            rotation_step(&WorkloadState::Synced, late * 4, true),
            RotationStep::Promote,
            "a late sync still swaps"
        );
    }
}
