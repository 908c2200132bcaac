use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                header::HeaderName::from_static(k),
                HeaderValue::from_str(v).unwrap(),
            )
        })
        .collect()
}

fn answer(status: u16, body: &str) -> Answer {
    Answer {
        status: StatusCode::from_u16(status).unwrap(),
        headers: headers(&[("content-type", "application/json")]),
        body: Bytes::from(body.to_string()),
        request: "POST /v1/projects/1/servers".into(),
    }
}

fn create_call() -> Call<'static> {
    Call {
        method: Method::POST,
        path: "projects/1/servers".into(),
        body: None,
        repeat: Repeat::Never,
        what: "the created server",
    }
}

#[test]
fn error_bodies_in_the_apis_shape_give_their_message() {
    let call = create_call();
    let err = ensure_success(
        &call,
        &answer(
            400,
            r#"{"code":400,"message":"Given server plan was not found."}"#,
        ),
    )
    .unwrap_err();
    match err {
        CherryError::Rejected { status, message } => {
            assert_eq!(status, 400);
            assert_eq!(
                message,
                "POST /v1/projects/1/servers: 400 Bad Request: Given server plan was not found."
            );
        }
        other => panic!("{other:?}"),
    }
    let err = ensure_success(
        &call,
        &answer(
            401,
            r#"{"code":401,"message":"No valid API key provided."}"#,
        ),
    )
    .unwrap_err();
    assert!(
        matches!(&err, CherryError::Unauthorized(m) if m.ends_with("No valid API key provided."))
    );
    // cluster-autoscaler's own test server answers {"error": ...}.
    let err = ensure_success(
        &call,
        &answer(400, r#"{"error":"mismatched project ID in body and path"}"#),
    )
    .unwrap_err();
    assert!(err.to_string().contains("mismatched project ID"), "{err}");
}

#[test]
fn a_refusal_mentioning_stock_is_not_told_apart_by_its_words() {
    let body = r#"{"code":400,"message":"Plan e5_1620v4 is out of stock in region eu_nord_1"}"#;
    let err = ensure_success(&create_call(), &answer(400, body)).unwrap_err();
    assert!(
        matches!(err, CherryError::Rejected { status: 400, .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
}

#[test]
fn a_failed_create_says_its_outcome_is_unknown() {
    let err = ensure_success(
        &create_call(),
        &answer(500, r#"{"code":500,"message":"boom"}"#),
    )
    .unwrap_err();
    assert!(err.is_retryable());
    assert!(
        err.to_string().contains("may have been carried out"),
        "{err}"
    );
}

#[test]
fn non_json_bodies_are_named_not_quoted_and_messages_are_cut() {
    let mut a = answer(502, "<html>Bad gateway</html>");
    a.headers = headers(&[("content-type", "text/html")]);
    let err = ensure_success(&create_call(), &a).unwrap_err();
    assert!(
        err.to_string()
            .contains("a text/html body of 24 bytes, not the API's JSON"),
        "{err}"
    );
    assert!(!err.to_string().contains("Bad gateway"), "{err}");
    let long = format!(
        r#"{{"code":400,"message":"line one\nforged line {}"}}"#,
        "y".repeat(100_000)
    );
    let err = ensure_success(&create_call(), &answer(400, &long)).unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 400 && !text.contains('\n'), "{text}");

    let mut ok = answer(200, "<html>portal</html>");
    ok.headers = headers(&[("content-type", "text/html; charset=utf-8")]);
    let err = decode::<Server>(&ok, "a server").unwrap_err();
    assert!(
        matches!(&err, CherryError::Decode(m) if m.contains("text/html")),
        "{err:?}"
    );
}

#[test]
fn paging_stops_at_the_total_or_a_short_page() {
    // With X-Total-Count: 250 items come as 100, 100, 50.
    assert!(!last_page(100, 100, Some(250)));
    assert!(!last_page(100, 200, Some(250)));
    assert!(last_page(50, 250, Some(250)));
    // A total that is a multiple of the page size needs no extra empty page.
    assert!(last_page(100, 200, Some(200)));
    // Without the header a full page asks for the next one.
    assert!(!last_page(100, 100, None));
    assert!(last_page(99, 199, None));
    // An API that ignores `limit` answers everything at once.
    assert!(last_page(PAGE_SIZE + 1, PAGE_SIZE + 1, Some(1000)));
    // Items deleted between pages: an empty page ends the list.
    assert!(last_page(0, 100, Some(250)));
}

#[test]
fn json_content_types_are_recognised() {
    assert!(is_json("application/json"));
    assert!(is_json("Application/JSON; charset=utf-8"));
    assert!(is_json("application/problem+json"));
    assert!(!is_json(""));
    assert!(!is_json("text/plain"));
}

#[test]
fn retry_after_reads_seconds_and_http_dates() {
    assert_eq!(
        retry_after(&headers(&[("retry-after", "3")])),
        Some(Duration::from_secs(3))
    );
    let soon = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(5);
    let date = jiff::fmt::rfc2822::DateTimePrinter::new()
        .timestamp_to_rfc9110_string(&soon)
        .unwrap();
    let wait = retry_after(&headers(&[("retry-after", &date)])).unwrap();
    assert!(
        wait > Duration::from_secs(3) && wait <= Duration::from_secs(5),
        "{wait:?}"
    );
    assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
    assert_eq!(retry_after(&HeaderMap::new()), None);
}

#[test]
fn config_is_checked_and_the_base_gets_its_slash() {
    let client = CherryClient::new(ClientConfig {
        base_url: "http://127.0.0.1:1/v1".into(),
        token: "t".into(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(client.base, "http://127.0.0.1:1/v1/");
    assert_eq!(client.path_of("servers/5"), "/v1/servers/5");
    for bad in [
        ClientConfig::default(),
        ClientConfig {
            token: "t".into(),
            requests_per_second: 0.0,
            ..Default::default()
        },
        ClientConfig {
            token: "t".into(),
            base_url: "ftp://example.invalid/".into(),
            ..Default::default()
        },
    ] {
        assert!(matches!(
            CherryClient::new(bad),
            Err(CherryError::InvalidConfig(_))
        ));
    }
}

#[test]
fn debug_output_never_shows_the_token() {
    let config = ClientConfig {
        token: "s3cr3t-token".into(),
        ..Default::default()
    };
    assert!(!format!("{config:?}").contains("s3cr3t"));
    let client = CherryClient::new(config).unwrap();
    assert!(!format!("{client:?}").contains("s3cr3t"));
}
