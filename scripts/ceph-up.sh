#!/usr/bin/env bash
# A single-node Ceph cluster under DIR, for tests and benchmarks (docs/ceph.md).
#
#   scripts/ceph-up.sh DIR      # start it; scripts/ceph-down.sh DIR stops it
#
# One ceph-mon, one ceph-mgr and one ceph-osd on a file-backed BlueStore,
# all on 127.0.0.1, run in the foreground of their own processes (no
# systemd, no kernel module); pool `tc` of size 1, initialised for RBD.
# Tuned for a 2-core machine with a rotational-looking virtual disk.
#
# Writes DIR/ceph.conf and DIR/ceph.env (`. DIR/ceph.env` sets CEPH_CONF,
# so ceph, rbd, fio's rbd engine and librbd find the cluster; CEPH_POOL;
# CEPH_DIR). Daemon PIDs are in DIR/run/*.pid, logs in DIR/log/.
#
# A leftover DIR (an earlier run's) is stopped and removed first. If a
# step fails or a daemon does not come up within CEPH_UP_TIMEOUT seconds
# (default 90), the script prints the failing command, its output and the
# daemons' log tails, stops what it started and exits 1 (DIR stays, for
# the logs).
#
# Environment (all optional):
#   CEPH_MON_PORT     msgr2 port of the monitor (msgr1 is the next one);
#                     default: a free pair picked at random
#   CEPH_OSD_BYTES    size of the sparse BlueStore file (default 16G)
#   CEPH_OSD_MEMORY   osd_memory_target in bytes (default 1G)
#   CEPH_UP_TIMEOUT   seconds each wait may take (default 90)
set -euo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-authtool monmaptool; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "ceph-up: $tool not found: run scripts/ceph-install.sh (scripts/test.sh does)" >&2
        exit 1
    fi
done

here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
TIMEOUT=${CEPH_UP_TIMEOUT:-90}
OSD_BYTES=${CEPH_OSD_BYTES:-16G}
OSD_MEMORY=${CEPH_OSD_MEMORY:-1073741824}
POOL=tc
t_start_ns=$(date +%s%N)

# A leftover cluster: stop its daemons (by their PID files), then start afresh.
if [ -n "$(ls -A "$DIR")" ]; then
    "$here/ceph-down.sh" "$DIR" >/dev/null
    mkdir -p "$DIR"
fi
mkdir -p "$DIR"/{run,log/client,mon,mgr,osd,crash}

CONF=$DIR/ceph.conf
export CEPH_CONF=$CONF

log() { printf 'ceph-up: %s\n' "$*"; }

# Stops whatever this script started and fails with the daemons' log tails.
fail() {
    echo "ceph-up: FAILED: $*" >&2
    local f
    for f in "$DIR"/log/*.log "$DIR"/log/*.out; do
        [ -s "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 15 "$f" >&2
    done
    "$here/ceph-down.sh" --keep "$DIR" >&2 || true
    echo "ceph-up: daemons stopped; logs kept in $DIR/log" >&2
    exit 1
}

# Runs a command with a time limit; on failure, fails with the command and its output.
step() {
    local out
    if ! out=$(timeout "$TIMEOUT" "$@" 2>&1); then
        fail "command '$*' failed:"$'\n'"$out"
    fi
    [ -z "$out" ] || printf '%s\n' "$out"
}

# Waits until the shell command $3 succeeds (each try at most 15 s),
# checking that daemon $2 still runs; $1 says what is awaited.
wait_for() {
    local what=$1 daemon=$2 check=$3 out
    local deadline=$(( $(date +%s) + TIMEOUT ))
    until out=$(timeout 15 bash -c "$check" 2>&1); do
        if ! kill -0 "$(cat "$DIR/run/$daemon.pid")" 2>/dev/null; then
            fail "$daemon exited while waiting for $what (check: '$check': $out)"
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            fail "$what not within ${TIMEOUT} s (check: '$check': $out)"
        fi
        sleep 0.5
    done
}

# Starts a daemon in the foreground of its own process, stdio to a file,
# its PID in DIR/run/NAME.pid (what ceph-down.sh signals).
start_daemon() {
    local name=$1
    shift
    setsid "$@" -f </dev/null >"$DIR/log/$name.out" 2>&1 &
    echo $! >"$DIR/run/$name.pid"
}

# Free: no socket of any state (listening, connected, TIME_WAIT) has it as
# its local port. Connected sockets count: a client's ephemeral port made
# the monitor's bind fail with EADDRINUSE once (a bench run, 2026-11-28).
port_free() {
    ! ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .
}

if [ -n "${CEPH_MON_PORT:-}" ]; then
    port=$CEPH_MON_PORT
else
    # Below the kernel's ephemeral range (ip_local_port_range), which
    # outgoing connections take their local ports from at any moment.
    read -r eph_lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || eph_lo=32768
    top=$(( eph_lo > 12000 ? eph_lo - 2 : 30000 ))
    for _ in $(seq 50); do
        port=$(( 10000 + RANDOM % (top - 10000) ))
        if port_free "$port" && port_free $((port + 1)); then break; fi
    done
fi
port_v1=$((port + 1))
fsid=$(cat /proc/sys/kernel/random/uuid)

# Each daemon has its own keyring (a keyring in [global] would make every
# daemon present the admin key). The BlueStore block file lives outside
# the OSD data dir (inside, mkfs loops on its own symlink: ELOOP). Client
# admin sockets carry the PID, so concurrent clients do not collide.
cat >"$CONF" <<EOF
# Written by scripts/ceph-up.sh: a single-node test cluster.
[global]
fsid = $fsid
mon_host = [v2:127.0.0.1:$port,v1:127.0.0.1:$port_v1]
public_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
auth_allow_insecure_global_id_reclaim = false
run_dir = $DIR/run
log_file = $DIR/log/\$name.log
admin_socket = $DIR/run/\$name.asok
crash_dir = $DIR/crash
# One OSD: one copy, no failure domain above the OSD, no autoscaler.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_delete = true
# The disk may be fairly full: no HEALTH_WARN or refusal over free space.
mon_data_avail_warn = 2
mon_data_avail_crit = 1

[mon]
mon_data = $DIR/mon/data
keyring = $DIR/mon/keyring
mon_initial_members = a

[mgr]
mgr_data = $DIR/mgr
keyring = $DIR/mgr/keyring

[osd]
osd_data = $DIR/osd/data
keyring = $DIR/osd/data/keyring
osd_objectstore = bluestore
bluestore_block_path = $DIR/osd-block.img
bluestore_block_create = true
bluestore_block_size = $OSD_BYTES
bluestore_fsck_on_mkfs = false
bluestore_fsck_on_mount = false
osd_memory_target = $OSD_MEMORY

[client]
keyring = $DIR/keyring
admin_socket = $DIR/run/\$name.\$pid.asok
log_file = $DIR/log/client/\$name.\$pid.log
EOF

cat >"$DIR/ceph.env" <<EOF
# Written by scripts/ceph-up.sh: '. $DIR/ceph.env'
export CEPH_CONF=$CONF
export CEPH_DIR=$DIR
export CEPH_POOL=$POOL
EOF

# --- monitor
step ceph-authtool --create-keyring "$DIR/mon/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
step ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
step ceph-authtool "$DIR/mon/keyring" --import-keyring "$DIR/keyring" >/dev/null
step monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port,v1:127.0.0.1:$port_v1]" \
    "$DIR/monmap" >/dev/null
step ceph-mon --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/mon/keyring" >/dev/null
start_daemon mon.a ceph-mon -i a
wait_for "the monitor (127.0.0.1:$port)" mon.a "ceph --connect-timeout 10 mon stat"
log "mon.a up on 127.0.0.1:$port"

# --- manager
step ceph auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$DIR/mgr/keyring" >/dev/null
start_daemon mgr.x ceph-mgr -i x

# --- OSD 0 on a sparse file
osd_uuid=$(cat /proc/sys/kernel/random/uuid)
osd_key=$(ceph-authtool --gen-print-key)
printf '{"cephx_secret": "%s"}\n' "$osd_key" >"$DIR/osd/secret.json"
if ! osd_id=$(timeout "$TIMEOUT" ceph osd new "$osd_uuid" -i "$DIR/osd/secret.json" 2>&1) ||
    [ "$osd_id" != 0 ]; then
    fail "command 'ceph osd new $osd_uuid -i $DIR/osd/secret.json' did not give id 0: $osd_id"
fi
rm -f "$DIR/osd/secret.json"
mkdir -p "$DIR/osd/data"
step ceph-authtool --create-keyring "$DIR/osd/data/keyring" --name osd.0 --add-key "$osd_key" >/dev/null
step ceph-osd -i 0 --mkfs --osd-uuid "$osd_uuid" >/dev/null
start_daemon osd.0 ceph-osd -i 0
wait_for "osd.0 up" osd.0 "ceph --connect-timeout 10 osd dump -f json | grep -q '\"up\":1,'"
log "osd.0 up"

# --- the pool
step ceph osd pool create "$POOL" 16 16 >/dev/null
step rbd pool init "$POOL"
wait_for "mgr.x available" mgr.x "ceph --connect-timeout 10 mgr stat -f json | grep -q '\"available\": *true'"
elapsed_ms=$(( ($(date +%s%N) - t_start_ns) / 1000000 ))
log "pool '$POOL' ready; cluster up in $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100)) s"
log "config: $CONF; environment: . $DIR/ceph.env"
