//! This host's identity from its firmware tables, for the controller to compare with what
//! the host's BMC says (issue 25: a BMC that answers for another server must be found before
//! a fence goes through it).
//!
//! Read once at start from `[state] dmi_dir` (default `/sys/class/dmi/id`): `product_uuid`
//! (Linux prints the SMBIOS UUID in canonical text, first three fields decoded little-endian
//! from SMBIOS 2.6 on, as dmidecode and a Redfish BMC do) and `product_serial`. Both are mode
//! 0400 root on most kernels, so the packaged agent (user `metalguard`) usually cannot read
//! them: a field that cannot be read is absent with the reason, said once in the log, and the
//! agent goes on — an identity is evidence for the controller, never a reason to stop.

use std::io::Read as _;
use std::path::Path;

use metalguard_api::identity::SystemIdentity;

/// The DMI attribute holding the system UUID.
pub const PRODUCT_UUID: &str = "product_uuid";
/// The DMI attribute holding the system serial number.
pub const PRODUCT_SERIAL: &str = "product_serial";
/// The most read from one attribute: a DMI string is at most a few hundred bytes, and a
/// misconfigured `dmi_dir` must not make the agent read a large file.
const MAX_READ: u64 = 4096;

/// Reads `dir/product_uuid` and `dir/product_serial`; never fails.
pub fn read(dir: &Path) -> SystemIdentity {
    let mut identity = SystemIdentity::default();
    identity.set_uuid(read_attribute(dir, PRODUCT_UUID).and_then(|text| {
        text.trim()
            .parse()
            .map_err(|_| format!("{} does not hold a uuid", dir.join(PRODUCT_UUID).display()))
    }));
    identity.set_serial_number(
        read_attribute(dir, PRODUCT_SERIAL)
            .as_deref()
            .map_err(Clone::clone),
    );
    identity
}

/// [`read`], and says in the log what was found and why a field is absent (once: the
/// agent reads its identity only at start).
pub fn read_and_log(dir: &Path) -> SystemIdentity {
    let identity = read(dir);
    if let Some(uuid) = &identity.uuid {
        tracing::info!(uuid = %uuid, serial_number = identity.serial_number.as_deref().unwrap_or(""), "host identity read");
    }
    for (field, why) in [
        ("uuid", &identity.uuid_absent),
        ("serial_number", &identity.serial_number_absent),
    ] {
        if let Some(why) = why {
            tracing::warn!(field, reason = %why, "host identity field absent: the controller cannot compare it with the BMC's");
        }
    }
    identity
}

/// The text of one attribute, or why it could not be read.
fn read_attribute(dir: &Path, name: &str) -> Result<String, String> {
    let path = dir.join(name);
    let why = |what: &str| format!("{}: {what}", path.display());
    let file = std::fs::File::open(&path).map_err(|err| why(&open_failure(&err)))?;
    let mut bytes = Vec::new();
    file.take(MAX_READ + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| why(&err.to_string()))?;
    if bytes.len() as u64 > MAX_READ {
        return Err(why(&format!("longer than {MAX_READ} bytes")));
    }
    String::from_utf8(bytes).map_err(|_| why("not UTF-8 text"))
}

/// Why an attribute could not be opened, in words an operator can act on.
fn open_failure(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::NotFound => {
            "no such file (no DMI tables here, or the kernel does not export this one)".to_owned()
        }
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (root-only on most kernels; see `[state] dmi_dir` in docs/design-agent.md)"
                .to_owned()
        }
        _ => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(uuid: Option<&str>, serial: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if let Some(text) = uuid {
            std::fs::write(dir.path().join(PRODUCT_UUID), text).unwrap();
        }
        if let Some(text) = serial {
            std::fs::write(dir.path().join(PRODUCT_SERIAL), text).unwrap();
        }
        dir
    }

    #[test]
    fn both_attributes_are_read_as_the_kernel_writes_them() {
        let dir = dir_with(
            Some("674523a1-ab89-efcd-a123-456789abcdef\n"),
            Some("MXQ1234567\n"),
        );
        let identity = read(dir.path());
        assert_eq!(
            identity.to_string(),
            "uuid 674523a1-ab89-efcd-a123-456789abcdef, serial number MXQ1234567"
        );
    }

    #[test]
    fn missing_files_are_absent_with_the_path_and_the_reason() {
        let dir = dir_with(None, None);
        let identity = read(dir.path());
        let why = identity.uuid_absent.unwrap();
        assert!(why.ends_with("/product_uuid: no such file (no DMI tables here, or the kernel does not export this one)"), "{why}");
        assert!(why.starts_with(&dir.path().display().to_string()), "{why}");
        assert!(
            identity
                .serial_number_absent
                .unwrap()
                .contains("/product_serial: no such file")
        );
    }

    #[test]
    fn unusable_contents_are_absent_with_the_reason() {
        let dir = dir_with(Some("not-a-uuid\n"), Some("   \n"));
        let identity = read(dir.path());
        assert!(
            identity
                .uuid_absent
                .unwrap()
                .ends_with("/product_uuid does not hold a uuid")
        );
        assert_eq!(identity.serial_number_absent.as_deref(), Some("empty"));
        let dir = dir_with(
            Some("00000000-0000-0000-0000-000000000000\n"),
            Some(&"9".repeat(5_000)),
        );
        let identity = read(dir.path());
        assert!(
            identity
                .uuid_absent
                .unwrap()
                .starts_with("placeholder uuid")
        );
        assert!(
            identity
                .serial_number_absent
                .unwrap()
                .ends_with("longer than 4096 bytes")
        );
        let dir = dir_with(None, None);
        std::fs::write(dir.path().join(PRODUCT_SERIAL), [0xff, 0xfe, b'A']).unwrap();
        assert!(
            read(dir.path())
                .serial_number_absent
                .unwrap()
                .ends_with("not UTF-8 text")
        );
    }

    /// What the packaged agent (user `metalguard`) meets on most kernels. Checked on the
    /// mapping itself: root reads through any mode, and test suites often run as root.
    #[test]
    fn permission_denied_says_why_and_where_to_look() {
        let err = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert_eq!(
            open_failure(&err),
            "permission denied (root-only on most kernels; see `[state] dmi_dir` in docs/design-agent.md)"
        );
        let err = std::io::Error::from(std::io::ErrorKind::InvalidInput);
        assert_eq!(open_failure(&err), err.to_string());
    }
}
