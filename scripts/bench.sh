#!/usr/bin/env bash
# Runs moonkv's system benchmarks that need no data plane, in release mode, and prints one
# markdown report (also written to target/bench-results.md):
#   - master metadata rate over loopback TCP, next to the upstream master_bench figures;
#   - the loopback round-trip floor of the machine (a server that does no work);
#   - the engine's rate in-process (no network), against the issue's targets;
#   - metadata memory per resident object;
#   - event stream rate end to end, and the master's rate with events on vs off.
#
#   scripts/bench.sh                                        # about 4-5 minutes on 2 cores
#   DURATION=10s REPEAT=1 scripts/bench.sh                  # upstream's 10 s per shape
#   DURATION=2s REPEAT=1 OBJECTS=1000000 scripts/bench.sh   # a quick, noisier pass
#
# Benchmarks share the machine with everything else running on it: check the load average
# printed in the header before trusting a figure.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-4s}                # per over-the-wire run (upstream used 10 s)
REPEAT=${REPEAT:-3}                     # runs per wire shape and per events on/off sink
ENGINE_DURATION=${ENGINE_DURATION:-3s}  # per in-process shape and per loopback floor run
EVENTS_DURATION=${EVENTS_DURATION:-3s}  # per events on/off run
OBJECTS=${OBJECTS:-10000000}            # objects resident for the memory figure
EVENTS=${EVENTS:-2000000}               # events per loopback run
OUT=${OUT:-target/bench-results.md}
ENGINE_SHAPES=put:1x1,get:1x1,put:2x1,get:2x1,batch-put:1x1:b128,batch-get:1x1:b128

cargo build --release -p moonkv >&2
BIN=target/release/moonkv
export RUST_LOG=${RUST_LOG:-warn}
mkdir -p "$(dirname "$OUT")"

section() { printf '\n## %s\n\n' "$1"; }
run() {
    printf '`moonkv %s`\n\n' "$*"
    "$BIN" "$@"
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD 2>/dev/null; then commit="$commit + local changes"; fi
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
ram=$(free -g 2>/dev/null | awk '/^Mem:/ {print $2}')

{
    echo "# moonkv benchmark results"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: $commit"
    echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}, ${ram:-?} GiB RAM"
    echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

    section "Master over the wire (loopback TCP, a fresh master per shape, default settings)"
    echo "A put call is PutStart + PutEnd (two round trips), a batch-put call BatchPutStart +"
    echo "BatchPutEnd; get calls are one round trip. Figures are from the median of $REPEAT runs."
    echo "Upstream: its own master_bench (2 cores, loopback, 10 s per shape), quoted from the issue."
    echo
    run bench master --spawn --duration "$DURATION" --repeat "$REPEAT" \
        --baseline scripts/upstream-master-bench.tsv

    section "Loopback round-trip floor (same client and runtime, a server that does no work)"
    run bench echo --duration "$ENGINE_DURATION" --repeat "$REPEAT"

    section "Engine in-process (no network, no serialization)"
    run bench master --in-process --duration "$ENGINE_DURATION" --shape "$ENGINE_SHAPES" \
        --baseline scripts/engine-targets.tsv --baseline-name goal

    section "Metadata memory"
    run bench memory --objects "$OBJECTS"

    section "Event stream"
    run bench events --events "$EVENTS" --duration "$EVENTS_DURATION" --repeat "$REPEAT"
    echo
    echo "- load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
