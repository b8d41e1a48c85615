#!/usr/bin/env bash
# What mirroring costs when the two copies land on two devices (bench/run's
# tc-set puts both cache files on the VM's one disk, which halves its write
# rate whatever tiercache does). Each cache device here is a loop device
# over a file in /dev/shm: two devices with their own queues, RAM behind
# them. For each placement it alternates one device against a set of two
# (every slot mirrored: --mirror-share 100, the same dirty space) and runs
# fio (ioengine=nbd) 4K randwrite QD32 and 4K randread QD32 (hits) over a
# warmed 256 MiB region; prints IOPS per run, the daemon's CPU, and the
# two/one ratios of the medians.
# Needs root (losetup). Usage: bench/mirror-cost.sh [ROUNDS] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-8}
BIN=${TIERCACHE_BIN:-target/release/tiercache}
[ -x "$BIN" ] || cargo build --release --quiet
W=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
LOOPS=()
SERVE=""
cleanup() {
    [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null || true
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT
for i in 0 1 2; do
    dd if=/dev/zero of="$SHM/c$i.img" bs=1M count=1024 status=none
    LOOPS+=("$(losetup -f --show "$SHM/c$i.img")") || {
        echo "mirror-cost: losetup failed (root and loop devices are needed)" >&2
        exit 1
    }
done
truncate -s 4G "$W/origin.img"

fio_iops() { # $1: uri, $2: randwrite|randread
    local key=write
    [ "$2" = randread ] && key=read
    fio --name=j --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --size=256M --iodepth=32 \
        --runtime="$SECS" --time_based --output-format=json 2>/dev/null | sed -n '/^{/,$p' \
        | python3 -c "import json,sys; print(round(json.load(sys.stdin)['jobs'][0]['$key']['iops']))"
}

# $1: placement, $2...: cache devices. Prints "write read cpu_ticks".
run() {
    local placement=$1
    shift
    local state=$W/state args=()
    rm -rf "$state"
    for c in "$@"; do args+=(--cache "$c"); done
    [ $# -gt 1 ] && args+=(--mirror-share 100)
    "$BIN" --state-dir "$state" create --name m --mode writeback --block-size 4K --force \
        --placement "$placement" --origin "$W/origin.img" "${args[@]}" >/dev/null
    "$BIN" --state-dir "$state" serve --name m --socket "$W/m.nbd" 2>"$W/serve.log" &
    SERVE=$!
    while [ ! -S "$W/m.nbd" ]; do sleep 0.05; done
    local uri="nbd+unix:///?socket=$W/m.nbd"
    fio --name=warm --ioengine=nbd --uri="$uri" --rw=write --bs=1M --size=256M --iodepth=8 \
        --output=/dev/null 2>/dev/null
    local t0 w r t1
    t0=$(awk '{print $14 + $15}' "/proc/$SERVE/stat")
    w=$(fio_iops "$uri" randwrite)
    t1=$(awk '{print $14 + $15}' "/proc/$SERVE/stat")
    r=$(fio_iops "$uri" randread)
    kill -TERM "$SERVE"
    wait "$SERVE" || true
    SERVE=""
    rm -f "$W/m.nbd"
    echo "$w $r $((t1 - t0))"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }

for placement in log in-place; do
    : >"$W/one" && : >"$W/two"
    for round in $(seq "$ROUNDS"); do
        one=$(run "$placement" "${LOOPS[0]}")
        two=$(run "$placement" "${LOOPS[1]}" "${LOOPS[2]}")
        echo "$placement round $round: one device: write, read IOPS, write CPU ticks: $one;" \
            "two (mirrored): $two"
        echo "$one" >>"$W/one"
        echo "$two" >>"$W/two"
    done
    w1=$(cut -d' ' -f1 "$W/one" | median); w2=$(cut -d' ' -f1 "$W/two" | median)
    r1=$(cut -d' ' -f2 "$W/one" | median); r2=$(cut -d' ' -f2 "$W/two" | median)
    python3 -c "print('$placement: medians: writes two/one %.2fx ($w2 / $w1), hits two/one %.2fx ($r2 / $r1)' % ($w2 / $w1, $r2 / $r1))"
done
