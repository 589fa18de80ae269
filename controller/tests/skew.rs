//! Mixed versions (issue 26, item 5), against the real binary and a real etcd: every answer
//! carries the controller's release; a newer agent's unknown fields are left out while the
//! same release's are refused; an agent outside the skew policy is given no command but is
//! still heard (its reports are read, and the metrics name its release as unsupported); a
//! version header that is not a version is refused.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_api::protocol::{ErrorBody, commands_path, report_path};
use metalguard_api::skew::{VERSION_HEADER, Version};
use metalguard_e2e::ports::reserve_port;

/// A release `minors` minor versions from ours (same major).
fn ours_plus(minors: i64) -> String {
    let ours = Version::ours();
    let minor = i64::try_from(ours.minor).unwrap() + minors;
    format!("{}.{}.0", ours.major, minor.max(0))
}

/// w-1's report as JSON with `extra` fields (`,"name":value…`).
fn report_json(sequence: u64, extra: &str) -> String {
    let plain = serde_json::to_string(&report("w-1", sequence)).unwrap();
    format!("{}{extra}}}", plain.strip_suffix('}').unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newer_agents_fields_are_left_out_and_an_agent_outside_the_policy_gets_no_command() {
    let lab = Lab::start();
    let (port, metrics_port) = (reserve_port().unwrap(), reserve_port().unwrap());
    let extra = format!("metrics_listen = \"127.0.0.1:{}\"", metrics_port.port());
    let controller = lab.controller_with("ctl-a", &port, &extra);
    // Without a default release header: each request says its own, or none.
    let w1 = client_unversioned(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    let report_url = url(port.port(), &report_path("w-1"));
    let send = |version: Option<String>, body: String| {
        let mut request = w1
            .post(&report_url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(version) = version {
            request = request.header(VERSION_HEADER, version);
        }
        request.send()
    };

    // Every answer says the controller's release, errors too.
    let answer = send(Some(ours_plus(0)), report_json(2, "")).await.unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    let said = answer
        .headers()
        .get(VERSION_HEADER)
        .unwrap()
        .to_str()
        .unwrap();
    assert_eq!(Version::parse(said).unwrap(), Version::ours());

    // A field this release does not know: left out from the next minor release, refused
    // (naming it) from this release and from one that sends no version.
    let unknown = r#","coming_in_a_later_release":{"x":[1,2]}"#;
    let newer = send(Some(ours_plus(1)), report_json(3, unknown))
        .await
        .unwrap();
    assert_eq!(
        newer.status().as_u16(),
        200,
        "{}",
        newer.text().await.unwrap()
    );
    for version in [Some(ours_plus(0)), None] {
        let answer = send(version.clone(), report_json(4, unknown))
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 422, "{version:?}");
        assert!(answer.headers().contains_key(VERSION_HEADER));
        let body: ErrorBody = answer.json().await.unwrap();
        assert!(
            body.error.contains("coming_in_a_later_release"),
            "{}",
            body.error
        );
    }
    // A newer agent's known field of the wrong type is still refused.
    let wrong = send(
        Some(ours_plus(1)),
        report_json(5, "").replace(r#""sequence":5"#, r#""sequence":"five""#),
    )
    .await
    .unwrap();
    assert_eq!(wrong.status().as_u16(), 422);

    // Two minor releases ahead: its report is read (strictly), its long-poll refused (426)
    // naming both releases, and the metrics name it unsupported.
    let far = ours_plus(2);
    let heard = send(Some(far.clone()), report_json(6, "")).await.unwrap();
    assert_eq!(heard.status().as_u16(), 200);
    let poll = w1
        .get(url(port.port(), &commands_path("w-1", Duration::ZERO)))
        .header(VERSION_HEADER, &far)
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status().as_u16(), 426);
    let body: ErrorBody = poll.json().await.unwrap();
    assert!(
        body.error.contains(&format!("agent {far}")) && body.error.contains("skew"),
        "{}",
        body.error
    );
    let supported = format!(
        "metalguard_controller_agent_release{{host=\"w-1\",version=\"{far}\",supported=\"false\"}} 1"
    );
    let started = Instant::now();
    loop {
        let exposition = scrape(metrics_port.port());
        if exposition.contains(&supported) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no {supported} in\n{exposition}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        controller
            .log_tail(200)
            .contains("outside the skew policy: its reports are read, it is given no command"),
        "{}",
        controller.log_tail(50)
    );
    // The same agent within the policy again polls as before.
    let poll = w1
        .get(url(port.port(), &commands_path("w-1", Duration::ZERO)))
        .header(VERSION_HEADER, ours_plus(0))
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status().as_u16(), 200);

    // A version header that is not a version: 400, for a report and for a long-poll.
    let garbage = send(Some("latest".to_owned()), report_json(7, ""))
        .await
        .unwrap();
    assert_eq!(garbage.status().as_u16(), 400);
    let poll = w1
        .get(url(port.port(), &commands_path("w-1", Duration::ZERO)))
        .header(VERSION_HEADER, "latest")
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status().as_u16(), 400);
}
