//! Fuzzes the Redfish JSON decoders: no input may panic them, and whatever decodes must map
//! to a power state and an error summary without panicking either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalguard_bmc::PowerState;
use metalguard_bmc::redfish::models::{
    ActionInfo, Collection, ComputerSystem, ErrorBody, ServiceRoot,
};

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<ServiceRoot>(data);
    let _ = serde_json::from_slice::<Collection>(data);
    let _ = serde_json::from_slice::<ActionInfo>(data);
    if let Ok(system) = serde_json::from_slice::<ComputerSystem>(data) {
        if let Some(state) = system.power_state.as_deref() {
            let state = PowerState::from_redfish(state);
            let _ = (state.is_off(), state.to_string());
        }
    }
    if let Ok(body) = serde_json::from_slice::<ErrorBody>(data) {
        let _ = body.summary();
    }
});
