//! Egress through an HTTP proxy, as corporate networks require: the proxy for a URL comes
//! from `HTTPS_PROXY` / `HTTP_PROXY` / `ALL_PROXY` (lower case too) unless `NO_PROXY` names
//! its host, as curl reads them. Both `https://` and `http://` URLs go through the proxy as a
//! `CONNECT` tunnel (TLS stays end to end); `user:password@` in the proxy URL is sent as
//! basic authentication.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which proxy a request goes through, as the environment variables say it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// Proxy of `https://` URLs (`HTTPS_PROXY`); empty: none.
    pub https: String,
    /// Proxy of `http://` URLs (`HTTP_PROXY`); empty: none.
    pub http: String,
    /// Proxy of both when the two above are empty (`ALL_PROXY`).
    pub all: String,
    /// Hosts, domains (`.example.com` or `example.com`, subdomains included), IPs and CIDR
    /// blocks reached directly, comma-separated; `*`: every host (`NO_PROXY`).
    pub no: String,
}

impl ProxySettings {
    /// The settings of this process's environment (upper case first, as curl).
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .or_else(|_| std::env::var(name.to_ascii_lowercase()))
                .unwrap_or_default()
        };
        Self {
            https: var("HTTPS_PROXY"),
            http: var("HTTP_PROXY"),
            all: var("ALL_PROXY"),
            no: var("NO_PROXY"),
        }
    }

    /// No proxy at all.
    pub fn none() -> Self {
        Self::default()
    }

    fn matcher(&self) -> Matcher {
        Matcher::builder()
            .all(self.all.clone())
            .http(self.http.clone())
            .https(self.https.clone())
            .no(self.no.clone())
            .build()
    }
}

/// Dials the destination directly, or a `CONNECT` tunnel through the proxy the settings name
/// for it; the TLS layer above it does not know the difference.
#[derive(Clone)]
pub(crate) struct ProxiedConnector {
    direct: HttpConnector,
    proxies: Arc<Matcher>,
}

impl ProxiedConnector {
    pub(crate) fn new(direct: HttpConnector, settings: &ProxySettings) -> Self {
        Self {
            direct,
            proxies: Arc::new(settings.matcher()),
        }
    }
}

impl tower_service::Service<Uri> for ProxiedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let mut direct = self.direct.clone();
        match self.proxies.intercept(&destination) {
            None => Box::pin(async move { direct.call(destination).await.map_err(Into::into) }),
            Some(proxy) => {
                let proxy_uri = proxy.uri().clone();
                let mut tunnel = Tunnel::new(proxy_uri.clone(), direct);
                if let Some(auth) = proxy.basic_auth() {
                    tunnel = tunnel.with_auth(auth.clone());
                }
                Box::pin(async move {
                    tunnel.call(destination).await.map_err(|e| {
                        // Host and port only: the URL may carry the proxy's password.
                        let host = proxy_uri.host().unwrap_or_default();
                        let port = proxy_uri
                            .port_u16()
                            .map(|p| format!(":{p}"))
                            .unwrap_or_default();
                        format!("through the proxy {host}{port}: {e}").into()
                    })
                })
            }
        }
    }
}
