#!/usr/bin/env bash
# Benchmark of the etcd learner join on a 3-member cluster holding ~52 MiB: learner start →
# promotable → promoted, measured by the join flow itself (bootstrap mode, 100 ms polling).
#
# Usage: scripts/bench-etcd.sh [N]       (N runs, default 5)
# Env:   METALGUARD_ETCD_BIN  etcd to measure (default: PATH; scripts/etcd35.sh fetches a 3.5)
# Prints a Markdown table on stdout and one line per run on stderr.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
etcd_bin=${METALGUARD_ETCD_BIN:-$(command -v etcd)}
echo "etcd: $("$etcd_bin" --version | head -n1)" >&2
cargo run -q -p metalguard-etcd --example join_bench -- "${1:-5}"
