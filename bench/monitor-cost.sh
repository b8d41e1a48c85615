#!/usr/bin/env bash
# What serve --metrics/--http cost 4 KiB read hits: fio (ioengine=nbd,
# randread 4k, QD32) over a warmed 8 MiB range, alternating runs without the
# endpoints and with both while a scraper fetches /metrics and
# /api/snapshot once a second. Prints IOPS per run and the on/off ratio of
# the medians. Usage: bench/monitor-cost.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-10}
BIN=${TIERCACHE_BIN:-target/release/tiercache}
[ -x "$BIN" ] || cargo build --release --quiet
W=$(mktemp -d)
trap 'kill $SERVE $SCRAPER 2>/dev/null || true; rm -rf "$W"' EXIT
SERVE=""; SCRAPER=""
export TIERCACHE_STATE_DIR=$W/state
truncate -s 256M "$W/origin.img"; truncate -s 64M "$W/cache.img"
"$BIN" create --origin "$W/origin.img" --cache "$W/cache.img" --mode writethrough >/dev/null
URI="nbd+unix:///?socket=$W/state/tc0.nbd"
MPORT=$((20000 + RANDOM % 20000)); HPORT=$((MPORT + 1))

run() { # $1: on|off
    if [ "$1" = on ]; then
        "$BIN" serve --metrics 127.0.0.1:$MPORT --http 127.0.0.1:$HPORT 2>/dev/null & SERVE=$!
    else
        "$BIN" serve 2>/dev/null & SERVE=$!
    fi
    while [ ! -S "$W/state/tc0.sock" ]; do sleep 0.05; done
    sleep 0.3
    fio --name=warm --ioengine=nbd --uri="$URI" --rw=read --bs=1M --size=8M --output=/dev/null
    if [ "$1" = on ]; then
        ( while true; do curl -s -o /dev/null 127.0.0.1:$MPORT/metrics; curl -s -o /dev/null 127.0.0.1:$HPORT/api/snapshot; sleep 1; done ) & SCRAPER=$!
    fi
    iops=$(fio --name=hits --ioengine=nbd --uri="$URI" --rw=randread --bs=4k --size=8M --iodepth=32 \
        --runtime="$SECS" --time_based --output-format=json | sed -n '/^{/,$p' \
        | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')
    if [ -n "$SCRAPER" ]; then kill $SCRAPER; wait $SCRAPER 2>/dev/null || true; SCRAPER=""; fi
    kill -TERM $SERVE; wait $SERVE || true; SERVE=""
    echo "$iops"
}

off=(); on=()
for r in $(seq "$ROUNDS"); do
    a=$(run off); b=$(run on)
    echo "round $r: off $a IOPS, on $b IOPS"
    off+=("$a"); on+=("$b")
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [int(x) for x in sys.argv[1].split()]
on = [int(x) for x in sys.argv[2].split()]
mo, mn = statistics.median(off), statistics.median(on)
print(f"median off {mo:.0f} IOPS, on {mn:.0f} IOPS, on/off {mn / mo:.3f}")
PY
