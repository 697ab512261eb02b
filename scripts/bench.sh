#!/usr/bin/env bash
# Runs moonkv's system benchmarks in release mode and prints one markdown report (also written
# to target/bench-results.md):
#   - master metadata rate over loopback TCP, next to the upstream master_bench figures;
#   - the loopback round-trip floor of the machine (a server that does no work);
#   - the engine's rate in-process (no network), against the issue's targets;
#   - metadata memory per resident object;
#   - event stream rate end to end, and the master's rate with events on vs off;
#   - the data plane: put/get by object size next to Redis SET/GET and raw loopback TCP. The
#     script starts a throwaway redis-server on a free port for it (installing Debian's
#     redis-server package when it is missing) and stops it at the end.
#
#   scripts/bench.sh                                        # about 10 minutes on 2 cores
#   PARTS=store scripts/bench.sh                            # only the data plane (~5 minutes)
#   DURATION=10s REPEAT=1 scripts/bench.sh                  # upstream's 10 s per shape
#   DURATION=2s REPEAT=1 OBJECTS=1000000 scripts/bench.sh   # a quick, noisier pass
#   scripts/bench.sh charts                                 # only redraw docs/charts/*.svg from
#                                                           # the figures in docs/benchmarks.md
#
# After a run, the report's comparison tables are also drawn as SVG bar charts (moonkv beside
# each comparator per cell) into target/bench-charts/ (CHARTS_OUT). Copy the figures into
# docs/benchmarks.md, then `scripts/bench.sh charts` redraws docs/charts/ from them.
#
# Benchmarks share the machine with everything else running on it: check the load average
# printed in the header before trusting a figure.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-4s}                # per over-the-wire run (upstream used 10 s)
REPEAT=${REPEAT:-3}                     # runs per wire shape, events on/off sink, data-plane cell
ENGINE_DURATION=${ENGINE_DURATION:-3s}  # per in-process shape and per loopback floor run
EVENTS_DURATION=${EVENTS_DURATION:-3s}  # per events on/off run
OBJECTS=${OBJECTS:-10000000}            # objects resident for the memory figure
EVENTS=${EVENTS:-2000000}               # events per loopback run
STORE_DURATION=${STORE_DURATION:-2s}    # per data-plane run (moonkv and Redis alike)
PARTS=${PARTS:-master,echo,engine,memory,events,store}
OUT=${OUT:-target/bench-results.md}
ENGINE_SHAPES=put:1x1,get:1x1,put:2x1,get:2x1,batch-put:1x1:b128,batch-get:1x1:b128

cargo build --release -p moonkv >&2
BIN=target/release/moonkv
if [[ ${1:-} == charts ]]; then
    exec "$BIN" bench charts --from docs/benchmarks.md --out docs/charts
fi
CHARTS_OUT=${CHARTS_OUT:-target/bench-charts}
export RUST_LOG=${RUST_LOG:-warn}
mkdir -p "$(dirname "$OUT")"

section() { printf '\n## %s\n\n' "$1"; }
want() { [[ ",$PARTS," == *",$1,"* ]]; }

# The Redis comparator: Debian's redis-server, no persistence, on a free loopback port.
REDIS_PID=
stop_redis() { if [[ -n $REDIS_PID ]]; then kill "$REDIS_PID" 2>/dev/null; wait "$REDIS_PID" 2>/dev/null || true; fi; }
trap stop_redis EXIT
start_redis() {
    if ! command -v redis-server >/dev/null; then
        echo "installing redis-server (Debian package)" >&2
        apt-get install -y redis-server >&2 || { apt-get update >&2 && apt-get install -y redis-server >&2; }
    fi
    REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
        --daemonize no --logfile '' >/dev/null &
    REDIS_PID=$!
    for _ in $(seq 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "redis-server did not start on port $REDIS_PORT" >&2
    return 1
}
if want store; then start_redis; fi
run() {
    printf '`moonkv %s`\n\n' "$*"
    "$BIN" "$@"
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if ! git diff --quiet HEAD 2>/dev/null; then commit="$commit + local changes"; fi
# shellcheck source=scripts/machine.sh
. scripts/machine.sh
cpu=$(machine_cpu)
ram=$(free -g 2>/dev/null | awk '/^Mem:/ {print $2}')

{
    echo "# moonkv benchmark results"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- commit: $commit"
    echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}, ${ram:-?} GiB RAM"
    echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

    if want master; then
        section "Master over the wire (loopback TCP, a fresh master per shape, default settings)"
        echo "A put call is PutStart + PutEnd (two round trips), a batch-put call BatchPutStart +"
        echo "BatchPutEnd; get calls are one round trip. Figures are from the median of $REPEAT runs."
        echo "Upstream: its own master_bench (2 cores, loopback, 10 s per shape), quoted from the issue."
        echo
        run bench master --spawn --duration "$DURATION" --repeat "$REPEAT" \
            --baseline scripts/upstream-master-bench.tsv
    fi

    if want echo; then
        section "Loopback round-trip floor (same client and runtime, a server that does no work)"
        run bench echo --duration "$ENGINE_DURATION" --repeat "$REPEAT"
    fi

    if want engine; then
        section "Engine in-process (no network, no serialization)"
        run bench master --in-process --duration "$ENGINE_DURATION" --shape "$ENGINE_SHAPES" \
            --baseline scripts/engine-targets.tsv --baseline-name goal
    fi

    if want memory; then
        section "Metadata memory"
        run bench memory --objects "$OBJECTS"
    fi

    if want events; then
        section "Event stream"
        run bench events --events "$EVENTS" --duration "$EVENTS_DURATION" --repeat "$REPEAT"
    fi

    if want store; then
        section "Data plane (put/get through a node over loopback TCP, Redis SET/GET, raw TCP)"
        echo "Median of $REPEAT runs per cell, moonkv and Redis interleaved; GB/s = 10^9 bytes/s."
        echo "$(redis-server --version | cut -d' ' -f1-3), no persistence, port $REDIS_PORT."
        echo
        run bench store --spawn --redis "127.0.0.1:$REDIS_PORT" --duration "$STORE_DURATION" \
            --repeat "$REPEAT"
    fi
    echo
    echo "- load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT"
"$BIN" bench charts --from "$OUT" --out "$CHARTS_OUT" >&2 || true
