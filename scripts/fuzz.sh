#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ with libFuzzer on the stable
# toolchain (coverage instrumentation by -C flags; no sanitizer, which
# would need nightly). Usage: scripts/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]
# (every target in fuzz/fuzz_targets/ unless some are named).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
fi
target=x86_64-unknown-linux-gnu
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS away from build scripts.
cargo build --release --target-dir target/cov --target "$target"
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    # corpus/ grows as it runs; seeds/ holds valid handshakes and requests
    # and real cache metadata images, so the fuzzer starts past the magic
    # numbers.
    "target/cov/$target/release/$t" "corpus/$t" "seeds/$t" -artifact_prefix="artifacts/$t/" \
        -max_total_time="$seconds" -print_final_stats=1 > "artifacts/$t.log" 2>&1 || {
        echo "$t: FUZZER FAILED (crash input in artifacts/$t/, log artifacts/$t.log)"; status=1; }
    echo "$t:"
    grep -E "^stat::number_of_executed_units|^Done|crash|panicked" "artifacts/$t.log" || true
done
exit "$status"
