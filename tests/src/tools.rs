//! Locating the programs the harness runs.
//!
//! Each program can be overridden with an environment variable, so the same tests run against
//! Debian's etcd 3.4, a 3.5 build and the 3.6 build (`METALGUARD_ETCD_BIN`; `scripts/test.sh`
//! runs the etcd matrix that way), or a venv elsewhere.

use std::path::{Path, PathBuf};

use crate::{HarnessError, Result};

const SETUP_HINT: &str = "run scripts/setup.sh";

/// The repository root (the parent of this crate's directory).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// Finds `name` on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn from_env_or_path(var: &str, name: &str) -> Result<PathBuf> {
    if let Some(value) = std::env::var_os(var) {
        let path = PathBuf::from(value);
        if is_executable(&path) {
            return Ok(path);
        }
        return Err(HarnessError::MissingProgram {
            program: name.to_owned(),
            hint: format!("{var}={} is not an executable file", path.display()),
        });
    }
    which(name).ok_or_else(|| HarnessError::MissingProgram {
        program: name.to_owned(),
        hint: format!("not on PATH and {var} unset; {SETUP_HINT}"),
    })
}

/// The `etcd` server binary: `METALGUARD_ETCD_BIN`, else `PATH`.
pub fn etcd_bin() -> Result<PathBuf> {
    from_env_or_path("METALGUARD_ETCD_BIN", "etcd")
}

/// An etcd release, as `etcd --version` names it (`etcd Version: 3.6.16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EtcdVersion {
    /// Major version (3).
    pub major: u32,
    /// Minor version (4, 5, 6).
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

impl EtcdVersion {
    /// The version on the `etcd Version: ` line of `etcd --version`'s output.
    pub fn parse(version_output: &str) -> Option<Self> {
        let version = version_output
            .lines()
            .find_map(|line| line.strip_prefix("etcd Version: "))?;
        let mut parts = version.trim().splitn(3, '.').map(str::parse::<u32>);
        Some(Self {
            major: parts.next()?.ok()?,
            minor: parts.next()?.ok()?,
            patch: parts.next()?.ok()?,
        })
    }

    /// Whether this release is `major.minor` or later.
    pub fn at_least(self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl std::fmt::Display for EtcdVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The release of the etcd binary the harness runs ([`etcd_bin`]), from its `--version`: tests
/// that depend on the release ask this instead of assuming one (the suite runs on 3.4, 3.5
/// and 3.6).
pub fn etcd_version() -> Result<EtcdVersion> {
    let etcd = etcd_bin()?;
    let output = std::process::Command::new(&etcd)
        .arg("--version")
        .output()
        .map_err(HarnessError::io(format!(
            "running {} --version",
            etcd.display()
        )))?;
    let text = String::from_utf8_lossy(&output.stdout);
    EtcdVersion::parse(&text).ok_or_else(|| {
        HarnessError::Other(format!(
            "{} --version names no etcd version: {text}",
            etcd.display()
        ))
    })
}

/// Prometheus's `promtool` (Debian `prometheus`): `METALGUARD_PROMTOOL_BIN`, else `PATH`.
pub fn promtool_bin() -> Result<PathBuf> {
    from_env_or_path("METALGUARD_PROMTOOL_BIN", "promtool")
}

/// The `etcdctl` binary: `METALGUARD_ETCDCTL_BIN`, else next to the etcd binary, else `PATH`.
pub fn etcdctl_bin() -> Result<PathBuf> {
    if std::env::var_os("METALGUARD_ETCDCTL_BIN").is_none()
        && let Some(sibling) = etcd_bin()?.parent().map(|dir| dir.join("etcdctl"))
        && is_executable(&sibling)
    {
        return Ok(sibling);
    }
    from_env_or_path("METALGUARD_ETCDCTL_BIN", "etcdctl")
}

/// The version a Go module in `tests/kube/` pins: the second field of the first line of its
/// `go.mod` that starts with `prefix` (`require k8s.io/kubernetes v1.37.2`,
/// `\tgo.etcd.io/etcd/server/v3 v3.6.16`).
fn pinned_version(module_dir: &str, prefix: &str) -> Result<String> {
    let path = repo_root()
        .join("tests/kube")
        .join(module_dir)
        .join("go.mod");
    let text = std::fs::read_to_string(&path)
        .map_err(HarnessError::io(format!("reading {}", path.display())))?;
    text.lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .ok_or_else(|| HarnessError::Other(format!("{} pins no {prefix}", path.display())))
}

/// The Kubernetes release the tests run (`tests/kube/k8s/go.mod`), e.g. `v1.37.2`.
pub fn kube_version() -> Result<String> {
    pinned_version("k8s", "require k8s.io/kubernetes ")
}

/// The etcd release the Kubernetes tests run (`tests/kube/etcd/go.mod`), e.g. `v3.6.16`.
pub fn etcd36_version() -> Result<String> {
    pinned_version("etcd", "go.etcd.io/etcd/server/v3 ")
}

/// `path` if it is an executable file; else an error naming `var`, the variable that would
/// point elsewhere.
fn built_program(var: &str, path: PathBuf, name: &str) -> Result<PathBuf> {
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(HarnessError::MissingProgram {
            program: name.to_owned(),
            hint: format!(
                "{} is missing; scripts/setup.sh builds it with scripts/kube-build.sh (or set {var})",
                path.display()
            ),
        })
    }
}

/// A Kubernetes binary (`kube-apiserver`, `kube-controller-manager`, `kubectl`) of the pinned
/// release: in `METALGUARD_KUBE_BIN_DIR`, else `<repo>/.tools/kube/<version>/`.
pub fn kube_bin(name: &str) -> Result<PathBuf> {
    kube_bin_in(
        std::env::var_os("METALGUARD_KUBE_BIN_DIR").map(PathBuf::from),
        name,
    )
}

/// `name` in `dir` (the variable's directory), else in `<repo>/.tools/kube/<version>/`.
fn kube_bin_in(dir: Option<PathBuf>, name: &str) -> Result<PathBuf> {
    let dir = match dir {
        Some(dir) => dir,
        None => repo_root().join(".tools/kube").join(kube_version()?),
    };
    built_program("METALGUARD_KUBE_BIN_DIR", dir.join(name), name)
}

/// The etcd 3.6 server the Kubernetes tests run: `METALGUARD_ETCD36_BIN`, else
/// `<repo>/.tools/etcd/<version>/etcd` (never Debian's 3.4 on `PATH`).
pub fn etcd36_bin() -> Result<PathBuf> {
    let path = match std::env::var_os("METALGUARD_ETCD36_BIN") {
        Some(path) => PathBuf::from(path),
        None => repo_root()
            .join(".tools/etcd")
            .join(etcd36_version()?)
            .join("etcd"),
    };
    built_program("METALGUARD_ETCD36_BIN", path, "etcd 3.6")
}

/// `etcdctl` next to [`etcd36_bin`].
pub fn etcdctl36_bin() -> Result<PathBuf> {
    let etcd = etcd36_bin()?;
    let etcdctl = etcd.with_file_name("etcdctl");
    built_program("METALGUARD_ETCD36_BIN", etcdctl, "etcdctl 3.6")
}

/// The Python virtual environment holding sushy-tools and pyghmi:
/// `METALGUARD_VENV`, else `<repo>/.tools/venv`.
pub fn venv_dir() -> PathBuf {
    std::env::var_os("METALGUARD_VENV")
        .map_or_else(|| repo_root().join(".tools").join("venv"), PathBuf::from)
}

/// The venv's Python interpreter.
pub fn venv_python() -> Result<PathBuf> {
    let python = venv_dir().join("bin").join("python3");
    if is_executable(&python) {
        Ok(python)
    } else {
        Err(HarnessError::MissingProgram {
            program: "python3 (venv with sushy-tools and pyghmi)".to_owned(),
            hint: format!("{} missing; {SETUP_HINT}", python.display()),
        })
    }
}

/// Any other program from `PATH` (ipmi_sim, ipmitool, curl, ...).
pub fn program(name: &str) -> Result<PathBuf> {
    which(name).ok_or_else(|| HarnessError::MissingProgram {
        program: name.to_owned(),
        hint: format!("not on PATH; {SETUP_HINT}"),
    })
}

/// A file shipped with the harness in `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name)
}

/// Whether temporary directories should be kept after the test (`METALGUARD_KEEP_TMP=1`).
pub fn keep_tmp() -> bool {
    std::env::var_os("METALGUARD_KEEP_TMP").is_some_and(|v| v == "1")
}

/// Creates a temporary directory for one component. Its name starts with `mg-harness-` so
/// stray processes are easy to find (`pgrep -f mg-harness-`).
pub fn temp_dir(component: &str) -> Result<tempfile::TempDir> {
    let mut dir = tempfile::Builder::new()
        .prefix(&format!("mg-harness-{component}-"))
        .tempdir()
        .map_err(HarnessError::io(format!(
            "creating a temporary directory for {component}"
        )))?;
    if keep_tmp() {
        dir.disable_cleanup(true);
    }
    Ok(dir)
}

/// A random lower-case hex string of `len` characters (not cryptographic; test fixtures only).
pub fn random_token(len: usize) -> String {
    use std::fmt::Write as _;
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::with_capacity(len + 16);
    while out.len() < len {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(out.len());
        let _ = write!(out, "{:016x}", hasher.finish());
    }
    out.truncate(len);
    out
}

/// A random UUID-shaped identifier.
pub fn random_uuid() -> String {
    let hex = random_token(32);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::EtcdVersion;

    #[test]
    fn etcd_versions_are_read_from_each_release_s_version_output() {
        let debian = "etcd Version: 3.4.23\nGit SHA: Not provided\nGo Version: go1.19.8\n";
        let built = "etcd Version: 3.6.16\nAPI Version: 3.6\nGo Version: go1.26.8\n";
        let v34 = EtcdVersion::parse(debian).unwrap();
        let v36 = EtcdVersion::parse(built).unwrap();
        assert_eq!((v34.major, v34.minor, v34.patch), (3, 4, 23));
        assert_eq!(v36.to_string(), "3.6.16");
        assert!(v36.at_least(3, 6) && v36.at_least(3, 5) && !v34.at_least(3, 5));
        assert_eq!(EtcdVersion::parse("etcdctl version: 3.6.16\n"), None);
        assert_eq!(EtcdVersion::parse("etcd Version: 3.x.1\n"), None);
    }

    #[test]
    fn a_kube_bin_dir_names_the_directory_of_the_binaries() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let apiserver = dir.path().join("kube-apiserver");
        std::fs::write(&apiserver, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&apiserver, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = super::kube_bin_in(Some(dir.path().to_owned()), "kube-apiserver").unwrap();
        assert_eq!(found, apiserver);
        let missing = super::kube_bin_in(Some(dir.path().to_owned()), "kubectl").unwrap_err();
        assert!(missing.to_string().contains("kubectl"), "{missing}");
    }
}
