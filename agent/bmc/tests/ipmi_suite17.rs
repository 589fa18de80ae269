//! Cipher suite 17 end to end against an in-test BMC. No simulator here offers suite 17, so
//! this BMC is built from the crate's own primitives — which `ipmi_vectors.rs` checks against
//! independently computed vectors. What this adds: the client prefers 17 when offered, honours
//! a configured restriction to 3, and its suite-17 paths (32-byte RAKP codes, 16-byte integrity
//! check and auth codes, SHA-256 keys) work through a whole session, including a wrong password.

use metalguard_bmc::ipmi::crypto::{self, CipherSuite, RakpContext, SessionKeys};
use metalguard_bmc::ipmi::wire::{
    Envelope, PayloadType, checksum, decode_envelope, encode_rmcp_plus, encode_v15,
};
use metalguard_bmc::ipmi::{ChassisControl, IpmiConfig, IpmiError, IpmiSession};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use zeroize::Zeroizing;

const PASSWORD: &[u8] = b"suite-17-secret";
const BMC_SID: u32 = 0x5555_0001;
const GUID: [u8; 16] = [0xA5; 16];
const BMC_RANDOM: [u8; 16] = [0x3C; 16];
/// What the fake BMC answers to Get System GUID: DSP0134 §7.2.1's example of
/// `00112233-4455-6677-8899-aabbccddeeff` stored in SMBIOS order.
const SYSTEM_GUID: [u8; 16] = [
    0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF,
];

/// What the fake BMC saw, for the test to check.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    OpenSession {
        auth: u8,
        integrity: u8,
        confidentiality: u8,
    },
    Command {
        netfn: u8,
        cmd: u8,
        data: Vec<u8>,
    },
}

struct FakeBmc {
    offered: Vec<u8>,
    suite: Option<CipherSuite>,
    console_sid: u32,
    console_random: [u8; 16],
    role: u8,
    username: Vec<u8>,
    keys: Option<SessionKeys>,
    seq: u32,
    seen: mpsc::UnboundedSender<Seen>,
}

fn ipmi_response(netfn: u8, cmd: u8, rq_seq_byte: u8, data: &[u8]) -> Vec<u8> {
    let mut msg = vec![0x81, (netfn | 1) << 2, 0, 0x20, rq_seq_byte, cmd, 0x00];
    msg[2] = checksum(&msg[0..2]);
    msg.extend_from_slice(data);
    let c = checksum(&msg[3..]);
    msg.push(c);
    msg
}

impl FakeBmc {
    fn ctx(&self) -> RakpContext<'_> {
        RakpContext {
            console_session_id: self.console_sid,
            bmc_session_id: BMC_SID,
            console_random: self.console_random,
            bmc_random: BMC_RANDOM,
            bmc_guid: GUID,
            role: self.role,
            username: &self.username,
        }
    }

    fn answer(&mut self, dg: &[u8]) -> Option<Vec<u8>> {
        let auth_len = self.suite.map_or(0, CipherSuite::integrity_len);
        match decode_envelope(dg, auth_len).ok()? {
            Envelope::V15 { message, .. } => {
                let (rq_seq, cmd) = (*message.get(4)?, *message.get(5)?);
                let data = match cmd {
                    0x38 => vec![0x01, 0x80, 0x04, 0x02, 0, 0, 0, 0],
                    0x54 => {
                        let mut d = vec![0x01];
                        for id in &self.offered {
                            d.extend_from_slice(&[0xC0, *id, 0x01, 0x41, 0x81]);
                        }
                        d
                    }
                    _ => return None,
                };
                Some(encode_v15(&ipmi_response(0x06, cmd, rq_seq, &data)))
            }
            Envelope::V20(p) => self.answer_v20(p.payload_type, p.payload, p.signed, p.auth_code),
        }
    }

    fn answer_v20(
        &mut self,
        ptype: u8,
        payload: &[u8],
        signed: &[u8],
        code: &[u8],
    ) -> Option<Vec<u8>> {
        let kuid = crypto::user_key(PASSWORD)?;
        let reply = |ptype, body: Vec<u8>| encode_rmcp_plus(ptype, false, false, 0, 0, &body).0;
        match ptype {
            0x10 => {
                let (auth, integrity, confidentiality) = (payload[12], payload[20], payload[28]);
                let _ = self.seen.send(Seen::OpenSession {
                    auth,
                    integrity,
                    confidentiality,
                });
                self.suite = Some(if auth == 3 {
                    CipherSuite::Suite17
                } else {
                    CipherSuite::Suite3
                });
                self.console_sid = u32::from_le_bytes(payload[4..8].try_into().ok()?);
                let mut body = vec![payload[0], 0, 4, 0];
                body.extend_from_slice(&payload[4..8]);
                body.extend_from_slice(&BMC_SID.to_le_bytes());
                body.extend_from_slice(&payload[8..32]);
                Some(reply(PayloadType::OpenSessionResponse, body))
            }
            0x12 => {
                self.console_random = payload[8..24].try_into().ok()?;
                self.role = payload[24];
                self.username = payload[28..28 + usize::from(payload[27])].to_vec();
                let suite = self.suite?;
                let mut body = vec![payload[0], 0, 0, 0];
                body.extend_from_slice(&self.console_sid.to_le_bytes());
                body.extend_from_slice(&BMC_RANDOM);
                body.extend_from_slice(&GUID);
                body.extend_from_slice(&crypto::rakp2_auth_code(suite, &kuid[..], &self.ctx()));
                Some(reply(PayloadType::Rakp2, body))
            }
            0x14 => {
                let suite = self.suite?;
                let expected = crypto::rakp3_auth_code(suite, &kuid[..], &self.ctx());
                let mut body = vec![payload[0], 0, 0, 0];
                body.extend_from_slice(&self.console_sid.to_le_bytes());
                if payload[1] != 0 || payload[8..] != expected[..] {
                    body[1] = 0x0F;
                    return Some(reply(PayloadType::Rakp4, body));
                }
                let sik = crypto::session_integrity_key(suite, &kuid[..], &self.ctx());
                body.extend_from_slice(&crypto::rakp4_integrity_check(suite, &sik, &self.ctx()));
                self.keys = Some(SessionKeys::derive(suite, &sik));
                Some(reply(PayloadType::Rakp4, body))
            }
            0x00 => {
                let keys = self.keys.clone()?;
                if !keys.verify_packet(signed, code) {
                    return None;
                }
                let msg = keys.decrypt(payload).ok()?;
                let (netfn, rq_seq, cmd) = (msg[1] >> 2, msg[4], msg[5]);
                let data = msg[6..msg.len() - 1].to_vec();
                let _ = self.seen.send(Seen::Command { netfn, cmd, data });
                let answer = match (netfn, cmd) {
                    (0x06, 0x3B) => vec![0x04],
                    (0x00, 0x01) => vec![0x01, 0x00, 0x00],
                    (0x06, 0x37) => SYSTEM_GUID.to_vec(),
                    _ => vec![],
                };
                let enc = keys.encrypt([0x11; 16], &ipmi_response(netfn, cmd, rq_seq, &answer));
                self.seq += 1;
                let (mut out, start) = encode_rmcp_plus(
                    PayloadType::Ipmi,
                    true,
                    true,
                    self.console_sid,
                    self.seq,
                    &enc,
                );
                let auth = keys.packet_auth_code(&out[start..]);
                out.extend_from_slice(&auth);
                Some(out)
            }
            _ => None,
        }
    }
}

async fn start(offered: &[u8]) -> std::io::Result<(u16, mpsc::UnboundedReceiver<Seen>)> {
    let socket = UdpSocket::bind("127.0.0.1:0").await?;
    let port = socket.local_addr()?.port();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut bmc = FakeBmc {
        offered: offered.to_vec(),
        suite: None,
        console_sid: 0,
        console_random: [0; 16],
        role: 0,
        username: Vec::new(),
        keys: None,
        seq: 0,
        seen: tx,
    };
    tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            if let Some(out) = bmc.answer(&buf[..n]) {
                let _ = socket.send_to(&out, from).await;
            }
        }
    });
    Ok((port, rx))
}

fn config(port: u16, password: &[u8]) -> IpmiConfig {
    let mut c = IpmiConfig::new("127.0.0.1", "admin", Zeroizing::new(password.to_vec()));
    c.port = port;
    c
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    std::iter::from_fn(|| rx.try_recv().ok()).collect()
}

#[tokio::test]
async fn suite_17_is_preferred_and_carries_a_whole_session() {
    let (port, mut rx) = start(&[3, 17]).await.unwrap();
    let mut s = IpmiSession::connect(&config(port, PASSWORD)).await.unwrap();
    assert!(
        s.events().iter().any(|e| e.detail == "suite 17"),
        "{:?}",
        s.events()
    );
    assert!(s.chassis_status().await.unwrap().power_on);
    s.chassis_control(ChassisControl::PowerDown).await.unwrap();
    s.close().await.unwrap();
    let seen = drain(&mut rx);
    assert_eq!(
        seen[0],
        Seen::OpenSession {
            auth: 3,
            integrity: 4,
            confidentiality: 1
        }
    );
    let commands: Vec<_> = seen[1..]
        .iter()
        .map(|s| match s {
            Seen::Command { netfn, cmd, data } => (*netfn, *cmd, data.clone()),
            Seen::OpenSession { .. } => panic!("second open session"),
        })
        .collect();
    assert_eq!(
        commands,
        vec![
            (0x06, 0x3B, vec![0x04]),
            (0x00, 0x01, vec![]),
            (0x00, 0x02, vec![0x00]),
            (0x06, 0x3C, BMC_SID.to_le_bytes().to_vec()),
        ]
    );
}

#[tokio::test]
async fn a_configured_list_restricts_the_suite() {
    let (port, mut rx) = start(&[3, 17]).await.unwrap();
    let mut c = config(port, PASSWORD);
    c.suites = vec![CipherSuite::Suite3];
    let s = IpmiSession::connect(&c).await.unwrap();
    s.close().await.unwrap();
    assert_eq!(
        drain(&mut rx)[0],
        Seen::OpenSession {
            auth: 1,
            integrity: 1,
            confidentiality: 1
        }
    );
}

#[tokio::test]
async fn a_wrong_password_on_suite_17_is_an_authentication_failure() {
    let (port, _rx) = start(&[17]).await.unwrap();
    let err = IpmiSession::connect(&config(port, b"not-the-secret"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, IpmiError::AuthenticationFailed { .. }),
        "{err:?}"
    );
    assert!(!format!("{err} {err:?}").contains("not-the-secret"));
}

/// Get System GUID inside a suite-17 session: the bytes as sent, read in SMBIOS order, the
/// serial number absent (IPMI has no command for it), and the session closed afterwards.
#[tokio::test]
async fn identity_reads_the_system_guid_in_smbios_order() {
    use metalguard_bmc::{BmcAddress, Credentials, PowerControl, ReadIdentity};

    let (port, mut rx) = start(&[17]).await.unwrap();
    let address: BmcAddress = format!("ipmi://127.0.0.1:{port}").parse().unwrap();
    let credentials = Credentials::new("admin", std::str::from_utf8(PASSWORD).unwrap());
    let mut bmc = metalguard_bmc::ipmi::IpmiClient::new(
        &address,
        &credentials,
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(2),
    );
    let identity = bmc.identity().await.unwrap();
    bmc.close().await.unwrap();
    assert_eq!(
        identity.uuid.unwrap().to_string(),
        "00112233-4455-6677-8899-aabbccddeeff"
    );
    assert_eq!(
        identity.serial_number_absent.as_deref(),
        Some("ipmi has no standard command for the system serial number")
    );
    let commands: Vec<(u8, u8)> = drain(&mut rx)
        .iter()
        .filter_map(|s| match s {
            Seen::Command { netfn, cmd, .. } => Some((*netfn, *cmd)),
            Seen::OpenSession { .. } => None,
        })
        .collect();
    assert_eq!(commands, vec![(0x06, 0x3B), (0x06, 0x37), (0x06, 0x3C)]);
    let timeline = bmc.timeline_mut().to_string();
    assert!(
        timeline.contains("ipmi system guid bytes 33 22 11 00 55 44 77 66 88 99 aa bb cc dd ee ff (read in smbios order)"),
        "{timeline}"
    );
}
