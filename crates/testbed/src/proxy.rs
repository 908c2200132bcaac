//! A TCP proxy that slows a connection down: every chunk a client sends is held back for a
//! configurable delay before it is forwarded (TLS passes through untouched). Put in front of
//! the kube-apiserver it turns each API call of a client into a slow one, as an overloaded or
//! distant API server would.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A running proxy; stops accepting when dropped (open connections end with their peers).
pub struct LatencyProxy {
    /// Where clients connect.
    pub address: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    /// Listens on a free loopback port and forwards to `upstream`, delaying each chunk from
    /// the client by `delay`.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let delay_ms = Arc::new(AtomicU64::new(delay.as_millis() as u64));
        let shared = delay_ms.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let delay = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        forward(client, server, delay).await;
                    }
                });
            }
        });
        Ok(Self {
            address,
            delay_ms,
            task,
        })
    }

    /// Changes the delay for chunks sent from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms
            .store(delay.as_millis() as u64, Ordering::Relaxed);
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(client: TcpStream, server: TcpStream, delay_ms: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let delay = delay_ms.load(Ordering::Relaxed);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Writes a copy of kubeconfig `from` to `to` whose server is `https://<address>` (the API
/// server's certificate covers `127.0.0.1`, so a proxy on loopback is transparent to TLS).
pub fn kubeconfig_via(from: &Path, to: &Path, address: SocketAddr) -> std::io::Result<()> {
    let text = std::fs::read_to_string(from)?;
    std::fs::write(to, kubeconfig_text_via(&text, address))
}

/// Kubeconfig `text` with every cluster's server replaced by `https://<address>`.
pub fn kubeconfig_text_via(text: &str, address: SocketAddr) -> String {
    let rewritten: String = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("server: ") {
            Some(_) => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}server: https://{address}")
            }
            None => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    rewritten + "\n"
}
