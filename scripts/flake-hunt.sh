#!/usr/bin/env bash
# Runs the whole test suite N times under CPU load and lists every test that
# failed at least once, with the seed and replay command it printed.
#
#   scripts/flake-hunt.sh [ROUNDS] [--load K] [--guest] [--readme] [--test NAME]...
#
# ROUNDS (default 10) rounds of `cargo test --no-fail-fast`, each with K
# (default 2) busy loops running beside it (a 2-core machine then has more
# runnable threads than cores, as a CI machine running other jobs does).
# --guest adds the quick guest test (scripts/guest-test.sh --quick --debug)
# to each round. --readme runs the README's test command instead
# (`CI=true ./scripts/test.sh`: formatting, lints, every test, the guest
# test), so one hunt also counts how often that command passes.
# --test NAME runs only that test file (repeatable).
# Logs: target/flake-hunt/round-N.log; the summary is printed and written
# to target/flake-hunt/summary.txt. Exit status 1 if any test failed.
# Installs nothing: run scripts/test.sh once first.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=10
LOAD=2
GUEST=0
README=0
TESTS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --load) LOAD=$2; shift ;;
        --guest) GUEST=1 ;;
        --readme) README=1 ;;
        --test) TESTS+=(--test "$2"); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        [0-9]*) ROUNDS=$1 ;;
        *) echo "flake-hunt: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

OUT=target/flake-hunt
rm -rf "$OUT"
mkdir -p "$OUT"
cargo test --no-run --quiet "${TESTS[@]}" 2>&1 | tail -3

LOADERS=()
stop_load() {
    for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_load EXIT
for _ in $(seq 1 "$LOAD"); do
    ( while :; do :; done ) &
    LOADERS+=($!)
done

failed_rounds=0
for r in $(seq 1 "$ROUNDS"); do
    log=$OUT/round-$r.log
    t0=$(date +%s)
    status=ok
    if [ $README = 1 ]; then
        CI=true ./scripts/test.sh </dev/null >"$log" 2>&1 || status=FAILED
    else
        cargo test --no-fail-fast "${TESTS[@]}" >"$log" 2>&1 || status=FAILED
    fi
    if [ $GUEST = 1 ] && [ $README = 0 ]; then
        ./scripts/guest-test.sh --quick --debug >>"$log" 2>&1 || status=FAILED
    fi
    echo "flake-hunt: round status $status" >>"$log"
    [ $status = ok ] || failed_rounds=$((failed_rounds + 1))
    echo "round $r of $ROUNDS: $status ($(( $(date +%s) - t0 )) s)"
done
stop_load

# Per failing test: the rounds it failed in, and the seeds it printed.
/usr/bin/python3 - "$OUT" "$ROUNDS" <<'EOF' | tee "$OUT/summary.txt"
import re, sys, pathlib
out, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
fails = {}
for r in range(1, rounds + 1):
    text = (out / f"round-{r}.log").read_text(errors="replace")
    # cargo test: a "---- NAME stdout ----" block per failed test.
    blocks = re.split(r"^---- (\S+) stdout ----$", text, flags=re.M)
    for name, body in zip(blocks[1::2], blocks[2::2]):
        body = body.split("\nfailures:")[0]
        seeds = sorted(set(re.findall(r"TIERCACHE_SEED=\d+[^\n]*", body)))
        if not seeds:
            seeds = sorted(set(re.findall(r"seed \d+", body)))[:3]
        first = next((l for l in body.splitlines() if "panicked" in l or "FAILED" in l), "")
        fails.setdefault(name, []).append((r, seeds[:3], first.strip()[:160]))
    for m in re.finditer(r"guest-test: FAILED: (.*)", text):
        fails.setdefault("guest-test", []).append((r, [], m.group(1)[:160]))
    # A failed round no test block explains (formatting, lints, an install
    # step, a test binary that crashed): its log's last lines.
    if "round status FAILED" in text and not any(
            r == run[0] for runs in fails.values() for run in runs):
        tail = [l for l in text.splitlines() if l.strip()][-3:-1]
        fails.setdefault("(round)", []).append((r, [], " | ".join(tail)[:160]))
passed = sum("round status ok" in (out / f"round-{r}.log").read_text(errors="replace")
             for r in range(1, rounds + 1))
print(f"flake hunt: {passed} of {rounds} rounds passed")
if not fails:
    print(f"flake hunt: {rounds} rounds, no test failed")
for name, runs in sorted(fails.items()):
    print(f"{name}: failed in {len(runs)} of {rounds} rounds")
    for r, seeds, first in runs:
        print(f"  round {r}: {first}")
        for s in seeds:
            print(f"    {s}")
EOF
[ $failed_rounds = 0 ]
