#!/usr/bin/env bash
# etcd writes per agent per minute (standalone controller, real etcd, real binary): three
# agents — one reporting every second unchanged, one whose condition flips on every report
# (once a second), one posting a changing report every 5 ms — for METALGUARD_BENCH_SECONDS
# (default 60 here, 20 in the test suite). Counts each agent's etcd writes by the version of
# its key (reports/HOST). Prints the figures on stderr (the test's output).
#
# Usage: scripts/bench-report-writes.sh [SECONDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
export METALGUARD_BENCH_SECONDS=${1:-60}
echo "etcd: $(etcd --version | head -n1); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo nextest run -p metalguard-controller --test report_store etcd_writes_per_agent_per_minute \
  --success-output immediate 2>&1 | grep -E '^ +(over|steady|flapping|flood)' >&2
