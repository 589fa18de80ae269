//! The identity a Redfish `ComputerSystem` gives: its `UUID` and `SerialNumber`.
//!
//! The Redfish schema asks for the UUID in the canonical `8-4-4-4-12` text, converted from the
//! SMBIOS bytes the way current operating systems print it (dmidecode, WMI), so it compares
//! with the host's `/sys/class/dmi/id/product_uuid` as text. Anything else the BMC sends in
//! these properties makes the field absent with the reason, never an error: power control of
//! the same System must keep working.

use serde_json::Value;

use super::models::ComputerSystem;
use crate::error::bmc_text;
use crate::identity::{SystemIdentity, SystemUuid};

/// The identity `system` gives.
pub fn identity_of(system: &ComputerSystem) -> SystemIdentity {
    let mut identity = SystemIdentity::default();
    identity.set_uuid(uuid_of(system.uuid.as_ref()));
    identity.set_serial_number(text_of("SerialNumber", system.serial_number.as_ref()));
    identity
}

fn uuid_of(value: Option<&Value>) -> Result<SystemUuid, String> {
    let text = text_of("UUID", value)?;
    text.trim()
        .parse()
        .map_err(|_| format!("the system's UUID \"{}\" is not a uuid", bmc_text(text)))
}

fn text_of<'a>(property: &str, value: Option<&'a Value>) -> Result<&'a str, String> {
    match value {
        None | Some(Value::Null) => Err(format!("the system reports no {property}")),
        Some(Value::String(text)) => Ok(text),
        Some(_) => Err(format!("the system's {property} is not a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn system(json: &str) -> ComputerSystem {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn uuid_and_serial_number_are_read_and_the_uuid_lowercased() {
        let identity = identity_of(&system(
            r#"{"UUID":"674523A1-AB89-EFCD-A123-456789ABCDEF","SerialNumber":" SN-1 "}"#,
        ));
        assert_eq!(
            identity.uuid.unwrap().to_string(),
            "674523a1-ab89-efcd-a123-456789abcdef"
        );
        assert_eq!(identity.serial_number.as_deref(), Some("SN-1"));
        assert_eq!(identity.uuid_absent, None);
        assert_eq!(identity.serial_number_absent, None);
    }

    #[test]
    fn what_is_missing_or_unusable_is_absent_with_the_reason() {
        let identity = identity_of(&system(r#"{"PowerState":"On"}"#));
        assert_eq!(
            identity.uuid_absent.as_deref(),
            Some("the system reports no UUID")
        );
        assert_eq!(
            identity.serial_number_absent.as_deref(),
            Some("the system reports no SerialNumber")
        );
        let identity = identity_of(&system(r#"{"UUID":7,"SerialNumber":""}"#));
        assert_eq!(
            identity.uuid_absent.as_deref(),
            Some("the system's UUID is not a string")
        );
        assert_eq!(identity.serial_number_absent.as_deref(), Some("empty"));
        let identity = identity_of(&system(
            r#"{"UUID":"00000000-0000-0000-0000-000000000000"}"#,
        ));
        assert!(
            identity
                .uuid_absent
                .as_deref()
                .unwrap()
                .starts_with("placeholder uuid"),
            "{identity:?}"
        );
    }

    #[test]
    fn a_hostile_uuid_is_quoted_escaped_and_cut() {
        let hostile = "\u{1b}[2J".repeat(10_000);
        let json = serde_json::json!({ "UUID": hostile }).to_string();
        let why = identity_of(&system(&json)).uuid_absent.unwrap();
        assert!(why.starts_with("the system's UUID \"\\u{1b}[2J"), "{why}");
        assert!(why.len() < 400 && !why.contains('\u{1b}'), "{why}");
    }

    /// Against a scripted BMC: one GET of the System, no POST, and power control of the same
    /// System still works afterwards (the discovery is shared).
    #[tokio::test]
    async fn identity_reads_the_system_the_power_operations_use_and_posts_nothing() {
        use crate::redfish::tests::{ROOT, client, json, serve};
        use crate::{PowerControl, PowerState, ReadIdentity};

        let server = serve(|req| {
            Some(match req.path.as_str() {
                "/redfish/v1" => json(200, ROOT),
                "/redfish/v1/Systems" => json(
                    200,
                    r#"{"Members":[{"@odata.id":"/redfish/v1/Systems/1"}]}"#,
                ),
                "/redfish/v1/Systems/1" => json(
                    200,
                    r#"{"Id":"1","PowerState":"Off","UUID":"674523a1-ab89-efcd-a123-456789abcdef",
                       "SerialNumber":"SN-42"}"#,
                ),
                _ => json(404, "{}"),
            })
        })
        .await;
        let mut bmc = client(&server.url);
        let identity = bmc.identity().await.unwrap();
        assert_eq!(
            identity.to_string(),
            "uuid 674523a1-ab89-efcd-a123-456789abcdef, serial number SN-42"
        );
        assert_eq!(bmc.power_state().await.unwrap(), PowerState::Off);
        let lines: Vec<String> = server
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert_eq!(
            lines,
            [
                "GET /redfish/v1",
                "GET /redfish/v1/Systems",
                "GET /redfish/v1/Systems/1",
                "GET /redfish/v1/Systems/1",
            ]
        );
        assert!(
            bmc.timeline_mut()
                .entries()
                .iter()
                .any(|e| e.what.contains("identity: uuid 674523a1")),
            "{}",
            bmc.timeline_mut()
        );
    }

    #[tokio::test]
    async fn refused_credentials_are_an_error_not_an_absent_identity() {
        use crate::redfish::tests::{client, json, serve};
        use crate::{BmcError, ReadIdentity};

        let server = serve(|_| Some(json(401, r#"{"error":{"message":"no"}}"#))).await;
        let error = client(&server.url).identity().await.unwrap_err();
        assert!(
            matches!(error, BmcError::Authentication { .. }),
            "{error:?}"
        );
    }
}
