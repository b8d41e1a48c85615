#!/usr/bin/env bash
# The Debian packages of the single-node Ceph cluster (scripts/ceph-up.sh)
# and of qemu-nbd's rbd driver.
#
# Ceph 16.2 (ceph-mon, ceph-mgr, ceph-osd, ceph-common) is in bookworm
# itself. The rbd block driver of qemu-nbd is in qemu-block-extra, which
# must be the exact version of the installed qemu-utils: from bookworm or,
# on machines whose qemu-utils came from there, bookworm-backports
# (scripts/qemu-install.sh --release says which; it adds backports to the
# apt sources when it is missing).
#
#   scripts/ceph-install.sh           # install what is missing (quiet)
#   scripts/ceph-install.sh --check   # simulate (apt-get install -s) the
#                                     # install for both releases on a fresh
#                                     # machine's dpkg status; exit 1 if
#                                     # either does not resolve
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
CEPH_PACKAGES="ceph-mon ceph-mgr ceph-osd ceph-common"

# apt-get install arguments for release $1 of qemu-utils.
install_args() {
    echo "$CEPH_PACKAGES qemu-block-extra/$1"
}

# True if qemu-nbd can open rbd: URLs (the driver module is installed and
# matches the qemu-utils it is loaded into).
has_rbd_driver() {
    [ "$(dpkg-query -W -f '${Version}' qemu-block-extra 2>/dev/null || true)" = \
      "$(dpkg-query -W -f '${Version}' qemu-utils 2>/dev/null || echo none)" ]
}

# This machine's dpkg status without Ceph's daemons and tools and without
# qemu (written to $1): a fresh machine's, for the simulation. The client
# libraries (librados2, librbd1) stay: fio depends on them.
fresh_status() {
    awk 'BEGIN { RS = ""; ORS = "\n\n" }
         $0 ~ /(^|\n)Package: (ceph|ceph-[^\n]*|python3-(ceph[^\n]*|rados|rbd|rgw|cephfs)|libcephfs2|libradosstriper1|librgw2|librados-dev|librbd-dev)(\n|$)/ { next }
         $0 ~ /(^|\n)Package: (qemu-[^\n]*|seabios|ipxe-qemu)(\n|$)/ { next }
         $0 ~ /\nSource: qemu( |\n|$)/ { next }
         { print }' /var/lib/dpkg/status >"$1"
}

# Simulates installing qemu-utils and everything here from release $1 on
# a fresh machine; checks that qemu-block-extra matches qemu-utils.
check_release() {
    local r=$1 out status extra utils
    status=$(mktemp)
    fresh_status "$status"
    # shellcheck disable=SC2046
    if ! out=$(apt-get install -s -o Dir::State::status="$status" \
            "qemu-utils/$r" $(install_args "$r") 2>&1); then
        rm -f "$status"
        echo "ceph-install: $r: apt-get install -s qemu-utils/$r $(install_args "$r") does not resolve:" >&2
        echo "$out" | grep -E '^E:|Depends:|Breaks:|Conflicts:' >&2 || echo "$out" | tail -5 >&2
        return 1
    fi
    rm -f "$status"
    version() {
        echo "$out" | awk -v p="$1" '$1 == "Inst" && $2 == p' |
            sed -E 's/^Inst [^ ]+ (\[[^]]*\] )?\(([^ ]+).*/\2/'
    }
    extra=$(version qemu-block-extra)
    utils=$(version qemu-utils)
    if [ -z "$extra" ] || [ "$extra" != "$utils" ]; then
        echo "ceph-install: $r: qemu-block-extra '$extra' and qemu-utils '$utils' differ" >&2
        return 1
    fi
    for p in $CEPH_PACKAGES; do
        if [ -z "$(version "$p")" ]; then
            echo "ceph-install: $r: $p would not be installed" >&2
            return 1
        fi
    done
    echo "ceph-install: $r resolves: qemu-block-extra $extra, ceph-mon $(version ceph-mon)"
}

case "${1:-}" in
    --check)
        "$here/qemu-install.sh" --ensure-backports
        rc=0
        for r in bookworm bookworm-backports; do check_release "$r" || rc=1; done
        exit $rc
        ;;
    "")
        missing=0
        for tool in ceph-mon ceph-mgr ceph-osd ceph rbd; do
            command -v "$tool" >/dev/null 2>&1 || missing=1
        done
        has_rbd_driver || missing=1
        [ "$missing" = 1 ] || exit 0
        if ! command -v qemu-nbd >/dev/null 2>&1; then
            echo "ceph-install: qemu-utils is not installed (scripts/test.sh installs it first)" >&2
            exit 1
        fi
        r=$("$here/qemu-install.sh" --release)
        [ "$r" = bookworm ] || "$here/qemu-install.sh" --ensure-backports
        echo "installing: $CEPH_PACKAGES qemu-block-extra/$r"
        $SUDO apt-get update -qq
        # shellcheck disable=SC2046
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            -o DPkg::Lock::Timeout=600 $(install_args "$r") >/dev/null
        ;;
    *) echo "ceph-install: unknown option $1 (--check)" >&2; exit 2 ;;
esac
