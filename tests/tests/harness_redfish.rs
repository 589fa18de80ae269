//! Self-tests of the Redfish harness against the real sushy-tools emulator.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions, Tls};

fn switch_off_and_on(bmc: &RedfishBmc) {
    assert_eq!(bmc.power_state(0).unwrap(), "On");
    assert_eq!(bmc.reset(0, "ForceOff").unwrap(), 204);
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
    assert_eq!(bmc.reset(0, "On").unwrap(), 204);
    assert_eq!(bmc.power_state(0).unwrap(), "On");
}

#[test]
fn http_emulator_switches_power_instantly() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    assert!(bmc.base_url().starts_with("http://127.0.0.1:"));
    switch_off_and_on(&bmc);
}

#[test]
fn https_with_a_test_ca_is_verified_by_curl() {
    let bmc = RedfishBmc::start(RedfishOptions {
        tls: Tls::CaSigned,
        ..RedfishOptions::default()
    })
    .unwrap();
    assert!(bmc.base_url().starts_with("https://"));
    let ca = std::fs::read_to_string(bmc.ca_pem_path().unwrap()).unwrap();
    assert!(ca.contains("BEGIN CERTIFICATE"));
    switch_off_and_on(&bmc);
}

#[test]
fn https_with_a_self_signed_ca_true_certificate_has_a_fingerprint() {
    let bmc = RedfishBmc::start(RedfishOptions {
        tls: Tls::SelfSignedCa,
        ..RedfishOptions::default()
    })
    .unwrap();
    let fingerprint = bmc.fingerprint_sha256().unwrap();
    assert_eq!(fingerprint.len(), 32 * 3 - 1, "{fingerprint}");
    switch_off_and_on(&bmc);
}

#[test]
fn wrong_password_is_refused_by_the_emulator() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let (code, _) = bmc.curl("GET", "/redfish/v1/Systems", None).unwrap();
    assert_eq!(code, 200);
    // The same request without credentials is refused.
    let addr = format!("127.0.0.1:{}", bmc.port());
    let reply = metalguard_e2e::http::get(
        addr.parse().unwrap(),
        "/redfish/v1/Systems",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(reply.0, 401);
}

#[test]
fn several_systems_are_listed() {
    let bmc = RedfishBmc::start(RedfishOptions {
        systems: 3,
        ..RedfishOptions::default()
    })
    .unwrap();
    let (code, body) = bmc.curl("GET", "/redfish/v1/Systems", None).unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["Members"].as_array().unwrap().len(), 3);
    for id in bmc.system_ids() {
        assert!(body.contains(id.as_str()), "{id} not listed");
    }
}

#[test]
fn stock_emulator_applies_power_changes_after_a_delay() {
    let bmc = RedfishBmc::start(RedfishOptions {
        instant_power: false,
        random_seed: Some(metalguard_e2e::redfish::SEED_FIRST_DELAY_1_TO_2_S),
        ..RedfishOptions::default()
    })
    .unwrap();
    let sent = Instant::now();
    assert_eq!(bmc.reset(0, "ForceOff").unwrap(), 204);
    assert_eq!(
        bmc.power_state(0).unwrap(),
        "On",
        "the seeded stock delay is 1-2 s"
    );
    while bmc.power_state(0).unwrap() != "Off" {
        assert!(
            sent.elapsed() < Duration::from_secs(15),
            "power never went off"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        sent.elapsed() >= Duration::from_secs(1),
        "the seeded first delay is 1-2 s"
    );
}

#[test]
fn systems_carry_their_uuid_and_the_launchers_serial_number() {
    let system = |bmc: &RedfishBmc| -> serde_json::Value {
        let (code, body) = bmc.curl("GET", &bmc.system_path(0), None).unwrap();
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let json = system(&bmc);
    assert_eq!(json["UUID"], bmc.system_ids()[0].as_str());
    let serial = bmc.serial_number(0).unwrap();
    assert!(serial.starts_with("MG-0-"), "{serial}");
    assert_eq!(json["SerialNumber"], serial);
    assert_eq!(json["PowerState"], "On");
    let bmc = RedfishBmc::start(RedfishOptions {
        serial_numbers: false,
        ..RedfishOptions::default()
    })
    .unwrap();
    assert_eq!(bmc.serial_number(0), None);
    assert!(system(&bmc).get("SerialNumber").is_none());
}
