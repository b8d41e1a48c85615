#!/usr/bin/env bash
# The long form of the reliability suite (issue 5): every
# tests/reliability_*.rs, engine_crash_log.rs (20,000 simulated kills) and
# engine_crash.rs with TIERCACHE_LONG=1 in the release profile (200
# kill -9 cycles, 10-minute soak, minute-long race runs, ...), then every
# cargo-fuzz target in fuzz/fuzz_targets/ for FUZZ_SECONDS each through
# scripts/fuzz.sh. Each test prints its counts (cycles, sectors verified,
# operations checked); they are collected at the end.
# Usage: scripts/reliability.sh [FUZZ_SECONDS_PER_TARGET]   (default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=${1:-600}
log=target/reliability-long.log
mkdir -p target
export TIERCACHE_LONG=1

echo "== reliability tests, long form (log: $log)"
start=$(date +%s)
# One test at a time: each long test loads both cores by itself, and the
# counts come out in order. --nocapture shows them as they are printed.
status=0
cargo test --release --test 'reliability_*' --test engine_crash_log --test engine_crash -- --nocapture --test-threads=1 2>&1 | tee "$log" || status=1
echo "reliability tests: $(( $(date +%s) - start )) s"

echo "== fuzzing, ${fuzz_seconds} s per target"
start=$(date +%s)
scripts/fuzz.sh "$fuzz_seconds" 2>&1 | tee -a "$log" || status=1
echo "fuzzing: $(( $(date +%s) - start )) s"

echo "== summary"
echo "fuzz targets, in the order of their execution counts below: $(ls fuzz/fuzz_targets | sed 's/\.rs$//' | tr '\n' ' ')"
# Test verdicts, the count lines the tests print (name: counts), and the
# fuzzers' execution counts.
grep -E '^test .* \.\.\. |^test result|^[a-z][a-z0-9 -]*( [^:]*)?: .*[0-9]|number_of_executed_units' "$log" \
    | grep -vE '^(running|warning|error)' || true
if [ "$status" -ne 0 ]; then
    echo "FAILED: see $log"
fi
exit "$status"
