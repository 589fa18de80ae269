//! Owner and mode of the files the inventory is read from and names: the inventory itself (it
//! says where each BMC is, and so where its password goes), each host's `credentials_dir`
//! and the files in it, and a BMC's CA file. The rule is `metalguard_fs`'s, shared with the
//! agent: nobody but root or the service user may own them, group and others may not write
//! them, and group and others may not read a secret.

use std::path::Path;

use metalguard_fs::{Access, FileError, Owners, check_path};

use super::InventoryError;

/// `what` (for messages) at `path`, refused unless `access` and the service's owners allow it.
fn check(what: String, path: &Path, access: Access) -> Result<(), InventoryError> {
    check_path(path, access, &Owners::service())
        .map(|_| ())
        .map_err(|source| InventoryError::Unsafe { what, source })
}

/// The inventory file itself (at start, in `check-config`, and before a changed file is
/// applied).
pub(crate) fn check_inventory(path: &Path) -> Result<(), InventoryError> {
    check(
        format!("inventory {}", path.display()),
        path,
        Access::Authority,
    )
}

/// A host's credentials directory (whoever may write it may swap the password file).
pub(super) fn check_credentials_dir(host: &str, dir: &Path) -> Result<(), InventoryError> {
    check(
        format!("bmc credentials directory of host {host}"),
        dir,
        Access::Authority,
    )
}

/// A BMC's CA file (whoever may write it decides which BMC certificate is trusted).
pub(super) fn check_ca_file(host: &str, path: &Path) -> Result<(), InventoryError> {
    check(
        format!("bmc ca file of host {host}"),
        path,
        Access::Authority,
    )
}

/// Reads a secret file of `host`'s credentials, refused when group or others may access it or
/// a stranger owns it.
pub(super) fn read_secret_file(host: &str, path: &Path) -> Result<String, InventoryError> {
    let problem = |problem: String| InventoryError::Credentials {
        host: host.to_owned(),
        path: path.to_owned(),
        problem,
    };
    match check_path(path, Access::Secret, &Owners::service()) {
        Ok(_) => {}
        Err(FileError::Examine { source, .. }) => {
            return Err(problem(format!("could not be read ({})", source.kind())));
        }
        Err(source) => {
            return Err(InventoryError::Unsafe {
                what: format!("bmc credentials of host {host}"),
                source,
            });
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| problem(format!("could not be read ({})", e.kind())))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::super::{BmcSettings, Inventory, TrustSetting};

    fn chmod(path: &std::path::Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn an_inventory_credentials_dir_or_ca_file_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("cp-1");
        std::fs::create_dir(&creds).unwrap();
        for name in ["username", "password"] {
            std::fs::write(creds.join(name), "x\n").unwrap();
            chmod(&creds.join(name), 0o600);
        }
        chmod(&creds, 0o755);
        let ca = dir.path().join("bmc-ca.pem");
        std::fs::write(&ca, "pem").unwrap();
        chmod(&ca, 0o644);
        let mut bmc = BmcSettings {
            address: "redfish+https://127.0.0.1".into(),
            credentials_dir: creds.clone(),
            tls: TrustSetting::default(),
            from_cluster: None,
        };
        bmc.tls.ca_file = Some(ca.clone());
        assert!(bmc.credentials("cp-1").is_ok());
        assert!(bmc.trust("cp-1").is_ok());

        // Whoever may write the directory swaps the password file for one of theirs.
        chmod(&creds, 0o777);
        let err = crate::error::chain(&bmc.credentials("cp-1").unwrap_err());
        assert!(
            err.contains("bmc credentials directory of host cp-1 is refused")
                && err.contains("has mode 0777"),
            "{err}"
        );
        chmod(&creds, 0o755);
        chmod(&creds.join("password"), 0o620);
        let err = crate::error::chain(&bmc.credentials("cp-1").unwrap_err());
        assert!(err.contains("password has mode 0620"), "{err}");
        chmod(&creds.join("password"), 0o600);
        // Whoever may write the CA file decides which BMC certificate is believed.
        chmod(&ca, 0o666);
        let err = crate::error::chain(&bmc.trust("cp-1").unwrap_err());
        assert!(
            err.contains("bmc ca file of host cp-1 is refused") && err.contains("0666"),
            "{err}"
        );

        // The inventory itself: at start and in check-config.
        let inventory = dir.path().join("inventory.toml");
        std::fs::write(
            &inventory,
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[control_plane]\ndesired_replicas = 1\n",
        )
        .unwrap();
        chmod(&inventory, 0o644);
        assert!(Inventory::load(&inventory).is_ok());
        chmod(&inventory, 0o664);
        let err = crate::error::chain(&Inventory::load(&inventory).unwrap_err());
        assert!(err.contains("inventory.toml has mode 0664"), "{err}");
    }

    #[test]
    fn an_inventory_owned_by_a_stranger_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: giving a file to another user needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let inventory = dir.path().join("inventory.toml");
        std::fs::write(
            &inventory,
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[control_plane]\ndesired_replicas = 1\n",
        )
        .unwrap();
        std::os::unix::fs::chown(&inventory, Some(4242), None).unwrap();
        let err = crate::error::chain(&Inventory::load(&inventory).unwrap_err());
        assert!(err.contains("is owned by uid 4242"), "{err}");
    }
}
