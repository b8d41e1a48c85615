#!/bin/bash
# The systemd guest tests (docs/guest.md, "systemd in the guest"): the
# host's systemd is PID 1 of the guest and mounts a filesystem on a
# tiercache volume at boot from an fstab line, after tiercache@tc0.service
# (issue 35). Each test is a boot of its own (scripts/guest-test.sh passes
# tc.systemd=NAME):
#
#   systemd_fstab_ublk  /dev/ublkb0 (TIERCACHE_SERVE_ARGS="--ublk --ublk-id 0")
#   systemd_fstab_nbd   /dev/nbd0 from a oneshot nbd-client unit
#
#   systemd.sh prepare NAME        init runs it chrooted, before systemd: the
#                                  cache, ext4 with files on the volume, the
#                                  unit, the fstab line and the test's units
#   systemd.sh check NAME          tiercache-check.service, once the boot is
#                                  through remote-fs.target: the assertions,
#                                  then the report and power-off
#   systemd.sh deadline NAME SECS  tiercache-test-deadline.service: reports a
#                                  failure if check has not finished
#                                  within SECS
#
# Each writes PASS|FAIL NAME SECONDS (guest uptime) to /run/results/summary
# and NAME.done when it has finished; NAME.log is the test's output and
# NAME.journal the boot's journal.
set -uo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LC_ALL=C
RESULTS=/run/results
. $RESULTS/config.sh
. "$TC_DIR/scripts/guest/lib.sh"
. "$TC_DIR/scripts/guest/tests.sh"
# Where the unit keeps it (Environment= in tiercache@.service): /var is the
# guest's tmpfs, so the registry made in prepare is there at boot.
export TIERCACHE_STATE_DIR=/var/lib/tiercache
mkdir -p "$TIERCACHE_STATE_DIR"
MNT=/srv
# Survives the switch to systemd (/run is the guest's tmpfs, kept).
STATE=/run/tc-systemd
mkdir -p $STATE

# The fstab lines and the NBD client's unit that docs/operations.md
# ("Mounting at boot") and the unit's comment show; prepare refuses to run
# when the docs no longer show them.
FSTAB_UBLK='/dev/ublkb0  /srv  ext4  defaults,_netdev,x-systemd.requires=tiercache@tc0.service  0 2'
FSTAB_NBD='/dev/nbd0  /srv  ext4  defaults,_netdev,x-systemd.requires=tiercache-nbd0.service  0 2'
NBD_UNIT='[Unit]
Description=/dev/nbd0 on tiercache tc0
Requires=tiercache@tc0.service
After=tiercache@tc0.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStartPre=-/usr/bin/udevadm settle
ExecStart=/usr/sbin/nbd-client -unix /var/lib/tiercache/tc0.nbd /dev/nbd0
ExecStop=/usr/sbin/nbd-client -d /dev/nbd0'

# The front end a systemd test mounts its filesystem over.
front_of() { # NAME: ublk or nbd
    case "$1" in
        systemd_fstab_ublk) echo ublk ;;
        systemd_fstab_nbd) echo nbd ;;
        *) fail "unknown systemd test $1" ;;
    esac
}

# Fails unless FILE shows LINE (runs of blanks compared as one).
doc_shows() { # FILE LINE
    local want
    want=$(echo "$2" | tr -s ' ')
    sed 's/^[# ]*//' "$TC_DIR/$1" | tr -s ' ' | grep -xF "$want" >/dev/null \
        || fail "$1 does not show the line this test uses: $2"
}

# --- before systemd (chrooted by init)

# The cache tc0 (writeback, registered in /var/lib/tiercache), ext4 on its
# volume with files whose sha256 go to $STATE/manifest, stopped cleanly:
# the files' blocks are dirty in the cache when systemd starts.
prepare_volume() { # FRONT
    local dev
    dmesg -C
    if [ "$1" = ublk ]; then
        "$TC_BIN" serve --help | grep -- '--ublk' >/dev/null \
            || fail "$TC_BIN has no ublk front end: build it with --features ublk (scripts/guest-test.sh without --quick)"
    fi
    tc create --name tc0 --origin "$(disk origin)" --cache "$(disk cache)" --mode writeback \
        --force --wipe --lose-dirty-data >/dev/null || fail "tiercache create"
    if [ "$1" = ublk ]; then
        serve_start tc0 --ublk --ublk-id 0
        ublk_wait
        dev=/dev/ublkb0
    else
        serve_start tc0
        nbd_attach /dev/nbd0 tc0
        dev=/dev/nbd0
    fi
    mkfs.ext4 -q -E nodiscard "$dev" || fail "mkfs.ext4 on $dev"
    mount -o noatime "$dev" $MNT || fail "mounting $dev"
    write_files a $STATE/manifest || fail "writing files on $dev"
    umount $MNT || fail "umount $dev"
    [ "$1" = nbd ] && nbd_detach /dev/nbd0
    serve_stop
    [ -e /dev/ublkb0 ] && fail "/dev/ublkb0 still there after a clean stop"
    log "prepared: $dev, ext4, $(wc -l <$STATE/manifest) files; $(tc status --json | grep -m1 '"cache_blocks_dirty"' | tr -d ' ,')"
}

# What an operator installs (/etc and /usr/local/bin are overlays in the
# guest), and the test's own units: tiercache-test.target is the boot's
# target (multi-user.target would start the host's services), pulling in
# remote-fs.target (so the fstab's _netdev mount, as at a normal boot), the
# check and its deadline.
install_units() { # FRONT NAME
    local sd=/etc/systemd/system u
    ln -sf "$TC_BIN" /usr/local/bin/tiercache
    cp "$TC_DIR/contrib/systemd/tiercache@.service" $sd/
    # The guest's kernel has no binfmt_misc module: masked, so its failing
    # mount does not fill the console with red FAILED lines.
    for u in proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount systemd-binfmt.service; do
        ln -sf /dev/null "$sd/$u"
    done
    if [ "$1" = ublk ]; then
        doc_shows docs/operations.md "$FSTAB_UBLK"
        doc_shows contrib/systemd/tiercache@.service "$FSTAB_UBLK"
        mkdir -p /etc/tiercache
        echo 'TIERCACHE_SERVE_ARGS="--ublk --ublk-id 0"' >/etc/tiercache/tc0.env
        echo "$FSTAB_UBLK" >/etc/fstab
    else
        doc_shows docs/operations.md "$FSTAB_NBD"
        local line
        while read -r line; do
            if [ -n "$line" ]; then doc_shows docs/operations.md "$line"; fi
        done <<<"$NBD_UNIT"
        echo "$NBD_UNIT" >$sd/tiercache-nbd0.service
        echo "$FSTAB_NBD" >/etc/fstab
    fi
    cat >$sd/tiercache-test.target <<EOF
[Unit]
Description=tiercache guest test $2
Requires=basic.target
Wants=remote-fs.target tiercache-check.service tiercache-test-deadline.service
After=basic.target
AllowIsolate=yes
EOF
    cat >$sd/tiercache-check.service <<EOF
[Unit]
Description=tiercache guest test $2: the checks
After=remote-fs.target

[Service]
Type=oneshot
ExecStart=/bin/bash $TC_DIR/scripts/guest/systemd.sh check $2
StandardOutput=journal+console
StandardError=journal+console
EOF
    cat >$sd/tiercache-test-deadline.service <<EOF
[Unit]
Description=tiercache guest test $2: the deadline
DefaultDependencies=no

[Service]
ExecStart=/bin/bash $TC_DIR/scripts/guest/systemd.sh deadline $2 240
StandardOutput=journal+console
EOF
}

# --- under systemd (tiercache-check.service)

# One property of a unit.
prop() { # UNIT PROPERTY
    systemctl show -p "$2" --value "$1"
}

# systemctl status for the log (its exit status says the unit's state).
show_status() { # UNIT
    systemctl status --no-pager "$1" || true
}

# Fails unless UNIT is active.
expect_active() { # UNIT
    [ "$(systemctl is-active "$1")" = active ] || { show_status "$1"; fail "$1 is not active"; }
}

# Fails unless UNIT's dependency property PROP lists OTHER.
expect_dep() { # UNIT PROP OTHER
    [[ " $(prop "$1" "$2") " == *" $3 "* ]] || fail "$1 has no $2=$3 ($2=$(prop "$1" "$2"))"
}

# LATER was started (left inactive) only once EARLIER was active: the
# order happened, not only the declaration.
expect_started_after() { # EARLIER LATER
    local ready started
    ready=$(prop "$1" ActiveEnterTimestampMonotonic)
    started=$(prop "$2" InactiveExitTimestampMonotonic)
    [ "$ready" -gt 0 ] && [ "$started" -ge "$ready" ] \
        || fail "$2 started at ${started} us, before $1 was ready at ${ready} us"
    log "$2 started $(( (started - ready) / 1000 )) ms after $1 was ready"
}

# Waits until UNIT's ActiveState is STATE.
wait_state() { # UNIT STATE SECS
    local i
    for i in $(seq $(($3 * 10))); do
        [ "$(prop "$1" ActiveState)" = "$2" ] && return 0
        sleep 0.1
    done
    show_status "$1"
    fail "$1 is not $2 after $3 s"
}

# Waits until the daemon serving tc0 counts no NBD client (nbd-client -d
# returned before the daemon saw the connection close; detach would wait
# only 2 s for it).
wait_no_nbd_client() {
    local i
    for i in $(seq 300); do
        /usr/local/bin/tiercache status --name tc0 | grep -E 'NBD clients connected: 0$' >/dev/null && return 0
        sleep 0.1
    done
    /usr/local/bin/tiercache status --name tc0
    fail "the daemon still counts an NBD client 30 s after nbd-client -d"
}

# Waits until UNIT's journal has a line with TEXT (journald stores what a
# process wrote a moment after systemctl returned).
wait_journal() { # UNIT TEXT
    local i
    for i in $(seq 100); do
        journalctl -b -u "$1" --no-pager | grep -F "$2" >/dev/null && return 0
        sleep 0.1
    done
    journalctl -b -u "$1" --no-pager | tail -20
    fail "no line '$2' in the journal of $1 within 10 s"
}

# The boot mounted /srv from the fstab line, after the daemon was ready
# (and, over NBD, after nbd-client connected); the files are there.
check_boot() { # FRONT
    local dev=/dev/ublkb0 provider=tiercache@tc0.service
    if [ "$1" = nbd ]; then dev=/dev/nbd0; provider=tiercache-nbd0.service; fi
    expect_active tiercache@tc0.service
    expect_active srv.mount
    [ "$(findmnt -n -o SOURCE,FSTYPE $MNT | tr -s ' ')" = "$dev ext4" ] \
        || fail "/srv is not ext4 on $dev: $(findmnt -n $MNT)"
    log "srv.mount: $(systemctl show -p SourcePath -p What srv.mount | tr '\n' ' ')"
    expect_dep srv.mount Requires "$provider"
    expect_dep srv.mount After "$provider"
    if [ "$1" = nbd ]; then
        expect_active tiercache-nbd0.service
        expect_dep tiercache-nbd0.service Requires tiercache@tc0.service
        expect_dep tiercache-nbd0.service After tiercache@tc0.service
        expect_started_after tiercache@tc0.service tiercache-nbd0.service
    fi
    expect_started_after "$provider" srv.mount
    # An fstab line that closes an ordering cycle (over ublk without
    # _netdev: the mount before local-fs.target, the unit after it) makes
    # systemd drop jobs at boot, and it logs that.
    if journalctl -b --no-pager | grep -i 'ordering cycle'; then
        fail "systemd found an ordering cycle at boot"
    fi
    local failed
    failed=$(systemctl list-units --failed --plain --no-legend | awk '{ print $1 }' | tr '\n' ' ')
    log "failed units at boot: ${failed:-none}"
    verify_files $STATE/manifest "mounted at boot"
    write_files b $STATE/manifest || fail "writing files on /srv"
    verify_files $STATE/manifest "written under systemd"
    if dmesg | grep -E "(ublkb0|nbd0).*error|EXT4-fs error"; then
        fail "the kernel logged errors on $dev"
    fi
}

# After `tiercache detach` the origin holds every file, and the unit is
# skipped by its ExecCondition (import --boot finds no cache tc0), not
# failed.
check_detached_skips() { # FRONT
    systemctl stop srv.mount || fail "systemctl stop srv.mount"
    if [ "$1" = nbd ]; then
        systemctl stop tiercache-nbd0.service || fail "systemctl stop tiercache-nbd0"
        wait_no_nbd_client
    fi
    /usr/local/bin/tiercache detach --name tc0 || fail "tiercache detach"
    wait_state tiercache@tc0.service inactive 30
    [ "$(prop tiercache@tc0.service Result)" = success ] \
        || fail "tiercache@tc0 ended with Result=$(prop tiercache@tc0.service Result) after detach"
    mkdir -p /run/mnt
    mount -o ro "$(disk origin)" /run/mnt || fail "mounting the origin after detach"
    sed 's#  /srv/#  /run/mnt/#' $STATE/manifest >$STATE/manifest-origin
    verify_files $STATE/manifest-origin "on the origin after detach"
    umount /run/mnt
    timeout 60 systemctl start tiercache@tc0.service \
        || fail "systemctl start tiercache@tc0 after detach exited with $?"
    local state
    state="ActiveState=$(prop tiercache@tc0.service ActiveState) Result=$(prop tiercache@tc0.service Result)"
    [ "$state" = "ActiveState=inactive Result=exec-condition" ] \
        || { show_status tiercache@tc0.service; fail "tiercache@tc0 after detach: $state"; }
    systemctl is-failed --quiet tiercache@tc0.service && fail "tiercache@tc0 failed after detach"
    wait_journal tiercache@tc0.service "no cache named 'tc0' is registered"
    log "after detach: tiercache@tc0 skipped, not failed ($state)"
    journalctl -b -u tiercache@tc0.service --no-pager | tail -3 | sed 's/^/    /'
}

# The one report of this boot (check's, or the deadline's if check did not
# finish): the journal, the summary line, NAME.done; then power off.
report() { # VERDICT NAME
    mkdir $STATE/reported 2>/dev/null || return 0
    journalctl -b --no-pager -o short-monotonic >"$RESULTS/$2.journal" 2>&1
    echo "$1 $2 $(awk '{ printf "%.1f", $1 }' /proc/uptime)" >>$RESULTS/summary
    touch "$RESULTS/$2.done"
    sync
    systemctl poweroff --force --force
}

name=${2:?usage: systemd.sh prepare|check|deadline NAME}
case "$1" in
    prepare)
        front=$(front_of "$name") || exit 1
        ( set -e; prepare_volume "$front"; install_units "$front" "$name" ) 2>&1 \
            | tee -a "$RESULTS/$name.log"
        rc=${PIPESTATUS[0]}
        if [ "$rc" -ne 0 ]; then
            echo "FAIL $name $(awk '{ printf "%.1f", $1 }' /proc/uptime)" >>$RESULTS/summary
            touch "$RESULTS/$name.done"
        fi
        exit "$rc"
        ;;
    check)
        front=$(front_of "$name") || exit 1
        log "systemd reached the check: $(systemctl is-system-running)" | tee -a "$RESULTS/$name.log"
        ( set -e; check_boot "$front"; check_detached_skips "$front" ) 2>&1 \
            | tee -a "$RESULTS/$name.log"
        if [ "${PIPESTATUS[0]}" -eq 0 ]; then report PASS "$name"; else report FAIL "$name"; fi
        ;;
    deadline)
        sleep "${3:?}"
        { echo "FAILED: the check did not finish within $3 s of systemd's start; jobs:"
          systemctl list-jobs --no-pager; } 2>&1 | tee -a "$RESULTS/$name.log"
        report FAIL "$name"
        ;;
    *) echo "usage: systemd.sh prepare|check|deadline NAME" >&2; exit 2 ;;
esac
