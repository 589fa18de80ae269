//! The credential-free reachability check against the real emulators: sushy-tools over HTTPS
//! (a CA-signed certificate, with the right and a wrong trust, and with basic auth required)
//! and OpenIPMI's `ipmi_sim`.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] fns

use std::time::Duration;

use metalguard_bmc::reach::{Answer, check_reachable};
use metalguard_bmc::{BmcAddress, BmcError, CallTimeouts, TlsTrust};
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim};
use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions, Tls};

const TIMEOUTS: CallTimeouts = CallTimeouts {
    connect: Duration::from_secs(2),
    request: Duration::from_secs(3),
};

fn redfish_address(bmc: &RedfishBmc) -> BmcAddress {
    format!("redfish+https://127.0.0.1:{}", bmc.port())
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_redfish_bmc_is_reachable_with_its_trust_and_not_with_a_wrong_one() {
    let bmc = RedfishBmc::start(RedfishOptions {
        tls: Tls::CaSigned,
        ..RedfishOptions::default()
    })
    .unwrap();
    let ca = TlsTrust::CaBundle(bmc.ca_pem_path().unwrap().to_owned());
    let answer = check_reachable(&redfish_address(&bmc), &ca, TIMEOUTS)
        .await
        .unwrap();
    // The emulator requires basic auth: the service root answers either way, and an answer
    // without credentials is all this check asks for.
    assert!(
        matches!(answer, Answer::Redfish { status: 200 | 401 }),
        "{answer:?}"
    );
    let error = check_reachable(&redfish_address(&bmc), &TlsTrust::SystemRoots, TIMEOUTS)
        .await
        .unwrap_err();
    assert!(matches!(error, BmcError::Tls { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("127.0.0.1") && text.contains("certificate"),
        "{text}"
    );
}

#[tokio::test]
async fn an_ipmi_sim_answers_without_credentials() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let address: BmcAddress = format!("ipmi://127.0.0.1:{}", sim.port()).parse().unwrap();
    let answer = check_reachable(&address, &TlsTrust::SystemRoots, TIMEOUTS)
        .await
        .unwrap();
    assert_eq!(answer, Answer::Ipmi);
}
