//! Certificate revocation in Kubernetes mode, on a real kube-apiserver: `run
//! --backend=kubernetes --revoked-certificates FILE` (a mounted ConfigMap in the Deployment)
//! refuses an agent certificate on the deny list once the file names it — reports on a
//! connection already open get 403, a new connection fails its handshake — while every other
//! agent goes on, exactly as the standalone controller does (`authority.rs`).

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::ffi::OsStr;
use std::time::Duration;

use kubelab::{KubeLab, LabOptions};

#[test]
fn a_revoked_agent_certificate_is_refused_in_kubernetes_mode_too() {
    let mut lab = KubeLab::start(&LabOptions::default());
    let revoked = lab.dir().join("revoked.txt");
    std::fs::write(&revoked, "# revoked agent certificates\n").unwrap();
    lab.start_controller_with(
        "controller-0",
        &[OsStr::new("--revoked-certificates"), revoked.as_os_str()],
    );
    lab.wait_leading("w-2", Duration::from_secs(60));

    let cert = lab.tls().join("w-2.pem");
    let shown = kubelab::run(&["certs", "show", cert.to_str().unwrap()]);
    let serial = shown
        .lines()
        .find_map(|l| l.strip_prefix("serial "))
        .unwrap_or_else(|| panic!("no serial in {shown}"))
        .to_owned();
    let tmp = revoked.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("serial {serial}  # w-2's key was copied off the host\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, &revoked).unwrap();

    // Within a few ticks w-2's reports are refused (403 on the open connection, or no
    // answer: a new connection's handshake fails), and the others are still answered.
    lab.wait("w-2's reports refused", Duration::from_secs(15), |lab| {
        matches!(lab.agents.last_report_status("w-2"), 0 | 403)
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        matches!(lab.agents.last_report_status("w-2"), 0 | 403),
        "w-2 answered {}",
        lab.agents.last_report_status("w-2")
    );
    for host in ["w-1", "w-3"] {
        assert_eq!(lab.agents.last_report_status(host), 200, "{host}");
    }
    let log = lab.controller_log("controller-0", 400);
    assert!(log.contains("revoked"), "{log}");
    lab.assert_nothing_forbidden();
}
