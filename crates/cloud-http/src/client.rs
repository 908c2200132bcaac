//! The pooled HTTP/1.1 client: connections over plain TCP or rustls, trusting the system's
//! root certificates and any extra ones, kept open between requests, each exchange bounded
//! by one timeout.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::CertificateDer;
use thiserror::Error;

use crate::proxy::{ProxiedConnector, ProxySettings};

/// How long an unused pooled connection stays open unless [`HttpOptions`] says otherwise.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most bytes of an answer read unless [`HttpOptions`] says otherwise: a page of 100 servers
/// or instances is well under 1 MiB; an endpoint sending more is not the cloud's API.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 16 << 20;

/// How an [`HttpClient`] connects and how long it waits.
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Limit per exchange, from sending the request to the last byte of the answer.
    pub timeout: Duration,
    /// Trusted in addition to the system's roots (a private gateway's CA). One that does not
    /// parse fails [`HttpClient::new`].
    pub extra_root_certificates: Vec<CertificateDer<'static>>,
    /// How long an unused pooled connection stays open.
    pub pool_idle_timeout: Duration,
    /// Most bytes of an answer's body; reading stops there and the exchange is
    /// [`SendError::Broken`].
    pub max_answer_bytes: usize,
    /// The HTTP proxy per URL ([`ProxySettings::from_env`] unless set otherwise).
    pub proxy: ProxySettings,
}

impl HttpOptions {
    /// `timeout` per exchange, the system's roots only, [`DEFAULT_POOL_IDLE_TIMEOUT`], the
    /// proxy of the environment.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            extra_root_certificates: Vec::new(),
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            proxy: ProxySettings::from_env(),
        }
    }
}

/// Why [`HttpClient::new`] cannot make a client.
#[derive(Debug, Error)]
pub enum BuildError {
    /// Some of [`HttpOptions::extra_root_certificates`] are not certificates.
    #[error("{0} extra root certificates do not parse")]
    ExtraRoots(usize),
    /// rustls refused the configuration.
    #[error("TLS: {0}")]
    Tls(rustls::Error),
}

/// Why an exchange got no whole answer. The request may have reached the server in every
/// case but [`SendError::Connect`].
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SendError {
    /// No whole answer within the timeout; the connection is closed, never reused.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// No connection: refused, DNS, TLS handshake. The request was not sent.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// The connection broke while sending or reading.
    #[error("{0}")]
    Broken(String),
}

/// An HTTP answer, read whole.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// A pooled HTTP/1.1 client for `http://` and `https://` URLs (rustls with ring). Cheap to
/// clone; clones share the pool.
#[derive(Clone)]
pub struct HttpClient {
    http: HyperClient<HttpsConnector<ProxiedConnector>, Full<Bytes>>,
    timeout: Duration,
    max_answer_bytes: usize,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// Builds a client; opens no connection. The system's root certificates that do not load
    /// are logged and skipped.
    pub fn new(options: &HttpOptions) -> Result<Self, BuildError> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::debug!(error = %e, "loading a system root certificate");
        }
        roots.add_parsable_certificates(native.certs);
        let (_, rejected) =
            roots.add_parsable_certificates(options.extra_root_certificates.iter().cloned());
        if rejected > 0 {
            return Err(BuildError::ExtraRoots(rejected));
        }
        if roots.is_empty() {
            tracing::warn!("no root certificates: HTTPS requests will fail");
        }
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(BuildError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut direct = HttpConnector::new();
        // The TLS layer above dials https:// URLs through it.
        direct.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(ProxiedConnector::new(direct, &options.proxy));
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(options.pool_idle_timeout)
            .build(connector);
        Ok(Self {
            http,
            timeout: options.timeout,
            max_answer_bytes: options.max_answer_bytes,
        })
    }

    /// The limit of one exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `request` and reads the whole answer, within the timeout. Dropping the future
    /// (or the timeout firing) closes the connection; the pool never reuses a half-read one.
    pub async fn send(&self, request: Request<Full<Bytes>>) -> Result<Answer, SendError> {
        let exchange = async {
            let response = self.http.request(request).await.map_err(|e| {
                if e.is_connect() {
                    SendError::Connect(error_chain(&e))
                } else {
                    SendError::Broken(error_chain(&e))
                }
            })?;
            let (parts, body) = response.into_parts();
            let max = self.max_answer_bytes;
            let body = Limited::new(body, max)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<LengthLimitError>() {
                        SendError::Broken(format!(
                            "reading the answer: it is longer than {max} bytes"
                        ))
                    } else {
                        SendError::Broken(format!("reading the answer: {}", error_chain(&*e)))
                    }
                })?
                .to_bytes();
            Ok(Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .unwrap_or(Err(SendError::Timeout(self.timeout)))
    }
}

/// `e` and its sources, `: `-separated.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::ProxySettings;

    fn client(timeout: Duration) -> HttpClient {
        HttpClient::new(&HttpOptions::new(timeout)).unwrap()
    }

    fn get(addr: SocketAddr) -> Request<Full<Bytes>> {
        Request::get(format!("http://{addr}/v1/things"))
            .body(Full::default())
            .unwrap()
    }

    /// Reads one request head (the tests send no bodies); `false` at the end of the stream.
    async fn read_head(stream: &mut TcpStream) -> bool {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => return false,
            }
        }
        true
    }

    /// A server answering every request on a connection with `reply`, counting connections.
    async fn serve(reply: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    while read_head(&mut stream).await {
                        if stream.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, connections)
    }

    #[tokio::test]
    async fn answers_are_read_whole_and_connections_reused() {
        let (addr, connections) = serve(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"id\": 42}\n",
        )
        .await;
        let client = client(Duration::from_secs(5));
        for _ in 0..2 {
            let answer = client.send(get(addr)).await.unwrap();
            assert_eq!(answer.status, StatusCode::OK);
            assert_eq!(answer.headers["content-type"], "application/json");
            assert_eq!(&answer.body[..], b"{\"id\": 42}\n");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_silent_server_is_a_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let timeout = Duration::from_millis(100);
        assert_eq!(
            client(timeout).send(get(addr)).await.unwrap_err(),
            SendError::Timeout(timeout)
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_a_broken_one() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let err = client(Duration::from_secs(5))
            .send(get(addr))
            .await
            .unwrap_err();
        assert!(matches!(err, SendError::Connect(_)), "{err:?}");
        assert!(err.to_string().starts_with("cannot connect: "), "{err}");
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_broken() {
        // Two bytes of the hundred announced, then the connection closes.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}")
                .await;
        });
        let err = client(Duration::from_secs(5))
            .send(get(addr))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, SendError::Broken(m) if m.starts_with("reading the answer: ")),
            "{err:?}"
        );
    }

    /// An endpoint sending an endless answer (chunked, no length) gets it cut at the limit,
    /// whatever the timeout.
    #[tokio::test]
    async fn an_endless_answer_is_cut_at_the_limit() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_head(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await;
            let chunk = format!("10000\r\n{}\r\n", "z".repeat(0x10000));
            while stream.write_all(chunk.as_bytes()).await.is_ok() {}
        });
        let options = HttpOptions {
            max_answer_bytes: 1 << 20,
            ..HttpOptions::new(Duration::from_secs(30))
        };
        let started = std::time::Instant::now();
        let err = HttpClient::new(&options)
            .unwrap()
            .send(get(addr))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            SendError::Broken("reading the answer: it is longer than 1048576 bytes".into())
        );
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// A CONNECT proxy on loopback: records each request head, answers `status`, and with 200
    /// pipes the tunnel to `upstream` whatever host was asked for (the proxy resolves names,
    /// not the client).
    async fn connect_proxy(
        status: &'static str,
        upstream: SocketAddr,
    ) -> (SocketAddr, Arc<std::sync::Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match stream.read(&mut byte).await {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    seen.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&head).into_owned());
                    let reply = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    if stream.write_all(reply.as_bytes()).await.is_err()
                        || !status.starts_with("200")
                    {
                        return;
                    }
                    let mut target = TcpStream::connect(upstream).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut target).await;
                });
            }
        });
        (addr, heads)
    }

    fn via(proxy: ProxySettings) -> HttpClient {
        HttpClient::new(&HttpOptions {
            proxy,
            ..HttpOptions::new(Duration::from_secs(5))
        })
        .unwrap()
    }

    /// HTTP(S)_PROXY and NO_PROXY as curl reads them: a proxied URL goes through a CONNECT
    /// tunnel (the proxy resolves the name, with the credentials of the proxy URL), a URL
    /// NO_PROXY names goes direct, and a proxy's refusal is an error naming the proxy without
    /// its password.
    #[tokio::test]
    async fn requests_go_through_the_proxy_the_environment_names_unless_no_proxy_says_otherwise() {
        let (target, _) = serve("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").await;
        let (proxy, heads) = connect_proxy("200 Connection established", target).await;
        let settings = ProxySettings {
            http: format!("http://ngo:s3cret@{proxy}"),
            ..ProxySettings::none()
        };
        let request = |host: &str| {
            Request::get(format!("http://{host}:{}/v1/things", target.port()))
                .body(Full::default())
                .unwrap()
        };
        let answer = via(settings.clone())
            .send(request("cloud.example.invalid"))
            .await
            .unwrap();
        assert_eq!(&answer.body[..], b"ok");
        {
            let heads = heads.lock().unwrap();
            assert_eq!(heads.len(), 1, "{heads:?}");
            assert!(
                heads[0].starts_with(&format!(
                    "CONNECT cloud.example.invalid:{} HTTP/1.1\r\n",
                    target.port()
                )),
                "{heads:?}"
            );
            // base64("ngo:s3cret")
            assert!(heads[0].contains("Basic bmdvOnMzY3JldA=="), "{heads:?}");
        }

        let direct = ProxySettings {
            no: "127.0.0.1,.internal.example".into(),
            ..settings.clone()
        };
        let answer = via(direct).send(request("127.0.0.1")).await.unwrap();
        assert_eq!(&answer.body[..], b"ok");
        assert_eq!(
            heads.lock().unwrap().len(),
            1,
            "NO_PROXY: not through the proxy"
        );

        let (refusing, _) = connect_proxy("407 Proxy Authentication Required", target).await;
        let refused = ProxySettings {
            http: format!("http://ngo:s3cret@{refusing}"),
            ..ProxySettings::none()
        };
        let err = via(refused)
            .send(request("cloud.example.invalid"))
            .await
            .unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, SendError::Connect(_)), "{err:?}");
        assert!(
            message.contains(&format!("through the proxy {refusing}")),
            "{message}"
        );
        assert!(!message.contains("s3cret"), "{message}");
    }

    #[test]
    fn extra_roots_that_do_not_parse_are_refused() {
        let options = HttpOptions {
            extra_root_certificates: vec![CertificateDer::from(b"not a certificate".to_vec())],
            ..HttpOptions::new(Duration::from_secs(1))
        };
        let err = HttpClient::new(&options).unwrap_err();
        assert!(matches!(err, BuildError::ExtraRoots(1)), "{err:?}");
        assert_eq!(err.to_string(), "1 extra root certificates do not parse");
    }
}
