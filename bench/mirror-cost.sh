#!/usr/bin/env bash
# What mirroring costs when the two copies land on two devices (bench/run's
# tc-set puts both cache files on the VM's one disk, which halves its write
# rate whatever tiercache does). For each placement it alternates one cache
# device against a set of two (every slot mirrored: --mirror-share 100, the
# same dirty space) and runs fio (ioengine=nbd) 4K randwrite QD32 and 4K
# randread QD32 (hits) over a warmed 256 MiB region; prints IOPS per run,
# the daemon's CPU, and the two/one ratios of the medians.
#
# DEVICES says what a cache device is:
# - loop (the default): a loop device over a file in /dev/shm. Two devices
#   with their own queues and RAM behind them, but every copy is a memcpy
#   on the host's CPUs, the same ones fio and the daemon use: on a small
#   machine this measures CPU, not mirroring. Needs root (losetup).
# - delay: an nbdkit memory export behind the delay filter (DELAY_MS a
#   request, 1 by default; DELAY_THREADS requests at once, 64 by default).
#   A device whose time is its own, as an SSD's is: what a second copy
#   costs in time, not in CPU. With few threads a device's rate is
#   bounded (DELAY_THREADS / DELAY_MS a millisecond), as an SSD's is under
#   load: then a second device adds reads it can serve.
# Usage: bench/mirror-cost.sh [ROUNDS] [SECONDS] [loop|delay]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-8}
DEVICES=${3:-loop}
DELAY_MS=${DELAY_MS:-1}
DELAY_THREADS=${DELAY_THREADS:-64}
BIN=${TIERCACHE_BIN:-target/release/tiercache}
[ -x "$BIN" ] || cargo build --release --quiet
case $DEVICES in
loop | delay) ;;
*)
    echo "mirror-cost: devices are loop or delay, not '$DEVICES'" >&2
    exit 2
    ;;
esac
W=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
LOOPS=()
KITS=()
DEVS=()
SERVE=""
cleanup() {
    [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null || true
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    for k in "${KITS[@]}"; do kill "$k" 2>/dev/null || true; done
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT
for i in 0 1 2; do
    if [ "$DEVICES" = delay ]; then
        nbdkit -U "$W/c$i.sock" --exit-with-parent --threads "$DELAY_THREADS" --filter=delay memory 1G \
            delay-read="${DELAY_MS}ms" delay-write="${DELAY_MS}ms" &
        KITS+=($!)
        DEVS+=("nbd+unix:///?socket=$W/c$i.sock")
        continue
    fi
    dd if=/dev/zero of="$SHM/c$i.img" bs=1M count=1024 status=none
    LOOPS+=("$(losetup -f --show "$SHM/c$i.img")") || {
        echo "mirror-cost: losetup failed (root and loop devices are needed)" >&2
        exit 1
    }
    DEVS+=("${LOOPS[-1]}")
done
for i in 0 1 2; do
    [ "$DEVICES" = delay ] || break
    while [ ! -S "$W/c$i.sock" ]; do sleep 0.05; done
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
    "$BIN" --state-dir "$state" create --name m --mode writeback --block-size 4K --force --wipe --lose-dirty-data \
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
        one=$(run "$placement" "${DEVS[0]}")
        two=$(run "$placement" "${DEVS[1]}" "${DEVS[2]}")
        echo "$placement round $round: one device: write, read IOPS, write CPU ticks: $one;" \
            "two (mirrored): $two"
        echo "$one" >>"$W/one"
        echo "$two" >>"$W/two"
    done
    w1=$(cut -d' ' -f1 "$W/one" | median); w2=$(cut -d' ' -f1 "$W/two" | median)
    r1=$(cut -d' ' -f2 "$W/one" | median); r2=$(cut -d' ' -f2 "$W/two" | median)
    python3 -c "print('$DEVICES, $placement: medians: writes two/one %.2fx ($w2 / $w1), hits two/one %.2fx ($r2 / $r1)' % ($w2 / $w1, $r2 / $r1))"
done
