//! End to end with the real binaries: a standalone controller on real etcd, three real agents
//! with mutual TLS, and an `ipmi_sim` BMC. A worker's agent reports its kubelet unhealthy; the
//! controller fences it through *another* host's agent; the simulator's power log shows exactly
//! one power-off, and the host is powered on again once it is healthy. etcd runs as kubeadm
//! runs it (TLS, client certificates required): the controller presents a client certificate
//! of its own, cp-1's agent its host's `healthcheck-client` certificate.
//!
//! Needs the workspace's binaries (`cargo nextest run --workspace` builds them).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, PowerEvent, Privilege};
use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::{Proc, tail_of};
use metalguard_e2e::soak::history::Event;
use metalguard_e2e::soak::logs::{Tail, Writer, parse_line};
use metalguard_e2e::soak::recorder::unix_ms;

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

/// The agent of `host`; `etcd` gives it an `[etcd]` section (endpoints and its TLS lines).
/// Its firmware identity is `dmi_uuid` (the UUID its BMC reports), read from its own
/// `dmi_dir`: the test hosts share this machine's `/sys/class/dmi/id`.
fn start_agent(
    dir: &Path,
    host: &str,
    controller_ports: &[u16],
    etcd: Option<(&[String], &str)>,
    dmi_uuid: Option<&str>,
) -> Agent {
    let dmi = dir.join(format!("{host}-dmi"));
    std::fs::create_dir_all(&dmi).unwrap();
    if let Some(uuid) = dmi_uuid {
        std::fs::write(dmi.join("product_uuid"), format!("{uuid}\n")).unwrap();
    }
    let tls = dir.join("tls");
    let flag = dir.join(format!("{host}.kubelet-ok"));
    std::fs::write(&flag, "").unwrap();
    let metrics = reserve_port().unwrap();
    let mut text = format!(
        "host = \"{host}\"\n\
         [controller]\nurl = \"https://127.0.0.1:{first}\"\nurls = [{more}]\n\
         ca = \"{tls}/ca.pem\"\ncert = \"{tls}/{host}.pem\"\nkey = \"{tls}/{host}-key.pem\"\n\
         report_interval = \"1s\"\ncommand_wait = \"5s\"\n\
         [state]\ndir = \"{dir}/{host}-state\"\ndmi_dir = \"{dmi}\"\n\
         [metrics]\nlisten = \"127.0.0.1:{m}\"\n\
         [[probes.exec]]\nname = \"KubeletHealthy\"\ncommand = [\"/usr/bin/test\", \"-e\", \"{flag}\"]\n\
         period = \"200ms\"\ntimeout = \"200ms\"\nfailure_threshold = 1\n",
        first = controller_ports[0],
        more = controller_ports[1..]
            .iter()
            .map(|p| format!("\"https://127.0.0.1:{p}\""))
            .collect::<Vec<_>>()
            .join(", "),
        tls = tls.display(),
        dir = dir.display(),
        m = metrics.port(),
        flag = flag.display(),
        dmi = dmi.display(),
    );
    if let Some((endpoints, tls)) = etcd {
        let list: Vec<String> = endpoints.iter().map(|e| format!("{e:?}")).collect();
        let _ = write!(text, "[etcd]\nendpoints = [{}]\n{tls}", list.join(", "));
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

const HOSTS: [&str; 3] = ["cp-1", "w-1", "w-2"];

/// etcd, certificates, the BMC simulator (w-2's BMC) and the inventory; controllers and agents
/// are started on top.
struct Stack {
    etcd: EtcdCluster,
    dir: tempfile::TempDir,
    sim: IpmiSim,
    port: metalguard_e2e::ports::PortLease,
    inventory: PathBuf,
}

impl Stack {
    fn new() -> Self {
        let etcd = EtcdCluster::start(1).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let tls = d.join("tls");
        let tls_s = tls.to_str().unwrap();
        controller(&["certs", "init", tls_s]);
        controller(&["certs", "issue", "controller", tls_s, "--server"]);
        for host in HOSTS {
            controller(&["certs", "issue", host, tls_s]);
        }
        let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
        let creds = sim.credentials_dir(Privilege::Admin);
        let port = reserve_port().unwrap();
        let endpoints: Vec<String> = etcd.endpoints();
        let pki = etcd.pki().unwrap();
        let client = pki.issue_client("metalguard").unwrap();
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
    ca_file = {ca:?}
    cert_file = {cert:?}
    key_file = {key:?}

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
                ca = pki.ca().display().to_string(),
                cert = client.cert.display().to_string(),
                key = client.key.display().to_string(),
            ),
        )
        .unwrap();
        Self {
            etcd,
            dir,
            sim,
            port,
            inventory,
        }
    }

    fn controller(&self, name: &str) -> (Proc, PathBuf) {
        let mut command = Command::new(workspace_bin("metalguard-controller"));
        command
            .args(["run", "--inventory"])
            .arg(&self.inventory)
            .args(["--id", name])
            .env("RUST_LOG", "info");
        let log = self.dir.path().join(format!("{name}.log"));
        (Proc::spawn(name, command, &log).unwrap(), log)
    }

    fn agents(&self) -> Vec<Agent> {
        self.agents_of(&[self.port.port()])
    }

    /// Agents that know every controller in `ports`, in that order.
    fn agents_of(&self, ports: &[u16]) -> Vec<Agent> {
        let endpoints = self.etcd.endpoints();
        // cp-1 is the etcd member's host: its agent uses the kubeadm files of that host.
        let pki = self.etcd.member(0).pki().unwrap();
        let tls = format!(
            "ca = {:?}\ncert = {:?}\nkey = {:?}\n",
            pki.ca.display().to_string(),
            pki.healthcheck_client.cert.display().to_string(),
            pki.healthcheck_client.key.display().to_string()
        );
        HOSTS
            .into_iter()
            .map(|host| {
                let etcd = (host == "cp-1").then_some((endpoints.as_slice(), tls.as_str()));
                let uuid = if host == "w-2" {
                    self.sim.system_uuid()
                } else {
                    None
                };
                start_agent(self.dir.path(), host, ports, etcd, uuid)
            })
            .collect()
    }

    /// A second controller on `port`: the same inventory but its own listen address.
    fn controller_on(&self, name: &str, port: u16) -> (Proc, PathBuf) {
        let text = std::fs::read_to_string(&self.inventory).unwrap().replace(
            &format!("listen = \"127.0.0.1:{}\"", self.port.port()),
            &format!("listen = \"127.0.0.1:{port}\""),
        );
        let inventory = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&inventory, text).unwrap();
        let mut command = Command::new(workspace_bin("metalguard-controller"));
        command
            .args(["run", "--inventory"])
            .arg(&inventory)
            .args(["--id", name])
            .env("RUST_LOG", "info");
        let log = self.dir.path().join(format!("{name}.log"));
        (Proc::spawn(name, command, &log).unwrap(), log)
    }

    /// When controller `name` last began leading (Unix ms), from its log.
    fn leader_began(&self, name: &str) -> Option<u64> {
        let mut tail = Tail::new(self.dir.path().join(format!("{name}.log")));
        tail.new_lines()
            .iter()
            .filter_map(
                |line| match parse_line(&Writer::Controller(name.to_owned()), line) {
                    Some((at, Event::Leader { .. })) => Some(at),
                    _ => None,
                },
            )
            .max()
    }

    /// The leader's id as `status` shows it (`none` while nobody leads), and how many hosts'
    /// stored reports it received since it began leading (a new leader stores each host's
    /// first report; a follower stores none). Not "under 2 s old": the store gets an
    /// unchanged report only once per heartbeat interval (15 s here), so that window was
    /// missed when `status` itself took seconds under the whole suite's load.
    fn leader_and_fresh_reports(&self) -> (String, usize) {
        let asked_at = unix_ms();
        let out = Command::new(workspace_bin("metalguard-controller"))
            .args(["status", "--inventory"])
            .arg(&self.inventory)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let leader = text
            .lines()
            .find_map(|l| l.strip_prefix("leader: "))
            .unwrap_or("none")
            .trim()
            .to_owned();
        // "  w-1: agent 0.1.0 report #12 0.4s ago, 1 conditions". `status` measured the age
        // at or after `asked_at`: `asked_at - age` is at most when the report was received.
        let began = self.leader_began(&leader);
        let fresh = text
            .lines()
            .filter_map(|l| l.split(" report #").nth(1))
            .filter_map(|rest| rest.split_whitespace().nth(1))
            .filter_map(|age| age.trim_end_matches('s').parse::<f64>().ok())
            .filter(|age| {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let age_ms = (age * 1000.0) as u64;
                began.is_some_and(|b| asked_at.saturating_sub(age_ms) >= b)
            })
            .count();
        (leader, fresh)
    }

    /// Waits until `want(leader)` holds and every host reports to it; returns the leader.
    fn wait_leader_with_reports(
        &self,
        want: impl Fn(&str) -> bool,
        context: impl Fn() -> String,
    ) -> String {
        let started = Instant::now();
        loop {
            let (leader, fresh) = self.leader_and_fresh_reports();
            if want(&leader) && fresh == HOSTS.len() {
                return leader;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "leader {leader}, {fresh} fresh reports:\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs(agents: &[Agent], controller_logs: &[&Path]) -> String {
        let mut all = String::new();
        for log in controller_logs {
            let _ = write!(all, "--- {}\n{}\n", log.display(), tail_of(log, 60));
        }
        for (agent, host) in agents.iter().zip(HOSTS) {
            let _ = write!(all, "--- {host}\n{}\n", tail_of(&agent.log, 30));
        }
        all
    }

    /// Waits until the simulator records a power-off, then returns how long it took.
    fn wait_for_off(&self, within: Duration, context: impl Fn() -> String) -> Duration {
        let started = Instant::now();
        while !self.sim.power_log().unwrap().iter().any(PowerEvent::is_off) {
            assert!(
                started.elapsed() < within,
                "no fence within {within:?}:\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        started.elapsed()
    }

    fn wait_for_power_on(&self, within: Duration, context: impl Fn() -> String) {
        let deadline = Instant::now() + within;
        while !self.sim.power_on().unwrap() {
            assert!(
                Instant::now() < deadline,
                "never powered on again:\n{}",
                context()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn assert_exactly_one_off(&self, context: impl Fn() -> String) {
        let events = self.sim.power_log().unwrap();
        assert_eq!(
            events.iter().filter(|e| e.is_off()).count(),
            1,
            "{events:?}\n{}",
            context()
        );
    }

    fn assert_no_password_in(&self, logs: &[&Path]) {
        for log in logs {
            let text = std::fs::read_to_string(log).unwrap();
            assert!(
                !text.contains(self.sim.password()),
                "password in {}",
                log.display()
            );
        }
    }
}

fn executors(agents: &[Agent]) -> Vec<&'static str> {
    agents
        .iter()
        .zip(HOSTS)
        .filter(|(a, _)| {
            std::fs::read_to_string(&a.log)
                .unwrap()
                .contains("executing command")
        })
        .map(|(_, h)| h)
        .collect()
}

#[test]
fn an_unhealthy_worker_is_fenced_exactly_once_by_another_agent_and_powered_on_again() {
    let stack = Stack::new();
    let (mut ctl, ctl_log) = stack.controller("ctl");
    let agents = stack.agents();
    let logs = || Stack::logs(&agents, &[&ctl_log]);
    // Let the agents report healthy for a while (the controller knows every host), and wait
    // until `status` shows every agent and the BMC probes: under the suite's load an agent
    // can take longer than a fixed sleep to start and report (a 4 s sleep once missed w-2).
    std::thread::sleep(Duration::from_secs(4));
    let reached = format!("  w-2 ({}): reached by cp-1, w-1\n", stack.sim.url());
    let status_now = || {
        let out = Command::new(workspace_bin("metalguard-controller"))
            .args(["status", "--inventory"])
            .arg(&stack.inventory)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let seen_all = |status: &str| {
        HOSTS
            .iter()
            .all(|host| status.contains(&format!("  {host}: agent {}", env!("CARGO_PKG_VERSION"))))
            && status.contains(&reached)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (ok, status) = loop {
        let (ok, status) = status_now();
        if (ok && seen_all(&status)) || std::time::Instant::now() > deadline {
            break (ok, status);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    ctl.ensure_running().unwrap();
    assert!(
        stack.sim.power_log().unwrap().is_empty(),
        "fenced a healthy host:\n{}",
        logs()
    );
    // `status` shows every real agent's report with its conditions.
    assert!(ok && status.contains("leader: ctl"), "{status}");
    for host in HOSTS {
        let version = format!("  {host}: agent {}", env!("CARGO_PKG_VERSION"));
        assert!(status.contains(&version), "{host} missing:\n{status}");
    }
    assert!(status.contains("KubeletHealthy = True"), "{status}");
    // The other agents were told w-2's BMC and reached it without credentials.
    assert!(status.contains(&reached), "{status}\n{}", logs());

    // w-2's kubelet fails: after the 1 s timeout the controller fences it.
    std::fs::remove_file(&agents[2].flag).unwrap();
    let took = stack.wait_for_off(Duration::from_secs(30), logs);
    eprintln!("kubelet failure -> verified power-off: {took:?}");
    assert!(!stack.sim.power_on().unwrap());
    // The host "reboots" healthy and is powered on again; nothing more happens to it.
    std::fs::write(&agents[2].flag, "").unwrap();
    stack.wait_for_power_on(Duration::from_secs(40), logs);
    std::thread::sleep(Duration::from_secs(3));
    stack.assert_exactly_one_off(logs);

    let executed = executors(&agents);
    assert!(
        !executed.is_empty() && !executed.contains(&"w-2"),
        "executors {executed:?}:\n{}",
        logs()
    );
    let all: Vec<&Path> = agents
        .iter()
        .map(|a| a.log.as_path())
        .chain([ctl_log.as_path()])
        .collect();
    stack.assert_no_password_in(&all);
    for mut agent in agents {
        agent.proc.terminate(Duration::from_secs(5));
    }
    ctl.terminate(Duration::from_secs(5));
}

/// The controller dies right after handing out the fence and stays away for a minute: the
/// agent keeps running, keeps its result, and delivers it to the restarted controller, which
/// finishes the remediation without a second power-off.
#[test]
fn a_controller_down_for_a_minute_mid_fence_gets_the_result_and_never_fences_twice() {
    let stack = Stack::new();
    let (mut first, first_log) = stack.controller("ctl-a");
    let agents = stack.agents();
    std::thread::sleep(Duration::from_secs(4));
    first.ensure_running().unwrap();

    std::fs::remove_file(&agents[2].flag).unwrap();
    // Kill the controller the moment an agent starts executing the fence, before its result
    // (which needs the power-off plus a verifying read) can reach it.
    let started = Instant::now();
    while executors(&agents).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no command:\n{}",
            Stack::logs(&agents, &[&first_log])
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill();
    stack.wait_for_off(Duration::from_secs(15), || {
        Stack::logs(&agents, &[&first_log])
    });
    std::fs::write(&agents[2].flag, "").unwrap();

    std::thread::sleep(Duration::from_secs(60));
    let executor = executors(&agents)[0];
    let executor_agent = &agents[HOSTS.iter().position(|h| *h == executor).unwrap()];
    let pending = std::fs::read_dir(
        stack
            .dir
            .path()
            .join(format!("{executor}-state/operations")),
    )
    .unwrap()
    .filter(|e| {
        e.as_ref()
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".result.json")
    })
    .count();
    assert_eq!(
        pending, 1,
        "the executor keeps its undelivered result while the controller is away"
    );
    for agent in &agents {
        let mut proc_alive = std::process::Command::new("kill");
        assert!(
            proc_alive
                .args(["-0", &agent.proc.pid().unwrap().to_string()])
                .status()
                .unwrap()
                .success()
        );
    }

    let (mut second, second_log) = stack.controller("ctl-b");
    let logs = || Stack::logs(&agents, &[&first_log, &second_log]);
    stack.wait_for_power_on(Duration::from_secs(60), logs);
    std::thread::sleep(Duration::from_secs(3));
    stack.assert_exactly_one_off(logs);
    let text = std::fs::read_to_string(&executor_agent.log).unwrap();
    assert!(text.contains("result not delivered yet"), "{}", logs());
    assert!(text.contains("result delivered"), "{}", logs());
    let all: Vec<&Path> = agents
        .iter()
        .map(|a| a.log.as_path())
        .chain([first_log.as_path(), second_log.as_path()])
        .collect();
    stack.assert_no_password_in(&all);
    for mut agent in agents {
        agent.proc.terminate(Duration::from_secs(5));
    }
    second.terminate(Duration::from_secs(5));
}

/// Two controllers, agents configured with both URLs: the leader is killed, the other takes
/// over, and the agents follow it (the follower answered them 503 before): a failure after the
/// hand-over is fenced exactly once by another agent through the new leader.
#[test]
fn agents_that_know_both_controllers_follow_the_leader_after_a_hand_over() {
    let stack = Stack::new();
    let port_b = reserve_port().unwrap();
    let (mut a, a_log) = stack.controller("ctl-a");
    let (mut b, b_log) = stack.controller_on("ctl-b", port_b.port());
    // ctl-b's URL first: with ctl-a leading, every agent starts at a follower.
    let agents = stack.agents_of(&[port_b.port(), stack.port.port()]);
    let logs = || Stack::logs(&agents, &[&a_log, &b_log]);
    // Every agent reaches the leader, whichever it is (those starting at the follower move).
    let first = stack.wait_leader_with_reports(|l| l != "none", logs);
    if first == "ctl-a" {
        a.kill();
    } else {
        b.kill();
    }
    let started = Instant::now();
    // And after the hand-over every agent reaches the new leader.
    let second = stack.wait_leader_with_reports(|l| l != "none" && l != first, logs);
    eprintln!(
        "{first} killed; {second} leads and hears every agent after {:?}",
        started.elapsed()
    );
    std::fs::remove_file(&agents[2].flag).unwrap();
    let took = stack.wait_for_off(Duration::from_secs(30), logs);
    eprintln!("kubelet failure -> verified power-off through {second}: {took:?}");
    std::fs::write(&agents[2].flag, "").unwrap();
    stack.wait_for_power_on(Duration::from_secs(40), logs);
    std::thread::sleep(Duration::from_secs(2));
    stack.assert_exactly_one_off(logs);
    let executed = executors(&agents);
    assert!(
        !executed.is_empty() && !executed.contains(&"w-2"),
        "executors {executed:?}:\n{}",
        logs()
    );
    for mut agent in agents {
        agent.proc.terminate(Duration::from_secs(5));
    }
    a.terminate(Duration::from_secs(5));
    b.terminate(Duration::from_secs(5));
}
