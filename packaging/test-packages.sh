#!/usr/bin/env bash
# Package tests under a real systemd (DOMAIN.md §4): builds the .deb (twice, as two versions)
# and the .rpm, boots a cached Debian bookworm root with systemd-nspawn, and checks install,
# enable-but-not-started, start when configured, READY, structured journal fields, the
# watchdog killing a frozen agent, clean stop, upgrade keeping an edited agent.toml, and purge.
# The etcd join's systemd launcher as installed: user metalguard in the agent unit's sandbox
# joins a one-member etcd by writing etcd.service's EnvironmentFile and `systemctl start
# etcd.service`, allowed by the package's polkit rule (refused without it; no other unit).
# Then the controller's .deb (standalone hosts): enabled but inactive without an inventory, the
# unit verifies, and configured (no etcd in the container) it runs sandboxed as `metalguard`
# with its open-file limit, listens, says it cannot act, and stops cleanly.
# The .rpm is checked for contents and scriptlets (no RPM distribution can be booted here).
# Every container and temporary copy is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[package-test] %s\n' "$*"; }
fail() { printf '[package-test] FAIL: %s\n' "$*" >&2; exit 1; }
passed=0; failed=0
check() { # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then say "ok   $name"; passed=$((passed + 1)); else say "FAIL $name"; failed=$((failed + 1)); fi
}

# The test build's binaries (profile dev), which the test command builds anyway; set
# PACKAGE_TEST_BUILD_ARGS="--no-musl" to test the release packages instead.
# shellcheck disable=SC2086 # word splitting of the arguments is intended
packaging/build-packages.sh ${PACKAGE_TEST_BUILD_ARGS:---no-musl --profile dev}
DEB1=$(ls target/debian/metalguard-agent_*_amd64.deb | head -1)
RPM=$(ls target/rpm/metalguard-agent-*.rpm | head -1)
CONTROLLER_DEB=$(ls target/debian/metalguard-controller_*_amd64.deb | head -1)
CONTROLLER_RPM=$(ls target/rpm/metalguard-controller-*.rpm | head -1)
WORK=$(mktemp -d /tmp/mg-pkgtest-XXXXXX)
NSPAWN_PID=""
cleanup() {
  if [ -n "$NSPAWN_PID" ] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
    kill -TERM "$NSPAWN_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$NSPAWN_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$NSPAWN_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/pkgs"
cp "$DEB1" "$WORK/pkgs/v1.deb"
cp "$CONTROLLER_DEB" "$WORK/pkgs/controller.deb"
# A "newer build": same content, higher Debian revision.
cargo deb -p metalguard-agent --no-build --no-strip --locked --fast --deb-revision 2 -o "$WORK/pkgs/v2.deb" >/dev/null

say "rpm: contents and scriptlets"
rpm_files=$(rpm -qlp "$RPM" 2>/dev/null)
rpm_scripts=$(rpm -qp --scripts "$RPM" 2>/dev/null)
rpm_config=$(rpm -qp --configfiles "$RPM" 2>/dev/null)
for f in /usr/bin/metalguard-agent /usr/lib/systemd/system/metalguard-agent.service /etc/metalguard/agent.toml \
         /usr/lib/sysusers.d/metalguard-agent.conf /usr/share/man/man1/metalguard-agent.1 \
         /usr/share/polkit-1/rules.d/50-metalguard-agent.rules; do
  check "rpm contains $f" grep -qx "$f" <<<"$rpm_files"
done
check "rpm marks agent.toml as config" grep -qx /etc/metalguard/agent.toml <<<"$rpm_config"
check "rpm postinstall runs sysusers and enables" grep -q "systemctl enable metalguard-agent" <<<"$rpm_scripts"
check "rpm preuninstall stops on removal" grep -q "disable --now metalguard-agent" <<<"$rpm_scripts"

crpm_files=$(rpm -qlp "$CONTROLLER_RPM" 2>/dev/null)
crpm_scripts=$(rpm -qp --scripts "$CONTROLLER_RPM" 2>/dev/null)
for f in /usr/bin/metalguard-controller /usr/lib/systemd/system/metalguard-controller.service \
         /usr/lib/sysusers.d/metalguard-controller.conf; do
  check "controller rpm contains $f" grep -qx "$f" <<<"$crpm_files"
done
check "controller rpm postinstall runs sysusers and enables" grep -q "systemctl enable metalguard-controller" <<<"$crpm_scripts"

say "deb: unit files verify"
dpkg-deb -x "$WORK/pkgs/v1.deb" "$WORK/unpacked"
check "deb ships the unit" test -f "$WORK/unpacked/lib/systemd/system/metalguard-agent.service" -o -f "$WORK/unpacked/usr/lib/systemd/system/metalguard-agent.service"
check "deb marks agent.toml as conffile" grep -qx /etc/metalguard/agent.toml <(dpkg-deb -I "$WORK/pkgs/v1.deb" conffiles 2>/dev/null)

ROOT_CACHE=$(packaging/nspawn-root.sh)
say "copying the cached root ($ROOT_CACHE)"
cp -a "$ROOT_CACHE" "$WORK/root"
MACHINE="mg-pkgtest-$$"
# etcd for the systemd launcher's test: the harness's binary (Debian bookworm's etcd-server,
# like the container), bound read-only into the container.
ETCD_BIN=${METALGUARD_ETCD_BIN:-$(command -v etcd || true)}
[ -x "$ETCD_BIN" ] || fail "no etcd binary (apt-get install etcd-server, or set METALGUARD_ETCD_BIN)"
systemd-nspawn --boot --register=no --keep-unit --quiet -D "$WORK/root" -M "$MACHINE" \
  --bind-ro="$WORK/pkgs:/pkgs" --bind-ro="$ETCD_BIN:/usr/local/bin/etcd" >"$WORK/console.log" 2>&1 &
NSPAWN_PID=$!
# The container's init: the child of systemd-nspawn that runs systemd. Not merely its first
# child: nspawn forks a short-lived helper first, and a loaded machine let the first lookup
# take that one, whose namespaces were gone a moment later (a fresh-clone run, 2026-11-28).
container_init() {
  local p
  for p in $(pgrep -P "$NSPAWN_PID" || true); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = systemd ] && { echo "$p"; return 0; }
  done
  return 1
}
leader=""
for _ in $(seq 300); do
  leader=$(container_init || true)
  [ -n "$leader" ] && break
  kill -0 "$NSPAWN_PID" 2>/dev/null || break
  sleep 0.1
done
[ -n "$leader" ] || { tail -20 "$WORK/console.log"; fail "container did not start"; }
in_ct() { nsenter --target "$leader" --mount --uts --ipc --net --pid -- env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
for _ in $(seq 300); do
  state=$(in_ct systemctl is-system-running 2>/dev/null || true)
  case "$state" in running|degraded) break ;; esac
  # A container that exited will never come up: say so with its console, not a minute later.
  kill -0 "$NSPAWN_PID" 2>/dev/null || break
  sleep 0.2
done
say "container systemd: ${state:-unknown}"
case "$state" in
  running|degraded) ;;
  *)
    if kill -0 "$NSPAWN_PID" 2>/dev/null; then why="still running, its systemd not up after 60 s"
    else why="exited ($(wait "$NSPAWN_PID" 2>/dev/null; echo "status $?"))"; fi
    say "the container $why; its console ends:"
    tail -30 "$WORK/console.log" >&2
    fail "the container's systemd did not come up (systemctl is-system-running: ${state:-no answer})"
    ;;
esac

say "install v1"
in_ct dpkg -i /pkgs/v1.deb >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; fail "dpkg -i failed"; }
check "unit is enabled" test "$(in_ct systemctl is-enabled metalguard-agent)" = enabled
check "unconfigured: not started (condition failed)" test "$(in_ct systemctl show -p ConditionResult --value metalguard-agent)" = no
check "unconfigured: not failed" test "$(in_ct systemctl is-failed metalguard-agent || true)" != failed
check "user metalguard exists" in_ct getent passwd metalguard
check "systemd-analyze verify passes" in_ct systemd-analyze verify --man=no metalguard-agent.service

say "configure and start"
in_ct sh -c 'cat > /etc/metalguard/agent.d/10-test.toml <<EOT
host = "pkgtest"
[[probes.exec]]
name = "AlwaysHealthy"
command = ["/bin/true"]
period = "500ms"
timeout = "500ms"
EOT'
in_ct mkdir -p /etc/systemd/system/metalguard-agent.service.d
in_ct sh -c 'printf "[Service]\nWatchdogSec=3s\n" > /etc/systemd/system/metalguard-agent.service.d/50-test.conf'
in_ct systemctl daemon-reload
in_ct systemctl start metalguard-agent
check "configured: active (READY reached)" test "$(in_ct systemctl is-active metalguard-agent)" = active
check "status line from the agent" bash -c "[[ \"\$(nsenter --target $leader --mount --pid -- systemctl show -p StatusText --value metalguard-agent)\" == *'probes healthy'* ]]"
sleep 1
journal=$(in_ct journalctl -u metalguard-agent -o json --no-pager)
check "journal has structured fields" grep -q '"MG_STATUS"' <<<"$journal"
check "journal has the ready event" grep -q 'first probe round complete' <<<"$journal"

say "break-glass as root: the hold is the daemon user's, and the event is journaled"
in_ct sh -c 'mkdir -p /root/bmc && printf admin > /root/bmc/username && printf pkgtest-secret > /root/bmc/password && chmod 600 /root/bmc/username /root/bmc/password'
# Nothing answers on port 9: the fence fails at the BMC, after the hold was recorded.
in_ct env SUDO_USER=tester metalguard-agent fence pkgtest-peer --direct --reason "package test" \
  --bmc redfish+http://127.0.0.1:9/redfish/v1/Systems/1 --credentials /root/bmc --timeout 5s \
  >"$WORK/fence.log" 2>&1 || true
hold=$(in_ct sh -c 'ls /var/lib/metalguard/holds/*.json 2>/dev/null' | head -1)
check "hold recorded before the BMC was tried" test -n "$hold"
check "hold owned by the daemon's user" test "$(in_ct stat -c %U:%G "${hold:-/nonexistent}")" = metalguard:metalguard
check "hold readable by the daemon's user" in_ct runuser -u metalguard -- cat "${hold:-/nonexistent}"
check "holds directory writable by the daemon's user (it deletes released holds)" in_ct runuser -u metalguard -- test -w /var/lib/metalguard/holds
breakglass=$(in_ct journalctl -t metalguard-agent -o json --no-pager)
check "journal has the break-glass event with user and hold id" bash -c "grep -q '\"MG_HOLD_ID\":\"pkgtest/' <<<\"\$1\" && grep -q '\"MG_USER\":\"tester\"' <<<\"\$1\"" _ "$breakglass"
check "journal never has the BMC password" bash -c "! grep -q pkgtest-secret <<<\"\$1\"" _ "$breakglass"
in_ct rm -rf /var/lib/metalguard/holds /root/bmc

say "freeze the agent: the watchdog must kill and restart it"
pid1=$(in_ct systemctl show -p MainPID --value metalguard-agent)
in_ct kill -STOP "$pid1"
restarted=no
for _ in $(seq 100); do
  n=$(in_ct systemctl show -p NRestarts --value metalguard-agent)
  pid2=$(in_ct systemctl show -p MainPID --value metalguard-agent)
  if [ "${n:-0}" -ge 1 ] && [ "$pid2" != "$pid1" ] && [ "$(in_ct systemctl is-active metalguard-agent)" = active ]; then restarted=yes; break; fi
  sleep 0.2
done
check "frozen agent restarted by the watchdog" test "$restarted" = yes
check "journal records the watchdog timeout" bash -c "nsenter --target $leader --mount --pid -- journalctl -u metalguard-agent --no-pager | grep -q 'Watchdog timeout'"

say "stop"
in_ct systemctl stop metalguard-agent
check "stopped cleanly" test "$(in_ct systemctl show -p Result --value metalguard-agent)" = success
check "journal has the clean-stop event" bash -c "nsenter --target $leader --mount --pid -- journalctl -u metalguard-agent --no-pager | grep -q 'metalguard-agent stopped'"

say "upgrade keeps an edited agent.toml and restarts the service"
in_ct systemctl start metalguard-agent
in_ct sh -c 'echo "# edited by the operator" >> /etc/metalguard/agent.toml'
start1=$(in_ct systemctl show -p ExecMainStartTimestampMonotonic --value metalguard-agent)
in_ct dpkg -i --force-confold /pkgs/v2.deb >"$WORK/upgrade.log" 2>&1 || { cat "$WORK/upgrade.log"; fail "upgrade failed"; }
check "edited agent.toml kept" in_ct grep -q "edited by the operator" /etc/metalguard/agent.toml
start2=$(in_ct systemctl show -p ExecMainStartTimestampMonotonic --value metalguard-agent)
check "service restarted by the upgrade" test "$start1" != "$start2"
check "service active after upgrade" test "$(in_ct systemctl is-active metalguard-agent)" = active

say "systemd launcher: the agent, as installed (user metalguard, its unit's sandbox), joins etcd run by etcd.service"
check "package ships the polkit rule" in_ct test -f /usr/share/polkit-1/rules.d/50-metalguard-agent.rules
# A one-member cluster to join (etcd-seed.service), and the etcd.service the launcher starts: it
# runs etcd from the EnvironmentFile the agent writes in its state directory.
EP=$((30000 + $$ % 10000 * 4 % 10000))
SEED_CLIENT=$EP; SEED_PEER=$((EP + 1)); JOIN_CLIENT=$((EP + 2)); JOIN_PEER=$((EP + 3))
in_ct sh -c "cat > /etc/systemd/system/etcd-seed.service <<EOT
[Service]
Type=notify
ExecStart=/usr/local/bin/etcd --name seed --data-dir /var/lib/etcd-seed --listen-client-urls http://127.0.0.1:$SEED_CLIENT --advertise-client-urls http://127.0.0.1:$SEED_CLIENT --listen-peer-urls http://127.0.0.1:$SEED_PEER --initial-advertise-peer-urls http://127.0.0.1:$SEED_PEER --initial-cluster seed=http://127.0.0.1:$SEED_PEER --initial-cluster-state new
EOT"
in_ct sh -c 'cat > /etc/systemd/system/etcd.service <<EOT
[Unit]
Description=etcd (its configuration written by metalguard-agent)
[Service]
Type=notify
EnvironmentFile=/var/lib/metalguard/etcd.env
ExecStart=/usr/local/bin/etcd
Restart=on-failure
EOT'
# The join runs as the packaged unit does: the installed unit's user and sandbox, with the
# join command instead of the daemon (a oneshot; no controller in the container to send the
# go-ahead, so the join promotes itself: --bootstrap-desired-voters 2).
JOIN="/usr/bin/metalguard-agent etcd --endpoints http://127.0.0.1:$SEED_CLIENT join --name pkgtest --peer-url http://127.0.0.1:$JOIN_PEER --client-url http://127.0.0.1:$JOIN_CLIENT --data-dir /var/lib/etcd-pkgtest --state-file /var/lib/metalguard/etcd-join.json --launcher systemd --unit etcd.service --bootstrap-desired-voters 2"
# (RuntimeDirectory= is left out: the running agent's /run/metalguard would go with this unit.)
in_ct sh -c "sed -e '/^ExecCondition=/d' -e '/^WatchdogSec=/d' -e '/^NotifyAccess=/d' -e '/^Restart/d' -e '/^RuntimeDirectory=/d' \
  -e 's/^Type=notify/Type=oneshot/' -e '/^\[Install\]/,\$d' -e 's|^ExecStart=.*|ExecStart=$JOIN|' \
  \$(systemctl show -p FragmentPath --value metalguard-agent) > /etc/systemd/system/mg-etcd-join.service"
in_ct systemctl daemon-reload
in_ct systemctl start etcd-seed.service
check "seed etcd active" test "$(in_ct systemctl is-active etcd-seed)" = active
check "join unit runs as metalguard" test "$(in_ct systemctl show -p User --value mg-etcd-join)" = metalguard
check "join unit keeps the agent's sandbox" test "$(in_ct systemctl show -p ProtectSystem --value mg-etcd-join)" = strict
# Without the rule, user metalguard may not start etcd.service (so the rule is what allows it).
in_ct mv /usr/share/polkit-1/rules.d/50-metalguard-agent.rules /root/
denied=no
for _ in $(seq 50); do
  if ! in_ct runuser -u metalguard -- systemctl start etcd.service 2>"$WORK/denied.log"; then denied=yes; break; fi
  in_ct systemctl stop etcd.service 2>/dev/null || true; sleep 0.1
done
check "without the polkit rule metalguard may not start etcd.service" test "$denied" = yes
check "the refusal is polkit's" grep -qi "authenticat\|access denied\|not authorized" "$WORK/denied.log"
in_ct mv /root/50-metalguard-agent.rules /usr/share/polkit-1/rules.d/
# polkitd reloads its rules when the directory changes: wait until the rule allows the
# launcher's other verb (stop of the inactive etcd.service).
allowed=no
for _ in $(seq 50); do
  if in_ct runuser -u metalguard -- systemctl stop etcd.service 2>/dev/null; then allowed=yes; break; fi
  sleep 0.2
done
check "with the rule metalguard may stop etcd.service" test "$allowed" = yes
in_ct systemctl start mg-etcd-join.service || true
check "join (systemd launcher) succeeded under the agent's sandbox" test "$(in_ct systemctl show -p Result --value mg-etcd-join)" = success
check "etcd.service started by the agent is active" test "$(in_ct systemctl is-active etcd)" = active
check "the join's log shows it became a member" bash -c "nsenter --target $leader --mount --pid -- journalctl -u mg-etcd-join --no-pager | grep -Eq 'etcd join advanced.*to=\"?member'"
check "the EnvironmentFile is the agent's, mode 0600" test "$(in_ct stat -c '%U %a' /var/lib/metalguard/etcd.env)" = "metalguard 600"
members=$(ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$SEED_CLIENT" member list -w json 2>/dev/null || true)
check "two members, no learner (joined and promoted)" bash -c "[ \"\$(grep -o '\"ID\"' <<<\"\$1\" | wc -l)\" = 2 ] && ! grep -q '\"isLearner\":true' <<<\"\$1\"" _ "$members"
check "the joined member is named and serves" bash -c "grep -q '\"name\":\"pkgtest\"' <<<\"\$1\"" _ "$members"
check "the rule allows no other unit: metalguard may not stop etcd-seed" bash -c "! nsenter --target $leader --mount --pid -- runuser -u metalguard -- systemctl stop etcd-seed.service 2>/dev/null"
check "etcd-seed still active" test "$(in_ct systemctl is-active etcd-seed)" = active
check "metalguard may stop the running etcd.service (the launcher's stop)" in_ct runuser -u metalguard -- systemctl stop etcd.service
check "etcd.service stopped" test "$(in_ct systemctl is-active etcd || true)" = inactive
in_ct systemctl stop etcd-seed.service
in_ct journalctl -u mg-etcd-join --no-pager >"$WORK/join.log" 2>&1 || true

say "remove and purge"
in_ct rm -f /etc/metalguard/agent.d/10-test.toml
in_ct dpkg --purge metalguard-agent >"$WORK/purge.log" 2>&1 || { cat "$WORK/purge.log"; fail "purge failed"; }
check "service gone after purge" bash -c "! nsenter --target $leader --mount --pid -- systemctl is-active --quiet metalguard-agent"
check "config removed by purge" bash -c "! nsenter --target $leader --mount -- test -e /etc/metalguard/agent.toml"
check "state removed by purge" bash -c "! nsenter --target $leader --mount -- test -e /var/lib/metalguard"

say "controller: install, unconfigured"
in_ct dpkg -i /pkgs/controller.deb >"$WORK/controller-install.log" 2>&1 || { cat "$WORK/controller-install.log"; fail "dpkg -i controller failed"; }
check "controller unit is enabled" test "$(in_ct systemctl is-enabled metalguard-controller)" = enabled
check "controller unconfigured: not started (condition failed)" test "$(in_ct systemctl show -p ConditionResult --value metalguard-controller)" = no
check "controller unconfigured: not failed" test "$(in_ct systemctl is-failed metalguard-controller || true)" != failed
check "controller: systemd-analyze verify passes" in_ct systemd-analyze verify --man=no metalguard-controller.service

say "controller: configured without etcd (it runs, sandboxed, and says it cannot act)"
CPORT=$((20000 + $$ % 20000))
in_ct metalguard-controller certs init /etc/metalguard/tls >/dev/null
in_ct metalguard-controller certs issue controller /etc/metalguard/tls --server >/dev/null
in_ct chown -R metalguard:metalguard /etc/metalguard/tls
in_ct sh -c "cat > /etc/metalguard/inventory.toml <<EOT
[controller]
listen = \"127.0.0.1:$CPORT\"
tls_dir = \"/etc/metalguard/tls\"
[etcd]
endpoints = [\"http://127.0.0.1:9\"]
[control_plane]
desired_replicas = 1
EOT"
in_ct systemctl start metalguard-controller || in_ct journalctl -u metalguard-controller --no-pager | tail -20
sleep 2
check "controller configured: active" test "$(in_ct systemctl is-active metalguard-controller)" = active
cpid=$(in_ct systemctl show -p MainPID --value metalguard-controller)
check "controller runs as metalguard" test "$(in_ct stat -c %U "/proc/${cpid:-1}")" = metalguard
climits=$(in_ct cat "/proc/${cpid:-1}/limits" | grep 'Max open files' || true)
say "controller: $climits (the unit asks 65536; a container's own hard limit caps it)"
check "controller open-file soft limit raised to its hard limit" bash -c "read -r _ _ _ soft hard _ <<<\"\$1\"; [ -n \"\$soft\" ] && [ \"\$soft\" = \"\$hard\" ] && [ \"\$soft\" -gt 1024 ]" _ "$climits"
cjournal=$(in_ct journalctl -u metalguard-controller --no-pager)
check "controller listens on its agent api" grep -q "agent api listening" <<<"$cjournal"
check "controller says it cannot act without etcd" grep -q "cannot act" <<<"$cjournal"
in_ct systemctl stop metalguard-controller
check "controller stopped cleanly" test "$(in_ct systemctl show -p Result --value metalguard-controller)" = success
in_ct dpkg --purge metalguard-controller >"$WORK/controller-purge.log" 2>&1 || { cat "$WORK/controller-purge.log"; fail "controller purge failed"; }
check "controller gone after purge" bash -c "! nsenter --target $leader --mount -- test -e /usr/bin/metalguard-controller"
check "the operator's inventory stays" in_ct test -e /etc/metalguard/inventory.toml

say "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
