//! Bounds the lines of a watch answer from a tenant's API server. Kubernetes sends one watch
//! event per line, and kube's client gathers a line whole before decoding it, so a server
//! sending one endless line would make the operator hold all of it (up to the body limit).
//! Object sizes are bounded by the API server's own limit (about 1.5 MiB in etcd), so a line
//! longer than [`MAX_WATCH_LINE_BYTES`] is no event: the answer fails, and the watcher retries
//! with its backoff.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// The longest watch line read.
pub const MAX_WATCH_LINE_BYTES: usize = 16 << 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A tower layer limiting the lines of watch answers ([`LineLimited`]).
#[derive(Clone, Copy, Debug)]
pub struct LineLimitLayer {
    max: usize,
}

impl LineLimitLayer {
    /// Lines of watch answers of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self { max }
    }
}

impl<S> tower::Layer<S> for LineLimitLayer {
    type Service = LineLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LineLimited {
            inner,
            max: self.max,
        }
    }
}

/// A service whose watch answers fail on a line longer than its limit.
#[derive(Clone, Debug)]
pub struct LineLimited<S> {
    inner: S,
    max: usize,
}

/// True when `request` opens a watch (`watch=true` or `watch=1` in its query).
pub(crate) fn is_watch<B>(request: &http::Request<B>) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for LineLimited<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<LineBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let max = if is_watch(&request) {
            self.max
        } else {
            usize::MAX
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|inner| LineBody {
                inner: Box::pin(inner),
                max,
                line: 0,
            }))
        })
    }
}

/// A body failing once a line exceeds its limit.
pub struct LineBody<B> {
    inner: Pin<Box<B>>,
    max: usize,
    /// Bytes of the line under way.
    line: usize,
}

impl<B> Body for LineBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = match self.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            self.line = match data.iter().rposition(|b| *b == b'\n') {
                Some(end) => data.len() - end - 1,
                None => self.line.saturating_add(data.len()),
            };
            if self.line > self.max {
                let max = self.max;
                return Poll::Ready(Some(Err(format!(
                    "a watch event line longer than {max} bytes: no Kubernetes object is that large"
                )
                .into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body(
        chunks: Vec<&'static [u8]>,
        max: usize,
    ) -> LineBody<impl Body<Data = Bytes, Error = std::convert::Infallible>> {
        let frames = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(c)))),
        );
        LineBody {
            inner: Box::pin(StreamBody::new(frames)),
            max,
            line: 0,
        }
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_and_a_longer_one_fails() {
        let ok = body(vec![b"0123\n45", b"67\n", b"89ab"], 5);
        let bytes = ok.collect().await.expect("every line fits").to_bytes();
        assert_eq!(&bytes[..], b"0123\n4567\n89ab");
        let long = body(vec![b"0123\n45", b"6789"], 5);
        let error = long.collect().await.expect_err("a line of 6 bytes");
        assert!(error.to_string().contains("longer than 5 bytes"), "{error}");
    }

    #[test]
    fn only_watch_requests_are_limited() {
        let request = |uri: &str| http::Request::get(uri).body(()).expect("request");
        assert!(is_watch(&request(
            "/api/v1/nodes?watch=true&timeoutSeconds=20"
        )));
        assert!(is_watch(&request(
            "/api/v1/nodes?resourceVersion=1&watch=1"
        )));
        assert!(!is_watch(&request("/api/v1/nodes?limit=500")));
        assert!(!is_watch(&request("/api/v1/nodes?watch=false")));
    }
}
