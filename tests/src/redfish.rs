//! The `sushy-tools` Redfish emulator with the fake driver.
//!
//! Each instance gets its own state directory (shared state leaks between instances and runs),
//! a bcrypt htpasswd with a low cost (so timings do not measure bcrypt), and HTTP or HTTPS.
//! The test reads the power state through `curl`, a client independent of metalguard's.

use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::ports::{PortLease, reserve_port};
use crate::process::{Proc, run_capture, wait_until};
use crate::tls::{ServerCert, ServerCertFiles, write_file};
use crate::{HarnessError, Result, tools};

/// How long to wait for the emulator to answer after start.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// A seed whose first stock power delay falls between 1 and 2 seconds (Python's `random.seed(14)`
/// draws `randint(1, 11) == 2` first).
pub const SEED_FIRST_DELAY_1_TO_2_S: u64 = 14;
/// The file whose presence locks the emulator's account (`sushy_launch.py`).
const LOCK_FILE: &str = "account-locked";

/// bcrypt cost of the htpasswd entries (low on purpose, see DOMAIN.md §2).
const BCRYPT_COST: u32 = 4;

/// Transport of the emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// Plain HTTP.
    Http,
    /// HTTPS with a leaf certificate issued by a test CA.
    CaSigned,
    /// HTTPS with a self-signed certificate carrying CA:TRUE.
    SelfSignedCa,
}

/// Options for [`RedfishBmc::start`].
#[derive(Debug, Clone)]
pub struct RedfishOptions {
    /// HTTP or HTTPS flavour.
    pub tls: Tls,
    /// Apply power changes at once (true) or after the emulator's stock random delay (false):
    /// `int(now) + randint(1, 11)`, so anywhere from a few milliseconds to 11 s.
    pub instant_power: bool,
    /// Seed of the emulator's random delays (with `instant_power: false`), for tests that must
    /// know the delay is long enough to observe; [`SEED_FIRST_DELAY_1_TO_2_S`] is one.
    pub random_seed: Option<u64>,
    /// Number of systems the BMC lists.
    pub systems: usize,
    /// Power state of every system at start.
    pub initially_on: bool,
    /// The user the test logs in as.
    pub username: String,
    /// Its password (random by default).
    pub password: String,
    /// The address it listens on (127.0.0.1 by default; the HTTPS certificate names it).
    pub bind: Ipv4Addr,
    /// Give every system a `SerialNumber` (sushy-tools has none; the launcher adds it): true
    /// by default.
    pub serial_numbers: bool,
    /// The account's lockout policy (sushy-tools has none; the launcher adds it): this many
    /// refused logins in a row lock the account for this long. `None`: no lockout, though
    /// [`RedfishBmc::lock_account`] still locks it.
    pub lockout: Option<(u32, Duration)>,
}

impl Default for RedfishOptions {
    fn default() -> Self {
        Self {
            tls: Tls::Http,
            instant_power: true,
            random_seed: None,
            systems: 1,
            initially_on: true,
            username: "admin".to_owned(),
            password: tools::random_token(16),
            bind: Ipv4Addr::LOCALHOST,
            serial_numbers: true,
            lockout: None,
        }
    }
}

/// A running sushy-tools emulator. Dropping it stops it and removes its state.
#[derive(Debug)]
pub struct RedfishBmc {
    proc: Proc,
    port: PortLease,
    options: RedfishOptions,
    system_ids: Vec<String>,
    serial_numbers: Vec<String>,
    cert: Option<(ServerCert, ServerCertFiles)>,
    creds_dir: PathBuf,
    dir: tempfile::TempDir,
}

impl RedfishBmc {
    /// Starts an emulator and waits until it answers an authenticated request.
    pub fn start(options: RedfishOptions) -> Result<Self> {
        let python = tools::venv_python()?;
        let dir = tools::temp_dir("redfish")?;
        let port = reserve_port()?;
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir)
            .map_err(HarnessError::io("creating the emulator state directory"))?;

        let htpasswd = dir.path().join("htpasswd");
        let hash = bcrypt::hash(&options.password, BCRYPT_COST)
            .map_err(|e| HarnessError::Other(format!("hashing the emulator password: {e}")))?;
        write_file(
            &htpasswd,
            format!("{}:{hash}\n", options.username).as_bytes(),
            0o600,
        )?;

        crate::power::init(dir.path(), options.initially_on)?;
        let creds_dir = dir.path().join("credentials");
        write_credentials(&creds_dir, &options.username, &options.password)?;

        let cert = match options.tls {
            Tls::Http => None,
            Tls::CaSigned => Some(ServerCert::ca_signed_for(options.bind)?),
            Tls::SelfSignedCa => Some(ServerCert::self_signed_ca_for(options.bind)?),
        };
        let cert = match cert {
            Some(cert) => {
                let files = cert.write_to(dir.path())?;
                Some((cert, files))
            }
            None => None,
        };

        let system_ids: Vec<String> = (0..options.systems).map(|_| tools::random_uuid()).collect();
        let serial_numbers: Vec<String> = if options.serial_numbers {
            (0..options.systems)
                .map(|i| format!("MG-{i}-{}", tools::random_token(8).to_uppercase()))
                .collect()
        } else {
            Vec::new()
        };
        let serials: serde_json::Map<String, serde_json::Value> = system_ids
            .iter()
            .zip(&serial_numbers)
            .map(|(id, serial)| (id.clone(), serde_json::Value::from(serial.as_str())))
            .collect();
        let config = dir.path().join("emulator.conf");
        let text = emulator_config(
            &options,
            port.port(),
            &htpasswd,
            &state_dir,
            &system_ids,
            cert.as_ref().map(|c| &c.1),
        );
        write_file(&config, text.as_bytes(), 0o600)?;

        let mut command = Command::new(python);
        command
            .arg(tools::fixture("sushy_launch.py"))
            .arg("--config")
            .arg(&config)
            .env(
                "MG_SUSHY_INSTANT",
                if options.instant_power { "1" } else { "0" },
            )
            .env(
                "MG_SUSHY_SEED",
                options
                    .random_seed
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            )
            .env("MG_POWER_DIR", dir.path())
            .env("MG_SUSHY_LOCK_FILE", dir.path().join(LOCK_FILE))
            .env(
                "MG_SUSHY_LOCKOUT",
                options
                    .lockout
                    .map(|(n, d)| format!("{n}:{}", d.as_secs_f64()))
                    .unwrap_or_default(),
            )
            .env(
                "MG_SUSHY_SERIALS",
                serde_json::Value::Object(serials).to_string(),
            )
            .env(
                "MG_POWER_INITIAL",
                if options.initially_on { "On" } else { "Off" },
            )
            .env("PYTHONDONTWRITEBYTECODE", "1");
        let proc = Proc::spawn("sushy-emulator", command, &dir.path().join("emulator.log"))?;
        let mut bmc = Self {
            proc,
            port,
            options,
            system_ids,
            serial_numbers,
            cert,
            creds_dir,
            dir,
        };
        wait_until("the Redfish emulator to answer", START_TIMEOUT, || {
            bmc.proc.ensure_running()?;
            Ok(bmc
                .curl("GET", "/redfish/v1/Systems", None)
                .is_ok_and(|(code, _)| code == 200))
        })?;
        Ok(bmc)
    }

    /// `http://ADDRESS:PORT` or `https://ADDRESS:PORT` (ADDRESS is 127.0.0.1 by default).
    pub fn base_url(&self) -> String {
        let scheme = if self.options.tls == Tls::Http {
            "http"
        } else {
            "https"
        };
        format!("{scheme}://{}:{}", self.options.bind, self.port.port())
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The system ids (UUIDs) the emulator lists, in creation order.
    pub fn system_ids(&self) -> &[String] {
        &self.system_ids
    }

    /// The `SerialNumber` of system `i`, if it has one ([`RedfishOptions::serial_numbers`]).
    /// Its `UUID` is its id ([`RedfishBmc::system_ids`]).
    pub fn serial_number(&self, i: usize) -> Option<&str> {
        self.serial_numbers.get(i).map(String::as_str)
    }

    /// `/redfish/v1/Systems/<id>` of system `i`.
    pub fn system_path(&self, i: usize) -> String {
        format!("/redfish/v1/Systems/{}", self.system_ids[i])
    }

    /// The login user name.
    pub fn username(&self) -> &str {
        &self.options.username
    }

    /// The login password (tests use it to check that it never leaks).
    pub fn password(&self) -> &str {
        &self.options.password
    }

    /// Changes the login password while the emulator runs, as a person changing the BMC
    /// account's password does (the emulator reads its htpasswd on every request); the
    /// [`Self::credentials_dir`] follows.
    pub fn change_password(&mut self, password: &str) -> Result<()> {
        let hash = bcrypt::hash(password, BCRYPT_COST)
            .map_err(|e| HarnessError::Other(format!("hashing the emulator password: {e}")))?;
        let next = self.dir.path().join("htpasswd.next");
        write_file(
            &next,
            format!("{}:{hash}\n", self.options.username).as_bytes(),
            0o600,
        )?;
        std::fs::rename(&next, self.dir.path().join("htpasswd"))
            .map_err(HarnessError::io("replacing the emulator's htpasswd"))?;
        password.clone_into(&mut self.options.password);
        write_credentials(&self.creds_dir, &self.options.username, password)
    }

    /// Locks the account as a BMC's administrator would (or its lockout policy): every
    /// login is refused, with an error that says the account is locked, until
    /// [`RedfishBmc::unlock_account`].
    pub fn lock_account(&self) -> Result<()> {
        write_file(&self.dir.path().join(LOCK_FILE), b"", 0o600)
    }

    /// Lifts a lock, set by [`RedfishBmc::lock_account`] or by the lockout policy.
    pub fn unlock_account(&self) -> Result<()> {
        match std::fs::remove_file(self.dir.path().join(LOCK_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(HarnessError::io("removing the emulator's account lock")(e))
            }
            _ => Ok(()),
        }
    }

    /// True while the account is locked (a lockout that timed out counts as lifted once the
    /// emulator sees a request).
    pub fn account_locked(&self) -> bool {
        self.dir.path().join(LOCK_FILE).exists()
    }

    /// A directory holding `username` and `password` files (mode 0600), as a mounted
    /// Kubernetes Secret looks.
    pub fn credentials_dir(&self) -> &Path {
        &self.creds_dir
    }

    /// The CA bundle to trust for HTTPS (the certificate itself when self-signed).
    pub fn ca_pem_path(&self) -> Option<&Path> {
        self.cert.as_ref().map(|(_, files)| files.ca.as_path())
    }

    /// SHA-256 fingerprint (`AB:CD:...`) of the server certificate, for HTTPS.
    pub fn fingerprint_sha256(&self) -> Option<String> {
        self.cert
            .as_ref()
            .map(|(cert, _)| cert.fingerprint_sha256())
    }

    /// The emulator's directory (state, logs, power record).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The emulator's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("emulator.log")
    }

    /// Freezes the emulator (SIGSTOP): it accepts connections and answers nothing.
    pub fn freeze(&self) -> Result<()> {
        self.proc.freeze()
    }

    /// Thaws it (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.proc.thaw()
    }

    /// The current `PowerState` of system `i` as the emulator reports it.
    pub fn power_state(&self, i: usize) -> Result<String> {
        let (code, body) = self.curl("GET", &self.system_path(i), None)?;
        if code != 200 {
            return Err(HarnessError::Other(format!(
                "GET system {i} returned HTTP {code}"
            )));
        }
        let value: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| HarnessError::Other(format!("system {i} JSON unparsable: {e}")))?;
        value
            .get("PowerState")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| HarnessError::Other(format!("system {i} has no PowerState")))
    }

    /// Whether the emulator last applied "on" (its power record; see [`crate::power`]). The
    /// fake driver applies a change when the state is next read, which a fencing client's
    /// verification does.
    pub fn recorded_power_on(&self) -> Result<bool> {
        crate::power::is_on(self.dir.path())
    }

    /// Every power transition the emulator applied so far.
    pub fn power_log(&self) -> Result<Vec<crate::power::PowerEvent>> {
        crate::power::log(self.dir.path())
    }

    /// Sends `ComputerSystem.Reset` with `reset_type` to system `i` and returns the HTTP status.
    pub fn reset(&self, i: usize, reset_type: &str) -> Result<u16> {
        let path = format!("{}/Actions/ComputerSystem.Reset", self.system_path(i));
        let body = format!("{{\"ResetType\": \"{reset_type}\"}}");
        self.curl("POST", &path, Some(&body)).map(|(code, _)| code)
    }

    /// One request through `curl`; credentials go through its stdin config, never arguments.
    pub fn curl(&self, method: &str, path: &str, body: Option<&str>) -> Result<(u16, String)> {
        let mut config = String::new();
        let _ = writeln!(
            config,
            "user = \"{}:{}\"",
            self.options.username.replace('"', "\\\""),
            self.options.password.replace('"', "\\\"")
        );
        if let Some(ca) = self.ca_pem_path() {
            let _ = writeln!(config, "cacert = \"{}\"", ca.display());
        }
        let mut command = Command::new(tools::program("curl")?);
        command
            .args([
                "-sS",
                "--max-time",
                "10",
                "-K",
                "-",
                "-X",
                method,
                "-w",
                "\n%{http_code}",
            ])
            .arg(format!("{}{path}", self.base_url()));
        if let Some(body) = body {
            command.args(["-H", "Content-Type: application/json", "--data", body]);
        }
        let out = run_capture(
            command,
            Some(config.as_bytes()),
            &format!("curl -X {method} {path}"),
        )?;
        let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
        let code = code
            .trim()
            .parse()
            .map_err(|_| HarnessError::Other(format!("curl printed no status code: {out}")))?;
        Ok((code, body.to_owned()))
    }
}

/// Writes `username` and `password` files (0600) into `dir` (0700).
pub fn write_credentials(dir: &Path, username: &str, password: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(HarnessError::io("creating the credentials directory"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(HarnessError::io("setting the credentials directory mode"))?;
    write_file(&dir.join("username"), username.as_bytes(), 0o600)?;
    write_file(&dir.join("password"), password.as_bytes(), 0o600)
}

fn py_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn emulator_config(
    options: &RedfishOptions,
    port: u16,
    htpasswd: &Path,
    state_dir: &Path,
    system_ids: &[String],
    cert: Option<&ServerCertFiles>,
) -> String {
    let power = if options.initially_on { "On" } else { "Off" };
    let systems: Vec<String> = system_ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            format!(
                "{{'uuid': {}, 'name': 'host-{i}', 'power_state': '{power}', \
                 'external_notifier': False, 'nics': [{{'mac': '52:54:00:00:00:{i:02x}', \
                 'ip': '127.0.0.1'}}]}}",
                py_str(id)
            )
        })
        .collect();
    let mut text = format!(
        "SUSHY_EMULATOR_LISTEN_IP = '{bind}'\n\
         SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
         SUSHY_EMULATOR_FAKE_DRIVER = True\n\
         SUSHY_EMULATOR_STATE_DIR = {}\n\
         SUSHY_EMULATOR_AUTH_FILE = {}\n\
         SUSHY_EMULATOR_FAKE_SYSTEMS = [{}]\n",
        py_str(&state_dir.to_string_lossy()),
        py_str(&htpasswd.to_string_lossy()),
        systems.join(", "),
        bind = options.bind,
    );
    if let Some(cert) = cert {
        let _ = write!(
            text,
            "SUSHY_EMULATOR_SSL_CERT = {}\nSUSHY_EMULATOR_SSL_KEY = {}\n",
            py_str(&cert.cert.to_string_lossy()),
            py_str(&cert.key.to_string_lossy())
        );
    }
    text
}
