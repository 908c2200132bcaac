//! What the network hop ([`ngo_testbed::hop::NetworkHop`]) itself costs per round trip,
//! beyond the delay it is asked for: a delay line of threads on a shared machine wakes a little
//! late, and every RPC through it pays that. Measured two ways, each as many sequential round
//! trips directly and through a hop of each delay:
//!
//! - gRPC: the empty `GPULabel` RPC over mTLS to the operator, as cluster-autoscaler's remote
//!   calls travel (HTTP/2 frames through the hop in both directions);
//! - TCP: one byte to an echo thread and back, the hop alone.
//!
//! The extra cost is `through the hop - direct - 2 x delay`, as a mean (a loop's time is the
//! sum of its round trips, so the mean is what adds up) and a median.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ngo_service::proto;
use serde::Serialize;

use super::load;
use crate::operator::GrpcPki;
use ngo_testbed::hop::NetworkHop;

/// Round trips made before the timed ones (connections and caches warm).
const WARMUP: usize = 20;

/// One delay's calibration.
#[derive(Clone, Debug, Serialize)]
pub struct HopCalibration {
    /// The delay asked for, ms each way.
    pub delay_ms: f64,
    /// Round trips timed per series.
    pub samples: usize,
    /// gRPC: mean and median round trip directly, µs.
    pub grpc_direct_mean_us: f64,
    /// See `grpc_direct_mean_us`.
    pub grpc_direct_p50_us: f64,
    /// gRPC: mean and median round trip through the hop, µs.
    pub grpc_hop_mean_us: f64,
    /// See `grpc_hop_mean_us`.
    pub grpc_hop_p50_us: f64,
    /// TCP: mean and median round trip directly, µs.
    pub tcp_direct_mean_us: f64,
    /// See `tcp_direct_mean_us`.
    pub tcp_direct_p50_us: f64,
    /// TCP: mean and median round trip through the hop, µs.
    pub tcp_hop_mean_us: f64,
    /// See `tcp_hop_mean_us`.
    pub tcp_hop_p50_us: f64,
}

impl HopCalibration {
    /// What the hop adds to a gRPC round trip beyond twice its delay (mean), µs.
    pub fn grpc_extra_us(&self) -> f64 {
        self.grpc_hop_mean_us - self.grpc_direct_mean_us - 2.0 * self.delay_ms * 1e3
    }

    /// What the hop adds to a TCP round trip beyond twice its delay (mean), µs.
    pub fn tcp_extra_us(&self) -> f64 {
        self.tcp_hop_mean_us - self.tcp_direct_mean_us - 2.0 * self.delay_ms * 1e3
    }
}

/// Calibrates a hop of each of `delays_ms` (those above zero) with `samples` round trips per
/// series, gRPC against the operator at `operator` (client certificate from `pki`).
pub async fn calibrate(
    operator: SocketAddr,
    pki: &GrpcPki,
    delays_ms: &[f64],
    samples: usize,
) -> anyhow::Result<Vec<HopCalibration>> {
    let echo = Echo::start().context("the TCP echo of the hop calibration")?;
    let grpc_direct = grpc_series(operator, pki, samples).await?;
    let tcp_direct = tcp_series(echo.address, samples).await?;
    let mut out = Vec::new();
    for &delay_ms in delays_ms.iter().filter(|d| **d > 0.0) {
        let each_way = Duration::from_secs_f64(delay_ms / 1e3);
        let hop = NetworkHop::start(operator, each_way).context("a hop to the operator")?;
        let grpc_hop = grpc_series(hop.address, pki, samples).await?;
        drop(hop);
        let hop = NetworkHop::start(echo.address, each_way).context("a hop to the echo")?;
        let tcp_hop = tcp_series(hop.address, samples).await?;
        drop(hop);
        out.push(HopCalibration {
            delay_ms,
            samples,
            grpc_direct_mean_us: grpc_direct.0,
            grpc_direct_p50_us: grpc_direct.1,
            grpc_hop_mean_us: grpc_hop.0,
            grpc_hop_p50_us: grpc_hop.1,
            tcp_direct_mean_us: tcp_direct.0,
            tcp_direct_p50_us: tcp_direct.1,
            tcp_hop_mean_us: tcp_hop.0,
            tcp_hop_p50_us: tcp_hop.1,
        });
    }
    Ok(out)
}

/// (mean, median) of `samples` sequential `GPULabel` calls to `address`, µs.
async fn grpc_series(
    address: SocketAddr,
    pki: &GrpcPki,
    samples: usize,
) -> anyhow::Result<(f64, f64)> {
    let mut client = load::connect(address, &pki.ca_cert, &pki.client).await?;
    let mut times = Vec::with_capacity(samples);
    for i in 0..WARMUP + samples {
        let start = Instant::now();
        client
            .gpu_label(proto::GpuLabelRequest {})
            .await
            .with_context(|| format!("GPULabel through {address}"))?;
        if i >= WARMUP {
            times.push(start.elapsed());
        }
    }
    Ok(mean_and_median(times))
}

/// (mean, median) of `samples` one-byte round trips to the echo at `address`, µs.
async fn tcp_series(address: SocketAddr, samples: usize) -> anyhow::Result<(f64, f64)> {
    tokio::task::spawn_blocking(move || {
        let mut stream =
            TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        let mut byte = [0u8; 1];
        let mut times = Vec::with_capacity(samples);
        for i in 0..WARMUP + samples {
            let start = Instant::now();
            stream.write_all(&byte)?;
            stream.read_exact(&mut byte)?;
            if i >= WARMUP {
                times.push(start.elapsed());
            }
        }
        anyhow::Ok(mean_and_median(times))
    })
    .await
    .context("the TCP ping thread")?
}

fn mean_and_median(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = times.iter().copied().map(us).sum::<f64>() / times.len().max(1) as f64;
    let median = times.get(times.len() / 2).copied().map_or(0.0, us);
    (mean, median)
}

/// A thread echoing every byte back, a thread per connection; it stays, idle, until the bench
/// exits.
struct Echo {
    address: SocketAddr,
}

impl Echo {
    fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        std::thread::Builder::new()
            .name("hop-calibration-echo".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut stream) = stream else { continue };
                    let _ = stream.set_nodelay(true);
                    std::thread::spawn(move || {
                        let mut buffer = [0u8; 64];
                        while let Ok(n) = stream.read(&mut buffer) {
                            if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
            })?;
        Ok(Self { address })
    }
}
