#!/usr/bin/env bash
# Stops a cluster started by scripts/ceph-up.sh DIR and removes DIR.
#
#   scripts/ceph-down.sh [--keep] DIR     # --keep: stop the daemons, keep DIR
#
# Only the daemons named by DIR/run/*.pid are signalled, and only if that
# PID is still a ceph daemon reading DIR's config (a PID may have been
# reused since): SIGTERM (OSD first, the monitor last), then SIGKILL after
# 20 s.
set -euo pipefail

keep=0
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 [--keep] DIR" >&2
    exit 2
fi
[ -d "$1" ] || exit 0
DIR=$(cd "$1" && pwd)

# True if PID $1 is a ceph daemon of this cluster: its command line names
# a ceph binary, and its environment carries CEPH_CONF=DIR/ceph.conf (set by
# ceph-up.sh for everything it starts).
ours() {
    local pid=$1
    [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q '^ceph-\(mon\|mgr\|osd\) ' || return 1
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "CEPH_CONF=$DIR/ceph.conf"
}

# Running, not a zombie (a daemon whose parent is gone is reaped by init,
# but not every container's init reaps).
alive() {
    local state
    state=$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

pids=()
for name in osd.0 mgr.x mon.a; do
    f=$DIR/run/$name.pid
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [[ "$pid" =~ ^[0-9]+$ ]] && ours "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
    fi
    rm -f "$f"
done

deadline=$(( $(date +%s) + 20 ))
for pid in "${pids[@]}"; do
    while alive "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do
        sleep 0.1
    done
    if alive "$pid"; then
        echo "ceph-down: pid $pid ignored SIGTERM for 20 s: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        while alive "$pid"; do sleep 0.1; done
    fi
done

if [ "$keep" = 0 ]; then
    rm -rf "$DIR"
fi
echo "ceph-down: stopped ${#pids[@]} daemon(s)$([ "$keep" = 1 ] || echo ", removed $DIR")"
