//! `metalguard-agent bmc` and `metalguard-agent fence-agent` as a script or Pacemaker runs
//! them, against the real sushy-tools emulator. Every byte the CLI prints is kept and, at the
//! end of each test, searched for the password.

#![allow(clippy::unwrap_used, clippy::panic)] // test helpers outside #[test] fns

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use metalguard_e2e::blackhole::BlackHole;
use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions, Tls};

/// Output of one CLI run.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs the CLI with maximal logging, optionally feeding stdin, and records its output.
fn cli(args: &[&str], stdin: Option<&str>, transcript: &mut String) -> Run {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_metalguard-agent"))
        .args(args)
        .env("RUST_LOG", "trace")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    };
    let _ = write!(transcript, "$ {args:?}\n{}\n{}\n", run.stdout, run.stderr);
    run
}

fn assert_never_printed(transcript: &str, secret: &str) {
    assert!(!secret.is_empty());
    assert!(
        !transcript.contains(secret),
        "the password appears in the CLI output"
    );
}

fn url(bmc: &RedfishBmc) -> String {
    let scheme = if bmc.base_url().starts_with("https") {
        "redfish+https"
    } else {
        "redfish+http"
    };
    format!("{scheme}://127.0.0.1:{}", bmc.port())
}

#[test]
fn bmc_status_off_reboot_on_with_exit_codes_and_json() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let creds = bmc.credentials_dir().to_str().unwrap().to_owned();
    let address = url(&bmc);
    let mut transcript = String::new();
    let base = ["bmc", "--bmc", &address, "--credentials", &creds, "-v"];
    let with = |action: &str| {
        let mut args = vec![base[0], action];
        args.extend_from_slice(&base[1..]);
        args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()
    };
    let run = |action: &str, extra: &[&str], transcript: &mut String| {
        let mut args = with(action);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(&refs, None, transcript)
    };

    let status = run("status", &[], &mut transcript);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stdout.starts_with("status: power is on"),
        "{status:?}"
    );

    let off = run("off", &["--output", "json"], &mut transcript);
    assert_eq!(off.code, 0, "{off:?}");
    let report: serde_json::Value = serde_json::from_str(off.stdout.trim()).unwrap();
    assert_eq!(report["result"], "ok");
    assert_eq!(report["fenced"], true);
    assert!(report["timeline"].as_array().unwrap().len() >= 4);
    assert_eq!(bmc.power_state(0).unwrap(), "Off");

    let status = run("status", &[], &mut transcript);
    assert_eq!(status.code, 3, "status exits 3 when off: {status:?}");

    let reboot = run("reboot", &[], &mut transcript);
    assert_eq!(reboot.code, 0, "{reboot:?}");
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    let off = run("off", &[], &mut transcript);
    assert_eq!(off.code, 0, "{off:?}");
    let on = run("on", &[], &mut transcript);
    assert_eq!(on.code, 0, "{on:?}");
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    // sushy does not list PowerCycle in its AllowableValues: refused before sending.
    let cycle = run("cycle", &[], &mut transcript);
    assert_eq!(cycle.code, 1, "{cycle:?}");
    assert!(
        cycle
            .stderr
            .contains("does not support power cycle (it allows: On, ForceOff"),
        "{cycle:?}"
    );
    assert!(!cycle.stderr.contains("Sent POST"), "{cycle:?}");

    assert_never_printed(&transcript, bmc.password());
}

/// `bmc check` logs in, reads the power state and the identity, and changes nothing: against
/// sushy-tools (the System's UUID and SerialNumber) and ipmi_sim (Get System GUID), with a
/// wrong password failing with exit 1.
#[test]
fn bmc_check_prints_power_and_identity_and_changes_nothing() {
    use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege};

    let mut transcript = String::new();
    let bmc = RedfishBmc::start(RedfishOptions {
        initially_on: false,
        ..RedfishOptions::default()
    })
    .unwrap();
    let creds = bmc.credentials_dir().to_str().unwrap().to_owned();
    let address = url(&bmc);
    let args = ["bmc", "check", "--bmc", &address, "--credentials", &creds];
    let run = cli(&args, None, &mut transcript);
    assert_eq!(
        run.code, 0,
        "check exits 0 whatever the power state: {run:?}"
    );
    assert_eq!(
        run.stdout.split(" (bmc ").next().unwrap(),
        format!(
            "check: power is off; uuid {}, serial number {}",
            bmc.system_ids()[0],
            bmc.serial_number(0).unwrap()
        ),
        "{run:?}"
    );
    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let run = cli(&json_args, None, &mut transcript);
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(report["result"], "ok");
    assert_eq!(report["power_state"], "off");
    assert_eq!(report["identity"]["uuid"], bmc.system_ids()[0].as_str());
    assert_eq!(
        report["identity"]["serial_number"],
        bmc.serial_number(0).unwrap()
    );
    assert!(bmc.power_log().unwrap().is_empty());
    assert_never_printed(&transcript, bmc.password());

    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let ipmi_creds = sim.credentials_dir(Privilege::Admin);
    let ipmi_creds = ipmi_creds.to_str().unwrap();
    let ipmi = sim.url();
    let run = cli(
        &["bmc", "check", "--bmc", &ipmi, "--credentials", ipmi_creds],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout.starts_with(&format!(
            "check: power is on; uuid {}, serial number absent (ipmi has no standard command",
            sim.system_uuid().unwrap()
        )),
        "{run:?}"
    );
    let wrong = tempfile::tempdir().unwrap();
    let wrong_creds = write_creds(wrong.path(), "admin", "not-the-password", 0o600);
    let wrong_args = [
        "bmc",
        "check",
        "--bmc",
        &ipmi,
        "--credentials",
        &wrong_creds,
    ];
    let run = cli(&wrong_args, None, &mut transcript);
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("rejected the credentials"), "{run:?}");
    assert!(run.stderr.contains("class: credentials-refused"), "{run:?}");
    let json_args = [&wrong_args[..], &["--output", "json"]].concat();
    let run = cli(&json_args, None, &mut transcript);
    let report: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(report["failure"], "credentials-refused", "{run:?}");
    assert!(sim.power_log().unwrap().is_empty());
    assert_never_printed(&transcript, sim.password());
}

#[test]
fn bmc_over_https_with_ca_and_with_pinned_fingerprint() {
    let mut transcript = String::new();
    let signed = RedfishBmc::start(RedfishOptions {
        tls: Tls::CaSigned,
        ..RedfishOptions::default()
    })
    .unwrap();
    let creds = signed.credentials_dir().to_str().unwrap().to_owned();
    let ca = signed.ca_pem_path().unwrap().to_str().unwrap().to_owned();
    let address = url(&signed);
    let run = cli(
        &[
            "bmc",
            "off",
            "--bmc",
            &address,
            "--credentials",
            &creds,
            "--ca",
            &ca,
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(signed.power_state(0).unwrap(), "Off");
    // Without the CA: a TLS failure, exit 1.
    let run = cli(
        &["bmc", "status", "--bmc", &address, "--credentials", &creds],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("tls"), "{run:?}");
    assert_never_printed(&transcript, signed.password());

    let pinned = RedfishBmc::start(RedfishOptions {
        tls: Tls::SelfSignedCa,
        ..RedfishOptions::default()
    })
    .unwrap();
    let creds = pinned.credentials_dir().to_str().unwrap().to_owned();
    let fingerprint = pinned.fingerprint_sha256().unwrap();
    let address = url(&pinned);
    let run = cli(
        &[
            "bmc",
            "reboot",
            "--bmc",
            &address,
            "--credentials",
            &creds,
            "--fingerprint",
            &fingerprint,
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    // --ca and --fingerprint together are a usage error.
    let run = cli(
        &[
            "bmc",
            "status",
            "--bmc",
            &address,
            "--credentials",
            &creds,
            "--fingerprint",
            &fingerprint,
            "--insecure",
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 2, "{run:?}");
    let run = cli(
        &[
            "bmc",
            "status",
            "--bmc",
            &address,
            "--credentials",
            &creds,
            "--insecure",
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("verification disabled"), "{run:?}");
    assert_never_printed(&transcript, pinned.password());
}

fn write_creds(dir: &Path, user: &str, password: &str, mode: u32) -> String {
    let file = dir.join("bmc.conf");
    std::fs::write(&file, format!("username={user}\npassword={password}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file.to_str().unwrap().to_owned()
}

#[test]
fn refused_credentials_wrong_password_and_dead_bmcs() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let address = url(&bmc);
    let dir = tempfile::tempdir().unwrap();
    let mut transcript = String::new();

    // A world-readable credentials file: refused before any traffic, exit 6.
    let loose = write_creds(dir.path(), bmc.username(), bmc.password(), 0o644);
    let run = cli(
        &["bmc", "off", "--bmc", &address, "--credentials", &loose],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 6, "{run:?}");
    assert!(run.stderr.contains("mode 0644"), "{run:?}");
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    // The wrong password: exit 1 with a precise message, and never printed.
    let wrong = "Wr0ng-pass-Q7";
    let file = write_creds(dir.path(), bmc.username(), wrong, 0o600);
    let run = cli(
        &[
            "bmc",
            "off",
            "--bmc",
            &address,
            "--credentials",
            &file,
            "-v",
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("rejected the credentials"), "{run:?}");
    assert_never_printed(&transcript, wrong);
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    // Nothing listening: fails fast.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let run = cli(
        &[
            "bmc",
            "status",
            "--bmc",
            &format!("redfish+http://127.0.0.1:{port}"),
            "--credentials",
            &file,
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("could not connect"), "{run:?}");
    assert!(run.elapsed < Duration::from_secs(3), "{run:?}");

    // A peer that accepts and never answers: bounded by --timeout.
    let hole = BlackHole::start().unwrap();
    let run = cli(
        &[
            "bmc",
            "off",
            "--bmc",
            &format!("redfish+https://{}", hole.tcp_addr()),
            "--credentials",
            &file,
            "--insecure",
            "--timeout",
            "2s",
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.elapsed < Duration::from_secs(4), "{run:?}");
    assert!(
        run.stderr.contains("did not answer") || run.stderr.contains("did not finish"),
        "{run:?}"
    );
    assert_never_printed(&transcript, wrong);
    assert_never_printed(&transcript, bmc.password());
}

#[test]
fn fence_agent_over_stdin_and_arguments() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let mut transcript = String::new();
    let stdin = |action: &str| {
        format!(
            "# sent by pacemaker-fenced\naction={action}\nnodename=node-1\nip=127.0.0.1\n\
             ipport={}\nnotls=1\nlogin={}\npasswd=\"{}\"\npcmk_unknown=1\npower_timeout=20\n",
            bmc.port(),
            bmc.username(),
            bmc.password()
        )
    };
    let run = cli(&["fence-agent"], Some(&stdin("status")), &mut transcript);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), "Status: ON");
    assert!(
        run.stderr.contains("ignoring unknown option pcmk_unknown"),
        "{run:?}"
    );

    let run = cli(&["fence-agent"], Some(&stdin("off")), &mut transcript);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.stdout.trim(), "Success: Powered OFF");
    assert_eq!(bmc.power_state(0).unwrap(), "Off");

    let run = cli(&["fence-agent"], Some(&stdin("status")), &mut transcript);
    assert_eq!(run.code, 2, "status exits 2 when off: {run:?}");
    assert_eq!(run.stdout.trim(), "Status: OFF");

    let run = cli(&["fence-agent"], Some(&stdin("reboot")), &mut transcript);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    let run = cli(&["fence-agent"], Some(&stdin("monitor")), &mut transcript);
    assert_eq!(run.code, 0, "{run:?}");

    // Arguments with a credentials directory (no password anywhere on the command line).
    let creds = bmc.credentials_dir().to_str().unwrap().to_owned();
    let address = format!("redfish+http://127.0.0.1:{}", bmc.port());
    let run = cli(
        &[
            "fence-agent",
            "-o",
            "off",
            "--bmc",
            &address,
            "--credentials",
            &creds,
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    let run = cli(
        &[
            "fence-agent",
            "--action=on",
            "--bmc",
            &address,
            "--credentials",
            &creds,
        ],
        None,
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(bmc.power_state(0).unwrap(), "On");

    // An unknown argument fails like fence-agents do.
    let run = cli(&["fence-agent", "--frobnicate"], None, &mut transcript);
    assert_eq!(run.code, 1, "{run:?}");
    assert_never_printed(&transcript, bmc.password());
}

#[test]
fn fence_agent_metadata_validates_against_the_fence_agents_schema() {
    let schema = Path::new("/usr/share/cluster/relaxng/metadata.rng");
    assert!(
        schema.exists(),
        "{} missing: apt-get install fence-agents",
        schema.display()
    );
    let xmllint = metalguard_e2e::tools::program("xmllint").unwrap();
    let mut transcript = String::new();
    let run = cli(&["fence-agent", "-o", "metadata"], None, &mut transcript);
    assert_eq!(run.code, 0, "{run:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metadata.xml");
    std::fs::write(&file, &run.stdout).unwrap();
    let out = Command::new(xmllint)
        .args(["--noout", "--relaxng"])
        .arg(schema)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Stdin mode gives the same metadata.
    let run2 = cli(&["fence-agent"], Some("action=metadata\n"), &mut transcript);
    assert_eq!(run2.stdout, run.stdout);
}

#[test]
fn fence_agent_refuses_impossible_delays_and_never_echoes_stray_stdin_lines() {
    let mut transcript = String::new();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().to_str().unwrap().to_owned();
    for delay in ["1e30", "-1", "NaN", "inf"] {
        let run = cli(
            &[
                "fence-agent",
                "-o",
                "off",
                "--bmc",
                "redfish+http://127.0.0.1:9",
                "--credentials",
                &creds,
                &format!("--delay={delay}"),
            ],
            None,
            &mut transcript,
        );
        assert_eq!(run.code, 1, "{delay}: {run:?}");
        assert!(
            run.stderr.contains("ERROR: option delay") && !run.stderr.contains("panicked"),
            "{delay}: {run:?}"
        );
    }
    let run = cli(
        &["fence-agent"],
        Some(
            "action=validate-all\nip=127.0.0.1\nlogin=admin\npasswd=x\nS3cr3t-pasted-here\n\
             passwd_tpyo=S3cr3t\n\u{1b}]0;owned\u{7}title=1\n",
        ),
        &mut transcript,
    );
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("WARNING: ignoring stdin line 5"),
        "{run:?}"
    );
    assert!(run.stderr.contains("passwd_tpyo"), "{run:?}");
    assert!(!run.stderr.contains('\u{1b}'), "{run:?}");
    assert_never_printed(&transcript, "S3cr3t");
}

#[test]
fn a_bmc_address_without_slashes_is_refused_without_its_password() {
    // `redfish+http:/admin:PW@…` and `ipmi:admin:PW@…` parse as URLs without a host; their
    // refusals quoted the password (issue 28).
    let mut transcript = String::new();
    let mut printed = String::new();
    let dir = tempfile::tempdir().unwrap();
    let creds = write_creds(dir.path(), "admin", "unused-password", 0o600);
    for address in [
        "redfish+http:/admin:Pw-in-the-url@127.0.0.1:9",
        "ipmi:admin:Pw-in-the-url@127.0.0.1",
    ] {
        let run = cli(
            &["bmc", "status", "--bmc", address, "--credentials", &creds],
            None,
            &mut transcript,
        );
        assert_ne!(run.code, 0, "{run:?}");
        assert!(run.stderr.contains("<redacted>@127.0.0.1"), "{run:?}");
        printed.push_str(&run.stdout);
        printed.push_str(&run.stderr);
        let run = cli(
            &[
                "fence-agent",
                "-o",
                "status",
                "--bmc",
                address,
                "--credentials",
                &creds,
            ],
            None,
            &mut transcript,
        );
        assert_ne!(run.code, 0, "{run:?}");
        printed.push_str(&run.stdout);
        printed.push_str(&run.stderr);
    }
    // The transcript holds the command lines themselves; only what the CLI printed counts.
    assert_never_printed(&printed, "Pw-in-the-url");
}
