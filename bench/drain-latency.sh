#!/usr/bin/env bash
# Does writeback starve the foreground? (issue 34; Open CAS issue 1439 saw
# 20k IOPS fall to 5k while its cleaner ran.) One cache (a file in
# /dev/shm) in front of an emulated HDD (nbdkit memory, noparallel
# serialize=all-requests, DELAY_MS a request: one request at a time, as a
# disk's head). The daemon serves it over NBD; fio (ioengine=nbd) drives a
# fixed load of RATE 4K random read hits a second (over a warmed, clean
# region) plus RATE 4K random writes a second (to an 8 MiB region), QD4
# each, for SECS seconds, and reports p50/p99/p99.9 completion latency:
#   idle       nothing to write back;
#   flush      during `tiercache flush` of DIRTY random 4K dirty blocks;
#   watermark  during background writeback above the high watermark
#              (set-writeback --high 1 --low 0 with the same dirty blocks).
# Then it prints the ratios of each drain's p99 to idle's (target: at most
# 1.5x) and how long each drain took (it must finish).
# Each round runs the three phases; the table has the medians of ROUNDS
# (3) rounds: single p99s of tens of µs on a shared 2-core machine move
# by 2x from run to run.
# The cache device: by default a file in /dev/shm (RAM, nothing waits).
# CACHE_DELAY_MS=N makes it a device whose time is its own and which is
# busy: an nbdkit memory export behind the delay filter, N ms a request,
# CACHE_THREADS (8) at once (bench/mirror-cost.sh's delay devices), so the
# drain's cache reads queue with the foreground's hits and writes. DELAY_MS
# (5) is the origin's time a request: raise it for a slow origin.
# JSON_OUT=FILE also writes the medians there (bench/run's `drain` part
# runs this script and reads it).
# Usage: [ROUNDS=N] [DELAY_MS=N] [CACHE_DELAY_MS=N [CACHE_THREADS=N]] [JSON_OUT=FILE]
#        bench/drain-latency.sh [SECS] [RATE] [DIRTY]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-15}
RATE=${2:-500}
DIRTY=${3:-6000}
ROUNDS=${ROUNDS:-3}
DELAY_MS=${DELAY_MS:-5}
CACHE_DELAY_MS=${CACHE_DELAY_MS:-}
CACHE_THREADS=${CACHE_THREADS:-8}
if [ "$DIRTY" -lt 1000 ]; then
    # The watermark phase sets the high watermark to 1%: of the 256 MiB
    # cache's 65,536 blocks, fewer than 656 dirty would never start it.
    echo "drain-latency: DIRTY must be at least 1000 (above 1% of the cache's blocks)" >&2
    exit 2
fi
BIN=${TIERCACHE_BIN:-target/release/tiercache}
[ -x "$BIN" ] || cargo build --release --quiet
W=$(mktemp -d)
SHM=$(mktemp -d -p /dev/shm)
KIT=""
CKIT=""
SERVE=""
DRAIN=""
cleanup() {
    [ -n "$DRAIN" ] && kill "$DRAIN" 2>/dev/null || true
    [ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null || true
    [ -n "$KIT" ] && kill "$KIT" 2>/dev/null || true
    [ -n "$CKIT" ] && kill "$CKIT" 2>/dev/null || true
    rm -rf "$W" "$SHM"
}
trap cleanup EXIT
nbdkit -f -U "$W/hdd.sock" --exit-with-parent --filter=noparallel --filter=delay memory 2G \
    serialize=all-requests delay-read="${DELAY_MS}ms" delay-write="${DELAY_MS}ms" &
KIT=$!
while [ ! -S "$W/hdd.sock" ]; do sleep 0.05; done
if [ -n "$CACHE_DELAY_MS" ]; then
    nbdkit -f -U "$W/cache.sock" --exit-with-parent --threads "$CACHE_THREADS" --filter=delay \
        memory 256M delay-read="${CACHE_DELAY_MS}ms" delay-write="${CACHE_DELAY_MS}ms" &
    CKIT=$!
    while [ ! -S "$W/cache.sock" ]; do sleep 0.05; done
    CACHE="nbd+unix:///?socket=$W/cache.sock"
else
    truncate -s 256M "$SHM/cache.img"
    CACHE="$SHM/cache.img"
fi
state=$W/state
tc() { "$BIN" --state-dir "$state" "$@"; }
tc create --name dl --mode writeback --block-size 4K --writeback-idle 0 --writeback-high 100 \
    --writeback-low 99 --writeback-age 32767 --origin "nbd+unix:///?socket=$W/hdd.sock" \
    --cache "$CACHE" >/dev/null
"$BIN" --state-dir "$state" serve --name dl --socket "$W/dl.nbd" 2>>"$W/serve.log" &
SERVE=$!
while [ ! -S "$W/dl.nbd" ]; do
    kill -0 "$SERVE" 2>/dev/null || { cat "$W/serve.log" >&2; exit 1; }
    sleep 0.05
done
URI="nbd+unix:///?socket=$W/dl.nbd"
# Regions: hits [0, 64M) warmed clean; foreground writes [64M, 72M)
# (2,048 blocks, dirty after the first phase: the drains write them back
# too); the dirty blocks to drain [256M, 2G).
tc warm --name dl --offset 0 --length 64M >/dev/null

dirty() { # DIRTY random 4K dirty blocks in [256M, 2G)
    fio --name=dirty --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --offset=256M \
        --size=1792M --number_ios="$DIRTY" --norandommap --randseed=11 --iodepth=16 \
        --output=/dev/null 2>/dev/null
}

load() { # OUT: the fixed load for SECS seconds, fio JSON in OUT
    fio --output-format=json --output="$1" --ioengine=nbd --uri="$URI" --bs=4k --iodepth=4 \
        --time_based --runtime="$SECS" --rate_iops="$RATE" --percentile_list=50:99:99.9 \
        --name=hits --rw=randread --offset=0 --size=64M \
        --name=writes --rw=randwrite --offset=64M --size=8M >/dev/null
}

drain_start() { # CMD...: runs it in the background, timing it (W/drain_secs)
    ( t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
      python3 -c "print(f'{$t1 - $t0:.1f}')" >"$W/drain_secs" ) &
    DRAIN=$!
}

dirty_blocks() {
    tc status --name dl --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cache_blocks_dirty"])'
}

for r in $(seq "$ROUNDS"); do
    tc set-writeback --name dl --high 100 --low 99 >/dev/null
    load "$W/idle.$r.json"
    echo "round $r: idle: done ($(dirty_blocks) dirty blocks)"

    dirty
    echo "round $r: flush: $(dirty_blocks) dirty blocks to write back"
    drain_start tc flush --name dl
    load "$W/flush.$r.json"
    left=$(dirty_blocks)
    wait "$DRAIN"
    DRAIN=""
    echo "round $r: flush: $left dirty blocks left when the load ended; flush took $(cat "$W/drain_secs") s"
    echo "$(cat "$W/drain_secs")" >>"$W/flush.secs"

    dirty
    echo "round $r: watermark: $(dirty_blocks) dirty blocks to write back"
    t0=$(date +%s.%N)
    tc set-writeback --name dl --high 1 --low 0 >/dev/null
    load "$W/watermark.$r.json"
    left=$(dirty_blocks)
    deadline=$((SECONDS + 900))
    while [ "$(dirty_blocks)" -gt 0 ] && [ $SECONDS -lt $deadline ]; do sleep 0.5; done
    t1=$(date +%s.%N)
    wm_secs=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
    [ "$(dirty_blocks)" -eq 0 ] || wm_secs="unfinished"
    echo "round $r: watermark: $left dirty blocks left when the load ended; drained in $wm_secs s"
    echo "$wm_secs" >>"$W/watermark.secs"
done

python3 - "$W" "$RATE" "$DIRTY" "$DELAY_MS" "$ROUNDS" "$CACHE_DELAY_MS" "$CACHE_THREADS" \
    "${JSON_OUT:-}" "$SECS" <<'PY'
import json, statistics, sys
w, rate, dirty, delay, rounds, cache_delay, cache_threads, json_out, secs_each = sys.argv[1:]
KEYS = ("50.000000", "99.000000", "99.900000")
def lat(phase, r):
    jobs = {j["jobname"]: j for j in json.load(open(f"{w}/{phase}.{r}.json"))["jobs"]}
    out = {}
    for name, side in (("hits", "read"), ("writes", "write")):
        p = jobs[name][side]["clat_ns"]["percentile"]
        out[name] = [p[k] / 1000 for k in KEYS]
    return out
def median(phase):
    runs = [lat(phase, r) for r in range(1, int(rounds) + 1)]
    return {n: [statistics.median(x[n][i] for x in runs) for i in range(3)] for n in ("hits", "writes")}
def drain_secs(phase):
    """The median drain time, and whether every round's drain finished."""
    vals = open(f"{w}/{phase}.secs").read().split()
    done = [float(v) for v in vals if v != "unfinished"]
    return (statistics.median(done) if done else None), len(done) == len(vals)
def secs(phase):
    s, all_done = drain_secs(phase)
    if s is None:
        return "unfinished"
    return f"{s:.1f} s" + ("" if all_done else " (some unfinished)")
idle = median("idle")
if json_out:
    phases = {p: median(p) for p in ("idle", "flush", "watermark")}
    json.dump({
        "rate_iops": int(rate), "dirty_blocks": int(dirty), "origin_delay_ms": int(delay),
        "cache_delay_ms": int(cache_delay) if cache_delay else None,
        "cache_threads": int(cache_threads), "rounds": int(rounds), "secs": int(secs_each),
        "percentiles": ["p50", "p99", "p99.9"], "phases": phases,
        "drain": {p: dict(zip(("secs", "finished"), drain_secs(p))) for p in ("flush", "watermark")},
    }, open(json_out, "w"), indent=1)
print(f"\n{rate} read hits/s + {rate} writes/s, 4K QD4 each; {dirty} random dirty 4K blocks; "
      f"origin {delay} ms a request, one at a time; cache "
      + (f"{cache_delay} ms a request, {cache_threads} at once" if cache_delay else "a file in /dev/shm")
      + f"; medians of {rounds} rounds")
print("| phase | hit p50 | hit p99 | hit p99.9 | write p50 | write p99 | write p99.9 | hit p99 / idle | write p99 / idle | drain |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for phase in ("idle", "flush", "watermark"):
    m = median(phase)
    h, wr = m["hits"], m["writes"]
    d = "-" if phase == "idle" else secs(phase)
    print(f"| {phase} | {h[0]:.0f} µs | {h[1]:.0f} µs | {h[2]:.0f} µs | {wr[0]:.0f} µs | {wr[1]:.0f} µs "
          f"| {wr[2]:.0f} µs | {h[1] / idle['hits'][1]:.2f}x | {wr[1] / idle['writes'][1]:.2f}x | {d} |")
PY
