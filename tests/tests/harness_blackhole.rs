//! The black hole accepts TCP and never answers; its UDP port swallows datagrams.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::net::{TcpStream, UdpSocket};
use std::time::Duration;

use metalguard_e2e::blackhole::BlackHole;

#[test]
fn tcp_connects_but_never_answers_and_udp_never_answers() {
    let hole = BlackHole::start().unwrap();
    let mut stream = TcpStream::connect_timeout(&hole.tcp_addr(), Duration::from_secs(1)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 16];
    let err = stream.read(&mut buf).unwrap_err();
    assert!(matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));

    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    socket.connect(hole.udp_addr()).unwrap();
    socket.send(b"ping").unwrap();
    let err = socket.recv(&mut buf).unwrap_err();
    assert!(matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
}
