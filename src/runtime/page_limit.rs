//! Bounds the pages of a LIST from a tenant's API server. kube's watcher follows every
//! `continue` token it is given, so a server answering each page with an empty list and a fresh
//! token would keep the operator paging until the list's deadline. A list's pages are its
//! requests with the same path and query but for `continue`: the first (no token) starts the
//! count, and the request beyond [`PageLimitLayer::new`]'s `max` fails without being sent.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use super::line_limit::is_watch;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error of a request beyond a list's page limit.
#[derive(Debug, thiserror::Error)]
#[error("a list ran to more than {max} pages (fresh continue tokens)")]
pub struct TooManyPages {
    /// The limit.
    pub max: usize,
}

/// A tower layer limiting the pages of each list ([`PageLimited`]).
#[derive(Clone, Copy, Debug)]
pub struct PageLimitLayer {
    max: usize,
}

impl PageLimitLayer {
    /// Lists of at most `max` pages.
    pub fn new(max: usize) -> Self {
        Self { max }
    }
}

impl<S> tower::Layer<S> for PageLimitLayer {
    type Service = PageLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PageLimited {
            inner,
            max: self.max,
            pages: Arc::default(),
        }
    }
}

/// A service whose lists fail at the page beyond its limit.
#[derive(Clone, Debug)]
pub struct PageLimited<S> {
    inner: S,
    max: usize,
    /// Pages sent of each list under way, by path and query without `continue`.
    pages: Arc<Mutex<HashMap<String, usize>>>,
}

impl<S> PageLimited<S> {
    /// Counts `request` as a page of its list: false when it is one page too many.
    fn admit<B>(&self, request: &http::Request<B>) -> bool {
        if request.method() != http::Method::GET || is_watch(request) {
            return true;
        }
        let uri = request.uri();
        let mut continued = false;
        let rest: Vec<&str> = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|param| {
                let token = param.starts_with("continue=");
                continued |= token;
                !token
            })
            .collect();
        let list = format!("{}?{}", uri.path(), rest.join("&"));
        let mut pages = self
            .pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent = pages.entry(list).or_default();
        *sent = if continued { *sent + 1 } else { 1 };
        *sent <= self.max
    }
}

impl<S, ReqBody> tower::Service<http::Request<ReqBody>> for PageLimited<S>
where
    S: tower::Service<http::Request<ReqBody>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        if !self.admit(&request) {
            let max = self.max;
            return Box::pin(async move { Err(Box::new(TooManyPages { max }) as BoxError) });
        }
        let response = self.inner.call(request);
        Box::pin(async move { response.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::Layer;

    fn get(uri: &str) -> http::Request<()> {
        http::Request::get(uri).body(()).expect("a request")
    }

    #[test]
    fn a_lists_pages_are_counted_by_its_query_and_the_first_page_starts_again() {
        let limited = PageLimitLayer::new(3).layer(());
        let first = "/api/v1/nodes?limit=500";
        assert!(limited.admit(&get(first)));
        assert!(limited.admit(&get("/api/v1/nodes?limit=500&continue=a")));
        // Another list of the same client (a probe's) neither counts nor resets this one.
        assert!(limited.admit(&get("/api/v1/nodes?limit=1")));
        assert!(limited.admit(&get("/api/v1/nodes?continue=b&limit=500")));
        assert!(
            !limited.admit(&get("/api/v1/nodes?limit=500&continue=c")),
            "the fourth page of a list of at most three"
        );
        assert!(!limited.admit(&get("/api/v1/nodes?limit=500&continue=d")));
        // Watches and writes are no pages; a new list starts the count again.
        assert!(limited.admit(&get("/api/v1/nodes?watch=true&resourceVersion=1")));
        assert!(limited.admit(&get(first)));
        assert!(limited.admit(&get("/api/v1/nodes?limit=500&continue=e")));
    }
}
