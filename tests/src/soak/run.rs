//! The soak driver: starts the lab (five control-plane hosts, two controllers), the etcd
//! sampler and the workload, runs the nemesis for the duration while the recorder reads
//! everything, heals what is left, lets the system settle, and checks the history.
//!
//! Data flow: [`SoakOptions`] → [`super::schedule::plan`] (from the seed alone) → the loop
//! (lab tick → recorder poll → nemesis step) → settle → workload's final read → the history
//! file → [`super::check::check`] → [`super::report::render`] → [`Outcome`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::check::{self, Params, Verdict};
use super::history::Event;
use super::nemesis::Nemesis;
use super::recorder::{EtcdSampler, Paths, Recorder, SamplerTarget};
use super::schedule::{self, Shape};
use super::workload::Workload;
use crate::lab::{Lab, LabBackend, LabOptions, Timings};
use crate::{HarnessError, Result};

/// Pause between two ticks of the soak loop.
const TICK: Duration = Duration::from_millis(100);
/// After the faults, how long every host has to be healthy again with no remediation active.
const SETTLE: Duration = Duration::from_secs(240);
/// Lab tick errors in a row that end the soak (one is a hiccup; many, a broken lab).
const MAX_TICK_ERRORS: u32 = 50;

/// What to run.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // independent switches of one run
pub struct SoakOptions {
    /// The schedule's seed.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// Kubernetes mode (the controllers on the Lease, GuardedHosts) instead of standalone.
    pub kubernetes: bool,
    /// Partitions (network namespaces; standalone, as root).
    pub netns: bool,
    /// Where `metalguard-agent` and `metalguard-controller` are.
    pub bin_dir: PathBuf,
    /// Where the history and the report go.
    pub out_dir: PathBuf,
    /// Print the lab's timeline as it grows.
    pub live: bool,
    /// Agents reach the controllers through lag relays and the schedule has `leader-lag`
    /// faults.
    pub lag: bool,
}

/// What a soak found.
#[derive(Debug)]
pub struct Outcome {
    /// The checker's verdict.
    pub verdict: Verdict,
    /// The printed report.
    pub report: String,
    /// Faults injected.
    pub faults: u64,
    /// Every host was healthy again, with no remediation active, after the faults.
    pub settled: bool,
    /// Where the history is.
    pub history: PathBuf,
}

/// Kubernetes mode: how long `Ready=Unknown` must hold before the soak's check finds a host
/// unhealthy. A healthy kubelet's heartbeats stall for as long as kube-apiserver waits on a
/// hung etcd member ([`crate::lab::kube::APISERVER_ETCD_STALL`], which the lab cannot
/// shorten: it is gRPC's keepalive), and kube-controller-manager marks its Node `Unknown`
/// after its grace period: a timeout shorter than both fences healthy hosts whenever another
/// host hangs (the 202 soak did, at 13:16). So the soak, like a production check (300 s in
/// the seeds' examples), waits longer than the stall; hung hosts are still found in seconds
/// by their silent agents (`agentHeartbeatTimeout`).
pub const KUBE_READY_UNKNOWN_TIMEOUT: Duration = Duration::from_secs(90);

/// The schedule's shape for a lab with these timings.
pub fn shape(options: &SoakOptions, timings: &Timings) -> Shape {
    Shape {
        hosts: 5,
        duration: options.duration,
        kubernetes: options.kubernetes,
        netns: options.netns && !options.kubernetes,
        heartbeat_timeout: timings.heartbeat_timeout,
        lease: if options.kubernetes {
            crate::lab::kube::CONTROLLER_LEASE
        } else {
            timings.lease_ttl
        },
        recovery: Duration::from_secs(if options.kubernetes { 60 } else { 40 }),
        lag: options.lag,
    }
}

/// Runs one soak.
pub fn run(options: &SoakOptions) -> Result<Outcome> {
    std::fs::create_dir_all(&options.out_dir)
        .map_err(HarnessError::io("creating the soak's directory"))?;
    let paths = Paths {
        dir: options.out_dir.clone(),
    };
    let mut lab_options = LabOptions::new(5, options.bin_dir.clone());
    lab_options.controllers = 2;
    lab_options.lag_relays = options.lag;
    if options.lag {
        let lease = if options.kubernetes {
            crate::lab::kube::CONTROLLER_LEASE
        } else {
            lab_options.timings.lease_ttl
        };
        lab_options.timings.agent_request_timeout =
            Some(super::nemesis::agent_request_timeout(lease));
    }
    lab_options.live = options.live;
    // A replica that exits is started again, as systemd or the kubelet would; the exit is in
    // the history, and a panic is a violation.
    lab_options.supervise_controllers = true;
    if options.kubernetes {
        lab_options.timings.ready_unknown_timeout = Some(KUBE_READY_UNKNOWN_TIMEOUT);
    }
    lab_options.netns = options.netns && !options.kubernetes;
    lab_options.redfish_power_delay = true;
    lab_options.timings.max_retry = 2;
    if options.kubernetes {
        lab_options.backend = LabBackend::Kubernetes;
    }
    let plan = schedule::plan(options.seed, &shape(options, &lab_options.timings));
    let mut lab = Lab::start(lab_options)?;
    lab.wait_all_healthy(Duration::from_secs(120))?;

    let target = SamplerTarget {
        members: lab
            .member_health_addrs()
            .into_iter()
            .enumerate()
            .map(|(i, addr)| (lab.hosts()[i].name.clone(), addr))
            .collect(),
        endpoints: lab.etcd().endpoints(),
        tls: lab.etcd().client_tls(),
    };
    let (sampler, etcd_samples) = EtcdSampler::start(target);
    let workload = Workload::start(lab.etcd().endpoints(), lab.etcd().client_tls());
    let mut rec = Recorder::new(&lab, &paths.raw(), etcd_samples)?;
    rec.record(Event::Start {
        seed: options.seed,
        backend: backend_name(options).into(),
        hosts: lab.hosts().iter().map(|h| h.name.clone()).collect(),
        controllers: lab.controller_names(),
        duration_s: options.duration.as_secs(),
    });

    let mut nemesis = Nemesis::new(plan);
    let interrupted = interrupt_flag();
    let started = Instant::now();
    let mut errors = 0;
    let mut last_scene = Instant::now();
    while started.elapsed() < options.duration && !interrupted.load(Ordering::Relaxed) {
        step(&mut lab, &mut rec, &mut errors)?;
        nemesis.step(&mut lab, &mut rec, started.elapsed())?;
        if last_scene.elapsed() > Duration::from_secs(60) {
            // The timeline is for people watching; over hours it would only grow.
            lab.new_scenario();
            last_scene = Instant::now();
        }
        std::thread::sleep(TICK);
    }
    let interrupted = interrupted.load(Ordering::Relaxed);
    if interrupted {
        eprintln!(
            "soak: interrupted after {:?} of faults: healing the lab, checking the history so far, then stopping everything it started (a second signal ends at once and may leave processes behind)",
            started.elapsed()
        );
    }
    nemesis.stop(&mut lab, &mut rec)?;
    let settled = !interrupted && settle(&mut lab, &mut rec, &mut errors)?;
    drop(sampler);
    step(&mut lab, &mut rec, &mut errors)?;
    let (tally, lost) = workload.finish()?;
    rec.record(Event::Workload {
        acked: tally.acked.len() as u64,
        failed: tally.failed,
        lost,
    });
    rec.record(Event::End);
    let history = rec.finish(&paths.history())?;
    let verdict = check::check(&history, &Params::default());
    let report = super::report::render(&history, &verdict, options.seed, backend_name(options));
    std::fs::write(paths.report(), &report).map_err(HarnessError::io("writing the report"))?;
    if !verdict.passed() {
        lab.keep_dir();
    }
    Ok(Outcome {
        verdict,
        report,
        faults: nemesis.injected,
        settled,
        history: paths.history(),
    })
}

/// Set by SIGINT or SIGTERM: the faults stop and the soak ends as it would at its duration, so
/// the lab's processes and namespaces are taken down (the default action of either signal
/// left the whole lab running). A second signal ends the process at once.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // Registration only fails for forbidden signals; these two are allowed. The
        // conditional shutdown first, so the first signal only sets the flag.
        let _ = signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&flag));
        let _ = signal_hook::flag::register(signal, Arc::clone(&flag));
    }
    flag
}

fn backend_name(options: &SoakOptions) -> &'static str {
    if options.kubernetes {
        "kubernetes"
    } else {
        "standalone"
    }
}

/// One tick of the lab and one poll of the recorder; a lab error is tolerated unless it
/// repeats [`MAX_TICK_ERRORS`] times in a row.
fn step(lab: &mut Lab, rec: &mut Recorder, errors: &mut u32) -> Result<()> {
    match lab.tick().and_then(|()| rec.poll(lab)) {
        Ok(()) => {
            *errors = 0;
            Ok(())
        }
        Err(e) => {
            *errors += 1;
            eprintln!("soak: lab tick failed ({errors} in a row): {e}");
            if *errors >= MAX_TICK_ERRORS {
                Err(e)
            } else {
                Ok(())
            }
        }
    }
}

/// Ticks until every host is healthy with no remediation active, for at most [`SETTLE`];
/// returns whether it settled.
fn settle(lab: &mut Lab, rec: &mut Recorder, errors: &mut u32) -> Result<bool> {
    let started = Instant::now();
    while started.elapsed() < SETTLE {
        step(lab, rec, errors)?;
        let all = (0..lab.hosts().len()).all(|i| lab.host_healthy(i));
        if all && lab.active_remediations().is_empty() {
            // A few more samples with everything healthy, for the record.
            for _ in 0..20 {
                step(lab, rec, errors)?;
                std::thread::sleep(TICK);
            }
            return Ok(true);
        }
        std::thread::sleep(TICK);
    }
    Ok(false)
}
