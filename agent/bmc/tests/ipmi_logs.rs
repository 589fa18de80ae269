//! Every IPMI log line at TRACE level, from a successful fence and from a wrong password, is
//! captured and searched for the password: it must never be there.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metalguard_bmc::{
    Bmc, BmcAddress, CallTimeouts, Credentials, FenceAction, FenceOptions, PowerControl, TlsTrust,
    fence,
};
use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege as Account};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const TIMEOUTS: CallTimeouts = CallTimeouts {
    connect: Duration::from_millis(200),
    request: Duration::from_secs(2),
};

#[tokio::test]
async fn no_ipmi_log_line_holds_the_password() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let address: BmcAddress = sim.url().parse().unwrap();
    let good = Credentials::load(&sim.credentials_dir(Account::Admin)).unwrap();
    let mut b = Bmc::new(&address, good, &TlsTrust::SystemRoots, TIMEOUTS).unwrap();
    let out = fence(&mut b, FenceAction::Reboot, &FenceOptions::default()).await;
    assert!(out.status.is_success(), "{:?}", out.status);
    tracing::info!(timeline = %out.timeline, outcome = ?out.status, "fence done");
    b.close().await.unwrap();

    let wrong = Credentials::new("admin", "wrong-secret-value");
    let mut b = Bmc::new(&address, wrong, &TlsTrust::SystemRoots, TIMEOUTS).unwrap();
    let err = b.power_state().await.unwrap_err();
    tracing::error!(error = %err, debug = ?err, "power state failed");

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("ipmi exchange"),
        "nothing was logged:\n{text}"
    );
    assert!(text.contains("rakp message 2"), "{text}");
    assert!(
        !text.contains(sim.password()),
        "the password leaked:\n{text}"
    );
    assert!(
        !text.contains("wrong-secret-value"),
        "the wrong password leaked:\n{text}"
    );
}
