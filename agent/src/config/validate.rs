//! Semantic checks of a parsed configuration. Pure except for looking at the files it names
//! (existence and permissions), because a missing certificate must fail at start, not at 3 a.m.

use std::path::Path;
use std::time::Duration;

use super::bounds::{CONTROLLER_URL, ETCD_URL, PROBE_URL, check_durations, check_url};
use super::schema::{AgentConfig, DEFAULT_ETCD_BINARY, EtcdConfig, EtcdJoinConfig, ProbeTiming};
use crate::etcd_join::LauncherKind;

/// Shortest probe period accepted.
const MIN_PROBE_PERIOD: Duration = Duration::from_millis(100);
/// Shortest join poll interval accepted.
const MIN_JOIN_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Variables the join flow sets itself; `[etcd.join.env]` must not override them.
const JOIN_OWN_VARIABLES: [&str; 8] = [
    "ETCD_NAME",
    "ETCD_DATA_DIR",
    "ETCD_INITIAL_ADVERTISE_PEER_URLS",
    "ETCD_LISTEN_PEER_URLS",
    "ETCD_ADVERTISE_CLIENT_URLS",
    "ETCD_LISTEN_CLIENT_URLS",
    "ETCD_INITIAL_CLUSTER",
    "ETCD_INITIAL_CLUSTER_STATE",
];

impl AgentConfig {
    /// Every problem, each starting with the key it concerns. Empty when valid.
    pub fn validate(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.host.as_deref() {
            None | Some("") => problems.push("host: must be set to this host's name".to_owned()),
            Some(host) if !is_host_name(host) => problems.push(format!(
                "host: {host:?} is not a valid host name (letters, digits, '-' and '.')"
            )),
            Some(_) => {}
        }
        if !self.state.dir.is_absolute() {
            problems.push(format!(
                "state.dir: {} must be an absolute path",
                self.state.dir.display()
            ));
        }
        if let Some(controller) = &self.controller {
            check_url(
                "controller.url",
                &controller.url,
                &CONTROLLER_URL,
                &mut problems,
            );
            for url in &controller.urls {
                check_url("controller.urls", url, &CONTROLLER_URL, &mut problems);
            }
            check_file("controller.ca", &controller.ca, &mut problems);
            check_file("controller.cert", &controller.cert, &mut problems);
            check_secret("controller.key", &controller.key, &mut problems);
            if controller.request_timeout.is_zero() {
                problems.push("controller.request_timeout: must be greater than zero".to_owned());
            }
            if controller.report_interval < Duration::from_secs(1) {
                problems.push("controller.report_interval: must be at least 1s".to_owned());
            }
        }
        let reach = &self.bmc_reachability;
        if reach.period < Duration::from_secs(1) {
            problems.push("bmc_reachability.period: must be at least 1s".to_owned());
        }
        if reach.timeout.is_zero() || reach.timeout > reach.period {
            problems.push(format!(
                "bmc_reachability.timeout: must be greater than zero and at most the period ({})",
                humantime::format_duration(reach.period)
            ));
        }
        if let Some(etcd) = &self.etcd {
            if etcd.endpoints.is_empty() {
                problems.push("etcd.endpoints: must list at least the local member".to_owned());
            }
            for endpoint in &etcd.endpoints {
                check_url("etcd.endpoints", endpoint, &ETCD_URL, &mut problems);
            }
            if let Some(ca) = &etcd.ca {
                check_file("etcd.ca", ca, &mut problems);
            }
            if let Some(cert) = &etcd.cert {
                check_file("etcd.cert", cert, &mut problems);
            }
            if let Some(key) = &etcd.key {
                check_secret("etcd.key", key, &mut problems);
            }
            if etcd.cert.is_some() != etcd.key.is_some() {
                problems.push("etcd: cert and key must be given together".to_owned());
            }
            check_etcd_tls(etcd, &mut problems);
            check_timing("etcd.probe", etcd.probe, &mut problems);
            check_join(etcd, &mut problems);
        }
        let probes = &self.probes;
        for (key, probe) in [
            ("probes.apiserver", &probes.apiserver),
            ("probes.kubelet", &probes.kubelet),
        ] {
            if let Some(probe) = probe {
                check_url(&format!("{key}.url"), &probe.url, &PROBE_URL, &mut problems);
                if let Some(ca) = &probe.ca {
                    check_file(&format!("{key}.ca"), ca, &mut problems);
                }
                check_timing(key, probe.timing(), &mut problems);
            }
        }
        if let Some(disk) = &probes.disk {
            let data_dir = self.etcd.as_ref().and_then(|e| e.data_dir.as_ref());
            if disk.path.is_none() && data_dir.is_none() {
                problems.push("probes.disk.path: set it, or set etcd.data_dir".to_owned());
            }
            check_timing("probes.disk", disk.timing(), &mut problems);
        }
        if let Some(clock) = &probes.clock {
            if clock.max_offset.is_zero() {
                problems.push("probes.clock.max_offset: must be greater than zero".to_owned());
            }
            check_timing("probes.clock", clock.timing(), &mut problems);
        }
        for (i, probe) in probes.exec.iter().enumerate() {
            let key = format!("probes.exec[{i}] ({})", probe.name);
            if probe.name.is_empty() {
                problems.push(format!("probes.exec[{i}].name: must not be empty"));
            } else if metalguard_api::protocol::is_reserved_condition(&probe.name) {
                problems.push(format!(
                    "probes.exec[{i}].name: {:?} is reserved: {} are Kubernetes' own node conditions (the controller judges Ready from the other conditions); choose another name",
                    probe.name,
                    metalguard_api::protocol::RESERVED_CONDITION_TYPES.join(", ")
                ));
            }
            match probe.command.first() {
                None => problems.push(format!("{key}.command: must name a program")),
                Some(program) => {
                    let path = Path::new(program);
                    if path.is_absolute() {
                        check_file(&format!("{key}.command"), path, &mut problems);
                    } else {
                        problems.push(format!("{key}.command: {program} must be an absolute path"));
                    }
                }
            }
            check_timing(&key, probe.timing(), &mut problems);
        }
        check_durations(self, &mut problems);
        problems
    }
}

/// `[etcd.join]`: URLs, a data directory, and exactly the settings of the chosen launcher.
fn check_join(etcd: &EtcdConfig, problems: &mut Vec<String>) {
    let Some(join) = &etcd.join else {
        return;
    };
    if join.name.is_empty() {
        problems.push("etcd.join.name: must not be empty".to_owned());
    }
    for (key, url) in [
        ("etcd.join.peer_url", Some(&join.peer_url)),
        ("etcd.join.client_url", Some(&join.client_url)),
        ("etcd.join.listen_peer_url", join.listen_peer_url.as_ref()),
        (
            "etcd.join.listen_client_url",
            join.listen_client_url.as_ref(),
        ),
    ] {
        if let Some(url) = url {
            check_url(key, url, &ETCD_URL, problems);
        }
    }
    match join.data_dir.as_ref().or(etcd.data_dir.as_ref()) {
        None => problems.push("etcd.join.data_dir: set it, or set etcd.data_dir".to_owned()),
        Some(dir) if !dir.is_absolute() => problems.push(format!(
            "etcd.join.data_dir: {} must be an absolute path",
            dir.display()
        )),
        Some(_) => {}
    }
    let kind = join.launcher;
    for (key, given, used_by) in [
        (
            "etcd_binary",
            join.etcd_binary.is_some(),
            &[LauncherKind::Exec][..],
        ),
        ("unit", join.unit.is_some(), &[LauncherKind::Systemd][..]),
        (
            "env_file",
            join.env_file.is_some(),
            &[LauncherKind::Systemd, LauncherKind::EnvFile][..],
        ),
        (
            "start_command",
            join.start_command.is_some(),
            &[LauncherKind::EnvFile][..],
        ),
        (
            "start_timeout",
            join.start_timeout.is_some(),
            &[LauncherKind::EnvFile, LauncherKind::StaticPod][..],
        ),
        (
            "manifest",
            join.manifest.is_some(),
            &[LauncherKind::StaticPod][..],
        ),
        (
            "template",
            join.template.is_some(),
            &[LauncherKind::StaticPod][..],
        ),
        (
            "image",
            join.image.is_some(),
            &[LauncherKind::StaticPod][..],
        ),
        (
            "pki_dir",
            join.pki_dir.is_some(),
            &[LauncherKind::StaticPod][..],
        ),
        (
            "overwrite_foreign_manifest",
            join.overwrite_foreign_manifest.is_some(),
            &[LauncherKind::StaticPod][..],
        ),
    ] {
        if given && !used_by.contains(&kind) {
            let names: Vec<String> = used_by.iter().map(|k| format!("{:?}", k.name())).collect();
            problems.push(format!(
                "etcd.join.{key}: only used by launcher = {}, not {:?}",
                names.join(" or "),
                kind.name()
            ));
        }
    }
    match kind {
        LauncherKind::Exec => {
            let binary = join
                .etcd_binary
                .clone()
                .unwrap_or_else(|| DEFAULT_ETCD_BINARY.into());
            if binary.is_absolute() {
                check_file("etcd.join.etcd_binary", &binary, problems);
            } else {
                problems.push(format!(
                    "etcd.join.etcd_binary: {} must be an absolute path",
                    binary.display()
                ));
            }
        }
        LauncherKind::Systemd => {
            if join.unit.as_deref() == Some("") {
                problems.push("etcd.join.unit: must not be empty".to_owned());
            }
        }
        LauncherKind::EnvFile => {
            if join.env_file.is_none() {
                problems
                    .push("etcd.join.env_file: must be set for launcher = \"env-file\"".to_owned());
            }
            if let Some(command) = &join.start_command {
                match command.first() {
                    None => problems.push(
                        "etcd.join.start_command: must name a program (or leave it out)".to_owned(),
                    ),
                    Some(program) if Path::new(program).is_absolute() => {
                        check_file("etcd.join.start_command", Path::new(program), problems);
                    }
                    Some(program) => problems.push(format!(
                        "etcd.join.start_command: {program} must be an absolute path"
                    )),
                }
            }
        }
        LauncherKind::StaticPod => check_static_pod(join, problems),
    }
    if join.start_timeout.is_some_and(|t| t.is_zero()) {
        problems.push("etcd.join.start_timeout: must be greater than zero".to_owned());
    }
    if let Some(file) = &join.state_file
        && !file.is_absolute()
    {
        problems.push(format!(
            "etcd.join.state_file: {} must be an absolute path",
            file.display()
        ));
    }
    if let Some(file) = &join.env_file
        && !file.is_absolute()
    {
        problems.push(format!(
            "etcd.join.env_file: {} must be an absolute path",
            file.display()
        ));
    }
    for key in join.env.keys() {
        if !key.starts_with("ETCD_") {
            problems.push(format!(
                "etcd.join.env.{key}: only ETCD_* variables are passed to etcd"
            ));
        } else if JOIN_OWN_VARIABLES.contains(&key.as_str()) {
            problems.push(format!(
                "etcd.join.env.{key}: set by the join itself; use the etcd.join keys instead"
            ));
        }
    }
    if join.stall_after.is_zero() {
        problems.push("etcd.join.stall_after: must be greater than zero".to_owned());
    }
    if join.poll_interval < MIN_JOIN_POLL_INTERVAL || join.poll_interval > join.stall_after {
        problems.push(format!(
            "etcd.join.poll_interval: must be at least {MIN_JOIN_POLL_INTERVAL:?} and at most stall_after ({:?})",
            join.stall_after
        ));
    }
    if join.timeout <= join.stall_after {
        problems.push(format!(
            "etcd.join.timeout: must be longer than stall_after ({:?})",
            join.stall_after
        ));
    }
}

/// `launcher = "static-pod"`: absolute paths, an image (given or from a template that reads as
/// an etcd static Pod), and no TLS file variables (the Pod mounts `pki_dir` and takes
/// kubeadm's files from it).
fn check_static_pod(join: &EtcdJoinConfig, problems: &mut Vec<String>) {
    use metalguard_etcd::join::launcher::static_pod::manifest::{
        ExistingManifest, PKI_FLAGS, flag_of_env,
    };
    for (key, path) in [
        ("manifest", join.manifest.as_ref()),
        ("template", join.template.as_ref()),
        ("pki_dir", join.pki_dir.as_ref()),
    ] {
        if let Some(path) = path.filter(|p| !p.is_absolute()) {
            problems.push(format!(
                "etcd.join.{key}: {} must be an absolute path",
                path.display()
            ));
        }
    }
    if join.image.as_deref() == Some("") {
        problems.push("etcd.join.image: must not be empty".to_owned());
    }
    match &join.template {
        Some(path) if path.is_absolute() => match std::fs::read_to_string(path) {
            Err(err) => problems.push(format!("etcd.join.template: {}: {err}", path.display())),
            Ok(text) => {
                if let Err(err) = ExistingManifest::parse(&text).and_then(|m| m.template()) {
                    problems.push(format!("etcd.join.template: {}: {err}", path.display()));
                }
            }
        },
        None if join.image.is_none() => problems.push(
            "etcd.join.image: set it, or set etcd.join.template to an existing member's manifest"
                .to_owned(),
        ),
        Some(_) | None => {}
    }
    for key in join.env.keys() {
        let flag = flag_of_env(key);
        if PKI_FLAGS.iter().any(|(f, _)| *f == flag) {
            problems.push(format!(
                "etcd.join.env.{key}: the static-pod launcher names kubeadm's files in etcd.join.pki_dir (the directory the pod mounts); leave it out"
            ));
        }
    }
}

fn is_host_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn check_timing(key: &str, timing: ProbeTiming, problems: &mut Vec<String>) {
    if timing.period < MIN_PROBE_PERIOD {
        problems.push(format!(
            "{key}.period: must be at least {MIN_PROBE_PERIOD:?}"
        ));
    }
    if timing.timeout.is_zero() || timing.timeout > timing.period {
        problems.push(format!(
            "{key}.timeout: must be greater than zero and at most the period ({:?})",
            timing.period
        ));
    }
    if timing.failure_threshold == 0 {
        problems.push(format!("{key}.failure_threshold: must be at least 1"));
    }
    if timing.success_threshold == 0 {
        problems.push(format!("{key}.success_threshold: must be at least 1"));
    }
}

/// TLS to etcd: a CA with `https://` endpoints (etcd's CA is a private one, the system's
/// trust store is not used), none with `http://`, and files that parse into a client
/// configuration (the key matching the certificate); the metrics URL is plain HTTP.
fn check_etcd_tls(etcd: &EtcdConfig, problems: &mut Vec<String>) {
    let https = etcd.endpoints.iter().any(|e| e.starts_with("https://"));
    let http = etcd.endpoints.iter().any(|e| e.starts_with("http://"));
    if https && etcd.ca.is_none() {
        problems.push(
            "etcd.ca: must be set with https:// endpoints (kubeadm: /etc/kubernetes/pki/etcd/ca.crt)"
                .to_owned(),
        );
    }
    if http && !https && (etcd.ca.is_some() || etcd.cert.is_some()) {
        problems.push(
            "etcd: ca/cert/key are set but every endpoint is http://; write https:// endpoints"
                .to_owned(),
        );
    }
    if let Some(url) = &etcd.metrics_url
        && !url.starts_with("http://")
    {
        problems.push(format!(
            "etcd.metrics_url: {url} must start with http:// (etcd's --listen-metrics-urls)"
        ));
    }
    if let Some(ca) = &etcd.ca
        && ca.exists()
        && etcd.cert.as_ref().is_none_or(|c| c.exists())
        && etcd.key.as_ref().is_none_or(|k| k.exists())
    {
        let identity = etcd.cert.as_deref().zip(etcd.key.as_deref());
        if let Err(problem) = crate::client_tls::config("etcd", ca, identity) {
            problems.push(problem);
        }
    }
}

fn check_file(key: &str, path: &Path, problems: &mut Vec<String>) {
    super::files::authority(key, path, problems);
}

fn check_secret(key: &str, path: &Path, problems: &mut Vec<String>) {
    super::files::secret(key, path, problems);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> AgentConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_probe_named_like_a_kubernetes_node_condition_is_refused_naming_the_key() {
        for reserved in metalguard_api::protocol::RESERVED_CONDITION_TYPES {
            let config = parse(&format!(
                "host = \"cp-0\"\n[[probes.exec]]\nname = \"EtcdBackup\"\ncommand = [\"/bin/true\"]\n\
                 [[probes.exec]]\nname = \"{reserved}\"\ncommand = [\"/bin/true\"]\n"
            ));
            let problems = config.validate();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert!(
                problems[0]
                    .starts_with(&format!("probes.exec[1].name: \"{reserved}\" is reserved")),
                "{problems:?}"
            );
        }
        let fine = parse(
            "host = \"cp-0\"\n[[probes.exec]]\nname = \"ready\"\ncommand = [\"/bin/true\"]\n",
        );
        assert!(fine.validate().is_empty(), "{:?}", fine.validate());
    }

    #[test]
    fn minimal_configuration_is_valid() {
        assert!(parse("host = \"cp-0\"").validate().is_empty());
    }

    #[test]
    fn missing_host_and_bad_timing_are_each_reported() {
        let config = parse(
            "[probes.kubelet]\nurl = \"http://127.0.0.1:10248/healthz\"\nperiod = \"1s\"\ntimeout = \"2s\"\nfailure_threshold = 0\n",
        );
        let problems = config.validate();
        assert!(
            problems.iter().any(|p| p.starts_with("host:")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("probes.kubelet.timeout")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("probes.kubelet.failure_threshold")),
            "{problems:?}"
        );
    }

    #[test]
    fn bmc_reachability_defaults_and_bad_values_and_typos() {
        let config = parse("host = \"cp-0\"");
        assert_eq!(config.bmc_reachability.period, Duration::from_secs(30));
        assert_eq!(config.bmc_reachability.timeout, Duration::from_secs(3));
        let config =
            parse("host = \"cp-0\"\n[bmc_reachability]\nperiod = \"2s\"\ntimeout = \"5s\"\n");
        let problems = config.validate();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("bmc_reachability.timeout: ") && p.contains("(2s)")),
            "{problems:?}"
        );
        let typo = toml::from_str::<AgentConfig>("[bmc_reachability]\nperiode = \"1m\"\n");
        let error = typo.unwrap_err().to_string();
        assert!(error.contains("periode"), "{error}");
    }

    #[test]
    fn plain_http_controller_is_refused() {
        let config = parse(
            "host = \"cp-0\"\n[controller]\nurl = \"http://c\"\nca = \"/nonexistent/ca\"\ncert = \"/nonexistent/c\"\nkey = \"/nonexistent/k\"\n",
        );
        let problems = config.validate();
        assert!(
            problems.iter().any(|p| p.starts_with("controller.url")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("controller.key: /nonexistent/k")),
            "{problems:?}"
        );
    }

    #[test]
    fn every_controller_url_must_be_https_and_the_first_comes_first() {
        let config = parse(
            "host = \"cp-0\"\n[controller]\nurl = \"https://a:9443\"\n\
             urls = [\"https://b:9443\", \"https://a:9443\", \"http://c:9443\"]\n\
             ca = \"/nonexistent/ca\"\ncert = \"/nonexistent/c\"\nkey = \"/nonexistent/k\"\n",
        );
        let problems = config.validate();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("controller.urls: http://c:9443 must use https://")),
            "{problems:?}"
        );
        let controller = config.controller.as_ref().unwrap();
        assert_eq!(
            controller.all_urls().collect::<Vec<_>>(),
            ["https://a:9443", "https://b:9443", "http://c:9443"]
        );
    }

    fn join(extra: &str) -> Vec<String> {
        parse(&format!(
            "host = \"cp-0\"\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\
             [etcd.join]\nname = \"cp-0\"\npeer_url = \"http://127.0.0.1:2380\"\n\
             client_url = \"http://127.0.0.1:2379\"\n{extra}"
        ))
        .validate()
    }

    #[test]
    fn an_env_file_join_needs_its_file_and_a_data_dir() {
        let ok = join(
            "data_dir = \"/var/lib/etcd\"\nlauncher = \"env-file\"\nenv_file = \"/run/etcd.env\"\n\
             start_command = [\"/bin/true\"]\nstart_timeout = \"30s\"\n\
             [etcd.join.env]\nETCD_SNAPSHOT_COUNT = \"5000\"\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let problems = join("launcher = \"env-file\"\n");
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("etcd.join.data_dir: set it")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("etcd.join.env_file: must be set")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_key_of_another_launcher_is_refused_naming_both() {
        let problems = join(
            "data_dir = \"/var/lib/etcd\"\nlauncher = \"systemd\"\nstart_command = [\"/bin/true\"]\n",
        );
        assert_eq!(
            problems,
            vec![
                "etcd.join.start_command: only used by launcher = \"env-file\", not \"systemd\""
                    .to_owned()
            ]
        );
    }

    #[test]
    fn join_urls_variables_and_timing_are_checked() {
        let problems = join(
            "data_dir = \"/var/lib/etcd\"\nlauncher = \"env-file\"\nenv_file = \"etcd.env\"\n\
             listen_peer_url = \"0.0.0.0:2380\"\npoll_interval = \"1ms\"\ntimeout = \"5s\"\n\
             [etcd.join.env]\nETCD_NAME = \"x\"\nGOMAXPROCS = \"2\"\n",
        );
        for want in [
            "etcd.join.listen_peer_url: 0.0.0.0:2380 must start with",
            "etcd.join.env_file: etcd.env must be an absolute path",
            "etcd.join.env.ETCD_NAME: set by the join itself",
            "etcd.join.env.GOMAXPROCS: only ETCD_* variables",
            "etcd.join.poll_interval: must be at least",
            "etcd.join.timeout: must be longer than stall_after",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(want)),
                "{want}: {problems:?}"
            );
        }
    }

    #[test]
    fn a_static_pod_join_needs_an_image_or_a_readable_template_and_no_tls_variables() {
        let ok = join(
            "launcher = \"static-pod\"\nimage = \"registry.k8s.io/etcd:3.6.5-0\"\n\
             data_dir = \"/var/lib/etcd\"\nstate_file = \"/var/lib/metalguard/etcd-join.json\"\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
        let dir = tempfile::tempdir().unwrap();
        let template = dir.path().join("etcd.yaml");
        std::fs::write(
            &template,
            "kind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [etcd]\n",
        )
        .unwrap();
        let problems = join(&format!(
            "launcher = \"static-pod\"\ndata_dir = \"/var/lib/etcd\"\ntemplate = \"{}\"\n\
             manifest = \"etcd.yaml\"\nstate_file = \"join.json\"\nenv_file = \"/run/e.env\"\n\
             [etcd.join.env]\nETCD_CERT_FILE = \"/x.crt\"\nETCD_SNAPSHOT_COUNT = \"5000\"\n",
            template.display()
        ));
        for want in [
            "etcd.join.template: ",
            "etcd.join.manifest: etcd.yaml must be an absolute path",
            "etcd.join.state_file: join.json must be an absolute path",
            "etcd.join.env_file: only used by launcher = \"systemd\" or \"env-file\", not \"static-pod\"",
            "etcd.join.env.ETCD_CERT_FILE: the static-pod launcher names kubeadm's files",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(want)),
                "{want}: {problems:?}"
            );
        }
        assert!(
            problems.iter().any(|p| p.contains("has no image")),
            "the template is read: {problems:?}"
        );
        assert!(
            !problems.iter().any(|p| p.contains("ETCD_SNAPSHOT_COUNT")),
            "{problems:?}"
        );
        let problems = join("launcher = \"static-pod\"\ndata_dir = \"/var/lib/etcd\"\n");
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("etcd.join.image: set it, or set etcd.join.template")),
            "{problems:?}"
        );
        let problems = join("launcher = \"exec\"\nimage = \"x\"\n");
        assert!(
            problems.iter().any(|p| p.starts_with(
                "etcd.join.image: only used by launcher = \"static-pod\", not \"exec\""
            )),
            "{problems:?}"
        );
    }

    #[test]
    fn host_names_are_checked() {
        assert!(is_host_name("cp-0.example.com"));
        assert!(!is_host_name("cp_0"));
        assert!(!is_host_name("-cp"));
        assert!(!is_host_name(""));
    }
}
