//! The soak's report: a table of faults, fences and violations (to be written).
