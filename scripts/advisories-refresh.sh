#!/usr/bin/env bash
# Refreshes advisories/ from a checkout of the RustSec advisory
# database (https://github.com/rustsec/advisory-db; CC0). CI cannot reach
# GitHub, so tests/advisories.rs checks Cargo.lock against this copy.
# Only the facts are kept: each advisory's TOML front matter (id, crate,
# date, affected and patched versions, informational kind) and a title
# line naming the id; the advisories' prose stays upstream (their `url`).
# Usage: scripts/advisories-refresh.sh PATH/TO/advisory-db
set -euo pipefail
src=${1:?usage: $0 PATH/TO/advisory-db}
cd "$(dirname "$0")/.."
out=advisories
rm -rf "$out"
mkdir -p "$out/crates"
/usr/bin/python3 - "$src" "$out" <<'PY'
import os, sys, subprocess
src, out = sys.argv[1], sys.argv[2]
count = 0
for crate in sorted(os.listdir(os.path.join(src, "crates"))):
    d = os.path.join(src, "crates", crate)
    if not os.path.isdir(d):
        continue
    for name in sorted(os.listdir(d)):
        if not name.endswith(".md"):
            continue
        text = open(os.path.join(d, name), encoding="utf-8").read()
        start = text.index("```toml\n")
        end = text.index("\n```", start + 8)
        front = text[start:end + 4]
        ident = name[:-3]
        os.makedirs(os.path.join(out, "crates", crate), exist_ok=True)
        with open(os.path.join(out, "crates", crate, name), "w", encoding="utf-8") as f:
            f.write(front + "\n\n# " + ident + " in " + crate + "\n\nSee the advisory's url.\n")
        count += 1
rev = "unknown"
try:
    rev = subprocess.run(["git", "-C", src, "log", "-1", "--format=%H %cs"],
                         capture_output=True, text=True, check=True).stdout.strip()
except Exception:
    pass
with open(os.path.join(out, "SOURCE"), "w") as f:
    f.write(f"rustsec/advisory-db {rev}: {count} advisories, front matter only\n")
print(f"{count} advisories from {rev}")
PY
