//! What an operator installs beside metalguard, checked: the alert rules
//! (`packaging/prometheus/metalguard-rules.yaml`) pass `promtool check rules` and their unit
//! tests (`tests.yaml`), the PrometheusRule (`packaging/kubernetes/monitoring/`) is generated
//! from them, every alert has its runbook section, the dashboard
//! (`packaging/grafana/metalguard-dashboard.json`) is valid PromQL, and a real controller on
//! real etcd fires the rules from its own `/metrics`. That every metric they read is exported
//! is checked against each registry by unit tests (controller `metrics.rs`, agent
//! `daemon/metrics.rs`), which can give every family a series.
//!
//! `UPDATE_ALERTS=1 cargo nextest run -p metalguard-controller --test alerts` rewrites the
//! PrometheusRule from the rules file.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use metalguard_e2e::ports::reserve_port;
use serde_json::{Value, json};

const RULES: &str = "packaging/prometheus/metalguard-rules.yaml";
const RULE_TESTS: &str = "packaging/prometheus/tests.yaml";
const PROMETHEUS_RULE: &str = "packaging/kubernetes/monitoring/prometheusrule.yaml";
const DASHBOARD: &str = "packaging/grafana/metalguard-dashboard.json";
const RUNBOOKS: &str = "docs/runbooks.md";

/// What precedes the rules file's groups in the PrometheusRule.
const PROMETHEUS_RULE_HEAD: &str = "\
# Generated from packaging/prometheus/metalguard-rules.yaml (its groups, as they are) by
# controller/tests/alerts.rs: edit that file, then run
# `UPDATE_ALERTS=1 cargo nextest run -p metalguard-controller --test alerts`.
# Needs the Prometheus Operator's CRDs: see kustomization.yaml beside this file.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: metalguard
  namespace: metalguard-system
  labels:
    app.kubernetes.io/name: metalguard-controller
    app.kubernetes.io/part-of: metalguard
spec:
";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not valid yaml: {e}"))
}

/// Runs promtool with `args` in `dir`; its output, and whether it succeeded.
fn promtool(dir: &Path, args: &[&str]) -> (bool, String) {
    let bin = metalguard_e2e::tools::promtool_bin().unwrap();
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every rule of the rules file.
fn rules() -> Vec<Value> {
    yaml(RULES)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

/// Every PromQL expression of the dashboard's panels.
fn dashboard_exprs() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_shipped_rules_pass_promtool_check_and_their_unit_tests() {
    let (ok, out) = promtool(&repo(), &["check", "rules", RULES]);
    assert!(ok, "{out}");
    assert!(out.contains("SUCCESS: 9 rules found"), "{out}");
    let (ok, out) = promtool(
        &repo().join("packaging/prometheus"),
        &["test", "rules", "tests.yaml"],
    );
    assert!(ok, "{out}");
    // The unit tests cover every alert.
    let tested = read(RULE_TESTS);
    for rule in rules() {
        let name = rule["alert"].as_str().unwrap();
        assert!(
            tested.contains(&format!("alertname: {name}")),
            "{name} has no unit test in {RULE_TESTS}"
        );
    }
}

#[test]
fn the_prometheus_rule_is_the_rules_file() {
    let rules = read(RULES);
    let body: String = rules
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| {
            if l.is_empty() {
                "\n".to_owned()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    let want = format!("{PROMETHEUS_RULE_HEAD}{body}");
    if std::env::var_os("UPDATE_ALERTS").is_some() {
        std::fs::write(repo().join(PROMETHEUS_RULE), &want).unwrap();
    }
    assert_eq!(
        read(PROMETHEUS_RULE),
        want,
        "{PROMETHEUS_RULE} is stale: run UPDATE_ALERTS=1 cargo nextest run -p metalguard-controller --test alerts"
    );
    // Parsed, its spec holds exactly the rules file's groups.
    let resource = yaml(PROMETHEUS_RULE);
    assert_eq!(resource["kind"], "PrometheusRule");
    assert_eq!(resource["spec"], yaml(RULES));
    let listed = yaml("packaging/kubernetes/monitoring/kustomization.yaml");
    assert_eq!(
        listed["resources"],
        json!(["podmonitor.yaml", "prometheusrule.yaml"])
    );
}

/// GitHub's anchor of a Markdown heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn every_alert_has_a_summary_a_description_and_a_runbook_section() {
    let runbooks = read(RUNBOOKS);
    let anchors: BTreeSet<String> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
        .map(anchor)
        .collect();
    let rules = rules();
    assert_eq!(rules.len(), 9);
    for rule in &rules {
        let name = rule["alert"].as_str().unwrap();
        let notes = &rule["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            assert!(
                notes[key].as_str().is_some_and(|s| !s.trim().is_empty()),
                "{name} has no {key}"
            );
        }
        assert!(
            ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap()),
            "{name}"
        );
        let url = notes["runbook_url"].as_str().unwrap();
        let (page, section) = url.split_once('#').unwrap();
        assert!(page.ends_with(RUNBOOKS), "{name}: {url}");
        assert_eq!(section, name.to_lowercase(), "{name}: its own section");
        assert!(
            anchors.contains(section),
            "{name}: {RUNBOOKS} has no section #{section}"
        );
    }
}

#[test]
fn every_dashboard_expression_is_valid_promql() {
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{exprs:?}");
    // As recording rules, promtool parses them ($__rate_interval is Grafana's).
    let rules: Vec<Value> = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"record": format!("dashboard:panel_{i}"), "expr": e.replace("$__rate_interval", "5m")}))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-rules.yaml");
    std::fs::write(
        &file,
        json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string(),
    )
    .unwrap();
    let (ok, out) = promtool(dir.path(), &["check", "rules", "dashboard-rules.yaml"]);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", exprs.len())),
        "{out}"
    );
}

/// The scraped samples as promtool input series, each labelled as Prometheus would
/// (`instance`, `job`) and constant over the test.
fn input_series(exposition: &str, instance: &str) -> Vec<Value> {
    let target = format!("instance=\"{instance}\",job=\"metalguard-controller\"");
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            if !value.is_finite() {
                return None;
            }
            let series = match series.strip_suffix('}') {
                Some(labelled) => format!("{labelled},{target}}}"),
                None => format!("{series}{{{target}}}"),
            };
            Some(json!({"series": series, "values": format!("{value}+0x40")}))
        })
        .collect()
}

/// The alert `name` as promtool expects it fired by series `labels` with `value`: the rule's
/// labels and its annotations with `$value` and `$labels.host` filled in.
fn expected_alert(name: &str, labels: &Value, value: &str) -> Value {
    let rule = rules()
        .into_iter()
        .find(|r| r["alert"] == name)
        .unwrap_or_else(|| panic!("no rule {name}"));
    let mut exp_labels = labels.clone();
    for (k, v) in rule["labels"].as_object().unwrap() {
        exp_labels[k] = v.clone();
    }
    let host = labels["host"].as_str().unwrap_or("");
    let mut exp_annotations = json!({});
    for (k, v) in rule["annotations"].as_object().unwrap() {
        let text = v
            .as_str()
            .unwrap()
            .replace("{{ $value }}", value)
            .replace("{{ $labels.host }}", host)
            .replace(
                "{{ $labels.failure }}",
                labels["failure"].as_str().unwrap_or(""),
            );
        assert!(
            !text.contains("{{"),
            "{name}: a template this test does not fill: {text}"
        );
        exp_annotations[k] = json!(text);
    }
    json!({"exp_labels": exp_labels, "exp_annotations": exp_annotations})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_controller_fires_quorum_at_risk_unreachable_bmcs_and_failing_checks_from_its_own_metrics()
 {
    let lab = Lab::start();
    let (port, metrics_port) = (reserve_port().unwrap(), reserve_port().unwrap());
    let extra = format!("metrics_listen = \"127.0.0.1:{}\"", metrics_port.port());
    let controller = lab.controller_with("ctl-a", &port, &extra);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    // cp-1's agent: a single healthy voter, which tolerates no failure. It reaches w-2's BMC
    // but its credentialed check was refused; nobody reports on w-1's BMC (the inventory has
    // only those two); w-2 never reports at all. cp-1 is the only agent that could fence.
    let mut cp = report("cp-1", 1);
    cp.etcd = Some(single_voter_view());
    cp.bmc_reachability = vec![metalguard_api::protocol::BmcReachability {
        host: "w-2".into(),
        reachable: true,
        checked_at: metalguard_api::duration::Timestamp(1),
        error: None,
        check: Some(metalguard_api::protocol::BmcCheck {
            failure: Some(metalguard_api::bmc::CheckFailure::CredentialsRefused),
            power_state: None,
            identity: None,
            detail: "the BMC refused the login (401)".into(),
            credentials_id: None,
            request: None,
        }),
    }];
    let status = client(&lab.tls(), Some("cp-1"))
        .post(url(
            port.port(),
            &metalguard_api::protocol::report_path("cp-1"),
        ))
        .json(&cp)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200);
    // w-1 speaks for w-2: refused (403), and counted.
    assert_eq!(post_report(&w1, port.port(), "w-2", "w-2").await, Ok(403));
    let started = Instant::now();
    let exposition = loop {
        let response = scrape(metrics_port.port());
        let body = response
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_owned());
        if body.contains("metalguard_controller_etcd_voters 1")
            && body.contains(
                "metalguard_controller_agent_certificate_expiry_timestamp_seconds{host=\"cp-1\"}",
            )
            && body.contains("metalguard_controller_api_refusals_total{code=\"403\"}")
        {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the leader never planned with cp-1's member:\n{body}\n{}",
            controller.log_tail(2000)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for line in [
        "metalguard_controller_leader 1",
        "metalguard_controller_etcd_healthy_voters 1",
        "metalguard_controller_etcd_failure_tolerance 0",
        "metalguard_controller_bmc_reachable_agents{host=\"w-1\"} 0",
        "metalguard_controller_fencing_ready{host=\"w-1\",failure=\"\"} -1",
        "metalguard_controller_fencing_ready{host=\"w-2\",failure=\"credentials-refused\"} 0",
        "metalguard_controller_agent_silent{host=\"cp-1\"} 0",
        "metalguard_controller_agent_silent{host=\"w-1\"} 0",
        "metalguard_controller_api_refusals_total{code=\"403\"} 1",
    ] {
        assert!(exposition.contains(line), "{line}\n{exposition}");
    }
    assert!(
        !exposition.contains("metalguard_controller_agent_silent{host=\"w-2\"}"),
        "a worker never heard of has no agent to be silent\n{exposition}"
    );
    // The certificates it runs with: a year left on the server's, whatever the alert says.
    let server = exposition
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "metalguard_controller_certificate_expiry_timestamp_seconds{certificate=\"server\"} ",
            )
        })
        .unwrap_or_else(|| panic!("no server certificate end\n{exposition}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let left = server.parse::<u64>().unwrap().saturating_sub(now);
    assert!(
        (360 * 86400..=366 * 86400).contains(&left),
        "{left}s left on the server certificate"
    );

    // Fed to the shipped rules as Prometheus would have scraped them for 40 minutes.
    let labels = |host: Option<&str>| {
        let mut l = json!({"instance": "ctl-a", "job": "metalguard-controller"});
        if let Some(host) = host {
            l["host"] = json!(host);
        }
        l
    };
    let none: Vec<Value> = Vec::new();
    let cases = [
        (
            "MetalguardEtcdQuorumAtRisk",
            vec![expected_alert(
                "MetalguardEtcdQuorumAtRisk",
                &labels(None),
                "0",
            )],
        ),
        (
            "MetalguardBmcUnreachable",
            vec![expected_alert(
                "MetalguardBmcUnreachable",
                &labels(Some("w-1")),
                "0",
            )],
        ),
        (
            "MetalguardFencingNotReady",
            vec![expected_alert(
                "MetalguardFencingNotReady",
                &{
                    let mut l = labels(Some("w-2"));
                    l["failure"] = json!("credentials-refused");
                    l
                },
                "0",
            )],
        ),
        ("MetalguardNoLeader", none.clone()),
        ("MetalguardAgentSilent", none.clone()),
        ("MetalguardHostNeedsPerson", none.clone()),
        ("MetalguardControlPlaneRemediationBlocked", none.clone()),
        ("MetalguardCheckShortCircuited", none),
    ];
    let tests = json!({
        "rule_files": [repo().join(RULES).canonicalize().unwrap()],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "a real controller's metrics",
            "interval": "1m",
            "input_series": input_series(&exposition, "ctl-a"),
            "alert_rule_test": cases.iter().map(|(name, alerts)| json!({
                "eval_time": "30m",
                "alertname": name,
                "exp_alerts": alerts,
            })).collect::<Vec<_>>(),
        }],
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("real.yaml"), tests.to_string()).unwrap();
    let (ok, out) = promtool(dir.path(), &["test", "rules", "real.yaml"]);
    assert!(ok, "{out}\nscraped:\n{exposition}");
}
