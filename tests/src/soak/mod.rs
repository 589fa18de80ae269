//! The nemesis soak (issue 24): a lab of five control-plane hosts and two controllers, a
//! workload writing keys, and a seeded random schedule of faults; a recorder writes one
//! NDJSON history of everything that happened and a checker reads it back.
//!
//! Data flow: `schedule` (seed → faults in time) → `nemesis` (injects and heals them in the
//! lab) ; `recorder` (logs, BMC power logs, etcd samples, the store) → [`history`] NDJSON →
//! [`check`] (rules over the history) → [`report`] (the table, and the history around each
//! violation).

pub mod check;
pub mod history;
pub mod logs;
pub mod nemesis;
pub mod recorder;
pub mod report;
pub mod run;
pub mod schedule;
pub mod workload;
