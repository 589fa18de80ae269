//! IPMI through the protocol-neutral layer: `Bmc::new` on an `ipmi://` address, the verified
//! `fence` operations against `ipmi_sim`, and the lenient `pyghmi` BMC with delayed and dropped
//! replies (retransmission).

use std::time::{Duration, Instant};

use metalguard_bmc::{
    Bmc, BmcAddress, BmcError, CallTimeouts, Credentials, FenceAction, FenceOptions, FenceStatus,
    PowerControl, PowerState, TlsTrust, fence,
};
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege as Account, PyghmiBmc};

const TIMEOUTS: CallTimeouts = CallTimeouts {
    connect: Duration::from_millis(200),
    request: Duration::from_secs(3),
};

fn bmc(url: &str, creds: &std::path::Path) -> Result<Bmc, Box<dyn std::error::Error>> {
    let address: BmcAddress = url.parse()?;
    let credentials = Credentials::load(creds)?;
    Ok(Bmc::new(
        &address,
        credentials,
        &TlsTrust::SystemRoots,
        TIMEOUTS,
    )?)
}

fn options() -> FenceOptions {
    FenceOptions {
        deadline: Duration::from_secs(20),
        ..FenceOptions::default()
    }
}

#[tokio::test]
async fn fence_off_reboot_on_and_status_against_ipmi_sim() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let mut b = bmc(&sim.url(), &sim.credentials_dir(Account::Admin)).unwrap();
    assert_eq!(b.power_state().await.unwrap(), PowerState::On);

    let out = fence(&mut b, FenceAction::Off, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::PoweredOff),
        "{:?}\n{}",
        out.status,
        out.timeline
    );
    assert!(!sim.power_on().unwrap());
    let text = out.timeline.to_string();
    assert!(text.contains("-> ipmi chassis control"), "{text}");
    assert!(text.contains("ipmi chassis power off"), "{text}");
    assert!(!text.contains(sim.password()), "{text}");

    let out = fence(&mut b, FenceAction::Reboot, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::Rebooted),
        "{:?}\n{}",
        out.status,
        out.timeline
    );
    assert!(sim.power_on().unwrap());

    let out = fence(&mut b, FenceAction::Off, &options()).await;
    assert!(out.status.is_fenced());
    let out = fence(&mut b, FenceAction::On, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::PoweredOn),
        "{:?}",
        out.status
    );
    b.close().await.unwrap();
    b.close().await.unwrap();

    let text = b.timeline_mut().to_string();
    assert!(text.contains("-> ipmi close session"), "{text}");
    let log = sim.power_log().unwrap();
    // off; reboot finds it off already, so only powers on; off; on.
    let kinds: Vec<_> = log
        .iter()
        .map(|e| format!("{} {}", e.kind, e.value))
        .collect();
    assert_eq!(kinds, ["power 0", "power 1", "power 0", "power 1"]);
}

#[tokio::test]
async fn a_wrong_password_fence_fails_fast_with_an_authentication_error() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("creds");
    std::fs::write(&path, "username=admin\npassword=wrong-password\n").unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut b = bmc(&sim.url(), &path).unwrap();
    let started = Instant::now();
    let out = fence(&mut b, FenceAction::Off, &options()).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    let FenceStatus::Failed(err) = &out.status else {
        panic!("{:?}", out.status);
    };
    assert!(matches!(err, BmcError::Authentication { .. }), "{err:?}");
    assert_eq!(
        err.check_failure(),
        metalguard_api::bmc::CheckFailure::CredentialsRefused
    );
    assert!(sim.power_on().unwrap());
    let all = format!("{err} {err:?} {}", out.timeline);
    assert!(
        !all.contains("wrong-password") && !all.contains(sim.password()),
        "{all}"
    );
}

#[tokio::test]
async fn pyghmi_status_off_and_on() {
    let bmc_sim = PyghmiBmc::start(IpmiOptions::default()).unwrap();
    let mut b = bmc(&bmc_sim.url(), &bmc_sim.credentials_dir()).unwrap();
    assert_eq!(b.power_state().await.unwrap(), PowerState::On);
    let out = fence(&mut b, FenceAction::Off, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::PoweredOff),
        "{:?}\n{}",
        out.status,
        out.timeline
    );
    assert!(!bmc_sim.power_on().unwrap());
    let out = fence(&mut b, FenceAction::On, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::PoweredOn),
        "{:?}\n{}",
        out.status,
        out.timeline
    );
    b.close().await.unwrap();
}

#[tokio::test]
async fn pyghmi_dropped_and_delayed_replies_are_retransmitted() {
    let bmc_sim = PyghmiBmc::start(IpmiOptions::default()).unwrap();
    let mut b = bmc(&bmc_sim.url(), &bmc_sim.credentials_dir()).unwrap();
    assert_eq!(b.power_state().await.unwrap(), PowerState::On);
    // Drop the next two replies (the force-off's answer and its first retransmission's),
    // and delay every reply past the first attempt timeout.
    bmc_sim
        .set_behaviour(Duration::from_millis(300), 2)
        .unwrap();
    let out = fence(&mut b, FenceAction::Off, &options()).await;
    assert!(
        matches!(out.status, FenceStatus::PoweredOff),
        "{:?}\n{}",
        out.status,
        out.timeline
    );
    let text = out.timeline.to_string();
    assert!(
        text.contains("attempt 2") && text.contains("attempt 3"),
        "{text}"
    );
    bmc_sim.set_behaviour(Duration::ZERO, 0).unwrap();
    b.close().await.unwrap();
    assert!(!bmc_sim.power_on().unwrap());
}

#[tokio::test]
async fn pyghmi_that_never_answers_commands_times_out_in_bounded_time() {
    let bmc_sim = PyghmiBmc::start(IpmiOptions::default()).unwrap();
    let mut b = bmc(&bmc_sim.url(), &bmc_sim.credentials_dir()).unwrap();
    bmc_sim.set_behaviour(Duration::ZERO, 1000).unwrap();
    let started = Instant::now();
    let err = b.power_state().await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, BmcError::Timeout { .. }), "{err:?}");
    assert!(took < TIMEOUTS.request + Duration::from_secs(1), "{took:?}");
    assert!(err.to_string().contains("get chassis status"), "{err}");
}
