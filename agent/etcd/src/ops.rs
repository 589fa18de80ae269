//! Membership operations: add a learner, promote it, remove a member, move leadership
//! (re-exported from [`crate::leader`]). Each is idempotent, observes the cluster first, passes
//! the [`crate::gate`] and sends the change to the leader.

use crate::client::{ClientSettings, bounded};
use crate::error::{EtcdError, EtcdErrorKind};
use crate::gate;
pub use crate::leader::{LeaderMoved, move_leader, move_leader_off, wait_for_live_leader};
use crate::observe::observe;
use crate::view::{ClusterView, MemberView};
use etcd_client::MemberAddOptions;
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// A member as needed to build `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerMember {
    /// Member ID.
    pub id: u64,
    /// Member name (empty while never started).
    pub name: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
}

/// The result of [`add_learner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnerAdded {
    /// The learner's member ID.
    pub member_id: u64,
    /// Whether a member with the same peer URL already existed and was reused.
    pub reused: bool,
    /// Whether the existing member is already a voter (only when `reused`).
    pub already_voter: bool,
    /// All members after the add, including the learner.
    pub members: Vec<PeerMember>,
}

/// The result of [`promote`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promoted {
    /// The learner became a voter after `attempts` calls.
    Promoted {
        /// Calls made, including the successful one.
        attempts: u32,
    },
    /// The member was already a voter.
    AlreadyVoter,
}

/// The result of [`remove`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The member was removed; `moved_leader` says leadership was moved off it first.
    Removed {
        /// Whether the member was the leader and leadership was moved first.
        moved_leader: bool,
    },
    /// The member was not in the cluster (already removed).
    AlreadyGone,
}

/// How often and how long to retry a promotion refused as "not in sync".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromoteRetry {
    /// The most calls to make.
    pub attempts: u32,
    /// Wait between calls.
    pub interval: Duration,
}

/// Default promotion retry: every 25 ms for up to 10 s. A refused promotion changes nothing
/// and costs one round trip, so a short interval only shortens the wait: the leader's view of
/// the learner's match index trails the learner's own applied index by a few heartbeats.
pub const DEFAULT_PROMOTE_RETRY: PromoteRetry = PromoteRetry {
    attempts: 400,
    interval: Duration::from_millis(25),
};

fn peer_members(view: &ClusterView) -> Vec<PeerMember> {
    view.members
        .iter()
        .map(|m| PeerMember {
            id: m.id,
            name: m.name.clone(),
            peer_urls: m.peer_urls.clone(),
        })
        .collect()
}

/// The endpoint to send a change to: the leader's, else any healthy voter's.
fn change_endpoint(view: &ClusterView) -> Option<String> {
    let healthy_endpoint = |m: &MemberView| {
        m.healthy()
            .then(|| m.probe.as_ref().map(|p| p.endpoint.clone()))
            .flatten()
    };
    view.leader()
        .and_then(healthy_endpoint)
        .or_else(|| view.voters().find_map(healthy_endpoint))
}

pub(crate) fn no_endpoint(settings: &ClientSettings) -> EtcdError {
    EtcdError::NoEndpointAnswered {
        endpoints: settings.endpoints.clone(),
    }
}

/// Wait between attempts while etcd's own check answers "unhealthy cluster".
const RECONFIG_RETRY: Duration = Duration::from_millis(250);

/// Adds the member with `peer_url` as a learner, unless a member with that peer URL already
/// exists (then it is reported, never duplicated). The gate must pass for a new add.
///
/// etcd refuses changes with "unhealthy cluster" until every voter has been connected for
/// its health interval (5 s after a start); while our own gate passes, that refusal is
/// retried (observe, gate, add) for up to the change timeout.
pub async fn add_learner(
    settings: &ClientSettings,
    peer_url: &str,
) -> Result<LearnerAdded, EtcdError> {
    // Boxed: the etcd client calls make a large future, which callers should not inline.
    Box::pin(add_learner_unboxed(settings, peer_url)).await
}

async fn add_learner_unboxed(
    settings: &ClientSettings,
    peer_url: &str,
) -> Result<LearnerAdded, EtcdError> {
    let started = Instant::now();
    loop {
        match Box::pin(try_add_learner(settings, peer_url)).await {
            Err(err)
                if matches!(
                    err.kind(),
                    Some(EtcdErrorKind::UnhealthyCluster | EtcdErrorKind::MemberNotFound)
                ) && started.elapsed() < settings.change_timeout =>
            {
                tracing::debug!(peer_url, "etcd refused the learner add for now, retrying");
                tokio::time::sleep(RECONFIG_RETRY).await;
            }
            other => return other,
        }
    }
}

async fn try_add_learner(
    settings: &ClientSettings,
    peer_url: &str,
) -> Result<LearnerAdded, EtcdError> {
    let view = observe(settings).await?;
    if let Some(existing) = view.member_by_peer_url(peer_url) {
        tracing::info!(
            member_id = existing.id,
            peer_url,
            "etcd member with this peer url exists, reusing it"
        );
        return Ok(reuse(&view, existing));
    }
    gate::may_add_learner(&view)?;
    let endpoint = change_endpoint(&view).ok_or_else(|| no_endpoint(settings))?;
    let mut client = settings
        .connect_one(&endpoint, settings.change_timeout)
        .await?;
    let answer = bounded(
        "member add",
        &endpoint,
        settings.change_timeout,
        client.member_add([peer_url], Some(MemberAddOptions::new().with_is_learner())),
    )
    .await;
    match answer {
        Ok(resp) => {
            let member_id = resp.member().map_or(0, etcd_client::Member::id);
            tracing::info!(member_id, peer_url, "etcd learner added");
            let members = resp
                .member_list()
                .iter()
                .map(|m| PeerMember {
                    id: m.id(),
                    name: m.name().to_owned(),
                    peer_urls: m.peer_urls().to_vec(),
                })
                .collect();
            Ok(LearnerAdded {
                member_id,
                reused: false,
                already_voter: false,
                members,
            })
        }
        // A concurrent or earlier add won, or etcd 3.4 answered "member not found" to an add
        // right after a removal (the add may still have applied): read the member back.
        Err(err)
            if matches!(
                err.kind(),
                Some(EtcdErrorKind::PeerUrlExists | EtcdErrorKind::MemberNotFound)
            ) =>
        {
            let view = observe(settings).await?;
            match view.member_by_peer_url(peer_url) {
                Some(existing) => Ok(reuse(&view, existing)),
                None => Err(err),
            }
        }
        Err(err) => Err(err),
    }
}

fn reuse(view: &ClusterView, existing: &MemberView) -> LearnerAdded {
    LearnerAdded {
        member_id: existing.id,
        reused: true,
        already_voter: !existing.is_learner,
        members: peer_members(view),
    }
}

/// Promotes the learner `id` through the gate, retrying only "not in sync" refusals.
pub async fn promote(
    settings: &ClientSettings,
    id: u64,
    retry: PromoteRetry,
) -> Result<Promoted, EtcdError> {
    // Boxed: the etcd client calls make a large future, which callers should not inline.
    Box::pin(promote_unboxed(settings, id, retry)).await
}

async fn promote_unboxed(
    settings: &ClientSettings,
    id: u64,
    retry: PromoteRetry,
) -> Result<Promoted, EtcdError> {
    let view = observe(settings).await?;
    if view.member(id).is_some_and(|m| !m.is_learner) {
        return Ok(Promoted::AlreadyVoter);
    }
    gate::may_promote(&view, id)?;
    let endpoint = change_endpoint(&view).ok_or_else(|| no_endpoint(settings))?;
    let mut client = settings
        .connect_one(&endpoint, settings.change_timeout)
        .await?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match bounded(
            "member promote",
            &endpoint,
            settings.change_timeout,
            client.member_promote(id),
        )
        .await
        {
            Ok(_) => {
                tracing::info!(member_id = id, attempts, "etcd learner promoted");
                return Ok(Promoted::Promoted { attempts });
            }
            Err(err) if err.kind() == Some(EtcdErrorKind::MemberNotLearner) => {
                return Ok(Promoted::AlreadyVoter);
            }
            Err(err) if err.kind() == Some(EtcdErrorKind::LearnerNotInSync) => {
                if attempts >= retry.attempts {
                    return Err(EtcdError::PromoteExhausted {
                        member_id: id,
                        attempts,
                        last: Box::new(err),
                    });
                }
                tracing::debug!(member_id = id, attempts, "etcd learner not in sync yet");
                tokio::time::sleep(retry.interval).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Removes the member `id` through the gate. "Member not found" means done. When the member
/// is the leader, leadership is moved to the most advanced healthy voter first (MoveLeader is
/// sent to the leader), so the cluster is never without a leader.
pub async fn remove(settings: &ClientSettings, id: u64) -> Result<Removed, EtcdError> {
    // Boxed: the etcd client calls make a large future, which callers should not inline.
    Box::pin(remove_unboxed(settings, id)).await
}

async fn remove_unboxed(settings: &ClientSettings, id: u64) -> Result<Removed, EtcdError> {
    let mut view = observe(settings).await?;
    if view.member(id).is_none() {
        return Ok(Removed::AlreadyGone);
    }
    gate::may_remove(&view, id)?;
    // Without a live leader etcd drops the proposal and the call hangs: wait for one.
    if !view.leader().is_some_and(MemberView::healthy) {
        view = wait_for_live_leader(settings).await?;
        if view.member(id).is_none() {
            return Ok(Removed::AlreadyGone);
        }
    }
    // The decision rests on a membership confirmed by a quorum read, not on member lists
    // that may lag (etcd's member list is never linearizable on its own).
    view = crate::observe::observe_confirmed(settings).await?;
    if view.member(id).is_none() {
        return Ok(Removed::AlreadyGone);
    }
    gate::may_remove(&view, id)?;
    // Only a leader that answers can hand over; a dead leader is replaced by an election.
    let moved_leader =
        view.summary.leader == Some(id) && view.member(id).is_some_and(MemberView::reachable);
    if moved_leader {
        view = Box::pin(move_leader_off(settings, &view, id)).await?;
    }
    let target_endpoint = view
        .member(id)
        .and_then(|m| m.probe.as_ref())
        .map(|p| p.endpoint.clone());
    let endpoint = change_endpoint(&view)
        .filter(|e| target_endpoint.as_ref() != Some(e))
        .or_else(|| {
            view.voters()
                .filter(|m| m.id != id && m.healthy())
                .find_map(|m| m.probe.as_ref().map(|p| p.endpoint.clone()))
        })
        .ok_or_else(|| no_endpoint(settings))?;
    let mut client = settings
        .connect_one(&endpoint, settings.change_timeout)
        .await?;
    let started = Instant::now();
    loop {
        match bounded(
            "member remove",
            &endpoint,
            settings.change_timeout,
            client.member_remove(id),
        )
        .await
        {
            Ok(_) => {
                tracing::info!(member_id = id, moved_leader, "etcd member removed");
                return Ok(Removed::Removed { moved_leader });
            }
            Err(err) if err.kind() == Some(EtcdErrorKind::MemberNotFound) => {
                return Ok(Removed::AlreadyGone);
            }
            // etcd's own check refuses for 5 s after a member (re)connected.
            Err(err)
                if err.kind() == Some(EtcdErrorKind::UnhealthyCluster)
                    && started.elapsed() < settings.change_timeout =>
            {
                tracing::debug!(
                    member_id = id,
                    "etcd refused the removal as unhealthy cluster, retrying"
                );
                tokio::time::sleep(RECONFIG_RETRY).await;
            }
            Err(err) => return Err(err),
        }
    }
}
