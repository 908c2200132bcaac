//! A TCP pass-through proxy that can turn into a black hole: while frozen it keeps accepting
//! connections and keeps every socket open, but forwards nothing in either direction, as a
//! silent network partition or a hung server does (no reset, no close, no answer). Thawed, it
//! forwards again, including what was held back on connections that stayed open. TLS passes
//! through untouched; see [`crate::proxy::kubeconfig_text_via`] to point a kubeconfig at it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; stops accepting and drops its connections when dropped.
pub struct BlackHoleProxy {
    /// Where clients connect.
    pub address: SocketAddr,
    frozen: watch::Sender<bool>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHoleProxy {
    /// Listens on a free loopback port and forwards to `upstream`; starts frozen when `frozen`
    /// (a pure black hole until [`BlackHoleProxy::thaw`]).
    pub async fn start(upstream: SocketAddr, frozen: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (switch, _) = watch::channel(frozen);
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let switch = switch.clone();
            let accepted = accepted.clone();
            async move {
                let mut connections = tokio::task::JoinSet::new();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::Relaxed);
                    let frozen = switch.subscribe();
                    connections.spawn(async move {
                        if let Ok(server) = TcpStream::connect(upstream).await {
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            forward(client, server, frozen).await;
                        }
                    });
                    while connections.try_join_next().is_some() {}
                }
            }
        });
        Ok(Self {
            address,
            frozen: switch,
            accepted,
            task,
        })
    }

    /// Stops forwarding, on open connections and new ones alike; sockets stay open.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forwards again, starting with what was held back.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for BlackHoleProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its JoinSet, which aborts every connection's task.
        self.task.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, frozen: watch::Receiver<bool>) {
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pipe(client_read, server_write, frozen.clone()),
        pipe(server_read, client_write, frozen),
    );
}

/// Copies `from` to `to` chunk by chunk, holding each chunk while frozen.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|frozen| !frozen).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> Option<Vec<u8>> {
        stream.write_all(text).await.ok()?;
        let mut back = vec![0u8; text.len()];
        tokio::time::timeout(Duration::from_millis(500), stream.read_exact(&mut back))
            .await
            .ok()?
            .ok()?;
        Some(back)
    }

    #[tokio::test]
    async fn a_frozen_proxy_holds_open_connections_silent_and_releases_them_when_thawed() {
        let proxy = BlackHoleProxy::start(echo().await, false)
            .await
            .expect("proxy");
        let mut open = TcpStream::connect(proxy.address).await.expect("connect");
        assert_eq!(
            round_trip(&mut open, b"one").await.as_deref(),
            Some(&b"one"[..])
        );

        proxy.freeze();
        assert_eq!(round_trip(&mut open, b"two").await, None, "nothing passes");
        let mut fresh = TcpStream::connect(proxy.address)
            .await
            .expect("new connections are still accepted");
        assert_eq!(
            round_trip(&mut fresh, b"new").await,
            None,
            "nor on new ones"
        );
        assert_eq!(proxy.accepted(), 2);

        proxy.thaw();
        let mut held = vec![0u8; 3];
        tokio::time::timeout(Duration::from_secs(2), open.read_exact(&mut held))
            .await
            .expect("the held chunk arrives")
            .expect("read");
        assert_eq!(&held, b"two");
        assert_eq!(
            round_trip(&mut open, b"three").await.as_deref(),
            Some(&b"three"[..])
        );
    }
}
