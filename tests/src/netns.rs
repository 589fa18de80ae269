//! Network namespaces for the local lab's netns mode: one namespace per host, each with a
//! veth pair whose root end sits on a lab bridge in the root namespace.
//!
//! Addresses come from 198.18.0.0/15 (set aside for benchmarking, RFC 2544): the lab takes one
//! /24 of it, gives host `i` `.(i+1)` inside its namespace and the bridge `.254` in the root
//! namespace (where the controller and the BMC emulators listen: a management network that
//! stays up when a host's link is cut). The /24 is held with a `flock` for the lab's lifetime
//! and skipped when any root-namespace address already lies in it, so two labs never collide.
//!
//! Every name starts with the lab's tag `mg<pid><letter>` (namespaces `<tag>-<i>`, bridge
//! `<tag>br`, root veth ends `<tag>v<i>`; interface names stay under 16 bytes). Dropping a
//! [`LabNetwork`] deletes what it created — after the lab killed the processes inside — and
//! [`LabNetwork::create`] first sweeps names of labs whose process is gone (a SIGKILLed test).
//! Needs root.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::fcntl::Flock;

use crate::process::run_capture;
use crate::{HarnessError, Result, tools};

/// Number of /24 subnets in 198.18.0.0/15.
const SUBNETS: u16 = 512;
/// Last octet of the root namespace's address on the lab bridge.
const GATEWAY_OCTET: u8 = 254;
/// Prefix of every name the lab creates.
const PREFIX: &str = "mg";
/// Labs started by this process so far (the tag's letter).
static LABS_IN_PROCESS: AtomicUsize = AtomicUsize::new(0);

/// One host's place on the lab network.
#[derive(Debug, Clone)]
struct HostLink {
    namespace: String,
    veth: String,
    address: Ipv4Addr,
}

/// The lab's namespaces, veths and bridge. Dropping it deletes them.
#[derive(Debug)]
pub struct LabNetwork {
    tag: String,
    subnet: u16,
    bridge: Option<String>,
    hosts: Vec<HostLink>,
    ip: PathBuf,
    _subnet_lock: Flock<File>,
}

impl LabNetwork {
    /// Creates the bridge and `hosts` namespaces with their links up; fails with a clear
    /// message when not root.
    pub fn create(hosts: usize) -> Result<Self> {
        require_root()?;
        let ip = tools::program("ip")?;
        sweep_stale(&ip);
        let seq = LABS_IN_PROCESS.fetch_add(1, Ordering::Relaxed);
        let letter = char::from(b'a' + u8::try_from(seq % 26).unwrap_or(0));
        let tag = format!("{PREFIX}{}{letter}", std::process::id());
        let (subnet, lock) = lock_free_subnet(&ip)?;
        let mut network = Self {
            bridge: None,
            hosts: Vec::new(),
            subnet,
            ip,
            _subnet_lock: lock,
            tag,
        };
        // Each step records what it created first, so a failure half-way is cleaned up too.
        let bridge = format!("{}br", network.tag);
        network.ip_cmd(&["link", "add", &bridge, "type", "bridge"])?;
        network.bridge = Some(bridge.clone());
        let gateway = format!("{}/24", network.gateway());
        network.ip_cmd(&["addr", "add", &gateway, "dev", &bridge])?;
        network.ip_cmd(&["link", "set", &bridge, "up"])?;
        for i in 0..hosts {
            network.add_host(i, &bridge)?;
        }
        Ok(network)
    }

    fn add_host(&mut self, i: usize, bridge: &str) -> Result<()> {
        let octet = u8::try_from(i + 1)
            .ok()
            .filter(|o| *o < GATEWAY_OCTET)
            .ok_or_else(|| HarnessError::Other(format!("no lab address for host {i}")))?;
        let link = HostLink {
            namespace: format!("{}-{i}", self.tag),
            veth: format!("{}v{i}", self.tag),
            address: self.address(octet),
        };
        self.hosts.push(link.clone());
        let ns = link.namespace.as_str();
        self.ip_cmd(&["netns", "add", ns])?;
        self.ip_cmd(&[
            "link", "add", &link.veth, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        self.ip_cmd(&["link", "set", &link.veth, "master", bridge, "up"])?;
        let address = format!("{}/24", link.address);
        self.ip_cmd(&["-n", ns, "addr", "add", &address, "dev", "eth0"])?;
        self.ip_cmd(&["-n", ns, "link", "set", "eth0", "up"])?;
        // The agent's metrics listen on 127.0.0.1 inside the namespace.
        self.ip_cmd(&["-n", ns, "link", "set", "lo", "up"])
    }

    fn address(&self, octet: u8) -> Ipv4Addr {
        let [hi, lo] = self.subnet.to_be_bytes();
        Ipv4Addr::new(198, 18 + hi, lo, octet)
    }

    /// The tag every name of this lab starts with (for leftover checks).
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The root namespace's address on the lab bridge (`198.18.X.254`).
    pub fn gateway(&self) -> Ipv4Addr {
        self.address(GATEWAY_OCTET)
    }

    /// Host `i`'s address inside its namespace (`198.18.X.(i+1)`).
    pub fn host_address(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].address
    }

    /// Host `i`'s namespace name.
    pub fn namespace(&self, i: usize) -> &str {
        &self.hosts[i].namespace
    }

    /// Cuts host `i` off: its veth's root end goes down, so the host sees its carrier drop
    /// and nothing reaches it or leaves it; its processes keep running.
    pub fn partition(&self, i: usize) -> Result<()> {
        self.ip_cmd(&["link", "set", &self.hosts[i].veth, "down"])
    }

    /// Reconnects host `i`.
    pub fn heal(&self, i: usize) -> Result<()> {
        self.ip_cmd(&["link", "set", &self.hosts[i].veth, "up"])
    }

    fn ip_cmd(&self, args: &[&str]) -> Result<()> {
        ip_cmd(&self.ip, args)
    }
}

impl Drop for LabNetwork {
    fn drop(&mut self) {
        // Deleting a namespace only removes its name while a process still lives in it, and
        // its veth would stay: delete the root ends explicitly.
        for link in &self.hosts {
            let _ = ip_cmd(&self.ip, &["link", "del", &link.veth]);
            let _ = ip_cmd(&self.ip, &["netns", "del", &link.namespace]);
        }
        if let Some(bridge) = &self.bridge {
            let _ = ip_cmd(&self.ip, &["link", "del", bridge]);
        }
    }
}

/// A command that runs `program` in namespace `netns` (through `ip netns exec`, which execs
/// without forking: the child's pid is the program's), or directly when `netns` is `None`.
pub fn command_in(netns: Option<&str>, program: &Path) -> Result<Command> {
    Ok(match netns {
        Some(ns) => {
            let mut command = Command::new(tools::program("ip")?);
            command.args(["netns", "exec", ns]).arg(program);
            command
        }
        None => Command::new(program),
    })
}

/// Namespaces and links whose name starts with `tag` (empty once a lab cleaned up).
pub fn leftovers(tag: &str) -> Result<Vec<String>> {
    let ip = tools::program("ip")?;
    Ok(existing_names(&ip)?
        .into_iter()
        .filter(|n| n.starts_with(tag))
        .collect())
}

fn require_root() -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    let uid = std::fs::metadata("/proc/self")
        .map_err(HarnessError::io(
            "reading the effective user id from /proc/self",
        ))?
        .uid();
    if uid == 0 {
        Ok(())
    } else {
        Err(HarnessError::Other(format!(
            "the lab's netns mode needs root (it creates network namespaces, veth pairs and a \
             bridge); running as uid {uid}"
        )))
    }
}

fn ip_cmd(ip: &Path, args: &[&str]) -> Result<()> {
    let mut command = Command::new(ip);
    command.args(args);
    run_capture(command, None, &format!("ip {}", args.join(" "))).map(drop)
}

/// Network namespace names and root-namespace link names.
fn existing_names(ip: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let mut netns = Command::new(ip);
    netns.args(["netns", "list"]);
    for line in run_capture(netns, None, "ip netns list")?.lines() {
        names.extend(line.split_whitespace().next().map(str::to_owned));
    }
    let mut links = Command::new(ip);
    links.args(["-o", "link", "show"]);
    for line in run_capture(links, None, "ip -o link show")?.lines() {
        // `7: mg123abr: <BROADCAST,...` or `8: mg123av0@if2: ...`
        if let Some(name) = line.split(": ").nth(1) {
            names.push(name.split('@').next().unwrap_or(name).to_owned());
        }
    }
    Ok(names)
}

/// The pid in a lab name (`mg<pid><letter>` followed by `br`, `v<i>` or `-<i>`), if it is one.
fn lab_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (pid, rest) = rest.split_at(digits);
    let mut chars = rest.chars();
    if !chars.next()?.is_ascii_lowercase() {
        return None;
    }
    let suffix = chars.as_str();
    let numbered =
        |s: Option<&str>| s.is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let ours =
        suffix == "br" || numbered(suffix.strip_prefix('v')) || numbered(suffix.strip_prefix('-'));
    if ours { pid.parse().ok() } else { None }
}

/// Deletes namespaces and links of labs whose process no longer exists.
fn sweep_stale(ip: &Path) {
    let Ok(names) = existing_names(ip) else {
        return;
    };
    for name in names {
        let Some(pid) = lab_pid(&name) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let args: [&str; 3] = if name.contains('-') {
            ["netns", "del", &name]
        } else {
            ["link", "del", &name]
        };
        // A veth may already be gone with its peer's namespace.
        let _ = ip_cmd(ip, &args);
    }
}

/// Locks a /24 of 198.18.0.0/15 that no root-namespace address uses, starting from one
/// derived from the pid.
fn lock_free_subnet(ip: &Path) -> Result<(u16, Flock<File>)> {
    let dir = std::env::temp_dir().join("metalguard-harness-netns");
    std::fs::create_dir_all(&dir).map_err(HarnessError::io(format!(
        "creating the subnet lock directory {}",
        dir.display()
    )))?;
    let mut command = Command::new(ip);
    command.args(["-o", "-4", "addr", "show"]);
    let in_use = run_capture(command, None, "ip -o -4 addr show")?;
    let start = u16::try_from(std::process::id() % u32::from(SUBNETS)).unwrap_or(0);
    for k in 0..SUBNETS {
        let subnet = (start + k) % SUBNETS;
        let [hi, lo] = subnet.to_be_bytes();
        if in_use.contains(&format!("inet 198.{}.{lo}.", 18 + hi)) {
            continue;
        }
        if let Some(lock) = crate::ports::try_lock(&dir.join(format!("subnet-{subnet}.lock")))? {
            return Ok((subnet, lock));
        }
    }
    Err(HarnessError::Other(
        "every /24 of 198.18.0.0/15 is in use or locked by another lab".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_names_are_recognised_with_their_pid() {
        assert_eq!(lab_pid("mg4242abr"), Some(4242));
        assert_eq!(lab_pid("mg4242av0"), Some(4242));
        assert_eq!(lab_pid("mg4242c-12"), Some(4242));
        for foreign in [
            "mgmt0",
            "mg4242",
            "mg4242a",
            "mg4242av",
            "mg4242a-x",
            "eth0",
            "mg4242Abr",
        ] {
            assert_eq!(lab_pid(foreign), None, "{foreign}");
        }
    }
}
