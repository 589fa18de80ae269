//! The seed text the planner's reasons quote, kept in one place so that a reason printed by
//! `metalguard-controller plan` and docs/design-core.md cite the same words. Each constant is
//! a sentence of a seed (`../shared/seeds/`), named by its seed and section.

/// Seed 002, "Self healing" step 3: the value the controller *sets* for the control-plane
/// check's `maxUnhealthy` — a default, not a ceiling over what an administrator writes.
pub const CONTROL_PLANE_MAX_UNHEALTHY_DEFAULT: &str = "seed 002: the controller sets maxUnhealthy \"1 for cluster with 3 members or 2 for a cluster with 5 members\"";

/// Seed 004, remediation scenario 2 (three replicas, two machines marked for remediation).
pub const REMEDIATION_SCENARIO_2: &str = "seed 004 scenario 2: \"As long as we continue to only have at most one unhealthy etcd member, we will scale down an unhealthy machine\"";

/// Seed 004, the rules for starting a remediation.
pub const REMEDIATION_PRESERVES_QUORUM: &str =
    "seed 004: \"Remediation MUST preserve etcd quorum\"";

/// Seed 004, scale down and the stacked-etcd preflight check.
pub const MACHINES_EQUAL_MEMBERS: &str = "seed 004: \"Scale down operations are blocked based on Etcd and control plane preflight checks\": \"There are an equal number of control plane Machines and members in the etcd cluster\"";

/// Seed 004, scale up, and the step of seed 002's scale out it stands for.
pub const SCALE_UP_PREFLIGHT: &str = "seed 004: \"Scale up operations are blocked based on Etcd and control plane preflight checks\"; seed 002 scale out step 6: \"If (NOT all etcd members are healthy OR NOT all owned machines have a backed ready node) then controller short circuits here\"";

/// Seed 004, scale down: which machine goes first.
pub const DELETE_ANNOTATION_FIRST: &str = "seed 004 scale down: \"outdated machines with the delete annotation\", then \"machines with the delete annotation\", then \"outdated machines\", then the one \"Scale down operations removes\": \"the oldest machine in the failure domain that has the most control-plane machines on it\"";
