//! The HTTP side: routes, Bearer auth, rate limiting, injected failures and the request
//! log. Every answer carries `Content-Type: application/json`, the 204 of a delete
//! included: cluster-autoscaler's `request` (`cherry_manager_rest.go`) fails any answer
//! without it.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::net::TcpListener;

use super::faults::{FaultAction, RequestKind};
use super::model::ApiError;
use super::state::{RecordedRequest, Shared};
use crate::emulator::{self, Answer, ResetConnection};

/// A request, routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    ListServers(i64),
    CreateServer(i64),
    GetServer(i64),
    DeleteServer(i64),
    ListPlans,
    MethodNotAllowed,
    NotFound,
}

impl Route {
    fn of(method: &Method, path: &str) -> Self {
        let Some(rest) = path.strip_prefix("/v1/") else {
            return Self::NotFound;
        };
        let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
        let id = |s: &str| s.parse::<i64>().ok();
        let (route, allowed): (Option<Self>, bool) = match segments.as_slice() {
            ["projects", project, "servers"] => match (id(project), method) {
                (None, _) => (None, true),
                (Some(p), &Method::GET) => (Some(Self::ListServers(p)), true),
                (Some(p), &Method::POST) => (Some(Self::CreateServer(p)), true),
                _ => (None, false),
            },
            ["servers", server] => match (id(server), method) {
                (None, _) => (None, true),
                (Some(s), &Method::GET) => (Some(Self::GetServer(s)), true),
                (Some(s), &Method::DELETE) => (Some(Self::DeleteServer(s)), true),
                _ => (None, false),
            },
            ["plans"] | ["teams", _, "plans"] => match method {
                &Method::GET => (Some(Self::ListPlans), true),
                _ => (None, false),
            },
            _ => (None, true),
        };
        match (route, allowed) {
            (Some(route), _) => route,
            (None, false) => Self::MethodNotAllowed,
            (None, true) => Self::NotFound,
        }
    }

    fn kind(self) -> Option<RequestKind> {
        Some(match self {
            Self::ListServers(_) => RequestKind::ListServers,
            Self::CreateServer(_) => RequestKind::CreateServer,
            Self::GetServer(_) => RequestKind::GetServer,
            Self::DeleteServer(_) => RequestKind::DeleteServer,
            Self::ListPlans => RequestKind::ListPlans,
            Self::MethodNotAllowed | Self::NotFound => return None,
        })
    }
}

/// Accepts connections until the task is aborted (which aborts every connection).
pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    emulator::serve(
        listener,
        "cherry emulator",
        shared,
        |shared, request| async move { handle_request(&shared, request).await },
    )
    .await;
}

async fn handle_request(
    shared: &Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Answer, ResetConnection> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let target = parts
        .uri
        .path_and_query()
        .map_or(path.clone(), |p| p.to_string());
    let route = Route::of(&parts.method, &path);
    let mut record = RecordedRequest {
        method: parts.method.to_string(),
        path: target,
        body: String::from_utf8_lossy(&body).into_owned(),
        status: None,
        at: shared.started.elapsed(),
    };

    let limited = shared.rate().admit(Instant::now());
    if let Some(wait) = limited {
        // Whole seconds, rounded up, never 0.
        let seconds = wait.as_millis().div_ceil(1000).max(1);
        let mut answer = error(&ApiError::new(429, "Too Many Requests"));
        if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
            answer.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return Ok(shared.record(record, answer));
    }

    let mut lose_answer = false;
    match route.kind().and_then(|kind| shared.take_fault(kind)) {
        None => {}
        Some(FaultAction::Status(status)) => {
            let answer = error(&ApiError::new(status, "Injected failure."));
            return Ok(shared.record(record, answer));
        }
        Some(FaultAction::Respond {
            status,
            headers,
            body,
        }) => {
            let mut answer = respond(status, Bytes::from(body));
            for (name, value) in headers {
                if let (Ok(name), Ok(value)) = (
                    header::HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(&value),
                ) {
                    answer.headers_mut().insert(name, value);
                }
            }
            return Ok(shared.record(record, answer));
        }
        Some(FaultAction::Hang(duration)) => tokio::time::sleep(duration).await,
        Some(FaultAction::Reset) => {
            shared.log().push(record);
            return Err(ResetConnection);
        }
        Some(FaultAction::LoseAnswer) => lose_answer = true,
    }

    let expected = format!("Bearer {}", shared.token);
    let authorized = parts
        .headers
        .get(header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    let answer = if authorized {
        dispatch(shared, route, parts.uri.query(), &parts.headers, &body)
    } else {
        error(&ApiError::new(
            401,
            "Unauthorized: invalid or missing API token.",
        ))
    };
    if lose_answer {
        record.at = shared.started.elapsed();
        shared.log().push(record);
        return Err(ResetConnection);
    }
    Ok(shared.record(record, answer))
}

fn dispatch(
    shared: &Arc<Shared>,
    route: Route,
    query: Option<&str>,
    headers: &http::HeaderMap,
    body: &[u8],
) -> Answer {
    match route {
        Route::ListServers(project) => {
            let account = shared.account();
            let servers: Vec<Value> = account
                .project_servers(project)
                .into_iter()
                .map(|s| account.server_json(s))
                .collect();
            page(servers, query)
        }
        Route::GetServer(id) => {
            let account = shared.account();
            match account.servers.get(&id) {
                Some(server) => json_answer(200, &account.server_json(server)),
                None => error(&ApiError::new(404, "Server not found.")),
            }
        }
        Route::CreateServer(project) => {
            let is_json = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("application/json"));
            if !is_json {
                return error(&ApiError::new(
                    400,
                    "The request body must be JSON (Content-Type: application/json).",
                ));
            }
            let created = shared.account().create(project, body);
            match created {
                Ok(server) => {
                    let value = shared.account().server_json(&server);
                    shared.spawn_lifecycle(server.id);
                    json_answer(201, &value)
                }
                Err(e) => error(&e),
            }
        }
        Route::DeleteServer(id) => {
            let terminated = shared.account().terminate(id);
            match terminated {
                Some(server) => {
                    shared.spawn_termination(server);
                    respond(204, Bytes::new())
                }
                None => error(&ApiError::new(404, "Server not found.")),
            }
        }
        Route::ListPlans => {
            let account = shared.account();
            let plans = account
                .plans
                .iter()
                .map(|p| account.plan_json(p, true))
                .collect();
            page(plans, query)
        }
        Route::MethodNotAllowed => error(&ApiError::new(405, "Method not allowed.")),
        Route::NotFound => error(&ApiError::new(404, "Not found.")),
    }
}

/// `limit`/`offset` (cherrygo `GetOptions`; absent or 0 `limit` is everything) with the
/// total in `X-Total-Count`.
fn page(items: Vec<Value>, query: Option<&str>) -> Answer {
    let param = |name: &str| {
        query
            .unwrap_or_default()
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let (limit, offset) = (param("limit"), param("offset"));
    let total = items.len();
    let selected: Vec<Value> = items
        .into_iter()
        .skip(offset)
        .take(if limit == 0 { usize::MAX } else { limit })
        .collect();
    let mut answer = json_answer(200, &Value::Array(selected));
    answer
        .headers_mut()
        .insert("x-total-count", HeaderValue::from(total));
    answer
}

fn json_answer(status: u16, value: &Value) -> Answer {
    respond(status, Bytes::from(value.to_string()))
}

fn error(e: &ApiError) -> Answer {
    json_answer(e.status, &e.body())
}

fn respond(status: u16, body: Bytes) -> Answer {
    let mut answer = Response::new(Full::new(body));
    *answer.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn routes_cover_the_paths_clients_use() {
        assert_eq!(
            Route::of(&Method::GET, "/v1/projects/7/servers"),
            Route::ListServers(7)
        );
        assert_eq!(
            Route::of(&Method::POST, "/v1/projects/7/servers"),
            Route::CreateServer(7)
        );
        assert_eq!(
            Route::of(&Method::GET, "/v1/servers/9"),
            Route::GetServer(9)
        );
        assert_eq!(
            Route::of(&Method::DELETE, "/v1/servers/9"),
            Route::DeleteServer(9)
        );
        assert_eq!(Route::of(&Method::GET, "/v1/plans"), Route::ListPlans);
        assert_eq!(
            Route::of(&Method::GET, "/v1/teams/3/plans"),
            Route::ListPlans
        );
        assert_eq!(
            Route::of(&Method::PUT, "/v1/servers/9"),
            Route::MethodNotAllowed
        );
        // A base URL without its trailing slash loses `v1` (cluster-autoscaler's
        // `ResolveReference`): such paths are not found.
        assert_eq!(Route::of(&Method::GET, "/servers/9"), Route::NotFound);
        assert_eq!(Route::of(&Method::GET, "/v1/servers/abc"), Route::NotFound);
    }

    #[test]
    fn pages_follow_limit_and_offset_with_the_total() {
        let items: Vec<Value> = (0..5).map(|i| json!(i)).collect();
        let answer = page(items.clone(), Some("limit=2&offset=3"));
        assert_eq!(answer.headers()["x-total-count"], "5");
        let all = page(items, None);
        assert_eq!(all.headers()["content-type"], "application/json");
    }
}
