#!/usr/bin/env bash
# Runs tiercache under a real kernel: boots Debian's 6.12 kernel in qemu
# (TCG, no KVM needed) and, inside it, drives `tiercache serve` with the
# kernel NBD client (ext4, kill -9 and restart, fio verify), boots it into
# the host's systemd to mount a tiercache volume from /etc/fstab
# (systemd_fstab_*, a boot each), or compares tiercache with
# dm-writecache, bcache and dm-cache (--compare).
# How it works and what each test does: docs/guest.md.
#
#   scripts/guest-test.sh                 # every guest test (~4-6 min)
#   scripts/guest-test.sh --quick         # the CI subset (scripts/test.sh)
#   scripts/guest-test.sh --compare       # kernel caches side by side (not in CI)
#   scripts/guest-test.sh --tests 'ext4_writeback fio_verify_writethrough'
#   scripts/guest-test.sh --run FILE      # run your own bash script in the guest
#
# Options: --debug (use the dev-profile binary that `cargo test` builds
# instead of `cargo build --release`), --binary PATH, --timeout SECS (whole
# guest run), --mem MIB, --keep (keep the disk images).
# Exit status: 0 when every test passed, 1 otherwise (a test failed, the
# guest did not finish in time, or it could not be started).
set -euo pipefail
# The whole script is one block, parsed before it runs: editing this file
# while a (long) run is going cannot break that run.
{
cd "$(dirname "$0")/.."
ROOT=$PWD

MODE=full
TESTS=""
RUN_FILE=""
PROFILE=release
BINARY=""
TIMEOUT=""
MEM_MIB=1536
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) MODE=quick ;;
        --compare) MODE=compare ;;
        --tests) TESTS=$2; shift ;;
        --run) RUN_FILE=$(realpath "$2"); MODE=run; shift ;;
        --debug) PROFILE=debug ;;
        --binary) BINARY=$(realpath "$2"); shift ;;
        --timeout) TIMEOUT=$2; shift ;;
        --mem) MEM_MIB=$2; shift ;;
        --keep) KEEP=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "guest-test: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$MODE" in
    quick) : "${TIMEOUT:=600}" ;;
    full|run) : "${TIMEOUT:=1200}" ;;
    compare) : "${TIMEOUT:=2400}" ;;
esac

T0=$(date +%s.%N)
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
say() { echo "guest-test [$(elapsed) s]: $*"; }
die() { echo "guest-test: FAILED: $*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
apt_install() {
    say "installing: $*"
    $SUDO apt-get update -qq
    # Another apt-get may hold the lock on a shared machine: wait for it.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
        -o DPkg::Lock::Timeout=600 "$@" >/dev/null
}

# 1. Host packages: qemu, busybox (static: it is the initramfs), the kernel
#    NBD client and the tools the guest tests run (the guest runs the host's
#    binaries over 9p, so they are installed here).
missing=()
for pair in qemu-system-x86_64:qemu-system-x86 nbd-client:nbd-client fio:fio \
            mkfs.ext4:e2fsprogs e2fsck:e2fsprogs dmsetup:dmsetup cpio:cpio \
            make-bcache:bcache-tools xz:xz-utils nbdkit:nbdkit; do
    tool=${pair%%:*}; pkg=${pair##*:}
    PATH=$PATH:/usr/sbin:/sbin command -v "$tool" >/dev/null 2>&1 || missing+=("$pkg")
done
# --compare's round counts are whole numbers (a bad one would measure nothing).
for v in TC_COMPARE_ROUNDS TC_COMPARE_SEED_ROUNDS; do
    [[ -z "${!v:-}" || "${!v}" =~ ^[0-9]+$ ]] || die "$v must be a whole number, not '${!v}'"
done
[ "${TC_COMPARE_ROUNDS:-1}" != 0 ] || die "TC_COMPARE_ROUNDS must be at least 1"
# --compare's profiles (TC_COMPARE_PERF=1) run the host's perf in the guest.
if [ "$MODE" = compare ] && [ "${TC_COMPARE_PERF:-0}" = 1 ] && ! command -v perf >/dev/null 2>&1; then
    missing+=(linux-perf)
fi
# The guest runs /usr/bin/python3 (nbd_netlink.py, the comparison table).
[ -x /usr/bin/python3 ] || missing+=(python3)
# busybox (dynamic) and busybox-static both provide /bin/busybox.
if ! [ -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
# qemu-system-x86 comes from the release of the installed qemu-utils
# (scripts/qemu-install.sh), in its own apt-get run: `-t` would otherwise
# pull the other tools from backports too.
need_qemu=0
for i in "${!missing[@]}"; do
    if [ "${missing[$i]}" = qemu-system-x86 ]; then unset 'missing[i]'; need_qemu=1; fi
done
if [ ${#missing[@]} -gt 0 ]; then
    apt_install $(printf '%s\n' "${missing[@]}" | sort -u)
fi
if [ $need_qemu = 1 ]; then
    say "installing qemu-system-x86 from $(scripts/qemu-install.sh --release)"
    scripts/qemu-install.sh
fi
export PATH=$PATH:/usr/sbin:/sbin

# 2. The kernel: the current Debian 6.12 image, downloaded once into
#    target/guest/ (apt-get download, dpkg -x), modules decompressed.
GUEST=$ROOT/target/guest
mkdir -p "$GUEST"
kernel_pkg() { apt-cache depends linux-image-6.12-amd64 2>/dev/null | awk '/Depends: linux-image-6.12/ { print $2; exit }'; }
PKG=$(kernel_pkg || true)
if [ -z "$PKG" ]; then
    $SUDO apt-get update -qq
    PKG=$(kernel_pkg || true)
fi
if [ -z "$PKG" ]; then
    # No package lists (offline): use a kernel downloaded before, if any.
    PKG=$(cd "$GUEST" && ls -d linux-image-6.12* 2>/dev/null | tail -1 || true)
    [ -n "$PKG" ] || die "no linux-image-6.12 package found (apt-cache search linux-image-6.12)"
fi
KDIR=$GUEST/$PKG
if ! [ -f "$KDIR/.extracted" ]; then
    say "downloading $PKG"
    rm -rf "$KDIR"; mkdir -p "$KDIR"
    # Stale package lists may name a version the mirror no longer has.
    (cd "$KDIR" && apt-get download -q "$PKG" >/dev/null 2>&1) \
        || { $SUDO apt-get update -qq && (cd "$KDIR" && apt-get download -q "$PKG" >/dev/null 2>&1); } \
        || die "apt-get download $PKG"
    dpkg -x "$KDIR"/*.deb "$KDIR/x"
    rm -f "$KDIR"/*.deb
    touch "$KDIR/.extracted"
fi
VMLINUZ=$(ls "$KDIR"/x/boot/vmlinuz-*)
MODDIR=$(ls -d "$KDIR"/x/lib/modules/*/kernel)

# 3. The initramfs: busybox, /init and the modules, in load order. Cached
#    under target/guest/ and rebuilt only when the kernel or init changes;
#    everything else (tiercache, the test scripts, fio, ...) the guest
#    reads from the host over 9p, so a rebuilt tiercache needs no new image.
MODULES="crc32c_generic crc32c-intel virtio_blk 9pnet_virtio 9p nbd:nbds_max=4 ublk_drv dm-mod dm-delay dm-writecache \
         dm-cache dm-cache-smq bcache ext4 overlay autofs4"
KEY=$( (echo "$PKG $MODULES"; cat scripts/guest/init /bin/busybox) | sha256sum | cut -c1-16)
INITRD=$GUEST/initramfs-$KEY.cpio
if ! [ -f "$INITRD" ]; then
    say "building the initramfs"
    STAGE=$GUEST/initramfs-stage
    rm -rf "$STAGE"; mkdir -p "$STAGE"/{bin,proc,sys,dev,host,modules}
    cp /bin/busybox "$STAGE/bin/busybox"
    install -m 755 scripts/guest/init "$STAGE/init"
    declare -A loaded=()
    : >"$STAGE/modules/order"
    # Depth first over the modules' own "depends=" lists (the package has
    # no modules.dep); built-in modules have no .ko and are skipped.
    add_module() {
        local name=$1 args=${2:-} file dep
        [ -z "${loaded[$name]:-}" ] || return 0
        loaded[$name]=1
        file=$(find "$MODDIR" \( -name "$name.ko.xz" -o -name "${name//-/_}.ko.xz" -o -name "${name//_/-}.ko.xz" \) | head -1)
        if [ -z "$file" ]; then
            grep -qE "/(${name}|${name//-/_}|${name//_/-})\.ko$" "$MODDIR/../modules.builtin" \
                || die "kernel module $name not found"
            return 0
        fi
        xz -dc "$file" >"$STAGE/modules/$name.ko"
        for dep in $(grep -a -o 'depends=[^[:cntrl:]]*' "$STAGE/modules/$name.ko" | head -1 | cut -d= -f2 | tr , ' '); do
            add_module "$dep"
        done
        echo "$name $args" >>"$STAGE/modules/order"
    }
    for spec in $MODULES; do
        add_module "${spec%%:*}" "$(echo "$spec" | sed -n 's/^[^:]*://p')"
    done
    (cd "$STAGE" && find . | cpio -o -H newc --quiet) >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$STAGE"
    find "$GUEST" -maxdepth 1 -name 'initramfs-*.cpio' ! -name "${INITRD##*/}" -delete
fi

# 4. The tiercache binary, built on the host; with the ublk front end
#    (libublk's bindgen needs libclang) except for --quick: the feature
#    build takes ~2 min on 2 cores, more than CI's guest budget.
FEATURES=(--features ublk)
if [ "$MODE" = quick ]; then
    FEATURES=()
elif ! ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1; then
    apt_install libclang-dev
fi
if [ -z "$BINARY" ]; then
    if [ "$PROFILE" = release ]; then
        say "cargo build --release ${FEATURES[*]}"
        cargo build --release --quiet "${FEATURES[@]}"
    else
        cargo build --quiet "${FEATURES[@]}"
    fi
    BINARY=$ROOT/target/$PROFILE/tiercache
fi
[ -x "$BINARY" ] || die "no tiercache binary at $BINARY"

# 4b. --compare's ublk ceilings: libublk's own example targets (null,
#     loop), built once from the libublk crate that tiercache's ublk build
#     uses (Cargo.lock's version, from cargo's registry) into target/guest/.
UBLK_EXAMPLES=""
if [ "$MODE" = compare ]; then
    ver=$(awk '$0 == "name = \"libublk\"" { getline; gsub(/"/, "", $3); print $3; exit }' Cargo.lock)
    UBLK_SRC=$GUEST/libublk-$ver
    UBLK_EXAMPLES=$UBLK_SRC/target/release/examples
    if ! [ -x "$UBLK_EXAMPLES/null" ] || ! [ -x "$UBLK_EXAMPLES/loop" ]; then
        crate=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"libublk-$ver" 2>/dev/null | head -1)
        [ -n "$crate" ] || die "libublk $ver is not in cargo's registry (cargo build --features ublk fetches it)"
        say "building libublk $ver's null and loop examples (the ublk ceilings)"
        rm -rf "$UBLK_SRC"; cp -r "$crate" "$UBLK_SRC"
        (cd "$UBLK_SRC" && cargo build --release --quiet --example null --example loop) \
            || die "building libublk's examples"
    fi
fi

# 5. Disks (sparse files; virtio-blk, serial = name) and the results share.
RUN=$GUEST/run
rm -rf "$RUN"; mkdir -p "$RUN/results" "$RUN/disks"
declare -a DISKS=()
declare -A DISK_MIB=()
disk() { # NAME SIZE_MIB
    truncate -s "$2M" "$RUN/disks/$1.img"
    DISK_MIB[$1]=$2
    DISKS+=(-drive "file=$RUN/disks/$1.img,format=raw,if=none,id=$1,cache=none,aio=threads"
           -device "virtio-blk-pci,drive=$1,serial=$1")
}
# The tests use "origin" and "cache", --compare one pair per system; a
# --run script gets both sets.
if [ "$MODE" != compare ]; then
    disk origin 512; disk cache 128
    # A cache set: two members, and two spares that replace them.
    for m in a b c d; do disk "set-$m" 48; done
fi
if [ "$MODE" = compare ] || [ "$MODE" = run ]; then
    for sys in wc bc dc tc; do disk "origin-$sys" 512; disk "cache-$sys" 128; done
    disk meta-dc 16; disk fast-nbd 128
    # The seed case's cache: it holds the whole set.
    disk cache-seed 384
fi
case "$MODE" in
    quick) : "${TESTS:=ext4_writeback ext4_restart_writeback fio_verify_writeback cache_set_member_fails cache_set_crash_nbd systemd_fstab_nbd}" ;;
    full) : "${TESTS:=ext4_writeback ext4_writethrough ext4_restart_writeback ext4_restart_writethrough fio_verify_writeback fio_verify_writethrough cache_set_member_fails cache_set_crash_nbd ublk_fio_verify_writeback ublk_ext4_recover_writeback cache_set_crash_ublk ublk_two_volumes ublk_add_volume systemd_fstab_ublk systemd_fstab_nbd}" ;;
    compare) TESTS=compare ;;
    run) TESTS=run ;;
esac
# A systemd test (scripts/guest/systemd.sh) boots the guest into the
# host's systemd: one boot each, after the boot that runs the others.
GUEST_TESTS=""
SYSTEMD_TESTS=""
for t in $TESTS; do
    case "$t" in
        systemd_*) SYSTEMD_TESTS="$SYSTEMD_TESTS $t" ;;
        *) GUEST_TESTS="$GUEST_TESTS $t" ;;
    esac
done
GUEST_TESTS=${GUEST_TESTS# }
SYSTEMD_TESTS=${SYSTEMD_TESTS# }
# The guest's /tmp is its own: a --run script travels in the results share.
[ -z "$RUN_FILE" ] || cp "$RUN_FILE" "$RUN/results/user-script.sh"
cat >"$RUN/results/config.sh" <<EOF
TC_BIN='$BINARY'
TC_DIR='$ROOT'
TC_MODE='$MODE'
TC_TESTS='$GUEST_TESTS'
TC_RUN_FILE=/run/results/user-script.sh
TC_FIO_JOB_MIB=$([ "$MODE" = quick ] && echo 8 || echo 24)
TC_UBLK_EXAMPLES='$UBLK_EXAMPLES'
EOF
# Knobs of --compare (docs/guest.md): TC_COMPARE_RUN_S, TC_COMPARE_SPAN_MIB,
# TC_COMPARE_SYSTEMS, TC_COMPARE_WORKLOADS, TC_COMPARE_PERF.
for v in $(compgen -e | grep '^TC_COMPARE_' || true); do
    printf "%s='%s'\n" "$v" "${!v}" >>"$RUN/results/config.sh"
done

# 6. Boot. The whole run has a deadline: qemu is killed (by its PID) when
#    it passes, and the run fails with a message that says so. A systemd
#    test's boot has its own too (SYSTEMD_BOOT_S, within the run's).
CONSOLE=$GUEST/console.log
DEADLINE=$(( $(date +%s) + TIMEOUT ))
SYSTEMD_BOOT_S=360
BOOT_DEADLINE=$DEADLINE
BOOT_APPEND=""
TIMED_OUT=0
boot_guest() {
BOOT_TIMEOUT_S=$((BOOT_DEADLINE - $(date +%s)))
say "booting $(basename "$VMLINUZ") (tests: ${BOOT_TESTS}; timeout ${BOOT_TIMEOUT_S} s; console in ${CONSOLE#"$ROOT"/})"
qemu-system-x86_64 -M q35 -accel tcg,thread=multi -cpu max -m "$MEM_MIB" -smp 2 \
    -kernel "$VMLINUZ" -initrd "$INITRD" -nographic -no-reboot -nic none \
    -append "console=ttyS0 quiet loglevel=4 panic=-1 tc.dir=$ROOT$BOOT_APPEND" \
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$ROOT,mount_tag=repo,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$RUN/results,mount_tag=results,security_model=none" \
    "${DISKS[@]}" </dev/null >"$CONSOLE" 2>&1 &
QEMU=$!
trap 'kill "$QEMU" 2>/dev/null || true' EXIT INT TERM
tail -n +1 -f "$CONSOLE" --pid="$QEMU" 2>/dev/null | sed -u 's/^/  | /' &
TAIL=$!
while kill -0 "$QEMU" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$BOOT_DEADLINE" ]; then
        TIMED_OUT=1
        kill "$QEMU" 2>/dev/null || true
        sleep 1; kill -9 "$QEMU" 2>/dev/null || true
        break
    fi
    sleep 1
done
QEMU_RC=0
wait "$QEMU" 2>/dev/null || QEMU_RC=$?
wait "$TAIL" 2>/dev/null || true
trap - EXIT INT TERM
}
# qemu itself can fail before the guest runs anything (TCG with
# thread=multi has aborted in iotlb_to_section while the firmware ran): that
# is no test's failure, so the guest boots once more, its first console
# kept. A guest that started its tests (wrote BOOT_MARK) is never booted
# again.
boot_guest_once_more() {
    boot_guest
    if [ "$TIMED_OUT" = 0 ] && [ "$QEMU_RC" -ne 0 ] && ! [ -f "$BOOT_MARK" ]; then
        mv "$CONSOLE" "${CONSOLE%.log}.first.log"
        say "qemu failed before the guest started (exit $QEMU_RC: $(tail -c 200 "${CONSOLE%.log}.first.log" | tail -1)); booting once more"
        boot_guest
    fi
}

# Each systemd test's boot starts from blank disks: a cache an earlier
# test left would be found by its recorded name (import --boot).
blank_disks() {
    local d
    for d in "${!DISK_MIB[@]}"; do
        rm -f "$RUN/disks/$d.img"
        truncate -s "${DISK_MIB[$d]}M" "$RUN/disks/$d.img"
    done
}

# Why a boot did not finish (none if it did, i.e. wrote DONE_MARK).
boot_failure() {
    if [ "$TIMED_OUT" = 1 ]; then
        echo "the guest did not finish within ${BOOT_TIMEOUT_S} s; it was stopped (see $CONSOLE)"
    elif ! [ -f "$DONE_MARK" ]; then
        echo "the guest stopped before finishing its tests (see $CONSOLE)"
    fi
}

declare -a BOOT_FAILURES=()
if [ -n "$GUEST_TESTS" ]; then
    BOOT_TESTS=$GUEST_TESTS BOOT_MARK=$RUN/results/boot DONE_MARK=$RUN/results/done
    boot_guest_once_more
    why=$(boot_failure)
    [ -z "$why" ] || BOOT_FAILURES+=("$why")
fi
for t in $SYSTEMD_TESTS; do
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then
        BOOT_FAILURES+=("$t: not run, the run's ${TIMEOUT} s had passed")
        continue
    fi
    blank_disks
    BOOT_TESTS=$t BOOT_MARK=$RUN/results/$t.boot DONE_MARK=$RUN/results/$t.done
    CONSOLE=$GUEST/console.$t.log
    BOOT_APPEND=" tc.systemd=$t"
    BOOT_DEADLINE=$(( $(date +%s) + SYSTEMD_BOOT_S ))
    [ "$BOOT_DEADLINE" -le "$DEADLINE" ] || BOOT_DEADLINE=$DEADLINE
    TIMED_OUT=0
    boot_guest_once_more
    why=$(boot_failure)
    [ -z "$why" ] || BOOT_FAILURES+=("$t: $why")
done

# 7. Results: the guest writes one line per test to results/summary
#    ("PASS|FAIL NAME SECONDS") and results/done when it has finished.
SUMMARY=$RUN/results/summary
echo
echo "guest results (logs in ${RUN#"$ROOT"/}/results/, consoles in ${GUEST#"$ROOT"/}/console*.log):"
pass=0; fail=0
if [ -f "$SUMMARY" ]; then
    while read -r verdict name secs; do
        printf '  %-4s %-28s %6s s\n' "$verdict" "$name" "$secs"
        if [ "$verdict" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
    done <"$SUMMARY"
fi
if [ -f "$RUN/results/boot" ]; then
    echo "  boot to tests: $(cat "$RUN/results/boot") s (guest uptime)"
fi
[ "$KEEP" = 1 ] || rm -rf "$RUN/disks"
for why in "${BOOT_FAILURES[@]}"; do
    echo "guest-test: FAILED: $why" >&2
    fail=$((fail + 1))
done
for t in $TESTS; do
    grep -q " $t " "$SUMMARY" 2>/dev/null || { echo "  MISSING $t (no result)"; fail=$((fail + 1)); }
done
echo "guest-test: $(elapsed) s in all"
echo "guest: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
exit
}
