//! Hand-written serde models of the few Redfish resources metalguard reads.
//!
//! Every field is optional or defaulted and unknown fields and enum values are tolerated:
//! BMC firmware varies, and a newer `PowerState` or `ResetType` value must not break decoding
//! (redfish-codegen's generated enums do; see `docs/design-bmc.md`). Strings stay strings here;
//! [`crate::PowerState::from_redfish`] maps them.

use serde::{Deserialize, Serialize};

/// `{"@odata.id": "..."}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Link {
    /// The linked resource's URI.
    #[serde(rename = "@odata.id", default)]
    pub odata_id: Option<String>,
}

/// `/redfish/v1`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceRoot {
    /// The Systems collection.
    #[serde(default)]
    pub systems: Option<Link>,
    /// The SessionService, when the BMC offers one.
    #[serde(default)]
    pub session_service: Option<Link>,
    /// `Links.Sessions`, the collection to POST a session to.
    #[serde(default)]
    pub links: Option<RootLinks>,
}

/// `Links` of the service root.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RootLinks {
    /// The session collection.
    #[serde(default)]
    pub sessions: Option<Link>,
}

/// Any resource collection.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Collection {
    /// The members.
    #[serde(rename = "Members", default)]
    pub members: Vec<Link>,
}

/// A `ComputerSystem`, reduced to what power control needs.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ComputerSystem {
    /// `Id`.
    #[serde(default)]
    pub id: Option<String>,
    /// `PowerState` verbatim (`On`, `Off`, `PoweringOn`, `PoweringOff`, or anything newer).
    #[serde(default)]
    pub power_state: Option<String>,
    /// `Actions`.
    #[serde(default)]
    pub actions: Option<SystemActions>,
    /// `UUID`, as any JSON value: a malformed identity must not make the System, and with it
    /// power control, undecodable. Mapped by `redfish::identity`.
    #[serde(rename = "UUID", default)]
    pub uuid: Option<serde_json::Value>,
    /// `SerialNumber`, as any JSON value (same reason as `uuid`).
    #[serde(rename = "SerialNumber", default)]
    pub serial_number: Option<serde_json::Value>,
}

/// `Actions` of a `ComputerSystem`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SystemActions {
    /// `#ComputerSystem.Reset`.
    #[serde(rename = "#ComputerSystem.Reset", default)]
    pub reset: Option<ResetAction>,
}

/// `#ComputerSystem.Reset`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResetAction {
    /// The URI to POST to.
    #[serde(default)]
    pub target: Option<String>,
    /// `ResetType@Redfish.AllowableValues`.
    #[serde(rename = "ResetType@Redfish.AllowableValues", default)]
    pub allowable_values: Option<Vec<String>>,
    /// `@Redfish.ActionInfo`, where some BMCs put the allowable values instead.
    #[serde(rename = "@Redfish.ActionInfo", default)]
    pub action_info: Option<String>,
}

/// An `ActionInfo` resource.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ActionInfo {
    /// `Parameters`.
    #[serde(rename = "Parameters", default)]
    pub parameters: Vec<ActionParameter>,
}

/// One parameter of an `ActionInfo`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ActionParameter {
    /// `Name`.
    #[serde(rename = "Name", default)]
    pub name: Option<String>,
    /// `AllowableValues`.
    #[serde(rename = "AllowableValues", default)]
    pub allowable_values: Option<Vec<String>>,
}

/// The body of a reset request.
#[derive(Debug, Clone, Serialize)]
pub struct ResetRequest<'a> {
    /// The chosen `ResetType`.
    #[serde(rename = "ResetType")]
    pub reset_type: &'a str,
}

/// A Redfish error answer (`{"error": {...}}`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorBody {
    /// The error object.
    #[serde(default)]
    pub error: Option<ErrorDetail>,
}

/// The `error` object of a Redfish error answer.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ErrorDetail {
    /// `message`.
    #[serde(default)]
    pub message: Option<String>,
    /// `@Message.ExtendedInfo`.
    #[serde(rename = "@Message.ExtendedInfo", default)]
    pub extended_info: Vec<ExtendedInfo>,
}

/// One `@Message.ExtendedInfo` entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExtendedInfo {
    /// `Message`.
    #[serde(rename = "Message", default)]
    pub message: Option<String>,
    /// `MessageId`.
    #[serde(rename = "MessageId", default)]
    pub message_id: Option<String>,
}

impl ErrorBody {
    /// The most specific message the BMC gave, if any, shortened to one line of 200 characters.
    pub fn summary(&self) -> Option<String> {
        let error = self.error.as_ref()?;
        let text = error
            .extended_info
            .iter()
            .find_map(|info| info.message.clone().or_else(|| info.message_id.clone()))
            .or_else(|| error.message.clone())?;
        let one_line: String = text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(200)
            .collect();
        Some(one_line)
    }
}

#[cfg(test)]
mod tests {
    use super::{ComputerSystem, ErrorBody, ServiceRoot};

    #[test]
    fn system_with_unknown_values_decodes() {
        let json = r##"{"@odata.id":"/redfish/v1/Systems/1","Id":"1","PowerState":"Paused",
            "Boot":{"BootSourceOverrideTarget":"Hologram"},
            "Actions":{"#ComputerSystem.Reset":{"target":"/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues":["On","ForceOff","QuantumReset"]},"Oem":{}}}"##;
        let system: ComputerSystem = serde_json::from_str(json).unwrap();
        assert_eq!(system.power_state.as_deref(), Some("Paused"));
        let reset = system.actions.unwrap().reset.unwrap();
        assert_eq!(reset.allowable_values.unwrap()[2], "QuantumReset");
    }

    #[test]
    fn identity_fields_of_any_type_leave_the_system_decodable() {
        for identity in [
            r#""UUID":"674523a1-ab89-efcd-a123-456789abcdef","SerialNumber":"SN1""#,
            r#""UUID":42,"SerialNumber":{"a":[1]}"#,
            r#""UUID":null,"SerialNumber":null"#,
        ] {
            let json = format!(r#"{{"Id":"1","PowerState":"On",{identity}}}"#);
            let system: ComputerSystem = serde_json::from_str(&json).unwrap();
            assert_eq!(system.power_state.as_deref(), Some("On"), "{identity}");
        }
    }

    #[test]
    fn root_links_and_errors() {
        let root: ServiceRoot = serde_json::from_str(
            r#"{"Systems":{"@odata.id":"/redfish/v1/Systems"},
               "SessionService":{"@odata.id":"/redfish/v1/SessionService"},
               "Links":{"Sessions":{"@odata.id":"/redfish/v1/SessionService/Sessions"}}}"#,
        )
        .unwrap();
        assert_eq!(
            root.links.unwrap().sessions.unwrap().odata_id.as_deref(),
            Some("/redfish/v1/SessionService/Sessions")
        );
        let body: ErrorBody = serde_json::from_str(
            r#"{"error":{"code":"Base.1.0.GeneralError","message":"general",
               "@Message.ExtendedInfo":[{"MessageId":"Base.1.0.ActionParameterNotSupported",
               "Message":"The parameter ResetType\nis not supported"}]}}"#,
        )
        .unwrap();
        assert_eq!(
            body.summary().as_deref(),
            Some("The parameter ResetType is not supported")
        );
    }

    /// Decodes every model from `bytes` and exercises the derived helpers; must never panic.
    fn decode_all(bytes: &[u8]) {
        let _ = serde_json::from_slice::<ServiceRoot>(bytes);
        let _ = serde_json::from_slice::<super::Collection>(bytes);
        if let Ok(system) = serde_json::from_slice::<ComputerSystem>(bytes) {
            let _ = system
                .power_state
                .as_deref()
                .map(crate::PowerState::from_redfish);
            let _ = crate::redfish::identity::identity_of(&system);
        }
        let _ = serde_json::from_slice::<super::ActionInfo>(bytes);
        if let Ok(body) = serde_json::from_slice::<ErrorBody>(bytes) {
            let _ = body.summary();
        }
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec![
            "Systems",
            "Members",
            "@odata.id",
            "PowerState",
            "Actions",
            "#ComputerSystem.Reset",
            "target",
            "ResetType@Redfish.AllowableValues",
            "@Redfish.ActionInfo",
            "Parameters",
            "Name",
            "AllowableValues",
            "error",
            "message",
            "@Message.ExtendedInfo",
            "Message",
            "MessageId",
            "Links",
            "Sessions",
            "UUID",
            "SerialNumber",
        ]);
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(serde_json::Value::from),
            ".{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(serde_json::Value::from),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|pairs| {
                    serde_json::Value::Object(
                        pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                    )
                }),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic_on_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            decode_all(&bytes);
        }

        #[test]
        fn decoders_never_panic_on_redfish_shaped_json(value in json_value()) {
            let bytes = serde_json::to_vec(&value).unwrap();
            decode_all(&bytes);
            // Truncations of valid JSON too.
            for cut in [bytes.len() / 3, bytes.len() / 2, bytes.len().saturating_sub(1)] {
                decode_all(&bytes[..cut]);
            }
        }
    }
}
