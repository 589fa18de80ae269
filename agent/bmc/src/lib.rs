//! # metalguard-bmc
//!
//! Power control of a host through its BMC, over Redfish (HTTPS/HTTP) and IPMI v2.0 RMCP+
//! (UDP), behind one narrow `PowerControl` trait, with a verified `fence` operation on top.
//!
//! May depend on: tokio, reqwest with rustls, RustCrypto primitives, serde. Never on the kube
//! client crates (enforced by `metalguard-e2e`'s dependency-rule test).
