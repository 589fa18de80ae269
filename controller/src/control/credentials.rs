//! Credential rotation without a window (issue 25): new BMC credentials (a Secret or a
//! credentials directory rewritten) are checked before any fence uses them, and the ones in
//! use are kept until a check with the new ones passes.
//!
//! Per host the leader keeps the credentials fences use (`in_use`) and, while a rotation is
//! under way, the new ones read from the source (`candidate`). The read-only check of the
//! agent that would execute the host's fence is handed the candidate; its result names the
//! credentials it was made with (an id only this process can compute), so a check still
//! running with the old credentials when they changed is never taken for the new ones. A
//! passing check with the candidate makes it the credentials in use; a failing one leaves the
//! host not ready with the reason, and fences keep the old credentials.
//!
//! The old credentials live only in this process's memory (the source no longer has them): a
//! leader that starts mid-rotation, or after a restart, takes what the source says as in use,
//! as before rotation existed. Written down in docs/design-controller.md.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac as _};
use metalguard_api::protocol::{BmcCheck, BmcCredentials};
use sha2::Sha256;

/// The credentials of one host's BMC the leader knows.
#[derive(Debug, Clone)]
struct Entry {
    /// The BMC address these credentials are for: another address is another BMC, whose
    /// credentials are taken as they are read (a rotation is of one BMC's password).
    address: String,
    /// What fences use.
    in_use: Held,
    /// New credentials read from the source, not yet proven by a check.
    candidate: Option<Held>,
    /// Whether a failed check of the candidate was logged.
    candidate_refusal_logged: bool,
}

#[derive(Debug, Clone)]
struct Held {
    id: String,
    credentials: BmcCredentials,
}

/// What reading a host's credentials from the source changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The first read: in use from now.
    First,
    /// The same as in use, or the same candidate as before.
    Unchanged,
    /// New credentials: a rotation, checked before fences use them.
    Rotating,
    /// The source went back to the credentials in use: the rotation is abandoned.
    Reverted,
}

/// The credentials of a check grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForCheck {
    pub credentials: BmcCredentials,
    /// Echoed by the agent in its check ([`BmcCheck::credentials_id`]).
    pub id: String,
    /// True for a rotation's new credentials.
    pub new: bool,
}

/// Per host, the credentials in use and any rotation under way.
#[derive(Debug)]
pub struct CredentialBook {
    key: [u8; 32],
    hosts: BTreeMap<String, Entry>,
}

impl Default for CredentialBook {
    fn default() -> Self {
        let mut key = [0_u8; 32];
        // Without randomness the ids are still distinct per credentials; only guessing them
        // from the outside gets easier, and they are never published beyond the agent.
        if getrandom::fill(&mut key).is_err() {
            tracing::warn!("no randomness for the credentials ids' key");
        }
        Self::with_key(key)
    }
}

impl CredentialBook {
    /// A book whose ids are made with `key` (tests; [`Default`] draws a random one).
    pub(crate) fn with_key(key: [u8; 32]) -> Self {
        Self {
            key,
            hosts: BTreeMap::new(),
        }
    }

    /// An id of `credentials`: a keyed hash with this process's random key, so that it says
    /// nothing about the password to whoever reads it.
    fn id_of(&self, credentials: &BmcCredentials) -> String {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.key)
            .unwrap_or_else(|_| crate::pki::seal::unreachable_key_length());
        mac.update(credentials.username.as_bytes());
        mac.update(&[0]);
        mac.update(credentials.password.expose().as_bytes());
        let digest = mac.finalize().into_bytes();
        digest[..8]
            .iter()
            .fold(String::with_capacity(16), |mut id, b| {
                use std::fmt::Write as _;
                let _ = write!(id, "{b:02x}");
                id
            })
    }

    /// Takes the credentials of `host`'s BMC at `address` just read from the source. A new
    /// address (the inventory names another BMC) starts afresh: its credentials are in use
    /// as read, as on the first read.
    pub fn read(&mut self, host: &str, address: &str, credentials: BmcCredentials) -> Read {
        let id = self.id_of(&credentials);
        let held = Held { id, credentials };
        let Some(entry) = self.hosts.get_mut(host).filter(|e| e.address == address) else {
            self.hosts.insert(
                host.to_owned(),
                Entry {
                    address: address.to_owned(),
                    in_use: held,
                    candidate: None,
                    candidate_refusal_logged: false,
                },
            );
            return Read::First;
        };
        if held.id == entry.in_use.id {
            return match entry.candidate.take() {
                Some(_) => Read::Reverted,
                None => Read::Unchanged,
            };
        }
        if entry.candidate.as_ref().is_some_and(|c| c.id == held.id) {
            return Read::Unchanged;
        }
        entry.candidate = Some(held);
        entry.candidate_refusal_logged = false;
        Read::Rotating
    }

    /// What the read-only check of `host`'s BMC uses: the rotation's new credentials while
    /// one is under way, else those in use.
    pub fn for_check(&self, host: &str) -> Option<ForCheck> {
        let entry = self.hosts.get(host)?;
        let (held, new) = match &entry.candidate {
            Some(candidate) => (candidate, true),
            None => (&entry.in_use, false),
        };
        Some(ForCheck {
            credentials: held.credentials.clone(),
            id: held.id.clone(),
            new,
        })
    }

    /// What a fence of `host` through the BMC at `address` uses, given the credentials the
    /// source gives now (`fresh`, read so that an unreadable source still stops the fence):
    /// those in use; `fresh` for a host this book has not read yet, or read at another address.
    pub fn for_fence(&self, host: &str, address: &str, fresh: BmcCredentials) -> BmcCredentials {
        match self.hosts.get(host).filter(|e| e.address == address) {
            Some(entry) => entry.in_use.credentials.clone(),
            None => fresh,
        }
    }

    /// Takes the latest check of `host`'s BMC by the agent that would execute its fence: a
    /// check with the rotation's new credentials that passed makes them the credentials in
    /// use (true). A check that failed with them is logged once; fences keep the old ones.
    pub fn take_check(&mut self, host: &str, by: &str, check: &BmcCheck) -> bool {
        let Some(entry) = self.hosts.get_mut(host) else {
            return false;
        };
        let Some(candidate) = &entry.candidate else {
            return false;
        };
        if check.credentials_id.as_deref() != Some(candidate.id.as_str()) {
            return false;
        }
        match check.failure {
            None => {
                entry.in_use = entry
                    .candidate
                    .take()
                    .unwrap_or_else(|| entry.in_use.clone());
                tracing::info!(%host, checked_by = %by, "bmc credentials rotated: the new ones passed a read-only check; fences use them from now on");
                true
            }
            Some(failure) => {
                if !entry.candidate_refusal_logged {
                    entry.candidate_refusal_logged = true;
                    tracing::warn!(%host, checked_by = %by, failure = failure.name(), detail = %check.detail, "bmc credential rotation failing: the new credentials did not pass a read-only check; fences keep the previous ones");
                }
                false
            }
        }
    }

    /// Forgets hosts not in `keep` (left the inventory, or lost their BMC).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.hosts.retain(|host, _| keep(host));
    }

    /// Whether a rotation of `host`'s credentials is under way.
    #[cfg(test)]
    pub fn rotating(&self, host: &str) -> bool {
        self.hosts.get(host).is_some_and(|e| e.candidate.is_some())
    }

    /// The hosts whose credentials are being rotated (a few at most: a pass over the entries,
    /// not a lookup per fence target).
    pub fn rotating_hosts(&self) -> impl Iterator<Item = &str> {
        self.hosts
            .iter()
            .filter(|(_, e)| e.candidate.is_some())
            .map(|(host, _)| host.as_str())
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::bmc::CheckFailure;
    use metalguard_api::protocol::Secret;

    use super::*;

    fn creds(password: &str) -> BmcCredentials {
        BmcCredentials {
            username: "admin".into(),
            password: Secret::new(password),
        }
    }

    fn check(id: &str, failure: Option<CheckFailure>) -> BmcCheck {
        BmcCheck {
            failure,
            power_state: None,
            identity: None,
            detail: String::new(),
            credentials_id: Some(id.into()),
            request: None,
        }
    }

    fn password(c: &BmcCredentials) -> &str {
        c.password.expose()
    }

    const A: &str = "redfish+https://10.0.1.1";

    #[test]
    fn new_credentials_are_checked_before_a_fence_uses_them() {
        let mut book = CredentialBook::with_key([7; 32]);
        assert_eq!(password(&book.for_fence("cp-1", A, creds("old"))), "old");
        assert_eq!(book.read("cp-1", A, creds("old")), Read::First);
        assert_eq!(book.read("cp-1", A, creds("old")), Read::Unchanged);
        let old = book.for_check("cp-1").unwrap();
        assert!(!old.new);

        assert_eq!(book.read("cp-1", A, creds("new")), Read::Rotating);
        assert_eq!(book.read("cp-1", A, creds("new")), Read::Unchanged);
        assert!(book.rotating("cp-1"));
        assert_eq!(book.rotating_hosts().collect::<Vec<_>>(), ["cp-1"]);
        let new = book.for_check("cp-1").unwrap();
        assert!(new.new && password(&new.credentials) == "new" && new.id != old.id);
        assert_eq!(
            password(&book.for_fence("cp-1", A, creds("new"))),
            "old",
            "fences keep the old credentials while the new ones are unproven"
        );

        // A check made with the old credentials, answered after the rotation began, proves
        // nothing about the new ones.
        assert!(!book.take_check("cp-1", "cp-2", &check(&old.id, None)));
        // A failed check with the new ones leaves the old ones in use.
        assert!(!book.take_check(
            "cp-1",
            "cp-2",
            &check(&new.id, Some(CheckFailure::CredentialsRefused))
        ));
        assert_eq!(password(&book.for_fence("cp-1", A, creds("new"))), "old");
        // A check without an id (an agent that predates them) proves nothing either.
        let mut anonymous = check(&new.id, None);
        anonymous.credentials_id = None;
        assert!(!book.take_check("cp-1", "cp-2", &anonymous));

        assert!(book.take_check("cp-1", "cp-2", &check(&new.id, None)));
        assert!(!book.rotating("cp-1"));
        assert_eq!(password(&book.for_fence("cp-1", A, creds("new"))), "new");
        let after = book.for_check("cp-1").unwrap();
        assert!(!after.new && after.id == new.id);
    }

    #[test]
    fn a_rotation_replaced_or_reverted_keeps_the_credentials_in_use() {
        let mut book = CredentialBook::with_key([1; 32]);
        book.read("cp-1", A, creds("old"));
        assert_eq!(book.read("cp-1", A, creds("typo")), Read::Rotating);
        let typo = book.for_check("cp-1").unwrap().id;
        assert_eq!(book.read("cp-1", A, creds("fixed")), Read::Rotating);
        assert!(
            !book.take_check("cp-1", "cp-2", &check(&typo, None)),
            "a check of replaced credentials"
        );
        assert_eq!(book.read("cp-1", A, creds("old")), Read::Reverted);
        assert!(!book.rotating("cp-1"));
        assert_eq!(password(&book.for_fence("cp-1", A, creds("x"))), "old");
        book.retain(|h| h != "cp-1");
        assert_eq!(password(&book.for_fence("cp-1", A, creds("x"))), "x");
    }

    #[test]
    fn another_bmc_address_is_another_bmc_not_a_rotation() {
        let mut book = CredentialBook::with_key([3; 32]);
        book.read("cp-1", A, creds("old"));
        // The inventory now names another BMC (a swapped line): its credentials are in use at
        // once, and the fence's identity check, not the rotation, guards the swap.
        let other = "redfish+https://10.0.1.3";
        assert_eq!(book.read("cp-1", other, creds("other")), Read::First);
        assert!(!book.rotating("cp-1"));
        assert_eq!(
            password(&book.for_fence("cp-1", other, creds("other"))),
            "other"
        );
        // A fence built for an address the book has not read takes what the source says.
        assert_eq!(
            password(&book.for_fence("cp-1", A, creds("fresh"))),
            "fresh"
        );
    }

    #[test]
    fn ids_depend_on_the_key_and_say_nothing_of_the_password() {
        let a = CredentialBook::with_key([1; 32]);
        let b = CredentialBook::with_key([2; 32]);
        let id = a.id_of(&creds("hunter2"));
        assert_eq!(id.len(), 16);
        assert_ne!(id, b.id_of(&creds("hunter2")));
        assert_ne!(id, a.id_of(&creds("hunter3")));
        assert!(!id.contains("hunter2"));
    }
}
