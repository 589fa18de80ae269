//! `run --backend=kubernetes` with a kubeconfig whose API server does not answer: the
//! controller exits with a message naming the server, within a bounded time, instead of hanging.

#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

fn kubeconfig(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: not-a-real-token\n"
        ),
    )
    .unwrap();
    path
}

fn run(server: &str) -> (String, Duration, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_metalguard-controller"))
        .args([
            "run",
            "--backend=kubernetes",
            "--namespace",
            "metalguard-system",
        ])
        .env("KUBECONFIG", kubeconfig(dir.path(), server))
        .env("METALGUARD_TLS_DIR", dir.path())
        .env("METALGUARD_LISTEN", "127.0.0.1:0")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed(),
        output.status.code(),
    )
}

#[test]
fn a_closed_port_fails_at_once_naming_the_server() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = format!("https://127.0.0.1:{port}");
    let (stderr, took, code) = run(&server);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the Kubernetes API server at {server}/ could not be reached"
        )),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn a_server_that_accepts_but_never_answers_fails_within_the_deadline() {
    // Accepts TCP connections and never says a word (a hung apiserver or a half-open LB).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("https://{}", listener.local_addr().unwrap());
    let _keep = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let (stderr, took, code) = run(&server);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("did not answer within 15s") || stderr.contains("could not be reached"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}
