//! The host-wide state a node of [`super::NodeBed`] changes, and its undoing.
//!
//! kubelet, kube-proxy, the bridge CNI plugin and containerd write outside the directories
//! they are given (../shared/KUBELET.md lists what was measured on this machine kind):
//! sysctls, iptables chains in the root network namespace, fixed paths (`/var/lib/kubelet`,
//! `/var/log/containers`, `/run/netns`, `/var/lib/cni`, `/run/containerd`), bridges and
//! cgroups. [`HostState::capture`] records what is there before the bed starts;
//! [`HostState::restore`] puts back what changed; [`HostState::differences`] says what is
//! still different (a test's final check: nothing).
//!
//! One bed runs on a host at a time: [`HostLock`] is a file lock every bed takes first.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};

use crate::process::wait_until;
use crate::{HarnessError, Result};

/// Sysctls kubelet, kube-proxy and the bridge plugin set (KUBELET.md), restored afterwards.
pub const SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "kernel.panic",
    "kernel.panic_on_oops",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.default.forwarding",
];
/// Fixed paths kubelet, containerd and the CNI plugins create whatever they are told.
pub const FIXED_PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/opt/containerd",
];
/// Where containerd's CNI code puts a Pod's network namespace (`cni-<uuid>`). The directory
/// itself is shared with `ip netns` (the lab's netns mode): only `cni-*` entries are ours.
const NETNS_DIR: &str = "/run/netns";
/// The iptables tables kubelet and kube-proxy write.
const TABLES: &[&str] = &["filter", "nat", "mangle"];
/// How long a bed waits for another bed on the same host to finish.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// The host-wide lock of node beds (one at a time per host).
#[derive(Debug)]
pub struct HostLock {
    _lock: Flock<File>,
}

impl HostLock {
    /// Takes the lock, waiting up to 10 minutes for another bed to finish.
    pub fn take() -> Result<Self> {
        let path = std::env::temp_dir().join("metalguard-harness-node.lock");
        let mut file = Some(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(HarnessError::io(format!("opening {}", path.display())))?,
        );
        let mut held = None;
        wait_until("the host's node-bed lock", LOCK_WAIT, || {
            let Some(f) = file.take() else {
                return Ok(true);
            };
            match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    held = Some(lock);
                    Ok(true)
                }
                Err((f, _)) => {
                    file = Some(f);
                    Ok(false)
                }
            }
        })?;
        held.map(|lock| Self { _lock: lock })
            .ok_or_else(|| HarnessError::Other("node-bed lock not taken".into()))
    }
}

/// What the host looked like before a bed started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    sysctls: Vec<(String, Option<String>)>,
    chains: BTreeSet<String>,
    paths: BTreeSet<String>,
    links: BTreeSet<String>,
}

impl HostState {
    /// Reads the sysctls, iptables chains, fixed paths and links now.
    pub fn capture() -> Self {
        Self {
            sysctls: SYSCTLS
                .iter()
                .map(|k| ((*k).to_owned(), read_sysctl(k)))
                .collect(),
            chains: chains(),
            paths: FIXED_PATHS
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| (*p).to_owned())
                .collect(),
            links: links(),
        }
    }

    /// Puts back what changed since [`HostState::capture`]: iptables chains added (after the
    /// rules that jump to them), sysctls, fixed paths created (after unmounting what is
    /// mounted below them), and links added whose name starts with `link_prefix` or `veth`
    /// (a Pod's host end).
    pub fn restore(&self, link_prefix: &str) {
        let now = chains();
        let added: Vec<&String> = now.difference(&self.chains).collect();
        for chain in &added {
            let (family, table, name) = split_chain(chain);
            delete_jumps_to(family, table, name);
            let _ = iptables(family, &["-t", table, "-F", name]);
        }
        for chain in &added {
            let (family, table, name) = split_chain(chain);
            let _ = iptables(family, &["-t", table, "-X", name]);
        }
        for (key, value) in &self.sysctls {
            if let Some(value) = value
                && read_sysctl(key).as_ref() != Some(value)
            {
                let _ = std::fs::write(sysctl_path(key), value);
            }
        }
        for netns in cni_netns() {
            let _ = Command::new("umount").arg("-l").arg(&netns).output();
            let _ = std::fs::remove_file(&netns);
        }
        for path in FIXED_PATHS {
            if !self.paths.contains(*path) && Path::new(path).exists() {
                unmount_below(Path::new(path));
                let _ = std::fs::remove_dir_all(path);
            }
        }
        // A Pod's veth goes with its network namespace, which the kernel cleans up a moment
        // after the last reference is gone: give it that moment, then delete what is left.
        let ours = |l: &String| l.starts_with(link_prefix) || l.starts_with("veth");
        let _ = wait_until("the Pods' links to go", Duration::from_secs(10), || {
            Ok(!links().difference(&self.links).any(ours))
        });
        for link in links().difference(&self.links).filter(|l| ours(l)) {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }

    /// What differs from this capture now (empty: the host is as it was). Links count when
    /// their name starts with `link_prefix` or `veth` (a Pod's host end); others belong to
    /// whatever else runs on the host meanwhile.
    pub fn differences(&self, link_prefix: &str) -> Vec<String> {
        let now = Self::capture();
        let mut out = Vec::new();
        for ((key, before), (_, after)) in self.sysctls.iter().zip(&now.sysctls) {
            if before != after {
                out.push(format!("sysctl {key}: {before:?} before, {after:?} now"));
            }
        }
        for chain in now.chains.symmetric_difference(&self.chains) {
            out.push(format!("iptables chain {chain} added or removed"));
        }
        for path in now.paths.symmetric_difference(&self.paths) {
            out.push(format!("path {path} created or removed"));
        }
        for link in now
            .links
            .symmetric_difference(&self.links)
            .filter(|l| l.starts_with(link_prefix) || l.starts_with("veth"))
        {
            out.push(format!("link {link} added or removed"));
        }
        for netns in cni_netns() {
            out.push(format!("network namespace {} left", netns.display()));
        }
        out
    }
}

/// The Pods' network namespaces (`/run/netns/cni-*`).
fn cni_netns() -> Vec<PathBuf> {
    std::fs::read_dir(NETNS_DIR)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("cni-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

fn read_sysctl(key: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(key))
        .ok()
        .map(|v| v.trim().to_owned())
}

/// `iptables` or `ip6tables` with `args`; its stdout.
fn iptables(family: &str, args: &[&str]) -> Option<String> {
    let program = if family == "6" {
        "ip6tables"
    } else {
        "iptables"
    };
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every chain as `FAMILY/TABLE/NAME` (`4/nat/KUBE-SERVICES`), from `iptables-save`.
fn chains() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (family, program) in [("4", "iptables-save"), ("6", "ip6tables-save")] {
        for table in TABLES {
            let Ok(saved) = Command::new(program).args(["-t", table]).output() else {
                continue;
            };
            for line in String::from_utf8_lossy(&saved.stdout).lines() {
                if let Some(rest) = line.strip_prefix(':')
                    && let Some(name) = rest.split_whitespace().next()
                {
                    out.insert(format!("{family}/{table}/{name}"));
                }
            }
        }
    }
    out
}

fn split_chain(chain: &str) -> (&str, &str, &str) {
    let mut parts = chain.splitn(3, '/');
    let family = parts.next().unwrap_or("4");
    let table = parts.next().unwrap_or("filter");
    let name = parts.next().unwrap_or("");
    (family, table, name)
}

/// Deletes, by number, every rule of `table` whose target is `chain`.
fn delete_jumps_to(family: &str, table: &str, chain: &str) {
    let Some(listing) = iptables(family, &["-t", table, "-L", "-n", "--line-numbers"]) else {
        return;
    };
    let mut current = String::new();
    let mut doomed: Vec<(String, u32)> = Vec::new();
    for line in listing.lines() {
        if let Some(rest) = line.strip_prefix("Chain ") {
            rest.split_whitespace()
                .next()
                .unwrap_or("")
                .clone_into(&mut current);
            continue;
        }
        let mut fields = line.split_whitespace();
        let (Some(number), Some(target)) = (fields.next(), fields.next()) else {
            continue;
        };
        if target == chain
            && let Ok(number) = number.parse()
        {
            doomed.push((current.clone(), number));
        }
    }
    // Highest number first in each chain, so that the others keep theirs.
    doomed.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    for (from, number) in doomed {
        let _ = iptables(family, &["-t", table, "-D", &from, &number.to_string()]);
    }
}

/// Network link names in the root namespace.
fn links() -> BTreeSet<String> {
    let Ok(out) = Command::new("ip").args(["-o", "link", "show"]).output() else {
        return BTreeSet::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

/// Mount points at or below `dir` (`/proc/self/mountinfo`), deepest first.
pub fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| *point == prefix || point.starts_with(&format!("{prefix}/")))
        .map(str::to_owned)
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    mounts
}

/// Unmounts (lazily) everything mounted at or below `dir`, deepest first.
pub fn unmount_below(dir: &Path) {
    for mount in mounts_below(dir) {
        let _ = Command::new("umount").arg("-l").arg(&mount).output();
    }
}

/// The cgroup hierarchies under `/sys/fs/cgroup`: every v1 controller directory and the
/// `unified` (v2) mount, or the root itself on a v2-only host.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && !p.is_symlink())
        .collect()
}

/// Creates cgroup `/name` in every hierarchy (kubelet wants its `cgroupRoot` present in each
/// on cgroup v1), with the parent's cpus and memory nodes where cpuset needs them.
pub fn create_cgroup(name: &str) -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(name);
        std::fs::create_dir_all(&dir).map_err(HarnessError::io(format!(
            "creating cgroup {}",
            dir.display()
        )))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(dir.join(file), value.trim()).map_err(HarnessError::io(format!(
                    "writing {}",
                    dir.join(file).display()
                )))?;
            }
        }
    }
    Ok(())
}

/// Kills every process in cgroup `/name` (any hierarchy) and removes the cgroup tree,
/// deepest first; returns the directories that could not be removed.
pub fn remove_cgroup(name: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for hierarchy in cgroup_hierarchies() {
        let top = hierarchy.join(name);
        if !top.is_dir() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in &dirs {
            kill_procs(dir);
        }
        for dir in dirs {
            let gone = wait_until("a cgroup to empty", Duration::from_secs(10), || {
                kill_procs(&dir);
                Ok(std::fs::remove_dir(&dir).is_ok() || !dir.exists())
            });
            if gone.is_err() {
                left.push(dir);
            }
        }
    }
    left
}

/// Cgroup directories `/name` still present in any hierarchy.
pub fn cgroups_left(name: &str) -> Vec<PathBuf> {
    cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(name))
        .filter(|d| d.is_dir())
        .collect()
}

fn kill_procs(dir: &Path) {
    // A frozen cgroup's processes die only once thawed.
    let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                collect_dirs(&path, out);
            }
        }
    }
}
