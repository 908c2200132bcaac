//! RPC latency and codes, including RPCs dropped before they answer.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Static strings: recording an RPC allocates nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: &'static str,
    code: &'static str,
}

/// `grpc_request_duration_seconds`.
pub struct RpcFamilies {
    duration: Family<RpcLabels, Histogram>,
}

impl Default for RpcFamilies {
    fn default() -> Self {
        Self {
            duration: Family::new_with_constructor(|| {
                Histogram::new([
                    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0,
                ])
            }),
        }
    }
}

impl RpcFamilies {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_request_duration_seconds",
            "Latency of externalgrpc RPCs by method and gRPC code (grpc-go's names: OK, NotFound, ...); RPCs the client's deadline or a reset cut off are DeadlineExceeded or Canceled",
            self.duration.clone(),
        );
    }
}

/// The name of a gRPC status code in the `code` label: grpc-go's `codes.Code.String()`
/// (`OK`, `Canceled`, `InvalidArgument`, `DeadlineExceeded`, `NotFound`, ...), the values
/// go-grpc-prometheus and grpc-go's own metrics put in their `grpc_code` label, so that the
/// operator's series read like those of every other gRPC server.
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

impl RpcFamilies {
    /// Records one RPC (its code as [`grpc_code_name`] names it).
    pub(super) fn observe(&self, method: &'static str, code: tonic::Code, elapsed: Duration) {
        self.duration
            .get_or_create(&RpcLabels {
                method,
                code: grpc_code_name(code),
            })
            .observe(elapsed.as_secs_f64());
    }
}

/// Observes one RPC even when it never answers: tonic drops a handler's future when the
/// client's deadline (its `grpc-timeout`) passes or its stream is reset, and such calls must
/// still show in the RPC metrics, with the time they took. Dropped before
/// [`UnansweredRpc::answered`], the RPC is recorded as `DeadlineExceeded` when the client's
/// deadline had passed (see [`UnansweredRpc::client_deadline`]) and as `Canceled` otherwise.
pub struct UnansweredRpc<'a> {
    metrics: &'a RpcFamilies,
    method: &'static str,
    start: Instant,
    client_deadline: Option<Duration>,
    answered: bool,
}

impl<'a> UnansweredRpc<'a> {
    /// Starts timing `method`.
    pub fn new(metrics: &'a RpcFamilies, method: &'static str) -> Self {
        Self {
            metrics,
            method,
            start: Instant::now(),
            client_deadline: None,
            answered: false,
        }
    }

    /// The time the client allows the RPC (its `grpc-timeout`), counted from the start.
    pub fn client_deadline(mut self, timeout: Option<Duration>) -> Self {
        self.client_deadline = timeout;
        self
    }

    /// The RPC answered: its caller records the code.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// The code of an RPC dropped `elapsed` after it started: `DeadlineExceeded` once the
    /// client's deadline has passed, `Canceled` before. The deadline counts as passed a
    /// twentieth of it early: the server's timer starts when the request arrives, this one
    /// when its handler first runs, and a client whose deadline passes resets the stream at
    /// about the time the server's timer fires.
    pub(super) fn dropped_code(&self, elapsed: Duration) -> tonic::Code {
        match self.client_deadline {
            Some(deadline) if elapsed + deadline / 20 >= deadline => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::Cancelled,
        }
    }
}

impl Drop for UnansweredRpc<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let elapsed = self.start.elapsed();
            let code = self.dropped_code(elapsed);
            tracing::info!(
                method = self.method,
                ?elapsed,
                code = grpc_code_name(code),
                "rpc dropped before answering (client deadline or reset)"
            );
            self.metrics.observe(self.method, code, elapsed);
        }
    }
}
