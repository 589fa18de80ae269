//! Fault tests of the Redfish client against a tiny scripted HTTP server.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{RedfishClient, RedfishOptions};
use crate::{
    BmcAddress, BmcError, Credentials, FenceAction, FenceOptions, FenceStatus, PowerControl,
    PowerState, TlsTrust, fence,
};
use metalguard_api::bmc::CheckFailure;

const PASSWORD: &str = "pw-Zq81-never-shown";

#[derive(Debug, Clone)]
pub(super) struct Req {
    pub(super) method: String,
    pub(super) path: String,
    headers: Vec<(String, String)>,
    body: String,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub(super) struct Resp {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

pub(super) fn json(status: u16, body: &str) -> Resp {
    Resp {
        status,
        headers: vec![("Content-Type", "application/json".into())],
        body: body.to_owned(),
    }
}

/// `None`: accept the request and never answer.
type Handler = Arc<dyn Fn(&Req) -> Option<Resp> + Send + Sync>;

pub(super) struct Server {
    pub(super) url: String,
    pub(super) requests: Arc<Mutex<Vec<Req>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(super) async fn serve(
    handler: impl Fn(&Req) -> Option<Resp> + Send + Sync + 'static,
) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redfish+http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let handler: Handler = Arc::new(handler);
    let log = requests.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let n = stream.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let mut lines = head.split("\r\n");
                let mut first = lines.next().unwrap().split(' ');
                let method = first.next().unwrap().to_owned();
                let path = first.next().unwrap().to_owned();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|l| l.split_once(':'))
                    .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
                    .collect();
                let length: usize = headers
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
                    .map_or(0, |(_, v)| v.parse().unwrap());
                while buf.len() < head_end + length {
                    let n = stream.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
                let req = Req {
                    method,
                    path,
                    headers,
                    body,
                };
                log.lock().unwrap().push(req.clone());
                let Some(resp) = handler(&req) else {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    return;
                };
                let mut out = format!("HTTP/1.1 {} X\r\nConnection: close\r\n", resp.status);
                for (n, v) in &resp.headers {
                    let _ = write!(out, "{n}: {v}\r\n");
                }
                let _ = write!(
                    out,
                    "Content-Length: {}\r\n\r\n{}",
                    resp.body.len(),
                    resp.body
                );
                let _ = stream.write_all(out.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Server {
        url,
        requests,
        task,
    }
}

fn options() -> RedfishOptions {
    RedfishOptions {
        connect_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        retry_backoff: Duration::from_millis(10),
        ..RedfishOptions::default()
    }
}

pub(super) fn client(url: &str) -> RedfishClient {
    let address: BmcAddress = url.parse().unwrap();
    RedfishClient::new(
        &address,
        Credentials::new("admin", PASSWORD),
        &TlsTrust::SystemRoots,
        options(),
    )
    .unwrap()
}

pub(super) const ROOT: &str = r#"{"Systems":{"@odata.id":"/redfish/v1/Systems"}}"#;

fn system(state: &str, allowed: &str) -> String {
    format!(
        r##"{{"Id":"1","PowerState":"{state}","Actions":{{"#ComputerSystem.Reset":{{
        "target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        "ResetType@Redfish.AllowableValues":{allowed}}}}}}}"##
    )
}

/// A well-behaved BMC with one system whose power follows the last reset at once.
fn one_system(state: Arc<Mutex<String>>) -> impl Fn(&Req) -> Option<Resp> + Send + Sync {
    move |req| {
        Some(match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1") => json(200, ROOT),
            ("GET", "/redfish/v1/Systems") => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
            ),
            ("GET", "/redfish/v1/Systems/1") => json(
                200,
                &system(
                    &state.lock().unwrap(),
                    r#"["On","ForceOff","GracefulShutdown","ForceRestart"]"#,
                ),
            ),
            ("POST", "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset") => {
                let body: serde_json::Value = serde_json::from_str(&req.body).unwrap();
                let new = match body["ResetType"].as_str().unwrap() {
                    "ForceOff" => "Off",
                    _ => "On",
                };
                *state.lock().unwrap() = new.to_owned();
                json(204, "")
            }
            _ => json(404, "{}"),
        })
    }
}

fn assert_no_secret(text: &str) {
    assert!(!text.contains(PASSWORD), "password leaked: {text}");
}

fn error_chain(error: &BmcError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let _ = write!(text, " / {cause}");
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn fence_off_sends_odata_headers_and_basic_auth() {
    let state = Arc::new(Mutex::new("On".to_owned()));
    let server = serve(one_system(state.clone())).await;
    let mut bmc = client(&server.url);
    let outcome = fence(&mut bmc, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    bmc.close().await.unwrap();
    let requests = server.requests.lock().unwrap().clone();
    let lines: Vec<String> = requests
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        lines,
        [
            "GET /redfish/v1",
            "GET /redfish/v1/Systems",
            "GET /redfish/v1/Systems/1",
            "POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "GET /redfish/v1/Systems/1",
        ]
    );
    for req in &requests {
        assert_eq!(req.header("OData-Version"), Some("4.0"));
        assert_eq!(req.header("Accept"), Some("application/json"));
        assert!(req.header("Authorization").unwrap().starts_with("Basic "));
    }
    assert_eq!(requests[3].header("Content-Type"), Some("application/json"));
    assert_eq!(requests[3].body, r#"{"ResetType":"ForceOff"}"#);
    assert_no_secret(&outcome.timeline.to_string());
    assert_no_secret(&format!("{outcome:?}"));
}

#[tokio::test]
async fn several_systems_and_none_named_fails_and_lists_them() {
    let server = serve(|req| {
        Some(match req.path.as_str() {
            "/redfish/v1" => json(200, ROOT),
            "/redfish/v1/Systems" => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/a"},{"@odata.id":"/redfish/v1/Systems/b"}]}"#,
            ),
            _ => json(500, "{}"),
        })
    })
    .await;
    let mut bmc = client(&server.url);
    let error = bmc.power_state().await.unwrap_err();
    let BmcError::AmbiguousSystem { systems, .. } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(systems, "/redfish/v1/Systems/a, /redfish/v1/Systems/b");
    assert!(error.to_string().contains("name one of"));
    // Naming one works, and nothing was ever POSTed.
    let mut bmc = client(&format!("{}/redfish/v1/Systems/b", server.url));
    assert!(bmc.force_off().await.is_err());
    assert!(
        server
            .requests
            .lock()
            .unwrap()
            .iter()
            .all(|r| r.method == "GET")
    );
}

#[tokio::test]
async fn no_system_or_unknown_named_system_is_reported() {
    let server = serve(|req| {
        Some(match req.path.as_str() {
            "/redfish/v1" => json(200, ROOT),
            "/redfish/v1/Systems" => json(200, r#"{"Members":[]}"#),
            _ => json(404, r#"{"error":{"message":"not found"}}"#),
        })
    })
    .await;
    let error = client(&server.url).power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::SystemNotFound { ref wanted, .. } if wanted == "any"),
        "{error:?}"
    );
    let error = client(&format!("{}/redfish/v1/Systems/9", server.url))
        .power_state()
        .await
        .unwrap_err();
    assert!(
        matches!(error, BmcError::SystemNotFound { ref wanted, .. } if wanted == "/redfish/v1/Systems/9"),
        "{error:?}"
    );
}

#[tokio::test]
async fn wrong_password_is_an_authentication_error_without_the_secret() {
    let server = serve(|_| Some(json(401, r#"{"error":{"message":"bad creds"}}"#))).await;
    let error = client(&server.url).power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::Authentication { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("rejected the credentials"));
    assert_eq!(error.check_failure(), CheckFailure::CredentialsRefused);
    assert_no_secret(&error_chain(&error));
    assert_no_secret(&format!("{error:?}"));
}

#[tokio::test]
async fn a_refused_login_that_names_a_locked_account_is_classified_so() {
    // The lock named only in a MessageId, as some services do; and in the message.
    for body in [
        r#"{"error":{"message":"Login failed","@Message.ExtendedInfo":[{"MessageId":"Acme.1.0.AccountLocked"}]}}"#,
        r#"{"error":{"@Message.ExtendedInfo":[{"Message":"The account is disabled."}]}}"#,
    ] {
        let server = serve(move |_| Some(json(401, body))).await;
        let error = client(&server.url).power_state().await.unwrap_err();
        assert_eq!(
            error.check_failure(),
            CheckFailure::AccountLocked,
            "{error}"
        );
    }
    let server = serve(|_| Some(json(403, r#"{"error":{"message":"no"}}"#))).await;
    let error = client(&server.url).power_state().await.unwrap_err();
    assert_eq!(error.check_failure(), CheckFailure::InsufficientPrivilege);
    let server = serve(|_| Some(json(500, r#"{"error":{"message":"oops"}}"#))).await;
    let error = client(&server.url).power_state().await.unwrap_err();
    assert_eq!(error.check_failure(), CheckFailure::UnexpectedAnswer);
}

#[tokio::test]
async fn unsupported_reset_type_is_refused_before_sending() {
    let server = serve(|req| {
        Some(match req.path.as_str() {
            "/redfish/v1" => json(200, ROOT),
            "/redfish/v1/Systems" => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
            ),
            _ => json(200, &system("On", r#"["On","GracefulShutdown"]"#)),
        })
    })
    .await;
    let mut bmc = client(&server.url);
    let error = bmc.force_off().await.unwrap_err();
    let BmcError::Unsupported {
        allowed, operation, ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(operation, "power off");
    assert_eq!(allowed, "On, GracefulShutdown");
    let caps = bmc.capabilities().await.unwrap();
    assert!(caps.power_on && caps.graceful_off && !caps.force_off && !caps.power_cycle);
    assert!(
        server
            .requests
            .lock()
            .unwrap()
            .iter()
            .all(|r| r.method == "GET")
    );
}

#[tokio::test]
async fn unsupported_media_type_and_server_errors_are_precise() {
    let server = serve(|req| {
        Some(match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1") => json(200, ROOT),
            ("GET", "/redfish/v1/Systems") => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
            ),
            ("GET", _) => json(200, &system("On", r#"["On","ForceOff"]"#)),
            _ => json(
                415,
                r#"{"error":{"@Message.ExtendedInfo":[{"Message":"Unsupported media type"}]}}"#,
            ),
        })
    })
    .await;
    let error = client(&server.url).force_off().await.unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "bmc {} answered POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset ForceOff with http status 415: Unsupported media type",
            server.url.replace("redfish+http", "http")
        )
    );
}

#[tokio::test]
async fn transient_5xx_and_retry_after_are_retried_for_reads() {
    let count = Arc::new(Mutex::new(0));
    let seen = count.clone();
    let server = serve(move |req| {
        let mut n = seen.lock().unwrap();
        *n += 1;
        Some(match (*n, req.path.as_str()) {
            (1, _) => Resp {
                status: 503,
                headers: vec![("Retry-After", "1".into())],
                body: String::new(),
            },
            (2, _) => json(500, "{}"),
            (_, "/redfish/v1") => json(200, ROOT),
            (_, "/redfish/v1/Systems") => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
            ),
            _ => json(200, &system("PoweringOff", "[]")),
        })
    })
    .await;
    let mut bmc = client(&server.url);
    let started = std::time::Instant::now();
    let state = bmc.power_state().await.unwrap();
    assert_eq!(state, PowerState::PoweringOff);
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After was not honoured"
    );
    let timeline = bmc.timeline_mut().to_string();
    assert!(timeline.contains("retrying in 1s"), "{timeline}");
    // A fourth consecutive 5xx is not retried forever.
    let server = serve(|_| Some(json(502, "{}"))).await;
    let error = client(&server.url).power_state().await.unwrap_err();
    assert!(matches!(error, BmcError::HttpStatus { status: 502, .. }));
    assert_eq!(server.requests.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn failed_reset_is_resent_only_after_reading_the_state() {
    let posts = Arc::new(Mutex::new(0));
    let counter = posts.clone();
    let server = serve(move |req| {
        Some(match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1") => json(200, ROOT),
            ("GET", "/redfish/v1/Systems") => json(
                200,
                r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
            ),
            ("GET", _) => {
                let state = if *counter.lock().unwrap() > 0 {
                    "Off"
                } else {
                    "On"
                };
                json(200, &system(state, r#"["On","ForceOff"]"#))
            }
            _ => {
                // The BMC acts on the reset but answers 503.
                *counter.lock().unwrap() += 1;
                json(503, "{}")
            }
        })
    })
    .await;
    let mut bmc = client(&server.url);
    bmc.force_off().await.unwrap();
    assert_eq!(*posts.lock().unwrap(), 1, "the reset was re-sent blindly");
    let lines: Vec<String> = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(lines.last().unwrap(), "GET /redfish/v1/Systems/1");
    assert!(
        bmc.timeline_mut()
            .to_string()
            .contains("already done (off): not re-sent")
    );
}

#[tokio::test]
async fn conflict_on_force_off_is_success_only_when_off() {
    for (state, ok) in [("Off", true), ("On", false)] {
        let server = serve(move |req| {
            Some(match (req.method.as_str(), req.path.as_str()) {
                ("GET", "/redfish/v1") => json(200, ROOT),
                ("GET", "/redfish/v1/Systems") => json(
                    200,
                    r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
                ),
                ("GET", _) => json(200, &system(state, r#"["On","ForceOff"]"#)),
                _ => json(409, "{}"),
            })
        })
        .await;
        let result = client(&server.url).force_off().await;
        assert_eq!(result.is_ok(), ok, "{state}: {result:?}");
        if !ok {
            assert!(matches!(
                result,
                Err(BmcError::HttpStatus { status: 409, .. })
            ));
        }
    }
}

#[tokio::test]
async fn garbage_json_is_a_decode_error() {
    for body in [
        "<html>oops</html>",
        r#"{"Systems": 5}"#,
        "{\"Systems\":{\"@odata.id\":",
    ] {
        let body = body.to_owned();
        let server = serve(move |_| Some(json(200, &body))).await;
        let error = client(&server.url).power_state().await.unwrap_err();
        assert!(
            matches!(error, BmcError::Decode { ref what, .. } if what == "GET /redfish/v1"),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn a_peer_that_never_answers_times_out_per_request() {
    let server = serve(|_| None).await;
    let mut bmc = client(&server.url);
    let started = std::time::Instant::now();
    let error = bmc.power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::Timeout { ref what, .. } if what == "GET /redfish/v1"),
        "{error:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn not_listening_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redfish+http://{}", listener.local_addr().unwrap());
    drop(listener);
    let error = client(&url).power_state().await.unwrap_err();
    assert!(matches!(error, BmcError::Connect { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with("could not connect to bmc http://127.0.0.1:")
    );
}

#[tokio::test]
async fn session_is_used_and_logged_out() {
    let state = Arc::new(Mutex::new("On".to_owned()));
    let inner = one_system(state);
    let server = serve(move |req| match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/redfish/v1") => Some(json(
            200,
            r#"{"Systems":{"@odata.id":"/redfish/v1/Systems"},
                "Links":{"Sessions":{"@odata.id":"/redfish/v1/SessionService/Sessions"}}}"#,
        )),
        ("POST", "/redfish/v1/SessionService/Sessions") => Some(Resp {
            status: 201,
            headers: vec![
                ("X-Auth-Token", "tok-123".into()),
                ("Location", "/redfish/v1/SessionService/Sessions/7".into()),
            ],
            body: "{}".into(),
        }),
        ("DELETE", "/redfish/v1/SessionService/Sessions/7") => Some(json(204, "")),
        _ => inner(req),
    })
    .await;
    let mut bmc = client(&server.url);
    assert_eq!(bmc.power_state().await.unwrap(), PowerState::On);
    bmc.close().await.unwrap();
    bmc.close().await.unwrap();
    let requests = server.requests.lock().unwrap().clone();
    let login = &requests[1];
    assert!(login.header("Authorization").is_none());
    assert!(login.body.contains(PASSWORD));
    for req in &requests[2..requests.len() - 1] {
        assert_eq!(req.header("X-Auth-Token"), Some("tok-123"), "{req:?}");
        assert!(req.header("Authorization").is_none());
    }
    let last = requests.last().unwrap();
    assert_eq!(
        (last.method.as_str(), last.path.as_str()),
        ("DELETE", "/redfish/v1/SessionService/Sessions/7")
    );
    assert_eq!(requests.iter().filter(|r| r.method == "DELETE").count(), 1);
    assert_no_secret(&bmc.timeline_mut().to_string());
}

#[tokio::test]
async fn allowable_values_from_action_info() {
    let server = serve(|req| {
        Some(match req.path.as_str() {
            "/redfish/v1" => json(200, ROOT),
            "/redfish/v1/Systems" => json(200, r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#),
            "/redfish/v1/Systems/1/ResetActionInfo" => json(
                200,
                r#"{"Parameters":[{"Name":"ResetType","AllowableValues":["ForceOn","ForceOff","PowerCycle"]}]}"#,
            ),
            _ => json(
                200,
                r##"{"PowerState":"Off","Actions":{"#ComputerSystem.Reset":{
                "target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                "@Redfish.ActionInfo":"/redfish/v1/Systems/1/ResetActionInfo"}}}"##,
            ),
        })
    })
    .await;
    let mut bmc = client(&server.url);
    let caps = bmc.capabilities().await.unwrap();
    assert!(caps.power_on && caps.force_off && caps.power_cycle && !caps.graceful_off);
    bmc.power_on().await.unwrap();
    let requests = server.requests.lock().unwrap().clone();
    assert_eq!(requests.last().unwrap().body, r#"{"ResetType":"ForceOn"}"#);
}

#[tokio::test]
async fn truncated_answers_are_transport_errors() {
    // Promises 500 bytes, sends 20, closes: a broken exchange, retried, then reported.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redfish+http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"Systems\":{\"@odata")
                .await;
            let _ = stream.shutdown().await;
        }
    });
    let error = client(&url).power_state().await.unwrap_err();
    task.abort();
    assert!(
        matches!(error, BmcError::Transport { ref what, .. } if what == "GET /redfish/v1"),
        "{error:?}"
    );
    assert!(error.is_transient());
}

#[tokio::test]
async fn reboot_is_fenced_when_the_bmc_refuses_power_on() {
    let state = Arc::new(Mutex::new("On".to_owned()));
    let inner = one_system(state.clone());
    let server = serve(move |req| {
        if req.method == "POST" && req.body.contains("\"On\"") {
            return Some(json(
                400,
                r#"{"error":{"@Message.ExtendedInfo":[{"Message":"power on is locked"}]}}"#,
            ));
        }
        inner(req)
    })
    .await;
    let mut bmc = client(&server.url);
    let outcome = fence(&mut bmc, FenceAction::Reboot, &FenceOptions::default()).await;
    let FenceStatus::FencedPowerOnFailed(error) = &outcome.status else {
        panic!("{outcome:?}");
    };
    assert!(error.to_string().contains("power on is locked"), "{error}");
    assert!(outcome.status.is_fenced() && outcome.status.is_success());
    assert_eq!(*state.lock().unwrap(), "Off");
    assert!(
        outcome
            .timeline
            .to_string()
            .contains("fenced: power off verified, but powering the host on again failed")
    );
}

/// What a hostile or broken BMC may put in every string it sends: escape sequences that clear
/// a terminal, many kilobytes of them.
fn hostile(n: usize) -> String {
    "\\u001b[2J\\u001b]0;pwned\\u0007".repeat(n)
}

fn assert_tame(what: &str, text: &str) {
    assert!(text.len() < 2_000, "{what}: {} bytes", text.len());
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{what}: raw control characters"
    );
}

#[tokio::test]
async fn hostile_bmc_strings_are_cut_and_escaped_in_errors_and_the_timeline() {
    let members: Vec<String> = (0..30)
        .map(|i| {
            format!(
                r#"{{"@odata.id":"/redfish/v1/Systems/{i}{}"}}"#,
                hostile(1_000)
            )
        })
        .collect();
    let members = format!(r#"{{"Members":[{}]}}"#, members.join(","));
    let allowed: Vec<String> = (0..30)
        .map(|i| format!(r#""Reset{i}{}""#, hostile(500)))
        .collect();
    let allowed = format!("[{}]", allowed.join(","));
    let state = hostile(5_000);
    let server = serve(move |req| {
        Some(match req.path.as_str() {
            "/redfish/v1" => json(200, ROOT),
            "/redfish/v1/Systems" => json(200, &members),
            "/redfish/v1/Systems/1" => json(200, &system(&state, &allowed)),
            _ => json(
                500,
                &format!(r#"{{"error":{{"message":"{}"}}}}"#, hostile(20_000)),
            ),
        })
    })
    .await;
    // Several systems, none named: the error lists them.
    let mut bmc = client(&server.url);
    let error = bmc.power_state().await.unwrap_err();
    assert!(
        matches!(error, BmcError::AmbiguousSystem { .. }),
        "{error:?}"
    );
    assert_tame("systems", &error_chain(&error));
    // The named system reports a hostile power state and hostile reset types.
    let mut bmc = client(&format!("{}/redfish/v1/Systems/1", server.url));
    let state = bmc.power_state().await.unwrap();
    assert_tame("power state", &state.to_string());
    let error = bmc.force_off().await.unwrap_err();
    assert!(matches!(error, BmcError::Unsupported { .. }), "{error:?}");
    assert_tame("allowed", &error_chain(&error));
    for entry in bmc.timeline_mut().entries() {
        assert_tame("timeline", &entry.what);
    }
    // An error answer's message.
    let mut bmc = client(&format!("{}/redfish/v1/Systems/2", server.url));
    let error = bmc.power_state().await.unwrap_err();
    assert_tame("http status", &error_chain(&error));
}
