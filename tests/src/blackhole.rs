//! Endpoints that never answer, for timeout tests.
//!
//! The TCP side is a listening socket that is never `accept`ed: the kernel completes the
//! handshake into the backlog, so a client connects and then waits forever for bytes. The UDP
//! side is a bound socket that is never read, so datagrams vanish without an ICMP error.

use std::net::{SocketAddr, TcpListener, UdpSocket};

use crate::ports::{PortLease, reserve_port};
use crate::{HarnessError, Result};

/// A TCP port that accepts and never answers, and a UDP port that never answers.
#[derive(Debug)]
pub struct BlackHole {
    tcp: TcpListener,
    udp: UdpSocket,
    leases: (PortLease, PortLease),
}

impl BlackHole {
    /// Binds both sockets on 127.0.0.1.
    pub fn start() -> Result<Self> {
        let tcp_lease = reserve_port()?;
        let udp_lease = reserve_port()?;
        let tcp = TcpListener::bind(tcp_lease.addr())
            .map_err(HarnessError::io("binding the black-hole TCP port"))?;
        let udp = UdpSocket::bind(udp_lease.addr())
            .map_err(HarnessError::io("binding the black-hole UDP port"))?;
        Ok(Self {
            tcp,
            udp,
            leases: (tcp_lease, udp_lease),
        })
    }

    /// The TCP address (connects succeed; nothing is ever sent back).
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .unwrap_or_else(|_| self.leases.0.addr())
    }

    /// The UDP address (datagrams are swallowed).
    pub fn udp_addr(&self) -> SocketAddr {
        self.udp
            .local_addr()
            .unwrap_or_else(|_| self.leases.1.addr())
    }
}
