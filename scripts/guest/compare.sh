# The kernel caches side by side with tiercache, in one guest run
# (`scripts/guest-test.sh --compare`; sourced in the guest, see
# docs/guest.md and docs/benchmarks.md).
#
# Every system caches its own 512 MiB origin disk slowed by dm-delay (5 ms
# per read and write, in parallel: dm-delay delays each bio, it does not
# serialize them) on its own 128 MiB cache disk, and every workload starts
# from a freshly created cache:
#   origin   the dm-delay device alone (no cache)
#   wc       dm-writecache (SSD mode)
#   bc       bcache, writeback, sequential_cutoff 0
#   dc       dm-cache, smq policy, writeback, 32 KiB blocks (its minimum)
#   tc       tiercache writeback, 4 KiB blocks, over the kernel NBD client
#   tcu      tiercache writeback as tc, served over ublk (`serve --ublk`)
#   nbd      no cache and no origin: nbdkit's file plugin serving a disk
#            like the cache disks over the same kernel NBD client, the
#            ceiling for any userspace device behind NBD in this guest
#   unull    no cache and no disk: libublk's own `null` example target
#            (2 queues of depth 64, as `serve --ublk`), which completes
#            every request at once on its queue thread: the ceiling for
#            any userspace device behind ublk in this guest
#   uloop    libublk's own `loop` example target over the raw cache disk
#            of tiercache (O_DIRECT, its queue thread's io_uring): the
#            ceiling for a cache hit served over ublk
# (unull and uloop are built on the host by guest-test.sh --compare from
# the libublk crate tiercache uses: $TC_UBLK_EXAMPLES.)
# With TC_COMPARE_PERF=1 the measured run of each ublk system (tcu, unull,
# uloop) is profiled: perf record -a (cpu-clock; TCG has no PMU), flat
# profiles by thread and by symbol in $CMP/SYS-WORKLOAD.perf.txt.
# Workloads (fio, libaio, O_DIRECT, one job, over the first SPAN_MIB of the
# volume, the same number of I/Os on every system, so that what reaches the
# origin is counted for the same client work):
#   randwrite  4 KiB random writes, QD32, 16384 I/Os
#   readhit    4 KiB random reads, QD32, 16384 I/Os, after the span was
#              written once sequentially and read twice at random (warm-up)
#   subwrite   random writes of 512 B..3.5 KiB, 512-aligned offsets and
#              lengths (fio bsrange=512-3584, blockalign=512; bs_unaligned
#              would give lengths that are not 512 multiples, which O_DIRECT
#              refuses), QD16, 8192 I/Os
# Counted per system and workload: fio's IOPS; requests that reached the
# origin (completed reads and writes in /sys/block/<dm-delay>/stat) during
# the measured run, and again once all dirty data is written back (each
# system's own way: dm-writecache "cleaner", bcache detach, dm-cache's
# cleaner policy, `tiercache flush`); hits as the system counts them.

SPAN_MIB=${TC_COMPARE_SPAN_MIB:-64}
# I/Os per measured run: randwrite, readhit, subwrite.
IOS=(${TC_COMPARE_IOS:-16384 16384 8192})
DELAY_MS=5
CMP=/run/results/compare
ROWS=$CMP/rows.tsv
# The round of TC_COMPARE_ROUNDS being measured (compare_all).
ROUND=1

sectors() { blockdev --getsz "$1"; }
# No udev in the guest: no waiting for it, and the /dev/mapper nodes are
# made (and removed) by mknodes.
dmsetup() { command dmsetup --noudevsync "$@" && command dmsetup mknodes; }

# The slowed origin of system SYS: SLOW=/dev/mapper/slow-SYS.
make_slow() { # SYS
    local o
    o=$(disk "origin-$1")
    dmsetup create "slow-$1" --table "0 $(sectors "$o") delay $o 0 $DELAY_MS"
    SLOW=/dev/mapper/slow-$1
}

zero_head() { dd if=/dev/zero of="$1" bs=1M count=4 oflag=direct status=none; }

# --- per system: setup (sets DEV, the device fio runs on, and SLOW),
#     stats, writeback, teardown.

setup_origin() { make_slow tc; DEV=$SLOW; }
stats_origin() { echo "-"; }
writeback_origin() { :; }
teardown_origin() { dmsetup remove slow-tc; }

setup_wc() { # BLOCK_BYTES
    local cache
    make_slow wc
    cache=$(disk cache-wc)
    zero_head "$cache"
    dmsetup create wc --table "0 $(sectors "$SLOW") writecache s $SLOW $cache $1 0"
    DEV=/dev/mapper/wc
}
# dmsetup status: ... writecache ERR BLOCKS FREE WRITEBACK READS READ_HITS
# WRITES WRITE_HITS_UNCOMMITTED WRITE_HITS_COMMITTED WRITES_AROUND ...
stats_wc() {
    dmsetup status wc | awk '{ printf "reads %d hits %d; writes %d hits %d, around %d", $8, $9, $10, $11 + $12, $13 }'
}
writeback_wc() {
    dmsetup message wc 0 cleaner
    local i
    for i in $(seq 3000); do
        # All blocks free again: everything written back.
        dmsetup status wc | awk '{ exit !($6 == $5 && $7 == 0) }' && return 0
        sleep 0.1
    done
    fail "dm-writecache did not write back within 300 s: $(dmsetup status wc)"
}
teardown_wc() { dmsetup remove wc; dmsetup remove slow-wc; }

BC=/sys/block/bcache0/bcache
setup_bc() {
    local cache i
    make_slow bc
    cache=$(disk cache-bc)
    zero_head "$cache"
    # Old data on the origin can look like another superblock to make-bcache.
    zero_head "$SLOW"
    # 128 MiB holds too few of the default 512 KiB buckets.
    make-bcache --wipe-bcache --writeback --bucket 64k -B "$SLOW" -C "$cache" >/dev/null
    echo "$SLOW" >/sys/fs/bcache/register 2>/dev/null || true
    echo "$cache" >/sys/fs/bcache/register 2>/dev/null || true
    for i in $(seq 100); do [ -e $BC/cache ] && break; sleep 0.1; done
    [ -e $BC/cache ] || fail "bcache0 did not attach to its cache"
    echo writeback >$BC/cache_mode
    echo 0 >$BC/sequential_cutoff
    DEV=/dev/bcache0
}
stats_bc() {
    local s=$BC/stats_total
    # bcache adds its counters to stats_total every 5 s.
    sleep 5.5
    echo "hits $(cat $s/cache_hits) misses $(cat $s/cache_misses) bypass $(cat $s/cache_bypass_hits)/$(cat $s/cache_bypass_misses) (reads; bcache counts no write hits)"
}
writeback_bc() {
    # Detaching writes back every dirty key without the writeback rate
    # limit and waits for it.
    echo 1 >$BC/detach
    local i
    for i in $(seq 3000); do
        grep -q 'no cache' $BC/state && return 0
        sleep 0.1
    done
    fail "bcache did not write back within 300 s: $(cat $BC/state) dirty $(cat $BC/dirty_data)"
}
teardown_bc() {
    local i set
    for set in /sys/fs/bcache/*-*; do [ -e "$set/stop" ] && echo 1 >"$set/stop"; done
    echo 1 >$BC/stop 2>/dev/null || true
    for i in $(seq 100); do [ -e /sys/block/bcache0 ] || break; sleep 0.1; done
    for i in $(seq 100); do dmsetup remove slow-bc 2>/dev/null && return 0; sleep 0.1; done
    fail "slow-bc still busy after bcache stop"
}

DC_BLOCK_SECTORS=64
dc_table() { # POLICY
    echo "0 $(sectors /dev/mapper/slow-dc) cache $(disk meta-dc) $(disk cache-dc) /dev/mapper/slow-dc $DC_BLOCK_SECTORS 1 writeback $1 0"
}
setup_dc() {
    make_slow dc
    zero_head "$(disk meta-dc)"
    dmsetup create dc --table "$(dc_table smq)"
    DEV=/dev/mapper/dc
}
# dmsetup status: ... cache MDBLK USED/TOTAL CBLK USED/TOTAL READ_HITS
# READ_MISSES WRITE_HITS WRITE_MISSES DEMOTIONS PROMOTIONS DIRTY ...
stats_dc() {
    dmsetup status dc | awk '{ printf "reads hits %d misses %d; writes hits %d misses %d; promotions %d", $8, $9, $10, $11, $13 }'
}
writeback_dc() {
    dmsetup suspend dc
    dmsetup reload dc --table "$(dc_table cleaner)"
    dmsetup resume dc
    local i
    for i in $(seq 3000); do
        dmsetup status dc | awk '{ exit !($14 == 0) }' && return 0
        sleep 0.1
    done
    fail "dm-cache did not write back within 300 s: $(dmsetup status dc)"
}
teardown_dc() { dmsetup remove dc; dmsetup remove slow-dc; }

setup_tc() {
    make_slow tc
    tc create --origin "$SLOW" --cache "$(disk cache-tc)" --mode writeback --block-size 4K --force --wipe --lose-dirty-data >/dev/null
    serve_start tc0 ${TC_COMPARE_SERVE_ARGS:-}
    nbd_attach /dev/nbd0 tc0 -b 512 -C "${TC_COMPARE_NBD_CONNECTIONS:-1}"
    DEV=/dev/nbd0
}
setup_tcu() {
    make_slow tc
    tc create --origin "$SLOW" --cache "$(disk cache-tc)" --mode writeback --block-size 4K --force --wipe --lose-dirty-data >/dev/null
    serve_start tc0 --ublk ${TC_COMPARE_SERVE_ARGS:-}
    ublk_wait
    DEV=/dev/ublkb0
}
stats_tcu() { stats_tc; }
writeback_tcu() { writeback_tc; }
teardown_tcu() { serve_stop; dmsetup remove slow-tc; }
stats_tc() {
    tc status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
print("reads hits %d misses %d; writes hits %d misses %d" % (s["read_hits"], s["read_misses"], s["write_hits"], s["write_misses"]))'
}
# Every counter of tiercache's that is not zero, on one line.
counters_tc() {
    tc status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)["stats"]
print(", ".join("%s %d" % (k, v) for k, v in s.items() if isinstance(v, int) and v))'
}
# Where the seed case's daemon serves its metrics (`serve --metrics`).
TC_METRICS=127.0.0.1:9617
# Mean latency of each kind of request and device request tiercache
# counted (its Prometheus histograms, from `serve --metrics`), on one line.
latencies_tc() {
    python3 -c '
import re, sys, urllib.request
text = urllib.request.urlopen("http://'"$TC_METRICS"'/metrics", timeout=10).read().decode()
sums = {}
for line in text.splitlines():
    m = re.match(r"tiercache_(request|device)_duration_seconds_(sum|count)\{([^}]*)\} (\S+)", line)
    if m:
        sums.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = float(m.group(4))
out = ["%s %s: %d, mean %.0f us" % (k[0], k[1], v["count"], v["sum"] / v["count"] * 1e6)
       for k, v in sorted(sums.items()) if v.get("count")]
print("; ".join(out))'
}
writeback_tc() { tc flush >/dev/null; }
teardown_tc() { nbd_detach /dev/nbd0; serve_stop; dmsetup remove slow-tc; }

setup_nbd() {
    local sock=$WORK/nbdkit.sock
    rm -f "$sock"
    nbdkit -f -U "$sock" file file="$(disk fast-nbd)" cache=none >>$WORK/nbdkit.log 2>&1 &
    NBDKIT_PID=$!
    echo $NBDKIT_PID >>$PIDS
    local i
    for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    nbd-client -unix "$sock" /dev/nbd0 -b 512 >/dev/null || fail "nbd-client to nbdkit"
    DEV=/dev/nbd0
    SLOW=$(disk fast-nbd)
}
stats_nbd() { echo "-"; }
writeback_nbd() { :; }
teardown_nbd() { nbd_detach /dev/nbd0; kill "$NBDKIT_PID"; wait "$NBDKIT_PID" 2>/dev/null || true; }

# The ublk ceilings: libublk's example targets, as /dev/ublkb9.
UBLK_CEIL_ID=9
ublk_example_start() { # EXAMPLE [args]
    local ex=${TC_UBLK_EXAMPLES:-}/$1 i
    shift
    [ -x "$ex" ] || fail "no libublk example at $ex (guest-test.sh --compare builds it)"
    "$ex" add -n $UBLK_CEIL_ID -q 2 -d 64 --foreground "$@" >>$WORK/ublk-example.log 2>&1 &
    UEX_PID=$!
    echo $UEX_PID >>$PIDS
    for i in $(seq 200); do
        [ "$(blockdev --getsize64 /dev/ublkb$UBLK_CEIL_ID 2>/dev/null || echo 0)" -gt 0 ] && break
        kill -0 "$UEX_PID" 2>/dev/null || { cat $WORK/ublk-example.log; fail "libublk $ex exited"; }
        sleep 0.1
    done
    DEV=/dev/ublkb$UBLK_CEIL_ID
    UEX=$ex
}
ublk_example_stop() {
    "$UEX" del -n $UBLK_CEIL_ID >>$WORK/ublk-example.log 2>&1 || true
    local i
    for i in $(seq 100); do kill -0 "$UEX_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$UEX_PID" 2>/dev/null || true
    wait "$UEX_PID" 2>/dev/null || true
}
# The null target moves no data: the disk it stands beside sees nothing.
setup_unull() { ublk_example_start null; SLOW=$(disk cache-tc); }
stats_unull() { echo "-"; }
writeback_unull() { :; }
teardown_unull() { ublk_example_stop; }
setup_uloop() { SLOW=$(disk cache-tc); ublk_example_start loop -f "$SLOW"; }
stats_uloop() { echo "-"; }
writeback_uloop() { :; }
teardown_uloop() { ublk_example_stop; }

# perf record over the whole guest during a measured run (TC_COMPARE_PERF=1,
# ublk systems only). perf_start SYS NAME; perf_stop FIO_JSON writes NAME.perf.txt.
PERF_PID=""
perf_start() { # SYS NAME
    PERF_PID=""
    [ "${TC_COMPARE_PERF:-0}" = 1 ] || return 0
    case "$1" in
        tcu) PERF_COMMS=tiercache-ublk0,tokio-rt-worker ;;
        unull) PERF_COMMS=null ;;
        uloop) PERF_COMMS=loop ;;
        *) return 0 ;;
    esac
    echo 0 >/proc/sys/kernel/kptr_restrict 2>/dev/null || true
    PERF_OUT=/tmp/$2.perf
    PERF_TXT=$CMP/$2.perf.txt
    # TC_COMPARE_PERF_CG=1: call graphs from the stack (DWARF; the release
    # build has debug info), at a tenth of the rate.
    local cg=(-F 2000)
    [ "${TC_COMPARE_PERF_CG:-0}" != 1 ] || cg=(-F 200 --call-graph dwarf,8192)
    perf record -a -e cpu-clock "${cg[@]}" -o "$PERF_OUT" >>$WORK/perf.log 2>&1 &
    PERF_PID=$!
    sleep 1
}
perf_stop() { # FIO_JSON | WHAT
    [ -n "$PERF_PID" ] || return 0
    kill -INT "$PERF_PID"
    wait "$PERF_PID" 2>/dev/null || true
    local what=$1
    [ -f "$what" ] && what="$(fio_ios "$what") I/Os"
    {
        echo "# $what; samples at 2000 Hz per CPU over the whole guest (both vCPUs), 1 s of idle before fio"
        echo "## by thread"
        perf report -i "$PERF_OUT" --stdio --no-children --sort comm --percent-limit 0.5 2>/dev/null | grep -v '^$'
        echo "## by thread and symbol"
        perf report -i "$PERF_OUT" --stdio --no-children --sort comm,dso,sym --percent-limit 0.4 2>/dev/null | grep -v '^$'
        echo "## the system's own threads ($PERF_COMMS), by symbol, as shares of their samples"
        perf report -i "$PERF_OUT" --stdio --no-children --comms "$PERF_COMMS" --percentage relative \
            --sort dso,sym --percent-limit 0.5 2>/dev/null | grep -v '^$'
        if [ "${TC_COMPARE_PERF_CG:-0}" = 1 ]; then
            echo "## the system's own threads, callers of the top symbols"
            perf report -i "$PERF_OUT" --stdio --no-children --comms "$PERF_COMMS" --percentage relative \
                --sort sym -G --percent-limit 5 2>/dev/null | grep -v '^$' | head -400
        fi
    } >"$PERF_TXT"
    rm -f "$PERF_OUT"
}

# --- workloads

fio_iops() { # JSON
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(round(sum(x["read"]["iops"] + x["write"]["iops"] for x in j["jobs"])))' "$1"
}

fio_ios() { # JSON
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
print(sum(x["read"]["total_ios"] + x["write"]["total_ios"] for x in j["jobs"]))' "$1"
}

fio_run() { # DEV NAME [args] -> JSON in $CMP/NAME.json
    local dev=$1 name=$2
    shift 2
    fio --name="$name" --filename="$dev" --ioengine=libaio --direct=1 --size=${SPAN_MIB}M \
        --output-format=json --output="$CMP/$name.json" "$@" >/dev/null \
        || fail "fio $name on $dev failed: $(cat "$CMP/$name.json")"
}

warm() { # DEV SYS
    fio_run "$1" "$2-warm-write" --rw=write --bs=64k --iodepth=8
    fio_run "$1" "$2-warm-read1" --rw=randread --bs=4k --iodepth=32
    fio_run "$1" "$2-warm-read2" --rw=randread --bs=4k --iodepth=32
}

measure() { # SYS WORKLOAD
    local sys=$1 wl=$2 dev slow before after flushed iops hits
    if [ "$sys" = wc ] && [ "$wl" = subwrite ]; then
        # dm-writecache's block size is its logical block size: 512 B
        # I/O needs 512 B blocks.
        setup_wc 512
    elif [ "$sys" = wc ]; then
        setup_wc 4096
    else
        setup_$sys
    fi
    dev=$DEV slow=$SLOW
    [ "$wl" = readhit ] && warm "$dev" "$sys"
    local hits0
    hits0=$(stats_$sys)
    perf_start "$sys" "$sys-$wl"
    before=$(dev_stat "$slow")
    case "$wl" in
        randwrite) fio_run "$dev" "$sys-$wl" --rw=randwrite --bs=4k --iodepth=32 --number_ios=${IOS[0]} --norandommap ;;
        readhit) fio_run "$dev" "$sys-$wl" --rw=randread --bs=4k --iodepth=32 --number_ios=${IOS[1]} --norandommap ;;
        subwrite) fio_run "$dev" "$sys-$wl" --rw=randwrite --bsrange=512-3584 --blockalign=512 --iodepth=16 --number_ios=${IOS[2]} --norandommap ;;
    esac
    after=$(dev_stat "$slow")
    perf_stop "$CMP/$sys-$wl.json"
    hits=$(stats_$sys)
    writeback_$sys
    flushed=$(dev_stat "$slow")
    iops=$(fio_iops "$CMP/$sys-$wl.json")
    set -- $before $after $flushed
    # system workload iops reads writes reads+wb writes+wb ios hits-before hits-after round
    local ios
    ios=$(fio_ios "$CMP/$sys-$wl.json")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sys" "$wl" "$iops" $(($3 - $1)) $(($4 - $2)) \
        $(($5 - $1)) $(($6 - $2)) "$ios" "$hits0" "$hits" "$ROUND" >>"$ROWS"
    log "$sys $wl: $iops IOPS, origin reads $(($3 - $1)) writes $(($4 - $2)) during the run, $(($5 - $1)) / $(($6 - $2)) with writeback; $hits"
    teardown_$sys
}

# The lvm-cache seed case (issue 34): ext4 on the slowed origin holding a
# set of SEED_FILES files of SEED_FILE_MIB each, every file read (cat) once
# a pass with the page cache dropped before it: once from the origin alone,
# once through libublk's `loop` example over the origin (the ublk path with
# no cache: a ceiling), once from the origin alone while fio writes as much
# to the cache disk (what promoting the set costs the emulated machine),
# then five passes through tiercache over ublk on a cache that holds the
# set (its own disk, cache-seed), the first of which promotes it. The
# target: the first pass at most 1.1x the origin alone's.
SEED_FILES=${TC_COMPARE_SEED_FILES:-200}
SEED_FILE_MIB=${TC_COMPARE_SEED_FILE_MIB:-1}
# The cache mode of the seed case: writeback promotes what it reads;
# passthrough (which does not) shows the miss path's own cost.
SEED_MODE=${TC_COMPARE_SEED_MODE:-writeback}
seed_pass() { # DIR -> seconds on stdout
    drop_caches
    local t0 t1
    t0=$(date +%s.%N)
    find "$1" -type f -exec cat {} + >/dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }'
}
# Completed reads and sectors read of block device DEV: "reads sectors".
dev_reads() { # DEV
    awk '{ print $1, $3 }' "$(sysfs_of "$1")/stat"
}
# The reads DEV completed since `dev_reads DEV` gave BEFORE, and their
# mean size.
reads_since() { # DEV BEFORE
    local now
    now=$(dev_reads "$1")
    echo "$now $2" | awk '{ n = $1 - $3; printf "%d reads of %.0f KiB", n, n ? ($2 - $4) / 2 / n : 0 }'
}
queue_of() { # DEV -> its readahead and largest request
    local q
    q=$(sysfs_of "$1")/queue
    echo "$(cat "$q/read_ahead_kb") KiB readahead, $(cat "$q/max_sectors_kb") KiB largest"
}
# Interleaved rounds (TC_COMPARE_SEED_ROUNDS=N): N times the origin alone,
# then the first pass of a fresh cache through each entry of
# TC_COMPARE_SEED_BINS (a binary's path as the guest sees it, under the
# repository, and optionally `:MODE`; default the run's binary in
# TC_COMPARE_SEED_MODE), each ratio against the origin pass just before
# it. One boot's baseline moves by 30% over its run; pairs taken side by
# side, and their median, do not follow it.
SEED_ROUNDS=${TC_COMPARE_SEED_ROUNDS:-0}
# A fresh cache on cache-seed over the slowed origin, made and served over
# ublk by BIN in MODE (extra `serve` arguments after), mounted on MNT.
seed_serve() { # BIN MODE [SERVE_ARG...]
    local bin=$1 mode=$2
    shift 2
    "$bin" create --origin "$SLOW" --cache "$(disk cache-seed)" --mode "$mode" --block-size 4K \
        --force --wipe --lose-dirty-data >/dev/null
    TC_BIN=$bin serve_start tc0 --ublk "$@" ${TC_COMPARE_SERVE_ARGS:-}
    ublk_wait
    mount /dev/ublkb0 "$MNT"
}
seed_round_pass() { # BIN MODE -> seconds in PASS_S
    seed_serve "$1" "$2"
    PASS_S=$(seed_pass "$MNT/set")
    umount "$MNT"
    serve_stop
}
seed_rounds() {
    local r e t o row ratio rs
    local -a entries=() names=()
    local -A ratios=()
    # Each entry as BIN:MODE.
    for e in ${TC_COMPARE_SEED_BINS:-$TC_BIN}; do
        [[ $e == *:* ]] || e+=":$SEED_MODE"
        entries+=("$e")
        names+=("$(basename "${e%%:*}") ${e#*:}")
    done
    {
        echo
        echo "The seed's first pass in $SEED_ROUNDS interleaved rounds (s; each pass 1 on a fresh cache right after the origin alone):"
        echo
        echo "| round | origin alone | $(printf '%s | ' "${names[@]}")$(printf '%s / origin | ' "${names[@]}")"
        echo "|--:|--:|$(printf -- '--:|%.0s' "${names[@]}" "${names[@]}")"
    } >"$CMP/seed-rounds.md"
    for r in $(seq "$SEED_ROUNDS"); do
        mount -o ro "$SLOW" "$MNT"
        o=$(seed_pass "$MNT/set")
        umount "$MNT"
        row="| $r | $o | "
        rs=""
        for e in "${entries[@]}"; do
            seed_round_pass "${e%%:*}" "${e#*:}"
            t=$PASS_S
            ratio=$(awk -v a="$t" -v b="$o" 'BEGIN { printf "%.3f", a / b }')
            row+="$t | "
            rs+="$ratio "
            ratios[$e]+="$ratio "
        done
        echo "$row$(for x in $rs; do printf '%.2fx | ' "$x"; done)" >>"$CMP/seed-rounds.md"
        log "seed round $r: origin $o s, pass 1 / origin: $rs"
    done
    echo >>"$CMP/seed-rounds.md"
    for e in "${entries[@]}"; do
        echo "- $(basename "${e%%:*}") ${e#*:}: median pass 1 / origin alone $(echo "${ratios[$e]}" | tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2fx (of %d: %.2f-%.2f)", m, NR, v[1], v[NR] }')" >>"$CMP/seed-rounds.md"
    done
}

compare_seed() {
    local i t origin passes=() before origin_reads ublk_before slow_before tc_reads
    make_slow tc
    mkfs.ext4 -q -F "$SLOW" || fail "mkfs.ext4 on $SLOW"
    mount "$SLOW" "$MNT"
    mkdir -p "$MNT/set"
    for i in $(seq "$SEED_FILES"); do
        head -c $((SEED_FILE_MIB << 20)) /dev/urandom >"$MNT/set/f$i"
    done
    umount "$MNT"
    mount -o ro "$SLOW" "$MNT"
    before=$(dev_reads "$SLOW")
    origin=$(seed_pass "$MNT/set")
    origin_reads="$(reads_since "$SLOW" "$before") ($(queue_of "$SLOW"))"
    umount "$MNT"
    # The ublk path's own cost: the origin through libublk's `loop`
    # example (no cache), the ceiling of a pass through any ublk server.
    ublk_example_start loop -f "$SLOW"
    mount -o ro "$DEV" "$MNT"
    ceiling=$(seed_pass "$MNT/set")
    umount "$MNT"
    ublk_example_stop
    # What a promotion's cache writes cost the origin's reads here: the
    # origin alone again while fio writes the set's size to the cache disk
    # at the pace of the origin's pass (O_DIRECT, 256 KiB, one at a time).
    local set_kib=$((SEED_FILES * SEED_FILE_MIB * 1024))
    local pace_kib
    pace_kib=$(awk -v k="$set_kib" -v s="$origin" 'BEGIN { printf "%d", k / s }')
    mount -o ro "$SLOW" "$MNT"
    fio --name=promotions --filename="$(disk cache-seed)" --rw=write --bs=256k --direct=1 \
        --ioengine=psync --size="${set_kib}k" --rate="${pace_kib}k" >"$WORK/seed-fio.log" 2>&1 &
    local writer=$!
    with_writes=$(seed_pass "$MNT/set")
    wait "$writer" || fail "fio writing the cache disk beside the origin's pass"
    umount "$MNT"
    seed_serve "$TC_BIN" "$SEED_MODE" --metrics "$TC_METRICS"
    for i in 1 2 3 4 5; do
        [ "$i" != 1 ] && [ "$i" != 3 ] || perf_start tcu "seed-pass$i"
        ublk_before=$(dev_reads /dev/ublkb0)
        slow_before=$(dev_reads "$SLOW")
        passes+=("$(seed_pass "$MNT/set")")
        [ "$i" != 1 ] && [ "$i" != 3 ] || perf_stop "the seed's pass $i"
        [ "$i" != 1 ] || pass1_counters="$(counters_tc). Latencies: $(latencies_tc)"
        [ "$i" != 1 ] || tc_reads="/dev/ublkb0 $(reads_since /dev/ublkb0 "$ublk_before") ($(queue_of /dev/ublkb0)), its origin $(reads_since "$SLOW" "$slow_before")"
    done
    local hits
    hits=$(stats_tc)
    umount "$MNT"
    serve_stop
    [ "$SEED_ROUNDS" = 0 ] || seed_rounds
    dmsetup remove slow-tc
    {
        echo
        echo "The seed case: ext4, $SEED_FILES files of $SEED_FILE_MIB MiB on the origin (dm-delay, ${DELAY_MS} ms), each pass reads every file with the page cache dropped before it (s):"
        echo
        echo "| origin alone | the origin through libublk's loop | the origin alone, its set written to the cache disk meanwhile | tiercache ($SEED_MODE) over ublk, pass 1 | 2 | 3 | 4 | 5 | pass 1 / origin alone | pass 1 / loop | pass 1 / origin with the writes |"
        echo "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        echo "| $origin | $ceiling | $with_writes | $(printf '%s | ' "${passes[@]}")$(awk -v a="${passes[0]}" -v b="$origin" -v c="$ceiling" -v d="$with_writes" 'BEGIN { printf "%.2fx | %.2fx | %.2fx", a / b, a / c, a / d }') |"
        echo
        echo "Requests in the first pass: the origin alone $origin_reads; through tiercache $tc_reads."
        echo
        echo "tiercache's counters after the five passes: $hits"
        echo
        echo "Its counters after the first pass: $pass1_counters"
    } | tee "$CMP/seed.md"
    [ "$SEED_ROUNDS" = 0 ] || tee -a "$CMP/seed.md" <"$CMP/seed-rounds.md"
    log "seed: origin alone $origin s; through libublk's loop $ceiling s; with the cache disk written $with_writes s; through tiercache ${passes[*]} s"
}

# Writeback beside the foreground over ublk (issue 34; bench/drain-latency.sh
# is the same over NBD on the host): tiercache over ublk in front of an
# emulated HDD (nbdkit memory, noparallel serialize=all-requests, DELAY_MS a
# request, as tiercache's NBD origin), a cache that holds everything
# (cache-seed). A fixed load of DRAIN_RATE 4K read hits/s (a 64 MiB region
# warmed clean) plus DRAIN_RATE 4K writes/s (an 8 MiB region), QD4 each,
# fio libaio on /dev/ublkb0, for DRAIN_SECS: idle, then during `tiercache
# flush` of DRAIN_DIRTY random dirty blocks, then during watermark
# writeback of as many. p99 during a drain at most 1.5x idle's is the target.
DRAIN_SECS=${TC_COMPARE_DRAIN_SECS:-10}
DRAIN_RATE=${TC_COMPARE_DRAIN_RATE:-250}
DRAIN_DIRTY=${TC_COMPARE_DRAIN_DIRTY:-2000}
drain_load() { # NAME
    fio --output-format=json --output="$CMP/drain-$1.json" --filename=/dev/ublkb0 \
        --ioengine=libaio --direct=1 --bs=4k --iodepth=4 --time_based --runtime="$DRAIN_SECS" \
        --rate_iops="$DRAIN_RATE" --percentile_list=50:99 \
        --name=hits --rw=randread --offset=0 --size=64M \
        --name=writes --rw=randwrite --offset=64M --size=8M >/dev/null \
        || fail "fio drain load $1: $(cat "$CMP/drain-$1.json")"
}
drain_dirty() {
    fio --name=dirty --filename=/dev/ublkb0 --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
        --offset=128M --size=384M --number_ios="$DRAIN_DIRTY" --norandommap --randseed=11 \
        --iodepth=16 --output=/dev/null || fail "fio dirty"
}
dirty_blocks() {
    tc status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["cache_blocks_dirty"])'
}
compare_drain() {
    local sock=$WORK/hdd.sock t0 flush_s wm_s i
    rm -f "$sock"
    nbdkit -f -U "$sock" --filter=noparallel --filter=delay memory 1G serialize=all-requests \
        delay-read=${DELAY_MS}ms delay-write=${DELAY_MS}ms >>$WORK/nbdkit.log 2>&1 &
    echo $! >>$PIDS
    for i in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
    tc create --origin "nbd+unix:///?socket=$sock" --cache "$(disk cache-seed)" --mode writeback \
        --block-size 4K --writeback-idle 0 --writeback-high 100 --writeback-low 99 \
        --writeback-age 32767 --force --wipe --lose-dirty-data >/dev/null
    serve_start tc0 --ublk ${TC_COMPARE_SERVE_ARGS:-}
    ublk_wait
    tc warm --offset 0 --length 64M >/dev/null
    drain_load idle
    drain_dirty
    log "drain: $(dirty_blocks) dirty blocks; flush under the load"
    t0=$(date +%s.%N)
    ( tc flush >/dev/null; date +%s.%N >"$WORK/flush.end" ) &
    local flusher=$!
    drain_load flush
    wait "$flusher" || fail "tiercache flush failed"
    flush_s=$(awk -v a="$t0" -v b="$(cat "$WORK/flush.end")" 'BEGIN { printf "%.1f", b - a }')
    drain_dirty
    log "drain: $(dirty_blocks) dirty blocks; watermark writeback under the load"
    t0=$(date +%s.%N)
    tc set-writeback --high 1 --low 0 >/dev/null
    drain_load watermark
    for i in $(seq 1200); do [ "$(dirty_blocks)" -eq 0 ] && break; sleep 0.5; done
    [ "$(dirty_blocks)" -eq 0 ] || fail "watermark writeback did not finish within 600 s"
    wm_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    serve_stop
    python3 - "$CMP" "$DRAIN_RATE" "$DRAIN_DIRTY" "$DELAY_MS" "$flush_s" "$wm_s" <<'PY' | tee "$CMP/drain.md"
import json, sys
cmp, rate, dirty, delay, flush_s, wm_s = sys.argv[1:]
def lat(phase):
    jobs = {j["jobname"]: j for j in json.load(open(f"{cmp}/drain-{phase}.json"))["jobs"]}
    return {n: [jobs[n][side]["clat_ns"]["percentile"][k] / 1000 for k in ("50.000000", "99.000000")]
            for n, side in (("hits", "read"), ("writes", "write"))}
idle = lat("idle")
print(f"\nWriteback beside the foreground over ublk: {rate} 4K read hits/s + {rate} 4K writes/s (QD4 each), "
      f"{dirty} random dirty 4K blocks to drain, origin {delay} ms a request, one at a time:\n")
print("| phase | hit p50 | hit p99 | write p50 | write p99 | hit p99 / idle | write p99 / idle | drain took |")
print("|---|--:|--:|--:|--:|--:|--:|--:|")
for phase, took in (("idle", ""), ("flush", f"{flush_s} s"), ("watermark", f"{wm_s} s")):
    m = lat(phase)
    print(f"| {phase} | {m['hits'][0]:.0f} µs | {m['hits'][1]:.0f} µs | {m['writes'][0]:.0f} µs | "
          f"{m['writes'][1]:.0f} µs | {m['hits'][1] / idle['hits'][1]:.2f}x | "
          f"{m['writes'][1] / idle['writes'][1]:.2f}x | {took} |")
PY
}

compare_all() {
    # TC_COMPARE_THP=always|madvise|never: the guest's transparent huge
    # pages (Debian's 6.12 kernel: always).
    [ -z "${TC_COMPARE_THP:-}" ] || echo "$TC_COMPARE_THP" >/sys/kernel/mm/transparent_hugepage/enabled
    mkdir -p "$CMP"
    : >"$ROWS"
    local wl sys systems
    local workloads=${TC_COMPARE_WORKLOADS:-randwrite readhit subwrite}
    [ "$workloads" != none ] || workloads=""
    # TC_COMPARE_ROUNDS=N: every system and workload N times, the systems
    # in reverse order every other round; the table gives the median of
    # the rounds' ratios (one boot's numbers drift over a run).
    for ROUND in $(seq "${TC_COMPARE_ROUNDS:-1}"); do
        systems=${TC_COMPARE_SYSTEMS:-origin wc bc dc tc tcu nbd unull uloop}
        [ $((ROUND % 2)) = 1 ] || systems=$(echo "$systems" | tr ' ' '\n' | tac | tr '\n' ' ')
        for wl in $workloads; do
            for sys in $systems; do
                measure "$sys" "$wl"
            done
        done
    done
    python3 "$HERE/compare_table.py" "$ROWS" "${IOS[*]}" "$SPAN_MIB" | tee "$CMP/table.md"
    if [ "${TC_COMPARE_SEED:-1}" = 1 ]; then
        compare_seed
        cat "$CMP/seed.md" >>"$CMP/table.md"
    fi
    if [ "${TC_COMPARE_DRAIN:-1}" = 1 ]; then
        compare_drain
        cat "$CMP/drain.md" >>"$CMP/table.md"
    fi
}
