//! End to end with the real binaries: a standalone controller on real etcd, three real agents
//! with mutual TLS, and an `ipmi_sim` BMC. A worker's agent reports its kubelet unhealthy; the
//! controller fences it through *another* host's agent; the simulator's power log shows exactly
//! one power-off, and the host is powered on again once it is healthy.
//!
//! Needs the workspace's binaries (`cargo nextest run --workspace` builds them).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege};
use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::Proc;

/// A workspace binary next to this test's own directory (`target/<profile>/NAME`).
fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        path.exists(),
        "{} not built: run `cargo build --workspace` first",
        path.display()
    );
    path
}

fn controller(args: &[&str]) {
    let out = Command::new(workspace_bin("metalguard-controller"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct Agent {
    proc: Proc,
    flag: PathBuf,
    log: PathBuf,
}

fn start_agent(dir: &Path, host: &str, controller_port: u16, etcd: Option<&[String]>) -> Agent {
    let tls = dir.join("tls");
    let flag = dir.join(format!("{host}.kubelet-ok"));
    std::fs::write(&flag, "").unwrap();
    let metrics = reserve_port().unwrap();
    let mut text = format!(
        "host = \"{host}\"\n\
         [controller]\nurl = \"https://127.0.0.1:{controller_port}\"\n\
         ca = \"{tls}/ca.pem\"\ncert = \"{tls}/{host}.pem\"\nkey = \"{tls}/{host}-key.pem\"\n\
         report_interval = \"1s\"\ncommand_wait = \"5s\"\n\
         [state]\ndir = \"{dir}/{host}-state\"\n\
         [metrics]\nlisten = \"127.0.0.1:{m}\"\n\
         [[probes.exec]]\nname = \"KubeletHealthy\"\ncommand = [\"/usr/bin/test\", \"-e\", \"{flag}\"]\n\
         period = \"200ms\"\ntimeout = \"200ms\"\nfailure_threshold = 1\n",
        tls = tls.display(),
        dir = dir.display(),
        m = metrics.port(),
        flag = flag.display(),
    );
    if let Some(endpoints) = etcd {
        let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
        let _ = write!(text, "[etcd]\nendpoints = [{}]\n", list.join(", "));
    }
    let config = dir.join(format!("{host}.toml"));
    std::fs::write(&config, text).unwrap();
    drop(metrics);
    let log = dir.join(format!("{host}.log"));
    let mut command = Command::new(workspace_bin("metalguard-agent"));
    command
        .args(["run", "--log-stderr", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info");
    Agent {
        proc: Proc::spawn(format!("agent {host}"), command, &log).unwrap(),
        flag,
        log,
    }
}

#[test]
fn an_unhealthy_worker_is_fenced_exactly_once_by_another_agent_and_powered_on_again() {
    let etcd = EtcdCluster::start(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tls = d.join("tls");
    let tls_s = tls.to_str().unwrap();
    controller(&["certs", "init", tls_s]);
    controller(&["certs", "issue", "controller", tls_s, "--server"]);
    for host in ["cp-1", "w-1", "w-2"] {
        controller(&["certs", "issue", host, tls_s]);
    }
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let creds = sim.credentials_dir(Privilege::Admin);
    let port = reserve_port().unwrap();
    let endpoints: Vec<String> = etcd.endpoints();
    let inventory = d.join("inventory.toml");
    std::fs::write(
        &inventory,
        format!(
            r#"
[controller]
listen = "127.0.0.1:{port}"
tls_dir = "{tls}"
plan_interval = "200ms"

[etcd]
endpoints = [{endpoints}]
lease_ttl = "2s"
timeout = "500ms"

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "w-1"
role = "worker"

[[hosts]]
name = "w-2"
role = "worker"
bmc = {{ address = "{bmc}", credentials_dir = "{creds}" }}

[[policy.health_checks]]
name = "workers"
selector = {{ role = "worker" }}
unhealthy_conditions = [{{ type = "KubeletHealthy", status = "False", timeout = "1s" }}]
"#,
            port = port.port(),
            tls = tls.display(),
            endpoints = endpoints
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", "),
            bmc = sim.url(),
            creds = creds.display(),
        ),
    )
    .unwrap();
    let mut command = Command::new(workspace_bin("metalguard-controller"));
    command
        .args(["run", "--inventory"])
        .arg(&inventory)
        .args(["--id", "ctl"])
        .env("RUST_LOG", "info");
    let controller_log = d.join("controller.log");
    let mut ctl = Proc::spawn("controller", command, &controller_log).unwrap();

    let agents: Vec<Agent> = [
        ("cp-1", Some(endpoints.as_slice())),
        ("w-1", None),
        ("w-2", None),
    ]
    .into_iter()
    .map(|(host, etcd)| start_agent(d, host, port.port(), etcd))
    .collect();
    let logs = || {
        let mut all = format!(
            "--- controller\n{}\n",
            metalguard_e2e::process::tail_of(&controller_log, 60)
        );
        for (agent, host) in agents.iter().zip(["cp-1", "w-1", "w-2"]) {
            let _ = write!(
                all,
                "--- {host}\n{}\n",
                metalguard_e2e::process::tail_of(&agent.log, 30)
            );
        }
        all
    };
    // Let the agents report healthy for a while (the controller knows every host).
    std::thread::sleep(Duration::from_secs(4));
    ctl.ensure_running().unwrap();
    assert!(
        sim.power_log().unwrap().is_empty(),
        "fenced a healthy host:\n{}",
        logs()
    );

    // w-2's kubelet fails: after the 1 s timeout the controller fences it.
    let failed = Instant::now();
    std::fs::remove_file(&agents[2].flag).unwrap();
    while !sim
        .power_log()
        .unwrap()
        .iter()
        .any(metalguard_e2e::ipmi::PowerEvent::is_off)
    {
        assert!(
            failed.elapsed() < Duration::from_secs(30),
            "no fence within 30 s:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fenced_after = failed.elapsed();
    eprintln!("kubelet failure -> verified power-off: {fenced_after:?}");
    assert!(!sim.power_on().unwrap());
    // The host "reboots" healthy.
    std::fs::write(&agents[2].flag, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    while !sim.power_on().unwrap() {
        assert!(
            Instant::now() < deadline,
            "never powered on again:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Nothing more happens to it.
    std::thread::sleep(Duration::from_secs(3));
    let events = sim.power_log().unwrap();
    assert_eq!(
        events.iter().filter(|e| e.is_off()).count(),
        1,
        "{events:?}\n{}",
        logs()
    );

    // The fence was executed by another host's agent, never by the target's own.
    let executed: Vec<&str> = agents
        .iter()
        .zip(["cp-1", "w-1", "w-2"])
        .filter(|(a, _)| {
            std::fs::read_to_string(&a.log)
                .unwrap()
                .contains("executing command")
        })
        .map(|(_, h)| h)
        .collect();
    assert!(
        !executed.is_empty() && !executed.contains(&"w-2"),
        "executors {executed:?}:\n{}",
        logs()
    );
    // The BMC password appears in no log.
    for log in agents.iter().map(|a| &a.log).chain([&controller_log]) {
        assert!(
            !std::fs::read_to_string(log)
                .unwrap()
                .contains(sim.password()),
            "{}",
            log.display()
        );
    }
    for mut agent in agents {
        agent.proc.terminate(Duration::from_secs(5));
    }
    ctl.terminate(Duration::from_secs(5));
}
