# shellcheck shell=bash
# Shared helpers of scripts/bench-bmc.sh (and its IPMI half, scripts/bench-bmc-ipmi.sh).
# measure LABEL PREP INPUT CMD... runs CMD $BENCH_N times (after an untimed PREP command,
# with INPUT on stdin, "-" for none), records wall time (ns) and peak RSS (KiB, from
# /usr/bin/time -v), and appends "LABEL median_ms p90_ms max_rss_kib runs failures" to
# $BENCH_RESULTS.

: "${BENCH_N:=20}"

bench_median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m/1e6}'; }
bench_p90() { sort -n | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} i=int(NR*0.9+0.5); if (i<1) i=1; if (i>NR) i=NR; printf "%.1f", a[i]/1e6}'; }

measure() {
    local label=$1 prep=$2 input=$3
    shift 3
    local times rss_file failures=0 max_rss=0 i start end rss
    times=$(mktemp -p "$BENCH_TMP" times.XXXX)
    rss_file=$(mktemp -p "$BENCH_TMP" rss.XXXX)
    for ((i = 0; i < BENCH_N; i++)); do
        if [[ -n $prep ]]; then eval "$prep" >/dev/null 2>&1 || true; fi
        if [[ $input == - ]]; then input=/dev/null; fi
        start=$(date +%s%N)
        if ! /usr/bin/time -v -o "$rss_file" "$@" <"$input" >>"$BENCH_TMP/out.log" 2>&1; then
            failures=$((failures + 1))
        fi
        end=$(date +%s%N)
        echo $((end - start)) >>"$times"
        rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$rss_file")
        if [[ -n $rss && $rss -gt $max_rss ]]; then max_rss=$rss; fi
    done
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$(bench_median <"$times")" \
        "$(bench_p90 <"$times")" "$max_rss" "$BENCH_N" "$failures" >>"$BENCH_RESULTS"
    printf '  %-52s median %8s ms  p90 %8s ms  rss %6s KiB  failures %s/%s\n' "$label" \
        "$(bench_median <"$times")" "$(bench_p90 <"$times")" "$max_rss" "$failures" "$BENCH_N" >&2
}

# median_of LABEL: the recorded median (ms) of LABEL.
median_of() { awk -F'\t' -v l="$1" '$1 == l {print $2}' "$BENCH_RESULTS"; }
rss_of() { awk -F'\t' -v l="$1" '$1 == l {print $4}' "$BENCH_RESULTS"; }
