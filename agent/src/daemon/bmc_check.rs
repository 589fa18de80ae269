//! The credentialed, read-only check of a BMC this agent may be asked to fence (issue 25):
//! log in with the credentials a fence would use, read the power state and the system's
//! identity, and compare that identity with the one the host's own agent reported. Never
//! changes power. A failure is classified ([`CheckFailure`]) so a person knows what to fix
//! before the fence is needed.
//!
//! The controller hands the credentials out with the target ([`BmcTarget::credentials`]);
//! without them [`super::bmc_reach`] checks reachability only. Failed logins lock accounts on
//! many BMCs, so a refused login is not tried again with the same credentials for a doubling
//! number of periods ([`LoginBackoff`]); new credentials are tried at once.

use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::path::Path;
use std::time::Duration;

use metalguard_api::bmc::CheckFailure;
use metalguard_api::duration::Timestamp;
use metalguard_api::identity::{IdentityMatch, SystemIdentity, compare};
use metalguard_api::protocol::{BmcCheck, BmcCredentials, BmcReachability, BmcTarget};
use metalguard_bmc::{
    Bmc, BmcAddress, CallTimeouts, Credentials, PowerControl as _, ReadIdentity as _,
};
use tokio::time::Instant;

use super::execute::{error_chain, tls_trust};
use super::probes::now_ms;

/// The longest wait before a refused login is tried again with the same credentials.
const MAX_LOGIN_BACKOFF: Duration = Duration::from_secs(3600);

/// Checks `target` with `credentials`, each call under `timeout` and the whole within three
/// of them (log in, power state, identity) plus a second.
pub async fn check(
    target: &BmcTarget,
    credentials: &BmcCredentials,
    ca_dir: &Path,
    timeout: Duration,
) -> BmcReachability {
    let checked_at = Timestamp(now_ms());
    let deadline = timeout * 3 + Duration::from_secs(1);
    let read =
        match tokio::time::timeout(deadline, read(target, credentials, ca_dir, timeout)).await {
            Ok(read) => read,
            Err(_) => Err((
                CheckFailure::Unreachable,
                format!(
                    "the check of {}'s bmc did not finish within {deadline:?}",
                    target.host
                ),
            )),
        };
    let mut check = match read {
        Ok((power, identity)) => judge(target, power, identity),
        Err((failure, detail)) => BmcCheck {
            failure: Some(failure),
            power_state: None,
            identity: None,
            detail,
            credentials_id: None,
            request: None,
        },
    };
    check.credentials_id.clone_from(&target.credentials_id);
    check.request.clone_from(&target.check_request);
    if target.credentials_new {
        check.detail = format!(
            "with the rotation's new credentials (fences keep the previous ones until a check with these passes): {}",
            check.detail
        );
    }
    BmcReachability {
        host: target.host.clone(),
        // It answered unless nothing did or the handshake failed.
        reachable: !matches!(
            check.failure,
            Some(CheckFailure::Unreachable | CheckFailure::Tls)
        ),
        checked_at,
        error: check.failure.map(|_| check.detail.clone()),
        check: Some(check),
    }
}

/// Logs in and reads the power state, then the identity (whose read may fail on its own:
/// not every BMC gives one, and that is no reason to call a fence unready).
async fn read(
    target: &BmcTarget,
    credentials: &BmcCredentials,
    ca_dir: &Path,
    timeout: Duration,
) -> Result<(String, Result<SystemIdentity, String>), (CheckFailure, String)> {
    let address = target.bmc_address.parse::<BmcAddress>().map_err(|e| {
        (
            CheckFailure::UnexpectedAnswer,
            format!("bmc address of {}: {e}", target.host),
        )
    })?;
    let trust = tls_trust(ca_dir, &target.tls).map_err(|e| {
        (
            CheckFailure::Tls,
            format!("tls trust for bmc of {}: {e}", target.host),
        )
    })?;
    let credentials = Credentials::new(credentials.username.clone(), credentials.password.expose());
    let timeouts = CallTimeouts {
        connect: timeout,
        request: timeout,
    };
    let mut bmc = Bmc::new(&address, credentials, &trust, timeouts)
        .map_err(|e| (e.check_failure(), error_chain(&e)))?;
    let power = bmc.power_state().await;
    let identity = match &power {
        Ok(_) => bmc.identity().await.map_err(|e| error_chain(&e)),
        Err(_) => Err("not read".to_owned()),
    };
    let _ = bmc.close().await;
    let power = power.map_err(|e| (e.check_failure(), error_chain(&e)))?;
    Ok((power.as_str().to_owned(), identity))
}

/// The check's verdict on what was read: it passes unless the BMC is proven to answer for
/// another machine (only a proven mismatch fails, as at the fence, `identity_gate`).
fn judge(target: &BmcTarget, power: String, identity: Result<SystemIdentity, String>) -> BmcCheck {
    let host = &target.host;
    let (failure, detail) = match (&identity, target.expected_identity.as_deref()) {
        (Err(why), _) => (None, format!("logged in; identity not read: {why}")),
        (Ok(_), None) => (
            None,
            format!("logged in; {host}'s agent reported no identity to compare"),
        ),
        (Ok(seen), Some(expected)) => match compare(expected, seen) {
            IdentityMatch::Same { by } => (
                None,
                format!("logged in; the BMC's system is {host} (matched by {by})"),
            ),
            IdentityMatch::Unknown { reason } => {
                (None, format!("logged in; identity not compared: {reason}"))
            }
            IdentityMatch::Different { reason } => (
                Some(CheckFailure::IdentityMismatch),
                format!(
                    "the BMC given for {host} answers for another machine: {reason} (the host says it is {expected}, the BMC says {seen})"
                ),
            ),
        },
    };
    BmcCheck {
        failure,
        power_state: Some(power),
        identity: identity.ok(),
        detail,
        credentials_id: None,
        request: None,
    }
}

/// Refused logins per target, so that a wrong password does not lock the BMC's account:
/// after `n` refusals in a row with the same credentials the next try waits `period × 2^n`
/// (at most an hour); other credentials, or a login that passed, start afresh.
///
/// A person's on-demand check ([`BmcTarget::check_request`]) is tried once per request id
/// even while backing off, and at most once per period per target: whoever can write
/// requests cannot drive more than one extra login a period.
#[derive(Debug, Default)]
pub struct LoginBackoff {
    refused: HashMap<String, Refused>,
    /// Per target, the last request id tried and when.
    requests: HashMap<String, (String, Instant)>,
}

#[derive(Debug)]
struct Refused {
    credentials: u64,
    times: u32,
    until: Instant,
}

impl LoginBackoff {
    /// Whether `target` may be checked with its credentials now (`period`: the check period).
    pub fn allows(&self, target: &BmcTarget, period: Duration, now: Instant) -> bool {
        let Some(credentials) = &target.credentials else {
            return true;
        };
        self.refused
            .get(&target.host)
            .is_none_or(|r| r.credentials != fingerprint(credentials) || now >= r.until)
            || self.asked(target, period, now)
    }

    /// True when `target` carries a request not tried yet, and none was tried on it within
    /// `period`.
    fn asked(&self, target: &BmcTarget, period: Duration, now: Instant) -> bool {
        let Some(id) = &target.check_request else {
            return false;
        };
        self.requests
            .get(&target.host)
            .is_none_or(|(tried, at)| tried != id && now.saturating_duration_since(*at) >= period)
    }

    /// Takes the result of a check of `target` made at `now`.
    pub fn record(
        &mut self,
        target: &BmcTarget,
        result: &BmcReachability,
        period: Duration,
        now: Instant,
    ) {
        if let Some(id) = &target.check_request
            && self
                .requests
                .get(&target.host)
                .is_none_or(|(tried, _)| tried != id)
        {
            self.requests.insert(target.host.clone(), (id.clone(), now));
        }
        let Some(credentials) = &target.credentials else {
            self.refused.remove(&target.host);
            return;
        };
        let refused = result.check.as_ref().is_some_and(|c| {
            matches!(
                c.failure,
                Some(CheckFailure::CredentialsRefused | CheckFailure::AccountLocked)
            )
        });
        if !refused {
            self.refused.remove(&target.host);
            return;
        }
        let credentials = fingerprint(credentials);
        let times = match self.refused.get(&target.host) {
            Some(r) if r.credentials == credentials => r.times.saturating_add(1),
            _ => 1,
        };
        let wait = period
            .saturating_mul(2u32.saturating_pow(times))
            .min(MAX_LOGIN_BACKOFF);
        tracing::warn!(target_host = %target.host, refusals = times, retry_in = ?wait, "the bmc refused the login; not trying these credentials again until then");
        self.refused.insert(
            target.host.clone(),
            Refused {
                credentials,
                times,
                until: now + wait,
            },
        );
    }
}

/// A hash of `credentials`, kept in memory only, to tell new credentials from the refused
/// ones.
fn fingerprint(credentials: &BmcCredentials) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    credentials.username.hash(&mut hasher);
    credentials.password.expose().hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{BmcTrust, Secret};
    use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege};
    use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions};

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);

    /// What a check of `cp-2` came to, as the backoff sees it.
    fn outcome(failure: Option<CheckFailure>) -> BmcReachability {
        BmcReachability {
            host: "cp-2".into(),
            reachable: true,
            checked_at: Timestamp(1),
            error: None,
            check: Some(BmcCheck {
                failure,
                power_state: None,
                identity: None,
                detail: String::new(),
                credentials_id: None,
                request: None,
            }),
        }
    }

    fn credentials(user: &str, password: &str) -> BmcCredentials {
        BmcCredentials {
            username: user.into(),
            password: Secret::new(password),
        }
    }

    fn redfish_target(bmc: &RedfishBmc, expected: Option<SystemIdentity>) -> BmcTarget {
        BmcTarget {
            host: "cp-2".into(),
            bmc_address: format!("redfish+http://127.0.0.1:{}", bmc.port()),
            tls: BmcTrust::default(),
            credentials: Some(credentials(bmc.username(), bmc.password())),
            expected_identity: expected.map(Box::new),
            credentials_id: None,
            credentials_new: false,
            check_request: None,
        }
    }

    /// Checks `target` with the credentials it carries.
    async fn check_own(target: &BmcTarget, ca_dir: &Path) -> BmcReachability {
        check(
            target,
            target.credentials.as_ref().unwrap(),
            ca_dir,
            TIMEOUT,
        )
        .await
    }

    fn identity(uuid: &str) -> SystemIdentity {
        let mut id = SystemIdentity::default();
        id.set_uuid(Ok(uuid.parse().unwrap()));
        id
    }

    /// The emulator with a lockout policy (3 refused logins lock the account for a minute):
    /// refusals are credentials refused; then even the right password is refused, and the
    /// check names the lock. A person's request is answered with the id it carried.
    #[tokio::test]
    async fn a_bmc_whose_lockout_policy_tripped_is_reported_as_a_locked_account() {
        let bmc = RedfishBmc::start(RedfishOptions {
            lockout: Some((3, Duration::from_secs(60))),
            ..RedfishOptions::default()
        })
        .unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let target = redfish_target(&bmc, None);
        let wrong = credentials(bmc.username(), "not-the-password");
        for attempt in 1..=3 {
            let refused = check(&target, &wrong, ca_dir.path(), TIMEOUT).await;
            let failure = refused.check.unwrap().failure;
            assert_eq!(
                failure,
                Some(CheckFailure::CredentialsRefused),
                "attempt {attempt}"
            );
        }
        assert!(bmc.account_locked(), "the policy locked the account");
        let asked = BmcTarget {
            check_request: Some("r7".into()),
            ..target.clone()
        };
        let locked = check_own(&asked, ca_dir.path()).await;
        let verdict = locked.check.unwrap();
        assert_eq!(
            verdict.failure,
            Some(CheckFailure::AccountLocked),
            "{verdict:?}"
        );
        assert!(verdict.detail.contains("locked"), "{verdict:?}");
        assert_eq!(verdict.request.as_deref(), Some("r7"), "echoed");
        bmc.unlock_account().unwrap();
        let passed = check_own(&target, ca_dir.path()).await;
        assert_eq!(passed.check.unwrap().failure, None);
    }

    #[tokio::test]
    async fn a_redfish_check_passes_fails_on_a_wrong_password_and_on_another_machine() {
        let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let own = identity(&bmc.system_ids()[0]);
        let target = redfish_target(&bmc, Some(own));
        let passed = check_own(&target, ca_dir.path()).await;
        let verdict = passed.check.clone().unwrap();
        assert!(passed.reachable && passed.error.is_none(), "{passed:?}");
        assert_eq!(verdict.failure, None, "{verdict:?}");
        assert_eq!(verdict.power_state.as_deref(), Some("on"));
        assert!(verdict.detail.contains("matched by uuid"), "{verdict:?}");

        assert_eq!(verdict.credentials_id, None);

        let wrong = credentials(bmc.username(), "not-the-password");
        let rotated = BmcTarget {
            credentials_id: Some("c2".into()),
            credentials_new: true,
            ..target.clone()
        };
        let refused = check(&rotated, &wrong, ca_dir.path(), TIMEOUT).await;
        let failed = refused.check.clone().unwrap();
        assert_eq!(failed.failure, Some(CheckFailure::CredentialsRefused));
        assert!(refused.reachable, "it answered: {refused:?}");
        assert!(!format!("{refused:?}").contains("not-the-password"));
        assert_eq!(failed.credentials_id.as_deref(), Some("c2"), "echoed");
        assert!(
            failed
                .detail
                .starts_with("with the rotation's new credentials"),
            "{failed:?}"
        );

        let other = redfish_target(&bmc, Some(identity("4c4c4544-0032-3110-8050-b1c04f4e3132")));
        let swapped = check_own(&other, ca_dir.path()).await;
        let mismatch = swapped.check.unwrap();
        assert_eq!(mismatch.failure, Some(CheckFailure::IdentityMismatch));
        assert!(
            mismatch.detail.contains("answers for another machine"),
            "{mismatch:?}"
        );
        assert!(
            bmc.power_log().unwrap().is_empty(),
            "a check changes no power"
        );
    }

    #[tokio::test]
    async fn an_ipmi_check_reads_power_and_a_dead_bmc_is_unreachable() {
        let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let target = BmcTarget {
            host: "cp-3".into(),
            bmc_address: sim.url(),
            tls: BmcTrust::default(),
            credentials: Some(credentials(sim.username(Privilege::Admin), sim.password())),
            expected_identity: Some(Box::new(identity(sim.system_uuid().unwrap()))),
            credentials_id: None,
            credentials_new: false,
            check_request: None,
        };
        let passed = check_own(&target, ca_dir.path()).await;
        let result = passed.check.unwrap();
        assert_eq!(result.failure, None, "{result:?}");
        assert_eq!(result.power_state.as_deref(), Some("on"));
        assert!(sim.power_log().unwrap().is_empty());

        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dead = BmcTarget {
            bmc_address: format!("ipmi://127.0.0.1:{port}"),
            ..target.clone()
        };
        let result = check_own(&dead, ca_dir.path()).await;
        assert!(!result.reachable, "{result:?}");
        assert_eq!(
            result.check.unwrap().failure,
            Some(CheckFailure::Unreachable)
        );
    }

    #[test]
    fn a_refused_login_waits_doubling_periods_and_new_credentials_go_at_once() {
        let period = Duration::from_secs(60);
        let now = Instant::now();
        let target = |password: &str| BmcTarget {
            host: "cp-2".into(),
            bmc_address: "ipmi://x".into(),
            tls: BmcTrust::default(),
            credentials: Some(credentials("admin", password)),
            expected_identity: None,
            credentials_id: None,
            credentials_new: false,
            check_request: None,
        };
        let mut backoff = LoginBackoff::default();
        let old = target("old");
        assert!(backoff.allows(&old, period, now));
        backoff.record(
            &old,
            &outcome(Some(CheckFailure::CredentialsRefused)),
            period,
            now,
        );
        assert!(!backoff.allows(&old, period, now + period));
        assert!(backoff.allows(&old, period, now + period * 2));
        backoff.record(
            &old,
            &outcome(Some(CheckFailure::AccountLocked)),
            period,
            now,
        );
        assert!(!backoff.allows(&old, period, now + period * 3));
        assert!(backoff.allows(&old, period, now + period * 4));
        assert!(
            backoff.allows(&target("rotated"), period, now),
            "new credentials"
        );
        backoff.record(&old, &outcome(Some(CheckFailure::Unreachable)), period, now);
        assert!(backoff.allows(&old, period, now), "not a refused login");
        for _ in 0..20 {
            backoff.record(
                &old,
                &outcome(Some(CheckFailure::CredentialsRefused)),
                period,
                now,
            );
        }
        assert!(backoff.allows(&old, period, now + MAX_LOGIN_BACKOFF));
    }

    #[test]
    fn a_persons_request_is_tried_once_through_the_backoff_and_at_most_once_a_period() {
        let now = Instant::now();
        let period = Duration::from_secs(60);
        let asked = |id: Option<&str>| BmcTarget {
            host: "cp-2".into(),
            bmc_address: "ipmi://x".into(),
            tls: BmcTrust::default(),
            credentials: Some(credentials("admin", "wrong")),
            expected_identity: None,
            credentials_id: None,
            credentials_new: false,
            check_request: id.map(str::to_owned),
        };
        let refused = outcome(Some(CheckFailure::CredentialsRefused));
        let mut backoff = LoginBackoff::default();
        backoff.record(&asked(None), &refused, period, now);
        let later = now + Duration::from_secs(5);
        assert!(!backoff.allows(&asked(None), period, later), "backing off");
        assert!(backoff.allows(&asked(Some("r1")), period, later), "asked");
        backoff.record(&asked(Some("r1")), &refused, period, later);
        assert!(
            !backoff.allows(&asked(Some("r1")), period, later + Duration::from_secs(1)),
            "once per request"
        );
        assert!(
            !backoff.allows(&asked(Some("r2")), period, later + Duration::from_secs(30)),
            "a new request within the period waits for the backoff"
        );
        assert!(backoff.allows(&asked(Some("r2")), period, later + period));
    }
}
