#!/bin/bash
# Runs inside the test guest, chrooted into the host's root (read-only over
# 9p; /tmp and /run are the guest's tmpfs, /run/results is written back to
# the host). Reads the host's choices from /run/results/config.sh, runs each
# test with its own deadline and writes one line per test to
# /run/results/summary: "PASS|FAIL NAME SECONDS". Each test's output goes
# to the console and to /run/results/NAME.log.
set -uo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LC_ALL=C
RESULTS=/run/results
. $RESULTS/config.sh
cut -d' ' -f1 /proc/uptime >$RESULTS/boot
HERE=$TC_DIR/scripts/guest
. "$HERE/lib.sh"

# Deadline of one test (the host has its own for the whole run).
TEST_TIMEOUT_S=${TC_TEST_TIMEOUT:-240}

run_test() {
    local name=$1 t0 t1 rc
    echo "=== $name"
    t0=$(date +%s.%N)
    # A subshell, so a test's traps, cd and variables end with it; its own
    # process group, so a timeout ends the test's children too.
    setsid -w timeout -k 5 "$TEST_TIMEOUT_S" bash -c \
        ". '$HERE/lib.sh'; . '$HERE/tests.sh'; . '$HERE/compare.sh'; set -e; $2" \
        > >(tee "$RESULTS/$name.log") 2>&1
    rc=$?
    t1=$(date +%s.%N)
    if [ $rc -ne 0 ]; then
        # The daemons' own account of a failure (their logs live in the
        # guest's /run, gone with it).
        for f in /run/serve-*.log; do
            [ -f "$f" ] && { echo "--- $f (last 80 lines)"; tail -80 "$f"; } >>"$RESULTS/$name.log"
        done
    fi
    cleanup_all >>"$RESULTS/$name.log" 2>&1
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if [ $rc -eq 0 ]; then
        echo "PASS $name $secs" >>$RESULTS/summary
        echo "=== PASS $name ($secs s)"
    else
        [ $rc -eq 124 ] && echo "test $name ran past its deadline of $TEST_TIMEOUT_S s" | tee -a "$RESULTS/$name.log"
        echo "FAIL $name $secs" >>$RESULTS/summary
        echo "=== FAIL $name ($secs s, exit $rc)"
    fi
}

for t in $TC_TESTS; do
    case "$t" in
        run) run_test run ". '$TC_RUN_FILE'" ;;
        ext4_writeback|ext4_writethrough) run_test "$t" "test_ext4_kill ${t#ext4_}" ;;
        fio_verify_writeback|fio_verify_writethrough) run_test "$t" "test_fio_verify ${t#fio_verify_}" ;;
        ext4_restart_writeback|ext4_restart_writethrough) run_test "$t" "test_ext4_restart ${t#ext4_restart_}" ;;
        cache_set_member_fails) run_test "$t" "test_cache_set_member_fails" ;;
        # SQLite on ext4, a member lost, kill -9 throughout (issue 32).
        cache_set_crash_nbd) run_test "$t" "test_cache_set_crash nbd 3" ;;
        cache_set_crash_ublk) run_test "$t" "test_cache_set_crash ublk 6" ;;
        ublk_fio_verify_writeback|ublk_fio_verify_writethrough) run_test "$t" "test_ublk_fio_verify ${t#ublk_fio_verify_}" ;;
        # Ten kill -9 and recovery cycles under an ext4 writer: ~2-3 min.
        ublk_ext4_recover_writeback|ublk_ext4_recover_writethrough)
            TEST_TIMEOUT_S=600 run_test "$t" "test_ublk_ext4_recover ${t#ublk_ext4_recover_} 10" ;;
        # One cache, two origins, two ublk devices (issue 33).
        ublk_two_volumes) TEST_TIMEOUT_S=600 run_test "$t" "test_ublk_two_volumes" ;;
        ublk_add_volume) TEST_TIMEOUT_S=600 run_test "$t" "test_ublk_add_volume" ;;
        compare) TEST_TIMEOUT_S=2300 run_test compare "compare_all" ;;
        *) echo "FAIL $t 0 (unknown test)" >>$RESULTS/summary ;;
    esac
done
sync
touch $RESULTS/done
