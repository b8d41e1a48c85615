#!/usr/bin/env bash
# The whole test suite: installs what it needs (Debian packages via apt-get,
# crates via cargo), checks formatting and lints, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Real NBD clients and servers the tests drive, systemd-analyze for the
# unit file, and what tests/claims.rs puts on devices (mkfs.ext4, sfdisk,
# mkswap), reads back (blkid) and attaches (losetup), and what builds and
# lints the Debian package (tests/packaging.rs): tool -> Debian package.
missing=()
for pair in fio:fio nbdkit:nbdkit nbdinfo:libnbd-bin nbdcopy:libnbd-bin nbdsh:libnbd-bin \
            qemu-img:qemu-utils qemu-nbd:qemu-utils openssl:openssl pkg-config:pkg-config \
            systemd-analyze:systemd mkfs.ext4:e2fsprogs sfdisk:fdisk mkswap:util-linux \
            blkid:util-linux losetup:mount \
            dpkg-shlibdeps:dpkg-dev strip:binutils lintian:lintian; do
    tool=${pair%%:*}; pkg=${pair##*:}
    command -v "$tool" >/dev/null 2>&1 || missing+=("$pkg")
done
/usr/bin/python3 -c 'import nbd' >/dev/null 2>&1 || missing+=(python3-libnbd)
# The openssl crate (TLS-PSK) builds against Debian's libssl.
[ -f /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $(printf '%s\n' "${missing[@]}" | sort -u) >/dev/null
fi

# The single-node Ceph cluster of tests/ceph_rbd.rs (scripts/ceph-up.sh) and
# qemu-nbd's rbd driver, from the release of the installed qemu-utils.
./scripts/ceph-install.sh

# Headless Chromium for the dashboard test (tests/dashboard_browser.rs). If
# it truly cannot be installed, that test is skipped with a message saying so.
if ! command -v chromium >/dev/null 2>&1; then
    echo "installing: chromium"
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null; }; then
        echo "WARNING: chromium could not be installed: the dashboard browser test will be SKIPPED" >&2
        export TIERCACHE_SKIP_BROWSER="chromium could not be installed by scripts/test.sh"
    fi
fi

# One Ceph cluster for the three test binaries that need one (ceph_rbd,
# ceph_frozen, ceph_ordered: tests/common/ceph.rs), brought up in the
# background while the tests build, stopped when this script exits: ~15 s
# of bring-up and teardown each, saved twice. Idle, it costs ~1% of a core.
CEPH_SHARED=$(mktemp -d /tmp/tiercache-ceph.XXXXXX)
stop_shared_ceph() {
    wait "$CEPH_UP" 2>/dev/null || true
    ./scripts/ceph-down.sh "$CEPH_SHARED/cluster" >/dev/null 2>&1 || true
    rm -rf "$CEPH_SHARED"
}
( if ./scripts/ceph-up.sh "$CEPH_SHARED/cluster" >"$CEPH_SHARED/up.log" 2>&1; then
      touch "$CEPH_SHARED/up.done"
  else
      touch "$CEPH_SHARED/up.failed"
  fi ) </dev/null &
CEPH_UP=$!
trap stop_shared_ceph EXIT
export TIERCACHE_CEPH_CLUSTER="$CEPH_SHARED"

/usr/bin/python3 -m unittest discover -s bench/trace -p 'test_*.py'
/usr/bin/python3 -m unittest discover -s bench -p 'test_workloads.py'
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
cargo test --quiet
stop_shared_ceph
trap - EXIT
# The guest's qemu install resolves for machines with qemu-utils from
# bookworm and from bookworm-backports (apt-get install -s, both).
./scripts/qemu-install.sh --check
./scripts/ceph-install.sh --check
# tiercache under a real kernel (qemu, TCG): ext4 (kill -9, restart) and fio
# verify over the kernel NBD client; installs qemu and the kernel (docs/guest.md).
# It runs the binary `cargo test` built for the tests: the library's
# test-only parts (feature `testing`) add functions and change nothing a
# daemon does, and `--debug`'s own `cargo build` would compile the
# library again without them (109 s of a clean CI run).
./scripts/guest-test.sh --quick --binary target/debug/tiercache
