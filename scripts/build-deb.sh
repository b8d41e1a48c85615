#!/usr/bin/env bash
# Builds the Debian package: target/debian/tiercache_VERSION-1_ARCH.deb.
#
#   scripts/build-deb.sh [--binary PATH] [--out DIR]
#
# Without --binary it builds the release binary first (cargo build --release
# --locked). The package holds the binary (stripped), the systemd unit, the
# udev rule as an example, the man pages and the bash, zsh and fish completions (made by the binary from
# its own command line: `tiercache manpages`, `tiercache completions`), an
# empty /etc/tiercache for NAME.env files, and the README. It has no
# maintainer scripts: installing, upgrading or removing it never touches a
# cache, an origin or the state directory (/var/lib/tiercache). After an
# install, `systemctl daemon-reload` makes systemd see the unit.
# tests/packaging.rs builds it, runs lintian on it and checks its contents.
set -euo pipefail
cd "$(dirname "$0")/.."

binary=""
out="target/debian"
while [ $# -gt 0 ]; do
    case "$1" in
        --binary) binary=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: scripts/build-deb.sh [--binary PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done
if [ -z "$binary" ]; then
    cargo build --release --locked
    binary=target/release/tiercache
fi
for tool in dpkg-deb dpkg-shlibdeps strip gzip; do
    command -v "$tool" >/dev/null || { echo "build-deb: $tool is missing (Debian packages dpkg-dev, binutils)" >&2; exit 1; }
done

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
revision=1
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
doc=$root/usr/share/doc/tiercache

install -d -m 755 "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" \
    "$root/etc/tiercache" "$root/usr/share/man/man1" "$doc" \
    "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" \
    "$root/usr/share/fish/vendor_completions.d"

install -m 755 "$binary" "$root/usr/bin/tiercache"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$root/usr/bin/tiercache"
bin=$root/usr/bin/tiercache

# The unit of contrib/, pointed at the packaged binary.
sed 's|/usr/local/bin/tiercache|/usr/bin/tiercache|g' contrib/systemd/tiercache@.service \
    > "$root/lib/systemd/system/tiercache@.service"
chmod 644 "$root/lib/systemd/system/tiercache@.service"
# The udev rule is an example, not installed active: it starts a unit for a
# name any device records, and a device anyone plugs in can record any
# name (docs/operations.md). The unit's own ExecCondition covers boot.
install -d -m 755 "$doc/examples"
install -m 644 contrib/udev/60-tiercache.rules "$doc/examples/60-tiercache.rules"

# Man pages and completions, from the binary's own definitions.
"$bin" manpages "$stage/man" >/dev/null
for page in "$stage"/man/*.1; do
    gzip -9n -c "$page" > "$root/usr/share/man/man1/$(basename "$page").gz"
done
"$bin" completions bash > "$root/usr/share/bash-completion/completions/tiercache"
"$bin" completions zsh > "$root/usr/share/zsh/vendor-completions/_tiercache"
"$bin" completions fish > "$root/usr/share/fish/vendor_completions.d/tiercache.fish"

# Documentation: the copyright file, the changelog, the README.
cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: tiercache
Source: https://github.com/tiercache/tiercache

Files: *
Copyright: 2026 the tiercache developers
License: MIT or Apache-2.0
 tiercache may be used under the terms of the MIT license or of the Apache
 License, version 2.0, at your option.
 .
 On Debian systems, the full text of the Apache License, version 2.0, is in
 /usr/share/common-licenses/Apache-2.0.
 .
 Permission is hereby granted, free of charge, to any person obtaining a copy
 of this software and associated documentation files (the "Software"), to
 deal in the Software without restriction, including without limitation the
 rights to use, copy, modify, merge, publish, distribute, sublicense, and/or
 sell copies of the Software, and to permit persons to whom the Software is
 furnished to do so, subject to the following conditions:
 .
 The above copyright notice and this permission notice shall be included in
 all copies or substantial portions of the Software.
 .
 THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
 IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
 FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
 AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
 LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING
 FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS
 IN THE SOFTWARE.
EOF
date=$(git log -1 --format=%aD 2>/dev/null || date -R)
commit=$("$bin" --version | sed -n 's/^commit //p')
cat > "$stage/changelog" <<EOF
tiercache ($version-$revision) unstable; urgency=medium

  * Built from commit $commit.

 -- tiercache developers <tiercache@lists.tiercache.org>  $date
EOF
gzip -9n -c "$stage/changelog" > "$doc/changelog.Debian.gz"
gzip -9n -c README.md > "$doc/README.md.gz"

# The libraries the binary links (libc, libssl, libgcc_s), as Depends.
mkdir -p "$stage/src/debian"
printf 'Source: tiercache\n\nPackage: tiercache\nArchitecture: any\n' > "$stage/src/debian/control"
depends=$(cd "$stage/src" && dpkg-shlibdeps -O "$bin" | sed -n 's/^shlibs:Depends=//p')
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<EOF
Package: tiercache
Version: $version-$revision
Architecture: $arch
Maintainer: tiercache developers <tiercache@lists.tiercache.org>
Installed-Size: $size
Depends: $depends
Suggests: nbd-client, libnbd-bin, librbd1
Section: admin
Priority: optional
Description: userspace block cache: a slow disk cached on a fast device
 tiercache puts a fast cache device (an SSD or NVMe partition, a file, or
 RAM) in front of a slow origin (a hard disk, a big file, a remote NBD
 export, a Ceph RBD image) and serves the pair as one cached volume, over
 NBD or as a ublk block device, as dm-cache, dm-writecache and bcache do in
 the kernel.
 .
 It has the cache modes writeback, writethrough, writearound, writeonly and
 passthrough; checksummed metadata and crash recovery that keeps every
 flushed write; background writeback; one cache for several origins; and an
 operator's command line (create, list, status, flush, set-mode, detach,
 check) with metrics and a dashboard.
EOF
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    > "$root/DEBIAN/md5sums"
chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/tiercache_${version}-${revision}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
