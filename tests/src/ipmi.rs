//! IPMI-over-LAN BMCs: OpenIPMI's `ipmi_sim` (faithful: cipher suites 0-3 and 6, privilege
//! enforcement, 63 sessions) and a scriptable `pyghmi` BMC (lenient; delays and drops replies on
//! demand). Both record the power state in `power` ("1"/"0") and every transition in
//! `power.log` as `<unix ms> <event> <value>`, which the test reads.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::ports::{PortLease, reserve_port};
use crate::power;
pub use crate::power::PowerEvent;
use crate::process::{Proc, wait_until};
use crate::redfish::write_credentials;
use crate::tls::write_file;
use crate::{HarnessError, Result, tools};

/// How long to wait for a simulator to answer after start.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// IPMI privilege level of a test account.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// ADMINISTRATOR: may control chassis power.
    Admin,
    /// OPERATOR.
    Operator,
    /// USER: may read status only.
    User,
}

impl Privilege {
    const ALL: [Self; 3] = [Self::Admin, Self::Operator, Self::User];

    fn login(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Operator => "operator",
            Self::User => "viewer",
        }
    }

    fn sim_level(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Operator => "operator",
            Self::User => "user",
        }
    }
}

/// Options for [`IpmiSim::start`] and [`PyghmiBmc::start`].
#[derive(Debug, Clone)]
pub struct IpmiOptions {
    /// Power state at start.
    pub initially_on: bool,
    /// Password of every test account (random by default; at most 16 characters).
    pub password: String,
    /// The address the BMC listens on (127.0.0.1 by default).
    pub bind: Ipv4Addr,
    /// The system UUID the BMC answers Get System GUID with (canonical text; random by
    /// default), sent in SMBIOS byte order ([`smbios_guid_hex`]). `None`: pyghmi answers Get
    /// System GUID with completion code 0xC1; ipmi_sim refuses to start (it needs a GUID for
    /// RMCP+).
    pub system_uuid: Option<String>,
}

impl Default for IpmiOptions {
    fn default() -> Self {
        Self {
            initially_on: true,
            password: tools::random_token(16),
            bind: Ipv4Addr::LOCALHOST,
            system_uuid: Some(tools::random_uuid()),
        }
    }
}

/// `uuid` (canonical text) as the 32 hex digits of its 16 bytes in SMBIOS order (DSP0134
/// §7.2.1: `time_low`, `time_mid` and `time_hi_and_version` little-endian, the rest as
/// written): what a BMC following that convention sends for Get System GUID. Written here
/// independently of the client's decoder, which the tests check against it.
pub fn smbios_guid_hex(uuid: &str) -> Result<String> {
    let hex: String = uuid.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(HarnessError::Other(format!("not a uuid: {uuid}")));
    }
    let byte = |i: usize| &hex[i * 2..i * 2 + 2];
    let order = [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15];
    Ok(order
        .iter()
        .map(|&i| byte(i))
        .collect::<String>()
        .to_lowercase())
}

/// State shared by both IPMI flavours: the directory, the port and the power record.
#[derive(Debug)]
struct IpmiState {
    bind: Ipv4Addr,
    port: PortLease,
    password: String,
    system_uuid: Option<String>,
    dir: tempfile::TempDir,
}

impl IpmiState {
    fn new(component: &str, options: IpmiOptions) -> Result<Self> {
        if options.password.len() > 16 {
            return Err(HarnessError::Other(
                "IPMI passwords are at most 16 bytes here".into(),
            ));
        }
        let dir = tools::temp_dir(component)?;
        let state = Self {
            bind: options.bind,
            port: reserve_port()?,
            password: options.password,
            system_uuid: options.system_uuid,
            dir,
        };
        power::init(state.dir.path(), options.initially_on)?;
        for privilege in Privilege::ALL {
            write_credentials(
                &state.creds_dir(privilege),
                privilege.login(),
                &state.password,
            )?;
        }
        Ok(state)
    }

    fn creds_dir(&self, privilege: Privilege) -> PathBuf {
        self.dir
            .path()
            .join(format!("credentials-{}", privilege.login()))
    }

    fn power_on(&self) -> Result<bool> {
        power::is_on(self.dir.path())
    }

    fn power_log(&self) -> Result<Vec<PowerEvent>> {
        power::log(self.dir.path())
    }

    fn wait_answering(&self, proc: &mut Proc) -> Result<()> {
        let port = self.port.port();
        wait_until("the IPMI BMC to answer", START_TIMEOUT, || {
            proc.ensure_running()?;
            Ok(answers_auth_capabilities_at(self.bind, port))
        })
    }

    fn url(&self) -> String {
        format!("ipmi://{}:{}", self.bind, self.port.port())
    }
}

/// Sends an IPMI 1.5 sessionless Get Channel Authentication Capabilities and reports whether
/// any reply came back: an independent liveness probe that works for both flavours.
pub fn answers_auth_capabilities(port: u16) -> bool {
    answers_auth_capabilities_at(Ipv4Addr::LOCALHOST, port)
}

/// [`answers_auth_capabilities`] for a BMC listening on `address`.
pub fn answers_auth_capabilities_at(address: Ipv4Addr, port: u16) -> bool {
    let Ok(socket) = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) else {
        return false;
    };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(200)));
    let header = [0x20u8, 0x18];
    let body = [0x81u8, 0x00, 0x38, 0x8e, 0x04];
    let mut packet = vec![0x06, 0x00, 0xff, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    packet.extend_from_slice(&header);
    packet.push(checksum(&header));
    packet.extend_from_slice(&body);
    packet.push(checksum(&body));
    if socket.send_to(&packet, (address, port)).is_err() {
        return false;
    }
    let mut buf = [0u8; 512];
    socket.recv_from(&mut buf).is_ok()
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// OpenIPMI's `ipmi_sim` with users `admin` (ADMINISTRATOR), `operator` (OPERATOR) and
/// `viewer` (USER), all with [`IpmiOptions::password`]; anonymous login disabled.
#[derive(Debug)]
pub struct IpmiSim {
    proc: Proc,
    state: IpmiState,
}

impl IpmiSim {
    /// Starts the simulator and waits until it answers.
    pub fn start(options: IpmiOptions) -> Result<Self> {
        let program = tools::program("ipmi_sim")?;
        let Some(uuid) = options.system_uuid.as_deref() else {
            return Err(HarnessError::Other(
                "ipmi_sim needs a system GUID: it offers RMCP+ only with one".into(),
            ));
        };
        let guid = smbios_guid_hex(uuid)?;
        let state = IpmiState::new("ipmisim", options)?;
        let dir = state.dir.path();
        let control = dir.join("chassis_control");
        write_file(&control, chassis_control_script(dir).as_bytes(), 0o755)?;
        let lan_conf = dir.join("lan.conf");
        write_file(
            &lan_conf,
            lan_config(
                state.bind,
                state.port.port(),
                &control,
                &state.password,
                &guid,
            )
            .as_bytes(),
            0o600,
        )?;
        let emu = dir.join("sim.emu");
        write_file(&emu, EMU_COMMANDS.as_bytes(), 0o644)?;
        let sim_state = dir.join("simstate");
        std::fs::create_dir_all(&sim_state).map_err(HarnessError::io("creating ipmi_sim state"))?;

        let mut command = Command::new(program);
        command
            .arg("-c")
            .arg(&lan_conf)
            .arg("-f")
            .arg(&emu)
            .arg("-n")
            .arg("-s")
            .arg(&sim_state);
        let mut proc = Proc::spawn("ipmi_sim", command, &dir.join("ipmi_sim.log"))?;
        state.wait_answering(&mut proc)?;
        Ok(Self { proc, state })
    }

    /// The UDP port.
    pub fn port(&self) -> u16 {
        self.state.port.port()
    }

    /// `ipmi://ADDRESS:PORT` (ADDRESS is 127.0.0.1 by default).
    pub fn url(&self) -> String {
        self.state.url()
    }

    /// A credentials directory (`username`, `password`, mode 0600) for an account.
    pub fn credentials_dir(&self, privilege: Privilege) -> PathBuf {
        self.state.creds_dir(privilege)
    }

    /// The login name of an account.
    pub fn username(&self, privilege: Privilege) -> &'static str {
        privilege.login()
    }

    /// The shared password (tests use it to check that it never leaks).
    pub fn password(&self) -> &str {
        &self.state.password
    }

    /// The system UUID it answers Get System GUID with.
    pub fn system_uuid(&self) -> Option<&str> {
        self.state.system_uuid.as_deref()
    }

    /// Whether the simulated host is powered on.
    pub fn power_on(&self) -> Result<bool> {
        self.state.power_on()
    }

    /// Every power transition so far.
    pub fn power_log(&self) -> Result<Vec<PowerEvent>> {
        self.state.power_log()
    }

    /// The simulator's directory (logs, state).
    pub fn dir(&self) -> &Path {
        self.state.dir.path()
    }

    /// Freezes the simulator (SIGSTOP).
    pub fn freeze(&self) -> Result<()> {
        self.proc.freeze()
    }

    /// Thaws it (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.proc.thaw()
    }
}

/// A `pyghmi` BMC with one ADMINISTRATOR user `admin`. Lenient (no privilege checks), suite 3
/// only, and scriptable through [`PyghmiBmc::set_behaviour`].
#[derive(Debug)]
pub struct PyghmiBmc {
    proc: Proc,
    state: IpmiState,
}

impl PyghmiBmc {
    /// Starts the BMC and waits until it answers.
    pub fn start(options: IpmiOptions) -> Result<Self> {
        let python = tools::venv_python()?;
        let state = IpmiState::new("pyghmi", options)?;
        let dir = state.dir.path();
        let password_file = dir.join("bmc-password");
        write_file(&password_file, state.password.as_bytes(), 0o600)?;
        let mut command = Command::new(python);
        command
            .arg(tools::fixture("pyghmi_bmc.py"))
            .arg("--address")
            .arg(state.bind.to_string())
            .arg("--port")
            .arg(state.port.port().to_string())
            .arg("--state-dir")
            .arg(dir)
            .arg("--user")
            .arg(Privilege::Admin.login())
            .arg("--password-file")
            .arg(&password_file)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        if let Some(uuid) = &state.system_uuid {
            command.arg("--system-uuid").arg(uuid);
        }
        let mut proc = Proc::spawn("pyghmi bmc", command, &dir.join("pyghmi.log"))?;
        state.wait_answering(&mut proc)?;
        Ok(Self { proc, state })
    }

    /// The UDP port.
    pub fn port(&self) -> u16 {
        self.state.port.port()
    }

    /// `ipmi://ADDRESS:PORT` (ADDRESS is 127.0.0.1 by default).
    pub fn url(&self) -> String {
        self.state.url()
    }

    /// The credentials directory of the admin account.
    pub fn credentials_dir(&self) -> PathBuf {
        self.state.creds_dir(Privilege::Admin)
    }

    /// The password (tests use it to check that it never leaks).
    pub fn password(&self) -> &str {
        &self.state.password
    }

    /// The system UUID it answers Get System GUID with (`None`: it answers 0xC1).
    pub fn system_uuid(&self) -> Option<&str> {
        self.state.system_uuid.as_deref()
    }

    /// Whether the simulated host is powered on.
    pub fn power_on(&self) -> Result<bool> {
        self.state.power_on()
    }

    /// Every power transition so far.
    pub fn power_log(&self) -> Result<Vec<PowerEvent>> {
        self.state.power_log()
    }

    /// Delays every reply by `delay` and drops the next `drop_next` replies to IPMI commands
    /// (session set-up messages are not affected).
    pub fn set_behaviour(&self, delay: Duration, drop_next: u32) -> Result<()> {
        let dir = self.state.dir.path();
        let text = format!(
            "{{\"delay_ms\": {}, \"drop_next\": {drop_next}}}",
            delay.as_millis()
        );
        let tmp = dir.join("control.json.tmp");
        write_file(&tmp, text.as_bytes(), 0o644)?;
        std::fs::rename(&tmp, dir.join("control.json"))
            .map_err(HarnessError::io("installing the pyghmi control file"))
    }

    /// Freezes the BMC process (SIGSTOP).
    pub fn freeze(&self) -> Result<()> {
        self.proc.freeze()
    }
}

const EMU_COMMANDS: &str = "\
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
sel_enable 0x20 1000 0x0a
mc_enable 0x20
";

fn lan_config(bind: Ipv4Addr, port: u16, control: &Path, password: &str, guid: &str) -> String {
    let auths = "none md2 md5 straight";
    let mut text = format!(
        "name \"mgsim\"\n\
         set_working_mc 0x20\n\
         \x20 startlan 1\n\
         \x20   addr {bind} {port}\n\
         \x20   priv_limit admin\n\
         \x20   allowed_auths_callback {auths}\n\
         \x20   allowed_auths_user {auths}\n\
         \x20   allowed_auths_operator {auths}\n\
         \x20   allowed_auths_admin {auths}\n\
         \x20   guid {guid}\n\
         \x20 endlan\n\
         \x20 chassis_control \"{}\"\n\
         \x20 user 1 false \"\" \"\" user 10 none\n",
        control.display()
    );
    for (number, privilege) in (2..).zip(Privilege::ALL) {
        let _ = writeln!(
            text,
            "  user {number} true \"{}\" \"{password}\" {} 10 {auths}",
            privilege.login(),
            privilege.sim_level()
        );
    }
    text
}

fn chassis_control_script(dir: &Path) -> String {
    format!(
        r#"#!/bin/sh
# Generated by metalguard's test harness. ipmi_sim runs it as
# "PROG <mc> get <param>..." (answer "<param>:<value>" lines) or "PROG <mc> set <param> <value>...".
state="{dir}/power"
log="{dir}/power.log"
echo "$*" >> "{dir}/chassis_calls.log"
while [ $# -gt 0 ] && [ "$1" != get ] && [ "$1" != set ]; do shift; done
op="$1"; [ $# -gt 0 ] && shift
now() {{ date +%s%3N; }}
case "$op" in
get)
  for p in "$@"; do
    case "$p" in
      power) echo "power:$(cat "$state")" ;;
    esac
  done ;;
set)
  while [ $# -ge 2 ]; do
    p="$1"; v="$2"; shift 2
    case "$p" in
      power) echo "$v" > "$state"; echo "$(now) power $v" >> "$log" ;;
      shutdown) echo 0 > "$state"; echo "$(now) shutdown $v" >> "$log" ;;
      *) echo "$(now) $p $v" >> "$log" ;;
    esac
  done ;;
esac
exit 0
"#,
        dir = dir.display()
    )
}
