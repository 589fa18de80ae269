//! The static-pod launcher against real etcd as kubeadm runs it: a TLS cluster with client
//! certificates required, each member's files in kubeadm's layout (`pki/<member>/etcd/`), and
//! a test "kubelet" (`metalguard_e2e::kubelet`) that runs etcd from the manifest in the
//! joining host's manifest directory with exactly the manifest's flags, refusing a manifest a
//! real kubelet could not run (no hostNetwork, a certificate or data dir outside its hostPath
//! mounts, …). The agent reaches the cluster with the joining host's own
//! `healthcheck-client` certificate.
//!
//! A template is an existing member's manifest as kubeadm writes it (written out by hand by
//! the harness, not by metalguard's renderer), copied to the joining host.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use metalguard_e2e::etcd::{EtcdCluster, HostSlot};
use metalguard_e2e::kubelet::{KubeadmMember, KubeletEvent, KubeletThread, kubeadm_manifest};
use metalguard_etcd::join::launcher::Launcher;
use metalguard_etcd::join::launcher::static_pod::manifest::{ExistingManifest, PodSettings};
use metalguard_etcd::join::launcher::static_pod::{MOVED_ASIDE_DIR, StaticPodLauncher};
use metalguard_etcd::join::state::JoinState;
use metalguard_etcd::join::{JoinConfig, JoinFlow, StepOutcome};
use metalguard_etcd::ops::{self, DEFAULT_PROMOTE_RETRY, Promoted};
use metalguard_etcd::{ClientSettings, TlsFiles};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The joining host: its kubelet's manifest directory, its template, its join.
struct Host {
    manifests: PathBuf,
    template: PathBuf,
    config: JoinConfig,
    slot: HostSlot,
}

impl Host {
    fn manifest(&self) -> PathBuf {
        self.manifests.join("etcd.yaml")
    }

    fn moved_aside(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.manifests.parent().unwrap().join(MOVED_ASIDE_DIR))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    }

    fn launcher(&self, overwrite_foreign: bool) -> Launcher {
        Launcher::StaticPod(StaticPodLauncher::new(
            self.manifest(),
            Some(self.template.clone()),
            PodSettings {
                image: None,
                pki_dir: self.slot.pki.as_ref().unwrap().dir.clone(),
            },
            overwrite_foreign,
            Duration::from_secs(60),
        ))
    }

    fn flow(&self) -> JoinFlow {
        JoinFlow::load(self.config.clone(), self.launcher(false)).unwrap()
    }

    fn kubelet(&self) -> KubeletThread {
        KubeletThread::watch(&self.manifests, self.manifests.parent().unwrap())
    }

    /// The output of the etcd the kubelet runs from `etcd.yaml`.
    fn kubelet_log(&self) -> PathBuf {
        self.manifests.parent().unwrap().join("etcd.yaml.log")
    }
}

/// A three-member TLS cluster and a fourth host whose agent joins it with the static-pod
/// launcher, a copy of member 0's kubeadm manifest as its template.
fn cluster_and_host() -> (EtcdCluster, Host) {
    let mut cluster = EtcdCluster::start(3).unwrap();
    let slot = cluster.reserve_host().unwrap();
    let root = cluster.dir().join(format!("{}-kubernetes", slot.name));
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let m0 = cluster.member(0);
    let template = root.join("etcd-template.yaml");
    std::fs::write(
        &template,
        kubeadm_manifest(&KubeadmMember {
            etcd: metalguard_e2e::tools::etcd_version().unwrap(),
            name: m0.name(),
            peer_url: m0.peer_url(),
            client_url: m0.client_url(),
            metrics_url: m0.metrics_url(),
            data_dir: m0.data_dir(),
            pki_dir: &m0.pki().unwrap().dir,
            initial_cluster: "",
            state: "new",
        }),
    )
    .unwrap();
    let pki = slot.pki.as_ref().unwrap();
    let mut client = settings(cluster.endpoints());
    client.tls = Some(TlsFiles {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.healthcheck_client.cert.clone()),
        key: Some(pki.healthcheck_client.key.clone()),
    });
    let mut config = join_config(&cluster, &slot, None);
    config.client = client;
    // Every member of the harness runs on 127.0.0.1: the template's metrics URL is member 0's
    // own port here (on real hosts it is each host's 127.0.0.1:2381).
    config.extra_env = vec![(
        "ETCD_LISTEN_METRICS_URLS".to_owned(),
        slot.metrics_url.clone(),
    )];
    let host = Host {
        manifests,
        template,
        config,
        slot,
    };
    (cluster, host)
}

/// Steps the flow (a new one from the state file when `fresh` says so: a killed agent) until
/// `done` holds for its state, within a deadline.
async fn step_until(
    host: &Host,
    flow: &mut JoinFlow,
    done: impl Fn(&JoinState) -> bool,
) -> Vec<&'static str> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut steps = vec![flow.state().name()];
    while !done(flow.state()) {
        assert!(Instant::now() < deadline, "no progress past {steps:?}");
        match flow.step().await {
            Ok(StepOutcome::Advanced(state)) => steps.push(state.name()),
            Ok(StepOutcome::Waiting(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(StepOutcome::Done) => break,
            Err(e) if metalguard_etcd::join::is_retryable(&e) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!(
                "step {} failed: {e:?} (host {})",
                flow.state().name(),
                host.slot.name
            ),
        }
    }
    steps
}

fn members_with_peer(
    cluster: &EtcdCluster,
    peer_url: &str,
) -> Vec<metalguard_e2e::etcd::MemberInfo> {
    cluster
        .member_list()
        .unwrap()
        .into_iter()
        .filter(|m| m.peer_urls.iter().any(|u| u == peer_url))
        .collect()
}

fn started(events: &[KubeletEvent]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, KubeletEvent::Started { .. }))
        .count()
}

/// Waits (bounded) for the kubelet to see the removed member's manifest gone and checks that
/// etcd did not run after its data dir was wiped: either the kubelet stopped a running etcd
/// whose data dir still existed, or etcd (a removed member) had shut itself down first, as its
/// log says. etcd 3.6 does so at once, before the agent moves the manifest aside; the agent
/// then only waits for the client port to close, and the kubelet may notice the manifest gone
/// after the wipe.
async fn assert_etcd_ended_before_the_wipe(host: &Host, kubelet: &KubeletThread) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let stopped = loop {
        let stopped: Vec<_> = kubelet
            .events()
            .into_iter()
            .filter(|e| matches!(e, KubeletEvent::Stopped { .. }))
            .collect();
        if !stopped.is_empty() || Instant::now() > deadline {
            break stopped;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let log = std::fs::read_to_string(host.kubelet_log()).unwrap();
    let shut_itself_down = log.contains("the member has been permanently removed from the cluster");
    let ok = match &stopped[..] {
        [
            KubeletEvent::Stopped {
                was_running: true,
                data_dir_existed,
                ..
            },
        ] => *data_dir_existed,
        [
            KubeletEvent::Stopped {
                was_running: false, ..
            },
        ] => shut_itself_down,
        _ => false,
    };
    assert!(
        ok,
        "etcd stopped before the wipe: {stopped:?} (etcd logged its removal: {shut_itself_down})"
    );
}

fn restarted_or_refused(events: &[KubeletEvent]) -> Vec<&KubeletEvent> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                KubeletEvent::Restarted { .. }
                    | KubeletEvent::Refused { .. }
                    | KubeletEvent::Revived { .. }
            )
        })
        .collect()
}

fn client(host: &Host) -> ClientSettings {
    host.config.client.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_is_written_in_kubeadms_layout_only_after_the_add_and_the_kubelet_runs_etcd_from_it()
 {
    let (mut cluster, host) = cluster_and_host();
    let kubelet = host.kubelet();

    // A voter is down: the gate refuses the add, and no manifest is written.
    cluster.kill(2);
    let mut flow = host.flow();
    let err = flow.step().await.unwrap_err();
    assert!(format!("{err:?}").contains("DeadVoter"), "{err:?}");
    assert!(
        !host.manifest().exists(),
        "no manifest before the learner is added"
    );
    assert_eq!(cluster.member_list().unwrap().len(), 3);
    cluster.restart(2).unwrap();
    cluster.wait_healthy(Duration::from_secs(30)).unwrap();

    // The add comes first; the manifest only with the next step.
    let mut flow = host.flow();
    let steps = step_until(&host, &mut flow, |s| matches!(s, JoinState::Added { .. })).await;
    assert_eq!(steps, ["discover", "added"]);
    assert!(
        !host.manifest().exists(),
        "the manifest waits for the recorded add"
    );
    let mine = members_with_peer(&cluster, &host.slot.peer_url);
    assert!(
        mine.len() == 1 && mine[0].is_learner && mine[0].name.is_empty(),
        "{mine:?}"
    );
    let member_id = mine[0].id;
    assert_eq!(flow.found_learner(), None, "this agent added it");

    let steps = step_until(&host, &mut flow, |s| {
        matches!(s, JoinState::Promotable { .. })
    })
    .await;
    assert_eq!(steps, ["added", "started", "promotable"]);

    // kubeadm's layout, the template's image and further flags, the member's own flags.
    let text = std::fs::read_to_string(host.manifest()).unwrap();
    let mode = std::fs::metadata(host.manifest())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let m = ExistingManifest::parse(&text).unwrap();
    assert!(m.written_by_agent);
    let etcd = metalguard_e2e::tools::etcd_version().unwrap();
    let image = metalguard_e2e::kubelet::kubeadm_image(etcd);
    assert_eq!(m.image(), Some(image.as_str()));
    // kubeadm's corruption check, kept from the template under the name this etcd takes.
    let corrupt_check = if etcd.at_least(3, 6) {
        ("feature-gates", "InitialCorruptCheck=true".to_owned())
    } else {
        ("experimental-initial-corrupt-check", "true".to_owned())
    };
    let pki = host.slot.pki.as_ref().unwrap();
    let slot = &host.slot;
    for (flag, want) in [
        ("name", slot.name.clone()),
        ("initial-cluster-state", "existing".to_owned()),
        ("initial-advertise-peer-urls", slot.peer_url.clone()),
        ("advertise-client-urls", slot.client_url.clone()),
        ("data-dir", slot.data_dir.display().to_string()),
        ("cert-file", pki.server.cert.display().to_string()),
        ("key-file", pki.server.key.display().to_string()),
        ("trusted-ca-file", pki.ca.display().to_string()),
        ("peer-cert-file", pki.peer.cert.display().to_string()),
        ("peer-trusted-ca-file", pki.ca.display().to_string()),
        ("client-cert-auth", "true".to_owned()),
        ("peer-client-cert-auth", "true".to_owned()),
        ("listen-metrics-urls", slot.metrics_url.clone()),
        corrupt_check,
        ("logger", "zap".to_owned()),
    ] {
        assert_eq!(m.flag(flag), Some(want.as_str()), "--{flag} in\n{text}");
    }
    let initial = m.flag("initial-cluster").unwrap();
    for i in 0..3 {
        let member = cluster.member(i);
        assert!(
            initial.contains(&format!("{}={}", member.name(), member.peer_url())),
            "{initial}"
        );
    }
    assert!(
        initial.contains(&format!("{}={}", slot.name, slot.peer_url)),
        "{initial}"
    );
    assert!(text.contains("hostNetwork: true"), "{text}");

    // The kubelet runs it: a learner under its name, serving TLS to the host's certificate.
    let mine = members_with_peer(&cluster, &slot.peer_url);
    assert!(
        mine.len() == 1 && mine[0].is_learner && mine[0].name == slot.name,
        "{mine:?}"
    );
    // A learner answers only Status and serializable reads (no member list in etcd 3.4), so
    // its own endpoint is asked for its status alone.
    let probe = metalguard_etcd::observe::endpoint_status(&client(&host), &slot.client_url).await;
    let status = probe.status.as_ref().unwrap_or_else(|| panic!("{probe:?}"));
    assert_eq!(status.member_id, member_id, "{probe:?}");
    assert!(status.is_learner, "{probe:?}");

    // The controller promotes; the flow sees a voter.
    let promoted = ops::promote(&client(&host), member_id, DEFAULT_PROMOTE_RETRY)
        .await
        .unwrap();
    assert!(
        matches!(promoted, Promoted::Promoted { .. }),
        "{promoted:?}"
    );
    let steps = step_until(&host, &mut flow, |s| matches!(s, JoinState::Member { .. })).await;
    assert_eq!(steps, ["promotable", "member"]);
    let mine = members_with_peer(&cluster, &slot.peer_url);
    assert!(mine.len() == 1 && !mine[0].is_learner, "{mine:?}");
    assert_eq!(cluster.member_list().unwrap().len(), 4);
    let events = kubelet.finish();
    assert_eq!(started(&events), 1, "{events:?}");
    assert!(restarted_or_refused(&events).is_empty(), "{events:?}");
}

/// The agent dies after every step (nothing of it survives but the state file and the
/// manifest); a new one resumes. One member, one etcd, started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_after_each_step_ends_with_exactly_one_member_and_etcd_started_once() {
    let (cluster, mut host) = cluster_and_host();
    host.config.bootstrap_desired_voters = Some(5);
    let kubelet = host.kubelet();

    // Killed between the add and recording it: the member exists, the state says discover.
    let added = ops::add_learner(&host.config.client, &host.slot.peer_url)
        .await
        .unwrap();
    assert!(!added.reused);

    let mut steps = Vec::new();
    let mut found = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        assert!(Instant::now() < deadline, "no member after {steps:?}");
        // A new agent for every step: the previous one is gone without a word.
        let mut flow = host.flow();
        let outcome = match flow.step().await {
            Ok(outcome) => outcome,
            Err(e) if metalguard_etcd::join::is_retryable(&e) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => panic!("{e:?} after {steps:?}"),
        };
        steps.push(flow.state().name());
        found.extend(flow.found_learner());
        drop(flow);
        match outcome {
            StepOutcome::Done => break,
            StepOutcome::Waiting(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            StepOutcome::Advanced(_) => {}
        }
    }
    for want in ["added", "started", "promotable", "member"] {
        assert!(
            steps.contains(&want),
            "step {want} never reached: {steps:?}"
        );
    }
    assert_eq!(
        found,
        [added.member_id],
        "the unrecorded add was found, not repeated"
    );
    let mine = members_with_peer(&cluster, &host.slot.peer_url);
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(mine[0].id, added.member_id);
    assert!(!mine[0].is_learner);
    assert_eq!(cluster.member_list().unwrap().len(), 4);
    assert_eq!(kubelet.pids().len(), 1);
    let events = kubelet.finish();
    assert_eq!(
        started(&events),
        1,
        "every resumed agent left the manifest alone: {events:?}"
    );
    assert!(restarted_or_refused(&events).is_empty(), "{events:?}");
}

/// A removed member: its manifest is moved aside, the kubelet stops etcd while the data dir
/// is still there, and only then is the data dir wiped; the host joins again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_members_manifest_is_moved_aside_before_its_data_dir_is_wiped_and_it_rejoins() {
    let (cluster, host) = cluster_and_host();
    let kubelet = host.kubelet();
    let mut flow = host.flow();
    step_until(&host, &mut flow, |s| {
        matches!(s, JoinState::Promotable { .. })
    })
    .await;
    let first = flow.state().member_id().unwrap();
    let before = std::fs::read_to_string(host.manifest()).unwrap();

    ops::remove(&client(&host), first).await.unwrap();
    let mut flow = host.flow();
    assert_eq!(
        flow.step().await.unwrap(),
        StepOutcome::Advanced(JoinState::Discover)
    );
    assert!(!host.manifest().exists());
    let aside = host.moved_aside();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), before);
    assert!(!host.slot.data_dir.exists(), "wiped");
    assert_etcd_ended_before_the_wipe(&host, &kubelet).await;

    // The same host joins again as a new learner.
    step_until(&host, &mut flow, |s| {
        matches!(s, JoinState::Promotable { .. })
    })
    .await;
    let second = flow.state().member_id().unwrap();
    assert_ne!(first, second);
    assert_eq!(members_with_peer(&cluster, &host.slot.peer_url).len(), 1);
    let events = kubelet.finish();
    assert_eq!(started(&events), 2, "{events:?}");
}

/// A manifest for another member that the agent did not write is found before any learner is
/// added, and left alone; with overwrite_foreign_manifest it is moved aside and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_manifest_is_never_overwritten_and_stops_the_join_before_the_add() {
    let (mut cluster, host) = cluster_and_host();
    // What an earlier life of this host left: a one-member etcd of its own (another peer
    // URL, its own data dir), as kubeadm init wrote it.
    let old_slot = cluster.reserve_host().unwrap();
    let old = kubeadm_manifest(&KubeadmMember {
        etcd: metalguard_e2e::tools::etcd_version().unwrap(),
        name: "old-self",
        peer_url: &old_slot.peer_url,
        client_url: &old_slot.client_url,
        metrics_url: &old_slot.metrics_url,
        data_dir: &old_slot.data_dir,
        pki_dir: &old_slot.pki.as_ref().unwrap().dir,
        initial_cluster: &format!("old-self={}", old_slot.peer_url),
        state: "new",
    });
    std::fs::write(host.manifest(), &old).unwrap();
    let mut flow = host.flow();
    let err = flow.step().await.unwrap_err();
    let text = format!("{err:?}");
    assert!(
        text.contains("ForeignManifest") && text.contains("old-self"),
        "{text}"
    );
    assert_eq!(std::fs::read_to_string(host.manifest()).unwrap(), old);
    assert!(
        members_with_peer(&cluster, &host.slot.peer_url).is_empty(),
        "no learner added that could not be started"
    );

    // The kubelet runs the old one; an explicit setting replaces it (moved aside first).
    let kubelet = host.kubelet();
    let mut flow = JoinFlow::load(host.config.clone(), host.launcher(true)).unwrap();
    step_until(&host, &mut flow, |s| {
        matches!(s, JoinState::Promotable { .. })
    })
    .await;
    let aside = host.moved_aside();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read_to_string(&aside[0]).unwrap(), old);
    let now = std::fs::read_to_string(host.manifest()).unwrap();
    assert!(ExistingManifest::parse(&now).unwrap().written_by_agent);
    let mine = members_with_peer(&cluster, &host.slot.peer_url);
    assert!(mine.len() == 1 && mine[0].is_learner, "{mine:?}");
    // The kubelet sees the old manifest replaced by the agent's: changed in one sync, or gone
    // (moved aside) in one and the agent's new in the next; the old etcd stopped either way.
    let events = kubelet.finish();
    assert!(
        matches!(&events[..], [KubeletEvent::Started { member, .. }, KubeletEvent::Restarted { .. }] if member == "old-self")
            || matches!(&events[..], [
                KubeletEvent::Started { member: old, .. },
                KubeletEvent::Stopped { was_running: true, data_dir_existed: true, .. },
                KubeletEvent::Started { member: new, .. },
            ] if old == "old-self" && *new == host.slot.name),
        "{events:?}"
    );
}

/// `kubeadm join --control-plane` with EtcdLearnerMode: kubeadm adds the learner and writes its
/// own manifest; the kubelet starts it. The agent joins that member (no second add, kubeadm's
/// manifest left as it is), reports it caught up; kubeadm promotes it; metalguard's own
/// promotion then finds a voter (so who promoted is known); a removal moves kubeadm's
/// manifest aside before the wipe. One member for the host throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeadm_style_learner_added_from_outside_is_joined_not_added_again() {
    let (cluster, host) = cluster_and_host();
    let kubelet = host.kubelet();
    let slot = &host.slot;
    // kubeadm: MemberAddAsLearner, then the manifest with --initial-cluster-state=existing.
    let peer = format!("--peer-urls={}", slot.peer_url);
    let mut added = String::new();
    for _ in 0..60 {
        match cluster.etcdctl(&["member", "add", &slot.name, "--learner", &peer]) {
            Ok(out) => {
                added = out;
                break;
            }
            Err(e) if e.to_string().contains("unhealthy cluster") => {
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => panic!("{e}"),
        }
    }
    let initial_cluster = added
        .lines()
        .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER="))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let pki = slot.pki.as_ref().unwrap();
    let kubeadms = kubeadm_manifest(&KubeadmMember {
        etcd: metalguard_e2e::tools::etcd_version().unwrap(),
        name: &slot.name,
        peer_url: &slot.peer_url,
        client_url: &slot.client_url,
        metrics_url: &slot.metrics_url,
        data_dir: &slot.data_dir,
        pki_dir: &pki.dir,
        initial_cluster: &initial_cluster,
        state: "existing",
    });
    std::fs::write(host.manifest(), &kubeadms).unwrap();
    let kubeadm_learner = members_with_peer(&cluster, &slot.peer_url)[0].id;

    // The controller's go-ahead reaches the host's agent.
    let mut flow = host.flow();
    let steps = step_until(&host, &mut flow, |s| {
        matches!(s, JoinState::Promotable { .. })
    })
    .await;
    assert_eq!(steps, ["discover", "added", "started", "promotable"]);
    assert_eq!(flow.state().member_id(), Some(kubeadm_learner));
    assert_eq!(
        flow.found_learner(),
        Some(kubeadm_learner),
        "found, not added"
    );
    assert_eq!(
        std::fs::read_to_string(host.manifest()).unwrap(),
        kubeadms,
        "kubeadm's manifest is left as it is"
    );
    let mine = members_with_peer(&cluster, &slot.peer_url);
    assert!(mine.len() == 1 && mine[0].is_learner, "{mine:?}");

    // kubeadm promotes it (its MemberPromote loop); the flow sees a voter.
    cluster
        .etcdctl(&["member", "promote", &format!("{kubeadm_learner:x}")])
        .unwrap();
    let steps = step_until(&host, &mut flow, |s| matches!(s, JoinState::Member { .. })).await;
    assert_eq!(steps, ["promotable", "member"]);
    // metalguard's promotion, had the controller sent it, finds a voter it did not promote.
    let promoted = ops::promote(&client(&host), kubeadm_learner, DEFAULT_PROMOTE_RETRY)
        .await
        .unwrap();
    assert_eq!(promoted, Promoted::AlreadyVoter);
    let mine = members_with_peer(&cluster, &slot.peer_url);
    assert!(mine.len() == 1 && !mine[0].is_learner, "{mine:?}");
    assert_eq!(cluster.member_list().unwrap().len(), 4);

    // Removed later: kubeadm's manifest runs this member, so it is moved aside, then wiped.
    ops::remove(&client(&host), kubeadm_learner).await.unwrap();
    let mut flow = host.flow();
    assert_eq!(
        flow.step().await.unwrap(),
        StepOutcome::Advanced(JoinState::Discover)
    );
    assert_eq!(
        std::fs::read_to_string(&host.moved_aside()[0]).unwrap(),
        kubeadms
    );
    assert!(!host.slot.data_dir.exists());
    assert_etcd_ended_before_the_wipe(&host, &kubelet).await;
    let events = kubelet.finish();
    assert_eq!(started(&events), 1, "{events:?}");
    assert!(restarted_or_refused(&events).is_empty(), "{events:?}");
}
