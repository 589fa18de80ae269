//! The controller with only the etcd role docs/design-etcd.md asks for: `readwrite` on its
//! prefix, authentication enabled, TLS with client certificates (etcd takes the certificate's
//! common name as the user). It leads, persists reports and a fence's intent, and plans; the
//! same user is refused outside its prefix; a user with a password works, a wrong password is
//! named as such.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use metalguard_e2e::ports::reserve_port;

/// The role and users of the runbook, then `auth enable`. The harness's own client is `root`.
fn enable_auth_with_the_metalguard_role(lab: &Lab) {
    for args in [
        vec!["user", "add", "root", "--new-user-password=root-not-used"],
        vec!["user", "grant-role", "root", "root"],
        vec!["role", "add", "metalguard"],
        vec![
            "role",
            "grant-permission",
            "metalguard",
            "--prefix=true",
            "readwrite",
            "/metalguard/",
        ],
        vec!["user", "add", "metalguard", "--new-user-password=s3cret-pw"],
        vec!["user", "grant-role", "metalguard", "metalguard"],
        vec!["auth", "enable"],
    ] {
        lab.etcd.etcdctl(&args).unwrap();
    }
}

fn cli(args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The lab's inventory `name` with `from` replaced by `to` in its text.
fn edited(lab: &Lab, name: &str, port: u16, edits: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(lab.inventory(name, port)).unwrap();
    for (from, to) in edits {
        assert!(text.contains(from), "{from} not in the inventory");
        text = text.replace(from, to);
    }
    let path = lab.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn status(inventory: &Path) -> (bool, String) {
    cli(&["status", "--inventory", inventory.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_with_only_its_prefix_role_leads_persists_and_plans_and_nothing_more() {
    let lab = Lab::start();
    enable_auth_with_the_metalguard_role(&lab);
    let port = reserve_port().unwrap();
    let inventory = lab.inventory("ctl-a", port.port());
    let _controller = lab.controller_from("ctl-a", &inventory);
    let w1 = client(&lab.tls(), Some("w-1"));
    // Leading needs the lease and the leader key; a 200 to a report needs the report written.
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    assert_eq!(post_report(&w1, port.port(), "w-1", "w-1").await, Ok(200));
    report_etcd_voter(&lab, port.port()).await;
    let (ok, out) = status(&inventory);
    assert!(ok, "{out}");
    assert!(
        out.contains("leader: ctl-a") && out.contains("w-1: agent test"),
        "{out}"
    );
    // `status` also reads etcd's alarms and member list: not refused to this user.
    assert!(!out.contains("permission denied"), "{out}");

    let (ok, out) = cli(&[
        "fence",
        "w-2",
        "--reason",
        "rbac",
        "--force",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(ok, "{out}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !operation_keys(&lab.etcd)
        .iter()
        .any(|k| k.contains("remediation/w-2/"))
    {
        assert!(
            Instant::now() < deadline,
            "the fence's intent was never persisted:\n{}",
            status(&inventory).1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The same user outside its prefix: refused, and said so with the user and the prefix.
    let elsewhere = edited(
        &lab,
        "elsewhere",
        1,
        &[("[etcd]\n", "[etcd]\nprefix = \"/elsewhere\"\n")],
    );
    let (ok, out) = status(&elsewhere);
    assert!(!ok, "{out}");
    assert!(
        out.contains("permission denied: etcd's RBAC refused it to the client certificate's user \"metalguard\"")
            && out.contains("readwrite on /elsewhere/"),
        "{out}"
    );
    // Nothing was written there by anyone.
    assert_eq!(
        lab.etcd
            .etcdctl(&["get", "--prefix", "--keys-only", "/elsewhere/"])
            .unwrap()
            .trim(),
        ""
    );

    // A certificate whose common name is no etcd user has no rights at all.
    let nobody = lab.etcd.pki().unwrap().issue_client("nobody").unwrap();
    let as_nobody = edited(
        &lab,
        "nobody",
        1,
        &[(
            &lab.etcd_tls_keys(),
            &etcd_tls_keys(&metalguard_e2e::etcd::ClientTls {
                ca: lab.etcd_client.ca.clone(),
                client: nobody,
            }),
        )],
    );
    let (ok, out) = status(&as_nobody);
    assert!(
        !ok && out.contains("permission denied") && out.contains("\"nobody\""),
        "{out}"
    );

    // A user with a password (the handshake still needs a client certificate): the token
    // etcd gives for the password decides, not the certificate's name.
    let password = lab.dir.path().join("etcd-password");
    std::fs::write(&password, "s3cret-pw\n").unwrap();
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).unwrap();
    let user_lines = format!(
        "[etcd]\nusername = \"metalguard\"\npassword_file = {:?}\n",
        password.display().to_string()
    );
    let as_user = {
        let text = std::fs::read_to_string(&as_nobody)
            .unwrap()
            .replace("[etcd]\n", &user_lines);
        let path = lab.dir.path().join("as-user.toml");
        std::fs::write(&path, text).unwrap();
        path
    };
    let (ok, out) = status(&as_user);
    assert!(ok && out.contains("leader: ctl-a"), "{out}");

    std::fs::write(&password, "Xq7-not-the-password\n").unwrap();
    let (ok, out) = status(&as_user);
    assert!(!ok, "{out}");
    assert!(
        out.contains("authentication: etcd refused the user name or password")
            && out.contains("invalid user ID or password")
            && !out.contains("Xq7-not-the-password"),
        "{out}"
    );
}
