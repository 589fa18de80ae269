//! The controller's image (issue 26, item 1): the archive `packaging/build-image.sh` writes
//! without Docker or a registry, imported by a real container runtime (Debian's containerd
//! with runc) under the name the shipped Deployment asks for, and run there as the
//! Deployment runs it: its entrypoint, its non-root user, a read-only root filesystem.
//!
//! `METALGUARD_IMAGE_ARCHIVE` names the archive. scripts/test.sh builds it from the test
//! build's controller (`packaging/build-image.sh --profile dev`: the dynamic binary with its
//! libraries; a release build for musl is not spent by the test command) and sets it; without
//! it this test fails, saying how to build one.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use metalguard_e2e::containerd::{Containerd, namespace_cgroups};
use metalguard_e2e::process::run_capture;
use metalguard_e2e::tools;
use serde_json::Value;

/// The release this tree builds (the workspace version).
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn archive() -> PathBuf {
    metalguard_e2e::lab::kube::pods::image_archive_from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// The image configuration the archive carries, read by skopeo (not by our script).
fn image_config(archive: &std::path::Path) -> Value {
    let mut command = Command::new(tools::program("skopeo").unwrap());
    command
        .args(["inspect", "--config"])
        .arg(format!("docker-archive:{}", archive.display()));
    serde_json::from_str(&run_capture(command, None, "skopeo inspect --config").unwrap()).unwrap()
}

#[test]
fn the_controller_image_is_imported_by_containerd_and_runs_as_its_non_root_user() {
    let archive = archive();
    let config = image_config(&archive);
    assert_eq!(config["os"], "linux", "{config}");
    assert_eq!(config["architecture"], "amd64", "{config}");
    let process = &config["config"];
    assert_eq!(process["User"], "65532:65532", "{config}");
    assert_eq!(
        process["Entrypoint"],
        serde_json::json!(["/metalguard-controller"]),
        "{config}"
    );
    let ports: BTreeSet<&str> = process["ExposedPorts"]
        .as_object()
        .map(|ports| ports.keys().map(String::as_str).collect())
        .unwrap_or_default();
    assert_eq!(ports, BTreeSet::from(["8443/tcp", "9090/tcp"]), "{config}");

    // The name the shipped Deployment's `image: metalguard-controller:VERSION` resolves to.
    let reference = format!("docker.io/library/metalguard-controller:{VERSION}");
    let namespace;
    {
        let containerd = Containerd::start().unwrap();
        namespace = containerd.namespace().to_owned();
        let images = containerd.import(&archive).unwrap();
        assert!(
            images.contains(&reference),
            "{reference} not among the imported images {images:?}"
        );

        // The entrypoint runs from the image alone: every library it links is in it.
        let out = containerd
            .run(
                &reference,
                "mg-image-version",
                &["/metalguard-controller", "--version"],
            )
            .unwrap_or_else(|e| panic!("{e}\ncontainerd's log:\n{}", containerd.log_tail(30)));
        assert_eq!(out.trim(), format!("metalguard-controller {VERSION}"));

        // As user 65532 on a read-only root: writing its certificates anywhere in the image
        // is refused by the file system, and the controller says so instead of running on.
        let refused = containerd.run(
            &reference,
            "mg-image-readonly",
            &["/metalguard-controller", "certs", "init", "/mg-image-certs"],
        );
        let message = refused
            .expect_err("writing to the image's root must fail")
            .to_string();
        assert!(
            message.contains("Read-only file system") || message.contains("Permission denied"),
            "{message}"
        );

        let left = containerd.ctr(&["containers", "ls", "-q"]).unwrap();
        assert!(left.trim().is_empty(), "containers left after --rm: {left}");
    }
    // Torn down: no cgroup of its namespace in any hierarchy, no mount under its root, no
    // process (the test command's leftover check covers the processes).
    assert!(
        namespace_cgroups(&namespace).is_empty(),
        "cgroups left: {:?}",
        namespace_cgroups(&namespace)
    );
}
