//! Failure-domain placement (seeds 000, 002, 004; DOMAIN.md §3).
//!
//! - A new member goes to the domain with the fewest up-to-date, non-deleting members; ties
//!   are broken alphabetically, which also gives alphabetical reuse when there are fewer
//!   domains than replicas (seed 000). No domains: one implicit domain (`None`).
//! - The host to remove: marked with Cluster API's `cluster.x-k8s.io/delete-machine`
//!   annotation first (its presence, whatever its value, as Cluster API reads it), then
//!   outdated, then from the most populated domain, oldest first — seed 004's order
//!   ("outdated machines with the delete annotation", "machines with the delete annotation",
//!   "outdated machines", "all machines", each by the oldest in the most populated domain)
//!   and seed 002's "oldest machine in more populated failure domain".
//! - Rebalancing (seed 000, CPMS): a host whose domain was removed, or whose domain holds more
//!   than `ceil(hosts / domains)`, is proposed for replacement into the emptiest domain.

use std::collections::BTreeMap;

use metalguard_api::snapshot::Host;

fn counts<'a>(domains: &'a [String], hosts: &[&'a Host]) -> BTreeMap<&'a str, usize> {
    let mut counts: BTreeMap<&str, usize> = domains.iter().map(|d| (d.as_str(), 0)).collect();
    for h in hosts {
        if let Some(d) = h.failure_domain.as_deref()
            && let Some(c) = counts.get_mut(d)
        {
            *c += 1;
        }
    }
    counts
}

/// Chooses the failure domain for a new member among `domains`, given the current `hosts`.
/// Only up-to-date, non-deleting hosts count. `None` when no domains are configured.
pub fn choose_failure_domain<'a>(domains: &'a [String], hosts: &[&Host]) -> Option<&'a str> {
    let live: Vec<&Host> = hosts
        .iter()
        .copied()
        .filter(|h| h.up_to_date && !h.is_deleting())
        .collect();
    let mut counts: BTreeMap<&str, usize> = domains.iter().map(|d| (d.as_str(), 0)).collect();
    for h in &live {
        if let Some(d) = h.failure_domain.as_deref()
            && let Some(c) = counts.get_mut(d)
        {
            *c += 1;
        }
    }
    // BTreeMap iterates alphabetically; min_by_key keeps the first minimum.
    counts.into_iter().min_by_key(|(_, c)| *c).map(|(d, _)| d)
}

/// Cluster API's annotation that marks a machine to be removed first when its control plane
/// scales down (seed 004, KCP; `clusterv1.DeleteMachineAnnotation`).
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";

/// True when `host` carries [`DELETE_MACHINE_ANNOTATION`]: its presence counts, whatever
/// its value, as Cluster API reads it.
pub fn marked_for_deletion(host: &Host) -> bool {
    host.annotations.contains_key(DELETE_MACHINE_ANNOTATION)
}

/// Chooses which host to remove when scaling down: delete-requested first, then marked with
/// [`DELETE_MACHINE_ANNOTATION`] (seed 004), then outdated, then the most populated domain,
/// then the oldest, then by name. Among marked hosts the same order decides.
pub fn choose_host_to_remove<'a>(domains: &[String], hosts: &[&'a Host]) -> Option<&'a Host> {
    let counts = counts(domains, hosts);
    hosts.iter().copied().min_by(|a, b| {
        let key = |h: &Host| {
            let population = h
                .failure_domain
                .as_deref()
                .and_then(|d| counts.get(d).copied())
                .unwrap_or(0);
            (
                !h.is_deleting(),
                !marked_for_deletion(h),
                h.up_to_date,
                std::cmp::Reverse(population),
                h.created_at,
            )
        };
        key(a).cmp(&key(b)).then_with(|| a.name.cmp(&b.name))
    })
}

/// Why [`choose_host_to_remove`] put `host` first, for the reason of the scale-down.
pub fn why_removed_first(host: &Host) -> String {
    let marked = marked_for_deletion(host);
    match (marked, host.up_to_date) {
        (true, false) => format!("it is outdated and marked with {DELETE_MACHINE_ANNOTATION}"),
        (true, true) => format!("it is marked with {DELETE_MACHINE_ANNOTATION}"),
        (false, false) => "it is outdated".to_owned(),
        (false, true) => "the oldest host of the most populated failure domain".to_owned(),
    }
}

/// A proposal to move one host to another domain (by replacement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebalanceProposal<'a> {
    /// The host to replace.
    pub host: &'a Host,
    /// The domain its replacement should go to.
    pub to: &'a str,
}

/// Proposes at most one rebalancing move: the oldest host in a removed or overfull domain goes
/// to the emptiest domain, if that actually improves the spread.
pub fn propose_rebalance<'a>(
    domains: &'a [String],
    hosts: &[&'a Host],
) -> Option<RebalanceProposal<'a>> {
    if domains.is_empty() || hosts.is_empty() {
        return None;
    }
    let counts = counts(domains, hosts);
    let limit = hosts.len().div_ceil(domains.len());
    let (emptiest, lowest) = counts
        .iter()
        .min_by_key(|(_, c)| **c)
        .map(|(d, c)| (*d, *c))?;
    let misplaced = |h: &&&Host| match h.failure_domain.as_deref() {
        None => true,
        Some(d) => counts.get(d).is_none_or(|c| *c > limit || *c > lowest + 1),
    };
    let mut candidates: Vec<&&Host> = hosts.iter().filter(misplaced).collect();
    candidates.sort_by(|a, b| {
        let pop = |h: &Host| {
            h.failure_domain
                .as_deref()
                .and_then(|d| counts.get(d).copied())
                .unwrap_or(usize::MAX)
        };
        pop(b)
            .cmp(&pop(a))
            .then(a.created_at.cmp(&b.created_at))
            .then(a.name.cmp(&b.name))
    });
    candidates.first().map(|h| RebalanceProposal {
        host: h,
        to: emptiest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::cp_host;

    fn doms(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn seed_000_reuses_domains_alphabetically_when_fewer_domains_than_replicas() {
        let domains = doms(&["zone-b", "zone-a"]);
        let mut hosts: Vec<Host> = Vec::new();
        let mut picks = Vec::new();
        for i in 0..5 {
            let refs: Vec<&Host> = hosts.iter().collect();
            let d = choose_failure_domain(&domains, &refs).unwrap().to_owned();
            picks.push(d.clone());
            hosts.push(cp_host(&format!("cp-{i}"), Some(&d), i));
        }
        assert_eq!(picks, ["zone-a", "zone-b", "zone-a", "zone-b", "zone-a"]);
    }

    #[test]
    fn seed_000_no_domains_means_one_implicit_domain() {
        let h = cp_host("cp-0", None, 0);
        assert_eq!(choose_failure_domain(&[], &[&h]), None);
    }

    #[test]
    fn seed_004_scale_up_ignores_deleting_and_outdated_members() {
        let domains = doms(&["a", "b"]);
        let a0 = cp_host("a0", Some("a"), 0);
        let mut b0 = cp_host("b0", Some("b"), 1);
        b0.deletion_requested_at = Some(metalguard_api::duration::Timestamp(5));
        let mut b1 = cp_host("b1", Some("b"), 2);
        b1.up_to_date = false;
        assert_eq!(choose_failure_domain(&domains, &[&a0, &b0, &b1]), Some("b"));
    }

    #[test]
    fn seed_004_scale_down_prefers_deleting_then_outdated_then_populated_oldest() {
        let domains = doms(&["a", "b"]);
        let a0 = cp_host("a0", Some("a"), 10);
        let a1 = cp_host("a1", Some("a"), 5);
        let b0 = cp_host("b0", Some("b"), 1);
        assert_eq!(
            choose_host_to_remove(&domains, &[&a0, &a1, &b0])
                .unwrap()
                .name,
            "a1"
        );
        let mut b0_old = b0.clone();
        b0_old.up_to_date = false;
        assert_eq!(
            choose_host_to_remove(&domains, &[&a0, &a1, &b0_old])
                .unwrap()
                .name,
            "b0"
        );
        let mut a0_del = a0.clone();
        a0_del.deletion_requested_at = Some(metalguard_api::duration::Timestamp(1));
        assert_eq!(
            choose_host_to_remove(&domains, &[&a0_del, &a1, &b0_old])
                .unwrap()
                .name,
            "a0"
        );
    }

    /// Seed 004 scale down, "in descending order": "outdated machines with the delete
    /// annotation", "machines with the delete annotation", "outdated machines", "all
    /// machines"; within each, the oldest of the most populated failure domain. The key is
    /// Cluster API's `cluster.x-k8s.io/delete-machine`, whatever its value.
    #[test]
    fn seed_004_scale_down_prefers_the_delete_annotation_then_outdated_then_populated_oldest() {
        let domains = doms(&["a", "b"]);
        let mark = |h: &mut Host, value: &str| {
            h.annotations
                .insert(DELETE_MACHINE_ANNOTATION.to_owned(), value.to_owned());
        };
        let a0 = cp_host("a0", Some("a"), 1);
        let mut a1 = cp_host("a1", Some("a"), 2);
        a1.up_to_date = false;
        let mut b0 = cp_host("b0", Some("b"), 3);
        let mut b1 = cp_host("b1", Some("b"), 4);
        let pick = |hosts: &[&Host]| choose_host_to_remove(&domains, hosts).unwrap().name.clone();
        assert_eq!(pick(&[&a0, &a1, &b0, &b1]), "a1", "outdated");
        mark(&mut b1, "");
        assert_eq!(pick(&[&a0, &a1, &b0, &b1]), "b1", "marked beats outdated");
        mark(&mut b0, "yes");
        assert_eq!(
            pick(&[&a0, &a1, &b0, &b1]),
            "b0",
            "among marked: the oldest"
        );
        b1.up_to_date = false;
        assert_eq!(
            pick(&[&a0, &a1, &b0, &b1]),
            "b1",
            "outdated and marked beats marked"
        );
        assert_eq!(
            why_removed_first(&b1),
            "it is outdated and marked with cluster.x-k8s.io/delete-machine"
        );
        assert_eq!(
            why_removed_first(&a0),
            "the oldest host of the most populated failure domain"
        );
        // Another key, or the key on the Node only, marks nothing.
        let mut other = a0.clone();
        other
            .annotations
            .insert("cluster.x-k8s.io/delete".to_owned(), String::new());
        assert!(!marked_for_deletion(&other));
    }

    #[test]
    fn seed_000_adding_domains_proposes_rebalancing() {
        let hosts: Vec<Host> = (0..3)
            .map(|i| cp_host(&format!("cp-{i}"), Some("a"), i))
            .collect();
        let refs: Vec<&Host> = hosts.iter().collect();
        assert_eq!(propose_rebalance(&doms(&["a"]), &refs), None);
        let domains = doms(&["a", "b", "c"]);
        let p = propose_rebalance(&domains, &refs).unwrap();
        assert_eq!((p.host.name.as_str(), p.to), ("cp-0", "b"));
        let spread: Vec<Host> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, d)| cp_host(&format!("cp-{i}"), Some(d), i as u64))
            .collect();
        let refs: Vec<&Host> = spread.iter().collect();
        assert_eq!(propose_rebalance(&domains, &refs), None);
    }
}
