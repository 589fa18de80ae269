//! The IPMI client against peers that are not BMCs: nothing listening (ICMP port
//! unreachable), a black hole, and fake peers answering garbage or truncated datagrams. Every
//! case must end with a precise error within a bounded time.

use std::time::{Duration, Instant};

use metalguard_bmc::ipmi::{IpmiConfig, IpmiError, IpmiSession, RetryPolicy};
use metalguard_e2e::blackhole::BlackHole;
use metalguard_e2e::ports::reserve_port;
use tokio::net::UdpSocket;
use zeroize::Zeroizing;

fn config(port: u16) -> IpmiConfig {
    let mut c = IpmiConfig::new(
        "127.0.0.1",
        "admin",
        Zeroizing::new(b"secret-password".to_vec()),
    );
    c.port = port;
    c.retry = RetryPolicy {
        first_timeout: Duration::from_millis(100),
        max_timeout: Duration::from_millis(400),
        attempts: 3,
    };
    c
}

#[tokio::test]
async fn nothing_listening_fails_fast_on_port_unreachable() {
    let lease = reserve_port().unwrap();
    let started = Instant::now();
    let err = IpmiSession::connect(&config(lease.port()))
        .await
        .unwrap_err();
    assert!(matches!(err, IpmiError::Unreachable { .. }), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", lease.port()))
    );
}

#[tokio::test]
async fn a_black_hole_times_out_within_the_retry_budget() {
    let hole = BlackHole::start().unwrap();
    let c = config(hole.udp_addr().port());
    let budget = c.retry.worst_case();
    assert_eq!(budget, Duration::from_millis(100 + 200 + 400));
    let started = Instant::now();
    let err = IpmiSession::connect(&c).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(err, IpmiError::Timeout { attempts: 3, .. }),
        "{err:?}"
    );
    assert!(
        took >= budget && took < budget + Duration::from_secs(1),
        "{took:?}"
    );
    assert!(
        err.to_string().starts_with(&format!(
            "bmc 127.0.0.1:{} did not answer get channel authentication capabilities after 3 attempts",
            hole.udp_addr().port()
        )),
        "{err}"
    );
}

/// A UDP peer that answers every datagram with what `reply` makes of it.
async fn fake_peer(
    reply: fn(&[u8], u64) -> Vec<u8>,
) -> std::io::Result<(u16, tokio::task::JoinHandle<()>)> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let port = socket.local_addr()?.port();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        let mut n = 0u64;
        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
            n += 1;
            let _ = socket.send_to(&reply(&buf[..len], n), from).await;
        }
    });
    Ok((port, task))
}

#[tokio::test]
async fn garbage_answers_end_in_a_malformed_error() {
    let (port, task) = fake_peer(|_, n| {
        // Deterministic junk of varying length, sometimes with a valid RMCP header.
        let mut out: Vec<u8> = (0..(n * 7 % 60)).map(|i| (i * 31 + n) as u8).collect();
        if n % 2 == 0 {
            out.splice(0..0, [0x06, 0x00, 0xFF, 0x07]);
        }
        out
    })
    .await
    .unwrap();
    let started = Instant::now();
    let err = IpmiSession::connect(&config(port)).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(err, IpmiError::Malformed { .. }), "{err:?}");
    task.abort();
}

#[tokio::test]
async fn truncated_answers_end_in_a_malformed_error() {
    // A real Get Channel Auth Caps answer, cut short: the decoder must refuse it.
    let (port, task) = fake_peer(|_, _| {
        vec![
            0x06, 0x00, 0xFF, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x81, 0x1C, 0x63, 0x20,
            0x04, 0x38, 0x00, 0x01,
        ]
    })
    .await
    .unwrap();
    let err = IpmiSession::connect(&config(port)).await.unwrap_err();
    let IpmiError::Malformed { step, source, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*step, "get channel authentication capabilities");
    assert!(source.to_string().contains("length field"), "{source}");
    task.abort();
}

#[tokio::test]
async fn an_ipmi_v1_5_only_bmc_is_named_as_such() {
    // Answers Get Channel Auth Caps without the IPMI v2.0 bit.
    let (port, task) = fake_peer(|req, _| {
        let rq_seq = req.get(18).copied().unwrap_or(0);
        let mut msg = vec![
            0x81,
            0x07 << 2,
            0,
            0x20,
            rq_seq,
            0x38,
            0x00,
            0x01,
            0x17,
            0x04,
            0x01,
            0,
            0,
            0,
            0,
        ];
        msg[2] = checksum(&msg[0..2]);
        let c = checksum(&msg[3..]);
        msg.push(c);
        let mut out = vec![
            0x06,
            0x00,
            0xFF,
            0x07,
            0x00,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            msg.len() as u8,
        ];
        out.extend_from_slice(&msg);
        out
    })
    .await
    .unwrap();
    let err = IpmiSession::connect(&config(port)).await.unwrap_err();
    assert!(matches!(err, IpmiError::NotIpmiV2 { .. }), "{err:?}");
    task.abort();
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |a, b| a.wrapping_add(*b))
        .wrapping_neg()
}
