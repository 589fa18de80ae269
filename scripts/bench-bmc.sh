#!/usr/bin/env bash
# Benchmark of verified BMC power operations: metalguard-agent beside curl and fence_redfish
# (Redfish, sushy-tools over HTTPS) and, when scripts/bench-bmc-ipmi.sh exists, beside
# ipmipower, ipmitool and fence_ipmilan (IPMI, ipmi_sim) — all against the same emulators in
# one run, with instant power changes so the tools are measured and not the emulator's delay.
#
# Usage: scripts/bench-bmc.sh [N]        (N runs per tool, default 20)
# Env:   METALGUARD_AGENT_BIN  binary to measure (default: cargo build --release)
#        METALGUARD_VENV       venv with sushy-tools (default .tools/venv)
#        BENCH_MARKDOWN=FILE   also write the result table as Markdown to FILE
#
# Credentials never appear in process arguments: metalguard reads a 0600 directory, curl a
# 0600 -K config file, fence_redfish reads its options on stdin.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
export BENCH_N=${1:-20}
BENCH_TMP=$(mktemp -d /tmp/bench-bmc.XXXXXX)
export BENCH_TMP
export BENCH_RESULTS=$BENCH_TMP/results.tsv
: >"$BENCH_RESULTS"
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$BENCH_TMP"
}
trap cleanup EXIT
# shellcheck source=scripts/bench-lib.sh
source "$ROOT/scripts/bench-lib.sh"

need() { command -v "$1" >/dev/null || { echo "bench-bmc: $1 is missing ($2)" >&2; exit 1; }; }
need curl "apt-get install curl"
need fence_redfish "apt-get install fence-agents"
need openssl "apt-get install openssl"
[[ -x /usr/bin/time ]] || { echo "bench-bmc: /usr/bin/time missing (apt-get install time)" >&2; exit 1; }
VENV=${METALGUARD_VENV:-$ROOT/.tools/venv}
PY=$VENV/bin/python3
[[ -x $PY ]] || { echo "bench-bmc: $PY missing (scripts/setup.sh)" >&2; exit 1; }

if [[ -n ${METALGUARD_AGENT_BIN:-} ]]; then
    BIN=$METALGUARD_AGENT_BIN
else
    (cd "$ROOT" && cargo build --release -q -p metalguard-agent)
    BIN=$ROOT/target/release/metalguard-agent
fi
export BIN

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# --- credentials (mode 0600, never on a command line) --------------------------------------
USER_NAME=admin
PASSWORD=$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 20)
CREDS=$BENCH_TMP/creds
mkdir -m 700 "$CREDS"
(umask 077 && printf '%s' "$USER_NAME" >"$CREDS/username" && printf '%s' "$PASSWORD" >"$CREDS/password")
export CREDS USER_NAME PASSWORD

# --- Redfish: sushy-tools over HTTPS with a test CA, bcrypt cost 4, instant power -----------
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca \
    -keyout "$BENCH_TMP/ca.key" -out "$BENCH_TMP/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 \
    -keyout "$BENCH_TMP/bmc.key" -out "$BENCH_TMP/bmc.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' >"$BENCH_TMP/ext.cnf"
openssl x509 -req -in "$BENCH_TMP/bmc.csr" -CA "$BENCH_TMP/ca.pem" -CAkey "$BENCH_TMP/ca.key" \
    -CAcreateserial -days 2 -extfile "$BENCH_TMP/ext.cnf" -out "$BENCH_TMP/bmc.pem" 2>/dev/null
HASH=$(printf '%s' "$PASSWORD" | "$PY" -c 'import bcrypt,sys; print(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(4)).decode())')
(umask 077 && printf '%s:%s\n' "$USER_NAME" "$HASH" >"$BENCH_TMP/htpasswd")
RF_PORT=$(free_port)
SYSTEM_ID=$("$PY" -c 'import uuid; print(uuid.uuid4())')
mkdir "$BENCH_TMP/sushy-state"
cat >"$BENCH_TMP/sushy.conf" <<CONF
SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'
SUSHY_EMULATOR_LISTEN_PORT = $RF_PORT
SUSHY_EMULATOR_FAKE_DRIVER = True
SUSHY_EMULATOR_STATE_DIR = '$BENCH_TMP/sushy-state'
SUSHY_EMULATOR_AUTH_FILE = '$BENCH_TMP/htpasswd'
SUSHY_EMULATOR_FAKE_SYSTEMS = [{'uuid': '$SYSTEM_ID', 'name': 'bench', 'power_state': 'On', 'external_notifier': False, 'nics': [{'mac': '52:54:00:00:00:01', 'ip': '127.0.0.1'}]}]
SUSHY_EMULATOR_SSL_CERT = '$BENCH_TMP/bmc.pem'
SUSHY_EMULATOR_SSL_KEY = '$BENCH_TMP/bmc.key'
CONF
MG_SUSHY_INSTANT=1 PYTHONDONTWRITEBYTECODE=1 "$PY" "$ROOT/tests/fixtures/sushy_launch.py" \
    --config "$BENCH_TMP/sushy.conf" >"$BENCH_TMP/sushy.log" 2>&1 &
PIDS+=($!)
(umask 077 && printf 'user = "%s:%s"\ncacert = "%s"\nsilent\nshow-error\n' \
    "$USER_NAME" "$PASSWORD" "$BENCH_TMP/ca.pem" >"$BENCH_TMP/curl.cfg")
BASE=https://127.0.0.1:$RF_PORT
SYSTEM=/redfish/v1/Systems/$SYSTEM_ID
RESET=$SYSTEM/Actions/ComputerSystem.Reset
for _ in $(seq 100); do
    if curl -K "$BENCH_TMP/curl.cfg" -o /dev/null -f "$BASE$SYSTEM" 2>/dev/null; then break; fi
    sleep 0.1
done
curl -K "$BENCH_TMP/curl.cfg" -o /dev/null -f "$BASE$SYSTEM"
POWER_ON="curl -K '$BENCH_TMP/curl.cfg' -o /dev/null -H 'Content-Type: application/json' -X POST --data '{\"ResetType\":\"On\"}' '$BASE$RESET'; curl -K '$BENCH_TMP/curl.cfg' -o /dev/null '$BASE$SYSTEM'"

printf 'action=%s\nip=127.0.0.1\nipport=%s\nusername=%s\npassword=%s\nssl_insecure=1\nsystems_uri=%s\n' \
    off "$RF_PORT" "$USER_NAME" "$PASSWORD" "$SYSTEM" >"$BENCH_TMP/fr-off.in"
printf 'power_wait=0\n' | cat "$BENCH_TMP/fr-off.in" - >"$BENCH_TMP/fr-off-pw0.in"
sed 's/^action=off/action=status/' "$BENCH_TMP/fr-off.in" >"$BENCH_TMP/fr-status.in"
chmod 600 "$BENCH_TMP"/fr-*.in

MG="redfish+https://127.0.0.1:$RF_PORT$SYSTEM"
MG_DISCOVER="redfish+https://127.0.0.1:$RF_PORT"
(umask 077 && printf 'action=off\nbmc=%s\ncredentials=%s\nca=%s\n' "$MG" "$CREDS" "$BENCH_TMP/ca.pem" >"$BENCH_TMP/mg-fa-off.in")
echo "Redfish (sushy-tools, HTTPS, instant power), N=$BENCH_N:" >&2
measure "metalguard bmc status" "" - "$BIN" bmc status --bmc "$MG" --credentials "$CREDS" --ca "$BENCH_TMP/ca.pem"
measure "metalguard bmc off (verified)" "$POWER_ON" - "$BIN" bmc off --bmc "$MG" --credentials "$CREDS" --ca "$BENCH_TMP/ca.pem"
measure "metalguard bmc off (verified, system discovered)" "$POWER_ON" - "$BIN" bmc off --bmc "$MG_DISCOVER" --credentials "$CREDS" --ca "$BENCH_TMP/ca.pem"
measure "metalguard bmc reboot (verified off+on)" "$POWER_ON" - "$BIN" bmc reboot --bmc "$MG" --credentials "$CREDS" --ca "$BENCH_TMP/ca.pem"
measure "metalguard fence-agent off (stdin)" "$POWER_ON" "$BENCH_TMP/mg-fa-off.in" "$BIN" fence-agent
measure "curl POST ForceOff (1 request)" "$POWER_ON" - curl -K "$BENCH_TMP/curl.cfg" -o /dev/null -f -H 'Content-Type: application/json' -X POST --data '{"ResetType":"ForceOff"}' "$BASE$RESET"
measure "curl GET system (1 request)" "" - curl -K "$BENCH_TMP/curl.cfg" -o /dev/null -f "$BASE$SYSTEM"
measure "fence_redfish off (defaults)" "$POWER_ON" "$BENCH_TMP/fr-off.in" fence_redfish
measure "fence_redfish off (power_wait=0)" "$POWER_ON" "$BENCH_TMP/fr-off-pw0.in" fence_redfish
measure "fence_redfish status" "$POWER_ON" "$BENCH_TMP/fr-status.in" fence_redfish

# --- IPMI half (ipmi_sim; ipmipower, ipmitool, fence_ipmilan), owned by its own script ------
if [[ -f $ROOT/scripts/bench-bmc-ipmi.sh ]]; then
    echo "IPMI (ipmi_sim, instant power), N=$BENCH_N:" >&2
    # shellcheck source=/dev/null
    source "$ROOT/scripts/bench-bmc-ipmi.sh"
fi

# --- summary -----------------------------------------------------------------------------
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
POST=$(median_of "curl POST ForceOff (1 request)")
GET=$(median_of "curl GET system (1 request)")
CURL_PAIR=$(awk -v a="$POST" -v b="$GET" 'BEGIN { printf "%.1f", a + b }')
MG_OFF=$(median_of "metalguard bmc off (verified)")
echo >&2
echo "Redfish verified off: metalguard $MG_OFF ms vs curl POST+GET $CURL_PAIR ms -> ratio $(ratio "$MG_OFF" "$CURL_PAIR") (goal <= 2)" >&2
echo "  vs fence_redfish defaults $(median_of "fence_redfish off (defaults)") ms -> $(ratio "$(median_of "fence_redfish off (defaults)")" "$MG_OFF")x slower than metalguard" >&2
echo "  peak RSS: metalguard $(rss_of "metalguard bmc off (verified)") KiB, fence_redfish $(rss_of "fence_redfish off (defaults)") KiB, curl $(rss_of "curl GET system (1 request)") KiB" >&2
if [[ -n ${BENCH_MARKDOWN:-} ]]; then
    {
        echo "| tool and operation | median ms | p90 ms | peak RSS KiB | runs | failures |"
        echo "|---|---:|---:|---:|---:|---:|"
        awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6}' "$BENCH_RESULTS"
    } >"$BENCH_MARKDOWN"
fi
cat "$BENCH_RESULTS"
