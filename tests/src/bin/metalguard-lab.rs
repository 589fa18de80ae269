//! `metalguard-lab`: the local lab (README's main job).
//!
//! ```text
//! metalguard-lab demo [--hosts N]          every scenario in sequence, then a summary table
//! metalguard-lab run SCENARIO... [--hosts N] [--spares N]
//! metalguard-lab up [--hosts N]            leave the lab running with a cheat-sheet; Ctrl-C stops it
//! ```
//! `--netns` (as root) runs every host in its own network namespace; `run partition` implies
//! it.
//! `replace` needs a spare host: `demo` and `run replace` start one unless `--spares` says more.
//! `--etcd-layout static-pod` runs a spare's etcd as kubeadm's static Pod (the agent's
//! `static-pod` launcher writes the manifest, the lab is the host's kubelet) instead of from an
//! environment file (`env-file`, the default).
//! `--kubernetes` runs the lab in Kubernetes mode: the lab's etcd is also a real
//! kube-apiserver's store, each host has a Node, and the controller runs with
//! `--backend=kubernetes` on `GuardedHost`s (it must be built with its default features).
//! `--controller-image ARCHIVE` (with `--kubernetes`, as root) runs the controller as the
//! shipped Deployment's two Pods on two real nodes (containerd, kubelet, kube-proxy; the image
//! from ARCHIVE, `packaging/build-image.sh`) instead of as processes; `scripts/lab.sh
//! --kubernetes` passes it when the machine can run Pods.
//! Not in that mode: partition (netns; the API server and its kubelets live on 127.0.0.1;
//! see [`KUBE_UNSUPPORTED`]).
//! The binaries `metalguard-agent` and `metalguard-controller` are taken from the directory
//! of this executable (`target/<profile>/`) unless `--bin-dir` says otherwise.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use metalguard_e2e::lab::scenarios::{self, Report};
use metalguard_e2e::lab::{EtcdLayout, Lab, LabBackend, LabOptions};

struct Args {
    command: String,
    scenarios: Vec<String>,
    hosts: usize,
    spares: usize,
    bin_dir: PathBuf,
    netns: bool,
    etcd_layout: EtcdLayout,
    kubernetes: bool,
    controller_image: Option<PathBuf>,
}

/// Scenarios the Kubernetes-mode lab does not run, and why.
const KUBE_UNSUPPORTED: [(&str, &str); 1] = [(
    "partition",
    "it cuts a host's link inside network namespaces, and the Kubernetes lab's API server and kubelets run on 127.0.0.1 outside them",
)];

fn usage() -> String {
    format!(
        "usage: metalguard-lab demo|up|run SCENARIO... [--hosts N] [--spares N] [--bin-dir DIR] [--netns] [--etcd-layout env-file|static-pod] [--kubernetes [--controller-image ARCHIVE]]\n\
         scenarios: {} (the demo's, in its order); also controller-crash\n\
         --kubernetes: a real kube-apiserver on the lab's etcd, Nodes, the controller on GuardedHosts; not run there:\n{}",
        scenarios::ALL.join(", "),
        KUBE_UNSUPPORTED
            .iter()
            .map(|(name, why)| format!("  {name}: {why}"))
            .collect::<Vec<_>>()
            .join("\n")
    )
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let command = args.next().ok_or_else(usage)?;
    let mut parsed = Args {
        command,
        scenarios: Vec::new(),
        hosts: 3,
        spares: 0,
        bin_dir: std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_default(),
        netns: false,
        etcd_layout: EtcdLayout::default(),
        kubernetes: false,
        controller_image: None,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--hosts" => {
                parsed.hosts = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n: &usize| *n % 2 == 1 && *n <= 7)
                    .ok_or("--hosts needs an odd number up to 7")?;
            }
            "--spares" => {
                parsed.spares = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n: &usize| *n <= 2)
                    .ok_or("--spares needs a number up to 2")?;
            }
            "--bin-dir" => {
                parsed.bin_dir = args
                    .next()
                    .map(PathBuf::from)
                    .ok_or("--bin-dir needs a path")?;
            }
            "--netns" => parsed.netns = true,
            "--kubernetes" => parsed.kubernetes = true,
            "--controller-image" => {
                parsed.controller_image = Some(
                    args.next()
                        .map(PathBuf::from)
                        .ok_or("--controller-image needs the image archive's path")?,
                );
            }
            "--etcd-layout" => {
                parsed.etcd_layout = args
                    .next()
                    .as_deref()
                    .and_then(EtcdLayout::parse)
                    .ok_or("--etcd-layout needs env-file or static-pod")?;
            }
            "-h" | "--help" => return Err(usage()),
            other if !other.starts_with('-') => parsed.scenarios.push(other.to_owned()),
            other => return Err(format!("unknown option {other}\n{}", usage())),
        }
    }
    if parsed.controller_image.is_some() && !parsed.kubernetes {
        return Err("--controller-image needs --kubernetes".into());
    }
    if parsed.kubernetes {
        for (name, why) in KUBE_UNSUPPORTED {
            if parsed.scenarios.iter().any(|s| s == name) {
                return Err(format!("{name} does not run with --kubernetes: {why}"));
            }
        }
    }
    for tool in ["metalguard-agent", "metalguard-controller"] {
        if !parsed.bin_dir.join(tool).exists() {
            return Err(format!(
                "{tool} not found in {} (build it: cargo build -p metalguard-agent -p metalguard-controller)",
                parsed.bin_dir.display()
            ));
        }
    }
    Ok(parsed)
}

fn stop_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registration only fails for forbidden signals; these two are allowed.
        let _ = signal_hook::flag::register(signal, Arc::clone(&flag));
    }
    flag
}

fn start(args: &Args) -> Result<Lab, String> {
    println!(
        "metalguard lab: {} control-plane hosts (real etcd, real agents, Redfish and IPMI BMC emulators), {}",
        args.hosts,
        match (args.kubernetes, &args.controller_image) {
            (true, Some(_)) =>
                "the controller as the shipped Deployment's two Pods on two real nodes (Kubernetes backend: a real kube-apiserver on the lab's etcd, a Node per host)",
            (true, None) =>
                "one controller process (Kubernetes backend: a real kube-apiserver on the lab's etcd, a Node per host)",
            _ => "one controller",
        }
    );
    let mut options = LabOptions::new(args.hosts, args.bin_dir.clone());
    // partition cuts one host's link: every host needs its own network namespace (root).
    options.netns = args.netns || args.scenarios.iter().any(|s| s == "partition");
    options.live = true;
    options.etcd_layout = args.etcd_layout;
    if args.kubernetes {
        options.backend = LabBackend::Kubernetes;
        options.controller_image.clone_from(&args.controller_image);
    }
    // replace needs a spare host to replace the retired one with.
    let replace = args.command == "demo" || args.scenarios.iter().any(|s| s == "replace");
    options.spares = if replace {
        args.spares.max(1)
    } else {
        args.spares
    };
    // controller-crash kills the controller while a power change is in flight: the Redfish
    // BMCs then take seconds to change power, as real ones do.
    options.redfish_power_delay = args.scenarios.iter().any(|s| s == "controller-crash");
    Lab::start(options).map_err(|e| format!("the lab did not start: {e}"))
}

fn summary(reports: &[(String, Result<Report, String>)], total: Duration) -> bool {
    println!(
        "\n{:<15} {:<6} {:>7}  expected / seen",
        "scenario", "result", "time"
    );
    let mut all_ok = true;
    for (name, r) in reports {
        match r {
            Ok(r) => {
                all_ok &= r.ok;
                println!(
                    "{:<15} {:<6} {:>6.1}s  expected: {}",
                    name,
                    if r.ok { "ok" } else { "FAILED" },
                    r.took.as_secs_f64(),
                    r.expected
                );
                println!("{:<31}seen:     {}", "", r.seen);
            }
            Err(e) => {
                all_ok = false;
                println!("{name:<15} {:<6} {:>7}  {e}", "ERROR", "-");
            }
        }
    }
    println!(
        "\n{} in {:.0}s",
        if all_ok {
            "every scenario matched its expected outcome"
        } else {
            "SOME SCENARIOS DID NOT MATCH"
        },
        total.as_secs_f64()
    );
    all_ok
}

fn run_scenarios(args: &Args, names: &[String]) -> ExitCode {
    let started = Instant::now();
    let stop = stop_flag();
    let mut lab = match start(args) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let mut reports = Vec::new();
    for name in names {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        println!("\n=== scenario {name}");
        let result = scenarios::run(&mut lab, name).map_err(|e| e.to_string());
        if let Ok(r) = &result {
            println!(
                "--- {name}: {} — {}",
                if r.ok { "ok" } else { "FAILED" },
                r.seen
            );
        } else if let Err(e) = &result {
            println!("--- {name}: ERROR — {e}\n{}", lab.logs());
        }
        let failed = result.as_ref().map_or(true, |r| !r.ok);
        reports.push((name.clone(), result));
        if failed {
            lab.keep_dir();
            // Let the next scenario start from a healthy lab if it can.
            if let Err(e) = lab.wait_all_healthy(Duration::from_secs(90)) {
                println!("the lab did not recover ({e}); stopping");
                break;
            }
        }
    }
    let ok = summary(&reports, started.elapsed());
    if !ok {
        println!("logs kept in {}", lab.dir().display());
    }
    drop(lab);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn up(args: &Args) -> ExitCode {
    let stop = stop_flag();
    let mut lab = match start(args) {
        Ok(lab) => lab,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    lab.keep_dir();
    let inv = match lab.kube() {
        Some(kube) => format!("--kubeconfig {}", kube.admin_kubeconfig().display()),
        None => format!("--inventory {}", lab.inventory().display()),
    };
    let ctl = args
        .bin_dir
        .join("metalguard-controller")
        .display()
        .to_string();
    let agent = args.bin_dir.join("metalguard-agent").display().to_string();
    println!("\nThe lab is up (Ctrl-C stops it and every process it started). Try:\n");
    println!("  {ctl} status {inv}");
    println!("  {ctl} fence cp-2 --reason 'testing' {inv}");
    println!("  {ctl} fence cp-2 --force --reason 'testing' {inv}");
    if let Some(kube) = lab.kube()
        && let Ok(kubectl) = metalguard_e2e::tools::kube_bin("kubectl")
    {
        println!(
            "  {} --kubeconfig {} get nodes,metalguard -A",
            kubectl.display(),
            kube.admin_kubeconfig().display()
        );
        if kube.controller_pods().is_some() {
            println!(
                "  {} --kubeconfig {} -n metalguard-system get pods,endpointslices -o wide -L metalguard.io/leader",
                kubectl.display(),
                kube.admin_kubeconfig().display()
            );
        }
    }
    if let Some(h) = lab.hosts().first() {
        println!(
            "  {agent} status --config {}",
            h.agent_config_path().display()
        );
        if let Some(pid) = h.agent_pid() {
            println!("  kill -STOP {pid}   # freeze cp-1's agent (kill -CONT {pid} to thaw)");
        }
    }
    println!(
        "  ETCDCTL_API=3 etcdctl --endpoints={} {} endpoint status -w table",
        lab.etcd().endpoints().join(","),
        lab.etcd().etcdctl_tls_flags()
    );
    let controller_logs = match lab.kube().and_then(|k| k.controller_pods()) {
        Some(pods) => pods
            .log_files()
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        None => format!("{}/controller.log", lab.dir().display()),
    };
    println!(
        "\n  logs: {controller_logs}, {}/hosts/<host>/agent.log",
        lab.dir().display()
    );
    println!("  timeline:");
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = lab.tick() {
            eprintln!("the lab failed: {e}");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("\nstopping the lab (logs stay in {})", lab.dir().display());
    drop(lab);
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match args.command.as_str() {
        "demo" => {
            let all: Vec<String> = scenarios::ALL.iter().map(|s| (*s).to_owned()).collect();
            run_scenarios(&args, &all)
        }
        "run" if !args.scenarios.is_empty() => run_scenarios(&args, &args.scenarios),
        "up" => up(&args),
        _ => {
            eprintln!("{}", usage());
            ExitCode::from(2)
        }
    }
}
