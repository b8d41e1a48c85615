# The guest tests of tiercache behind the kernel NBD client (sourced in
# the guest; see docs/guest.md). Each runs on the virtio disks "origin"
# (512 MiB) and "cache" (128 MiB) and leaves cleanup to run.sh.

# Sizes of the files an ext4 test writes (KiB): small, odd and large.
EXT4_FILE_KIB="4 7 100 1024 4096 513 2048 64 8192 3 333 1536"

new_cache() { # MODE
    tc create --origin "$(disk origin)" --cache "$(disk cache)" --mode "$1" --force --wipe --lose-dirty-data >/dev/null
    log "created a $1 cache: $(disk origin) (512 MiB) on $(disk cache) (128 MiB)"
}

# Writes files PREFIX-N (sizes EXT4_FILE_KIB, random data) under $MNT,
# each fsync'ed, and appends "sha256  path" to MANIFEST only after its
# fsync returned: the manifest lists exactly what the kernel was told is
# durable. Writers running at once each have their own scratch file.
write_files() { # PREFIX MANIFEST
    local n=0 kib tmp=$WORK/file.$BASHPID.tmp
    for kib in $EXT4_FILE_KIB; do
        n=$((n + 1))
        head -c $((kib * 1024)) /dev/urandom >"$tmp"
        dd if="$tmp" of="$MNT/$1-$n" bs=64k conv=fsync status=none || return 1
        echo "$(sha256sum <"$tmp" | cut -d' ' -f1)  $MNT/$1-$n" >>"$2"
    done
    rm -f "$tmp"
}

verify_files() { # MANIFEST WHAT
    drop_caches
    sha256sum -c --quiet "$1" || fail "$2: files differ from what was fsync'ed"
    log "$2: $(wc -l <"$1") files verified"
}

# ext4 on /dev/nbd0, mounted on $MNT, files "a" written ($WORK/manifest lists
# them); then a writer in the background fsync'ing six more rounds of
# files into manifest-b, which stops with an error at its first failure.
# WRITER is its PID.
ext4_with_writer() {
    mkfs.ext4 -q -E nodiscard /dev/nbd0
    mount -o noatime /dev/nbd0 "$MNT"
    write_files a $WORK/manifest
    : >$WORK/manifest-b
    ( for round in 1 2 3 4 5 6; do write_files "b$round" $WORK/manifest-b || exit 1; done ) &
    WRITER=$!
    echo $WRITER >>$PIDS
}

fsck_clean() { # WHAT
    e2fsck -f -n /dev/nbd0 >$WORK/fsck.log 2>&1 || { cat $WORK/fsck.log; fail "$1: e2fsck -f -n found problems"; }
    log "$1: e2fsck -f clean"
}

# ext4 on /dev/nbd0 over `tiercache serve`: mkfs, files with known
# checksums, umount, mount, fsck; then the daemon is killed with -9 while
# a writer is fsync'ing more files, restarted, and every file whose fsync
# returned is there and the filesystem is clean after journal replay.
#
# The kernel NBD client cannot carry a mounted filesystem over a dead
# connection, so the filesystem is unmounted and the device reconnected
# after the restart: what is tested is that nothing acknowledged was lost.
# nbd-client runs in ioctl mode (-nonetlink) for this: when the server
# dies the device is torn down at once, in-flight requests fail and ext4
# shuts down. In netlink mode (nbd-client 3.24 sets no dead-connection
# timeout and cannot reconfigure) the writer and jbd2 instead hang in D
# state for good after the 30 s request timeout.
test_ext4_kill() { # MODE
    local mode=$1
    new_cache "$mode"
    serve_start tc0
    nbd_attach /dev/nbd0 tc0 -b 4096 -nonetlink
    mkfs.ext4 -q -E nodiscard /dev/nbd0
    mount -o noatime /dev/nbd0 "$MNT"
    write_files a $WORK/manifest
    log "wrote $(wc -l <$WORK/manifest) files"
    umount "$MNT"
    fsck_clean "after umount"
    mount -o noatime /dev/nbd0 "$MNT"
    verify_files $WORK/manifest "after remount"

    # A writer fsync'ing files in a loop; the daemon dies under it.
    : >$WORK/manifest-b
    ( for round in 1 2 3 4 5 6 7 8 9; do write_files "b$round" $WORK/manifest-b || exit 0; done ) &
    local writer=$!
    echo $writer >>$PIDS
    sleep 3
    log "kill -9 tiercache serve (pid $SERVE_PID) with $(wc -l <$WORK/manifest-b) more files fsync'ed"
    kill -9 "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    wait "$writer" 2>/dev/null || true
    umount "$MNT" 2>/dev/null || umount -l "$MNT"
    nbd_detach /dev/nbd0
    tc check >$WORK/check.log 2>&1 || { cat $WORK/check.log; fail "tiercache check after kill -9"; }
    log "tiercache check after kill -9: $(tail -1 $WORK/check.log)"

    serve_start tc0
    log "the restarted daemon: $(grep -o 'applied [0-9]* records from the crash log' /run/serve-tc0.log || echo 'nothing to apply from the crash log')"
    log "restarted: $(tc status --json | grep -E '"cache_blocks_dirty"' | tr -d ' ,')"
    nbd_attach /dev/nbd0 tc0 -b 4096 -nonetlink
    mount -o noatime /dev/nbd0 "$MNT"
    cat $WORK/manifest-b >>$WORK/manifest
    verify_files $WORK/manifest "after kill -9 and restart (journal replayed)"
    umount "$MNT"
    fsck_clean "after kill -9 and restart"
    nbd_detach /dev/nbd0
    serve_stop
    tc check >/dev/null || fail "tiercache check after a clean stop"
}

# fio with crc32c verification on /dev/nbd0: 4 jobs at queue depth 32,
# each on its own FIO_JOB_MIB (24 MiB: 96 MiB in all, more than the
# cache's free slots once ext4-size metadata is counted, so blocks are
# evicted and, in writeback, written back while fio runs; --quick uses 8),
# 4K random writes then a read-back of every block; then the same data
# read back after a clean restart, and after `tiercache detach` straight
# from the origin.
FIO_JOB_MIB=${TC_FIO_JOB_MIB:-24}
FIO_VERIFY=(--rw=randwrite --bs=4k --ioengine=libaio --iodepth=32 --direct=1
            --numjobs=4 --size=${FIO_JOB_MIB}M --offset_increment=${FIO_JOB_MIB}M
            --verify=crc32c --verify_fatal=1 --verify_state_save=0 --group_reporting)

fio_verify() { # WHAT DEVICE [fio args]
    local what=$1 dev=$2
    shift 2
    fio --name=verify --filename="$dev" "${FIO_VERIFY[@]}" "$@" --output=$WORK/fio.out \
        || { cat $WORK/fio.out; fail "$what: fio exited with an error"; }
    grep -q 'err= 0' $WORK/fio.out || { cat $WORK/fio.out; fail "$what: fio reported errors"; }
    log "$what: $(grep -E '^ *(write|read):' $WORK/fio.out | sed 's/^ *//; s/,.*//' | tr '\n' ' ')"
}

test_fio_verify() { # MODE
    new_cache "$1"
    serve_start tc0
    nbd_attach /dev/nbd0 tc0
    fio_verify "write and verify" /dev/nbd0
    nbd_detach /dev/nbd0
    log "status: $(tc status --json | grep -E '"(read_hits|write_hits|blocks_written_back|cache_blocks_dirty)"' | tr -d ' ,\n')"
    serve_stop
    serve_start tc0
    nbd_attach /dev/nbd0 tc0
    fio_verify "verify after restart" /dev/nbd0 --verify_only
    nbd_detach /dev/nbd0
    tc detach >/dev/null || fail "tiercache detach"
    wait "$SERVE_PID" || fail "tiercache serve exited with $? after detach"
    fio_verify "verify on the origin after detach" "$(disk origin)" --verify_only
}

# ext4 over /dev/nbd0 connected by nbd_netlink.py (netlink, 60 s
# dead-connection timeout): tiercache serve is killed with -9 while a
# writer fsyncs files, restarted, and given the device back
# (NBD_CMD_RECONFIGURE). The kernel requeues the requests that were in
# flight and the writer must finish every round without an error; every
# file matches and e2fsck is clean. This asks more than NBD promises:
# writes acknowledged but not yet flushed must survive the daemon's death,
# as they would survive a disk's firmware restart but not a power loss.
test_ext4_restart() { # MODE
    local mode=$1 nl="python3 $HERE/nbd_netlink.py"
    dmesg -C  # earlier tests' (expected) nbd0 errors are not this one's
    new_cache "$mode"
    serve_start tc0
    $nl connect "$TIERCACHE_STATE_DIR/tc0.nbd" 0 60 || fail "netlink connect"
    ext4_with_writer
    sleep 3
    log "kill -9 tiercache serve (pid $SERVE_PID) with $(wc -l <$WORK/manifest-b) more files fsync'ed"
    kill -9 "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    serve_start tc0
    $nl reconfigure "$TIERCACHE_STATE_DIR/tc0.nbd" 0 || fail "netlink reconfigure"
    log "restarted and reconnected"
    wait "$WRITER" || fail "the writer saw an error across the restart"
    log "the writer finished: $(wc -l <$WORK/manifest-b) files fsync'ed in all"
    cat $WORK/manifest-b >>$WORK/manifest
    verify_files $WORK/manifest "across kill -9 and restart"
    umount "$MNT"
    fsck_clean "across kill -9 and restart"
    dmesg | grep -E 'nbd0.*(I/O error|error)|EXT4-fs error' && fail "the kernel logged errors on nbd0"
    $nl disconnect 0
    serve_stop
}

# A cache set of two members, each a device-mapper linear device over its
# virtio disk, so that a member can be failed under the daemon: its table
# is swapped for dm-error (every I/O fails with EIO). fio verify runs while
# member 1 fails, then replace-cache rebuilds onto a spare while fio
# verifies again; ext4 writes fsync'ed files while member 0 fails, and
# replace-cache rebuilds that one too. No error may reach fio or the
# filesystem, e2fsck must be clean, every fsync'ed file must read back,
# and at the end the two spares alone carry the volume across a restart.
dm_member() { # NAME DISK
    local sectors
    sectors=$(blockdev --getsz "$2")
    dmsetup create "$1" --table "0 $sectors linear $2 0" || fail "dmsetup create $1"
    dmsetup mknodes "$1" >/dev/null 2>&1 || true
}

dm_fail() { # NAME: every I/O on it fails from now on
    local sectors
    sectors=$(blockdev --getsz "/dev/mapper/$1")
    dmsetup suspend --noflush "$1" || fail "dmsetup suspend $1"
    dmsetup load "$1" --table "0 $sectors error" || fail "dmsetup load $1 error"
    dmsetup resume "$1" || fail "dmsetup resume $1"
    log "member /dev/mapper/$1 now fails every I/O (dm-error)"
}

set_status() { # the set's state and each member, one line
    tc status --json >$WORK/status.json || fail "tiercache status"
    python3 - $WORK/status.json <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
ms = " ".join("%d:%s:%s" % (m["index"], m["device"].split("/")[-1], m["state"])
              for m in s["cache_members"])
print(s["cache_set_state"], "at-risk", s["dirty_at_risk"], "dirty", s["cache_blocks_dirty"], ms)
PY
}

test_cache_set_member_fails() {
    # On a failure, the daemon's own account first.
    fail() { echo "--- serve log (last 60 lines)"; tail -60 /run/serve-tc0.log; echo "FAILED: $*"; exit 1; }
    dm_member tca "$(disk set-a)"
    dm_member tcb "$(disk set-b)"
    tc create --origin "$(disk origin)" --cache /dev/mapper/tca --cache /dev/mapper/tcb \
        --mode writeback --force --wipe --lose-dirty-data >/dev/null || fail "create the cache set"
    log "created a cache set: $(set_status)"
    serve_start tc0
    nbd_attach /dev/nbd0 tc0

    # fio verify while member 1 fails.
    fio --name=verify --filename=/dev/nbd0 "${FIO_VERIFY[@]}" --output=$WORK/fio.out &
    local fio_pid=$!
    echo $fio_pid >>$PIDS
    sleep 4
    dm_fail tcb
    wait $fio_pid || { cat $WORK/fio.out; fail "fio failed across the member's failure"; }
    grep -q 'err= 0' $WORK/fio.out || { cat $WORK/fio.out; fail "fio reported errors"; }
    log "fio verify passed across member 1's failure: $(set_status)"
    set_status | grep -q '^degraded' || fail "the set does not say it is degraded"
    set_status | grep -q '1:tcb:failed' || fail "the set does not name member 1 failed"

    # Rebuild onto a spare while fio verifies the same data again.
    fio --name=verify --filename=/dev/nbd0 "${FIO_VERIFY[@]}" --verify_only --output=$WORK/fio2.out &
    fio_pid=$!
    echo $fio_pid >>$PIDS
    tc replace-cache /dev/mapper/tcb "$(disk set-c)" || fail "replace-cache member 1"
    wait $fio_pid || { cat $WORK/fio2.out; fail "fio verify failed during the rebuild"; }
    log "member 1 rebuilt onto $(disk set-c) during fio verify: $(set_status)"
    set_status | grep -q '^whole' || fail "the set is not whole after replace-cache"

    # ext4 writes while member 0 fails.
    ext4_with_writer
    sleep 3
    dm_fail tca
    wait $WRITER || fail "the ext4 writer saw an error across member 0's failure"
    cat $WORK/manifest-b >>$WORK/manifest
    verify_files $WORK/manifest "after member 0 failed"
    log "ext4 writer finished across member 0's failure: $(set_status)"
    set_status | grep -q '0:tca:failed' || fail "the set does not name member 0 failed"
    tc replace-cache /dev/mapper/tca "$(disk set-d)" || fail "replace-cache member 0"
    log "member 0 rebuilt onto $(disk set-d): $(set_status)"
    set_status | grep -q '^whole' || fail "the set is not whole after the second replace-cache"
    umount "$MNT"
    fsck_clean "after both members were replaced"
    dmesg | grep -E 'nbd0.*(I/O error|error)|EXT4-fs error' && fail "the kernel logged errors on nbd0"
    nbd_detach /dev/nbd0
    serve_stop
    # The original members are gone for good: the spares alone carry it.
    serve_start tc0
    nbd_attach /dev/nbd0 tc0
    mount -o noatime /dev/nbd0 "$MNT"
    verify_files $WORK/manifest "after a restart on the two spares"
    umount "$MNT"
    nbd_detach /dev/nbd0
    serve_stop
}

# --- the ublk front end (`serve --ublk`)

ublk_wait() { # wait for /dev/ublkb0 to have a size
    local i
    for i in $(seq 200); do
        [ "$(blockdev --getsize64 /dev/ublkb0 2>/dev/null || echo 0)" -gt 0 ] && return 0
        kill -0 "$SERVE_PID" 2>/dev/null || { cat /run/serve-tc0.log; fail "tiercache serve --ublk exited"; }
        sleep 0.1
    done
    cat /run/serve-tc0.log
    fail "/dev/ublkb0 did not appear"
}

# fio verify (as test_fio_verify) on /dev/ublkb0.
test_ublk_fio_verify() { # MODE
    new_cache "$1"
    serve_start tc0 --ublk
    ublk_wait
    fio_verify "write and verify on /dev/ublkb0" /dev/ublkb0
    serve_stop
    [ -e /dev/ublkb0 ] && fail "/dev/ublkb0 still there after a clean stop"
    serve_start tc0 --ublk
    ublk_wait
    fio_verify "verify after restart" /dev/ublkb0 --verify_only
    # set-mode while the device is up: leaving writeback writes back first.
    tc set-mode writethrough >/dev/null || fail "set-mode writethrough under /dev/ublkb0"
    tc status --json | grep -q '"cache_blocks_dirty": 0' || { tc status; fail "dirty blocks after set-mode writethrough"; }
    fio_verify "verify in writethrough" /dev/ublkb0 --verify_only
    tc set-mode "$1" >/dev/null || fail "set-mode $1 under /dev/ublkb0"
    # detach while the device is up (nothing holds it): the daemon writes
    # back, removes /dev/ublkb0 and exits; the origin holds everything.
    tc detach >/dev/null || fail "tiercache detach under /dev/ublkb0"
    wait "$SERVE_PID" || fail "tiercache serve exited with $? after detach"
    [ -e /dev/ublkb0 ] && fail "/dev/ublkb0 still there after detach"
    fio_verify "verify on the origin after detach" "$(disk origin)" --verify_only
    log "set-mode and detach while /dev/ublkb0 was up"
}

# ext4 on /dev/ublkb0; tiercache serve is killed with -9 under an
# fsync'ing writer and restarted, CYCLES times (default 10), 3 s apart;
# each restart takes the device over (user recovery): the writer sees no
# error, every file whose fsync returned matches, fsck is clean.
test_ublk_ext4_recover() { # MODE [CYCLES]
    local cycles=${2:-10} cycle recovered i
    dmesg -C
    new_cache "$1"
    serve_start tc0 --ublk
    ublk_wait
    mkfs.ext4 -q -E nodiscard /dev/ublkb0
    mount -o noatime /dev/ublkb0 "$MNT"
    write_files a $WORK/manifest
    : >$WORK/manifest-b
    rm -f $WORK/stop-writer
    ( round=0
      while ! [ -e $WORK/stop-writer ]; do
          round=$((round + 1))
          write_files "b$round" $WORK/manifest-b || exit 1
      done ) &
    local writer=$!
    echo $writer >>$PIDS
    recovered=$(grep -c 'recovered /dev/ublkb0' /run/serve-tc0.log || true)
    for cycle in $(seq "$cycles"); do
        sleep 3
        kill -0 "$writer" 2>/dev/null || break  # it failed: wait reports it below
        log "cycle $cycle: kill -9 tiercache serve (pid $SERVE_PID) with $(wc -l <$WORK/manifest-b) more files fsync'ed"
        kill -9 "$SERVE_PID"
        wait "$SERVE_PID" 2>/dev/null || true
        serve_start tc0 --ublk
        for i in $(seq 300); do
            [ "$(grep -c 'recovered /dev/ublkb0' /run/serve-tc0.log)" -gt "$recovered" ] && break
            kill -0 "$SERVE_PID" 2>/dev/null || { tail -5 /run/serve-tc0.log; fail "cycle $cycle: the restarted daemon exited"; }
            sleep 0.1
        done
        recovered=$((recovered + 1))
        [ "$(grep -c 'recovered /dev/ublkb0' /run/serve-tc0.log)" -ge "$recovered" ] \
            || { tail -5 /run/serve-tc0.log; fail "cycle $cycle: the device was not recovered within 30 s"; }
    done
    touch $WORK/stop-writer
    wait "$writer" || fail "the writer saw an error across the restarts"
    log "$cycles kill -9 and recovery cycles; the writer finished: $(wc -l <$WORK/manifest-b) files fsync'ed in all"
    log "records the restarted daemons applied from the crash log (acknowledged, not yet committed at the kill): $(grep -o 'applied [0-9]* records from the crash log' /run/serve-tc0.log | awk '{n++; s+=$2} END {printf "%d in %d of the restarts", s, n}')"
    cat $WORK/manifest-b >>$WORK/manifest
    verify_files $WORK/manifest "across kill -9 and recovery"
    tc status | grep -q 'served *ublk /dev/ublkb0' || { tc status; fail "status does not show /dev/ublkb0"; }
    tc detach >$WORK/detach.log 2>&1 && fail "detach of a mounted /dev/ublkb0 succeeded"
    grep -q 'refusing to detach.*mounted on' $WORK/detach.log || { cat $WORK/detach.log; fail "detach refused without saying why"; }
    log "detach refused while mounted: $(cat $WORK/detach.log)"
    umount "$MNT"
    e2fsck -f -n /dev/ublkb0 >$WORK/fsck.log 2>&1 || { cat $WORK/fsck.log; fail "e2fsck after recovery"; }
    log "e2fsck -f clean"
    dmesg | grep -E 'ublkb0.*error|EXT4-fs error' && fail "the kernel logged errors on ublkb0"
    serve_stop
}

# --- one cache in front of two origins, over ublk (issue 33)

ublk_wait_dev() { # DEV: wait for it to have a size
    local i
    for i in $(seq 200); do
        [ "$(blockdev --getsize64 "$1" 2>/dev/null || echo 0)" -gt 0 ] && return 0
        kill -0 "$SERVE_PID" 2>/dev/null || { cat /run/serve-tc0.log; fail "tiercache serve --ublk exited"; }
        sleep 0.1
    done
    cat /run/serve-tc0.log
    fail "$1 did not appear"
}

# Waits until the serve log says DEV was recovered more than N times.
ublk_recovered_after() { # DEV N
    local i
    for i in $(seq 300); do
        [ "$(grep -c "recovered $1\$" /run/serve-tc0.log)" -gt "$2" ] && return 0
        kill -0 "$SERVE_PID" 2>/dev/null || { tail -5 /run/serve-tc0.log; fail "the restarted daemon exited"; }
        sleep 0.1
    done
    tail -5 /run/serve-tc0.log
    fail "$1 was not recovered within 30 s"
}

# The origin disk cut in two with dm-linear, volumes db and logs of one
# writeback cache, served over ublk as /dev/ublkb0 and /dev/ublkb1. fio
# verify runs on both at once. Then ext4 on each with an fsync'ing writer;
# tiercache serve is killed with -9 under both writers twice and started
# again, each device taken over (user recovery): no writer sees an error,
# every file whose fsync returned is there, each filesystem is clean, and
# the data of one volume never shows on the other. A clean stop removes
# both devices.
# kill -9 of the daemon serving tc0 over /dev/ublkb0 and /dev/ublkb1, a
# restart, and both devices recovered (each logs "recovered" once more).
ublk_kill_and_recover_two() {
    local before0 before1
    before0=$(grep -c 'recovered /dev/ublkb0$' /run/serve-tc0.log || true)
    before1=$(grep -c 'recovered /dev/ublkb1$' /run/serve-tc0.log || true)
    kill -9 "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    serve_start tc0 --ublk
    ublk_recovered_after /dev/ublkb0 "$before0"
    ublk_recovered_after /dev/ublkb1 "$before1"
}

test_ublk_two_volumes() {
    local half d cycle
    half=$(( $(blockdev --getsz "$(disk origin)") / 2 ))
    dmsetup create tcdb --table "0 $half linear $(disk origin) 0"
    dmsetup create tclogs --table "0 $half linear $(disk origin) $half"
    tc create --origin /dev/mapper/tcdb --origin /dev/mapper/tclogs --volume db --volume logs \
        --cache "$(disk cache)" --mode writeback --force --wipe --lose-dirty-data >/dev/null
    log "created a writeback cache of two volumes: db and logs, halves of $(disk origin)"
    serve_start tc0 --ublk
    ublk_wait_dev /dev/ublkb0
    ublk_wait_dev /dev/ublkb1
    tc status | grep -q 'ublk /dev/ublkb0, /dev/ublkb1' || { tc status; fail "status does not show both devices"; }
    local f0 f1
    fio --name=db --filename=/dev/ublkb0 "${FIO_VERIFY[@]}" --output=$WORK/fio0.out & f0=$!
    fio --name=logs --filename=/dev/ublkb1 "${FIO_VERIFY[@]}" --output=$WORK/fio1.out & f1=$!
    echo "$f0 $f1" >>$PIDS
    wait $f0 || { cat $WORK/fio0.out; fail "fio verify on /dev/ublkb0"; }
    wait $f1 || { cat $WORK/fio1.out; fail "fio verify on /dev/ublkb1"; }
    for d in 0 1; do
        grep -q 'err= 0' $WORK/fio$d.out || { cat $WORK/fio$d.out; fail "fio reported errors on /dev/ublkb$d"; }
        log "fio verify on /dev/ublkb$d, beside the other: $(grep -E '^ *(write|read):' $WORK/fio$d.out | sed 's/^ *//; s/,.*//' | tr '\n' ' ')"
    done
    rm -f $WORK/stop-writer
    local writers=()
    for d in 0 1; do
        mkfs.ext4 -q -E nodiscard /dev/ublkb$d
        mkdir -p $MNT/v$d
        mount -o noatime /dev/ublkb$d $MNT/v$d
        write_files "v$d/a" $WORK/manifest
        verify_files $WORK/manifest "volume $d's first files, before any kill"
        : >$WORK/manifest-b$d
        ( round=0
          while ! [ -e $WORK/stop-writer ]; do
              round=$((round + 1))
              write_files "v$d/b$round" $WORK/manifest-b$d || exit 1
          done ) &
        writers+=($!)
        echo $! >>$PIDS
    done
    for cycle in 1 2; do
        sleep 3
        log "cycle $cycle: kill -9 tiercache serve with $(cat $WORK/manifest-b0 $WORK/manifest-b1 | wc -l) more files fsync'ed"
        ublk_kill_and_recover_two
    done
    sleep 2
    touch $WORK/stop-writer
    for d in 0 1; do
        wait "${writers[$d]}" || fail "the writer on /dev/ublkb$d saw an error across the restarts"
        cat $WORK/manifest-b$d >>$WORK/manifest
    done
    drop_caches
    sha256sum -c --quiet $WORK/manifest || {
        grep -E 'tiercache|warn|error|applied|recovered' /run/serve-tc0.log | tail -40
        fail "two volumes, across kill -9 and recovery: files differ from what was fsync'ed"
    }
    log "two volumes, across kill -9 and recovery: $(wc -l <$WORK/manifest) files verified"
    for d in 0 1; do
        umount $MNT/v$d
        e2fsck -f -n /dev/ublkb$d >$WORK/fsck.log 2>&1 || { cat $WORK/fsck.log; fail "e2fsck on /dev/ublkb$d"; }
    done
    log "e2fsck -f clean on both"
    dmesg | grep -E 'ublkb[01].*error|EXT4-fs error' && fail "the kernel logged errors"
    serve_stop
    [ -e /dev/ublkb0 ] || [ -e /dev/ublkb1 ] && fail "a ublk device is still there after a clean stop"
    log "a clean stop removed both devices"
}

# One volume served over ublk, a second added while it is (issue 33): its
# device appears beside the first, fio verify runs on both, ext4 on the new
# one survives a kill -9, and removing a volume while ublk serves is
# refused (device ids follow the volumes' places).
test_ublk_add_volume() {
    local half f0 f1
    half=$(( $(blockdev --getsz "$(disk origin)") / 2 ))
    dmsetup create tcdb --table "0 $half linear $(disk origin) 0"
    dmsetup create tclogs --table "0 $half linear $(disk origin) $half"
    tc create --origin /dev/mapper/tcdb --volume db \
        --cache "$(disk cache)" --mode writeback --force --wipe --lose-dirty-data >/dev/null
    serve_start tc0 --ublk
    ublk_wait_dev /dev/ublkb0
    fio --name=db --filename=/dev/ublkb0 "${FIO_VERIFY[@]}" --output=$WORK/fio0.out & f0=$!
    echo "$f0" >>$PIDS
    sleep 1
    tc add-origin --origin /dev/mapper/tclogs --volume logs >$WORK/add.out 2>&1 \
        || { cat $WORK/add.out; fail "add-origin while ublk serves"; }
    log "$(cat $WORK/add.out)"
    ublk_wait_dev /dev/ublkb1
    tc status | grep -q 'ublk /dev/ublkb0, /dev/ublkb1' || { tc status; fail "status does not show both devices"; }
    fio --name=logs --filename=/dev/ublkb1 "${FIO_VERIFY[@]}" --output=$WORK/fio1.out & f1=$!
    echo "$f1" >>$PIDS
    wait $f0 || { cat $WORK/fio0.out; fail "fio verify on /dev/ublkb0 across the add"; }
    wait $f1 || { cat $WORK/fio1.out; fail "fio verify on /dev/ublkb1, added online"; }
    for d in 0 1; do
        grep -q 'err= 0' $WORK/fio$d.out || { cat $WORK/fio$d.out; fail "fio reported errors on /dev/ublkb$d"; }
    done
    log "fio verify passed on /dev/ublkb0 across the add and on /dev/ublkb1, added online"
    mkfs.ext4 -q -E nodiscard /dev/ublkb1
    mkdir -p $MNT/v1
    mount -o noatime /dev/ublkb1 $MNT/v1
    write_files "v1/a" $WORK/manifest
    ublk_kill_and_recover_two
    drop_caches
    sha256sum -c --quiet $WORK/manifest || fail "ext4 on the added volume: files differ after kill -9"
    log "ext4 on the volume added online: $(wc -l <$WORK/manifest) files verified across kill -9 and recovery"
    umount $MNT/v1
    e2fsck -f -n /dev/ublkb1 >$WORK/fsck.log 2>&1 || { cat $WORK/fsck.log; fail "e2fsck on /dev/ublkb1"; }
    if tc remove-origin --volume logs >$WORK/remove.out 2>&1; then
        fail "remove-origin while ublk serves was not refused"
    fi
    grep -q 'ublk names its devices' $WORK/remove.out || { cat $WORK/remove.out; fail "remove-origin's refusal"; }
    log "remove-origin while ublk serves: refused ($(tail -1 $WORK/remove.out | cut -c1-100)...)"
    serve_stop
    [ -e /dev/ublkb0 ] || [ -e /dev/ublkb1 ] && fail "a ublk device is still there after a clean stop"
    log "a clean stop removed both devices"
}

# --- a cache set that loses a member, then the daemon (issue 32)

# SQLite on ext4 over a cache set of two dm-linear members, served as
# FRONT: "ublk" (/dev/ublkb0, user recovery) or "nbd" (/dev/nbd0 through
# nbd_netlink.py, reconnected after each restart). A writer commits one row
# per transaction (WAL, synchronous=FULL); a row is logged as acknowledged
# only once its COMMIT returned. The daemon is killed with -9 and started
# again (as systemd would: no --degraded) throughout: once on the whole
# set; 1 s after member 1 was switched to dm-error and the daemon logged
# the loss (the crash of issue 32: the restart must open degraded by
# itself, from member 0's label); CYCLES - 1 more times while degraded;
# once during `replace-cache` onto a spare (a dm-delay device, so that the
# rebuild takes seconds and the kill cuts it; then run again); once on the
# whole set after. Before each kill the writer must have committed more
# rows since the last restart: every kill lands under writes. With ublk, a daemon that cannot open the
# cache (both members dm-error for a moment) must say that /dev/ublkb0
# waits for a daemon, and the next one takes it over. Every acknowledged
# row must be in the database (integrity_check ok), e2fsck clean, no I/O
# error in the kernel log, the set whole.
test_cache_set_crash() { # FRONT CYCLES
    local front=$1 cycles=$2 k
    fail() { echo "--- serve log (last 60 lines)"; tail -60 /run/serve-tc0.log; echo "FAILED: $*"; exit 1; }
    dmesg -C
    KILLS=0
    dm_member tca "$(disk set-a)"
    dm_member tcb "$(disk set-b)"
    tc create --origin "$(disk origin)" --cache /dev/mapper/tca --cache /dev/mapper/tcb \
        --mode writeback --force --wipe --lose-dirty-data >/dev/null || fail "create the cache set"
    crash_front_start "$front"
    mkfs.ext4 -q -E nodiscard "$FRONT_DEV"
    mount -o noatime "$FRONT_DEV" "$MNT"
    : >$WORK/acked
    rm -f $WORK/stop-writer
    sqlite_writer "$MNT/rows.db" $WORK/acked $WORK/stop-writer >$WORK/writer.log 2>&1 &
    WRITER=$!
    echo $WRITER >>$PIDS
    crash_progress "the first rows"
    crash_kill "$front" "the set whole"
    crash_progress "after the first restart"
    dm_fail tcb
    wait_log 'member 1 failed' || fail "the daemon did not log member 1's loss"
    sleep 1
    crash_kill "$front" "1 s after member 1 failed"
    grep -q 'member 1 is named failed by the label of member 0' /run/serve-tc0.log \
        || fail "the restart did not say why it opened degraded"
    set_status | grep -q '^degraded.*1:(missing):failed' || { set_status; fail "not degraded without member 1"; }
    log "came back by itself: $(set_status)"
    for k in $(seq 2 "$cycles"); do
        crash_progress "degraded"
        crash_kill "$front" "degraded, kill $k of $cycles"
    done
    crash_progress "degraded"
    [ "$front" = ublk ] && crash_no_daemon
    crash_replace "$front"
    crash_progress "whole again"
    crash_kill "$front" "the set whole again"
    set_status | grep -q '^whole' || fail "the set is not whole after the last restart"
    crash_finish "$front"
}

# The daemon and the device: FRONT_DEV is /dev/ublkb0 or /dev/nbd0.
crash_front_start() { # FRONT
    if [ "$1" = ublk ]; then
        FRONT_DEV=/dev/ublkb0
        serve_start tc0 --ublk
        ublk_wait
    else
        FRONT_DEV=/dev/nbd0
        serve_start tc0
        python3 "$HERE/nbd_netlink.py" connect "$TIERCACHE_STATE_DIR/tc0.nbd" 0 60 || fail "netlink connect"
    fi
}

# kill -9 of the daemon, then a restart with no operator: the ublk device
# is taken over, or the NBD device given the new connection.
crash_kill() { # FRONT WHAT
    kill -0 "$WRITER" 2>/dev/null || { cat $WORK/writer.log; fail "$2: the writer has stopped"; }
    log "$2: kill -9 tiercache serve (pid $SERVE_PID), $(wc -l <$WORK/acked) rows acknowledged"
    kill -9 "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    KILLS=$((KILLS + 1))
    crash_restart "$1" "$2"
}

crash_restart() { # FRONT WHAT
    local before i
    if [ "$1" = nbd ]; then
        serve_start tc0
        python3 "$HERE/nbd_netlink.py" reconfigure "$TIERCACHE_STATE_DIR/tc0.nbd" 0 || fail "$2: netlink reconfigure"
        return 0
    fi
    before=$(grep -c 'recovered /dev/ublkb0' /run/serve-tc0.log || true)
    serve_start tc0 --ublk
    for i in $(seq 300); do
        [ "$(grep -c 'recovered /dev/ublkb0' /run/serve-tc0.log)" -gt "$before" ] && return 0
        kill -0 "$SERVE_PID" 2>/dev/null || fail "$2: the restarted daemon exited"
        sleep 0.1
    done
    fail "$2: /dev/ublkb0 was not recovered within 30 s"
}

# Waits (up to 60 s) until the writer has committed 20 more rows.
crash_progress() { # WHAT
    local want i
    want=$(( $(wc -l <$WORK/acked) + 20 ))
    for i in $(seq 600); do
        [ "$(wc -l <$WORK/acked)" -ge "$want" ] && return 0
        kill -0 "$WRITER" 2>/dev/null || { cat $WORK/writer.log; fail "$1: the writer has stopped"; }
        sleep 0.1
    done
    fail "$1: the writer committed no 20 rows within 60 s"
}

# Waits up to 30 s for the daemon's log to hold PATTERN.
wait_log() { # PATTERN
    local i
    for i in $(seq 300); do
        grep -q "$1" /run/serve-tc0.log && return 0
        sleep 0.1
    done
    return 1
}

# ublk: the daemon killed while no daemon can open the cache (member 0 is
# dm-error too for a moment). The one started then refuses and says that
# /dev/ublkb0 waits; the writer stalls, it does not fail; once member 0 is
# back the next daemon takes the device over.
crash_no_daemon() {
    local sectors
    log "no daemon can open the cache: member 0 is dm-error too, the daemon killed"
    kill -9 "$SERVE_PID"
    wait "$SERVE_PID" 2>/dev/null || true
    KILLS=$((KILLS + 1))
    dm_fail tca
    "$TC_BIN" serve --name tc0 --ublk >$WORK/refused.log 2>&1 && fail "a daemon served without a readable member"
    grep -q "/dev/ublkb0 is waiting for a daemon.*no member's label could be read" $WORK/refused.log \
        || { cat $WORK/refused.log; fail "the refused daemon did not say that /dev/ublkb0 waits, and why"; }
    log "refused, and said: $(tr '\n' ' ' <$WORK/refused.log | cut -c1-900)"
    kill -0 "$WRITER" 2>/dev/null || fail "the writer stopped while no daemon served"
    sectors=$(blockdev --getsz "$(disk set-a)")
    dmsetup suspend --noflush tca && dmsetup load tca --table "0 $sectors linear $(disk set-a) 0" \
        && dmsetup resume tca || fail "member 0 back to dm-linear"
    crash_restart ublk "member 0 back"
    log "member 0 back: the next daemon took /dev/ublkb0 over"
}

# replace-cache of member 1 onto the spare set-c, online, behind dm-delay
# (100 ms a request: the rebuild takes seconds); the daemon is killed 1 s
# into it, and replace-cache is run again if the kill cut it. Then the
# spare is made dm-linear (its table swapped under the daemon).
crash_replace() { # FRONT
    local rp sectors
    sectors=$(blockdev --getsz "$(disk set-c)")
    dmsetup create tcc --table "0 $sectors delay $(disk set-c) 0 100" || fail "dmsetup create tcc"
    dmsetup mknodes tcc >/dev/null 2>&1 || true
    tc replace-cache /dev/mapper/tcb /dev/mapper/tcc >$WORK/replace.log 2>&1 &
    rp=$!
    echo $rp >>$PIDS
    sleep 1
    log "replace-cache under way: $(set_status)"
    crash_kill "$1" "during replace-cache"
    if wait $rp; then
        log "replace-cache finished before the kill: $(tail -1 $WORK/replace.log)"
    else
        log "the kill cut replace-cache ($(tail -1 $WORK/replace.log | cut -c1-120)): $(set_status)"
        tc replace-cache /dev/mapper/tcb /dev/mapper/tcc >$WORK/replace.log 2>&1 \
            || { cat $WORK/replace.log; fail "replace-cache after the kill"; }
    fi
    set_status | grep -q '^whole' || fail "the set is not whole after replace-cache"
    dmsetup suspend tcc && dmsetup load tcc --table "0 $sectors linear $(disk set-c) 0" \
        && dmsetup resume tcc || fail "the spare to dm-linear"
    log "member 1 rebuilt onto /dev/mapper/tcc: $(set_status)"
}

# Stops the writer and checks everything it was told was committed.
crash_finish() { # FRONT
    touch $WORK/stop-writer
    wait "$WRITER" || { cat $WORK/writer.log; fail "the SQLite writer saw an error"; }
    log "$KILLS kill -9 and restarts; $(wc -l <$WORK/acked) rows committed"
    drop_caches
    sqlite_check "$MNT/rows.db" $WORK/acked
    umount "$MNT"
    e2fsck -f -n "$FRONT_DEV" >$WORK/fsck.log 2>&1 || { cat $WORK/fsck.log; fail "e2fsck"; }
    log "e2fsck -f clean"
    dmesg | grep -E '(ublkb0|nbd0).*error|EXT4-fs error' && fail "the kernel logged errors"
    if [ "$1" = nbd ]; then python3 "$HERE/nbd_netlink.py" disconnect 0; fi
    serve_stop
    log "the set: $(tc status --json | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["cache_set_state"], [m["state"] for m in s["cache_members"]])')"
}

# Rows, one transaction each, until STOP exists; a row's id and sha256 go
# to ACKED once its COMMIT returned. Any error ends it with status 1.
sqlite_writer() { # DB ACKED STOP
    /usr/bin/python3 - "$@" <<'PY'
import hashlib, os, random, sqlite3, sys
db, acked, stop = sys.argv[1:4]
con = sqlite3.connect(db, timeout=600, isolation_level=None)
assert con.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
con.execute("PRAGMA synchronous=FULL")
con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB, sum TEXT)")
rng = random.Random(32)
out = open(acked, "a", buffering=1)
n = 0
while not os.path.exists(stop):
    n += 1
    data = rng.randbytes(rng.randrange(100, 16384))
    s = hashlib.sha256(data).hexdigest()
    con.execute("BEGIN")
    con.execute("INSERT INTO t VALUES (?, ?, ?)", (n, data, s))
    con.execute("COMMIT")
    out.write("%d %s\n" % (n, s))
PY
}

sqlite_check() { # DB ACKED
    /usr/bin/python3 - "$@" <<'PY' || fail "acknowledged rows are missing or the database is damaged"
import hashlib, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
ok = con.execute("PRAGMA integrity_check").fetchone()[0]
if ok != "ok":
    sys.exit("integrity_check: " + ok)
rows = {i: (d, s) for i, d, s in con.execute("SELECT id, data, sum FROM t")}
acked = [l.split() for l in open(sys.argv[2])]
bad = [i for i, s in acked
       if int(i) not in rows or rows[int(i)][1] != s or hashlib.sha256(rows[int(i)][0]).hexdigest() != s]
if bad:
    sys.exit("%d of %d acknowledged rows missing or wrong, first %s" % (len(bad), len(acked), bad[:5]))
print("[check] %d acknowledged rows all in the database (%d rows), integrity_check ok" % (len(acked), len(rows)))
PY
}
