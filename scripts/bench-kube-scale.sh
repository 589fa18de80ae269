#!/usr/bin/env bash
# The Kubernetes backend at scale (issue 18, item 3): the release-built metalguard-controller on a
# real kube-apiserver (etcd 3.6) with 5 control-plane hosts and 5,000 worker Nodes, 100 of them
# NotReady; round time, resident memory and API requests at rest and during remediation
# (controller/benches/kube_scale.rs says what is measured and how).
#
# Usage: scripts/bench-kube-scale.sh [REST_SECONDS [REMEDIATION_SECONDS]]
#   BENCH_WORKERS, BENCH_UNHEALTHY, BENCH_NODE_UPDATES_PER_SECOND size the run;
#   BENCH_MARKDOWN=FILE writes the tables there.
# Everything the benchmark starts (etcd, kube-apiserver, the controller) runs in one process
# group, killed on exit, failure or interrupt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
eval "$(scripts/kube-build.sh --print-env | sed 's/^/export /')"
export BENCH_REST_SECONDS=${1:-${BENCH_REST_SECONDS:-60}}
export BENCH_REMEDIATION_SECONDS=${2:-${BENCH_REMEDIATION_SECONDS:-180}}

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)," \
  "$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(uname -sr)," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# Build first (outside the measured group): the bench profile is release (thin LTO) and the
# controller binary it runs is built with it.
cargo bench -p metalguard-controller --bench kube_scale --no-run

group=
cleanup() {
  if [[ -n $group ]]; then kill -TERM -- "-$group" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
setsid cargo bench -p metalguard-controller --bench kube_scale &
group=$!
status=0
wait "$group" || status=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit "$status"
