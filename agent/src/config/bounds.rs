//! Bounds of the configuration's values that the typed schema cannot express: every URL
//! parsed (scheme, host, no credentials — refused without quoting them), every duration at
//! most a day and non-zero where zero would make a loop spin or a deadline pass at once.
//! Called by [`AgentConfig::validate`](super::AgentConfig::validate); each problem starts with
//! its key, like the others.

use std::time::Duration;

use metalguard_api::text::{EXCERPT_CHARS, excerpt};

use super::schema::{AgentConfig, ProbeTiming};

/// The longest duration any setting may have: past a day a timeout protects nothing, and far
/// larger values overflow the additions made with them (deadlines, staleness bounds).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// The shortest long-poll: a zero wait would poll the controller in a tight loop.
pub const MIN_COMMAND_WAIT: Duration = Duration::from_secs(1);

/// What a URL setting accepts.
pub(super) struct UrlRule {
    /// Allowed schemes.
    pub schemes: &'static [&'static str],
    /// Appended to a scheme refusal, e.g. `must use https:// (the agent API is mutual TLS only)`.
    pub scheme_hint: &'static str,
    /// Whether a path and query are allowed (a probe URL); otherwise only `scheme://host:port`
    /// (and, for a base URL, a path).
    pub query: bool,
}

/// http or https, `scheme://host:port` only (etcd client and peer URLs).
pub(super) const ETCD_URL: UrlRule = UrlRule {
    schemes: &["http", "https"],
    scheme_hint: "must start with http:// or https://",
    query: false,
};
/// https only (the controller's agent API).
pub(super) const CONTROLLER_URL: UrlRule = UrlRule {
    schemes: &["https"],
    scheme_hint: "must use https:// (the agent API is mutual TLS only)",
    query: false,
};
/// http or https with any path and query (a health endpoint).
pub(super) const PROBE_URL: UrlRule = UrlRule {
    schemes: &["http", "https"],
    scheme_hint: "must start with http:// or https://",
    query: true,
};

/// Parses `text` as `rule` says; pushes one problem naming `key`. A URL with credentials is
/// refused without quoting it.
pub(super) fn check_url(key: &str, text: &str, rule: &UrlRule, problems: &mut Vec<String>) {
    let has_scheme = rule
        .schemes
        .iter()
        .any(|s| text.starts_with(&format!("{s}://")));
    let url = match url::Url::parse(text) {
        Ok(url) => url,
        Err(_) if text.contains('@') => {
            problems.push(format!(
                "{key}: is not a url, and may carry credentials (not shown)"
            ));
            return;
        }
        Err(_) if has_scheme => {
            problems.push(format!(
                "{key}: {:?} is not a url",
                excerpt(text, EXCERPT_CHARS)
            ));
            return;
        }
        Err(_) => {
            problems.push(format!(
                "{key}: {} {}",
                excerpt(text, EXCERPT_CHARS),
                rule.scheme_hint
            ));
            return;
        }
    };
    let host = excerpt(url.host_str().unwrap_or(""), EXCERPT_CHARS);
    if !url.username().is_empty() || url.password().is_some() {
        problems.push(format!(
            "{key}: the url for {host} carries credentials (user:password@), which are refused: they would reach logs and reports"
        ));
        return;
    }
    if !rule.schemes.contains(&url.scheme()) {
        problems.push(format!(
            "{key}: {} {}",
            excerpt(text, EXCERPT_CHARS),
            rule.scheme_hint
        ));
        return;
    }
    if host.is_empty() {
        problems.push(format!(
            "{key}: {:?} has no host",
            excerpt(text, EXCERPT_CHARS)
        ));
        return;
    }
    if !rule.query && (url.query().is_some() || url.fragment().is_some()) {
        problems.push(format!(
            "{key}: the url for {host} has a query or fragment, which it does not use"
        ));
    }
}

/// Pushes a problem unless `value` is at most [`MAX_DURATION`].
pub(super) fn at_most_a_day(key: &str, value: Duration, problems: &mut Vec<String>) {
    if value > MAX_DURATION {
        problems.push(format!(
            "{key}: {} is too long; at most {}",
            humantime::format_duration(value),
            humantime::format_duration(MAX_DURATION)
        ));
    }
}

/// Upper bounds of every duration, and the long-poll's lower bound.
pub(super) fn check_durations(config: &AgentConfig, problems: &mut Vec<String>) {
    if let Some(controller) = &config.controller {
        at_most_a_day(
            "controller.report_interval",
            controller.report_interval,
            problems,
        );
        at_most_a_day(
            "controller.request_timeout",
            controller.request_timeout,
            problems,
        );
        let wait = controller.command_wait;
        let max = metalguard_api::protocol::MAX_WAIT;
        if wait < MIN_COMMAND_WAIT || wait > max {
            problems.push(format!(
                "controller.command_wait: must be at least {} and at most {} (the controller answers a long-poll within that)",
                humantime::format_duration(MIN_COMMAND_WAIT),
                humantime::format_duration(max)
            ));
        }
    }
    at_most_a_day(
        "bmc_reachability.period",
        config.bmc_reachability.period,
        problems,
    );
    if let Some(etcd) = &config.etcd {
        timing("etcd.probe", etcd.probe, problems);
        if let Some(join) = &etcd.join {
            at_most_a_day("etcd.join.stall_after", join.stall_after, problems);
            at_most_a_day("etcd.join.timeout", join.timeout, problems);
            if let Some(start) = join.start_timeout {
                at_most_a_day("etcd.join.start_timeout", start, problems);
            }
        }
    }
    let probes = &config.probes;
    for (key, probe) in [
        ("probes.apiserver", &probes.apiserver),
        ("probes.kubelet", &probes.kubelet),
    ] {
        if let Some(probe) = probe {
            timing(key, probe.timing(), problems);
        }
    }
    if let Some(disk) = &probes.disk {
        timing("probes.disk", disk.timing(), problems);
    }
    if let Some(clock) = &probes.clock {
        timing("probes.clock", clock.timing(), problems);
        at_most_a_day("probes.clock.max_offset", clock.max_offset, problems);
    }
    for (i, probe) in probes.exec.iter().enumerate() {
        timing(&format!("probes.exec[{i}]"), probe.timing(), problems);
        // The name is the condition type of every report; the controller refuses longer ones.
        if probe.name.len() > metalguard_api::limits::MAX_NAME {
            problems.push(format!(
                "probes.exec[{i}].name: {} bytes long; at most {}",
                probe.name.len(),
                metalguard_api::limits::MAX_NAME
            ));
        }
    }
}

/// A probe's period (its timeout is at most the period, checked with the other rules).
fn timing(key: &str, timing: ProbeTiming, problems: &mut Vec<String>) {
    at_most_a_day(&format!("{key}.period"), timing.period, problems);
}

#[cfg(test)]
mod tests {
    use crate::config::AgentConfig;

    fn problems(text: &str) -> Vec<String> {
        toml::from_str::<AgentConfig>(text).unwrap().validate()
    }

    const CONTROLLER: &str = "host = \"cp-0\"\n[controller]\nurl = \"https://c:9443\"\n\
         ca = \"/nonexistent/ca\"\ncert = \"/nonexistent/c\"\nkey = \"/nonexistent/k\"\n";

    fn has(problems: &[String], key: &str) -> bool {
        problems.iter().any(|p| p.starts_with(key))
    }

    #[test]
    fn urls_are_parsed_and_credentials_refused_unquoted() {
        for (text, key) in [
            (
                CONTROLLER.replace("https://c:9443", "https://agent:hunter2@c:9443"),
                "controller.url",
            ),
            (
                format!("{CONTROLLER}urls = [\"https://\", \"https://x:hunter2@d\"]\n"),
                "controller.urls",
            ),
            (
                "host = \"cp-0\"\n[etcd]\nendpoints = [\"https://root:hunter2@127.0.0.1:2379\"]\n"
                    .to_owned(),
                "etcd.endpoints",
            ),
            (
                "host = \"cp-0\"\n[etcd]\nendpoints = [\"http://\"]\n".to_owned(),
                "etcd.endpoints",
            ),
            (
                "host = \"cp-0\"\n[probes.kubelet]\nurl = \"http://u:hunter2@127.0.0.1:10248/healthz\"\n"
                    .to_owned(),
                "probes.kubelet.url",
            ),
            (
                "host = \"cp-0\"\n[probes.apiserver]\nurl = \"https:// not a url\"\n".to_owned(),
                "probes.apiserver.url",
            ),
        ] {
            let found = problems(&text);
            assert!(has(&found, key), "{key}: {found:?}");
            assert!(found.iter().all(|p| !p.contains("hunter2")), "{found:?}");
        }
    }

    #[test]
    fn durations_are_bounded_and_spinning_zeros_refused() {
        for (extra, key) in [
            (
                "report_interval = \"100000h\"\n",
                "controller.report_interval",
            ),
            ("request_timeout = \"25h\"\n", "controller.request_timeout"),
            ("command_wait = \"0s\"\n", "controller.command_wait"),
            ("command_wait = \"10m\"\n", "controller.command_wait"),
        ] {
            let found = problems(&format!("{CONTROLLER}{extra}"));
            assert!(has(&found, key), "{extra}: {found:?}");
        }
        for (text, key) in [
            (
                "[probes.kubelet]\nurl = \"http://127.0.0.1:10248/healthz\"\nperiod = \"5000000000h\"\ntimeout = \"1s\"\n",
                "probes.kubelet.period",
            ),
            (
                "[probes.clock]\nmax_offset = \"48h\"\n",
                "probes.clock.max_offset",
            ),
            (
                "[bmc_reachability]\nperiod = \"48h\"\n",
                "bmc_reachability.period",
            ),
        ] {
            let found = problems(&format!("host = \"cp-0\"\n{text}"));
            assert!(has(&found, key), "{text}: {found:?}");
        }
        let join = "host = \"cp-0\"\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\
             [etcd.join]\nname = \"cp-0\"\npeer_url = \"http://127.0.0.1:2380\"\n\
             client_url = \"http://127.0.0.1:2379\"\ndata_dir = \"/var/lib/etcd\"\n\
             launcher = \"env-file\"\nenv_file = \"/run/etcd.env\"\n";
        for (extra, key) in [
            ("timeout = \"100000h\"\n", "etcd.join.timeout"),
            ("start_timeout = \"100000h\"\n", "etcd.join.start_timeout"),
            (
                "stall_after = \"48h\"\ntimeout = \"49h\"\n",
                "etcd.join.stall_after",
            ),
        ] {
            let found = problems(&format!("{join}{extra}"));
            assert!(has(&found, key), "{extra}: {found:?}");
        }
        let long = "p".repeat(300);
        let found = problems(&format!(
            "host = \"cp-0\"\n[[probes.exec]]\nname = \"{long}\"\ncommand = [\"/bin/true\"]\n"
        ));
        assert!(has(&found, "probes.exec[0].name: 300 bytes"), "{found:?}");
        let fine = problems(&format!("{join}timeout = \"2h\"\n"));
        assert!(fine.is_empty(), "{fine:?}");
    }
}
