//! Power states and BMC capabilities, shared by both protocols.

use std::fmt;

/// The power state a BMC reports for its host.
///
/// Only [`PowerState::Off`] means the host is off: a transitional state such as
/// [`PowerState::PoweringOff`] is *not* off, and neither is a value this crate does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerState {
    /// The host is powered on.
    On,
    /// The host is powered off. The only state that counts as fenced.
    Off,
    /// The BMC is turning the host on.
    PoweringOn,
    /// The BMC is turning the host off; not yet off.
    PoweringOff,
    /// A value the BMC sent that this crate does not know, kept verbatim.
    Unknown(String),
}

impl PowerState {
    /// Whether this state proves the host is off.
    pub fn is_off(&self) -> bool {
        matches!(self, Self::Off)
    }

    /// Whether this state proves the host is on.
    pub fn is_on(&self) -> bool {
        matches!(self, Self::On)
    }

    /// Maps a Redfish `PowerState` string; unknown values are kept, never guessed.
    pub fn from_redfish(value: &str) -> Self {
        match value {
            "On" => Self::On,
            "Off" => Self::Off,
            "PoweringOn" => Self::PoweringOn,
            "PoweringOff" => Self::PoweringOff,
            // A BMC's own word, quoted in errors and timelines: escaped and cut.
            other => Self::Unknown(crate::error::bmc_text(other)),
        }
    }

    /// A short lowercase name for output (`on`, `off`, `powering-on`, ...).
    pub fn as_str(&self) -> &str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::PoweringOn => "powering-on",
            Self::PoweringOff => "powering-off",
            Self::Unknown(other) => other,
        }
    }
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(other) => write!(f, "unknown ({other})"),
            known => f.write_str(known.as_str()),
        }
    }
}

/// The power operations a BMC says it supports.
///
/// For Redfish this comes from `ResetType@Redfish.AllowableValues`; for IPMI from the chassis
/// capabilities (all chassis control commands are mandatory there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(clippy::struct_excessive_bools)] // one flag per independent BMC feature
pub struct Capabilities {
    /// Power on is supported.
    pub power_on: bool,
    /// An immediate (non-graceful) power off is supported.
    pub force_off: bool,
    /// A graceful (ACPI) shutdown is supported.
    pub graceful_off: bool,
    /// A hard reset (reset without power loss) is supported.
    pub hard_reset: bool,
    /// A power cycle (off then on by the BMC) is supported.
    pub power_cycle: bool,
}

#[cfg(test)]
mod tests {
    use super::PowerState;

    #[test]
    fn only_off_is_off() {
        assert!(PowerState::Off.is_off());
        for state in [
            PowerState::On,
            PowerState::PoweringOff,
            PowerState::PoweringOn,
            PowerState::Unknown("Paused".into()),
        ] {
            assert!(!state.is_off(), "{state} must not count as off");
        }
    }

    #[test]
    fn redfish_values_map_and_unknown_is_kept() {
        assert_eq!(
            PowerState::from_redfish("PoweringOff"),
            PowerState::PoweringOff
        );
        assert_eq!(
            PowerState::from_redfish("off"),
            PowerState::Unknown("off".into())
        );
        assert_eq!(
            PowerState::from_redfish("Paused").to_string(),
            "unknown (Paused)"
        );
    }
}
