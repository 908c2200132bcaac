//! What one reconcile pass of a NodePool does, decided from what was observed: the pool's
//! desired replicas and scale-down ledger, the instances its status recorded, the servers its
//! backend lists and the Nodes registered. Pure, so every rule below is tested without a
//! cloud:
//!
//! - a server is a member when its backend tags name the pool (servers created by
//!   cluster-autoscaler's in-tree provider included); it is matched to its status entry by id,
//!   else by the creation request its tag names;
//! - a member in the ledger (cluster-autoscaler's DeleteNodes applied its decrement) or
//!   recorded as deleting is deleted, every pass until the backend reports it terminating;
//! - a creation in flight (recorded before the create call, no id yet) counts towards the
//!   size until its server appears, or until [`CREATE_GRACE`] has passed: the call then died
//!   before the server existed, and the pool may create again. Creations are never retried
//!   within the grace, so a lost answer never makes two servers;
//! - a failed creation counts until cluster-autoscaler deletes it (its id in the ledger) or
//!   [`FAILED_RETENTION`] has passed, so the autoscaler sees the failure and picks another
//!   group rather than the pool retrying into the same error;
//! - the pool grows by at most `max_creates` per pass; it shrinks (a manual scale-down)
//!   by dropping failed creations first, then deleting unregistered servers, then the newest,
//!   and never for a size that creations in flight may yet make up.

use std::collections::{BTreeSet, HashMap};

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::view::FAILED_ID_PREFIX;
use ngo_api::nodepool::{InstanceStateName, PoolInstance};
use ngo_index::capi::providerid;
use ngo_index::capi::scale_down::{Ledger, pool_instance_key};

/// How long a creation without a server is waited for.
pub const CREATE_GRACE: SignedDuration = SignedDuration::from_secs(180);
/// How long a failed creation is reported before it is forgotten.
pub const FAILED_RETENTION: SignedDuration = SignedDuration::from_secs(600);

/// Lifecycle of a server as its backend reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberPhase {
    /// Ordered, being installed.
    Provisioning,
    /// Running (the Node may not have registered yet).
    Active,
    /// Being deleted.
    Terminating,
}

/// A server of the pool as its backend lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Backend id.
    pub id: String,
    /// Provider ID its Node carries.
    pub provider_id: String,
    /// Hostname (the Node name once it joins).
    pub hostname: String,
    /// Lifecycle.
    pub phase: MemberPhase,
    /// The creation request its tags name, when created by this operator.
    pub request: Option<String>,
    /// Creation time, when the backend reports it.
    pub created: Option<Timestamp>,
}

/// A registered Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenNode {
    /// Node name.
    pub name: String,
    /// Ready condition is True.
    pub ready: bool,
}

/// What a pass observed.
pub struct Observed<'a> {
    /// `spec.replicas`.
    pub desired: i32,
    /// `status.instances` as last written.
    pub previous: &'a [PoolInstance],
    /// The servers the backend lists for the pool.
    pub members: &'a [Member],
    /// The pool's scale-down ledger.
    pub ledger: &'a Ledger,
    /// Registered Nodes by normalized provider ID.
    pub nodes: &'a HashMap<String, SeenNode>,
    /// Now.
    pub now: Timestamp,
    /// Most creations one pass starts.
    pub max_creates: usize,
}

/// Why an entry left the status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// A creation whose server never appeared within [`CREATE_GRACE`].
    CreationLost { request: String },
    /// A failed creation cluster-autoscaler deleted.
    FailureDeleted { request: String },
    /// A failed creation older than [`FAILED_RETENTION`].
    FailureExpired { request: String },
    /// A failed creation removed by a manual scale-down.
    FailureScaledDown { request: String },
    /// A server that is gone from the backend.
    ServerGone { id: String },
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// The status instances after this pass (before creations are added).
    pub instances: Vec<PoolInstance>,
    /// Servers to delete (ids), each already `Deleting` in `instances`.
    pub delete: Vec<String>,
    /// Servers to create.
    pub create: usize,
    /// Entries dropped from the status, and why.
    pub dropped: Vec<Dropped>,
}

impl Decision {
    /// Instances that count towards the pool's size (not deleting).
    pub fn live(&self) -> usize {
        self.instances
            .iter()
            .filter(|i| i.state != Some(InstanceStateName::Deleting))
            .count()
    }
}

/// Whether a pass may record its intents over the pool's `current` status instances, having
/// last seen or written `recorded` there: only when nobody else changed them meanwhile, so
/// two reconcilers of one pool (a handover, a stalled leader) never both act on a pass.
pub fn intents_may_land(current: &[PoolInstance], recorded: &[PoolInstance]) -> bool {
    current == recorded
}

/// Decides one pass.
pub fn decide(o: &Observed<'_>) -> Decision {
    let mut decision = Decision::default();
    let by_id: HashMap<&str, &PoolInstance> = o
        .previous
        .iter()
        .filter_map(|i| Some((i.id.as_deref()?, i)))
        .collect();
    let by_request: HashMap<&str, &PoolInstance> =
        o.previous.iter().map(|i| (i.request.as_str(), i)).collect();
    let mut matched: BTreeSet<&str> = BTreeSet::new();

    for m in o.members {
        let previous = by_id.get(m.id.as_str()).copied().or_else(|| {
            m.request
                .as_deref()
                .and_then(|r| by_request.get(r).copied())
        });
        if let Some(p) = previous {
            matched.insert(p.request.as_str());
        }
        let request = previous
            .map(|p| p.request.clone())
            .or_else(|| m.request.clone())
            .unwrap_or_else(|| format!("adopted-{}", m.id));
        let in_ledger = o.ledger.get(&pool_instance_key(&m.provider_id)).is_some();
        let was_deleting = previous.is_some_and(|p| p.state == Some(InstanceStateName::Deleting));
        let node = o.nodes.get(providerid::normalize(&m.provider_id));
        let state = if m.phase == MemberPhase::Terminating || in_ledger || was_deleting {
            InstanceStateName::Deleting
        } else if node.is_some() {
            InstanceStateName::Running
        } else {
            InstanceStateName::Creating
        };
        if (in_ledger || was_deleting) && m.phase != MemberPhase::Terminating {
            decision.delete.push(m.id.clone());
        }
        decision.instances.push(PoolInstance {
            id: Some(m.id.clone()),
            provider_id: Some(m.provider_id.clone()),
            hostname: m.hostname.clone(),
            state: Some(state),
            request,
            node: node.map(|n| n.name.clone()),
            created: previous
                .and_then(|p| p.created.clone())
                .or_else(|| m.created.map(Time)),
            error: None,
            deletion: previous.and_then(|p| p.deletion.clone()),
        });
    }

    for p in o.previous {
        if matched.contains(p.request.as_str()) {
            continue;
        }
        let age = p
            .created
            .as_ref()
            .map(|c| o.now.duration_since(c.0))
            .unwrap_or(SignedDuration::MAX);
        let request = p.request.clone();
        let failed = p.state == Some(InstanceStateName::Failed);
        let failed_id = p.provider_id.as_deref().filter(|_| failed);
        match (p.id.as_deref(), failed_id) {
            (_, Some(id)) => {
                if o.ledger.get(&pool_instance_key(id)).is_some() {
                    decision.dropped.push(Dropped::FailureDeleted { request });
                } else if age > FAILED_RETENTION {
                    decision.dropped.push(Dropped::FailureExpired { request });
                } else {
                    decision.instances.push(p.clone());
                }
            }
            (Some(id), None) => decision.dropped.push(Dropped::ServerGone { id: id.into() }),
            (None, None) if age <= CREATE_GRACE => decision.instances.push(p.clone()),
            (None, None) => decision.dropped.push(Dropped::CreationLost { request }),
        }
    }

    let desired = usize::try_from(o.desired).unwrap_or(0);
    let live = decision.live();
    if live < desired {
        decision.create = (desired - live).min(o.max_creates);
    } else if live > desired {
        shrink(&mut decision, live - desired);
    }
    decision.instances.sort_by(|a, b| {
        (a.created.as_ref().map(|t| t.0), &a.hostname, &a.request).cmp(&(
            b.created.as_ref().map(|t| t.0),
            &b.hostname,
            &b.request,
        ))
    });
    decision
}

/// Why a pool's min/max (`bounds`: the served ones, which a NodeGroupPolicy may supply)
/// do not fit the backend's own `[MinSize, MaxSize]`; `None` when they do.
pub fn size_outside(bounds: (Option<i32>, Option<i32>), backend: (i32, i32)) -> Option<String> {
    let (backend_min, backend_max) = backend;
    let mut problems = Vec::new();
    if let Some(min) = bounds.0.filter(|m| *m < backend_min) {
        problems.push(format!(
            "min size {min} is below the group's MinSize {backend_min}"
        ));
    }
    if let Some(max) = bounds.1.filter(|m| *m > backend_max) {
        problems.push(format!(
            "max size {max} is above the group's MaxSize {backend_max}"
        ));
    }
    (!problems.is_empty()).then(|| {
        format!(
            "{}; the pool is kept within [{backend_min}, {backend_max}]",
            problems.join(" and ")
        )
    })
}

/// Removes `excess` instances: failed creations first, then servers without a Node, then
/// the newest; never a server for a size that creations in flight may yet make up.
fn shrink(decision: &mut Decision, mut excess: usize) {
    let is_failed = |i: &PoolInstance| i.state == Some(InstanceStateName::Failed);
    let mut failed: Vec<usize> = (0..decision.instances.len())
        .filter(|&k| is_failed(&decision.instances[k]))
        .collect();
    failed.sort_by_key(|&k| std::cmp::Reverse(created(&decision.instances[k])));
    let mut drop_indices = BTreeSet::new();
    for k in failed.into_iter().take(excess) {
        drop_indices.insert(k);
        excess -= 1;
    }
    let in_flight = decision
        .instances
        .iter()
        .filter(|i| i.id.is_none() && !is_failed(i))
        .count();
    let mut to_delete = excess.saturating_sub(in_flight);
    let mut candidates: Vec<usize> = (0..decision.instances.len())
        .filter(|&k| {
            let i = &decision.instances[k];
            i.id.is_some()
                && matches!(
                    i.state,
                    Some(InstanceStateName::Creating | InstanceStateName::Running)
                )
        })
        .collect();
    // Unregistered first, then newest first.
    candidates.sort_by_key(|&k| {
        let i = &decision.instances[k];
        (
            i.state == Some(InstanceStateName::Running),
            std::cmp::Reverse(created(i)),
        )
    });
    for k in candidates {
        if to_delete == 0 {
            break;
        }
        let instance = &mut decision.instances[k];
        instance.state = Some(InstanceStateName::Deleting);
        if let Some(id) = &instance.id {
            decision.delete.push(id.clone());
        }
        to_delete -= 1;
    }
    for k in drop_indices.into_iter().rev() {
        let removed = decision.instances.remove(k);
        decision.dropped.push(Dropped::FailureScaledDown {
            request: removed.request,
        });
    }
}

fn created(i: &PoolInstance) -> Option<Timestamp> {
    i.created.as_ref().map(|t| t.0)
}

/// True for the provider ID of a failed creation.
pub fn is_failed_id(provider_id: &str) -> bool {
    provider_id.starts_with(FAILED_ID_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ngo_api::nodepool::InstanceErrorStatus;

    const NOW: i64 = 1_800_000_000;

    fn at(secs_ago: i64) -> Timestamp {
        Timestamp::from_second(NOW - secs_ago).unwrap()
    }

    fn member(id: u32, phase: MemberPhase, request: Option<&str>, age: i64) -> Member {
        Member {
            id: id.to_string(),
            provider_id: format!("cherryservers://{id}"),
            hostname: format!("h{id}"),
            phase,
            request: request.map(String::from),
            created: Some(at(age)),
        }
    }

    fn entry(id: Option<u32>, state: InstanceStateName, request: &str, age: i64) -> PoolInstance {
        PoolInstance {
            id: id.map(|i| i.to_string()),
            provider_id: id.map(|i| format!("cherryservers://{i}")),
            hostname: format!("h{}", id.unwrap_or(0)),
            state: Some(state),
            request: request.into(),
            node: None,
            created: Some(Time(at(age))),
            error: None,
            deletion: None,
        }
    }

    fn failed(request: &str, age: i64) -> PoolInstance {
        PoolInstance {
            provider_id: Some(format!("{FAILED_ID_PREFIX}ns_p_{request}")),
            error: Some(InstanceErrorStatus {
                class: "OutOfResources".into(),
                code: "OutOfStock".into(),
                message: "no stock".into(),
            }),
            ..entry(None, InstanceStateName::Failed, request, age)
        }
    }

    fn nodes(ids: &[u32]) -> HashMap<String, SeenNode> {
        ids.iter()
            .map(|i| {
                (
                    i.to_string(),
                    SeenNode {
                        name: format!("h{i}"),
                        ready: true,
                    },
                )
            })
            .collect()
    }

    fn decide_with(
        desired: i32,
        previous: &[PoolInstance],
        members: &[Member],
        ledger: &Ledger,
        registered: &[u32],
    ) -> Decision {
        decide(&Observed {
            desired,
            previous,
            members,
            ledger,
            nodes: &nodes(registered),
            now: at(0),
            max_creates: 10,
        })
    }

    fn states(d: &Decision) -> Vec<(Option<String>, InstanceStateName)> {
        d.instances
            .iter()
            .map(|i| (i.id.clone(), i.state.unwrap()))
            .collect()
    }

    #[test]
    fn bounds_outside_the_backends_are_named() {
        assert_eq!(size_outside((Some(0), Some(10)), (0, 10)), None);
        assert_eq!(size_outside((None, None), (2, 5)), None);
        assert_eq!(
            size_outside((Some(1), Some(12)), (2, 10)).as_deref(),
            Some(
                "min size 1 is below the group's MinSize 2 and max size 12 is above the group's MaxSize 10; the pool is kept within [2, 10]"
            )
        );
    }

    #[test]
    fn grows_to_the_desired_size_in_bounded_steps() {
        let d = decide_with(3, &[], &[], &Ledger::default(), &[]);
        assert_eq!((d.create, d.delete.len()), (3, 0));
        let d = decide(&Observed {
            desired: 50,
            previous: &[],
            members: &[],
            ledger: &Ledger::default(),
            nodes: &HashMap::new(),
            now: at(0),
            max_creates: 10,
        });
        assert_eq!(d.create, 10);
    }

    #[test]
    fn a_creation_in_flight_counts_until_its_server_appears_or_the_grace_ends() {
        let in_flight = [entry(None, InstanceStateName::Creating, "r1", 30)];
        let d = decide_with(1, &in_flight, &[], &Ledger::default(), &[]);
        assert_eq!(d.create, 0, "no second server while the first may exist");
        assert_eq!(d.instances.len(), 1);

        // Its server appears, tagged with the request: matched, id recorded.
        let m = [member(7, MemberPhase::Provisioning, Some("r1"), 20)];
        let d = decide_with(1, &in_flight, &m, &Ledger::default(), &[]);
        assert_eq!(d.create, 0);
        assert_eq!(
            states(&d),
            vec![(Some("7".into()), InstanceStateName::Creating)]
        );
        assert_eq!(d.instances[0].request, "r1");

        // Never appeared within the grace: dropped, created again.
        let lost = [entry(None, InstanceStateName::Creating, "r1", 181)];
        let d = decide_with(1, &lost, &[], &Ledger::default(), &[]);
        assert_eq!(d.create, 1);
        assert_eq!(
            d.dropped,
            vec![Dropped::CreationLost {
                request: "r1".into()
            }]
        );
    }

    #[test]
    fn servers_are_running_once_their_node_registers() {
        let m = [
            member(1, MemberPhase::Active, Some("a"), 100),
            member(2, MemberPhase::Active, Some("b"), 50),
        ];
        let d = decide_with(2, &[], &m, &Ledger::default(), &[1]);
        assert_eq!(
            states(&d),
            vec![
                (Some("1".into()), InstanceStateName::Running),
                (Some("2".into()), InstanceStateName::Creating)
            ]
        );
        assert_eq!(d.instances[0].node.as_deref(), Some("h1"));
        assert_eq!((d.create, d.delete.len()), (0, 0));
    }

    #[test]
    fn servers_in_the_ledger_are_deleted_until_the_backend_says_terminating() {
        let mut ledger = Ledger::default();
        ledger.record(&pool_instance_key("cherryservers://2"), "q", NOW, |_| true);
        let m = [
            member(1, MemberPhase::Active, None, 100),
            member(2, MemberPhase::Active, None, 50),
        ];
        // CA lowered replicas to 1 and recorded server 2.
        let d = decide_with(1, &[], &m, &ledger, &[1, 2]);
        assert_eq!(d.delete, vec!["2".to_string()]);
        assert_eq!((d.create, d.live()), (0, 1));
        assert_eq!(d.instances[1].request, "adopted-2");

        let m = [
            member(1, MemberPhase::Active, None, 100),
            member(2, MemberPhase::Terminating, None, 50),
        ];
        let d = decide_with(1, &d.instances, &m, &ledger, &[1]);
        assert!(d.delete.is_empty());
        assert_eq!(d.live(), 1);
        // Gone from the backend: dropped.
        let d = decide_with(1, &d.instances, &m[..1], &ledger, &[1]);
        assert_eq!(d.dropped, vec![Dropped::ServerGone { id: "2".into() }]);
    }

    #[test]
    fn a_deletion_recorded_in_status_is_repeated_not_replaced_by_another() {
        let previous = [
            entry(Some(1), InstanceStateName::Running, "a", 100),
            entry(Some(2), InstanceStateName::Deleting, "b", 50),
        ];
        // The backend still lists 2 as active (delete not yet seen): delete 2 again, and
        // nothing else.
        let m = [
            member(1, MemberPhase::Active, Some("a"), 100),
            member(2, MemberPhase::Active, Some("b"), 50),
        ];
        let d = decide_with(1, &previous, &m, &Ledger::default(), &[1, 2]);
        assert_eq!(d.delete, vec!["2".to_string()]);
        assert_eq!(d.live(), 1);
    }

    #[test]
    fn failures_count_until_the_autoscaler_deletes_them_or_they_expire() {
        let previous = [
            entry(Some(1), InstanceStateName::Running, "a", 100),
            failed("f1", 30),
        ];
        let m = [member(1, MemberPhase::Active, Some("a"), 100)];
        let d = decide_with(2, &previous, &m, &Ledger::default(), &[1]);
        assert_eq!(d.create, 0, "a failure is not retried by the pool");
        assert_eq!(d.live(), 2);

        let mut ledger = Ledger::default();
        ledger.record(
            &pool_instance_key(&format!("{FAILED_ID_PREFIX}ns_p_f1")),
            "q",
            NOW,
            |_| true,
        );
        let d = decide_with(1, &previous, &m, &ledger, &[1]);
        assert_eq!(
            d.dropped,
            vec![Dropped::FailureDeleted {
                request: "f1".into()
            }]
        );
        assert_eq!((d.create, d.live()), (0, 1));

        let old = [previous[0].clone(), failed("f1", 601)];
        let d = decide_with(2, &old, &m, &Ledger::default(), &[1]);
        assert_eq!(
            d.create, 1,
            "an expired failure makes room for a new attempt"
        );
    }

    #[test]
    fn a_manual_scale_down_drops_failures_then_unregistered_then_newest() {
        let previous = [failed("f1", 30)];
        let m = [
            member(1, MemberPhase::Active, Some("a"), 300),
            member(2, MemberPhase::Active, Some("b"), 200),
            member(3, MemberPhase::Active, Some("c"), 100),
            member(4, MemberPhase::Active, Some("d"), 250),
        ];
        // 5 live (4 servers + 1 failure), 2 wanted: failure, then 4 (no node), then 3 (newest).
        let d = decide_with(2, &previous, &m, &Ledger::default(), &[1, 2, 3]);
        assert_eq!(
            d.dropped,
            vec![Dropped::FailureScaledDown {
                request: "f1".into()
            }]
        );
        assert_eq!(d.delete, vec!["4".to_string(), "3".to_string()]);
        assert_eq!(d.live(), 2);
    }

    #[test]
    fn no_server_is_deleted_for_a_size_creations_in_flight_may_make_up() {
        let previous = [
            entry(Some(1), InstanceStateName::Running, "a", 300),
            entry(None, InstanceStateName::Creating, "b", 10),
        ];
        let m = [member(1, MemberPhase::Active, Some("a"), 300)];
        // CA's DecreaseTargetSize took back the upcoming node: 2 live, 1 wanted.
        let d = decide_with(1, &previous, &m, &Ledger::default(), &[1]);
        assert!(d.delete.is_empty(), "{d:?}");
        // Once it exists, the unregistered newcomer goes rather than the registered node.
        let m = [
            member(1, MemberPhase::Active, Some("a"), 300),
            member(2, MemberPhase::Provisioning, Some("b"), 5),
        ];
        let d = decide_with(1, &previous, &m, &Ledger::default(), &[1]);
        assert_eq!(d.delete, vec!["2".to_string()]);
    }

    #[test]
    fn servers_created_elsewhere_are_adopted() {
        let m = [member(9, MemberPhase::Active, None, 100)];
        let d = decide_with(1, &[], &m, &Ledger::default(), &[9]);
        assert_eq!(d.instances[0].request, "adopted-9");
        assert_eq!((d.create, d.delete.len()), (0, 0));
    }
}
