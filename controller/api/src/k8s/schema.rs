//! Validation the derived schemas cannot express on their own: Go-style duration strings,
//! `maxUnhealthy` as an int-or-percentage, BMC addresses and fingerprints, and CEL rules
//! (`x-kubernetes-validations`) that the API server checks on every write.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A duration the controller's parser ([`crate::duration::parse_duration`]) accepts: `"0"` or
/// a sequence of `<integer><unit>` with units `ms`, `s`, `m`, `h` (`"300s"`, `"1h30m"`).
pub const DURATION_PATTERN: &str = "^(0|([0-9]+(ms|s|m|h))+)$";

/// `maxUnhealthy` as a string: a bare number or a percentage from 0% to 100% (the pattern of
/// machine-api-operator's `MachineHealthCheck`).
pub const MAX_UNHEALTHY_PATTERN: &str = "^((100|[0-9]{1,2})%|[0-9]+)$";

/// A BMC address in a spelling `metalguard-bmc` parses, without credentials in the URL.
pub const BMC_ADDRESS_PATTERN: &str =
    "^((idrac-|ilo5-)?redfish([+-]https?)?|ipmi(\\+lanplus)?)://[^/@]+(/.*)?$";

/// A SHA-256 certificate fingerprint: 64 hex digits, optionally colon-separated pairs.
pub const FINGERPRINT_PATTERN: &str = "^([0-9A-Fa-f]{64}|([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2})$";

/// Schema of a duration string.
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": DURATION_PATTERN,
        "description": "A duration such as 300s, 10m or 1h30m (units ms, s, m, h); 0 disables.",
    })
}

/// Schema of `maxUnhealthy`: an integer of at least 0 or a string matching
/// [`MAX_UNHEALTHY_PATTERN`] (the pattern applies to strings only; the CEL rule to integers).
pub fn max_unhealthy(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "pattern": MAX_UNHEALTHY_PATTERN,
        "x-kubernetes-validations": [{
            "rule": "type(self) == int ? self >= 0 : true",
            "message": "maxUnhealthy must not be negative",
        }],
        "description": "How many selected hosts may be unhealthy for remediation to go ahead: \
                        an integer, a bare number (\"2\") or a percentage (\"40%\", rounded down). \
                        Default 100%, or 1 when every selected host is a control-plane host.",
    })
}
