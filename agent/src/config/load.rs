//! Reading `agent.toml` and its drop-ins, merging them, and collecting every problem.

use std::path::{Path, PathBuf};

use super::schema::AgentConfig;

/// Drop-in directory name, next to the main file.
pub const DROP_IN_DIR: &str = "agent.d";

/// A loaded, merged and validated configuration.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: AgentConfig,
    /// The files it was read from, in merge order.
    pub files: Vec<PathBuf>,
}

/// Every problem found in the configuration, each naming its file or key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .problems.join("\n"))]
pub struct ConfigError {
    problems: Vec<String>,
}

impl ConfigError {
    /// The problems, one per entry.
    pub fn problems(&self) -> &[String] {
        &self.problems
    }
}

/// Reads, merges and validates the configuration rooted at `main`.
pub fn load(main: &Path) -> Result<Loaded, ConfigError> {
    let loaded = read_merged(main)?;
    let mut problems = super::files::check(&loaded);
    problems.extend(loaded.config.validate());
    if problems.is_empty() {
        Ok(loaded)
    } else {
        Err(ConfigError { problems })
    }
}

/// Reads and merges the configuration rooted at `main` like [`load`], and returns the
/// validation problems next to it instead of refusing it. For break-glass fencing, which
/// needs only `host`, `state.dir` and `[controller]` and must not be stopped by a problem
/// elsewhere (a missing probe binary). Files that do not parse are still an error.
pub fn load_lenient(main: &Path) -> Result<(Loaded, Vec<String>), ConfigError> {
    let loaded = read_merged(main)?;
    let mut problems = super::files::check(&loaded);
    problems.extend(loaded.config.validate());
    Ok((loaded, problems))
}

/// Reads, parses and merges the files, without semantic validation.
fn read_merged(main: &Path) -> Result<Loaded, ConfigError> {
    let mut problems = Vec::new();
    let mut files = vec![main.to_path_buf()];
    match drop_ins(main) {
        Ok(found) => files.extend(found),
        Err(problem) => problems.push(problem),
    }

    let mut merged = toml::Table::new();
    for file in &files {
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(err) => {
                problems.push(format!("{}: cannot read: {err}", file.display()));
                continue;
            }
        };
        // Parse each file alone against the schema so unknown keys and bad values are reported
        // with the file (and line) that holds them.
        if let Err(err) = toml::from_str::<AgentConfig>(&text) {
            problems.push(format!(
                "{}: {}",
                file.display(),
                one_line(&err.to_string())
            ));
            continue;
        }
        match toml::from_str::<toml::Table>(&text) {
            Ok(table) => merge(&mut merged, table),
            Err(err) => problems.push(format!(
                "{}: {}",
                file.display(),
                one_line(&err.to_string())
            )),
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError { problems });
    }
    let config: AgentConfig = match toml::Value::Table(merged).try_into() {
        Ok(config) => config,
        Err(err) => {
            return Err(ConfigError {
                problems: vec![format!("merged configuration: {err}")],
            });
        }
    };
    Ok(Loaded { config, files })
}

/// Whether the files parse and none sets `host` (an untouched, all-comments install). Any
/// problem answers `false`: the daemon itself must then report it loudly.
pub fn host_is_unset(main: &Path) -> bool {
    let Ok(extra) = drop_ins(main) else {
        return false;
    };
    let mut files = vec![main.to_path_buf()];
    files.extend(extra);
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            return false;
        };
        let Ok(table) = toml::from_str::<toml::Table>(&text) else {
            return false;
        };
        if table.contains_key("host") {
            return false;
        }
    }
    true
}

/// `agent.d/*.toml` next to `main`, sorted by name; none when the directory does not exist.
fn drop_ins(main: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = main
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(DROP_IN_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(format!("{}: cannot list drop-ins: {err}", dir.display())),
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    found.sort();
    Ok(found)
}

/// Merges `overlay` into `base`: tables merge key by key, anything else is replaced.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(existing)), toml::Value::Table(incoming)) => {
                merge(existing, incoming);
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// toml's messages span several lines (a source excerpt); keep them readable in one list.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn drop_ins_merge_in_name_order_and_later_files_win() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        write(&main, "host = \"cp-0\"\n[state]\ndir = \"/var/lib/a\"\n");
        write(
            &dir.path().join("agent.d/20-b.toml"),
            "[state]\ndir = \"/var/lib/c\"\n",
        );
        write(
            &dir.path().join("agent.d/10-a.toml"),
            "[state]\ndir = \"/var/lib/b\"\n",
        );
        write(&dir.path().join("agent.d/README"), "ignored: not .toml");
        let loaded = load(&main).unwrap();
        assert_eq!(loaded.config.state.dir, PathBuf::from("/var/lib/c"));
        assert_eq!(loaded.files.len(), 3);
    }

    #[test]
    fn unknown_key_in_a_drop_in_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        write(&main, "host = \"cp-0\"\n");
        let drop_in = dir.path().join("agent.d/50-typo.toml");
        write(&drop_in, "[probes.clock]\nmax_ofset = \"1s\"\n");
        let err = load(&main).unwrap_err();
        let text = err.problems().join("\n");
        assert!(text.contains("50-typo.toml"), "{text}");
        assert!(text.contains("max_ofset"), "{text}");
    }

    #[test]
    fn a_typo_in_the_join_table_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        write(&main, "host = \"cp-0\"\n");
        // Each file is parsed alone against the schema, so the drop-in repeats [etcd]'s
        // required endpoints.
        let drop_in = dir.path().join("agent.d/40-join.toml");
        write(
            &drop_in,
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\ndata_dir = \"/var/lib/etcd\"\n\
             [etcd.join]\nname = \"cp-0\"\npeer_url = \"http://127.0.0.1:2380\"\n\
             client_url = \"http://127.0.0.1:2379\"\nlauncher = \"env-file\"\nenv_fiel = \"/run/etcd.env\"\n",
        );
        let text = load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains("40-join.toml") && text.contains("env_fiel"),
            "{text}"
        );
        write(
            &drop_in,
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\ndata_dir = \"/var/lib/etcd\"\n\
             [etcd.join]\nname = \"cp-0\"\npeer_url = \"http://127.0.0.1:2380\"\n\
             client_url = \"http://127.0.0.1:2379\"\nlauncher = \"env-file\"\nenv_file = \"/run/etcd.env\"\n",
        );
        let loaded = load(&main).unwrap();
        let join = loaded.config.etcd.unwrap().join.unwrap();
        assert_eq!(join.env_file, Some(PathBuf::from("/run/etcd.env")));
        assert_eq!(join.stall_after, crate::config::DEFAULT_JOIN_STALL_AFTER);
        write(
            &drop_in,
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n[etcd.join]\nlauncher = \"docker\"\n",
        );
        let text = load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains("40-join.toml") && text.contains("docker"),
            "{text}"
        );
    }

    #[test]
    fn bad_duration_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        write(
            &main,
            "host = \"cp-0\"\n[probes.kubelet]\nurl = \"http://127.0.0.1:10248/healthz\"\nperiod = \"5 parsecs\"\n",
        );
        let text = load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains("agent.toml") && text.contains("period"),
            "{text}"
        );
    }

    #[test]
    fn the_packaged_all_comments_file_is_not_configured() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("agent.toml");
        let packaged = concat!(env!("CARGO_MANIFEST_DIR"), "/../systemd/agent.toml");
        std::fs::copy(packaged, &main).unwrap();
        assert!(host_is_unset(&main));
        // The packaged file is valid TOML and, once host is set, a valid configuration.
        write(
            &dir.path().join("agent.d/00-host.toml"),
            "host = \"cp-0\"\n",
        );
        assert!(!host_is_unset(&main));
        assert!(load(&main).is_ok());
        // Broken files are "configured": the daemon must report them, not be skipped.
        write(&dir.path().join("agent.d/99-broken.toml"), "[[[");
        std::fs::remove_file(dir.path().join("agent.d/00-host.toml")).unwrap();
        assert!(!host_is_unset(&main));
    }

    #[test]
    fn missing_main_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("nope.toml");
        let text = load(&main).unwrap_err().problems().join("\n");
        assert!(text.contains("nope.toml: cannot read"), "{text}");
    }

    #[test]
    fn world_readable_key_is_refused_with_file_and_key() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["ca.crt", "agent.crt", "agent.key"] {
            write(&dir.path().join(name), "x");
        }
        let key = dir.path().join("agent.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let main = dir.path().join("agent.toml");
        let d = dir.path().display();
        write(
            &main,
            &format!(
                "host = \"cp-0\"\n[controller]\nurl = \"https://c:9443\"\nca = \"{d}/ca.crt\"\n\
                 cert = \"{d}/agent.crt\"\nkey = \"{d}/agent.key\"\n"
            ),
        );
        let text = load(&main).unwrap_err().problems().join("\n");
        assert!(
            text.contains("controller.key") && text.contains("agent.key"),
            "{text}"
        );
        assert!(text.contains("0644"), "{text}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(load(&main).is_ok());
    }
}
