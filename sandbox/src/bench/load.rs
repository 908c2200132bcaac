//! The one load client every server is measured with: tonic over mTLS on loopback, a fixed
//! number of HTTP/2 connections shared by a fixed number of workers, so that the operator and
//! the upstream example server see exactly the same client, connections and concurrency.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ngo_service::proto::cloud_provider_client::CloudProviderClient;
use rand::{Rng as _, SeedableRng as _};
use serde::Serialize;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A gRPC client of a server under test.
pub type Client = CloudProviderClient<Channel>;

/// The largest response the client accepts (`NodeGroups` at 1,000 groups is ~100 KiB; the
/// upstream example server puts a `Debug` string on every group).
const MAX_MESSAGE_BYTES: usize = 64 << 20;

/// Opens one HTTP/2 connection to `address` over mTLS: the server is verified against `ca`
/// as `localhost` (both servers use the same serving certificate), and the client presents
/// `identity` (certificate, key).
pub async fn connect(
    address: SocketAddr,
    ca: &Path,
    identity: &(PathBuf, PathBuf),
) -> anyhow::Result<Client> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)?))
        .identity(Identity::from_pem(read(&identity.0)?, read(&identity.1)?))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://{address}"))
        .context("gRPC endpoint")?
        .tls_config(tls)
        .context("gRPC TLS configuration")?
        .connect()
        .await
        .with_context(|| format!("connecting to {address}"))?;
    Ok(CloudProviderClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Opens one HTTP/2 connection in plaintext to the Unix socket `path` (the co-located mode's,
/// or a relay's), as cluster-autoscaler's `unix://` address does.
pub async fn connect_unix(path: &Path) -> anyhow::Result<Client> {
    let socket = path.to_path_buf();
    // The URI is not dialled: every connection goes to the socket.
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .with_context(|| format!("connecting to {}", path.display()))?;
    Ok(CloudProviderClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// One RPC of a load: called with a client and a random number (to pick a node or group),
/// resolves to the RPC's outcome.
pub type Call = Arc<
    dyn Fn(Client, u64) -> Pin<Box<dyn Future<Output = Result<(), tonic::Status>> + Send>>
        + Send
        + Sync,
>;

/// Wraps a closure as a [`Call`].
pub fn call<F, Fut>(f: F) -> Call
where
    F: Fn(Client, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), tonic::Status>> + Send + 'static,
{
    Arc::new(move |client, n| Box::pin(f(client, n)))
}

/// What a closed-loop load achieved.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Throughput {
    /// RPCs answered OK inside the measured window.
    pub ok: u64,
    /// RPCs that failed inside the measured window.
    pub errors: u64,
    /// Length of the measured window.
    pub seconds: f64,
    /// `ok / seconds`.
    pub rps: f64,
    /// The first failure, to tell a broken setup from a slow one.
    pub first_error: Option<String>,
}

impl Throughput {
    /// Adds another window's figures to these: the rate over both windows.
    pub fn add(&mut self, other: &Throughput) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.seconds += other.seconds;
        self.rps = if self.seconds > 0.0 {
            self.ok as f64 / self.seconds
        } else {
            0.0
        };
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
    }
}

/// Runs `concurrency` workers, worker `w` calling `calls[w % calls.len()]` back to back on
/// `clients[w % clients.len()]`, for `warmup` (not counted) and then `window`. Only RPCs that
/// complete inside the window count; workers stop issuing at its end and this waits for
/// their last RPCs, so the next measurement starts on an idle server.
pub async fn throughput(
    clients: &[Client],
    calls: &[Call],
    concurrency: usize,
    warmup: Duration,
    window: Duration,
    per_call_timeout: Duration,
) -> Throughput {
    let start = Instant::now() + warmup;
    let end = start + window;
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let client = clients[worker % clients.len()].clone();
        let call = calls[worker % calls.len()].clone();
        workers.spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(worker as u64);
            let mut tally = Throughput::default();
            while Instant::now() < end {
                let result =
                    tokio::time::timeout(per_call_timeout, call(client.clone(), rng.random()))
                        .await
                        .unwrap_or_else(|_| {
                            Err(tonic::Status::deadline_exceeded("client-side timeout"))
                        });
                let done = Instant::now();
                if done < start || done > end {
                    continue;
                }
                match result {
                    Ok(()) => tally.ok += 1,
                    Err(status) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert_with(|| {
                            format!("{:?}: {}", status.code(), status.message())
                        });
                    }
                }
            }
            tally
        });
    }
    let mut total = Throughput {
        seconds: window.as_secs_f64(),
        ..Default::default()
    };
    while let Some(joined) = workers.join_next().await {
        let Ok(tally) = joined else { continue };
        total.ok += tally.ok;
        total.errors += tally.errors;
        if total.first_error.is_none() {
            total.first_error = tally.first_error;
        }
    }
    total.rps = total.ok as f64 / total.seconds;
    total
}

/// Latency of one RPC called back to back by one client.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    /// Calls that answered OK.
    pub samples: usize,
    /// Median, milliseconds.
    pub p50_ms: Option<f64>,
    /// 99th percentile (nearest rank), milliseconds; the maximum below 100 samples.
    pub p99_ms: Option<f64>,
    /// Set when a call did not answer within the per-call limit: the lower bound it proves.
    pub bound_ms: Option<f64>,
    /// Calls that failed otherwise.
    pub errors: usize,
    /// The first failure.
    pub first_error: Option<String>,
}

impl Latency {
    /// The median, or the bound when no call finished.
    pub fn p50_or_bound(&self) -> Option<f64> {
        self.p50_ms.or(self.bound_ms)
    }
}

/// Calls `call` back to back (unloaded latency) until `max_samples` answered or `budget` is
/// spent (at least one call is made). A call still running after `per_call_timeout` ends the
/// series with that bound.
pub async fn latency(
    client: &Client,
    max_samples: usize,
    budget: Duration,
    per_call_timeout: Duration,
    call: Call,
) -> Latency {
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut result = Latency::default();
    let mut n: u64 = 0;
    while samples.len() < max_samples && (n == 0 || started.elapsed() < budget) {
        n += 1;
        let begin = Instant::now();
        match tokio::time::timeout(per_call_timeout, call(client.clone(), n)).await {
            Ok(Ok(())) => samples.push(begin.elapsed()),
            Ok(Err(status)) => {
                result.errors += 1;
                result
                    .first_error
                    .get_or_insert_with(|| format!("{:?}: {}", status.code(), status.message()));
                if result.errors > max_samples.max(10) {
                    break;
                }
            }
            Err(_) => {
                result.bound_ms = Some(ms(per_call_timeout));
                break;
            }
        }
    }
    result.samples = samples.len();
    result.p50_ms = percentile(&mut samples, 0.50).map(ms);
    result.p99_ms = percentile(&mut samples, 0.99).map(ms);
    result
}

/// Nearest-rank percentile `p` (0..=1) of `samples`; `None` when empty.
pub fn percentile(samples: &mut [Duration], p: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = (p * samples.len() as f64).ceil() as usize;
    Some(samples[rank.clamp(1, samples.len()) - 1])
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(
            percentile(&mut samples, 0.5),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            percentile(&mut samples, 0.99),
            Some(Duration::from_millis(99))
        );
        let mut two = vec![Duration::from_millis(9), Duration::from_millis(1)];
        assert_eq!(percentile(&mut two, 0.99), Some(Duration::from_millis(9)));
        assert_eq!(percentile(&mut two, 0.5), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&mut [], 0.5), None);
    }

    #[test]
    fn rounds_add_up_to_the_rate_over_all_of_them() {
        let mut total = Throughput::default();
        let round = |ok, seconds, error: Option<&str>| Throughput {
            ok,
            errors: u64::from(error.is_some()),
            seconds,
            rps: ok as f64 / seconds,
            first_error: error.map(String::from),
        };
        total.add(&round(300, 2.0, None));
        total.add(&round(100, 2.0, Some("Unavailable: gone")));
        total.add(&round(200, 1.0, Some("later")));
        assert_eq!((total.ok, total.errors), (600, 2));
        assert_eq!(total.seconds, 5.0);
        assert_eq!(total.rps, 120.0);
        assert_eq!(total.first_error.as_deref(), Some("Unavailable: gone"));
    }
}
