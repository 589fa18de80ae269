//! The checker: rules over a soak's history (to be written).
