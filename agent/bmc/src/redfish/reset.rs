//! Choosing a `ResetType` for a power command from what the BMC allows.

use crate::PowerState;

/// What a power command asks for, before a `ResetType` is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResetKind {
    On,
    ForceOff,
    GracefulOff,
    HardReset,
    PowerCycle,
}

impl ResetKind {
    /// `ResetType` values that do this, best first.
    pub(super) fn candidates(self) -> &'static [&'static str] {
        match self {
            Self::On => &["On", "ForceOn"],
            Self::ForceOff => &["ForceOff"],
            Self::GracefulOff => &["GracefulShutdown"],
            Self::HardReset => &["ForceRestart"],
            Self::PowerCycle => &["PowerCycle"],
        }
    }

    pub(super) fn operation(self) -> &'static str {
        match self {
            Self::On => "power on",
            Self::ForceOff => "power off",
            Self::GracefulOff => "graceful shutdown",
            Self::HardReset => "hard reset",
            Self::PowerCycle => "power cycle",
        }
    }

    /// Whether `state` shows the command already took effect (only for verifiable commands).
    pub(super) fn done_in(self, state: &PowerState) -> bool {
        match self {
            Self::On => state.is_on(),
            Self::ForceOff => state.is_off(),
            Self::GracefulOff | Self::HardReset | Self::PowerCycle => false,
        }
    }

    pub(super) fn verifiable(self) -> bool {
        matches!(self, Self::On | Self::ForceOff)
    }
}

/// Picks the `ResetType` for `kind` from what the BMC allows (`None`: not advertised, assume
/// the standard value).
pub(super) fn choose_reset_type(
    kind: ResetKind,
    allowed: Option<&[String]>,
) -> Result<&'static str, Vec<String>> {
    let candidates = kind.candidates();
    match allowed {
        None => Ok(candidates[0]),
        Some(allowed) => candidates
            .iter()
            .find(|c| allowed.iter().any(|a| a == *c))
            .copied()
            .ok_or_else(|| allowed.to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::{ResetKind, choose_reset_type};

    #[test]
    fn reset_type_comes_from_the_allowed_list() {
        let allowed: Vec<String> = ["ForceOn", "ForceOff"].map(String::from).to_vec();
        assert_eq!(
            choose_reset_type(ResetKind::On, Some(&allowed)),
            Ok("ForceOn")
        );
        assert_eq!(choose_reset_type(ResetKind::On, None), Ok("On"));
        assert_eq!(
            choose_reset_type(ResetKind::PowerCycle, Some(&allowed)),
            Err(allowed.clone())
        );
        assert_eq!(
            choose_reset_type(ResetKind::ForceOff, Some(&[])),
            Err(vec![])
        );
    }
}
