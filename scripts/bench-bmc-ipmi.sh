# shellcheck shell=bash
# IPMI half of scripts/bench-bmc.sh (sourced by it; uses its BENCH_TMP, PIDS, BIN, USER_NAME,
# PASSWORD, PY, need and bench-lib.sh's measure/median_of/rss_of).
#
# One ipmi_sim (OpenIPMI) with instant power changes: its chassis_control program only writes
# a file, so the tools are measured and not the simulator. Compared, N times each:
#   metalguard-agent bmc off|reboot|status --bmc ipmi://...      (RMCP+ suite 3 here)
#   ipmipower --off --wait-until-off / --stat  (freeipmi; needs -D LAN_2_0 -I 3 -l ADMIN
#                                                -W opensesspriv against ipmi_sim)
#   ipmitool -I lanplus -C 3 chassis power off / status          (-C 3 avoids a 10 s probe)
#   fence_ipmilan off --lanplus --cipher 3, at its defaults and with power_wait=0
# Passwords never appear in process arguments: metalguard reads $IPMI_CREDS, ipmipower a 0600
# --config-file, ipmitool a 0600 -f file, fence_ipmilan its options on stdin.

need ipmi_sim "apt-get install openipmi"
need ipmipower "apt-get install freeipmi-tools"
need ipmitool "apt-get install ipmitool"
need fence_ipmilan "apt-get install fence-agents"

IPMI_DIR=$BENCH_TMP/ipmi
mkdir -p "$IPMI_DIR/state"
# ipmi_sim keeps at most 16 password bytes (the IPMI 1.5 size): its own credentials directory.
IPMI_PASSWORD=${PASSWORD:0:16}
IPMI_CREDS=$IPMI_DIR/creds
mkdir -m 700 "$IPMI_CREDS"
(umask 077 && printf '%s' "$USER_NAME" >"$IPMI_CREDS/username" && printf '%s' "$IPMI_PASSWORD" >"$IPMI_CREDS/password")
IPMI_PORT=$("$PY" -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo 1 >"$IPMI_DIR/power"
cat >"$IPMI_DIR/chassis_control" <<EOF
#!/bin/sh
# ipmi_sim runs "PROG <mc> get power" (answer "power:<0|1>") or "PROG <mc> set <param> <value>".
while [ \$# -gt 0 ] && [ "\$1" != get ] && [ "\$1" != set ]; do shift; done
op="\$1"; [ \$# -gt 0 ] && shift
case "\$op" in
get) echo "power:\$(cat '$IPMI_DIR/power')" ;;
set) while [ \$# -ge 2 ]; do
       case "\$1" in
         power) echo "\$2" >'$IPMI_DIR/power' ;;
         shutdown) echo 0 >'$IPMI_DIR/power' ;;
       esac
       shift 2
     done ;;
esac
exit 0
EOF
chmod 755 "$IPMI_DIR/chassis_control"
# ipmi_sim's lan.conf holds the password itself: keep it 0600 in the private temp dir.
(umask 077 && cat >"$IPMI_DIR/lan.conf" <<EOF
name "bench"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 $IPMI_PORT
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "$IPMI_DIR/chassis_control"
  user 1 false "" "" user 10 none
  user 2 true "$USER_NAME" "$IPMI_PASSWORD" admin 10 none md2 md5 straight
EOF
)
printf 'mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\nmc_enable 0x20\n' >"$IPMI_DIR/sim.emu"
ipmi_sim -c "$IPMI_DIR/lan.conf" -f "$IPMI_DIR/sim.emu" -n -s "$IPMI_DIR/state" >"$IPMI_DIR/ipmi_sim.log" 2>&1 &
PIDS+=($!)

(umask 077 && printf 'username %s\npassword %s\ndriver-type LAN_2_0\ncipher-suite-id 3\nprivilege-level ADMIN\nworkaround-flags opensesspriv\n' \
    "$USER_NAME" "$IPMI_PASSWORD" >"$IPMI_DIR/freeipmi.conf")
(umask 077 && printf '%s' "$IPMI_PASSWORD" >"$IPMI_DIR/ipmitool.pass")
IPMIPOWER=(ipmipower --config-file="$IPMI_DIR/freeipmi.conf" -h "127.0.0.1:$IPMI_PORT")
IPMITOOL=(ipmitool -I lanplus -C 3 -L ADMINISTRATOR -H 127.0.0.1 -p "$IPMI_PORT" -U "$USER_NAME" -f "$IPMI_DIR/ipmitool.pass")
for _ in $(seq 100); do
    if "${IPMITOOL[@]}" chassis power status >/dev/null 2>&1; then break; fi
    sleep 0.05
done
"${IPMITOOL[@]}" chassis power status >/dev/null

(umask 077 && printf 'action=off\nip=127.0.0.1\nipport=%s\nusername=%s\npassword=%s\nlanplus=1\ncipher=3\nprivlvl=administrator\n' \
    "$IPMI_PORT" "$USER_NAME" "$IPMI_PASSWORD" >"$IPMI_DIR/fi-off.in")
(umask 077 && { cat "$IPMI_DIR/fi-off.in"; echo power_wait=0; } >"$IPMI_DIR/fi-off-pw0.in")
(umask 077 && sed 's/^action=off/action=status/' "$IPMI_DIR/fi-off.in" >"$IPMI_DIR/fi-status.in")

IPMI_ON="echo 1 > '$IPMI_DIR/power'"
MG_IPMI="ipmi://127.0.0.1:$IPMI_PORT"
measure "metalguard ipmi status" "$IPMI_ON" - "$BIN" bmc status --bmc "$MG_IPMI" --credentials "$IPMI_CREDS"
measure "metalguard ipmi off (verified)" "$IPMI_ON" - "$BIN" bmc off --bmc "$MG_IPMI" --credentials "$IPMI_CREDS"
measure "metalguard ipmi reboot (verified off+on)" "$IPMI_ON" - "$BIN" bmc reboot --bmc "$MG_IPMI" --credentials "$IPMI_CREDS"
measure "ipmipower --off --wait-until-off" "$IPMI_ON" - "${IPMIPOWER[@]}" --off --wait-until-off
measure "ipmipower --stat" "$IPMI_ON" - "${IPMIPOWER[@]}" --stat
measure "ipmitool chassis power off (unverified)" "$IPMI_ON" - "${IPMITOOL[@]}" chassis power off
measure "ipmitool chassis power status" "$IPMI_ON" - "${IPMITOOL[@]}" chassis power status
measure "fence_ipmilan off (defaults)" "$IPMI_ON" "$IPMI_DIR/fi-off.in" fence_ipmilan
measure "fence_ipmilan off (power_wait=0)" "$IPMI_ON" "$IPMI_DIR/fi-off-pw0.in" fence_ipmilan
measure "fence_ipmilan status" "$IPMI_ON" "$IPMI_DIR/fi-status.in" fence_ipmilan

ipmi_ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "nan" }'; }
MG_IPMI_OFF=$(median_of "metalguard ipmi off (verified)")
IPMIPOWER_OFF=$(median_of "ipmipower --off --wait-until-off")
{
    echo
    echo "IPMI verified off: metalguard $MG_IPMI_OFF ms vs ipmipower $IPMIPOWER_OFF ms -> ratio $(ipmi_ratio "$MG_IPMI_OFF" "$IPMIPOWER_OFF") (goal <= 1.5)"
    echo "  fence_ipmilan defaults $(median_of "fence_ipmilan off (defaults)") ms, power_wait=0 $(median_of "fence_ipmilan off (power_wait=0)") ms"
    echo "  peak RSS: metalguard $(rss_of "metalguard ipmi off (verified)") KiB, ipmitool $(rss_of "ipmitool chassis power status") KiB (goal: below), ipmipower $(rss_of "ipmipower --off --wait-until-off") KiB"
} >&2
