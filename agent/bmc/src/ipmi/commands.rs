//! The IPMI commands this client sends, their request bytes and response parsers.

use super::rakp::Privilege;
use super::wire::{DecodeError, byte, take};

/// NetFn of application commands.
pub const NETFN_APP: u8 = 0x06;
/// NetFn of chassis commands.
pub const NETFN_CHASSIS: u8 = 0x00;
/// Get Channel Authentication Capabilities.
pub const CMD_GET_CHANNEL_AUTH_CAPS: u8 = 0x38;
/// Set Session Privilege Level.
pub const CMD_SET_SESSION_PRIVILEGE: u8 = 0x3B;
/// Close Session.
pub const CMD_CLOSE_SESSION: u8 = 0x3C;
/// Get Channel Cipher Suites.
pub const CMD_GET_CHANNEL_CIPHER_SUITES: u8 = 0x54;
/// Get System GUID (IPMI v2.0 §22.14): no request data, 16 bytes of GUID in the answer.
pub const CMD_GET_SYSTEM_GUID: u8 = 0x37;
/// Get Chassis Status.
pub const CMD_GET_CHASSIS_STATUS: u8 = 0x01;
/// Chassis Control.
pub const CMD_CHASSIS_CONTROL: u8 = 0x02;
/// "This channel" in channel-number fields.
pub const THIS_CHANNEL: u8 = 0x0E;
/// Completion code: insufficient privilege level.
pub const CC_INSUFFICIENT_PRIVILEGE: u8 = 0xD4;

/// Chassis Control actions (the request's data byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum ChassisControl {
    /// Power down (hard, immediate).
    PowerDown = 0x00,
    /// Power up.
    PowerUp = 0x01,
    /// Power cycle (off, then on after a BMC-defined delay).
    PowerCycle = 0x02,
    /// Hard reset.
    HardReset = 0x03,
    /// Soft shutdown through ACPI.
    SoftShutdown = 0x05,
}

impl ChassisControl {
    /// Whether sending it twice does the same as sending it once (safe to retransmit with a
    /// fresh sequence number).
    pub fn is_idempotent(self) -> bool {
        matches!(self, Self::PowerDown | Self::PowerUp | Self::SoftShutdown)
    }

    /// The action's name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::PowerDown => "power down",
            Self::PowerUp => "power up",
            Self::PowerCycle => "power cycle",
            Self::HardReset => "hard reset",
            Self::SoftShutdown => "soft shutdown",
        }
    }
}

/// A human reading of a completion code (IPMI v2.0 completion-code table).
pub fn completion_meaning(code: u8) -> &'static str {
    match code {
        0x00 => "success",
        0x80 => "requested privilege level not available for this user",
        0x81 => "requested privilege level exceeds user or channel limit",
        0xC0 => "node busy",
        0xC1 => "invalid command",
        0xC2 => "command invalid for given lun",
        0xC3 => "timeout while processing command",
        0xC4 => "out of space",
        0xC5 => "reservation canceled or invalid",
        0xC6 => "request data truncated",
        0xC7 => "request data length invalid",
        0xC8 => "request data field length limit exceeded",
        0xC9 => "parameter out of range",
        0xCC => "invalid data field in request",
        0xCD => "command illegal for specified sensor or record type",
        0xCE => "command response could not be provided",
        0xD4 => "insufficient privilege level",
        0xD5 => "command not supported in present state",
        0xFF => "unspecified error",
        _ => "unknown completion code",
    }
}

/// Get Channel Authentication Capabilities request data (asks for IPMI v2.0 data).
pub fn get_channel_auth_caps(privilege: Privilege) -> Vec<u8> {
    vec![0x80 | THIS_CHANNEL, privilege as u8]
}

/// Whether a Get Channel Authentication Capabilities answer says IPMI v2.0 is supported.
pub fn supports_ipmi_v2(data: &[u8]) -> Result<bool, DecodeError> {
    let what = "channel authentication capabilities";
    let auth_support = byte(data, 1, what)?;
    if auth_support & 0x80 == 0 {
        return Ok(false);
    }
    Ok(byte(data, 3, what)? & 0x02 != 0)
}

/// Get Channel Cipher Suites request data for one 16-byte page of the list.
pub fn get_channel_cipher_suites(page: u8) -> Vec<u8> {
    vec![THIS_CHANNEL, 0x00, 0x80 | (page & 0x3F)]
}

/// Splits one Get Channel Cipher Suites answer into (record bytes, whether more pages follow).
pub fn cipher_suite_page(data: &[u8]) -> Result<(&[u8], bool), DecodeError> {
    let _channel = byte(data, 0, "channel cipher suites")?;
    let records = &data[1..];
    Ok((records, records.len() == 16))
}

/// Parses the concatenated cipher suite records into suite IDs (standard and OEM records).
pub fn parse_cipher_suite_records(records: &[u8]) -> Vec<u8> {
    let mut ids = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let start = records[i];
        let skip_after_id = match start {
            0xC0 => 0,
            0xC1 => 3,
            _ => {
                i += 1;
                continue;
            }
        };
        let Some(id) = records.get(i + 1) else { break };
        ids.push(*id);
        i += 2 + skip_after_id;
        while i < records.len() && records[i] < 0xC0 {
            i += 1;
        }
    }
    ids
}

/// Set Session Privilege Level request data.
pub fn set_session_privilege(privilege: Privilege) -> Vec<u8> {
    vec![privilege as u8]
}

/// Close Session request data.
pub fn close_session(bmc_session_id: u32) -> Vec<u8> {
    bmc_session_id.to_le_bytes().to_vec()
}

/// Parses Get System GUID response data: the 16 GUID bytes as sent (IPMI v2.0 §22.14, format
/// of §20.8). Which byte order they are in is decided by the caller
/// ([`crate::identity::IPMI_GUID_ORDER`]). Bytes after the sixteenth are ignored.
pub fn parse_system_guid(data: &[u8]) -> Result<[u8; 16], DecodeError> {
    take::<16>(data, 0, "system guid")
}

/// The parts of Get Chassis Status we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChassisStatus {
    /// System power is on.
    pub power_on: bool,
    /// Power overload, interlock, fault or control fault bits (byte 1, bits 1-4).
    pub power_fault: bool,
}

/// Parses Get Chassis Status response data.
pub fn parse_chassis_status(data: &[u8]) -> Result<ChassisStatus, DecodeError> {
    let [current] = take::<1>(data, 0, "chassis status")?;
    Ok(ChassisStatus {
        power_on: current & 0x01 != 0,
        power_fault: current & 0x1E != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cipher_suite_records_standard_and_oem() {
        // ipmi_sim style: suites 0, 1, 2, 3 as standard records, plus one OEM record.
        let records = [
            0xC0, 0x00, 0x00, 0x40, 0x80, 0xC0, 0x01, 0x01, 0x40, 0x80, 0xC0, 0x03, 0x01, 0x41,
            0x81, 0xC1, 0x50, 0x01, 0x02, 0x03, 0x01, 0x41, 0x81, 0xC0, 0x11, 0x03, 0x44, 0x81,
        ];
        assert_eq!(
            parse_cipher_suite_records(&records),
            vec![0, 1, 3, 0x50, 17]
        );
        assert_eq!(parse_cipher_suite_records(&[0xC0]), Vec::<u8>::new());
        assert_eq!(parse_cipher_suite_records(&[1, 2, 3]), Vec::<u8>::new());
    }

    #[test]
    fn chassis_status_power_bit() {
        assert!(parse_chassis_status(&[0x01, 0, 0]).unwrap().power_on);
        assert!(!parse_chassis_status(&[0x60, 0, 0]).unwrap().power_on);
        assert!(parse_chassis_status(&[]).is_err());
    }

    #[test]
    fn system_guid_is_sixteen_bytes_as_sent() {
        let guid: Vec<u8> = (0u8..16).collect();
        assert_eq!(parse_system_guid(&guid).unwrap().to_vec(), guid);
        let mut longer = guid.clone();
        longer.push(0xEE);
        assert_eq!(parse_system_guid(&longer).unwrap().to_vec(), guid);
        let error = parse_system_guid(&guid[..15]).unwrap_err();
        assert!(error.to_string().contains("system guid"), "{error}");
        assert!(parse_system_guid(&[]).is_err());
    }

    #[test]
    fn auth_caps_v2_bit() {
        assert!(supports_ipmi_v2(&[1, 0x97, 0x04, 0x03, 0, 0, 0, 0]).unwrap());
        assert!(!supports_ipmi_v2(&[1, 0x17, 0x04, 0x03]).unwrap());
        assert!(!supports_ipmi_v2(&[1, 0x97, 0x04, 0x01]).unwrap());
        assert!(supports_ipmi_v2(&[1, 0x97]).is_err());
    }
}
