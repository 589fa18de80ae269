use std::time::Duration;

use tokio::time::Instant;

use super::{FenceAction, FenceOptions, FenceStatus, fence};
use crate::{BmcError, Capabilities, PowerControl, PowerState, Timeline};

/// A hand-written fake BMC: commands take effect after `delay`, with a transitional state
/// reported meanwhile; failures are injected per command.
struct FakeBmc {
    state: PowerState,
    pending: Option<(Instant, PowerState)>,
    delay: Duration,
    fail_on: bool,
    ignore_off: bool,
    reads: usize,
    transient_reads: Vec<usize>,
    commands: Vec<&'static str>,
    timeline: Timeline,
}

impl FakeBmc {
    fn new(state: PowerState, delay: Duration) -> Self {
        Self {
            state,
            pending: None,
            delay,
            fail_on: false,
            ignore_off: false,
            reads: 0,
            transient_reads: Vec::new(),
            commands: Vec::new(),
            timeline: Timeline::new(),
        }
    }

    fn settle(&mut self) {
        if let Some((at, state)) = self.pending.clone()
            && Instant::now() >= at
        {
            self.state = state;
            self.pending = None;
        }
    }
}

impl PowerControl for FakeBmc {
    fn address(&self) -> &'static str {
        "fake:1"
    }

    async fn power_state(&mut self) -> Result<PowerState, BmcError> {
        self.reads += 1;
        if self.transient_reads.contains(&self.reads) {
            return Err(BmcError::HttpStatus {
                bmc: "fake:1".into(),
                what: "GET".into(),
                status: 503,
                detail: String::new(),
            });
        }
        self.settle();
        Ok(match &self.pending {
            Some((_, PowerState::Off)) => PowerState::PoweringOff,
            Some((_, _)) => PowerState::PoweringOn,
            None => self.state.clone(),
        })
    }

    async fn power_on(&mut self) -> Result<(), BmcError> {
        self.commands.push("on");
        if self.fail_on {
            return Err(BmcError::HttpStatus {
                bmc: "fake:1".into(),
                what: "POST On".into(),
                status: 400,
                detail: String::new(),
            });
        }
        self.pending = Some((Instant::now() + self.delay, PowerState::On));
        Ok(())
    }

    async fn force_off(&mut self) -> Result<(), BmcError> {
        self.commands.push("force_off");
        if !self.ignore_off {
            self.pending = Some((Instant::now() + self.delay, PowerState::Off));
        }
        Ok(())
    }

    async fn graceful_off(&mut self) -> Result<(), BmcError> {
        self.commands.push("graceful_off");
        Ok(())
    }

    async fn hard_reset(&mut self) -> Result<(), BmcError> {
        self.commands.push("hard_reset");
        Ok(())
    }

    async fn power_cycle(&mut self) -> Result<(), BmcError> {
        self.commands.push("power_cycle");
        Ok(())
    }

    async fn capabilities(&mut self) -> Result<Capabilities, BmcError> {
        Ok(Capabilities::default())
    }

    async fn close(&mut self) -> Result<(), BmcError> {
        Ok(())
    }

    fn timeline_mut(&mut self) -> &mut Timeline {
        &mut self.timeline
    }
}

#[tokio::test(start_paused = true)]
async fn off_waits_through_powering_off_until_off() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::from_secs(7));
    let outcome = fence(&mut bmc, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    assert_eq!(bmc.commands, ["force_off"]);
    assert!(outcome.elapsed >= Duration::from_secs(7));
    assert!(
        outcome.elapsed < Duration::from_secs(8),
        "{:?}",
        outcome.elapsed
    );
    let text = outcome.timeline.to_string();
    assert!(text.contains("not verified yet: powering-off"), "{text}");
    assert!(text.contains("power off verified: off"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn off_when_already_off_sends_nothing() {
    let mut bmc = FakeBmc::new(PowerState::Off, Duration::ZERO);
    let outcome = fence(&mut bmc, FenceAction::Off, &FenceOptions::default()).await;
    assert!(matches!(outcome.status, FenceStatus::PoweredOff));
    assert!(bmc.commands.is_empty());
}

#[tokio::test(start_paused = true)]
async fn off_that_never_happens_fails_at_the_deadline() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::ZERO);
    bmc.ignore_off = true;
    let options = FenceOptions {
        deadline: Duration::from_secs(5),
        ..FenceOptions::default()
    };
    let outcome = fence(&mut bmc, FenceAction::Off, &options).await;
    let FenceStatus::Failed(BmcError::Deadline { operation, .. }) = &outcome.status else {
        panic!("expected a deadline failure, got {outcome:?}");
    };
    assert_eq!(operation, "power off");
    assert!(!outcome.status.is_fenced());
    assert_eq!(outcome.elapsed, Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn reboot_is_fenced_even_when_power_on_fails() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::from_secs(2));
    bmc.fail_on = true;
    let outcome = fence(&mut bmc, FenceAction::Reboot, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::FencedPowerOnFailed(_)),
        "{outcome:?}"
    );
    assert!(outcome.status.is_fenced());
    assert!(outcome.status.is_success());
    assert!(
        outcome
            .status
            .summary()
            .contains("powering the host on again failed")
    );
    assert_eq!(bmc.commands, ["force_off", "on"]);
}

#[tokio::test(start_paused = true)]
async fn reboot_verifies_off_then_on() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::from_secs(3));
    let outcome = fence(&mut bmc, FenceAction::Reboot, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::Rebooted),
        "{outcome:?}"
    );
    assert_eq!(bmc.commands, ["force_off", "on"]);
    assert_eq!(bmc.state, PowerState::On);
}

#[tokio::test(start_paused = true)]
async fn reboot_that_times_out_after_off_is_still_fenced() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::from_secs(3));
    let options = FenceOptions {
        deadline: Duration::from_secs(5),
        ..FenceOptions::default()
    };
    let outcome = fence(&mut bmc, FenceAction::Reboot, &options).await;
    assert!(
        matches!(
            outcome.status,
            FenceStatus::FencedPowerOnFailed(BmcError::Deadline { .. })
        ),
        "{outcome:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn first_read_error_fails_without_sending_a_command() {
    let mut bmc = FakeBmc::new(PowerState::Off, Duration::ZERO);
    bmc.transient_reads = vec![1];
    let outcome = fence(&mut bmc, FenceAction::On, &FenceOptions::default()).await;
    assert!(matches!(
        outcome.status,
        FenceStatus::Failed(BmcError::HttpStatus { status: 503, .. })
    ));
    assert!(bmc.commands.is_empty());
}

#[tokio::test(start_paused = true)]
async fn transient_errors_while_polling_are_retried() {
    let mut bmc = FakeBmc::new(PowerState::On, Duration::from_secs(1));
    bmc.transient_reads = vec![2, 3];
    let outcome = fence(&mut bmc, FenceAction::Off, &FenceOptions::default()).await;
    assert!(
        matches!(outcome.status, FenceStatus::PoweredOff),
        "{outcome:?}"
    );
    assert_eq!(bmc.commands, ["force_off"]);
    assert!(
        outcome
            .timeline
            .to_string()
            .contains("state read failed, retrying")
    );
}
