#!/usr/bin/env bash
# Measures metalguard-agent at idle: peak RSS and CPU share over a window, with 1 s probes of a
# real local etcd member (/health), disk space, the kernel clock and one exec probe.
# Usage: scripts/bench-agent-idle.sh [SECONDS]   (default 60; builds the release binary)
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOW=${1:-60}
cargo build --release --locked -p metalguard-agent >/dev/null 2>&1
AGENT=target/release/metalguard-agent
WORK=$(mktemp -d /tmp/mg-harness-bench-XXXXXX)
cleanup() { kill "${AGENT_PID:-}" "${ETCD_PID:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CP=$(port); PP=$(port); MP=$(port)
etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "http://127.0.0.1:$CP" \
  --advertise-client-urls "http://127.0.0.1:$CP" --listen-peer-urls "http://127.0.0.1:$PP" \
  --initial-advertise-peer-urls "http://127.0.0.1:$PP" --initial-cluster "bench=http://127.0.0.1:$PP" \
  >"$WORK/etcd.log" 2>&1 &
ETCD_PID=$!
cat >"$WORK/agent.toml" <<TOML
host = "bench"
[state]
dir = "$WORK/state"
[metrics]
listen = "127.0.0.1:$MP"
[etcd]
endpoints = ["http://127.0.0.1:$CP"]
data_dir = "$WORK/etcd"
[etcd.probe]
period = "1s"
timeout = "500ms"
[probes.disk]
period = "1s"
timeout = "500ms"
min_free_bytes = 1
[probes.clock]
period = "1s"
timeout = "500ms"
max_offset = "10s"
[[probes.exec]]
name = "True"
command = ["/bin/true"]
period = "1s"
timeout = "500ms"
TOML
$AGENT run --log-stderr --config "$WORK/agent.toml" 2>"$WORK/agent.log" &
AGENT_PID=$!
sleep 3 # first round, warm-up
ticks() { awk '{print $14+$15+$16+$17}' "/proc/$AGENT_PID/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); s0=$(date +%s.%N)
sleep "$WINDOW"
t1=$(ticks); s1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$AGENT_PID/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$AGENT_PID/status")
cpu=$(python3 -c "print(f'{100*($t1-$t0)/$hz/($s1-$s0):.3f}')")
curl -s "http://127.0.0.1:$MP/status" | grep -c '"healthy": true' | xargs -I{} echo "healthy probes: {}"
echo "window ${WINDOW}s  rss ${rss} KiB  peak rss ${hwm} KiB  cpu ${cpu}% of one core (incl. exec children)"
