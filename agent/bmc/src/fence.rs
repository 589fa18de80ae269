//! The verified `fence` operation on top of [`PowerControl`].
//!
//! - `off`: read the state; unless already Off, force off; then poll until the BMC reports Off.
//! - `on`: read the state; unless already On, power on; then poll until the BMC reports On.
//! - `reboot`: a verified `off`, then power on and poll until On. Once Off is verified the host
//!   counts as fenced, even when powering it on again fails: the outcome says so.
//!
//! Everything runs under one overall deadline. Transitional states (`PoweringOff`) and unknown
//! values are never taken for Off.

use std::time::Duration;

use tokio::time::Instant;

use crate::{BmcError, PowerControl, PowerState, Timeline};

/// Default overall deadline of a fence operation.
pub const DEFAULT_FENCE_DEADLINE: Duration = Duration::from_secs(60);
/// First pause between two state reads while waiting for a change.
pub const FIRST_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Longest pause between two state reads while waiting for a change.
pub const MAX_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What a fence operation should achieve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceAction {
    /// Verified off.
    Off,
    /// Verified off, then verified on.
    Reboot,
    /// Verified on.
    On,
}

impl FenceAction {
    /// The lowercase name (`off`, `reboot`, `on`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Reboot => "reboot",
            Self::On => "on",
        }
    }
}

/// Tuning of a fence operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceOptions {
    /// Overall deadline of the whole operation.
    pub deadline: Duration,
    /// First pause between state reads.
    pub first_poll_interval: Duration,
    /// Longest pause between state reads (the pause doubles up to this).
    pub max_poll_interval: Duration,
}

impl Default for FenceOptions {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_FENCE_DEADLINE,
            first_poll_interval: FIRST_POLL_INTERVAL,
            max_poll_interval: MAX_POLL_INTERVAL,
        }
    }
}

/// How a fence operation ended.
#[derive(Debug)]
pub enum FenceStatus {
    /// `off`: the BMC reports Off.
    PoweredOff,
    /// `on`: the BMC reports On.
    PoweredOn,
    /// `reboot`: Off was verified, then On was verified.
    Rebooted,
    /// `reboot`: Off was verified (the host is fenced) but powering it on again failed.
    FencedPowerOnFailed(BmcError),
    /// The operation failed; for `off` and `reboot` the host is *not* known to be fenced.
    Failed(BmcError),
}

impl FenceStatus {
    /// Whether the operation achieved what was asked (for `reboot`: at least the fence).
    pub fn is_success(&self) -> bool {
        !matches!(self, Self::Failed(_))
    }

    /// Whether Off was verified during the operation.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            Self::PoweredOff | Self::Rebooted | Self::FencedPowerOnFailed(_)
        )
    }

    /// A one-line lowercase summary for output.
    pub fn summary(&self) -> &'static str {
        match self {
            Self::PoweredOff => "fenced: power off verified",
            Self::PoweredOn => "power on verified",
            Self::Rebooted => "fenced and powered on again: off and on verified",
            Self::FencedPowerOnFailed(_) => {
                "fenced: power off verified, but powering the host on again failed"
            }
            Self::Failed(_) => "failed",
        }
    }

    /// The error, if any part failed.
    pub fn error(&self) -> Option<&BmcError> {
        match self {
            Self::FencedPowerOnFailed(error) | Self::Failed(error) => Some(error),
            _ => None,
        }
    }
}

/// The result of a fence operation with everything that was sent and seen.
#[derive(Debug)]
pub struct FenceOutcome {
    /// What was asked.
    pub action: FenceAction,
    /// How it ended.
    pub status: FenceStatus,
    /// Requests, answers and decisions, in order.
    pub timeline: Timeline,
    /// Wall time of the whole operation.
    pub elapsed: Duration,
}

/// Runs a verified fence operation under `options.deadline`. Never panics, never hangs past the
/// deadline; the caller closes the session afterwards.
pub async fn fence<P: PowerControl>(
    bmc: &mut P,
    action: FenceAction,
    options: &FenceOptions,
) -> FenceOutcome {
    let start = Instant::now();
    let deadline = start + options.deadline;
    bmc.timeline_mut().note(format!(
        "fence {} with deadline {:?}",
        action.as_str(),
        options.deadline
    ));
    let status = match action {
        FenceAction::Off => match bounded(bmc, deadline, options, Goal::Off).await {
            Ok(()) => FenceStatus::PoweredOff,
            Err(error) => FenceStatus::Failed(error),
        },
        FenceAction::On => match bounded(bmc, deadline, options, Goal::On).await {
            Ok(()) => FenceStatus::PoweredOn,
            Err(error) => FenceStatus::Failed(error),
        },
        FenceAction::Reboot => match bounded(bmc, deadline, options, Goal::Off).await {
            Err(error) => FenceStatus::Failed(error),
            Ok(()) => match bounded(bmc, deadline, options, Goal::OnAfterOff).await {
                Ok(()) => FenceStatus::Rebooted,
                Err(error) => FenceStatus::FencedPowerOnFailed(error),
            },
        },
    };
    let note = match status.error() {
        Some(error) => format!("{}: {error}", status.summary()),
        None => status.summary().to_owned(),
    };
    bmc.timeline_mut().note(note);
    FenceOutcome {
        action,
        status,
        timeline: std::mem::take(bmc.timeline_mut()),
        elapsed: start.elapsed(),
    }
}

/// One verified step of a fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Goal {
    /// Off, skipping the command when already off.
    Off,
    /// On, skipping the command when already on.
    On,
    /// On right after a verified off: no need to read the state first.
    OnAfterOff,
}

impl Goal {
    fn operation(self) -> &'static str {
        match self {
            Self::Off => "power off",
            Self::On | Self::OnAfterOff => "power on",
        }
    }

    fn reached(self, state: &PowerState) -> bool {
        match self {
            Self::Off => state.is_off(),
            Self::On | Self::OnAfterOff => state.is_on(),
        }
    }
}

async fn bounded<P: PowerControl>(
    bmc: &mut P,
    deadline: Instant,
    options: &FenceOptions,
    goal: Goal,
) -> Result<(), BmcError> {
    let address = bmc.address().to_owned();
    match tokio::time::timeout_at(deadline, reach(bmc, options, goal)).await {
        Ok(result) => result,
        Err(_elapsed) => {
            bmc.timeline_mut().note(format!(
                "overall deadline reached during {}",
                goal.operation()
            ));
            Err(BmcError::Deadline {
                bmc: address,
                operation: goal.operation().to_owned(),
                deadline: options.deadline,
            })
        }
    }
}

async fn reach<P: PowerControl>(
    bmc: &mut P,
    options: &FenceOptions,
    goal: Goal,
) -> Result<(), BmcError> {
    if goal != Goal::OnAfterOff {
        let state = bmc.power_state().await?;
        if goal.reached(&state) {
            bmc.timeline_mut()
                .note(format!("already {state}: no command sent"));
            return Ok(());
        }
    }
    match goal {
        Goal::Off => bmc.force_off().await?,
        Goal::On | Goal::OnAfterOff => bmc.power_on().await?,
    }
    wait_for(bmc, options, goal).await
}

/// Polls the power state until `goal` is reached; transient read errors are noted and retried
/// (the overall deadline bounds the loop), other errors end it.
async fn wait_for<P: PowerControl>(
    bmc: &mut P,
    options: &FenceOptions,
    goal: Goal,
) -> Result<(), BmcError> {
    let mut pause = options.first_poll_interval;
    loop {
        match bmc.power_state().await {
            Ok(state) if goal.reached(&state) => {
                bmc.timeline_mut()
                    .note(format!("{} verified: {state}", goal.operation()));
                return Ok(());
            }
            Ok(state) => {
                bmc.timeline_mut().note(format!(
                    "{} not verified yet: {state}; next read in {pause:?}",
                    goal.operation()
                ));
            }
            Err(error) if error.is_transient() => {
                bmc.timeline_mut()
                    .note(format!("state read failed, retrying in {pause:?}: {error}"));
            }
            Err(error) => return Err(error),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(options.max_poll_interval);
    }
}

#[cfg(test)]
mod tests;
