//! The time a mutation has. A mutation runs detached from the RPC that asked for it, so it
//! needs its own bounds:
//!
//! - it may *start* a change (write a mark, raise replicas) only while the client still
//!   waits for the answer (its `grpc-timeout`): after that, cluster-autoscaler has already
//!   counted the request as failed, and nothing new is begun on its behalf;
//! - once a Machine is marked, the mutation may *finish* (decrement, or roll back) for a grace
//!   period longer than that: completing a half-done deletion is always safer than leaving a
//!   mark behind. Its Machine marks carry the end of that period, after which the sweeper may
//!   roll them back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// What cluster-autoscaler's externalgrpc client allows an RPC when its cloud-config does not
/// say (`defaultGRPCTimeout` in `externalgrpc_cloud_provider.go`).
pub const DEFAULT_CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest client timeout honoured; a client without one is given the default.
pub const MAX_CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long after the client gave up a started deletion may still finish (one decrement,
/// retried on conflicts, or a rollback).
pub const FINISH_GRACE: Duration = Duration::from_secs(10);

/// Longest time kept, before the client's deadline, for an answer to reach it: an OK that
/// arrives after the client gave up is an error to it (cluster-autoscaler then backs the group
/// off, or untaints a node that is deleted anyway).
pub const ANSWER_MARGIN: Duration = Duration::from_millis(500);

/// The margin kept for the answer within a client timeout of `wait`: a fifth of it, at most
/// [`ANSWER_MARGIN`].
pub fn answer_margin(wait: Duration) -> Duration {
    (wait / 5).min(ANSWER_MARGIN)
}

/// Bounds of one mutation. Clones share what the mutation has seen of its writes.
#[derive(Clone, Debug)]
pub struct MutationDeadline {
    answer_until: Instant,
    start_until: Instant,
    finish_until: Instant,
    finish_unix: i64,
    /// The longest write of this mutation so far, in microseconds (see
    /// [`MutationDeadline::wrote`]).
    slowest_write_micros: Arc<AtomicU64>,
}

impl MutationDeadline {
    /// Bounds for a request whose client waits `client_timeout` (from `grpc-timeout`).
    pub fn new(client_timeout: Option<Duration>) -> Self {
        let wait = client_timeout
            .unwrap_or(DEFAULT_CLIENT_TIMEOUT)
            .min(MAX_CLIENT_TIMEOUT);
        let now = Instant::now();
        let finish = wait + FINISH_GRACE;
        Self {
            answer_until: now + wait - answer_margin(wait),
            start_until: now + wait,
            finish_until: now + finish,
            finish_unix: jiff::Timestamp::now().as_second() + finish.as_secs() as i64 + 1,
            slowest_write_micros: Arc::default(),
        }
    }

    /// True while a new change may begin.
    pub fn may_start(&self) -> bool {
        Instant::now() < self.start_until
    }

    /// True while a write that decides the answer may be sent: its outcome can still reach
    /// the client in time. A claim, mark or decrement written later would act on a request
    /// cluster-autoscaler already counts as failed (and whose node it has untainted).
    pub fn may_answer(&self) -> bool {
        Instant::now() < self.answer_until
    }

    /// [`MutationDeadline::may_answer`] for a write expected to take `round_trip` (as long
    /// as the read just before it took), or as long as this mutation's slowest write so far
    /// if that took longer (a write waits for etcd to persist it, a read does not): its
    /// outcome, not only its start, must come before the answer's margin. On a slow or
    /// loaded API server a write sent in time but answered after the client's deadline
    /// would remove a node its client was told had failed.
    pub fn may_answer_within(&self, round_trip: Duration) -> bool {
        Instant::now() + round_trip.max(self.slowest_write()) < self.answer_until
    }

    /// Records that one of this mutation's writes took `took`.
    pub fn wrote(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.slowest_write_micros
            .fetch_max(micros, Ordering::Relaxed);
    }

    /// The longest write of this mutation so far.
    fn slowest_write(&self) -> Duration {
        Duration::from_micros(self.slowest_write_micros.load(Ordering::Relaxed))
    }

    /// True while a begun change may still be written or rolled back.
    pub fn may_finish(&self) -> bool {
        Instant::now() < self.finish_until
    }

    /// Unix seconds after which this mutation writes nothing more (recorded in marks).
    pub fn finish_unix(&self) -> i64 {
        self.finish_unix
    }

    /// Time left to start changes.
    pub fn start_remaining(&self) -> Duration {
        self.start_until.saturating_duration_since(Instant::now())
    }

    /// Time left for waiting before answering, with the answer's margin kept.
    pub fn answer_remaining(&self) -> Duration {
        self.answer_until.saturating_duration_since(Instant::now())
    }
}

/// A short pause before retrying a write that conflicted, spread so that replicas racing
/// for the same object do not retry in lockstep.
pub fn conflict_backoff(attempt: u32) -> Duration {
    let spread = u64::from(jiff::Timestamp::now().subsec_nanosecond().unsigned_abs() % 20);
    Duration::from_millis(10 * u64::from(attempt.min(10)) + spread)
}

/// Parses gRPC's `grpc-timeout` header (`<digits><unit>`, unit one of `H M S m u n`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_grpc_go_writes_them() {
        assert_eq!(
            parse_grpc_timeout("4999m"),
            Some(Duration::from_millis(4999))
        );
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("300u"), Some(Duration::from_micros(300)));
        assert_eq!(parse_grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "5", "5s", "-5S", "1234567890S", "5 S", "x5m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_write_that_would_answer_after_the_margin_is_not_sent() {
        let d = MutationDeadline::new(Some(Duration::from_secs(1)));
        assert!(d.may_answer_within(Duration::from_millis(100)));
        assert!(
            !d.may_answer_within(Duration::from_millis(850)),
            "a write taking 850 ms ends after the 800 ms the client leaves for writes"
        );
    }

    #[test]
    fn a_write_is_expected_to_take_as_long_as_the_slowest_write_before_it() {
        let d = MutationDeadline::new(Some(Duration::from_secs(1)));
        assert!(d.may_answer_within(Duration::from_millis(10)));
        d.clone().wrote(Duration::from_millis(850));
        assert!(
            !d.may_answer_within(Duration::from_millis(10)),
            "a fast read does not make the next write fast after a write took 850 ms"
        );
    }

    #[test]
    fn a_deadline_allows_finishing_after_starting_stops() {
        let d = MutationDeadline::new(Some(Duration::ZERO));
        assert!(!d.may_start());
        assert!(d.may_finish());
        assert!(d.finish_unix() > jiff::Timestamp::now().as_second());
        let generous = MutationDeadline::new(Some(Duration::from_secs(3600)));
        assert!(generous.start_remaining() <= MAX_CLIENT_TIMEOUT);
    }

    #[test]
    fn waits_before_answering_keep_a_margin_for_the_answer() {
        let d = MutationDeadline::new(Some(Duration::from_secs(5)));
        assert!(d.answer_remaining() <= Duration::from_millis(4500));
        assert!(d.answer_remaining() > Duration::from_millis(4000));
        let short = MutationDeadline::new(Some(Duration::from_millis(100)));
        assert!(short.answer_remaining() <= Duration::from_millis(80));
        assert!(short.start_remaining() > short.answer_remaining());
        assert_eq!(answer_margin(Duration::from_secs(60)), ANSWER_MARGIN);
    }
}
