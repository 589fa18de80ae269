//! The cluster's certificates: the CA and what it signs ([`certs`], `certs init|issue|show`),
//! mutual TLS for the agent API ([`tls`]), revoked agent certificates ([`revocation`]), and
//! the key that seals the controller's stored records ([`seal`]).

pub mod certs;
pub mod revocation;
pub mod seal;
pub mod tls;
