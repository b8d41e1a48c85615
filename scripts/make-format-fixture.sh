#!/usr/bin/env bash
# Makes tests/fixtures/format2-eb5101c: a cache as the release at eb5101c
# (format 2, one origin) leaves it, kept so that every later tiercache is
# tested opening and upgrading it (tests/format_upgrade.rs). Run with that
# release's binary:
#   git worktree add /tmp/old eb5101c && (cd /tmp/old && cargo build --bin tiercache)
#   scripts/make-format-fixture.sh /tmp/old/target/debug/tiercache
# The origin (8 MiB) holds "origin sector N" in every sector; through the
# cache, 256 KiB at 0 is written with "written sector N", and 512 bytes at
# 3 MiB + 1536 with "partial sector N" (a block cached in part), both
# flushed; the daemon stops cleanly with them dirty (background writeback
# off). The cache image is kept as its non-zero pages (scripts/sparse-image.py);
# the test makes the origin again from its stamps.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$(realpath "${1:?usage: make-format-fixture.sh OLD_TIERCACHE_BINARY}")
OUT=tests/fixtures/format2-eb5101c
W=$(mktemp -d)
SERVE=""
trap '[ -n "$SERVE" ] && kill "$SERVE" 2>/dev/null; rm -rf "$W"' EXIT
stamp() { # $1: tag, $2: first sector, $3: sectors -> stdout
    /usr/bin/python3 - "$@" <<'PY'
import sys
tag, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
out = bytearray()
for s in range(first, first + n):
    out += f"{tag} sector {s} ".encode().ljust(512, b".")
sys.stdout.buffer.write(out)
PY
}
stamp origin 0 16384 >"$W/origin.img"
truncate -s 4M "$W/cache.img"
"$BIN" --state-dir "$W/state" create --name fx --origin "$W/origin.img" --cache "$W/cache.img" \
    --mode writeback --block-size 4K --writeback-idle 0 --writeback-age 32767 \
    --writeback-high 90 --writeback-low 80 >/dev/null
"$BIN" --state-dir "$W/state" serve --name fx --socket "$W/fx.nbd" 2>"$W/serve.log" &
SERVE=$!
while [ ! -S "$W/fx.nbd" ]; do
    kill -0 "$SERVE" 2>/dev/null || { cat "$W/serve.log" >&2; exit 1; }
    sleep 0.05
done
stamp written 0 512 >"$W/written.bin"
stamp partial 6147 1 >"$W/partial.bin"
PATH=/usr/bin:/bin nbdsh -u "nbd+unix:///?socket=$W/fx.nbd" -c "
h.pwrite(open('$W/written.bin', 'rb').read(), 0)
h.flush()
h.pwrite(open('$W/partial.bin', 'rb').read(), 6147 * 512)
h.flush()
"
kill -TERM "$SERVE"
wait "$SERVE"
SERVE=""
"$BIN" --state-dir "$W/state" status --name fx | sed -n '1,12p'
mkdir -p "$OUT"
scripts/sparse-image.py encode "$W/cache.img" "$OUT/cache.sparse"
ls -l "$OUT"
