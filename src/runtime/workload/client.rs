//! The client of a workload cluster: transport timeouts, no retries of its own, response
//! bodies and watch lines cut at the read limits, requests paced. The API server is a
//! tenant's.

use std::time::Duration;

use kube::Client;

use super::limits::ReadLimits;

/// Longest a workload client waits for a TCP connection and TLS handshake.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a workload client waits for the next bytes of a response.
pub(super) const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest a workload client waits to send a request.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client whose every response body is cut at [`ReadLimits::response_bytes`] (the API server is a
/// tenant's, and kube's client reads a LIST answer, or a watch line, whole, however long),
/// whose watch lines are cut shorter still ([`crate::runtime::line_limit`]), whose lists end at
/// [`ReadLimits::list_pages`] pages ([`crate::runtime::page_limit`]), and
/// whose requests are paced ([`crate::runtime::pacing`]: kube's watcher reopens a watch that ended
/// cleanly at once, and follows every 410 with a LIST, so a server doing either in a loop
/// would otherwise keep the operator busy reconnecting).
pub(super) fn bounded_client(
    config: kube::Config,
    limits: &ReadLimits,
) -> Result<Client, kube::Error> {
    let response_bytes = limits.response_bytes;
    let limit = tower::util::MapResponseLayer::new(move |response: http::Response<_>| {
        response.map(|body| http_body_util::Limited::new(body, response_bytes))
    });
    let lines = crate::runtime::line_limit::LineLimitLayer::new(limits.watch_line_bytes);
    let pace = crate::runtime::pacing::PaceLayer::new(
        crate::runtime::pacing::BURST,
        crate::runtime::pacing::PER_SECOND,
    );
    // Outermost: a page beyond the limit neither waits for pacing nor goes out.
    let pages = crate::runtime::page_limit::PageLimitLayer::new(limits.list_pages);
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&limit)
        .with_layer(&lines)
        .with_layer(&pace)
        .with_layer(&pages)
        .build())
}

/// The transport bounds of a workload client: timeouts, and no retries of its own.
pub(super) fn bound(config: &mut kube::Config) {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    // kube retries 429, 503 and 504 itself, waiting as long as the server's Retry-After says,
    // up to 15 times: a tenant's server could hold a request for hours. The watch has its own
    // backoff, and the probes judge the cluster.
    config.default_retry = false;
    // The read timeout counts from each request, not from when its pooled connection went idle.
    config.reset_reader_on_write = true;
}

/// A workload client (bounds and body limit as for a tenant's kubeconfig) of a local
/// plain-HTTP server answering every request with `router`.
#[cfg(test)]
pub(super) async fn client_of(router: axum::Router) -> Client {
    client_within(router, &ReadLimits::default()).await
}

/// As [`client_of`], with `limits`.
#[cfg(test)]
pub(super) async fn client_within(router: axum::Router, limits: &ReadLimits) -> Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let mut config = kube::Config::new(format!("http://{address}").parse().unwrap());
    bound(&mut config);
    bounded_client(config, limits).unwrap()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::Api;
    use kube::runtime::watcher;

    use super::super::health::reason;
    use super::super::limits::oversized;
    use super::*;

    #[tokio::test]
    async fn a_tenants_server_that_answers_429_is_not_retried_for_as_long_as_it_asks() {
        let router = axum::Router::new().fallback(|| async {
            (
                http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "3600"), ("content-type", "application/json")],
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":429,"reason":"TooManyRequests","message":"slow down"}"#,
            )
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let answer = tokio::time::timeout(Duration::from_secs(5), nodes.list(&Default::default()))
            .await
            .expect("answered at once, not after the server's Retry-After");
        match answer {
            Err(kube::Error::Api(status)) => assert_eq!(status.code, 429),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_tenants_endless_list_is_cut_at_the_body_limit() {
        let router = axum::Router::new().fallback(|| async {
            let head = futures::stream::once(async {
                Ok::<_, std::io::Error>(bytes::Bytes::from_static(
                    br#"{"kind":"NodeList","apiVersion":"v1","metadata":{},"items":["#,
                ))
            });
            let item = bytes::Bytes::from(format!(
                r#"{{"metadata":{{"name":"n","labels":{{"l":"{}"}}}}}},"#,
                "x".repeat(60_000)
            ));
            let endless = futures::stream::repeat_with(move || Ok(item.clone()));
            axum::body::Body::from_stream(head.chain(endless))
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let answer = tokio::time::timeout(Duration::from_secs(60), nodes.list(&Default::default()))
            .await
            .expect("cut at the limit, not read forever");
        let error = answer.expect_err("an endless body is no list");
        assert_eq!(
            oversized(&reason(&error), &ReadLimits::default()).as_deref(),
            Some("an answer was larger than 64 MiB (--workload-max-response-mib)"),
            "{}",
            reason(&error)
        );
    }

    /// A server that ends every watch at once (an empty 200) and lists one Node: kube's
    /// watcher reopens a cleanly ended watch without backoff, so only the client's pacing
    /// bounds the requests a tenant's server can make the operator send.
    #[tokio::test]
    async fn a_tenants_server_ending_every_watch_at_once_gets_paced_requests() {
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        let router = axum::Router::new().fallback(move |uri: http::Uri| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                let watch = uri.query().is_some_and(|q| q.contains("watch=true"));
                let body = if watch {
                    String::new()
                } else {
                    r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"n1","resourceVersion":"1"}}]}"#.to_string()
                };
                ([("content-type", "application/json")], body)
            }
        });
        let nodes: Api<Node> = Api::all(client_of(router).await);
        let watch = watcher(nodes, watcher::Config::default()).boxed();
        let watched = Duration::from_secs(3);
        let _ = tokio::time::timeout(watched, watch.for_each(|_| async {})).await;
        let sent = requests.load(Ordering::Relaxed);
        let allowed = crate::runtime::pacing::BURST as usize
            + crate::runtime::pacing::PER_SECOND as usize * watched.as_secs() as usize
            + 1;
        assert!(
            sent <= allowed,
            "{sent} requests in {watched:?}: the pacing allows {allowed}"
        );
        assert!(sent > 10, "the watch was reopened: {sent} requests");
    }
}
