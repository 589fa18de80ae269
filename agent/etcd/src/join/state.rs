//! The join state machine's states, its pure transitions, and the state file written
//! atomically next to the data directory.

use crate::ops::PeerMember;
use crate::view::ClusterView;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where a host is in its learner join. Persisted after every transition so that an agent
/// restarted at any step resumes from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum JoinState {
    /// Find the cluster, pass the gate and add this host as a learner.
    Discover,
    /// The learner is a member; write the etcd configuration and start etcd.
    Added {
        /// This host's member ID.
        member_id: u64,
        /// The `--initial-cluster` value built for this host.
        initial_cluster: String,
    },
    /// etcd runs as a learner; wait until it has caught up.
    Started {
        /// This host's member ID.
        member_id: u64,
        /// The `--initial-cluster` value etcd was started with.
        initial_cluster: String,
    },
    /// Caught up and reported promotable; wait for promotion (or promote in bootstrap mode).
    Promotable {
        /// This host's member ID.
        member_id: u64,
        /// The `--initial-cluster` value etcd was started with.
        initial_cluster: String,
    },
    /// A voting member: the join is done.
    Member {
        /// This host's member ID.
        member_id: u64,
        /// The `--initial-cluster` value etcd was started with.
        initial_cluster: String,
    },
}

impl JoinState {
    /// The member ID this state records, if any.
    pub fn member_id(&self) -> Option<u64> {
        match self {
            Self::Discover => None,
            Self::Added { member_id, .. }
            | Self::Started { member_id, .. }
            | Self::Promotable { member_id, .. }
            | Self::Member { member_id, .. } => Some(*member_id),
        }
    }

    /// The `--initial-cluster` value this state records, if any.
    pub fn initial_cluster(&self) -> Option<&str> {
        match self {
            Self::Discover => None,
            Self::Added {
                initial_cluster, ..
            }
            | Self::Started {
                initial_cluster, ..
            }
            | Self::Promotable {
                initial_cluster, ..
            }
            | Self::Member {
                initial_cluster, ..
            } => Some(initial_cluster),
        }
    }

    /// A short name of the step, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Discover => "discover",
            Self::Added { .. } => "added",
            Self::Started { .. } => "started",
            Self::Promotable { .. } => "promotable",
            Self::Member { .. } => "member",
        }
    }

    /// Whether etcd should be running locally in this state.
    pub fn etcd_should_run(&self) -> bool {
        matches!(
            self,
            Self::Started { .. } | Self::Promotable { .. } | Self::Member { .. }
        )
    }
}

/// What discovery found about this host in the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// This host's peer URL is a voter already.
    AlreadyVoter {
        /// Its member ID.
        member_id: u64,
    },
    /// This host's peer URL is a learner already (an earlier add, maybe not persisted).
    AlreadyLearner {
        /// Its member ID.
        member_id: u64,
    },
    /// Not a member: add a learner.
    Add,
}

/// What the recorded state means against the current cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconcile {
    /// The recorded member is still in the cluster (or nothing was recorded): go on.
    Continue,
    /// The recorded member is gone: this host was removed. Stop etcd, wipe the data dir and
    /// start over from discovery.
    RemovedWipe,
}

/// Finds this host (by peer URL) in the view.
pub fn discover(view: &ClusterView, peer_url: &str) -> Discovery {
    match view.member_by_peer_url(peer_url) {
        Some(m) if m.is_learner => Discovery::AlreadyLearner { member_id: m.id },
        Some(m) => Discovery::AlreadyVoter { member_id: m.id },
        None => Discovery::Add,
    }
}

/// Compares the recorded state with the cluster. Only a recorded member ID that the cluster
/// no longer lists means "removed": nothing else ever leads to wiping the data dir.
pub fn reconcile(state: &JoinState, view: &ClusterView) -> Reconcile {
    match state.member_id() {
        Some(id) if view.member(id).is_none() => Reconcile::RemovedWipe,
        _ => Reconcile::Continue,
    }
}

/// Errors building `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InitialClusterError {
    /// Another member has no name (added but never started) so it cannot be listed.
    #[error(
        "member {id:x} has no name (never started): it must start or be removed before this host joins"
    )]
    UnnamedMember {
        /// The member.
        id: u64,
    },
}

/// Builds `--initial-cluster` (`name=peer_url,…`) from the member list, naming this host's
/// member `my_name` (an unstarted member has an empty name in etcd's list).
pub fn build_initial_cluster(
    members: &[PeerMember],
    my_id: u64,
    my_name: &str,
) -> Result<String, InitialClusterError> {
    let mut parts = Vec::new();
    let mut sorted: Vec<&PeerMember> = members.iter().collect();
    sorted.sort_by_key(|m| m.id);
    for m in sorted {
        let name = if m.id == my_id {
            my_name
        } else {
            m.name.as_str()
        };
        if name.is_empty() {
            return Err(InitialClusterError::UnnamedMember { id: m.id });
        }
        for url in &m.peer_urls {
            parts.push(format!("{name}={url}"));
        }
    }
    Ok(parts.join(","))
}

/// Errors of the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// Reading failed.
    #[error("reading join state file {path} failed")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The content is not a join state.
    #[error("join state file {path} is not valid")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// Writing failed.
    #[error("writing join state file {path} failed")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The state file next to the data directory: `<data dir>.metalguard-join.json`.
pub fn state_path(data_dir: &Path) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(".metalguard-join.json");
    data_dir.with_file_name(name)
}

/// Loads the state; a missing file means [`JoinState::Discover`].
pub fn load(path: &Path) -> Result<JoinState, StateFileError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| StateFileError::Parse {
            path: path.to_owned(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(JoinState::Discover),
        Err(source) => Err(StateFileError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Writes `content` to `path` atomically: a temporary file in the same directory, fsync,
/// rename, fsync of the directory. A crash leaves either the old or the new content.
pub fn write_atomically(path: &Path, content: &[u8]) -> std::io::Result<()> {
    write_atomically_inner(path, content, None, false)
}

/// [`write_atomically`] with the file's permission bits set to `mode` before it is renamed
/// into place, so that no reader ever sees it with other permissions.
pub fn write_atomically_with_mode(path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomically_inner(path, content, Some(mode), false)
}

/// [`write_atomically_with_mode`] through a hidden temporary file (`.<name>.tmp`), for
/// directories whose every other file a reader takes for input: the kubelet runs every file
/// of its static Pod directory but those whose name starts with a dot.
pub fn write_atomically_hidden(path: &Path, content: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomically_inner(path, content, Some(mode), true)
}

fn write_atomically_inner(
    path: &Path,
    content: &[u8],
    mode: Option<u32>,
    hidden: bool,
) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp_name = std::ffi::OsString::from(if hidden { "." } else { "" });
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut file = std::fs::File::create(&tmp)?;
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.write_all(content)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Saves the state atomically.
pub fn save(path: &Path, state: &JoinState) -> Result<(), StateFileError> {
    let write_err = |source| StateFileError::Write {
        path: path.to_owned(),
        source,
    };
    let json = serde_json::to_vec_pretty(state).map_err(|e| write_err(std::io::Error::other(e)))?;
    write_atomically(path, &json).map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::testing::*;

    #[test]
    fn initial_cluster_names_the_unstarted_self() {
        let members = vec![
            PeerMember {
                id: 2,
                name: "b".into(),
                peer_urls: vec!["http://b:2380".into()],
            },
            PeerMember {
                id: 1,
                name: "a".into(),
                peer_urls: vec!["http://a:2380".into()],
            },
            PeerMember {
                id: 9,
                name: String::new(),
                peer_urls: vec!["http://me:2380".into()],
            },
        ];
        assert_eq!(
            build_initial_cluster(&members, 9, "me"),
            Ok("a=http://a:2380,b=http://b:2380,me=http://me:2380".to_owned())
        );
        assert_eq!(
            build_initial_cluster(&members, 1, "a"),
            Err(InitialClusterError::UnnamedMember { id: 9 })
        );
    }

    #[test]
    fn discovery_finds_self_by_peer_url() {
        let view = ClusterView::new(vec![voter(1, 1, 5), learner(2, 1, 5)], vec![]);
        assert_eq!(
            discover(&view, "http://127.0.0.1:20001"),
            Discovery::AlreadyVoter { member_id: 1 }
        );
        assert_eq!(
            discover(&view, "http://127.0.0.1:20002"),
            Discovery::AlreadyLearner { member_id: 2 }
        );
        assert_eq!(discover(&view, "http://127.0.0.1:20003"), Discovery::Add);
    }

    #[test]
    fn only_a_recorded_member_missing_from_the_cluster_means_wipe() {
        let view = ClusterView::new(vec![voter(1, 1, 5), voter(2, 1, 5)], vec![]);
        let ic = String::from("x");
        assert_eq!(reconcile(&JoinState::Discover, &view), Reconcile::Continue);
        assert_eq!(
            reconcile(
                &JoinState::Started {
                    member_id: 2,
                    initial_cluster: ic.clone()
                },
                &view
            ),
            Reconcile::Continue
        );
        for state in [
            JoinState::Added {
                member_id: 7,
                initial_cluster: ic.clone(),
            },
            JoinState::Started {
                member_id: 7,
                initial_cluster: ic.clone(),
            },
            JoinState::Promotable {
                member_id: 7,
                initial_cluster: ic.clone(),
            },
            JoinState::Member {
                member_id: 7,
                initial_cluster: ic.clone(),
            },
        ] {
            assert_eq!(
                reconcile(&state, &view),
                Reconcile::RemovedWipe,
                "{state:?}"
            );
        }
    }

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = state_path(&dir.path().join("etcd-data"));
        assert_eq!(path, dir.path().join("etcd-data.metalguard-join.json"));
        assert_eq!(load(&path).unwrap(), JoinState::Discover);
        let state = JoinState::Promotable {
            member_id: 0xdead_beef,
            initial_cluster: "a=http://a:2380".into(),
        };
        save(&path, &state).unwrap();
        assert_eq!(load(&path).unwrap(), state);
        assert!(
            !path
                .with_file_name("etcd-data.metalguard-join.json.tmp")
                .exists()
        );
        std::fs::write(&path, b"{\"step\":\"nonsense\"}").unwrap();
        assert!(matches!(load(&path), Err(StateFileError::Parse { .. })));
    }
}
