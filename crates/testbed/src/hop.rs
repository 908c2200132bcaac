//! A network hop on loopback: a TCP proxy that delays every byte by a fixed time in each
//! direction, as the wire between two nodes does, without serialising requests. Each direction
//! is a delay line: a reader thread stamps every chunk when it arrives and a writer thread
//! sends it when its delay is over, so chunks in flight overlap as they would on a link (a
//! proxy that slept before forwarding each chunk would add its delay once per chunk in a
//! row instead). Delays are sub-millisecond: the writer sleeps on the OS timer with its slack
//! set to 1 µs (Linux), so no core is spent spinning.
//!
//! TLS and HTTP/2 pass through untouched. For benchmarks that put the same delay between
//! cluster-autoscaler and each peer: this operator, or the API server of the in-tree provider.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running hop; stops accepting when dropped (open connections end with their peers).
pub struct NetworkHop {
    /// Where clients connect.
    pub address: SocketAddr,
    /// The delay added in each direction.
    pub each_way: Duration,
    stop: Arc<AtomicBool>,
}

impl NetworkHop {
    /// Listens on a free loopback port and forwards to `upstream`, adding `each_way` to every
    /// byte in each direction.
    pub fn start(upstream: SocketAddr, each_way: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::Builder::new()
            .name("hop-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    if let Err(error) = connect_lines(client, server, each_way) {
                        tracing::warn!(%error, "network hop: a connection could not be set up");
                    }
                }
            })?;
        Ok(Self {
            address,
            each_way,
            stop,
        })
    }
}

impl Drop for NetworkHop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// Joins `client` and `server` with a delay line each way.
fn connect_lines(client: TcpStream, server: TcpStream, delay: Duration) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    delay_line(client.try_clone()?, server.try_clone()?, delay)?;
    delay_line(server, client, delay)?;
    Ok(())
}

/// Copies `from` to `to`, each chunk `delay` after it arrived; closes `to`'s write side when
/// `from` ends.
fn delay_line(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> std::io::Result<()> {
    let (chunks, due) = mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::Builder::new()
        .name("hop-read".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            while let Ok(n) = from.read(&mut buffer) {
                if n == 0 || chunks.send((Instant::now(), buffer[..n].to_vec())).is_err() {
                    break;
                }
            }
        })?;
    std::thread::Builder::new()
        .name("hop-write".into())
        .spawn(move || {
            fine_timer_slack();
            for (arrived, chunk) in due {
                let at = arrived + delay;
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// Lets this thread's sleeps end within about a microsecond of their deadline (Linux's
/// default timer slack is 50 µs, a fifth of a 0.25 ms delay).
fn fine_timer_slack() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut stream = stream;
                    let _ = stream.set_nodelay(true);
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 || stream.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    /// The median round trip of a one-byte ping through `address`.
    fn round_trip(address: SocketAddr) -> Duration {
        let mut stream = TcpStream::connect(address).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let mut times: Vec<Duration> = (0..200)
            .map(|_| {
                let sent = Instant::now();
                stream.write_all(b"x").expect("write");
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).expect("read");
                sent.elapsed()
            })
            .collect();
        times.sort();
        times[times.len() / 2]
    }

    #[test]
    fn a_round_trip_gains_twice_the_delay_and_overlapping_chunks_are_not_serialised() {
        let upstream = echo();
        let direct = round_trip(upstream);
        let hop = NetworkHop::start(upstream, Duration::from_micros(250)).expect("hop");
        let through = round_trip(hop.address);
        let added = through.saturating_sub(direct);
        eprintln!("round trip {direct:?} direct, {through:?} through the hop (+{added:?})");
        assert!(
            added >= Duration::from_micros(500),
            "a round trip gains at least 2 x 250 µs: {added:?}"
        );

        // 50 pings sent at once come back about one delay pair later, not 50.
        let mut stream = TcpStream::connect(hop.address).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let sent = Instant::now();
        for _ in 0..50 {
            stream.write_all(b"x").expect("write");
        }
        let mut bytes = [0u8; 50];
        stream.read_exact(&mut bytes).expect("read");
        let burst = sent.elapsed();
        assert!(
            burst < Duration::from_millis(12),
            "50 chunks in flight together: {burst:?}, not 50 x 0.5 ms"
        );
    }
}
