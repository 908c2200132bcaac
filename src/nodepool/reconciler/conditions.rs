//! The pool's conditions after a pass, from how it ended and what it did.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::pass_report::PassReport;
use super::{Blocked, SIZE_OUTSIDE_BACKEND};
use ngo_api::conditions::{ConditionStatus, DesiredCondition};

/// The pool's conditions after a pass that ended with `blocked` (see
/// [`NodePoolStatus::conditions`](ngo_api::nodepool::NodePoolStatus::conditions) for their
/// polarity). What the pass did not get to check is Unknown: a pass blocked before it connected the
/// backend (`report.backend` unset: the spec names no usable backend, or the credentials Secret
/// could not be read) leaves the backend's availability Unknown (`NotConnected`), and a Kubernetes
/// API error before connecting leaves the spec's credentials unchecked (`InvalidSpec` Unknown,
/// `NotChecked`). A pass that connected got the backend's members and bounds before anything else
/// could block it, so the backend is then known to answer.
pub(super) fn conditions(
    blocked: &Option<Blocked>,
    report: &PassReport,
    previous_scale_up: Option<&Condition>,
    desired: usize,
    replicas: usize,
    ready: usize,
) -> Vec<DesiredCondition> {
    let condition =
        |type_, status: ConditionStatus, reason: &str, message: String| DesiredCondition {
            type_,
            status,
            reason: reason.into(),
            message,
        };
    let connected = report.backend.is_some();
    let invalid = match (blocked, &report.size_violation) {
        (Some(Blocked::Spec(reason, message)), _) => condition(
            "InvalidSpec",
            ConditionStatus::True,
            reason,
            message.clone(),
        ),
        (_, Some(message)) => condition(
            "InvalidSpec",
            ConditionStatus::True,
            SIZE_OUTSIDE_BACKEND,
            message.clone(),
        ),
        (Some(Blocked::Api(message)), None) if !connected => condition(
            "InvalidSpec",
            ConditionStatus::Unknown,
            "NotChecked",
            format!("the pool's credentials could not be read: {message}"),
        ),
        _ => condition(
            "InvalidSpec",
            ConditionStatus::False,
            "Valid",
            "the pool's spec and credentials can be acted on".into(),
        ),
    };
    let backend = match blocked {
        Some(Blocked::Backend(e)) => condition(
            "BackendUnavailable",
            ConditionStatus::True,
            e.kind.as_str(),
            e.message.clone(),
        ),
        Some(Blocked::Spec(..)) if !connected => condition(
            "BackendUnavailable",
            ConditionStatus::Unknown,
            "NotConnected",
            "the backend is not called while the spec is invalid".into(),
        ),
        Some(Blocked::Api(_)) if !connected => condition(
            "BackendUnavailable",
            ConditionStatus::Unknown,
            "NotConnected",
            "the backend is not called before the pool's credentials are read".into(),
        ),
        _ => condition(
            "BackendUnavailable",
            ConditionStatus::False,
            "Available",
            "the backend answers".into(),
        ),
    };
    // Kept until the next scale-up, so a failure stays visible after the pass that saw it.
    let scale_up = match (&report.create_failure, report.created, previous_scale_up) {
        (Some((code, message)), _, _) => condition(
            "ScaleUpFailed",
            ConditionStatus::True,
            code,
            message.clone(),
        ),
        (None, true, _) | (None, false, None) => condition(
            "ScaleUpFailed",
            ConditionStatus::False,
            "NoFailure",
            "the last scale-up ordered every server it needed".into(),
        ),
        (None, false, Some(previous)) => DesiredCondition {
            type_: "ScaleUpFailed",
            status: ConditionStatus::parse(&previous.status),
            reason: previous.reason.clone(),
            message: previous.message.clone(),
        },
    };
    let ready_condition = match blocked {
        Some(Blocked::Api(message)) => {
            condition("Ready", ConditionStatus::False, "ApiError", message.clone())
        }
        Some(_) => condition(
            "Ready",
            ConditionStatus::False,
            "Blocked",
            "see the InvalidSpec and BackendUnavailable conditions".into(),
        ),
        None if replicas != desired => condition(
            "Ready",
            ConditionStatus::False,
            "Scaling",
            format!("{replicas} of {desired} servers"),
        ),
        None if ready < desired => condition(
            "Ready",
            ConditionStatus::False,
            "WaitingForNodes",
            format!("{ready} of {desired} Nodes Ready"),
        ),
        None => condition(
            "Ready",
            ConditionStatus::True,
            "Ready",
            format!("{desired} servers with Ready Nodes"),
        ),
    };
    vec![ready_condition, invalid, backend, scale_up]
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::nodepool::backend::BackendError;
    use ngo_api::conditions::merge;
    use ngo_api::nodepool::NO_BACKEND;

    /// The conditions as (type, whether True, reason), and the message of `type_`.
    fn summary(conditions: &[DesiredCondition]) -> Vec<(&'static str, bool, String)> {
        conditions
            .iter()
            .map(|c| (c.type_, c.status == ConditionStatus::True, c.reason.clone()))
            .collect()
    }

    fn message<'a>(conditions: &'a [DesiredCondition], type_: &str) -> &'a str {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map_or("", |c| c.message.as_str())
    }

    #[test]
    fn a_pool_is_ready_only_with_every_server_and_every_node_ready() {
        let report = PassReport::default();
        let ready = |replicas, nodes| conditions(&None, &report, None, 3, replicas, nodes);
        let scaling = ready(2, 2);
        assert_eq!(summary(&scaling)[0], ("Ready", false, "Scaling".into()));
        assert_eq!(message(&scaling, "Ready"), "2 of 3 servers");
        let waiting = ready(3, 1);
        assert_eq!(
            summary(&waiting)[0],
            ("Ready", false, "WaitingForNodes".into())
        );
        assert_eq!(message(&waiting, "Ready"), "1 of 3 Nodes Ready");
        assert_eq!(
            summary(&ready(3, 3)),
            vec![
                ("Ready", true, "Ready".into()),
                ("InvalidSpec", false, "Valid".into()),
                ("BackendUnavailable", false, "Available".into()),
                ("ScaleUpFailed", false, "NoFailure".into()),
            ]
        );
    }

    #[test]
    fn a_blocked_pass_says_why_on_the_condition_that_names_the_cause() {
        let report = PassReport::default();
        let spec = Some(Blocked::Spec(
            "MissingSecret",
            "Secret ns/x has no key".into(),
        ));
        assert_eq!(
            summary(&conditions(&spec, &report, None, 1, 1, 1))[..3],
            [
                ("Ready", false, "Blocked".into()),
                ("InvalidSpec", true, "MissingSecret".into()),
                ("BackendUnavailable", false, "NotConnected".into()),
            ]
        );
        assert_eq!(
            conditions(&spec, &report, None, 1, 1, 1)[2].status,
            ConditionStatus::Unknown,
            "the backend is not called while the spec is invalid"
        );
        let backend = Some(Blocked::Backend(BackendError {
            kind: crate::nodepool::backend::BackendErrorKind::Unauthorized,
            message: "401 from GET plans".into(),
        }));
        let blocked = conditions(&backend, &report, None, 1, 1, 1);
        assert_eq!(
            summary(&blocked)[..3],
            [
                ("Ready", false, "Blocked".into()),
                ("InvalidSpec", false, "Valid".into()),
                (
                    "BackendUnavailable",
                    true,
                    crate::nodepool::backend::BackendErrorKind::Unauthorized
                        .as_str()
                        .into()
                ),
            ]
        );
        assert_eq!(
            message(&blocked, "BackendUnavailable"),
            "401 from GET plans"
        );
        let api = Some(Blocked::Api("conflict".into()));
        let failed = conditions(&api, &report, None, 1, 1, 1);
        assert_eq!(summary(&failed)[0], ("Ready", false, "ApiError".into()));
        assert_eq!(message(&failed, "Ready"), "conflict");
        let outside = PassReport {
            size_violation: Some("maxSize 9 above the scaling group's 5".into()),
            ..Default::default()
        };
        assert_eq!(
            summary(&conditions(&None, &outside, None, 1, 1, 1))[1],
            ("InvalidSpec", true, SIZE_OUTSIDE_BACKEND.into())
        );
    }

    #[test]
    fn a_scale_up_failure_stays_visible_until_a_later_pass_orders_servers() {
        let failing = PassReport {
            create_failure: Some(("OutOfStock".into(), "no e5 in eu-1".into())),
            ..Default::default()
        };
        let first = conditions(&None, &failing, None, 2, 1, 1);
        assert_eq!(
            summary(&first)[3],
            ("ScaleUpFailed", true, "OutOfStock".into())
        );
        let previous = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "ScaleUpFailed".into(),
            status: "True".into(),
            reason: "OutOfStock".into(),
            message: "no e5 in eu-1".into(),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::UNIX_EPOCH,
            ),
            observed_generation: None,
        };
        let quiet = PassReport::default();
        let kept = conditions(&None, &quiet, Some(&previous), 2, 1, 1);
        assert_eq!(
            summary(&kept)[3],
            ("ScaleUpFailed", true, "OutOfStock".into())
        );
        assert_eq!(message(&kept, "ScaleUpFailed"), "no e5 in eu-1");
        let ordered = PassReport {
            created: true,
            ..Default::default()
        };
        assert_eq!(
            summary(&conditions(&None, &ordered, Some(&previous), 2, 2, 1))[3],
            ("ScaleUpFailed", false, "NoFailure".into())
        );
    }

    #[test]
    fn what_a_pass_did_not_get_to_check_is_unknown() {
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let statuses = |blocked: Option<Blocked>, report: &PassReport| {
            merge(
                &[],
                &conditions(&blocked, report, None, 1, 1, 1),
                None,
                &now,
            )
            .into_iter()
            .map(|c| (c.type_, c.status, c.reason))
            .collect::<Vec<_>>()
        };
        let triple = |t: &str, s: &str, r: &str| (t.to_string(), s.to_string(), r.to_string());
        // Blocked before the backend was connected: the credentials Secret could not be read.
        let unconnected = PassReport::default();
        let api = statuses(
            Some(Blocked::Api("reading Secret ns/s: 500".into())),
            &unconnected,
        );
        assert_eq!(api[1], triple("InvalidSpec", "Unknown", "NotChecked"));
        assert_eq!(
            api[2],
            triple("BackendUnavailable", "Unknown", "NotConnected")
        );
        // An invalid spec: the backend is not called, so its availability is not known.
        let spec = statuses(
            Some(Blocked::Spec("NoBackend", NO_BACKEND.into())),
            &unconnected,
        );
        assert_eq!(spec[1], triple("InvalidSpec", "True", "NoBackend"));
        assert_eq!(
            spec[2],
            triple("BackendUnavailable", "Unknown", "NotConnected")
        );
        // The backend answered (list and bounds), then the pass stopped: it is available.
        let connected = PassReport {
            backend: Some("cherryServers"),
            ..Default::default()
        };
        let late_api = statuses(
            Some(Blocked::Api("adding finalizer: 409".into())),
            &connected,
        );
        assert_eq!(late_api[0], triple("Ready", "False", "ApiError"));
        assert_eq!(late_api[1], triple("InvalidSpec", "False", "Valid"));
        assert_eq!(
            late_api[2],
            triple("BackendUnavailable", "False", "Available")
        );
        let late_spec = statuses(
            Some(Blocked::Spec(
                "NodesUnreachable",
                "cannot read Nodes".into(),
            )),
            &connected,
        );
        assert_eq!(
            late_spec[1],
            triple("InvalidSpec", "True", "NodesUnreachable")
        );
        assert_eq!(
            late_spec[2],
            triple("BackendUnavailable", "False", "Available")
        );
    }
}
