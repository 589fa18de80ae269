//! Benchmark of the learner join on a 3-member cluster holding ~50 MiB: time from the
//! learner's etcd start to promotion, and from "promotable" to promoted.
//!
//! Run with `scripts/bench-etcd.sh` (or `cargo run -p metalguard-etcd --example join_bench --
//! RUNS`). Uses the harness's real etcd (`METALGUARD_ETCD_BIN` or `PATH`).
//! Over plain HTTP (`EtcdCluster::start_plain_http`), as the recorded numbers were measured.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_etcd::ClientSettings;
use metalguard_etcd::join::launcher::{ExecLauncher, Launcher};
use metalguard_etcd::join::state::JoinState;
use metalguard_etcd::join::{DEFAULT_POLL_INTERVAL, JoinConfig, JoinFlow, StepOutcome};
use metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY;
use std::time::{Duration, Instant};

const FILL_MIB: usize = 52;

struct Sample {
    start_to_promoted: Duration,
    promotable_to_promoted: Duration,
    start_to_promotable: Duration,
}

async fn fill(endpoints: &[String]) {
    let value = vec![b'x'; 100 * 1024];
    let mut tasks = Vec::new();
    for t in 0..8 {
        let options = etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(10));
        let mut c = etcd_client::Client::connect(endpoints, Some(options))
            .await
            .unwrap();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..=(FILL_MIB * 10 / 8) {
                c.put(format!("/fill/{t}/{i}"), value.clone(), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn one_run() -> Sample {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    fill(&cluster.endpoints()).await;
    let slot = cluster.reserve_host().unwrap();
    let mut client = ClientSettings::new(cluster.endpoints());
    client.change_timeout = Duration::from_secs(15);
    let config = JoinConfig {
        client,
        name: slot.name.clone(),
        peer_url: slot.peer_url.clone(),
        client_url: slot.client_url.clone(),
        listen_peer_url: None,
        listen_client_url: None,
        data_dir: slot.data_dir.clone(),
        state_file: None,
        extra_env: vec![],
        bootstrap_desired_voters: Some(5),
        poll_interval: DEFAULT_POLL_INTERVAL,
        stall_after: Duration::from_secs(30),
        promote_retry: DEFAULT_PROMOTE_RETRY,
    };
    let pid_file = slot.data_dir.with_file_name("bench.pid");
    let launcher = Launcher::Exec(ExecLauncher::new(
        metalguard_e2e::tools::etcd_bin().unwrap(),
        pid_file,
        Some(slot.data_dir.with_file_name("bench.log")),
    ));
    let mut flow = JoinFlow::load(config, launcher).unwrap();
    let (mut started, mut promotable) = (None, None);
    let promoted = loop {
        let before = Instant::now();
        let outcome = flow.step().await.unwrap();
        match outcome {
            StepOutcome::Advanced(JoinState::Started { .. }) => started = Some(before),
            StepOutcome::Advanced(JoinState::Promotable { .. }) => {
                promotable = Some(Instant::now());
            }
            StepOutcome::Advanced(JoinState::Member { .. }) => break Instant::now(),
            StepOutcome::Waiting(_) => tokio::time::sleep(DEFAULT_POLL_INTERVAL).await,
            StepOutcome::Advanced(_) | StepOutcome::Done => {}
        }
    };
    if let Launcher::Exec(exec) = flow.launcher_mut() {
        exec.stop().await;
    }
    let (started, promotable) = (started.unwrap(), promotable.unwrap());
    Sample {
        start_to_promoted: promoted - started,
        promotable_to_promoted: promoted - promotable,
        start_to_promotable: promotable - started,
    }
}

fn stats(mut values: Vec<Duration>) -> (Duration, Duration, Duration) {
    values.sort();
    (
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
    )
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::args().nth(1).map_or(5, |a| a.parse().unwrap());
    let mut samples = Vec::new();
    for run in 1..=runs {
        let s = one_run().await;
        eprintln!(
            "run {run}: start->promotable {}, promotable->promoted {}, start->promoted {}",
            ms(s.start_to_promotable),
            ms(s.promotable_to_promoted),
            ms(s.start_to_promoted)
        );
        samples.push(s);
    }
    let rows = [
        (
            "learner start → promotable",
            samples
                .iter()
                .map(|s| s.start_to_promotable)
                .collect::<Vec<_>>(),
        ),
        (
            "promotable → promoted",
            samples.iter().map(|s| s.promotable_to_promoted).collect(),
        ),
        (
            "learner start → promoted",
            samples.iter().map(|s| s.start_to_promoted).collect(),
        ),
    ];
    println!("| {FILL_MIB} MiB, {runs} runs | min | median | max |");
    println!("|---|---|---|---|");
    for (name, values) in rows {
        let (min, median, max) = stats(values);
        println!("| {name} | {} | {} | {} |", ms(min), ms(median), ms(max));
    }
}
