//! What the cloud API emulators share: the HTTP/1 server loop whose handler may answer a
//! request by resetting the connection, and a one-second rate window.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// An emulator's answer.
pub type Answer = Response<Full<Bytes>>;

/// A handler's error: drop the connection with a reset (RST) instead of answering.
#[derive(Debug)]
pub struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("injected connection reset")
    }
}

impl std::error::Error for ResetConnection {}

/// Accepts connections on `listener` until the task is aborted (which aborts every
/// connection), answering each request with `handle`; `name` goes into log lines.
pub async fn serve<S, F, Fut>(listener: TcpListener, name: &'static str, shared: Arc<S>, handle: F)
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, ResetConnection>> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "{name}: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        connections.spawn(serve_connection(stream, name, shared.clone(), handle));
    }
}

async fn serve_connection<S, F, Fut>(
    stream: TcpStream,
    name: &'static str,
    shared: Arc<S>,
    handle: F,
) where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: Future<Output = Result<Answer, ResetConnection>> + Send + 'static,
{
    // A second handle on the socket, to set SO_LINGER to zero when a handler asks for a
    // reset: closing then sends RST instead of FIN.
    let (socket, stream) = match stream
        .into_std()
        .and_then(|s| Ok((s.try_clone()?, s)))
        .and_then(|(handle, s)| Ok((Arc::new(handle), TcpStream::from_std(s)?)))
    {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(error = %e, "{name}: cannot take the connection");
            return;
        }
    };
    let service = service_fn(move |request| {
        let shared = shared.clone();
        let socket = socket.clone();
        async move {
            let outcome = handle(shared, request).await;
            if outcome.is_err() {
                let _ = socket2::SockRef::from(socket.as_ref()).set_linger(Some(Duration::ZERO));
            }
            outcome
        }
    });
    if let Err(e) = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        tracing::debug!(error = %e, "{name}: connection ended");
    }
}

/// Requests beyond which a one-second window refuses.
#[derive(Debug, Default)]
pub struct RateWindow {
    /// Requests per second; `None`: all pass.
    pub limit: Option<u32>,
    accepted: VecDeque<Instant>,
}

impl RateWindow {
    /// A window admitting `limit` requests per second (`None`: all).
    pub fn new(limit: Option<u32>) -> Self {
        Self {
            limit,
            accepted: VecDeque::new(),
        }
    }

    /// `None` when the request may pass (and counts), else how long until it would.
    pub fn admit(&mut self, now: Instant) -> Option<Duration> {
        let limit = self.limit? as usize;
        while self
            .accepted
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.accepted.pop_front();
        }
        if self.accepted.len() < limit {
            self.accepted.push_back(now);
            return None;
        }
        let oldest = self.accepted.front().copied().unwrap_or(now);
        Some(Duration::from_secs(1).saturating_sub(now.duration_since(oldest)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_window_admits_the_limit_per_second() {
        let mut window = RateWindow::new(Some(2));
        let t0 = Instant::now();
        assert_eq!(window.admit(t0), None);
        assert_eq!(window.admit(t0 + Duration::from_millis(100)), None);
        let wait = window.admit(t0 + Duration::from_millis(200)).unwrap();
        assert_eq!(wait, Duration::from_millis(800));
        assert_eq!(window.admit(t0 + Duration::from_millis(1000)), None);
        let unlimited = &mut RateWindow::default();
        assert!((0..100).all(|_| unlimited.admit(t0).is_none()));
    }
}
