//! Checks of the inventory's values that serde cannot make: BMC addresses and fingerprints
//! parsed with the agent's own rules (`metalguard_api::bmc`), etcd endpoints, and every
//! duration within bounds (never zero where zero stops a loop, never so large that an addition
//! overflows or a lease outlives any failover). Run by [`super::Inventory::validate`], so on
//! the first load and on every reload alike. Messages name the host and the key; a URL with
//! credentials is refused without quoting them.

use std::time::Duration;

use metalguard_api::bmc::{BmcAddress, parse_sha256_fingerprint};
use metalguard_api::duration::format_duration;
use metalguard_api::text::{EXCERPT_CHARS, excerpt};

use super::Inventory;

/// The longest duration any setting may have: past a day a timeout no longer protects
/// anything, and far larger values overflow the additions made with them.
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest plan interval (the loop also renews the lease on it).
pub const MIN_PLAN_INTERVAL: Duration = Duration::from_millis(10);

/// Every problem of the values, or `Ok` (the first problem is returned).
pub(super) fn check(inventory: &Inventory) -> Result<(), String> {
    check_etcd(inventory)?;
    check_controller(inventory)?;
    check_resources(inventory)
}

/// The checks that apply to an inventory built from the cluster's resources (the Kubernetes
/// backend): the hosts' BMCs and the policy's durations. Its process settings are checked
/// where they are read.
pub(crate) fn check_resources(inventory: &Inventory) -> Result<(), String> {
    check_policy(&inventory.policy)?;
    for host in &inventory.hosts {
        if let Some(bmc) = &host.bmc {
            check_bmc(&host.name, bmc)?;
        }
    }
    Ok(())
}

/// `key` must be greater than zero (when `nonzero`) and at most [`MAX_DURATION`].
fn bounded(key: &str, value: Duration, nonzero: bool) -> Result<(), String> {
    if nonzero && value.is_zero() {
        return Err(format!("{key} must be greater than zero"));
    }
    if value > MAX_DURATION {
        return Err(format!(
            "{key} is {}; it must be at most {}",
            format_duration(value),
            format_duration(MAX_DURATION)
        ));
    }
    Ok(())
}

fn check_etcd(inventory: &Inventory) -> Result<(), String> {
    let etcd = &inventory.etcd;
    for (i, endpoint) in etcd.endpoints.iter().enumerate() {
        check_endpoint(endpoint).map_err(|problem| format!("etcd.endpoints[{i}]: {problem}"))?;
    }
    bounded("etcd.timeout", etcd.timeout, true)?;
    bounded("etcd.lease_ttl", etcd.lease_ttl, true)?;
    // A leader acts only while its lease certainly holds: until the last renewal plus the
    // lease less one request timeout. With the lease under twice the timeout that window is
    // shorter than one request; at or below the timeout it is empty and the leader holds the
    // lease, blocking its peers, without ever acting.
    if etcd.lease_ttl < etcd.timeout.saturating_mul(2) {
        return Err(format!(
            "etcd.lease_ttl is {}; it must be at least twice etcd.timeout ({}), or the leader cannot act within its lease",
            format_duration(etcd.lease_ttl),
            format_duration(etcd.timeout)
        ));
    }
    Ok(())
}

/// An etcd client URL: `http://` or `https://`, a host, no credentials, no path or query.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let quoted = || excerpt(endpoint, EXCERPT_CHARS);
    let Ok(url) = url::Url::parse(endpoint) else {
        return Err(if endpoint.contains('@') {
            "is not a url (http://host:port or https://host:port)".to_owned()
        } else {
            format!(
                "{:?} is not a url (http://host:port or https://host:port)",
                quoted()
            )
        });
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "the url for {} carries credentials; etcd client certificates go in the [etcd] tls settings",
            excerpt(url.host_str().unwrap_or(""), EXCERPT_CHARS)
        ));
    }
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{:?} has scheme {}; use http:// or https://",
            quoted(),
            excerpt(url.scheme(), EXCERPT_CHARS)
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{:?} has no host", quoted()));
    }
    if url.query().is_some()
        || url.fragment().is_some()
        || !url.path().trim_end_matches('/').is_empty()
    {
        return Err(format!(
            "the url for {} has a path, query or fragment; an etcd endpoint is scheme://host:port",
            excerpt(url.host_str().unwrap_or(""), EXCERPT_CHARS)
        ));
    }
    Ok(())
}

fn check_controller(inventory: &Inventory) -> Result<(), String> {
    inventory.controller.limits.check()?;
    let plan = inventory.controller.plan_interval;
    bounded("controller.plan_interval", plan, true)?;
    if plan < MIN_PLAN_INTERVAL {
        return Err(format!(
            "controller.plan_interval is {}; it must be at least {}",
            format_duration(plan),
            format_duration(MIN_PLAN_INTERVAL)
        ));
    }
    // The loop renews the lease on this tick; a tick longer than half of what the lease
    // leaves after one request lets leadership lapse between renewals.
    let etcd = &inventory.etcd;
    let window = etcd.lease_ttl.saturating_sub(etcd.timeout);
    if plan > window / 2 {
        return Err(format!(
            "controller.plan_interval is {}; it must be at most half of etcd.lease_ttl less etcd.timeout ({}), the lease is renewed on it",
            format_duration(plan),
            format_duration(window / 2)
        ));
    }
    Ok(())
}

fn check_policy(policy: &metalguard_api::policy::Policy) -> Result<(), String> {
    for (i, check) in policy.health_checks.iter().enumerate() {
        let key = format!("policy.health_checks[{i}]");
        for (j, condition) in check.unhealthy_conditions.iter().enumerate() {
            bounded(
                &format!("{key}.unhealthy_conditions[{j}].timeout"),
                condition.timeout,
                true,
            )?;
        }
        if let Some(timeout) = check.node_startup_timeout {
            // `0` disables it (MachineHealthCheck semantics).
            bounded(&format!("{key}.node_startup_timeout"), timeout, false)?;
        }
        if let Some(timeout) = check.agent_heartbeat_timeout {
            bounded(&format!("{key}.agent_heartbeat_timeout"), timeout, true)
                .map_err(|e| format!("{e} (leave it out to disable the heartbeat check)"))?;
        }
    }
    let remediation = &policy.remediation;
    if remediation.max_retry > metalguard_api::policy::MAX_MAX_RETRY {
        return Err(format!(
            "policy.remediation.max_retry is {}; at most {} retries may be allowed",
            remediation.max_retry,
            metalguard_api::policy::MAX_MAX_RETRY
        ));
    }
    bounded(
        "policy.remediation.retry_period",
        remediation.retry_period,
        true,
    )?;
    // `0`: a host unhealthy again right after a remediation is never counted as a retry.
    bounded(
        "policy.remediation.min_healthy_period",
        remediation.min_healthy_period,
        false,
    )?;
    bounded(
        "policy.remediation.executor_heartbeat_timeout",
        remediation.executor_heartbeat_timeout,
        true,
    )?;
    Ok(())
}

/// A host's BMC: the address as the agent parses it, the fingerprint as it pins it.
fn check_bmc(host: &str, bmc: &super::BmcSettings) -> Result<(), String> {
    // The parser never quotes credentials, a query or a fragment.
    bmc.address
        .parse::<BmcAddress>()
        .map_err(|e| format!("host {host} bmc.address: {e}"))?;
    if let Some(fingerprint) = &bmc.tls.fingerprint_sha256
        && parse_sha256_fingerprint(fingerprint).is_none()
    {
        return Err(format!(
            "host {host} bmc.tls.fingerprint-sha256: {:?} is not a sha-256 digest (64 hex digits, colons allowed)",
            excerpt(fingerprint, 100)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::inventory::Inventory;

    const BASE: &str = r#"
[controller]
plan_interval = "1s"

[etcd]
endpoints = ["http://127.0.0.1:2379"]
lease_ttl = "5s"
timeout = "2s"

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"
bmc = { address = "redfish+https://10.0.0.1/redfish/v1/Systems/1", credentials_dir = "/etc/metalguard/bmc/cp-1" }

[[policy.health_checks]]
name = "control-plane"
selector = { role = "control-plane" }
unhealthy_conditions = [{ type = "Ready", status = "False", timeout = "5m" }]
agent_heartbeat_timeout = "1m"
node_startup_timeout = "10m"

[policy.remediation]
retry_period = "5m"
min_healthy_period = "1h"
executor_heartbeat_timeout = "1m"
"#;

    fn refused(text: &str) -> String {
        match Inventory::parse(Path::new("inv.toml"), text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => crate::error::chain(&e),
        }
    }

    fn bmc(address: &str) -> String {
        BASE.replace("redfish+https://10.0.0.1/redfish/v1/Systems/1", address)
    }

    #[test]
    fn the_base_inventory_is_valid() {
        Inventory::parse(Path::new("inv.toml"), BASE).unwrap();
        for fine in [
            "ipmi://10.0.0.1",
            "ipmi+lanplus://[fd00::1]:6230",
            "redfish://bmc.example",
            "idrac-redfish+https://10.0.0.1",
            "redfish+http://10.0.0.1:8000",
        ] {
            Inventory::parse(Path::new("inv.toml"), &bmc(fine)).unwrap();
        }
        let pinned = BASE.replace(
            "credentials_dir = \"/etc/metalguard/bmc/cp-1\"",
            &format!(
                "credentials_dir = \"/c\", tls = {{ fingerprint-sha256 = \"{}\" }}",
                vec!["AB"; 32].join(":")
            ),
        );
        Inventory::parse(Path::new("inv.toml"), &pinned).unwrap();
    }

    #[test]
    fn max_retry_past_the_bound_is_refused_naming_the_key() {
        let text = format!("{BASE}max_retry = 4294967295\n");
        let error = refused(&text);
        assert!(
            error.contains("policy.remediation.max_retry is 4294967295; at most 100"),
            "{error}"
        );
        let text = format!("{BASE}max_retry = 100\n");
        Inventory::parse(Path::new("inv.toml"), &text).unwrap();
    }

    #[test]
    fn a_bad_bmc_address_is_refused_naming_the_host_and_key() {
        for (address, says) in [
            ("not a url", "is not a url"),
            ("ftp://10.0.0.1", "unsupported scheme ftp"),
            ("https://10.0.0.1", "unsupported scheme https"),
            ("ipmi://10.0.0.1/x", "unexpected path"),
            ("redfish+https://", "no host"),
        ] {
            let error = refused(&bmc(address));
            assert!(
                error.contains("host cp-1")
                    && error.contains("bmc.address")
                    && error.contains(says),
                "{address}: {error}"
            );
        }
    }

    #[test]
    fn a_bmc_address_with_credentials_is_refused_without_echoing_them() {
        for address in [
            "redfish+https://admin:hunter2@10.0.0.1/redfish/v1/Systems/1",
            "ipmi://root:hunter2@10.0.0.1",
            "redfish+https://10.0.0.1/redfish/v1/Systems/1?password=hunter2",
        ] {
            let error = refused(&bmc(address));
            assert!(
                error.contains("host cp-1") && error.contains("bmc.address"),
                "{error}"
            );
            assert!(!error.contains("hunter2"), "{error}");
            assert!(
                !error.contains("admin:") && !error.contains("root:"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_bad_fingerprint_is_refused_naming_the_host_and_key() {
        for fingerprint in ["zz", "", &"ab".repeat(31), &"+a".repeat(32)] {
            let text = BASE.replace(
                "credentials_dir = \"/etc/metalguard/bmc/cp-1\"",
                &format!(
                    "credentials_dir = \"/c\", tls = {{ fingerprint-sha256 = \"{fingerprint}\" }}"
                ),
            );
            let error = refused(&text);
            assert!(
                error.contains("host cp-1") && error.contains("bmc.tls.fingerprint-sha256"),
                "{fingerprint}: {error}"
            );
        }
    }

    #[test]
    fn bad_etcd_endpoints_are_refused_naming_the_key() {
        for (endpoint, secret) in [
            ("not a url", None),
            ("ftp://127.0.0.1:2379", None),
            ("127.0.0.1:2379", None),
            ("http://", None),
            ("http://127.0.0.1:2379/v3?x=1", None),
            ("https://root:hunter2@127.0.0.1:2379", Some("hunter2")),
        ] {
            let error = refused(&BASE.replace("http://127.0.0.1:2379", endpoint));
            assert!(error.contains("etcd.endpoints[0]"), "{endpoint}: {error}");
            if let Some(secret) = secret {
                assert!(!error.contains(secret), "{error}");
            }
        }
    }

    #[test]
    fn the_lease_must_be_at_least_twice_the_etcd_timeout() {
        let error = refused(&BASE.replace("lease_ttl = \"5s\"", "lease_ttl = \"2s\""));
        assert!(
            error.contains("etcd.lease_ttl") && error.contains("etcd.timeout"),
            "{error}"
        );
        let error = refused(&BASE.replace("lease_ttl = \"5s\"", "lease_ttl = \"3s\""));
        assert!(error.contains("etcd.lease_ttl"), "{error}");
        Inventory::parse(
            Path::new("inv.toml"),
            &BASE.replace("lease_ttl = \"5s\"", "lease_ttl = \"4s\""),
        )
        .unwrap();
    }

    #[test]
    fn zero_timeouts_and_intervals_are_refused() {
        for (from, to, key) in [
            ("timeout = \"2s\"", "timeout = \"0\"", "etcd.timeout"),
            (
                "plan_interval = \"1s\"",
                "plan_interval = \"0\"",
                "controller.plan_interval",
            ),
            (
                "executor_heartbeat_timeout = \"1m\"",
                "executor_heartbeat_timeout = \"0\"",
                "policy.remediation.executor_heartbeat_timeout",
            ),
            (
                "agent_heartbeat_timeout = \"1m\"",
                "agent_heartbeat_timeout = \"0\"",
                "policy.health_checks[0].agent_heartbeat_timeout",
            ),
        ] {
            let error = refused(&BASE.replace(from, to));
            assert!(error.contains(key), "{to}: {error}");
        }
    }

    #[test]
    fn api_limits_are_checked_naming_the_key() {
        let with = |lines: &str| {
            BASE.replace(
                "plan_interval = \"1s\"\n",
                &format!("plan_interval = \"1s\"\n[controller.limits]\n{lines}\n"),
            )
        };
        Inventory::parse(
            Path::new("inv.toml"),
            &with("idle_timeout = \"30s\"\nrequests_per_second = 5"),
        )
        .unwrap();
        for (lines, key) in [
            (
                "header_read_timeout = \"0\"",
                "controller.limits.header_read_timeout",
            ),
            (
                "body_read_timeout = \"2h\"",
                "controller.limits.body_read_timeout",
            ),
            ("max_handshakes = 0", "controller.limits.max_handshakes"),
            (
                "max_connections_per_host = 1",
                "controller.limits.max_connections_per_host",
            ),
            (
                "max_long_polls_per_host = 100",
                "controller.limits.max_long_polls_per_host",
            ),
            (
                "requests_per_second = 0",
                "controller.limits.requests_per_second",
            ),
            ("request_burst = 0", "controller.limits.request_burst"),
        ] {
            let error = refused(&with(lines));
            assert!(error.contains(key), "{lines}: {error}");
        }
        let typo = Inventory::parse(Path::new("inv.toml"), &with("idle_timout = \"1s\""));
        assert!(typo.unwrap_err().to_string().contains("idle_timout"));
    }

    #[test]
    fn huge_durations_are_refused_naming_the_key() {
        for (from, to, key) in [
            (
                "lease_ttl = \"5s\"",
                "lease_ttl = \"5000000000h\"",
                "etcd.lease_ttl",
            ),
            ("timeout = \"2s\"", "timeout = \"48h\"", "etcd.timeout"),
            (
                "plan_interval = \"1s\"",
                "plan_interval = \"25h\"",
                "controller.plan_interval",
            ),
            (
                "timeout = \"5m\"",
                "timeout = \"100000000h\"",
                "policy.health_checks[0].unhealthy_conditions[0].timeout",
            ),
            (
                "node_startup_timeout = \"10m\"",
                "node_startup_timeout = \"9000000h\"",
                "policy.health_checks[0].node_startup_timeout",
            ),
            (
                "retry_period = \"5m\"",
                "retry_period = \"1000h\"",
                "policy.remediation.retry_period",
            ),
            (
                "min_healthy_period = \"1h\"",
                "min_healthy_period = \"1000000h\"",
                "policy.remediation.min_healthy_period",
            ),
        ] {
            let error = refused(&BASE.replace(from, to));
            assert!(
                error.contains(key) && error.contains("at most"),
                "{to}: {error}"
            );
        }
    }
}
