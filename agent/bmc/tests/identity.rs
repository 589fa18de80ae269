//! Reading which machine a BMC manages, against the real emulators, through `Bmc` as a
//! credentialed check will: sushy-tools (the System's `UUID`; `SerialNumber` added by the
//! test launcher, which sushy-tools lacks), ipmi_sim and pyghmi (Get System GUID). Every test
//! also checks that no power changed.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::Path;
use std::time::Duration;

use metalguard_bmc::{
    Bmc, BmcAddress, BmcError, CallTimeouts, Credentials, PowerControl, PowerState, ReadIdentity,
    SystemIdentity, TlsTrust,
};
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege as Account, PyghmiBmc};
use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions, Tls};

const TIMEOUTS: CallTimeouts = CallTimeouts {
    connect: Duration::from_millis(500),
    request: Duration::from_secs(3),
};

/// Reading an IPMI GUID in the wrong byte order would give another UUID: this one's SMBIOS
/// bytes differ from its RFC 4122 bytes.
const UUID: &str = "00112233-4455-6677-8899-aabbccddeeff";

fn bmc(url: &str, credentials: Credentials, trust: &TlsTrust) -> Bmc {
    let address: BmcAddress = url.parse().unwrap();
    Bmc::new(&address, credentials, trust, TIMEOUTS).unwrap()
}

fn redfish_url(emulator: &RedfishBmc, system: Option<usize>) -> String {
    let scheme = if emulator.base_url().starts_with("https") {
        "redfish+https"
    } else {
        "redfish+http"
    };
    let path = system.map(|i| emulator.system_path(i)).unwrap_or_default();
    format!("{scheme}://127.0.0.1:{}{path}", emulator.port())
}

async fn identity_of(b: &mut Bmc) -> Result<SystemIdentity, BmcError> {
    let identity = b.identity().await;
    b.close().await.unwrap();
    identity
}

fn creds(dir: &Path) -> Credentials {
    Credentials::load(dir).unwrap()
}

#[tokio::test]
async fn redfish_identity_is_the_named_systems_uuid_and_serial_number_over_https() {
    let emulator = RedfishBmc::start(RedfishOptions {
        tls: Tls::CaSigned,
        systems: 2,
        ..RedfishOptions::default()
    })
    .unwrap();
    let trust = TlsTrust::CaBundle(emulator.ca_pem_path().unwrap().to_owned());
    for i in 0..2 {
        let mut b = bmc(
            &redfish_url(&emulator, Some(i)),
            creds(emulator.credentials_dir()),
            &trust,
        );
        let identity = identity_of(&mut b).await.unwrap();
        assert_eq!(
            identity.uuid.unwrap().to_string(),
            emulator.system_ids()[i],
            "system {i}"
        );
        assert_eq!(
            identity.serial_number.as_deref(),
            emulator.serial_number(i),
            "system {i}"
        );
    }
    // Two systems and none named: the same refusal as for a power operation.
    let mut b = bmc(
        &redfish_url(&emulator, None),
        creds(emulator.credentials_dir()),
        &trust,
    );
    let error = identity_of(&mut b).await.unwrap_err();
    assert!(
        matches!(error, BmcError::AmbiguousSystem { .. }),
        "{error:?}"
    );
    assert!(emulator.power_log().unwrap().is_empty());
    assert_eq!(emulator.power_state(0).unwrap(), "On");
}

#[tokio::test]
async fn redfish_without_a_serial_number_reports_it_absent_and_power_still_reads() {
    let emulator = RedfishBmc::start(RedfishOptions {
        serial_numbers: false,
        initially_on: false,
        ..RedfishOptions::default()
    })
    .unwrap();
    let mut b = bmc(
        &redfish_url(&emulator, None),
        creds(emulator.credentials_dir()),
        &TlsTrust::SystemRoots,
    );
    let identity = b.identity().await.unwrap();
    assert_eq!(identity.uuid.unwrap().to_string(), emulator.system_ids()[0]);
    assert_eq!(identity.serial_number, None);
    assert_eq!(
        identity.serial_number_absent.as_deref(),
        Some("the system reports no SerialNumber")
    );
    assert_eq!(b.power_state().await.unwrap(), PowerState::Off);
    b.close().await.unwrap();
    assert!(emulator.power_log().unwrap().is_empty());
}

#[tokio::test]
async fn redfish_identity_failures_are_classified() {
    let emulator = RedfishBmc::start(RedfishOptions {
        tls: Tls::CaSigned,
        ..RedfishOptions::default()
    })
    .unwrap();
    let url = redfish_url(&emulator, None);
    let ca = TlsTrust::CaBundle(emulator.ca_pem_path().unwrap().to_owned());
    let wrong = Credentials::new(emulator.username(), "wrong-Pa55-xyzzy");
    let error = identity_of(&mut bmc(&url, wrong, &ca)).await.unwrap_err();
    assert!(
        matches!(error, BmcError::Authentication { .. }),
        "{error:?}"
    );
    let right = creds(emulator.credentials_dir());
    let error = identity_of(&mut bmc(&url, right, &TlsTrust::SystemRoots))
        .await
        .unwrap_err();
    assert!(matches!(error, BmcError::Tls { .. }), "{error:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let error = identity_of(&mut bmc(
        &format!("redfish+http://127.0.0.1:{port}"),
        Credentials::new("admin", "x"),
        &TlsTrust::SystemRoots,
    ))
    .await
    .unwrap_err();
    assert!(matches!(error, BmcError::Connect { .. }), "{error:?}");
    assert!(emulator.power_log().unwrap().is_empty());
}

#[tokio::test]
async fn ipmi_sim_identity_is_its_system_guid_read_in_smbios_order() {
    let sim = IpmiSim::start(IpmiOptions {
        system_uuid: Some(UUID.to_owned()),
        ..IpmiOptions::default()
    })
    .unwrap();
    let mut b = bmc(
        &sim.url(),
        creds(&sim.credentials_dir(Account::Admin)),
        &TlsTrust::SystemRoots,
    );
    let identity = b.identity().await.unwrap();
    assert_eq!(identity.uuid.unwrap().to_string(), UUID);
    assert_eq!(
        identity.serial_number_absent.as_deref(),
        Some("ipmi has no standard command for the system serial number")
    );
    // The session serves the power read that follows.
    assert_eq!(b.power_state().await.unwrap(), PowerState::On);
    b.close().await.unwrap();
    let wrong = Credentials::new(sim.username(Account::Admin), "not-the-password");
    let error = identity_of(&mut bmc(&sim.url(), wrong, &TlsTrust::SystemRoots))
        .await
        .unwrap_err();
    assert!(
        matches!(error, BmcError::Authentication { .. }),
        "{error:?}"
    );
    assert!(sim.power_log().unwrap().is_empty());
    assert!(sim.power_on().unwrap());
}

#[tokio::test]
async fn pyghmi_identity_and_a_bmc_that_refuses_get_system_guid() {
    // pyghmi encodes the GUID with Python's uuid.bytes_le: an encoder independent of ours.
    let with = PyghmiBmc::start(IpmiOptions {
        system_uuid: Some(UUID.to_owned()),
        ..IpmiOptions::default()
    })
    .unwrap();
    let mut b = bmc(
        &with.url(),
        creds(&with.credentials_dir()),
        &TlsTrust::SystemRoots,
    );
    assert_eq!(
        identity_of(&mut b).await.unwrap().uuid.unwrap().to_string(),
        UUID
    );
    let without = PyghmiBmc::start(IpmiOptions {
        system_uuid: None,
        ..IpmiOptions::default()
    })
    .unwrap();
    let mut b = bmc(
        &without.url(),
        creds(&without.credentials_dir()),
        &TlsTrust::SystemRoots,
    );
    let identity = b.identity().await.unwrap();
    assert_eq!(identity.uuid, None);
    assert_eq!(
        identity.uuid_absent.as_deref(),
        Some("the bmc answered get system guid with completion code 0xc1 (invalid command)")
    );
    // A completion code is an answer, not a failure: the same client goes on to read power.
    assert_eq!(b.power_state().await.unwrap(), PowerState::On);
    b.close().await.unwrap();
    assert!(with.power_log().unwrap().is_empty());
    assert!(without.power_log().unwrap().is_empty());
}
