//! The executing agent's identity check before it cuts a host's power: the system behind the
//! BMC must be the machine the target's own agent says it runs on
//! ([`FenceCommand::expected_identity`]). A BMC that answers for another server (a swapped
//! cable, a copied inventory line, another server's address with valid credentials) is
//! refused before any power command; both identities are in the refusal.
//!
//! Only a proven mismatch refuses. An identity the BMC cannot give, or nothing both sides
//! name, lets the fence go on with a note in its timeline: at 3 a.m. a BMC quirk must not
//! turn into a host nobody can fence (the scheduled checks report such a BMC beforehand).

use std::time::Duration;

use metalguard_api::identity::{IdentityMatch, SystemIdentity, compare};
use metalguard_api::protocol::{FenceCommand, PowerAction};
use metalguard_bmc::ReadIdentity as _;

/// How long the identity read may take (one Redfish GET or one IPMI command; the fence's own
/// calls have their own timeouts).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks the identity behind `bmc` for `command`: `Ok(note)` to go on (with what was found,
/// for the timeline), `Err(refusal)` when the BMC answers for another machine.
pub async fn check(
    bmc: &mut metalguard_bmc::Bmc,
    command: &FenceCommand,
) -> Result<Option<String>, String> {
    let Some(expected) = command.expected_identity.as_deref() else {
        return Ok(None);
    };
    if command.action == PowerAction::On {
        return Ok(None);
    }
    let read = match tokio::time::timeout(READ_TIMEOUT, bmc.identity()).await {
        Ok(Ok(seen)) => Ok(seen),
        Ok(Err(err)) => Err(super::execute::error_chain(&err)),
        Err(_) => Err(format!("no answer within {READ_TIMEOUT:?}")),
    };
    judge(&command.target, expected, read)
}

/// [`check`]'s decision on what was read.
pub fn judge(
    target: &str,
    expected: &SystemIdentity,
    read: Result<SystemIdentity, String>,
) -> Result<Option<String>, String> {
    let seen = match read {
        Ok(seen) => seen,
        Err(why) => {
            tracing::warn!(target_host = %target, error = %why, "the bmc's system identity could not be read; fencing without the identity check");
            return Ok(Some(format!(
                "identity not checked: the BMC's system identity could not be read ({why})"
            )));
        }
    };
    match compare(expected, &seen) {
        IdentityMatch::Same { by } => Ok(Some(format!(
            "identity checked: the BMC's system is {target} (matched by {by})"
        ))),
        IdentityMatch::Unknown { reason } => {
            tracing::warn!(target_host = %target, %reason, "the bmc's system identity could not be compared; fencing without the identity check");
            Ok(Some(format!("identity not checked: {reason}")))
        }
        IdentityMatch::Different { reason } => Err(format!(
            "the BMC given for {target} answers for another machine: {reason}; no power command was sent (fix the BMC address or the cabling; the host says it is {expected}, the BMC says {seen})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(uuid: &str, serial: &str) -> SystemIdentity {
        let mut id = SystemIdentity::default();
        id.set_uuid(Ok(uuid.parse().unwrap()));
        id.set_serial_number(Ok(serial));
        id
    }

    const CP1: &str = "4c4c4544-0031-3110-8050-b1c04f4e3132";
    const CP2: &str = "4c4c4544-0032-3110-8050-b1c04f4e3132";

    #[test]
    fn another_machine_behind_the_bmc_is_refused_with_both_identities() {
        let refusal = judge("cp-1", &identity(CP1, "SN1"), Ok(identity(CP2, "SN2"))).unwrap_err();
        assert!(refusal.contains(CP1) && refusal.contains(CP2), "{refusal}");
        assert!(refusal.contains("no power command was sent"), "{refusal}");
    }

    #[test]
    fn the_same_machine_or_one_that_cannot_be_told_goes_on_with_a_note() {
        let same = judge("cp-1", &identity(CP1, "SN1"), Ok(identity(CP1, "SN1"))).unwrap();
        assert_eq!(
            same.as_deref(),
            Some("identity checked: the BMC's system is cp-1 (matched by uuid)")
        );
        let unread = judge("cp-1", &identity(CP1, "SN1"), Err("timed out".into())).unwrap();
        assert!(unread.unwrap().contains("could not be read (timed out)"));
        let bare = judge("cp-1", &identity(CP1, "SN1"), Ok(SystemIdentity::default())).unwrap();
        assert!(
            bare.unwrap()
                .starts_with("identity not checked: nothing to compare")
        );
    }
}
