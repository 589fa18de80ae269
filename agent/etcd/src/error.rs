//! Errors of the etcd mechanics and the classification of etcd's gRPC answers.
//!
//! etcd's errors do not survive gRPC as typed values: the server sends a status code and a
//! message text. [`classify`] turns the pair into an [`EtcdErrorKind`] by matching the code
//! **and** the exact message texts etcd 3.4 and 3.5 send (DOMAIN.md §1).

use serde::Serialize;
use std::time::Duration;

/// What an etcd answer means for the caller, derived from its gRPC code and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EtcdErrorKind {
    /// `etcdserver: can only promote a learner member which is in sync with leader`: retryable.
    LearnerNotInSync,
    /// `etcdserver: can only promote a learner member`: the member is already a voter.
    MemberNotLearner,
    /// `etcdserver: too many learner members in cluster`: only one learner is allowed.
    TooManyLearners,
    /// `etcdserver: Peer URLs already exists` or `member ID already exist`.
    PeerUrlExists,
    /// `etcdserver: member not found`.
    MemberNotFound,
    /// `etcdserver: unhealthy cluster`: etcd's own reconfiguration check refused.
    UnhealthyCluster,
    /// `etcdserver: rpc not supported for learner`: the call reached a learner.
    NotSupportedForLearner,
    /// `etcdserver: not leader`: a leader-only call reached a follower.
    NotLeader,
    /// `etcdserver: mvcc: database space exceeded`: the NOSPACE alarm is raised.
    NoSpace,
    /// `etcdserver: request timed out` (lost quorum or overload) or a gRPC deadline.
    Timeout,
    /// The endpoint could not be reached (connection refused, unavailable).
    Unreachable,
    /// Authentication or permission failure.
    Unauthorized,
    /// Anything else.
    Other,
}

impl EtcdErrorKind {
    /// Whether retrying the same call later can succeed without anyone changing the cluster.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::LearnerNotInSync | Self::Timeout | Self::Unreachable | Self::NotLeader
        )
    }
}

// gRPC status codes (grpc/status codes.proto), named here so the crate does not depend on tonic.
const CODE_CANCELLED: i32 = 1;
const CODE_DEADLINE_EXCEEDED: i32 = 4;
const CODE_NOT_FOUND: i32 = 5;
const CODE_PERMISSION_DENIED: i32 = 7;
const CODE_RESOURCE_EXHAUSTED: i32 = 8;
const CODE_FAILED_PRECONDITION: i32 = 9;
const CODE_UNAVAILABLE: i32 = 14;
const CODE_UNAUTHENTICATED: i32 = 16;

/// Classifies an etcd gRPC answer by its status code and message.
///
/// The message texts are etcd's own (`etcdserver/api/v3rpc/rpctypes`); the code is checked
/// too so that a message that merely contains one of the texts is not misread.
pub fn classify(code: i32, message: &str) -> EtcdErrorKind {
    // The "in sync" text starts with the "not learner" text: test the longer one first.
    const NOT_IN_SYNC: &str = "can only promote a learner member which is in sync with leader";
    const NOT_LEARNER: &str = "can only promote a learner member";
    match code {
        CODE_FAILED_PRECONDITION if message.contains(NOT_IN_SYNC) => {
            EtcdErrorKind::LearnerNotInSync
        }
        CODE_FAILED_PRECONDITION if message.contains(NOT_LEARNER) => {
            EtcdErrorKind::MemberNotLearner
        }
        CODE_FAILED_PRECONDITION if message.contains("too many learner members in cluster") => {
            EtcdErrorKind::TooManyLearners
        }
        CODE_FAILED_PRECONDITION
            if message.contains("Peer URLs already exists")
                || message.contains("member ID already exist") =>
        {
            EtcdErrorKind::PeerUrlExists
        }
        CODE_FAILED_PRECONDITION if message.contains("not leader") => EtcdErrorKind::NotLeader,
        CODE_NOT_FOUND if message.contains("member not found") => EtcdErrorKind::MemberNotFound,
        CODE_UNAVAILABLE if message.contains("unhealthy cluster") => {
            EtcdErrorKind::UnhealthyCluster
        }
        CODE_UNAVAILABLE if message.contains("request timed out") => EtcdErrorKind::Timeout,
        // Sent as Unavailable by 3.4/3.5; the text is specific enough to accept any code.
        _ if message.contains("rpc not supported for learner") => {
            EtcdErrorKind::NotSupportedForLearner
        }
        CODE_RESOURCE_EXHAUSTED if message.contains("database space exceeded") => {
            EtcdErrorKind::NoSpace
        }
        CODE_DEADLINE_EXCEEDED => EtcdErrorKind::Timeout,
        // tonic reports its own request timeout as Cancelled "Timeout expired".
        CODE_CANCELLED if message.contains("Timeout expired") => EtcdErrorKind::Timeout,
        _ if message.contains("request timed out") => EtcdErrorKind::Timeout,
        CODE_UNAVAILABLE => EtcdErrorKind::Unreachable,
        CODE_UNAUTHENTICATED | CODE_PERMISSION_DENIED => EtcdErrorKind::Unauthorized,
        _ => EtcdErrorKind::Other,
    }
}

/// Classifies an error of the `etcd-client` crate.
pub(crate) fn classify_client_error(err: &etcd_client::Error) -> EtcdErrorKind {
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            classify(i32::from(status.code()), status.message())
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            EtcdErrorKind::Unreachable
        }
        _ => EtcdErrorKind::Other,
    }
}

/// Errors of the etcd mechanics.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// A call to one etcd endpoint failed; `kind` says what it means.
    #[error("{operation} via etcd endpoint {endpoint} failed ({kind:?})")]
    Call {
        /// The operation, e.g. `member add`.
        operation: &'static str,
        /// The endpoint the call went to.
        endpoint: String,
        /// The classification of the answer.
        kind: EtcdErrorKind,
        /// The client error.
        #[source]
        source: etcd_client::Error,
    },
    /// A call did not answer within its deadline.
    #[error("{operation} via etcd endpoint {endpoint} did not answer within {timeout:?}")]
    Deadline {
        /// The operation.
        operation: &'static str,
        /// The endpoint the call went to.
        endpoint: String,
        /// The deadline that passed.
        timeout: Duration,
    },
    /// No configured endpoint answered the member list.
    #[error("no etcd endpoint answered (tried {endpoints:?})")]
    NoEndpointAnswered {
        /// The endpoints tried.
        endpoints: Vec<String>,
    },
    /// The endpoints list was empty.
    #[error("no etcd endpoints configured")]
    NoEndpoints,
    /// The member list seen by the probes and the one read after a linearizable read differ
    /// (a membership change in between), or no healthy voter served that read.
    #[error("etcd's membership could not be confirmed by a linearizable read: {detail}")]
    MembershipUnconfirmed {
        /// What differed or failed.
        detail: String,
    },
    /// The safety gate refused a membership change.
    #[error("membership change refused by the safety gate")]
    Refused(#[from] crate::gate::Refusal),
    /// A learner could not be promoted within the retry budget.
    #[error("promotion of learner {member_id:x} did not succeed after {attempts} attempts")]
    PromoteExhausted {
        /// The learner.
        member_id: u64,
        /// How many attempts were made.
        attempts: u32,
        /// The last refusal.
        #[source]
        last: Box<EtcdError>,
    },
    /// Leadership did not move off a member before removing it.
    #[error("leadership did not move off member {member_id:x} within {timeout:?}")]
    LeaderDidNotMove {
        /// The member that is still the leader.
        member_id: u64,
        /// How long we waited.
        timeout: Duration,
    },
    /// Leadership moved, but not to the requested voter (an election picked another one).
    #[error("leadership moved to member {leader:x} instead of member {to:x}")]
    LeaderMovedElsewhere {
        /// The voter that should lead.
        to: u64,
        /// The voter that leads now.
        leader: u64,
    },
    /// No live leader appeared.
    #[error("etcd cluster had no leader answering our probe within {timeout:?}")]
    NoLeader {
        /// How long we waited.
        timeout: Duration,
    },
    /// TLS files could not be read.
    #[error("reading tls file {path} failed")]
    TlsFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl EtcdError {
    /// The classification of this error, when it came from etcd or the network.
    pub fn kind(&self) -> Option<EtcdErrorKind> {
        match self {
            Self::Call { kind, .. } => Some(*kind),
            Self::Deadline { .. } => Some(EtcdErrorKind::Timeout),
            Self::PromoteExhausted { last, .. } => last.kind(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_etcd_texts_are_classified_by_code_and_message() {
        let cases = [
            (
                9,
                "etcdserver: can only promote a learner member which is in sync with leader",
                EtcdErrorKind::LearnerNotInSync,
            ),
            (
                9,
                "etcdserver: can only promote a learner member",
                EtcdErrorKind::MemberNotLearner,
            ),
            (
                9,
                "etcdserver: too many learner members in cluster",
                EtcdErrorKind::TooManyLearners,
            ),
            (
                9,
                "etcdserver: Peer URLs already exists",
                EtcdErrorKind::PeerUrlExists,
            ),
            (
                9,
                "etcdserver: member ID already exist",
                EtcdErrorKind::PeerUrlExists,
            ),
            (
                5,
                "etcdserver: member not found",
                EtcdErrorKind::MemberNotFound,
            ),
            (
                14,
                "etcdserver: unhealthy cluster",
                EtcdErrorKind::UnhealthyCluster,
            ),
            (
                14,
                "etcdserver: rpc not supported for learner",
                EtcdErrorKind::NotSupportedForLearner,
            ),
            (9, "etcdserver: not leader", EtcdErrorKind::NotLeader),
            (
                8,
                "etcdserver: mvcc: database space exceeded",
                EtcdErrorKind::NoSpace,
            ),
            (14, "etcdserver: request timed out", EtcdErrorKind::Timeout),
            (4, "deadline has elapsed", EtcdErrorKind::Timeout),
            (1, "Timeout expired", EtcdErrorKind::Timeout),
            (14, "tcp connect error", EtcdErrorKind::Unreachable),
            (
                16,
                "etcdserver: invalid auth token",
                EtcdErrorKind::Unauthorized,
            ),
        ];
        for (code, message, want) in cases {
            assert_eq!(classify(code, message), want, "{code} {message}");
        }
    }

    #[test]
    fn a_known_text_under_an_unexpected_code_is_not_trusted() {
        assert_eq!(
            classify(2, "etcdserver: member not found"),
            EtcdErrorKind::Other
        );
        assert_eq!(
            classify(5, "etcdserver: too many learner members in cluster"),
            EtcdErrorKind::Other
        );
    }

    #[test]
    fn only_not_in_sync_is_retryable_among_promote_refusals() {
        assert!(EtcdErrorKind::LearnerNotInSync.is_transient());
        assert!(!EtcdErrorKind::MemberNotFound.is_transient());
        assert!(!EtcdErrorKind::TooManyLearners.is_transient());
        assert!(!EtcdErrorKind::MemberNotLearner.is_transient());
    }
}
