#!/usr/bin/env bash
# The main job: the local lab. On a fresh Debian 12 machine it installs what the lab needs
# (scripts/setup.sh --lab), builds the three binaries once, and runs the lab:
#   scripts/lab.sh            the demo: every scenario in turn, then a summary table
#   scripts/lab.sh up         a lab left running, with a cheat-sheet to poke it (Ctrl-C stops it)
#   scripts/lab.sh run hang   chosen scenarios (hang, double-failure, admin-fence, bad-bmc,
#                             replace, controller-crash, partition)
#   scripts/lab.sh run replace --etcd-layout static-pod
#                             the spare's etcd as kubeadm's static Pod (the agent writes the
#                             manifest, the lab is the host's kubelet); default env-file
# Everything the lab starts binds 127.0.0.1 (or addresses inside network namespaces it
# creates) and is stopped when it ends, also on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --lab
echo "== cargo build (agent, controller, lab)"
# The standalone controller is all the lab runs: without the Kubernetes types (the
# controller's default feature; no other crate here has default features) it builds minutes
# faster, no k8s-openapi. One invocation, so both cores stay busy across the three.
cargo build --locked -p metalguard-e2e -p metalguard-agent -p metalguard-controller --bins --no-default-features
# No command, or options only (scripts/lab.sh --etcd-layout static-pod): the demo.
case "${1:-}" in ""|-*) set -- demo "$@" ;; esac
exec target/debug/metalguard-lab "$@"
