# Helpers of the guest tests (sourced by run.sh and each test).
# Everything a test starts is recorded in $PIDS so cleanup_all can end it
# by PID.

. /run/results/config.sh
HERE=$TC_DIR/scripts/guest
export TIERCACHE_STATE_DIR=/run/tc
PIDS=/run/test-pids
MNT=/run/mnt
# Scratch files of one test (manifests, logs); emptied between tests.
WORK=/run/work
mkdir -p "$TIERCACHE_STATE_DIR" "$MNT" "$WORK"
cd "$WORK"

log() { echo "[$(cut -d' ' -f1 /proc/uptime)] $*"; }
fail() { echo "FAILED: $*"; exit 1; }

# The block device whose virtio serial is NAME (scripts/guest-test.sh names
# every disk).
disk() {
    local d
    for d in /sys/block/vd*; do
        if [ "$(cat "$d/serial" 2>/dev/null)" = "$1" ]; then echo "/dev/${d##*/}"; return; fi
    done
    fail "no disk with serial $1"
}

tc() { "$TC_BIN" "$@"; }

# Starts `tiercache serve` for cache NAME (default tc0) in the background;
# sets SERVE_PID once its sockets exist (the control socket; and the NBD
# socket unless --ublk).
serve_start() {
    local name=${1:-tc0} i
    shift || true
    # A killed daemon leaves its socket files behind: waiting for them
    # would not wait for the new one.
    rm -f "$TIERCACHE_STATE_DIR/$name.nbd" "$TIERCACHE_STATE_DIR/$name.sock"
    "$TC_BIN" serve --name "$name" "$@" >>/run/serve-$name.log 2>&1 &
    SERVE_PID=$!
    echo "$SERVE_PID" >>$PIDS
    for i in $(seq 200); do
        # With --ublk there is no NBD socket (ublk_wait waits for the device).
        if [ -S "$TIERCACHE_STATE_DIR/$name.sock" ] \
           && { [ -S "$TIERCACHE_STATE_DIR/$name.nbd" ] || [[ " $* " == *" --ublk "* ]]; }; then
            return 0
        fi
        kill -0 "$SERVE_PID" 2>/dev/null || { cat /run/serve-$name.log; fail "tiercache serve exited"; }
        sleep 0.1
    done
    fail "tiercache serve did not listen within 20 s"
}

# SIGTERM (clean shutdown) and wait.
serve_stop() {
    kill -TERM "$SERVE_PID"
    wait "$SERVE_PID" || fail "tiercache serve exited with $? on SIGTERM"
}

# Connects /dev/nbdN to the served cache NAME; extra args to nbd-client.
nbd_attach() {
    local dev=$1 name=$2
    shift 2
    nbd-client -unix "$TIERCACHE_STATE_DIR/$name.nbd" "$dev" "$@" >/dev/null \
        || fail "nbd-client could not connect $dev"
    local i
    for i in $(seq 100); do
        [ "$(blockdev --getsize64 "$dev" 2>/dev/null || echo 0)" -gt 0 ] && return 0
        sleep 0.1
    done
    fail "$dev has no size after nbd-client"
}

nbd_detach() { nbd-client -d "$1" >/dev/null 2>&1 || true; }

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# A block device's sysfs directory, by device number: without udev
# /dev/mapper/* are nodes, not links.
sysfs_of() { # DEV
    local mm
    mm=$(stat -L -c '%t %T' "$1") || fail "no device $1"
    set -- $mm
    echo "/sys/dev/block/$((16#$1)):$((16#$2))"
}

# Origin request counters: completed reads and writes from
# /sys/block/DEV/stat (fields 1 and 5).
dev_stat() {
    awk '{ print $1, $5 }' "$(sysfs_of "$1")/stat"
}

# Ends whatever a test left behind: mounts, NBD devices, device-mapper
# and bcache devices, and the processes it started (by PID).
cleanup_all() {
    umount "$MNT" 2>/dev/null || true
    local d
    for d in /dev/nbd0 /dev/nbd1; do nbd_detach "$d"; done
    if [ -f $PIDS ]; then
        while read -r p; do kill -9 "$p" 2>/dev/null || true; done <$PIDS
        rm -f $PIDS
    fi
    for d in /sys/block/bcache*/bcache; do
        [ -e "$d/stop" ] && echo 1 >"$d/stop" 2>/dev/null || true
    done
    for d in /sys/fs/bcache/*-*; do
        [ -e "$d/unregister" ] && echo 1 >"$d/unregister" 2>/dev/null || true
    done
    dmsetup remove_all --force >/dev/null 2>&1 || true
    rm -rf "${TIERCACHE_STATE_DIR:?}"/* "${WORK:?}"/* /run/serve-*.log
}
