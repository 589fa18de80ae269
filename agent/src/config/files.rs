//! Owner and mode of the files that decide what the agent does: the configuration files and
//! `agent.d/` (an exec probe runs what they name), the TLS files, the programs it runs, and the
//! state directory (the operation journal and the break-glass holds). Each is refused by
//! `check-config` and `run` when group or others may write it, or when it is owned by anyone but
//! root or the service user (`metalguard_fs::Owners::service`); a key is also refused when
//! group or others may read it. The rule itself is `metalguard_fs`'s, shared with the BMC
//! crate and the controller.

use std::path::Path;

use metalguard_fs::{Access, FileError, Owners, check_path};

use super::load::Loaded;

/// Every problem of the configuration's own files and of the state directory, each naming
/// its file.
pub fn check(loaded: &Loaded) -> Vec<String> {
    let owners = Owners::service();
    let mut problems = Vec::new();
    for file in &loaded.files {
        if let Err(err) = check_path(file, Access::Authority, &owners) {
            problems.push(format!("configuration: {}", chain(&err)));
        }
    }
    if let Some(main) = loaded.files.first() {
        let drop_ins = main
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(super::load::DROP_IN_DIR);
        if drop_ins.exists()
            && let Err(err) = check_path(&drop_ins, Access::Authority, &owners)
        {
            problems.push(format!("configuration: {}", chain(&err)));
        }
    }
    if let Some(problem) = state_dir(&loaded.config.state.dir, &owners) {
        problems.push(problem);
    }
    problems
}

/// The state directory, when it exists: not a symlink, not writable by group or others, owned
/// by root or the service user.
fn state_dir(dir: &Path, owners: &Owners) -> Option<String> {
    let meta = std::fs::symlink_metadata(dir).ok()?;
    let err = if meta.file_type().is_symlink() {
        FileError::Symlink {
            path: dir.to_owned(),
            what: "directory",
        }
    } else {
        check_path(dir, Access::Authority, owners).err()?
    };
    Some(format!("state.dir: {}", chain(&err)))
}

/// A file that carries authority (a CA, a certificate, a program the agent runs) must exist,
/// be writable by its owner only, and be owned by root or the service user.
pub fn authority(key: &str, path: &Path, problems: &mut Vec<String>) {
    if let Err(err) = check_path(path, Access::Authority, &Owners::service()) {
        problems.push(format!("{key}: {}", chain(&err)));
    }
}

/// A secret file must also be readable by its owner only.
pub fn secret(key: &str, path: &Path, problems: &mut Vec<String>) {
    if let Err(err) = check_path(path, Access::Secret, &Owners::service()) {
        problems.push(format!("{key}: {}", chain(&err)));
    }
}

/// The error and its causes, one after the other.
fn chain(err: &dyn std::error::Error) -> String {
    crate::bmc_cmd::chain(err).join(": ")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::super::load;

    fn set_mode(path: &std::path::Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_configuration_or_state_directory_others_may_write_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let main = dir.path().join("agent.toml");
        std::fs::write(
            &main,
            format!("host = \"cp-0\"\n[state]\ndir = \"{}\"\n", state.display()),
        )
        .unwrap();
        set_mode(&main, 0o644);
        set_mode(&state, 0o750);
        assert!(load::load(&main).is_ok());

        // Anyone who can write agent.toml makes the agent run an exec probe of theirs.
        set_mode(&main, 0o666);
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains(&format!("configuration: {} has mode 0666", main.display())),
            "{text}"
        );
        set_mode(&main, 0o644);

        let drop_ins = dir.path().join("agent.d");
        std::fs::create_dir(&drop_ins).unwrap();
        set_mode(&drop_ins, 0o777);
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(text.contains("agent.d has mode 0777"), "{text}");
        set_mode(&drop_ins, 0o755);
        std::fs::write(drop_ins.join("10-site.toml"), "host = \"cp-0\"\n").unwrap();
        set_mode(&drop_ins.join("10-site.toml"), 0o620);
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(text.contains("10-site.toml has mode 0620"), "{text}");
        set_mode(&drop_ins.join("10-site.toml"), 0o600);

        // A state directory others may write: a planted journal result or hold.
        set_mode(&state, 0o777);
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains(&format!("state.dir: {} has mode 0777", state.display())),
            "{text}"
        );
        set_mode(&state, 0o750);
        let link = dir.path().join("state-link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        std::fs::write(
            &main,
            format!("host = \"cp-0\"\n[state]\ndir = \"{}\"\n", link.display()),
        )
        .unwrap();
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(text.contains("state-link is a symbolic link"), "{text}");
    }

    #[test]
    fn a_configuration_owned_by_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: giving a file to another user needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        std::fs::write(&main, "host = \"cp-0\"\n").unwrap();
        std::os::unix::fs::chown(&main, Some(4242), None).unwrap();
        let text = load::load(&main).unwrap_err().problems().join("\n");
        assert!(text.contains("agent.toml is owned by uid 4242"), "{text}");
    }
}
