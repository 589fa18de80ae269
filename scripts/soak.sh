#!/usr/bin/env bash
# The nemesis soak (issue 24): a lab of five control-plane hosts and two controller replicas,
# a workload writing keys, and a seeded random schedule of faults (host and etcd hangs, agents
# killed, partitions, the leading controller paused or killed, BMCs that fail, answer slowly
# or lie, the API server frozen in Kubernetes mode). Everything is recorded in one NDJSON
# history that a checker reads at the end; the report names each violation with the seed
# and the history around it. The same seed replays the same schedule.
#   scripts/soak.sh [--kubernetes] [--seed N] [--duration SECONDS] [--out DIR]
#   scripts/soak.sh --lag ...        also the leader-lag fault: the leader's answers held in a
#                   relay, then it crashes with a command in flight (docs/design-soak.md)
#   scripts/soak.sh --mutate skip-term-check|skip-quorum-check|withdraw-inherited ...
#                   debug builds only, comma separated: the agents run with one safety check
#                   switched off, or a new leadership withdraws its predecessor's power cuts,
#                   to show the checker finds what a check prevents (docs/design-soak.md)
#   scripts/soak.sh --no-build ...   use the binaries already in target/debug (test.sh)
#   scripts/soak.sh check target/soak/standalone-seed-1/history.ndjson   check a history again
# Exit status: 0 no violation, 1 a violation, 2 the soak could not run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=true
kubernetes=false
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=false ;;
    --kubernetes) kubernetes=true; args+=("$1") ;;
    --mutate) export METALGUARD_TEST_MUTATE="$2"; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
if $build; then
  if $kubernetes; then scripts/setup.sh; else scripts/setup.sh --lab; fi
fi
# etcd 3.6 and, in Kubernetes mode, the Kubernetes binaries: built once into .tools/.
if $kubernetes || [ -x "$(scripts/kube-build.sh --print-env | sed -n 's/^METALGUARD_ETCD36_BIN=//p')" ]; then
  $build && scripts/kube-build.sh
  eval "$(scripts/kube-build.sh --print-env | sed 's/^/export /')"
  export METALGUARD_ETCD_BIN="$METALGUARD_ETCD36_BIN"
  METALGUARD_ETCDCTL_BIN="$(dirname "$METALGUARD_ETCD36_BIN")/etcdctl"
  export METALGUARD_ETCDCTL_BIN
fi
if $build; then
  echo "== cargo build (agent, controller, soak)"
  cargo build --locked -p metalguard-e2e -p metalguard-agent -p metalguard-controller --bins
fi
exec target/debug/metalguard-soak "${args[@]}"
