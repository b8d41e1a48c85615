#!/usr/bin/env bash
# qemu-system-x86 from the Debian release of the installed qemu-utils.
#
# Our machines come with qemu-utils from bookworm or from bookworm-backports.
# qemu-system-x86 must come from the same release: a bookworm qemu-system-x86
# beside backports' qemu-utils makes apt replace qemu-utils (qemu-block-extra
# conflicts), and a plain `apt-get install qemu-system-x86/bookworm-backports`
# fails ("held broken packages"): its dependencies (qemu-system-common,
# qemu-system-data, seabios) must come from backports too, and backports'
# default priority (100) picks bookworm's. `-t RELEASE` raises the whole
# release, so every dependency is resolved from it.
#
#   scripts/qemu-install.sh            # install qemu-utils and qemu-system-x86
#   scripts/qemu-install.sh --check    # simulate (apt-get install -s) the
#                                      # install for both releases on a fresh
#                                      # machine (this one's dpkg status
#                                      # without qemu); exit 1 if either does
#                                      # not resolve to one version
#   scripts/qemu-install.sh --release  # print the release it would use
#   scripts/qemu-install.sh --ensure-backports  # add bookworm-backports to
#                                      # the apt sources if missing
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
BACKPORTS_LIST=/etc/apt/sources.list.d/tiercache-backports.list

# The release of the installed qemu-utils (bookworm when none is installed).
qemu_release() {
    case "$(dpkg-query -W -f '${Version}' qemu-utils 2>/dev/null || true)" in
        *bpo12*) echo bookworm-backports ;;
        *) echo bookworm ;;
    esac
}

# apt-get install arguments that take both packages from release $1.
install_args() {
    echo "-t $1 qemu-utils/$1 qemu-system-x86/$1"
}

ensure_backports() {
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        echo 'deb http://deb.debian.org/debian bookworm-backports main' |
            $SUDO tee "$BACKPORTS_LIST" >/dev/null
        $SUDO apt-get update -qq
    fi
}

# The dpkg status of this machine without qemu, its firmware and its
# modules (written to $1): the state of a fresh machine, whichever qemu this
# one has installed since (the guest test installs one, and a simulation of
# the other release on top of it would be a downgrade, not a fresh install).
fresh_status() {
    awk 'BEGIN { RS = ""; ORS = "\n\n" }
         $0 ~ /(^|\n)Package: (qemu-[^\n]*|seabios|ipxe-qemu)(\n|$)/ { next }
         $0 ~ /\nSource: qemu( |\n|$)/ { next }
         { print }' /var/lib/dpkg/status >"$1"
}

# Simulates the install for release $1 on a fresh machine's dpkg status and
# checks that qemu-system-x86 and qemu-utils come from one version.
check_release() {
    local r=$1 out utils system status
    status=$(mktemp)
    fresh_status "$status"
    # shellcheck disable=SC2046
    if ! out=$(apt-get install -s -o Dir::State::status="$status" $(install_args "$r") 2>&1); then
        rm -f "$status"
        echo "qemu-install: $r: apt-get install -s $(install_args "$r") does not resolve:" >&2
        echo "$out" | grep -E '^E:|Depends:|Breaks:|Conflicts:' >&2 || echo "$out" | tail -5 >&2
        return 1
    fi
    rm -f "$status"
    system=$(echo "$out" | awk '$1 == "Inst" && $2 == "qemu-system-x86"' |
             sed -E 's/^Inst qemu-system-x86 (\[[^]]*\] )?\(([^ ]+).*/\2/')
    utils=$(echo "$out" | awk '$1 == "Inst" && $2 == "qemu-utils"' |
            sed -E 's/^Inst qemu-utils (\[[^]]*\] )?\(([^ ]+).*/\2/')
    if [ -z "$system" ] || [ "$system" != "$utils" ]; then
        echo "qemu-install: $r: qemu-system-x86 '$system' and qemu-utils '$utils' differ" >&2
        return 1
    fi
    echo "qemu-install: $r resolves: qemu-utils and qemu-system-x86 $system"
}

case "${1:-}" in
    --release) qemu_release ;;
    --ensure-backports) ensure_backports ;;
    --check)
        ensure_backports
        rc=0
        for r in bookworm bookworm-backports; do check_release "$r" || rc=1; done
        exit $rc
        ;;
    "")
        r=$(qemu_release)
        [ "$r" = bookworm ] || ensure_backports
        $SUDO apt-get update -qq
        # shellcheck disable=SC2046
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            -o DPkg::Lock::Timeout=600 $(install_args "$r") >/dev/null
        ;;
    *) echo "qemu-install: unknown option $1 (--check, --release, --ensure-backports)" >&2; exit 2 ;;
esac
