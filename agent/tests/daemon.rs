//! The real `metalguard-agent` binary as systemd runs it: configuration checks, READY after the
//! first probe round, watchdog pings, `/status` and `/metrics`, STOPPING on SIGTERM.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metalguard_e2e::ports::reserve_port;

const AGENT: &str = env!("CARGO_BIN_EXE_metalguard-agent");

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn check_config(config: &Path) -> (bool, String) {
    let out = Command::new(AGENT)
        .arg("check-config")
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_refuses_a_probe_that_would_report_ready() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("agent.toml");
    write(
        &main,
        "host = \"cp-0\"\n[[probes.exec]]\nname = \"Ready\"\ncommand = [\"/bin/true\"]\n",
    );
    let (ok, err) = check_config(&main);
    assert!(!ok, "{err}");
    assert!(
        err.contains("probes.exec[0].name: \"Ready\" is reserved"),
        "{err}"
    );
    write(
        &main,
        "host = \"cp-0\"\n[[probes.exec]]\nname = \"EtcdBackupFresh\"\ncommand = [\"/bin/true\"]\n",
    );
    assert!(check_config(&main).0);
}

#[test]
fn check_config_names_file_key_and_problem_and_run_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let main = d.join("agent.toml");
    write(&main, "host = \"cp-0\"\n");
    assert!(check_config(&main).0);

    // Unknown key in a drop-in.
    write(
        &d.join("agent.d/10-typo.toml"),
        "[probes.clock]\nmax_ofset = \"1s\"\n",
    );
    let (ok, err) = check_config(&main);
    assert!(!ok);
    assert!(
        err.contains("10-typo.toml") && err.contains("max_ofset"),
        "{err}"
    );
    std::fs::remove_file(d.join("agent.d/10-typo.toml")).unwrap();

    // Bad duration.
    write(
        &d.join("agent.d/20-dur.toml"),
        "[probes.kubelet]\nurl = \"http://127.0.0.1:1/healthz\"\nperiod = \"soon\"\n",
    );
    let (ok, err) = check_config(&main);
    assert!(!ok);
    assert!(
        err.contains("20-dur.toml") && err.contains("period"),
        "{err}"
    );
    std::fs::remove_file(d.join("agent.d/20-dur.toml")).unwrap();

    // World-readable key and a missing CA.
    write(&d.join("agent.key"), "secret");
    std::fs::set_permissions(d.join("agent.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    write(&d.join("agent.crt"), "cert");
    write(
        &d.join("agent.d/30-controller.toml"),
        &format!(
            "[controller]\nurl = \"https://127.0.0.1:9443\"\nca = \"{0}/missing-ca.crt\"\ncert = \"{0}/agent.crt\"\nkey = \"{0}/agent.key\"\n",
            d.display()
        ),
    );
    let (ok, err) = check_config(&main);
    assert!(!ok);
    assert!(
        err.contains("controller.key") && err.contains("mode 0644"),
        "{err}"
    );
    assert!(
        err.contains("controller.ca") && err.contains("missing-ca.crt"),
        "{err}"
    );

    // The daemon refuses to start on the same configuration, with exit code 2.
    let out = Command::new(AGENT)
        .args(["run", "--log-stderr", "--config"])
        .arg(&main)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("controller.key"), "{err}");
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn daemon_notifies_ready_watchdog_and_stopping_and_serves_status() {
    let dir = tempfile::tempdir().unwrap();
    let port = reserve_port().unwrap();
    let flag = dir.path().join("healthy");
    std::fs::write(&flag, "").unwrap();
    let config = dir.path().join("agent.toml");
    write(
        &config,
        &format!(
            "host = \"cp-0\"\n[state]\ndir = \"{d}/state\"\n[metrics]\nlisten = \"127.0.0.1:{p}\"\n\
             [[probes.exec]]\nname = \"FlagPresent\"\ncommand = [\"/usr/bin/test\", \"-e\", \"{f}\"]\n\
             period = \"100ms\"\ntimeout = \"100ms\"\nfailure_threshold = 2\n",
            d = dir.path().display(),
            p = port.port(),
            f = flag.display()
        ),
    );
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    drop(port);
    let mut child = Command::new(AGENT)
        .args(["run", "--log-stderr", "--config"])
        .arg(&config)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();

    let mut seen: Vec<String> = Vec::new();
    let mut buf = [0u8; 512];
    let started = Instant::now();
    while !(seen.iter().any(|m| m.starts_with("READY=1")) && seen.iter().any(|m| m == "WATCHDOG=1"))
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no READY/WATCHDOG: {seen:?}"
        );
        let n = socket.recv(&mut buf).unwrap();
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let ready = seen.iter().find(|m| m.starts_with("READY=1")).unwrap();
    assert!(ready.contains("STATUS=1 probes healthy"), "{ready}");

    let port = config_port(&config);
    let status = http_get(port, "/status");
    assert!(
        status.contains("\"condition\": \"FlagPresent\"") && status.contains("\"healthy\": true"),
        "{status}"
    );

    let out = Command::new(AGENT)
        .arg("status")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains("FlagPresent") && table.contains("yes"),
        "{table}"
    );

    // The probe fails twice (threshold 2) and the STATUS line follows.
    std::fs::remove_file(&flag).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = socket.recv(&mut buf).unwrap();
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if msg.contains("STATUS=unhealthy: FlagPresent") {
            break;
        }
        assert!(Instant::now() < deadline, "status never said unhealthy");
    }
    let metrics = http_get(port, "/metrics");
    assert!(
        metrics.contains("metalguard_agent_probe_healthy{condition=\"FlagPresent\"} 0"),
        "{metrics}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid.cast_signed()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = socket.recv(&mut buf).unwrap();
        if String::from_utf8_lossy(&buf[..n]).starts_with("STOPPING=1") {
            break;
        }
        assert!(Instant::now() < deadline, "no STOPPING=1");
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "agent exited with {status}");
}

fn config_port(config: &Path) -> u16 {
    let text = std::fs::read_to_string(config).unwrap();
    let line = text.lines().find(|l| l.starts_with("listen")).unwrap();
    line.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('"')
        .parse()
        .unwrap()
}
