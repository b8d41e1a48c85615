#!/usr/bin/env bash
# Writeback to several origins at once (issue 33): one cache in front of
# two emulated HDDs (nbdkit memory, noparallel serialize=all-requests,
# DELAY_MS a request, 5 by default: one request at a time, as a disk's
# head). Each volume gets BLOCKS random 4K dirty blocks (fio, ioengine=nbd,
# through the served cache with background writeback off), then
# `tiercache flush --volume` times each volume's writeback alone, and after
# the same writes again `tiercache flush` times both together. Writeback
# side by side takes the slower volume's time (together/slower ~1.0), one
# after the other the sum (together/sum ~1.0).
# Usage: bench/parallel-writeback.sh [ROUNDS] [BLOCKS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BLOCKS=${2:-1000}
DELAY_MS=${DELAY_MS:-5}
BIN=${TIERCACHE_BIN:-target/release/tiercache}
[ -x "$BIN" ] || cargo build --release --quiet
W=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
KITS=()
SERVE=""
cleanup() {
    [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null || true
    for k in "${KITS[@]}"; do kill "$k" 2>/dev/null || true; done
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT
for i in 0 1; do
    nbdkit -f -U "$W/hdd$i.sock" --exit-with-parent --filter=noparallel --filter=delay memory 256M \
        serialize=all-requests delay-read="${DELAY_MS}ms" delay-write="${DELAY_MS}ms" &
    KITS+=($!)
done
for i in 0 1; do while [ ! -S "$W/hdd$i.sock" ]; do sleep 0.05; done; done
truncate -s 256M "$SHM/cache.img"
state=$W/state
tc() { "$BIN" --state-dir "$state" "$@"; }
tc create --name pw --mode writeback --block-size 4K --writeback-idle 0 --writeback-high 100 \
    --writeback-low 99 --writeback-age 32767 --origin "nbd+unix:///?socket=$W/hdd0.sock" \
    --origin "nbd+unix:///?socket=$W/hdd1.sock" --cache "$SHM/cache.img" >/dev/null

# Dirties BLOCKS random 4K blocks of each volume (the same ones each time).
fill() {
    "$BIN" --state-dir "$state" serve --name pw --socket "$W/pw.nbd" 2>>"$W/serve.log" &
    SERVE=$!
    while [ ! -S "$W/pw.nbd" ]; do
        kill -0 "$SERVE" 2>/dev/null || { cat "$W/serve.log" >&2; exit 1; }
        sleep 0.05
    done
    for v in vol0 vol1; do
        fio --name=fill --ioengine=nbd --uri="nbd+unix:///$v?socket=$W/pw.nbd" --rw=randwrite \
            --bs=4k --size=256M --number_ios="$BLOCKS" --norandommap --randseed=7 --iodepth=16 \
            --output=/dev/null 2>/dev/null
    done
    kill -TERM "$SERVE"
    wait "$SERVE" || true
    SERVE=""
    rm -f "$W/pw.nbd"
}

seconds() { # the command's wall time
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.2f}')"
}

: >"$W/rows"
for round in $(seq "$ROUNDS"); do
    fill
    a=$(seconds tc flush --name pw --volume vol0)
    b=$(seconds tc flush --name pw --volume vol1)
    fill
    both=$(seconds tc flush --name pw)
    echo "round $round: vol0 alone ${a}s, vol1 alone ${b}s, both together ${both}s"
    echo "$a $b $both" >>"$W/rows"
done
python3 - "$W/rows" "$BLOCKS" "$DELAY_MS" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
a, b, both = (statistics.median(r[i] for r in rows) for i in range(3))
print(f"medians, {sys.argv[2]} random 4K dirty blocks a volume, {sys.argv[3]} ms a request: "
      f"vol0 {a:.2f}s, vol1 {b:.2f}s, together {both:.2f}s: "
      f"together/slower {both / max(a, b):.2f}x, together/sum {both / (a + b):.2f}x")
PY
