//! Which machine a host or a BMC says it is: the system UUID and serial number, as the host's
//! firmware tables (SMBIOS/DMI), a Redfish `ComputerSystem` and IPMI's Get System GUID give
//! them. The agent reads its own host's; a credentialed BMC check reads the BMC's; the
//! controller compares the two, so a BMC that answers for another server is found before a
//! fence goes through it.
//!
//! Data flow: raw bytes or text → [`SystemUuid`] (16 bytes, always printed in the canonical
//! lowercase `8-4-4-4-12` form) → [`SystemIdentity`] (both fields, each present or absent with
//! the reason). Pure: no I/O.
//!
//! # Byte order of a 16-byte GUID
//!
//! The canonical text of a UUID reads its 16 bytes in RFC 4122 order (§4.1.2: every field
//! most significant byte first). Binary encodings differ ([`GuidByteOrder`]):
//!
//! - **SMBIOS ≥ 2.6** (DSP0134 §7.2.1, System Information UUID) stores the first three fields
//!   (`time_low`, `time_mid`, `time_hi_and_version`) little-endian and the last eight bytes as
//!   they are: `{00112233-4455-6677-8899-aabbccddeeff}` is `33 22 11 00 55 44 77 66 88 99 aa
//!   bb cc dd ee ff`. Linux's `/sys/class/dmi/id/product_uuid`, dmidecode and the Redfish
//!   `ComputerSystem.UUID` of a BMC that follows the schema's advice print this value.
//! - **IPMI v2.0** Get System GUID (§22.14) returns 16 bytes in the format of Get Device GUID
//!   (§20.8), whose table lists the whole GUID least significant byte first (the node first,
//!   `time_low` last). Most BMCs send the SMBIOS order instead (ipmitool's `mc guid` prefers
//!   that reading for this reason), and so do ipmi_sim's configuration and pyghmi
//!   (`uuid.bytes_le`). metalguard reads IPMI GUIDs in SMBIOS order; a comparison that finds no
//!   match can try the other readings ([`SystemUuid::readings_of_ipmi_guid`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How the 16 bytes of a binary GUID map onto the canonical UUID text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GuidByteOrder {
    /// RFC 4122 §4.1.2: every field most significant byte first (the bytes in text order).
    Rfc4122,
    /// SMBIOS ≥ 2.6 (DSP0134 §7.2.1): `time_low`, `time_mid` and `time_hi_and_version`
    /// little-endian, the clock sequence and node as they are. What metalguard reads an IPMI
    /// system GUID as.
    Smbios,
    /// IPMI v2.0 §20.8 read literally: the whole 16 bytes least significant byte first.
    IpmiReversed,
}

impl GuidByteOrder {
    /// Every order, the one metalguard reads IPMI GUIDs in first.
    pub const ALL: [Self; 3] = [Self::Smbios, Self::IpmiReversed, Self::Rfc4122];

    /// A short name for messages (`smbios`, `ipmi-reversed`, `rfc4122`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rfc4122 => "rfc4122",
            Self::Smbios => "smbios",
            Self::IpmiReversed => "ipmi-reversed",
        }
    }
}

/// A system UUID: 16 bytes in RFC 4122 order, printed as canonical lowercase text
/// (`674523a1-ab89-efcd-a123-456789abcdef`) and parsed from it case-insensitively. On the
/// wire (JSON) it is that text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SystemUuid([u8; 16]);

/// Why a text is not a UUID. The message never quotes the text (it may come from anywhere).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a uuid in the 8-4-4-4-12 hexadecimal form")]
pub struct UuidParseError;

/// Where the hyphens of the canonical text are.
const HYPHENS: [usize; 4] = [8, 13, 18, 23];

impl SystemUuid {
    /// The UUID whose canonical text reads `bytes` in order (RFC 4122).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    /// The 16 bytes in RFC 4122 order.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The UUID a binary GUID stored in `order` stands for.
    pub fn from_guid_bytes(bytes: [u8; 16], order: GuidByteOrder) -> Self {
        Self(reorder(bytes, order))
    }

    /// This UUID stored as a binary GUID in `order` (the inverse of
    /// [`SystemUuid::from_guid_bytes`]).
    pub fn to_guid_bytes(&self, order: GuidByteOrder) -> [u8; 16] {
        // Each reordering is its own inverse.
        reorder(self.0, order)
    }

    /// All zeros or all `FF`: SMBIOS §7.2.1 says the ID is not present (`00`) or not set yet
    /// (`FF`). Never an identity.
    pub fn is_placeholder(&self) -> bool {
        self.0.iter().all(|b| *b == 0) || self.0.iter().all(|b| *b == 0xFF)
    }

    /// The UUIDs an IPMI BMC that sent this UUID's bytes (read in SMBIOS order, as metalguard
    /// reads them) could have meant, one per [`GuidByteOrder`], SMBIOS first. For a comparison
    /// that must not call a BMC foreign only because its firmware picked another byte order.
    pub fn readings_of_ipmi_guid(&self) -> [(GuidByteOrder, SystemUuid); 3] {
        let wire = self.to_guid_bytes(GuidByteOrder::Smbios);
        GuidByteOrder::ALL.map(|order| (order, Self::from_guid_bytes(wire, order)))
    }
}

/// `bytes` as stored in `order`, in RFC 4122 order (and back: every case is an involution).
fn reorder(bytes: [u8; 16], order: GuidByteOrder) -> [u8; 16] {
    let mut out = bytes;
    match order {
        GuidByteOrder::Rfc4122 => {}
        GuidByteOrder::Smbios => {
            out[0..4].reverse();
            out[4..6].reverse();
            out[6..8].reverse();
        }
        GuidByteOrder::IpmiReversed => out.reverse(),
    }
    out
}

impl fmt::Display for SystemUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SystemUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SystemUuid({self})")
    }
}

impl FromStr for SystemUuid {
    type Err = UuidParseError;

    /// The canonical 36-character form, hexadecimal digits in either case. Braces, `urn:uuid:`
    /// and hyphen-less forms are refused: no source metalguard reads uses them, and a lenient
    /// parser would hide a BMC that sends something else.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.as_bytes();
        if text.len() != 36 {
            return Err(UuidParseError);
        }
        let mut digits = Vec::with_capacity(32);
        for (i, c) in text.iter().enumerate() {
            if HYPHENS.contains(&i) {
                if *c != b'-' {
                    return Err(UuidParseError);
                }
            } else {
                digits.push(hex_value(*c).ok_or(UuidParseError)?);
            }
        }
        let mut bytes = [0u8; 16];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            *byte = (pair[0] << 4) | pair[1];
        }
        Ok(Self(bytes))
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl Serialize for SystemUuid {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SystemUuid {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What one source says a machine is. Each field is present, or absent with the reason (a
/// file the agent may not read, a BMC that sends no serial number, a placeholder UUID), so a
/// check can say why it could not compare.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemIdentity {
    /// The system UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<SystemUuid>,
    /// Why `uuid` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid_absent: Option<String>,
    /// The system serial number as the source gives it, surrounding whitespace removed (often
    /// a vendor placeholder such as `To Be Filled By O.E.M.`: the UUID is the stronger key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// Why `serial_number` is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number_absent: Option<String>,
}

/// The longest serial number kept; a longer one is reported absent (cutting it would make it
/// another serial number).
pub const MAX_SERIAL_NUMBER: usize = 128;

impl SystemIdentity {
    /// Sets the UUID from `uuid`, or records `why` it is absent.
    pub fn set_uuid(&mut self, uuid: Result<SystemUuid, String>) {
        match uuid {
            Ok(uuid) if uuid.is_placeholder() => {
                self.uuid = None;
                self.uuid_absent = Some(format!("placeholder uuid {uuid} (not set in firmware)"));
            }
            Ok(uuid) => {
                self.uuid = Some(uuid);
                self.uuid_absent = None;
            }
            Err(why) => {
                self.uuid = None;
                self.uuid_absent = Some(why);
            }
        }
    }

    /// Sets the serial number from `text` (trimmed), or records why it is absent: empty,
    /// longer than [`MAX_SERIAL_NUMBER`] bytes, or holding a control character.
    pub fn set_serial_number(&mut self, text: Result<&str, String>) {
        let checked = text.and_then(|text| {
            let text = text.trim();
            if text.is_empty() {
                Err("empty".to_owned())
            } else if text.len() > MAX_SERIAL_NUMBER {
                Err(format!(
                    "{} bytes long; at most {MAX_SERIAL_NUMBER} are kept",
                    text.len()
                ))
            } else if crate::text::has_control(text) {
                Err("contains a control character".to_owned())
            } else {
                Ok(text.to_owned())
            }
        });
        match checked {
            Ok(serial) => {
                self.serial_number = Some(serial);
                self.serial_number_absent = None;
            }
            Err(why) => {
                self.serial_number = None;
                self.serial_number_absent = Some(why);
            }
        }
    }
}

impl fmt::Display for SystemIdentity {
    /// `uuid 674523a1-…, serial number ABC123`, with `absent (why)` for a missing field.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.uuid, &self.uuid_absent) {
            (Some(uuid), _) => write!(f, "uuid {uuid}")?,
            (None, why) => write!(f, "uuid absent ({})", why.as_deref().unwrap_or("unknown"))?,
        }
        match (&self.serial_number, &self.serial_number_absent) {
            (Some(serial), _) => write!(f, ", serial number {}", crate::text::escaped(serial)),
            (None, why) => write!(
                f,
                ", serial number absent ({})",
                why.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

/// Serial numbers firmware ships before a vendor sets one (compared case-insensitively):
/// they name no machine, so they never prove or disprove anything.
const PLACEHOLDER_SERIALS: [&str; 9] = [
    "to be filled by o.e.m.",
    "default string",
    "system serial number",
    "not specified",
    "not applicable",
    "none",
    "0",
    "0123456789",
    "123456789",
];

fn usable_serial(identity: &SystemIdentity) -> Option<&str> {
    identity
        .serial_number
        .as_deref()
        .filter(|s| !PLACEHOLDER_SERIALS.contains(&s.to_ascii_lowercase().as_str()))
}

/// What comparing a host's own identity (its agent's DMI read) with what a BMC says found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "result")]
pub enum IdentityMatch {
    /// The same machine; `by` says how it was told (`uuid`, `uuid (ipmi-reversed byte order)`,
    /// `serial number`).
    Same {
        /// How the match was made.
        by: String,
    },
    /// Another machine: both identities in the reason.
    Different {
        /// What differs, with both values.
        reason: String,
    },
    /// Nothing both sides name could be compared (each side's reason given).
    Unknown {
        /// Why not.
        reason: String,
    },
}

impl IdentityMatch {
    /// Whether the BMC was shown to belong to another machine.
    pub fn is_different(&self) -> bool {
        matches!(self, Self::Different { .. })
    }
}

/// Compares `host` (what the host's agent read from DMI) with `bmc` (what its BMC says).
///
/// The UUID decides when both sides have one: equal in text, or equal once the BMC's bytes
/// are read in another GUID byte order (firmware differs on it, and a byte order is not a
/// swapped cable), named in `by`. Only when a side has no UUID do serial numbers decide
/// (exact after trimming; vendor placeholders such as `To Be Filled By O.E.M.` decide
/// nothing). With neither, the answer is [`IdentityMatch::Unknown`], never a match.
pub fn compare(host: &SystemIdentity, bmc: &SystemIdentity) -> IdentityMatch {
    if let (Some(h), Some(b)) = (&host.uuid, &bmc.uuid) {
        if h == b {
            return IdentityMatch::Same { by: "uuid".into() };
        }
        if let Some((order, _)) = b.readings_of_ipmi_guid().iter().find(|(_, r)| r == h) {
            return IdentityMatch::Same {
                by: format!("uuid ({} byte order)", order.as_str()),
            };
        }
        return IdentityMatch::Different {
            reason: format!("the host's uuid is {h}, its BMC's is {b}"),
        };
    }
    match (usable_serial(host), usable_serial(bmc)) {
        (Some(h), Some(b)) if h == b => IdentityMatch::Same {
            by: "serial number".into(),
        },
        (Some(h), Some(b)) => IdentityMatch::Different {
            reason: format!(
                "the host's serial number is {}, its BMC's is {} (no uuid on {})",
                crate::text::escaped(h),
                crate::text::escaped(b),
                if host.uuid.is_none() {
                    "the host"
                } else {
                    "the BMC"
                }
            ),
        },
        _ => IdentityMatch::Unknown {
            reason: format!("nothing to compare: the host says {host}; its BMC says {bmc}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DSP0134 §7.2.1's own example.
    const SPEC_TEXT: &str = "00112233-4455-6677-8899-aabbccddeeff";
    const SPEC_WIRE: [u8; 16] = [
        0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE,
        0xFF,
    ];

    #[test]
    fn smbios_order_matches_the_specification_example() {
        let uuid = SystemUuid::from_guid_bytes(SPEC_WIRE, GuidByteOrder::Smbios);
        assert_eq!(uuid.to_string(), SPEC_TEXT);
        assert_eq!(uuid.to_guid_bytes(GuidByteOrder::Smbios), SPEC_WIRE);
    }

    #[test]
    fn the_other_orders_read_the_same_bytes_differently() {
        assert_eq!(
            SystemUuid::from_guid_bytes(SPEC_WIRE, GuidByteOrder::Rfc4122).to_string(),
            "33221100-5544-7766-8899-aabbccddeeff"
        );
        assert_eq!(
            SystemUuid::from_guid_bytes(SPEC_WIRE, GuidByteOrder::IpmiReversed).to_string(),
            "ffeeddcc-bbaa-9988-6677-445500112233"
        );
    }

    #[test]
    fn readings_of_an_ipmi_guid_cover_every_order_smbios_first() {
        let read = SystemUuid::from_guid_bytes(SPEC_WIRE, GuidByteOrder::Smbios);
        let readings = read.readings_of_ipmi_guid();
        assert_eq!(readings[0], (GuidByteOrder::Smbios, read));
        for (order, uuid) in readings {
            assert_eq!(
                uuid,
                SystemUuid::from_guid_bytes(SPEC_WIRE, order),
                "{order:?}"
            );
        }
    }

    #[test]
    fn text_parses_in_either_case_and_prints_lowercase() {
        let upper: SystemUuid = "00112233-4455-6677-8899-AABBCCDDEEFF".parse().unwrap();
        assert_eq!(upper.to_string(), SPEC_TEXT);
        assert_eq!(format!("{upper:?}"), format!("SystemUuid({SPEC_TEXT})"));
    }

    #[test]
    fn other_spellings_are_refused() {
        for bad in [
            "",
            "00112233445566778899aabbccddeeff",
            "{00112233-4455-6677-8899-aabbccddeeff}",
            "urn:uuid:00112233-4455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeefg",
            "0011223-34455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeef ",
            "+0112233-4455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeeffé",
        ] {
            assert_eq!(bad.parse::<SystemUuid>(), Err(UuidParseError), "{bad:?}");
        }
    }

    #[test]
    fn placeholders_are_absent_with_the_reason() {
        let mut identity = SystemIdentity::default();
        identity.set_uuid(Ok(SystemUuid::from_bytes([0; 16])));
        assert_eq!(identity.uuid, None);
        assert!(
            identity
                .uuid_absent
                .as_deref()
                .unwrap()
                .starts_with("placeholder uuid 00000000-")
        );
        identity.set_uuid(Ok(SystemUuid::from_bytes([0xFF; 16])));
        assert_eq!(identity.uuid, None);
        identity.set_uuid(Ok(SystemUuid::from_bytes([1; 16])));
        assert!(identity.uuid.is_some() && identity.uuid_absent.is_none());
    }

    #[test]
    fn serial_numbers_are_trimmed_and_refused_when_unusable() {
        let mut identity = SystemIdentity::default();
        identity.set_serial_number(Ok("  ABC-123\n"));
        assert_eq!(identity.serial_number.as_deref(), Some("ABC-123"));
        for (text, why) in [
            ("   ", "empty"),
            ("AB\u{1b}[2JC", "contains a control character"),
        ] {
            identity.set_serial_number(Ok(text));
            assert_eq!(identity.serial_number, None);
            assert_eq!(identity.serial_number_absent.as_deref(), Some(why));
        }
        identity.set_serial_number(Ok(&"9".repeat(MAX_SERIAL_NUMBER + 1)));
        assert!(
            identity
                .serial_number_absent
                .unwrap()
                .starts_with("129 bytes long")
        );
    }

    fn identity(uuid: Option<&str>, serial: Option<&str>) -> SystemIdentity {
        let mut id = SystemIdentity::default();
        id.set_uuid(uuid.map_or_else(|| Err("not sent".to_owned()), |u| Ok(u.parse().unwrap())));
        id.set_serial_number(serial.ok_or_else(|| "not sent".to_owned()));
        id
    }

    #[test]
    fn the_uuid_decides_in_any_byte_order_and_a_foreign_one_is_named_with_both() {
        let host = identity(Some(SPEC_TEXT), Some("ABC1"));
        assert_eq!(
            compare(&host, &identity(Some(SPEC_TEXT), Some("other"))),
            IdentityMatch::Same { by: "uuid".into() }
        );
        // A BMC that sends the SMBIOS bytes as if they were in RFC 4122 order.
        let bmc_says = SystemUuid::from_guid_bytes(SPEC_WIRE, GuidByteOrder::Rfc4122);
        assert_ne!(bmc_says.to_string(), SPEC_TEXT);
        match compare(&host, &identity(Some(&bmc_says.to_string()), None)) {
            IdentityMatch::Same { by } => assert!(by.ends_with(" byte order)"), "{by}"),
            other => panic!("{other:?}"),
        }
        let other = "10112233-4455-6677-8899-aabbccddeeff";
        assert_eq!(
            compare(&host, &identity(Some(other), Some("ABC1"))),
            IdentityMatch::Different {
                reason: format!("the host's uuid is {SPEC_TEXT}, its BMC's is {other}")
            }
        );
    }

    #[test]
    fn serial_numbers_decide_only_without_a_uuid_and_placeholders_decide_nothing() {
        let host = identity(None, Some("ABC1"));
        assert_eq!(
            compare(&host, &identity(Some(SPEC_TEXT), Some("ABC1"))),
            IdentityMatch::Same {
                by: "serial number".into()
            }
        );
        assert!(compare(&host, &identity(None, Some("XYZ9"))).is_different());
        let placeholder = identity(None, Some("To Be Filled By O.E.M."));
        assert!(matches!(
            compare(
                &placeholder,
                &identity(None, Some("To Be Filled By O.E.M."))
            ),
            IdentityMatch::Unknown { .. }
        ));
        match compare(&identity(None, None), &identity(None, None)) {
            IdentityMatch::Unknown { reason } => {
                assert!(reason.contains("uuid absent (not sent)"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn json_carries_text_and_leaves_absent_fields_out() {
        let mut identity = SystemIdentity::default();
        identity.set_uuid(SPEC_TEXT.parse().map_err(|_| String::new()));
        identity.set_serial_number(Err("permission denied".to_owned()));
        let json = serde_json::to_string(&identity).unwrap();
        assert_eq!(
            json,
            format!(r#"{{"uuid":"{SPEC_TEXT}","serial_number_absent":"permission denied"}}"#)
        );
        assert_eq!(
            serde_json::from_str::<SystemIdentity>(&json).unwrap(),
            identity
        );
        assert_eq!(
            identity.to_string(),
            format!("uuid {SPEC_TEXT}, serial number absent (permission denied)")
        );
        assert!(serde_json::from_str::<SystemIdentity>(r#"{"uuid":"nope"}"#).is_err());
        assert_eq!(
            serde_json::from_str::<SystemIdentity>("{}").unwrap(),
            SystemIdentity::default()
        );
    }

    proptest::proptest! {
        #[test]
        fn every_order_round_trips_and_text_round_trips(bytes in proptest::array::uniform16(proptest::num::u8::ANY)) {
            for order in GuidByteOrder::ALL {
                let uuid = SystemUuid::from_guid_bytes(bytes, order);
                proptest::prop_assert_eq!(uuid.to_guid_bytes(order), bytes);
            }
            let uuid = SystemUuid::from_bytes(bytes);
            let text = uuid.to_string();
            proptest::prop_assert_eq!(text.parse::<SystemUuid>(), Ok(uuid));
            proptest::prop_assert_eq!(text.to_uppercase().parse::<SystemUuid>(), Ok(uuid));
        }

        #[test]
        fn parsing_never_panics(text in ".{0,40}") {
            let _ = text.parse::<SystemUuid>();
        }
    }
}
