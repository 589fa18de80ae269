//! Redfish power control over reqwest + rustls.
//!
//! Flow of one client: (first call) `GET /redfish/v1` → a session via the SessionService when
//! the BMC offers one, else basic auth → find the System (named in the address, or the only
//! member of `Systems`; several and none named is an error listing them) → read `PowerState`
//! and `ResetType@Redfish.AllowableValues` (or the `@Redfish.ActionInfo`) → POST the chosen
//! `ResetType`. A failed or unanswered reset is only re-sent after reading the power state and
//! finding the command not yet done. [`RedfishClient::close`] logs the session out. The
//! System's `UUID` and `SerialNumber` come from the same GET ([`crate::ReadIdentity`]).

mod http;
pub(crate) mod identity;
pub mod models;
mod reset;
#[cfg(test)]
mod tests;

use std::time::Duration;

use reqwest::{Method, StatusCode};

use self::http::{Answer, Auth, Http};
use self::models::{ActionInfo, Collection, ComputerSystem, ServiceRoot};
use self::reset::{ResetKind, choose_reset_type};
use crate::address::Transport;
use crate::identity::{ReadIdentity, SystemIdentity};
use crate::tls::{self, TlsTrust};
use crate::{BmcAddress, BmcError, Capabilities, Credentials, PowerControl, PowerState, Timeline};

/// Default TCP (and TLS handshake) connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default timeout of one request, from sending to the last byte of the answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Default number of attempts of an idempotent read.
pub const DEFAULT_READ_ATTEMPTS: u32 = 3;
/// Default number of attempts of a verifiable reset (each retry reads the state first).
pub const DEFAULT_RESET_ATTEMPTS: u32 = 3;
/// Default first pause between attempts (doubles each time).
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// The Systems collection when the service root does not link one.
const DEFAULT_SYSTEMS_PATH: &str = "/redfish/v1/Systems";
const SERVICE_ROOT: &str = "/redfish/v1";

/// Tuning of a Redfish client. Defaults are named constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedfishOptions {
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// Attempts of an idempotent read (GET).
    pub read_attempts: u32,
    /// Attempts of a reset whose effect can be read back (`On`, `ForceOff`).
    pub reset_attempts: u32,
    /// First pause between attempts.
    pub retry_backoff: Duration,
    /// Use the SessionService when offered (`false`: always basic auth).
    pub use_sessions: bool,
}

impl Default for RedfishOptions {
    fn default() -> Self {
        Self {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            read_attempts: DEFAULT_READ_ATTEMPTS,
            reset_attempts: DEFAULT_RESET_ATTEMPTS,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            use_sessions: true,
        }
    }
}

/// What is known about the System after discovery.
#[derive(Debug, Clone)]
struct SystemInfo {
    path: String,
    reset_target: Option<String>,
    allowed: Option<Vec<String>>,
}

/// A Redfish BMC client implementing [`PowerControl`].
#[derive(Debug)]
pub struct RedfishClient {
    http: Http,
    named_system: Option<String>,
    system: Option<SystemInfo>,
    root: Option<ServiceRoot>,
    options: RedfishOptions,
    timeline: Timeline,
}

/// Reduces an `@odata.id` (a path, or rarely an absolute URL) to a path on this BMC.
fn path_of(odata_id: &str) -> String {
    if let Some(rest) = odata_id
        .strip_prefix("https://")
        .or_else(|| odata_id.strip_prefix("http://"))
    {
        return rest
            .find('/')
            .map_or_else(|| "/".to_owned(), |i| rest[i..].to_owned());
    }
    odata_id.to_owned()
}

impl RedfishClient {
    /// Builds a client; no network traffic happens until the first call.
    pub fn new(
        address: &BmcAddress,
        credentials: Credentials,
        trust: &TlsTrust,
        options: RedfishOptions,
    ) -> Result<Self, BmcError> {
        let bmc = address.base_url();
        let tls_error = |detail: String| BmcError::Tls {
            bmc: bmc.clone(),
            detail,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .timeout(options.request_timeout)
            .http1_only()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("metalguard/", env!("CARGO_PKG_VERSION")));
        match address.transport {
            Transport::RedfishHttps => {
                let config = tls::client_config(trust).map_err(|error| tls_error(chain(&error)))?;
                builder = builder.tls_backend_preconfigured(config);
            }
            Transport::RedfishHttp => {
                // reqwest needs a TLS backend even for plain HTTP; this one trusts nothing.
                let config =
                    tls::trust_nothing_config().map_err(|error| tls_error(chain(&error)))?;
                builder = builder.tls_backend_preconfigured(config);
            }
            Transport::Ipmi => {
                return Err(BmcError::Unsupported {
                    bmc,
                    operation: "redfish over an ipmi address".to_owned(),
                    allowed: "redfish+https, redfish+http".to_owned(),
                });
            }
        }
        let client = builder.build().map_err(|error| tls_error(chain(&error)))?;
        Ok(Self {
            http: Http {
                client,
                base_url: address.base_url(),
                bmc,
                request_timeout: options.request_timeout,
                credentials,
                auth: Auth::Basic,
                read_attempts: options.read_attempts.max(1),
                retry_backoff: options.retry_backoff,
            },
            named_system: address.system_path.clone(),
            system: None,
            root: None,
            options,
            timeline: Timeline::new(),
        })
    }

    /// One unauthenticated GET of the service root `/redfish/v1/`, never retried: the HTTP
    /// status of whatever answered (a 401 is an answer), or why nothing did (TLS verification
    /// with the configured trust failed, the connection was refused, the request timed out).
    /// A reachability check: it sends no credentials and proves nothing about them.
    pub async fn service_root_status(&mut self) -> Result<u16, BmcError> {
        let answer = self
            .http
            .send_once(
                &mut self.timeline,
                Method::GET,
                &format!("{SERVICE_ROOT}/"),
                None,
                false,
            )
            .await?;
        Ok(answer.status.as_u16())
    }

    /// Reads the service root once and opens a session when the BMC offers one.
    async fn connect(&mut self) -> Result<(), BmcError> {
        if self.root.is_some() {
            return Ok(());
        }
        let answer = self.http.get(&mut self.timeline, SERVICE_ROOT).await?;
        let root: ServiceRoot = answer.decode(&self.http.bmc, "GET /redfish/v1")?;
        let sessions = root
            .links
            .as_ref()
            .and_then(|links| links.sessions.as_ref())
            .and_then(|link| link.odata_id.as_deref())
            .map(path_of);
        self.root = Some(root);
        match sessions {
            Some(sessions) if self.options.use_sessions => self.log_in(&sessions).await,
            Some(_) => Ok(()),
            None => {
                self.timeline
                    .note("no SessionService offered: using basic authentication");
                Ok(())
            }
        }
    }

    async fn log_in(&mut self, sessions: &str) -> Result<(), BmcError> {
        let body = serde_json::json!({
            "UserName": self.http.credentials.username(),
            "Password": self.http.credentials.password(),
        });
        let answer = self
            .http
            .send_once(
                &mut self.timeline,
                Method::POST,
                sessions,
                Some(&body),
                false,
            )
            .await?;
        drop(body);
        let what = format!("POST {sessions}");
        if answer.status == StatusCode::UNAUTHORIZED || answer.status == StatusCode::FORBIDDEN {
            return Err(BmcError::Authentication {
                bmc: self.http.bmc.clone(),
                detail: answer.refusal_detail(),
            });
        }
        match (answer.status.is_success(), answer.auth_token) {
            (true, Some(token)) => {
                self.timeline.note("redfish session opened");
                self.http.auth = Auth::Session {
                    token,
                    location: answer.location.as_deref().map(path_of),
                };
            }
            _ => {
                self.timeline.note(format!(
                    "{what} gave no session ({}): using basic authentication",
                    answer.status.as_u16()
                ));
            }
        }
        Ok(())
    }

    /// Finds the System: the one named in the address, else the only member of `Systems`.
    async fn system_path(&mut self) -> Result<String, BmcError> {
        if let Some(system) = &self.system {
            return Ok(system.path.clone());
        }
        self.connect().await?;
        if let Some(named) = &self.named_system {
            return Ok(named.clone());
        }
        let members = self.list_systems().await?;
        match members.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(BmcError::SystemNotFound {
                bmc: self.http.bmc.clone(),
                wanted: "any".to_owned(),
                systems: String::new(),
            }),
            several => Err(BmcError::AmbiguousSystem {
                bmc: self.http.bmc.clone(),
                systems: crate::error::bmc_text(&several.join(", ")),
            }),
        }
    }

    async fn list_systems(&mut self) -> Result<Vec<String>, BmcError> {
        let path = self
            .root
            .as_ref()
            .and_then(|root| root.systems.as_ref())
            .and_then(|link| link.odata_id.as_deref())
            .map_or_else(|| DEFAULT_SYSTEMS_PATH.to_owned(), path_of);
        let answer = self.http.get(&mut self.timeline, &path).await?;
        let collection: Collection = answer.decode(&self.http.bmc, &format!("GET {path}"))?;
        Ok(collection
            .members
            .iter()
            .filter_map(|member| member.odata_id.as_deref().map(path_of))
            .collect())
    }

    /// GETs the System, caching its reset target and allowable values.
    async fn read_system(&mut self) -> Result<ComputerSystem, BmcError> {
        let path = self.system_path().await?;
        let what = format!("GET {path}");
        let answer = match self.http.get(&mut self.timeline, &path).await {
            Err(BmcError::HttpStatus { status: 404, .. }) if self.named_system.is_some() => {
                let systems = self.list_systems().await.unwrap_or_default();
                return Err(BmcError::SystemNotFound {
                    bmc: self.http.bmc.clone(),
                    wanted: crate::error::bmc_text(&path),
                    systems: crate::error::bmc_text(&systems.join(", ")),
                });
            }
            other => other?,
        };
        let system: ComputerSystem = answer.decode(&self.http.bmc, &what)?;
        if self.system.is_none() {
            let reset = system.actions.as_ref().and_then(|a| a.reset.as_ref());
            let mut allowed = reset.and_then(|r| r.allowable_values.clone());
            if allowed.is_none()
                && let Some(info) = reset.and_then(|r| r.action_info.as_deref())
            {
                allowed = self.read_action_info(&path_of(info)).await?;
            }
            self.system = Some(SystemInfo {
                path,
                reset_target: reset.and_then(|r| r.target.as_deref()).map(path_of),
                allowed,
            });
        }
        Ok(system)
    }

    async fn read_action_info(&mut self, path: &str) -> Result<Option<Vec<String>>, BmcError> {
        let answer = self.http.get(&mut self.timeline, path).await?;
        let info: ActionInfo = answer.decode(&self.http.bmc, &format!("GET {path}"))?;
        Ok(info
            .parameters
            .into_iter()
            .find(|p| p.name.as_deref() == Some("ResetType"))
            .and_then(|p| p.allowable_values))
    }

    async fn read_power_state(&mut self) -> Result<PowerState, BmcError> {
        let system = self.read_system().await?;
        let state = match system.power_state.as_deref() {
            Some(value) => PowerState::from_redfish(value),
            None => {
                return Err(BmcError::Protocol {
                    bmc: self.http.bmc.clone(),
                    detail: "the system reports no PowerState".to_owned(),
                });
            }
        };
        self.timeline.note(format!("power state {state}"));
        Ok(state)
    }

    /// Sends a reset. A failed or unanswered attempt is re-sent only after reading the power
    /// state and finding the command not yet done; non-verifiable commands are sent once.
    async fn reset(&mut self, kind: ResetKind) -> Result<(), BmcError> {
        if self.system.is_none() {
            self.read_system().await?;
        }
        let Some(system) = self.system.clone() else {
            return Err(BmcError::Protocol {
                bmc: self.http.bmc.clone(),
                detail: "the system could not be read".to_owned(),
            });
        };
        let reset_type = choose_reset_type(kind, system.allowed.as_deref()).map_err(|allowed| {
            BmcError::Unsupported {
                bmc: self.http.bmc.clone(),
                operation: kind.operation().to_owned(),
                allowed: crate::error::bmc_text(&allowed.join(", ")),
            }
        })?;
        let target = system
            .reset_target
            .clone()
            .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", system.path));
        let what = format!("POST {target} {reset_type}");
        let body = serde_json::json!({ "ResetType": reset_type });
        let attempts = if kind.verifiable() {
            self.options.reset_attempts.max(1)
        } else {
            1
        };
        let mut pause = self.options.retry_backoff;
        let mut attempt = 1;
        loop {
            if attempt > 1 {
                let state = self.read_power_state().await?;
                if kind.done_in(&state) {
                    self.timeline.note(format!(
                        "{} already done ({state}): not re-sent",
                        kind.operation()
                    ));
                    return Ok(());
                }
            }
            self.timeline
                .note(format!("{} with ResetType {reset_type}", kind.operation()));
            let result = self
                .http
                .send_once(&mut self.timeline, Method::POST, &target, Some(&body), true)
                .await;
            let wait = match result {
                Ok(answer) if answer.status.is_success() => return Ok(()),
                Ok(answer)
                    if answer.status == StatusCode::CONFLICT && kind == ResetKind::ForceOff =>
                {
                    return self.confirm_conflict(&answer, &what).await;
                }
                Ok(answer) if answer.status.is_server_error() && attempt < attempts => {
                    answer.retry_after.unwrap_or(pause)
                }
                Ok(answer) => return answer.check(&self.http.bmc, &what),
                Err(error) if error.is_transient() && attempt < attempts => pause,
                Err(error) => return Err(error),
            };
            self.timeline.note(format!(
                "reset attempt {attempt} of {attempts} failed; state read before any re-send, in {wait:?}"
            ));
            tokio::time::sleep(wait).await;
            pause *= 2;
            attempt += 1;
        }
    }

    /// A 409 to ForceOff counts as success only when a GET then shows Off.
    async fn confirm_conflict(&mut self, answer: &Answer, what: &str) -> Result<(), BmcError> {
        let state = self.read_power_state().await?;
        if state.is_off() {
            self.timeline
                .note("409 conflict and the system reports Off: already off");
            Ok(())
        } else {
            answer.check(&self.http.bmc, what)
        }
    }
}

/// The error and its causes on one line, `: `-separated (for setup errors only).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl PowerControl for RedfishClient {
    fn address(&self) -> &str {
        &self.http.bmc
    }

    async fn power_state(&mut self) -> Result<PowerState, BmcError> {
        self.read_power_state().await
    }

    async fn power_on(&mut self) -> Result<(), BmcError> {
        self.reset(ResetKind::On).await
    }

    async fn force_off(&mut self) -> Result<(), BmcError> {
        self.reset(ResetKind::ForceOff).await
    }

    async fn graceful_off(&mut self) -> Result<(), BmcError> {
        self.reset(ResetKind::GracefulOff).await
    }

    async fn hard_reset(&mut self) -> Result<(), BmcError> {
        self.reset(ResetKind::HardReset).await
    }

    async fn power_cycle(&mut self) -> Result<(), BmcError> {
        self.reset(ResetKind::PowerCycle).await
    }

    async fn capabilities(&mut self) -> Result<Capabilities, BmcError> {
        if self.system.is_none() {
            self.read_system().await?;
        }
        let allowed = self.system.as_ref().and_then(|s| s.allowed.as_deref());
        let supports = |kind| choose_reset_type(kind, allowed).is_ok();
        Ok(Capabilities {
            power_on: supports(ResetKind::On),
            force_off: supports(ResetKind::ForceOff),
            graceful_off: supports(ResetKind::GracefulOff),
            hard_reset: supports(ResetKind::HardReset),
            power_cycle: supports(ResetKind::PowerCycle),
        })
    }

    async fn close(&mut self) -> Result<(), BmcError> {
        let Auth::Session { location, .. } = &self.http.auth else {
            return Ok(());
        };
        let result = if let Some(location) = location.clone() {
            let what = format!("DELETE {location}");
            let result = self
                .http
                .send_once(&mut self.timeline, Method::DELETE, &location, None, true)
                .await;
            result.and_then(|answer| answer.check(&self.http.bmc, &what))
        } else {
            self.timeline
                .note("the bmc gave no session location: cannot log out");
            Ok(())
        };
        self.http.auth = Auth::Basic;
        self.root = None;
        result
    }

    fn timeline_mut(&mut self) -> &mut Timeline {
        &mut self.timeline
    }
}

impl ReadIdentity for RedfishClient {
    async fn identity(&mut self) -> Result<SystemIdentity, BmcError> {
        let system = self.read_system().await?;
        let identity = identity::identity_of(&system);
        self.timeline.note(format!("identity: {identity}"));
        Ok(identity)
    }
}
