//! The agent's TLS identity towards the controller, renewed without a restart: the HTTPS
//! client is rebuilt from `controller.ca`, `controller.cert` and `controller.key` whenever
//! one of them changes on disk (modification time, length, inode, mode or owner), so a renewed
//! certificate copied over the old one is used from the next connection on.
//!
//! A change that does not make a usable identity (the certificate copied but not its key
//! yet, a key others may read) keeps the previous client and says why; the next change is
//! tried again.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::config::ControllerConfig;

/// Modification time, length, inode, mode and owner of one file (`None` when it cannot be
/// read): a `chmod` or `chown` is a change too, since the files are checked again.
type FileStamp = Option<(SystemTime, u64, u64, u32, u32)>;

fn stamp(path: &Path) -> FileStamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((
        meta.modified().ok()?,
        meta.len(),
        meta.ino(),
        meta.mode(),
        meta.uid(),
    ))
}

/// The HTTPS client built from the identity files, and what they looked like then.
#[derive(Debug)]
struct Built {
    client: reqwest::Client,
    stamps: [FileStamp; 3],
    /// How many times the client was rebuilt after the first (for tests and logs).
    renewals: u64,
}

/// A client that follows the identity files. Clones share it.
#[derive(Debug, Clone)]
pub struct Identity {
    built: Arc<Mutex<Built>>,
    config: ControllerConfig,
}

impl Identity {
    /// Builds the client from the configured files; an error names the file.
    pub fn new(config: &ControllerConfig) -> Result<Self, String> {
        let stamps = stamps(config);
        let client = build(config)?;
        Ok(Self {
            built: Arc::new(Mutex::new(Built {
                client,
                stamps,
                renewals: 0,
            })),
            config: config.clone(),
        })
    }

    /// The client to use now: rebuilt first if an identity file changed since it was built.
    pub fn client(&self) -> reqwest::Client {
        let now = stamps(&self.config);
        let mut built = self
            .built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if built.stamps != now {
            built.stamps = now;
            match build(&self.config) {
                Ok(client) => {
                    built.client = client;
                    built.renewals += 1;
                    tracing::info!(cert = %self.config.cert.display(), renewals = built.renewals, "client certificate files changed: new connections use them");
                }
                Err(error) => {
                    tracing::warn!(%error, "client certificate files changed but are not usable (yet); the previous certificate stays in use");
                }
            }
        }
        built.client.clone()
    }

    /// How many times the client was rebuilt after a change.
    #[cfg(test)]
    pub fn renewals(&self) -> u64 {
        self.built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .renewals
    }
}

fn stamps(config: &ControllerConfig) -> [FileStamp; 3] {
    [stamp(&config.ca), stamp(&config.cert), stamp(&config.key)]
}

fn build(config: &ControllerConfig) -> Result<reqwest::Client, String> {
    // Checked again at every change, as `check-config` checks them (crate::config::files).
    let mut problems = Vec::new();
    crate::config::files::authority("controller.ca", &config.ca, &mut problems);
    crate::config::files::authority("controller.cert", &config.cert, &mut problems);
    crate::config::files::secret("controller.key", &config.key, &mut problems);
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let tls =
        crate::client_tls::config("controller", &config.ca, Some((&config.cert, &config.key)))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(config.request_timeout)
        .pool_idle_timeout(super::link::POOL_IDLE)
        .no_proxy()
        .build()
        .map_err(|e| format!("building the controller client: {e}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metalguard_e2e::tls::{ServerCert, write_file};

    use super::*;

    fn config(dir: &Path) -> ControllerConfig {
        ControllerConfig {
            url: "https://127.0.0.1:1".into(),
            urls: Vec::new(),
            ca: dir.join("ca.crt"),
            cert: dir.join("agent.crt"),
            key: dir.join("agent.key"),
            report_interval: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            command_wait: Duration::from_secs(1),
        }
    }

    fn install(dir: &Path, cert: &ServerCert, key: &ServerCert) {
        // Through a rename, as `install` and most copies do: a new inode.
        for (name, text, mode) in [
            ("agent.crt", &cert.cert_pem, 0o644),
            ("agent.key", &key.key_pem, 0o600),
        ] {
            let tmp = dir.join(format!("{name}.tmp"));
            write_file(&tmp, text.as_bytes(), mode).unwrap();
            std::fs::rename(&tmp, dir.join(name)).unwrap();
        }
    }

    #[tokio::test]
    async fn a_renewed_certificate_is_picked_up_and_a_half_copied_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let first = ServerCert::ca_signed().unwrap();
        let second = ServerCert::ca_signed().unwrap();
        write_file(
            &dir.path().join("ca.crt"),
            first.ca_pem.as_deref().unwrap().as_bytes(),
            0o644,
        )
        .unwrap();
        install(dir.path(), &first, &first);
        let identity = Identity::new(&config(dir.path())).unwrap();
        identity.client();
        assert_eq!(identity.renewals(), 0, "nothing changed");
        // The new certificate is in place but the old key is still there: not usable.
        let tmp = dir.path().join("agent.crt.tmp");
        write_file(&tmp, second.cert_pem.as_bytes(), 0o644).unwrap();
        std::fs::rename(&tmp, dir.path().join("agent.crt")).unwrap();
        identity.client();
        assert_eq!(identity.renewals(), 0, "a certificate without its key");
        install(dir.path(), &second, &second);
        identity.client();
        assert_eq!(identity.renewals(), 1, "the renewed pair");
        identity.client();
        assert_eq!(identity.renewals(), 1);
    }

    #[tokio::test]
    async fn a_renewed_pair_others_may_write_or_read_is_not_applied() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let first = ServerCert::ca_signed().unwrap();
        let second = ServerCert::ca_signed().unwrap();
        write_file(
            &dir.path().join("ca.crt"),
            first.ca_pem.as_deref().unwrap().as_bytes(),
            0o644,
        )
        .unwrap();
        install(dir.path(), &first, &first);
        let identity = Identity::new(&config(dir.path())).unwrap();
        install(dir.path(), &second, &second);
        let set = |name: &str, mode| {
            std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        };
        set("agent.crt", 0o666);
        identity.client();
        assert_eq!(identity.renewals(), 0, "a certificate anyone may replace");
        set("agent.crt", 0o644);
        set("agent.key", 0o640);
        identity.client();
        assert_eq!(identity.renewals(), 0, "a key the group may read");
        set("agent.key", 0o600);
        identity.client();
        assert_eq!(identity.renewals(), 1, "the pair once its modes are right");
    }
}
