//! BMC addresses as URLs: the parser lives in `metalguard_api::bmc::address` so that the
//! controller checks an inventory's addresses with exactly the rules the agent applies
//! (refusing at load what a fence would refuse at 3 a.m.). Re-exported here unchanged.

pub use metalguard_api::bmc::address::{
    AddressError, BmcAddress, DEFAULT_HTTP_PORT, DEFAULT_HTTPS_PORT, DEFAULT_IPMI_PORT, Transport,
    redact,
};
