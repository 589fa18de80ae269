//! The leadership term in Kubernetes mode: a counter on the leader election Lease.
//!
//! kube-lease-manager counts `leaseTransitions` only when the holder changes, and in two
//! patches (the holder first, the count after), so a lapsed holder that takes its Lease back,
//! or a reader between the two patches, sees no new number. metalguard keeps its own: every
//! leadership that begins increments the annotation [`TERM_ANNOTATION`] on the Lease, in one
//! merge patch guarded by the `resourceVersion` it read. Two controllers can never both get
//! the same term (the second patch conflicts), and a term never goes back while the Lease
//! lives. Every command carries it; agents refuse commands of an older term.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use super::{FIELD_MANAGER, KubeBackend};
use crate::backend::BackendError;

/// The Lease annotation that counts leaderships.
pub const TERM_ANNOTATION: &str = "metalguard.io/leader-term";

/// The term last begun on the Lease (0: none yet).
pub fn term_of(meta: &ObjectMeta) -> Result<u64, String> {
    match meta.annotations.as_ref().and_then(|a| a.get(TERM_ANNOTATION)) {
        None => Ok(0),
        Some(text) => text.parse().map_err(|e| {
            format!("the Lease's annotation {TERM_ANNOTATION}={text:?} is not a term ({e}): set it to a number at least as high as every agent has seen")
        }),
    }
}

impl KubeBackend {
    /// Begins a leadership on the Lease we hold (`meta` as read): the next term, or `None`
    /// when the Lease changed since it was read (judge again next round).
    pub(super) async fn begin_term(
        &self,
        api: &Api<Lease>,
        meta: Option<&ObjectMeta>,
    ) -> Result<Option<u64>, BackendError> {
        let lease = &self.settings.lease_name;
        let Some(meta) = meta else {
            return Ok(None);
        };
        let refuse = |why: String| BackendError::Refused {
            what: format!("a leadership term on Lease {lease}: {why}"),
        };
        let next = term_of(meta)
            .map_err(refuse)?
            .checked_add(1)
            .ok_or_else(|| refuse("the term cannot grow past u64::MAX".to_owned()))?;
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": meta.resource_version,
                "annotations": { TERM_ANNOTATION: next.to_string() },
            }
        });
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        match api.patch(lease, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(term = next, "leadership term begins");
                Ok(Some(next))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
            Err(error) => Err(Self::unavailable(format!("Lease {lease} (term)"), error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(term: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            annotations: term.map(|t| [(TERM_ANNOTATION.to_owned(), t.to_owned())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_term_is_read_from_the_annotation_and_garbage_is_refused_by_name() {
        assert_eq!(term_of(&meta(None)), Ok(0));
        assert_eq!(term_of(&meta(Some("41"))), Ok(41));
        let err = term_of(&meta(Some("-1"))).unwrap_err();
        assert!(err.contains(TERM_ANNOTATION), "{err}");
    }
}
