//! End to end: etcd hits its space quota (the NOSPACE alarm) on a three-host lab with real
//! etcd 3.4 members (`--quota-backend-bytes` 2 MiB), real agents and the real controller.
//!
//! A NOSPACE member refuses writes but still serves reads and votes; no fence cures it
//! (compaction, defragmentation and `etcdctl alarm disarm` do). So: for longer than the
//! health check's unhealthy timeout plus the heartbeat timeout plus the lab's overhead, no
//! BMC may see a power event and no remediation may start; every agent keeps
//! `EtcdMemberHealthy` True and reports `EtcdNoSpace` True; `metalguard-controller status`
//! names the alarm and the member (host) that raised it. Then the runbook's recovery clears
//! the alarm, the agents report `EtcdNoSpace` False again and every host is healthy.
//!
//! While the alarm is active the controller's own store (the same etcd) refuses writes too:
//! reports cannot be recorded, which is why `status` reads the alarm from etcd itself.
//! Runs in the nextest test group `lab` (binary name `lab*`), one lab at a time.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use metalguard_e2e::HarnessError;
use metalguard_e2e::lab::scenarios::OVERHEAD;
use metalguard_e2e::lab::{Lab, LabOptions};
use metalguard_e2e::soak::recorder::unix_ms;
use serde_json::Value;

/// etcd's space quota in the lab: small, so a few puts fill it.
const QUOTA: u64 = 2 * 1024 * 1024;
/// One value: below Linux's 128 KiB limit of one command-line argument (etcdctl takes it so).
const VALUE_BYTES: usize = 100 * 1024;
/// etcd's answer to a write over the quota (DOMAIN.md §1).
const NOSPACE_ERROR: &str = "etcdserver: mvcc: database space exceeded";

/// Puts large values until etcd refuses one for space; returns how many were accepted.
fn fill_until_nospace(lab: &Lab) -> usize {
    let value = "x".repeat(VALUE_BYTES);
    for i in 0..200 {
        match lab.etcd().put(&format!("/lab/nospace/{i:03}"), &value) {
            Ok(()) => {}
            Err(HarnessError::Command { detail, .. }) if detail.contains(NOSPACE_ERROR) => {
                return i;
            }
            Err(other) => panic!("put {i} failed otherwise: {other}"),
        }
    }
    panic!("a {QUOTA}-byte quota was never reached")
}

/// The agent's own view (`/status` on its metrics port): condition → (healthy, reason).
fn agent_probes(lab: &Lab, i: usize) -> Vec<(String, Option<bool>, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], lab.hosts()[i].metrics_port()));
    let Some((200, body)) = metalguard_e2e::http::get(addr, "/status", Duration::from_secs(2))
    else {
        return Vec::new();
    };
    let status: Value = serde_json::from_str(&body).unwrap();
    status["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["condition"].as_str().unwrap().to_owned(),
                p["healthy"].as_bool(),
                p["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Whether host `i`'s agent sees the member healthy and the NOSPACE pressure as `pressure`.
fn agent_sees(lab: &Lab, i: usize, pressure: bool) -> bool {
    let probes = agent_probes(lab, i);
    let member_ok = probes
        .iter()
        .any(|(c, healthy, _)| c == "EtcdMemberHealthy" && *healthy == Some(true));
    let nospace = probes.iter().any(|(c, healthy, reason)| {
        c == "EtcdNoSpace"
            && *healthy == Some(!pressure)
            && reason == if pressure { "AlarmNoSpace" } else { "NoAlarm" }
    });
    member_ok && nospace
}

/// The NOSPACE alarms `status --json` lists, as member names.
fn nospace_alarms(status: &Value) -> Vec<String> {
    status["etcd_alarms"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter(|a| a["alarm"] == "NOSPACE")
                .map(|a| a["member"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The condition `type_` of host `host` in the stored reports of `status --json`.
fn stored_condition(status: &Value, host: &str, type_: &str) -> Option<String> {
    status["agents"][host]["report"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_owned)
}

/// Compaction, defragmentation of every member, then disarm (docs/runbooks.md).
fn recover(lab: &Lab) {
    let etcd = lab.etcd();
    etcd.etcdctl(&["del", "--prefix", "/lab/nospace/"]).unwrap();
    let status = etcd.etcdctl(&["endpoint", "status", "-w", "json"]).unwrap();
    let statuses: Vec<Value> = serde_json::from_str(&status).unwrap();
    let revision = statuses[0]["Status"]["header"]["revision"]
        .as_u64()
        .unwrap();
    etcd.etcdctl(&["compact", &revision.to_string()]).unwrap();
    etcd.etcdctl(&["defrag"]).unwrap();
    etcd.etcdctl(&["alarm", "disarm"]).unwrap();
}

#[test]
fn a_nospace_alarm_is_reported_and_nothing_is_fenced() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.quota_backend_bytes = Some(QUOTA);
    let mut lab = Lab::start(options).unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&mut lab)));
    if let Err(panic) = result {
        eprintln!("--- timeline\n{}", lab.timeline.render());
        eprintln!("{}", lab.logs());
        std::panic::resume_unwind(panic);
    }
}

fn scenario(lab: &mut Lab) {
    let t = lab.options().timings.clone();
    let names: Vec<String> = lab.hosts().iter().map(|h| h.name.clone()).collect();
    let since = unix_ms();
    let accepted = fill_until_nospace(lab);
    lab.timeline.add(
        "lab",
        format!("etcd refused put {accepted} for space: {NOSPACE_ERROR}"),
        format!("quota {QUOTA} bytes, values of {VALUE_BYTES} bytes"),
    );

    // Every agent: the member stays healthy, the alarm is reported as a pressure.
    lab.wait_for(
        "every agent to report EtcdNoSpace True and EtcdMemberHealthy True",
        Duration::from_secs(10),
        |lab| Ok((0..3).all(|i| agent_sees(lab, i, true))),
    )
    .unwrap();
    // The controller's status names the alarm and the member (the host) that raised it.
    let status = lab.status().unwrap();
    let raised_by = nospace_alarms(&status);
    assert!(
        !raised_by.is_empty() && raised_by.iter().all(|m| names.contains(m)),
        "status --json etcd_alarms: {}",
        status["etcd_alarms"]
    );

    // Long enough for any health check, heartbeat and the lab's overhead: nothing happens.
    lab.idle(t.unhealthy_timeout + t.heartbeat_timeout + OVERHEAD)
        .unwrap();
    let events = lab.power_events_since(since).unwrap();
    assert!(events.is_empty(), "power events under NOSPACE: {events:?}");
    let remediations = lab.remediations();
    assert!(
        remediations.is_empty(),
        "remediations under NOSPACE: {remediations:?}"
    );
    assert!(
        (0..3).all(|i| agent_sees(lab, i, true)),
        "{:?}",
        (0..3).map(|i| agent_probes(lab, i)).collect::<Vec<_>>()
    );
    let text = lab.controller_cli(&["status"]).unwrap();
    for member in &raised_by {
        assert!(
            text.contains("NOSPACE raised by member")
                && text.contains(&format!("({member}): etcd refuses writes")),
            "{text}"
        );
    }
    assert!(text.contains("etcdctl alarm disarm"), "{text}");
    eprintln!("--- status under NOSPACE\n{text}");

    // The runbook's recovery: the alarm clears, the agents say so, every host is healthy.
    recover(lab);
    lab.timeline.add(
        "lab",
        "deleted the filler, compacted, defragmented every member, disarmed",
        "docs/runbooks.md \"etcd NOSPACE alarm\"",
    );
    lab.wait_for(
        "the alarm to clear in status and in every stored report",
        Duration::from_secs(20),
        |lab| {
            let status = lab.status()?;
            Ok(nospace_alarms(&status).is_empty()
                && names.iter().all(|h| {
                    stored_condition(&status, h, "EtcdNoSpace").as_deref() == Some("False")
                })
                && (0..3).all(|i| agent_sees(lab, i, false)))
        },
    )
    .unwrap();
    lab.wait_all_healthy(Duration::from_secs(30)).unwrap();
    let events = lab.power_events_since(since).unwrap();
    assert!(events.is_empty(), "power events: {events:?}");
    assert!(lab.remediations().is_empty(), "{:?}", lab.remediations());
}
