//! Notices changes of the inventory file while the controller runs.
//!
//! Checked on every plan tick: the file's modification time, length, mode and owner first; its
//! owner and mode against the rule of `check-config` (a file others may write is rejected
//! whatever it says); its text only when they changed, and a new inventory only when the text
//! changed. A new text that does not
//! parse or validate is rejected with the precise error and the previous inventory stays in
//! use; the same rejected text is reported once. Hosts, the control-plane spec and the policy
//! take effect at once; the `controller` and `etcd` sections only at the next start (a change
//! there is reported).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::inventory::Inventory;

/// What a check found.
#[derive(Debug)]
pub enum Reload {
    /// Nothing new (or a rejected text that was already reported).
    Unchanged,
    /// A new, valid inventory; `restart_needed` names sections that apply only at restart.
    Accepted {
        /// The new inventory.
        inventory: Box<Inventory>,
        /// Sections whose change needs a restart (`controller`, `etcd`).
        restart_needed: Vec<&'static str>,
    },
    /// The new text is not a valid inventory (the error chain, one cause per line).
    Rejected(String),
}

/// The inventory file and what was last read from it.
#[derive(Debug)]
pub struct InventoryFile {
    path: PathBuf,
    stamp: Option<(SystemTime, u64, u32, u32)>,
    text: String,
    /// Increases with every accepted text; 1 for the one read at start.
    pub generation: u64,
    /// Why the current text of the file is not in use, if it is not.
    pub error: Option<String>,
}

impl InventoryFile {
    /// Remembers the file as read at start (generation 1).
    pub fn new(path: &Path) -> Self {
        let mut file = Self {
            path: path.to_owned(),
            stamp: None,
            text: String::new(),
            generation: 1,
            error: None,
        };
        file.stamp = file.read_stamp();
        file.text = std::fs::read_to_string(path).unwrap_or_default();
        file
    }

    /// Modification time, length, mode and owner: a `chmod` or `chown` is checked again too.
    fn read_stamp(&self) -> Option<(SystemTime, u64, u32, u32)> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&self.path).ok()?;
        Some((meta.modified().ok()?, meta.len(), meta.mode(), meta.uid()))
    }

    /// Checks the file against `current` (the inventory in use).
    pub fn check(&mut self, current: &Inventory) -> Reload {
        let stamp = self.read_stamp();
        if stamp.is_some() && stamp == self.stamp {
            return Reload::Unchanged;
        }
        self.stamp = stamp;
        // Owner and mode first: a file others may write is not applied, whatever it says.
        let loaded = crate::inventory::files::check_inventory(&self.path)
            .and_then(|()| {
                std::fs::read_to_string(&self.path).map_err(|source| {
                    crate::inventory::InventoryError::Read {
                        path: self.path.clone(),
                        source,
                    }
                })
            })
            .and_then(|text| {
                if text == self.text {
                    return Ok(None);
                }
                self.text.clone_from(&text);
                Inventory::parse(&self.path, &text).map(Some)
            });
        match loaded {
            Ok(None) => Reload::Unchanged,
            Ok(Some(inventory)) => {
                self.generation += 1;
                self.error = None;
                let mut restart_needed = Vec::new();
                if format!("{:?}", inventory.controller) != format!("{:?}", current.controller) {
                    restart_needed.push("controller");
                }
                if format!("{:?}", inventory.etcd) != format!("{:?}", current.etcd) {
                    restart_needed.push("etcd");
                }
                Reload::Accepted {
                    inventory: Box::new(inventory),
                    restart_needed,
                }
            }
            Err(error) => {
                let message = crate::error::chain(&error);
                if self.error.as_ref() == Some(&message) {
                    return Reload::Unchanged;
                }
                self.error = Some(message.clone());
                Reload::Rejected(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 3

[[hosts]]
name = "cp-1"
role = "control-plane"
"#;

    /// Writes `text` and makes sure the modification time moves even on coarse clocks.
    fn write(path: &Path, text: &str, tick: u64) {
        std::fs::write(path, text).unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + tick))
            .unwrap();
    }

    #[test]
    fn a_valid_change_is_accepted_once_and_an_invalid_one_keeps_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.toml");
        write(&path, BASE, 0);
        let current = Inventory::load(&path).unwrap();
        let mut file = InventoryFile::new(&path);
        assert!(matches!(file.check(&current), Reload::Unchanged));

        let added = format!("{BASE}\n[[hosts]]\nname = \"cp-4\"\nrole = \"control-plane\"\n");
        write(&path, &added, 1);
        let Reload::Accepted {
            inventory,
            restart_needed,
        } = file.check(&current)
        else {
            panic!("not accepted")
        };
        assert_eq!(inventory.hosts.len(), 2);
        assert!(restart_needed.is_empty());
        assert_eq!((file.generation, file.error.as_deref()), (2, None));
        // Touched without a change: nothing new.
        write(&path, &added, 2);
        assert!(matches!(file.check(&inventory), Reload::Unchanged));

        let typo = added.replace("role = \"control-plane\"\n", "rol = \"control-plane\"\n");
        write(&path, &typo, 3);
        let Reload::Rejected(error) = file.check(&inventory) else {
            panic!("not rejected")
        };
        assert!(
            error.contains("inventory.toml") && error.contains("rol"),
            "{error}"
        );
        assert_eq!(file.generation, 2);
        assert_eq!(file.error.as_deref(), Some(error.as_str()));
        // Reported once, not on every tick.
        write(&path, &typo, 4);
        assert!(matches!(file.check(&inventory), Reload::Unchanged));

        let moved = added.replace("127.0.0.1:2379", "127.0.0.1:2380");
        write(&path, &moved, 5);
        let Reload::Accepted { restart_needed, .. } = file.check(&inventory) else {
            panic!("not accepted")
        };
        assert_eq!(restart_needed, ["etcd"]);
        assert_eq!((file.generation, file.error.as_deref()), (3, None));
    }

    #[test]
    fn a_reload_with_a_bad_value_is_rejected_naming_host_and_key_without_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.toml");
        write(&path, BASE, 0);
        let current = Inventory::load(&path).unwrap();
        let mut file = InventoryFile::new(&path);
        let host = |address: &str| {
            format!(
                "{BASE}\n[[hosts]]\nname = \"cp-4\"\nrole = \"control-plane\"\n\
                 bmc = {{ address = \"{address}\", credentials_dir = \"/c\" }}\n"
            )
        };
        for (tick, (text, names)) in [
            (
                host("redfish+https://admin:hunter2@10.0.0.4"),
                "host cp-4 bmc.address",
            ),
            (host("ftp://10.0.0.4"), "host cp-4 bmc.address"),
            (
                BASE.replace("http://127.0.0.1:2379", "https://u:hunter2@127.0.0.1:2379"),
                "etcd.endpoints[0]",
            ),
            (
                format!(
                    "{BASE}\n[policy.remediation]\nexecutor_heartbeat_timeout = \"1000000h\"\n"
                ),
                "policy.remediation.executor_heartbeat_timeout",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            write(&path, &text, 10 + tick as u64);
            let Reload::Rejected(error) = file.check(&current) else {
                panic!("not rejected: {text}")
            };
            assert!(error.contains(names), "{error}");
            assert!(!error.contains("hunter2"), "{error}");
            assert_eq!(file.generation, 1, "the previous inventory stays in use");
        }
    }

    #[test]
    fn a_change_to_an_inventory_others_may_write_is_rejected_until_its_mode_is_fixed() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inventory.toml");
        write(&path, BASE, 0);
        let current = Inventory::load(&path).unwrap();
        let mut file = InventoryFile::new(&path);
        // A local user who may write it points a BMC at their listener.
        let redirected = format!(
            "{BASE}\n[[hosts]]\nname = \"cp-4\"\nrole = \"control-plane\"\n\
             bmc = {{ address = \"redfish+https://127.0.0.1:9\", credentials_dir = \"/c\" }}\n"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        write(&path, &redirected, 1);
        let Reload::Rejected(error) = file.check(&current) else {
            panic!("applied")
        };
        assert!(
            error.contains("inventory.toml has mode 0666") && error.contains("chmod go-w"),
            "{error}"
        );
        assert_eq!(file.generation, 1);
        let err = Inventory::load(&path).unwrap_err();
        assert!(
            crate::error::chain(&err).contains("has mode 0666"),
            "at start too"
        );
        // The operator fixes the mode: the (reviewed) text applies.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(file.check(&current), Reload::Accepted { .. }));
    }
}
