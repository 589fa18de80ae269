//! The Redfish client against the real sushy-tools emulator (HTTP, HTTPS with a CA, HTTPS with
//! a pinned self-signed CA:TRUE certificate, the stock random power delay) and real faults.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] fns

use std::time::{Duration, Instant};

use metalguard_api::bmc::CheckFailure;
use metalguard_bmc::redfish::{RedfishClient, RedfishOptions};
use metalguard_bmc::tls::parse_fingerprint;
use metalguard_bmc::{
    BmcAddress, BmcError, Credentials, FenceAction, FenceOptions, FenceStatus, PowerControl,
    PowerState, TlsTrust, fence,
};
use metalguard_e2e::blackhole::BlackHole;
use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions as EmuOptions, Tls};

fn url(bmc: &RedfishBmc, system: Option<usize>) -> BmcAddress {
    let scheme = if bmc.base_url().starts_with("https") {
        "redfish+https"
    } else {
        "redfish+http"
    };
    let path = system.map(|i| bmc.system_path(i)).unwrap_or_default();
    format!("{scheme}://127.0.0.1:{}{path}", bmc.port())
        .parse()
        .unwrap()
}

fn client(bmc: &RedfishBmc, trust: &TlsTrust, system: Option<usize>) -> RedfishClient {
    RedfishClient::new(
        &url(bmc, system),
        Credentials::load(bmc.credentials_dir()).unwrap(),
        trust,
        RedfishOptions::default(),
    )
    .unwrap()
}

async fn off_reboot_on(bmc: &RedfishBmc, trust: &TlsTrust) {
    let mut c = client(bmc, trust, None);
    assert_eq!(c.power_state().await.unwrap(), PowerState::On);
    let outcome = fence(&mut c, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
    let outcome = fence(&mut c, FenceAction::Reboot, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::Rebooted),
        "{outcome:?}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "On");
    let outcome = fence(&mut c, FenceAction::Off, &FenceOptions::default()).await;
    assert!(outcome.status.is_fenced());
    let outcome = fence(&mut c, FenceAction::On, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOn),
        "{outcome:?}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "On");
    c.close().await.unwrap();
    let text = format!("{:?} {}", outcome, outcome.timeline);
    assert!(!text.contains(bmc.password()));
}

#[tokio::test]
async fn status_off_reboot_on_over_http() {
    let bmc = RedfishBmc::start(EmuOptions::default()).unwrap();
    off_reboot_on(&bmc, &TlsTrust::SystemRoots).await;
}

#[tokio::test]
async fn https_with_a_ca_bundle_and_refused_without_it() {
    let bmc = RedfishBmc::start(EmuOptions {
        tls: Tls::CaSigned,
        ..EmuOptions::default()
    })
    .unwrap();
    let ca = bmc.ca_pem_path().unwrap().to_owned();
    off_reboot_on(&bmc, &TlsTrust::CaBundle(ca)).await;
    // The system roots do not know the test CA: refused, and not retried as transient.
    let error = client(&bmc, &TlsTrust::SystemRoots, None)
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(error, BmcError::Tls { .. }), "{error:?}");
    assert_eq!(error.check_failure(), CheckFailure::Tls);
}

#[tokio::test]
async fn https_with_a_pinned_self_signed_ca_true_certificate() {
    let bmc = RedfishBmc::start(EmuOptions {
        tls: Tls::SelfSignedCa,
        ..EmuOptions::default()
    })
    .unwrap();
    let pin = parse_fingerprint(&bmc.fingerprint_sha256().unwrap()).unwrap();
    off_reboot_on(&bmc, &TlsTrust::Fingerprint(pin)).await;
    // The same certificate as a CA bundle is refused by webpki (CaUsedAsEndEntity)...
    let ca = bmc.ca_pem_path().unwrap().to_owned();
    let error = client(&bmc, &TlsTrust::CaBundle(ca), None)
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(error, BmcError::Tls { .. }), "{error:?}");
    // ...and a wrong pin is refused.
    let mut wrong = pin;
    wrong[0] ^= 1;
    let error = client(&bmc, &TlsTrust::Fingerprint(wrong), None)
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(error, BmcError::Tls { .. }), "{error:?}");
    // Insecure works and is counted.
    let before = metalguard_bmc::tls::insecure_handshakes();
    let mut c = client(&bmc, &TlsTrust::Insecure, None);
    assert_eq!(c.power_state().await.unwrap(), PowerState::On);
    assert!(metalguard_bmc::tls::insecure_handshakes() > before);
}

#[tokio::test]
async fn stock_random_power_delay_is_waited_for() {
    let bmc = RedfishBmc::start(EmuOptions {
        instant_power: false,
        // The stock delay is int(now) + randint(1, 11): unseeded it can be a few milliseconds,
        // which would make "the loop saw it still on" a coin toss. This seed draws 1-2 s.
        random_seed: Some(metalguard_e2e::redfish::SEED_FIRST_DELAY_1_TO_2_S),
        ..EmuOptions::default()
    })
    .unwrap();
    let mut c = client(&bmc, &TlsTrust::SystemRoots, None);
    let started = Instant::now();
    let outcome = fence(&mut c, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
    let text = outcome.timeline.to_string();
    // The emulator applies the change after 1-11 s: the loop must have seen it still on.
    assert!(started.elapsed() >= Duration::from_millis(900), "{text}");
    assert!(text.contains("not verified yet"), "{text}");
}

#[tokio::test]
async fn several_systems_need_a_name() {
    let bmc = RedfishBmc::start(EmuOptions {
        systems: 2,
        ..EmuOptions::default()
    })
    .unwrap();
    let error = client(&bmc, &TlsTrust::SystemRoots, None)
        .power_state()
        .await
        .unwrap_err();
    let BmcError::AmbiguousSystem { systems, .. } = &error else {
        panic!("{error:?}");
    };
    for id in bmc.system_ids() {
        assert!(systems.contains(id.as_str()), "{systems}");
    }
    let mut c = client(&bmc, &TlsTrust::SystemRoots, Some(1));
    let outcome = fence(&mut c, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    assert_eq!(bmc.power_state(1).unwrap(), "Off");
    assert_eq!(bmc.power_state(0).unwrap(), "On");
    // PowerCycle is refused by sushy (501): a precise error, no panic.
    let error = c.power_cycle().await.unwrap_err();
    assert!(
        matches!(
            error,
            BmcError::HttpStatus { status: 501, .. } | BmcError::Unsupported { .. }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn wrong_password_is_refused_without_leaking_it() {
    let bmc = RedfishBmc::start(EmuOptions::default()).unwrap();
    let wrong = "wrong-Pa55-xyzzy";
    let mut c = RedfishClient::new(
        &url(&bmc, None),
        Credentials::new(bmc.username(), wrong),
        &TlsTrust::SystemRoots,
        RedfishOptions::default(),
    )
    .unwrap();
    let outcome = fence(&mut c, FenceAction::Off, &FenceOptions::default()).await;
    let FenceStatus::Failed(error) = &outcome.status else {
        panic!("{outcome:?}");
    };
    assert!(
        matches!(error, BmcError::Authentication { .. }),
        "{error:?}"
    );
    assert_eq!(error.check_failure(), CheckFailure::CredentialsRefused);
    let text = format!("{outcome:?} {} {error}", outcome.timeline);
    assert!(!text.contains(wrong) && !text.contains(bmc.password()));
    assert_eq!(bmc.power_state(0).unwrap(), "On");
}

#[tokio::test]
async fn not_listening_and_black_hole_fail_fast_and_bounded() {
    let creds = Credentials::new("admin", "x");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let address: BmcAddress = format!("redfish+http://127.0.0.1:{port}").parse().unwrap();
    let mut c = RedfishClient::new(
        &address,
        creds.clone(),
        &TlsTrust::SystemRoots,
        RedfishOptions::default(),
    )
    .unwrap();
    let started = Instant::now();
    let error = c.power_state().await.unwrap_err();
    assert!(matches!(error, BmcError::Connect { .. }), "{error:?}");
    assert_eq!(error.check_failure(), CheckFailure::Unreachable);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let hole = BlackHole::start().unwrap();
    let address: BmcAddress = format!("redfish+https://{}", hole.tcp_addr())
        .parse()
        .unwrap();
    let options = RedfishOptions {
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(2),
        ..RedfishOptions::default()
    };
    let mut c = RedfishClient::new(&address, creds, &TlsTrust::Insecure, options).unwrap();
    let started = Instant::now();
    let outcome = fence(
        &mut c,
        FenceAction::Off,
        &FenceOptions {
            deadline: Duration::from_secs(3),
            ..FenceOptions::default()
        },
    )
    .await;
    let elapsed = started.elapsed();
    let FenceStatus::Failed(error) = &outcome.status else {
        panic!("{outcome:?}");
    };
    assert!(
        matches!(error, BmcError::Timeout { .. } | BmcError::Deadline { .. }),
        "{error:?}"
    );
    assert!(elapsed < Duration::from_millis(3500), "{elapsed:?}");
}
