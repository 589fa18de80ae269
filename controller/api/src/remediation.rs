//! The remediation record and its explicit state machine (seed 003, DOMAIN.md §3, CAPBM).
//!
//! ```text
//! detected → gated → powering-off → verified-off → backed-up → node-removed → powering-on
//!          → waiting-for-node → restored → done
//! reboot strategy:      verified-off → powering-on, waiting-for-node → done
//! cancellation:         detected | gated → cancelled (clean)
//!                       powering-off | verified-off | backed-up → powering-on → … → cancelled
//! failure:              any live phase → failed → needs-a-person | reprovisioning
//! ```
//! A retry is a new remediation (next sequence number), never a transition out of a terminal
//! phase.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::Timestamp;
use crate::policy::{NodeHandling, Strategy};

/// The phase of one remediation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "phase")]
pub enum RemediationPhase {
    /// The target was found unhealthy (or a fence was requested).
    Detected,
    /// Every gate passed; intent is persisted, nothing destructive done yet.
    Gated,
    /// Power-off was requested from the BMC.
    PoweringOff,
    /// The BMC reported the host off.
    VerifiedOff,
    /// The Node's labels and annotations are saved in the remediation.
    BackedUp,
    /// The Node was deleted or tainted out-of-service.
    NodeRemoved,
    /// Power-on was requested.
    PoweringOn,
    /// The host is on; waiting for its Node to (re-)register and become Ready.
    WaitingForNode,
    /// Saved labels and annotations were merged back (keys on the new Node win).
    Restored,
    /// Finished successfully.
    Done,
    /// This attempt failed.
    Failed {
        /// Why.
        reason: String,
    },
    /// metalguard will not act further on this host; a person must.
    NeedsPerson {
        /// Why.
        reason: String,
    },
    /// Handed to the provisioner to be reprovisioned.
    Reprovisioning,
    /// Cancelled; the host was left (or put back) powered on.
    Cancelled {
        /// Why.
        reason: String,
    },
}

/// A transition the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("remediation cannot go from {from} to {to}")]
pub struct IllegalTransition {
    /// The phase the remediation was in.
    pub from: String,
    /// The phase that was asked for.
    pub to: String,
}

impl RemediationPhase {
    /// A short, stable name of the phase (used in ids and text).
    pub fn name(&self) -> &'static str {
        match self {
            RemediationPhase::Detected => "detected",
            RemediationPhase::Gated => "gated",
            RemediationPhase::PoweringOff => "powering-off",
            RemediationPhase::VerifiedOff => "verified-off",
            RemediationPhase::BackedUp => "backed-up",
            RemediationPhase::NodeRemoved => "node-removed",
            RemediationPhase::PoweringOn => "powering-on",
            RemediationPhase::WaitingForNode => "waiting-for-node",
            RemediationPhase::Restored => "restored",
            RemediationPhase::Done => "done",
            RemediationPhase::Failed { .. } => "failed",
            RemediationPhase::NeedsPerson { .. } => "needs-a-person",
            RemediationPhase::Reprovisioning => "reprovisioning",
            RemediationPhase::Cancelled { .. } => "cancelled",
        }
    }

    /// True for phases no transition leaves.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            RemediationPhase::Done
                | RemediationPhase::NeedsPerson { .. }
                | RemediationPhase::Reprovisioning
                | RemediationPhase::Cancelled { .. }
        )
    }

    /// True while the remediation holds its target (not terminal and not failed).
    pub fn is_active(&self) -> bool {
        !self.is_terminal() && !matches!(self, RemediationPhase::Failed { .. })
    }

    /// True once power-off may have taken effect (the host must be powered back on if cancelled).
    pub fn power_may_be_off(&self) -> bool {
        matches!(
            self,
            RemediationPhase::PoweringOff
                | RemediationPhase::VerifiedOff
                | RemediationPhase::BackedUp
                | RemediationPhase::NodeRemoved
                | RemediationPhase::PoweringOn
        )
    }

    /// True when the state machine allows going from `self` to `next`.
    pub fn can_transition_to(&self, next: &RemediationPhase) -> bool {
        use RemediationPhase as P;
        if matches!(next, P::Failed { .. }) {
            return self.is_active();
        }
        match self {
            P::Detected => matches!(next, P::Gated | P::Cancelled { .. }),
            P::Gated => matches!(next, P::PoweringOff | P::Cancelled { .. }),
            // Cancelled from PoweringOff only when the power-off was never answered and a
            // newer leadership withdrew it: the target reported healthy to that leadership
            // (the controller's re-validation of an inherited power cut). The planner never
            // cancels from here; it powers back on.
            P::PoweringOff => matches!(next, P::VerifiedOff | P::PoweringOn | P::Cancelled { .. }),
            P::VerifiedOff => matches!(next, P::BackedUp | P::PoweringOn),
            P::BackedUp => matches!(next, P::NodeRemoved | P::PoweringOn),
            P::NodeRemoved => matches!(next, P::PoweringOn),
            P::PoweringOn => matches!(next, P::WaitingForNode),
            P::WaitingForNode => matches!(next, P::Restored | P::Done | P::Cancelled { .. }),
            P::Restored => matches!(next, P::Done | P::Cancelled { .. }),
            P::Failed { .. } => matches!(next, P::NeedsPerson { .. } | P::Reprovisioning),
            P::Done | P::NeedsPerson { .. } | P::Reprovisioning | P::Cancelled { .. } => false,
        }
    }

    /// Moves to `next`, or rejects an illegal transition.
    pub fn transition(self, next: RemediationPhase) -> Result<RemediationPhase, IllegalTransition> {
        if self.can_transition_to(&next) {
            Ok(next)
        } else {
            Err(IllegalTransition {
                from: self.name().to_owned(),
                to: next.name().to_owned(),
            })
        }
    }
}

impl fmt::Display for RemediationPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemediationPhase::Failed { reason }
            | RemediationPhase::NeedsPerson { reason }
            | RemediationPhase::Cancelled { reason } => write!(f, "{} ({reason})", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// The Node's labels and annotations saved before the Node is removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeBackup {
    /// Saved labels.
    pub labels: BTreeMap<String, String>,
    /// Saved annotations.
    pub annotations: BTreeMap<String, String>,
}

/// One remediation of one target, as persisted by the executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remediation {
    /// Stable id: `remediation/<target>/<seq>`.
    pub id: String,
    /// The host being remediated.
    pub target: String,
    /// Per-target sequence number (1 for the first remediation ever of this target).
    pub seq: u32,
    /// Attempt number within the current retry window (1 = first attempt).
    pub attempt: u32,
    /// The agent host that drives the target's BMC (never the target itself).
    pub executor: String,
    /// Power-cycle strategy chosen at start.
    pub strategy: Strategy,
    /// Node handling chosen at start.
    pub node_handling: NodeHandling,
    /// Current phase.
    pub phase: RemediationPhase,
    /// When the remediation started.
    pub started_at: Timestamp,
    /// When the current phase was entered.
    pub phase_since: Timestamp,
    /// The target is a control-plane host.
    pub control_plane: bool,
    /// Why the remediation started (unhealthy reason or admin request).
    pub cause: String,
    /// Set when an administrator forced the fence past the policy gates: the recorded reason.
    #[serde(default)]
    pub forced: Option<String>,
    /// Set when cancellation was requested, with the reason.
    #[serde(default)]
    pub cancel_requested: Option<String>,
    /// The Node metadata backup, once taken.
    #[serde(default)]
    pub backup: Option<NodeBackup>,
    /// When the target was verified powered on again (the remediation entered
    /// `waiting-for-node`): the host's boot. Health evidence older than this describes the
    /// host before its fence and is not held against it (see `metalguard-core::health`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub powered_on_at: Option<Timestamp>,
    /// Power off and leave off (an administrator's `PowerOff` fence): after the Node is
    /// handled, the remediation ends needing a person instead of powering the host on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stay_off: bool,
    /// The target's boot ID when the remediation started (its agent's last report): the
    /// remediation is done only once the target reports another one after its verified
    /// power-on, the evidence that it really booted (a BMC that says "on" and does nothing is
    /// caught). `None` when it was never known: readiness alone decides then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_before: Option<String>,
}

impl Remediation {
    /// True when this remediation may go to `next`: the phase machine's transitions, and
    /// for a stay-off remediation, from `node-removed` to `needs-a-person` (left off).
    pub fn may_step_to(&self, next: &RemediationPhase) -> bool {
        self.phase.can_transition_to(next)
            || (self.stay_off
                && self.phase == RemediationPhase::NodeRemoved
                && matches!(next, RemediationPhase::NeedsPerson { .. }))
    }
}

/// Builds the stable id of a remediation.
pub fn remediation_id(target: &str, seq: u32) -> String {
    format!("remediation/{target}/{seq}")
}

impl Remediation {
    /// Moves the remediation to `next` at `at`, or rejects an illegal transition.
    pub fn advance(
        &mut self,
        next: RemediationPhase,
        at: Timestamp,
    ) -> Result<(), IllegalTransition> {
        if !self.may_step_to(&next) {
            return Err(IllegalTransition {
                from: self.phase.name().to_owned(),
                to: next.name().to_owned(),
            });
        }
        let current = std::mem::replace(&mut self.phase, RemediationPhase::Detected);
        // A stay-off remediation's last step is legal by `may_step_to`, not by the phases alone.
        let moved = if self.stay_off && current == RemediationPhase::NodeRemoved {
            Ok(next)
        } else {
            current.clone().transition(next)
        };
        match moved {
            Ok(p) => {
                if p == RemediationPhase::WaitingForNode {
                    self.powered_on_at = Some(at);
                }
                self.phase = p;
                self.phase_since = at;
                Ok(())
            }
            Err(e) => {
                self.phase = current;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RemediationPhase as P;
    use super::*;

    fn failed() -> P {
        P::Failed { reason: "x".into() }
    }

    #[test]
    fn happy_path_is_legal() {
        let path = [
            P::Detected,
            P::Gated,
            P::PoweringOff,
            P::VerifiedOff,
            P::BackedUp,
            P::NodeRemoved,
            P::PoweringOn,
            P::WaitingForNode,
            P::Restored,
            P::Done,
        ];
        let mut p = P::Detected;
        for next in path.into_iter().skip(1) {
            p = p.transition(next).unwrap();
        }
        assert!(p.is_terminal());
    }

    #[test]
    fn reboot_path_skips_node_handling() {
        let p = P::VerifiedOff.transition(P::PoweringOn).unwrap();
        let p = p.transition(P::WaitingForNode).unwrap();
        assert_eq!(p.transition(P::Done), Ok(P::Done));
    }

    #[test]
    fn illegal_transitions_are_rejected() {
        assert!(P::Detected.transition(P::PoweringOff).is_err());
        assert!(P::Gated.transition(P::VerifiedOff).is_err());
        assert!(P::NodeRemoved.transition(P::Done).is_err());
        assert!(P::Done.transition(failed()).is_err());
        assert!(P::Done.transition(P::Detected).is_err());
        let cancelled = P::Cancelled { reason: "r".into() };
        // Cancelling after power-off was requested must go through power-on.
        assert!(P::VerifiedOff.transition(cancelled.clone()).is_err());
        assert!(P::NodeRemoved.transition(cancelled.clone()).is_err());
        assert!(cancelled.transition(P::Gated).is_err());
        let err = P::Detected.transition(P::Done).unwrap_err();
        assert_eq!(
            err.to_string(),
            "remediation cannot go from detected to done"
        );
    }

    #[test]
    fn failure_paths() {
        for p in [
            P::Detected,
            P::Gated,
            P::PoweringOff,
            P::WaitingForNode,
            P::Restored,
        ] {
            assert!(p.can_transition_to(&failed()), "{p}");
        }
        assert!(failed().can_transition_to(&P::NeedsPerson { reason: "r".into() }));
        assert!(failed().can_transition_to(&P::Reprovisioning));
        assert!(!failed().can_transition_to(&P::Gated));
        assert!(!failed().can_transition_to(&failed()));
    }

    #[test]
    fn advance_keeps_phase_on_error() {
        let mut r = Remediation {
            id: remediation_id("n", 1),
            target: "n".into(),
            seq: 1,
            attempt: 1,
            executor: "e".into(),
            strategy: Strategy::Reboot,
            node_handling: NodeHandling::Delete,
            phase: P::Gated,
            started_at: Timestamp(0),
            phase_since: Timestamp(0),
            control_plane: false,
            cause: "test".into(),
            forced: None,
            cancel_requested: None,
            backup: None,
            powered_on_at: None,
            stay_off: false,
            boot_before: None,
        };
        assert!(r.advance(P::Done, Timestamp(5)).is_err());
        assert_eq!(r.phase, P::Gated);
        r.advance(P::PoweringOff, Timestamp(7)).unwrap();
        assert_eq!(
            (r.phase.clone(), r.phase_since),
            (P::PoweringOff, Timestamp(7))
        );
        assert_eq!(r.powered_on_at, None);
        r.advance(P::PoweringOn, Timestamp(8)).unwrap();
        r.advance(P::WaitingForNode, Timestamp(9)).unwrap();
        r.advance(P::Done, Timestamp(12)).unwrap();
        assert_eq!(
            r.powered_on_at,
            Some(Timestamp(9)),
            "the boot is remembered past done"
        );
    }

    #[test]
    fn only_a_stay_off_remediation_ends_left_off_after_its_node_is_handled() {
        let mut r = Remediation {
            id: remediation_id("n", 1),
            target: "n".into(),
            seq: 1,
            attempt: 1,
            executor: "e".into(),
            strategy: Strategy::ExternalBaremetal,
            node_handling: NodeHandling::Delete,
            phase: P::NodeRemoved,
            started_at: Timestamp(0),
            phase_since: Timestamp(0),
            control_plane: false,
            cause: "test".into(),
            forced: None,
            cancel_requested: None,
            backup: None,
            powered_on_at: None,
            stay_off: false,
            boot_before: None,
        };
        let left_off = P::NeedsPerson {
            reason: "left off".into(),
        };
        assert!(!r.may_step_to(&left_off));
        assert!(r.clone().advance(left_off.clone(), Timestamp(1)).is_err());
        r.stay_off = true;
        assert!(r.may_step_to(&left_off));
        // Never from another phase, and power-on stays legal (a cancel undoes it).
        assert!(r.may_step_to(&P::PoweringOn));
        let mut early = r.clone();
        early.phase = P::VerifiedOff;
        assert!(!early.may_step_to(&left_off));
        r.advance(left_off.clone(), Timestamp(2)).unwrap();
        assert_eq!((r.phase, r.phase_since), (left_off, Timestamp(2)));
    }
}
