//! The IPMI v2.0 client against OpenIPMI's `ipmi_sim` (cipher suite 3, privilege
//! enforcement, 63 session slots) and against peers that do not answer or answer garbage.

use std::time::{Duration, Instant};

use metalguard_bmc::ipmi::{
    ChassisControl, CipherSuite, IpmiConfig, IpmiError, IpmiSession, Privilege,
};
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege as Account};
use zeroize::Zeroizing;

fn config(sim: &IpmiSim, account: Account) -> IpmiConfig {
    let mut c = IpmiConfig::new(
        "127.0.0.1",
        sim.username(account),
        Zeroizing::new(sim.password().as_bytes().to_vec()),
    );
    c.port = sim.port();
    c
}

#[tokio::test]
async fn suite_3_status_off_on_and_cycle_against_ipmi_sim() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let mut s = IpmiSession::connect(&config(&sim, Account::Admin))
        .await
        .unwrap();
    assert!(
        s.events().iter().any(|e| e.detail == "suite 3"),
        "{:?}",
        s.events()
    );
    assert!(s.chassis_status().await.unwrap().power_on);

    s.chassis_control(ChassisControl::PowerDown).await.unwrap();
    assert!(!s.chassis_status().await.unwrap().power_on);
    assert!(!sim.power_on().unwrap());

    s.chassis_control(ChassisControl::PowerUp).await.unwrap();
    assert!(s.chassis_status().await.unwrap().power_on);
    assert!(sim.power_on().unwrap());

    s.chassis_control(ChassisControl::HardReset).await.unwrap();
    s.chassis_control(ChassisControl::SoftShutdown)
        .await
        .unwrap();
    assert!(!sim.power_on().unwrap());
    s.chassis_control(ChassisControl::PowerUp).await.unwrap();
    s.chassis_control(ChassisControl::PowerCycle).await.unwrap();
    s.close().await.unwrap();

    let log = sim.power_log().unwrap();
    let kinds: Vec<_> = log
        .iter()
        .map(|e| format!("{} {}", e.kind, e.value))
        .collect();
    assert!(kinds.contains(&"reset 1".to_owned()), "{kinds:?}");
    assert!(kinds.contains(&"shutdown 1".to_owned()), "{kinds:?}");
}

/// ipmi_sim does not enforce an account's configured maximum for RMCP+ sessions (it grants
/// ADMINISTRATOR to its USER account `viewer`, to ipmitool as well); what it enforces is the
/// session's level. A session at the account's USER level reads, and is refused power off.
#[tokio::test]
async fn a_user_level_session_cannot_power_off() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let mut c = config(&sim, Account::User);
    c.privilege = Privilege::User;
    let mut s = IpmiSession::connect(&c).await.unwrap();
    assert!(s.chassis_status().await.unwrap().power_on);
    let err = s
        .chassis_control(ChassisControl::PowerDown)
        .await
        .unwrap_err();
    assert!(matches!(err, IpmiError::PrivilegeRefused { .. }), "{err:?}");
    let msg = err.to_string();
    assert_eq!(
        msg,
        format!(
            "bmc 127.0.0.1:{} refused chassis control (power down) for user viewer: insufficient privilege level",
            sim.port()
        )
    );
    s.close().await.unwrap();
    assert!(sim.power_on().unwrap(), "the host must still be on");
    assert!(sim.power_log().unwrap().is_empty());
}

#[tokio::test]
async fn one_hundred_operations_do_not_exhaust_the_63_session_slots() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let c = config(&sim, Account::Admin);
    for i in 0..100 {
        let mut s = IpmiSession::connect(&c)
            .await
            .unwrap_or_else(|e| panic!("session {i}: {e}"));
        let action = if i % 2 == 0 {
            ChassisControl::PowerDown
        } else {
            ChassisControl::PowerUp
        };
        s.chassis_control(action).await.unwrap();
        s.close().await.unwrap();
    }
    // Sessions dropped without close() are closed by Drop: 100 more must still work.
    for i in 0..100 {
        let mut s = IpmiSession::connect(&c)
            .await
            .unwrap_or_else(|e| panic!("dropped {i}: {e}"));
        s.chassis_status().await.unwrap();
        drop(s);
        // Give ipmi_sim a moment to process the fire-and-forget Close Session.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_cancelled_operation_still_frees_its_session() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let c = config(&sim, Account::Admin);
    for _ in 0..70 {
        let fut = async {
            let mut s = IpmiSession::connect(&c).await.unwrap();
            s.chassis_status().await.unwrap();
            // Never completes: the future is cancelled by the timeout below while holding `s`.
            std::future::pending::<()>().await;
        };
        assert!(
            tokio::time::timeout(Duration::from_millis(40), fut)
                .await
                .is_err()
        );
    }
    let mut s = IpmiSession::connect(&c).await.unwrap();
    s.chassis_status().await.unwrap();
    s.close().await.unwrap();
}

#[tokio::test]
async fn wrong_password_fails_fast_and_does_not_leak_it() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let mut c = config(&sim, Account::Admin);
    let wrong = "not-the-password";
    c.password = Zeroizing::new(wrong.as_bytes().to_vec());
    let started = Instant::now();
    let err = IpmiSession::connect(&c).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(err, IpmiError::AuthenticationFailed { .. }),
        "{err:?}"
    );
    let msg = format!("{err} {err:?} {c:?}");
    assert!(
        msg.contains("authentication failed for user admin at bmc 127.0.0.1:"),
        "{msg}"
    );
    assert!(
        !msg.contains(wrong) && !msg.contains(sim.password()),
        "{msg}"
    );
    // The failed attempts must not leak session slots either.
    for _ in 0..70 {
        let _ = IpmiSession::connect(&c).await.unwrap_err();
    }
    let s = IpmiSession::connect(&config(&sim, Account::Admin))
        .await
        .unwrap();
    s.close().await.unwrap();
}

#[tokio::test]
async fn a_suite_list_without_3_finds_no_common_suite_on_ipmi_sim() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let mut c = config(&sim, Account::Admin);
    c.suites = vec![CipherSuite::Suite17];
    let err = IpmiSession::connect(&c).await.unwrap_err();
    let IpmiError::NoCommonCipherSuite { offered, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        offered.contains(&3) && !offered.contains(&17),
        "{offered:?}"
    );
}

/// A UDP relay in front of `port` that drops the BMC's RAKP message 2, leaving every
/// handshake half-open (after Open Session, before activation).
async fn relay_dropping_rakp2(port: u16) -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let back = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    back.connect(("127.0.0.1", port)).await?;
    let front_port = front.local_addr()?.port();
    let task = tokio::spawn(async move {
        let (mut a, mut b) = ([0u8; 1024], [0u8; 1024]);
        let mut client = None;
        loop {
            tokio::select! {
                Ok((n, from)) = front.recv_from(&mut a) => {
                    client = Some(from);
                    let _ = back.send(&a[..n]).await;
                }
                Ok(n) = back.recv(&mut b) => {
                    let rakp2 = n > 5 && b[4] == 0x06 && b[5] & 0x3F == 0x13;
                    if let (false, Some(to)) = (rakp2, client) {
                        let _ = front.send_to(&b[..n], to).await;
                    }
                }
            }
        }
    });
    Ok((front_port, task))
}

/// Handshakes that fail or are cancelled half-open are aborted with an RAKP3 error status,
/// or ipmi_sim would run out of its 63 slots.
#[tokio::test]
async fn half_open_handshakes_do_not_leak_session_slots() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let (relay, task) = relay_dropping_rakp2(sim.port()).await.unwrap();
    let mut c = config(&sim, Account::Admin);
    c.port = relay;
    // The relay drops every RAKP 2, so each attempt times out there whatever the budget; the
    // budget only has to cover the Open Session answer, which took longer than 20 ms on a
    // loaded 2-core machine (load ~12: 2 failures in 4 runs, each "open session").
    c.retry.first_timeout = Duration::from_millis(250);
    c.retry.attempts = 1;
    for _ in 0..40 {
        let err = IpmiSession::connect(&c).await.unwrap_err();
        assert!(
            matches!(
                err,
                IpmiError::Timeout {
                    step: "rakp message 2",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // Now each RAKP wait outlasts the cancellation by far, even on a loaded machine.
    c.retry.first_timeout = Duration::from_millis(500);
    for _ in 0..40 {
        let cancelled = tokio::time::timeout(Duration::from_millis(15), IpmiSession::connect(&c));
        let result = cancelled.await;
        assert!(result.is_err(), "not cancelled: {result:?}");
    }
    task.abort();
    let s = IpmiSession::connect(&config(&sim, Account::Admin))
        .await
        .unwrap();
    s.close().await.unwrap();
}

/// A relay in front of `port` that drops the `n`-th authenticated session answer (1-based).
async fn relay_dropping_answer(
    port: u16,
    n: usize,
) -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let front = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let back = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    back.connect(("127.0.0.1", port)).await?;
    let front_port = front.local_addr()?.port();
    let task = tokio::spawn(async move {
        let (mut a, mut b) = ([0u8; 1024], [0u8; 1024]);
        let (mut client, mut seen) = (None, 0);
        loop {
            tokio::select! {
                Ok((len, from)) = front.recv_from(&mut a) => {
                    client = Some(from);
                    let _ = back.send(&a[..len]).await;
                }
                Ok(len) = back.recv(&mut b) => {
                    let session_answer = len > 5 && b[4] == 0x06 && b[5] == 0xC0;
                    if session_answer {
                        seen += 1;
                    }
                    if let (false, Some(to)) = (session_answer && seen == n, client) {
                        let _ = front.send_to(&b[..len], to).await;
                    }
                }
            }
        }
    });
    Ok((front_port, task))
}

/// A hard reset whose answer is lost is never repeated (ipmi_sim runs even a byte-identical
/// retransmission again — found by this test): the host is reset once, and the error says the
/// reset may have run.
#[tokio::test]
async fn a_lost_hard_reset_answer_never_resets_twice() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    // Answers: 1 = set session privilege, 2 = chassis control.
    let (relay, task) = relay_dropping_answer(sim.port(), 2).await.unwrap();
    let mut c = config(&sim, Account::Admin);
    c.port = relay;
    c.retry.first_timeout = Duration::from_millis(100);
    c.retry.attempts = 3;
    let mut s = IpmiSession::connect(&c).await.unwrap();
    let started = Instant::now();
    let err = s
        .chassis_control(ChassisControl::HardReset)
        .await
        .unwrap_err();
    // The single send waits the whole budget of the three attempts (100 + 200 + 400 ms).
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, IpmiError::Timeout { attempts: 1, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("it may have run"), "{err}");
    drop(s);
    task.abort();
    let log = sim.power_log().unwrap();
    let resets = log.iter().filter(|e| e.kind == "reset").count();
    assert_eq!(resets, 1, "{log:?}");
}
