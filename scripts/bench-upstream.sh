#!/usr/bin/env bash
# moonkv next to upstream Mooncake Store, both driven through their Python API by the same
# driver (mc_bench.py from the shared upstream tools), on one machine in one invocation.
# Not part of the test suite (.ci/run does not call it).
#
#   scripts/bench-upstream.sh [OUT_DIR]          # default OUT_DIR target/bench-upstream
#
# Environment:
#   VENV            venv holding upstream's wheel (mooncake-transfer-engine-non-cuda) and moonkv's
#                   Python package; default ~/.cache/mooncake-venv. Created by
#                   `cluster.sh venv` when missing; moonkv's package is pip-installed into it
#                   from ./crates/moonkv-py when `import moonkv` fails there.
#   MOONKV_BIN      moonkv binary (default: target/release/moonkv, built here)
#   UPSTREAM_TOOLS  directory with cluster.sh and mc_bench.py (default ../shared/tools/upstream)
#   RUNS=3          rounds; each round runs every cell once per system, the order of the
#                   systems reversed from round to round (A B C, C B A, A B C), so every pair
#                   that is compared runs next to each other and each side goes first as often
#   DURATION=3      seconds per dataplane op and size
#   CALLS=300       batch calls per batch cell
#   SMALL_N=5000    fresh keys of the single 4 KiB put/get cell
#   SEG=4294967296  bytes of the one storage segment of each system
#   CELLS           which cells, from: batch4k batch128k one4m pair dp1 dp4 small (default all
#                   seven; one4m is one 4 MiB object per call in the batch cycle, reported only
#                   beside the 32 x 128 KiB batch; pair is scripts/batch_pair.py, the two
#                   alternating call by call in one process, so both meet the same machine)
#   CLIENT_PREFIX   command put before every Python client of both systems, e.g.
#                   "taskset -c 0" to keep the client on one vCPU (default: none)
#   SKIP_RUST=1     skip the `moonkv bench store` runs of moonkv's Rust client
#   SOCKET_TOO=1    also run moonkv's client with same-host copies off (MOONKV_SAME_HOST=0) as
#                   one more system, "socket", in the same rounds: what the same-host path adds,
#                   and the figure to set against upstream's TCP path
#   SYSTEMS         which systems, in the order of odd rounds, from: socket upstream moonkv
#                   up-shm mk-standalone (default all but socket; SOCKET_TOO=1 adds it)
#   TARGET_SHM=1.5  the mk-standalone ÷ up-shm ratio each cell is held to in the results
# Every round ends with `moonkv bench memcpy` (one thread's copy rate at 1, 4, 16 and 64 MiB);
# the same-host table shows each GB/s cell as a fraction of it (a batch of 32 × 128 KiB against
# the 4 MiB copy: the bytes of one call). It also runs `moonkv bench tcp`, the loopback floor of
# one call (its bytes one way over loopback TCP, a 16-byte answer back, 1 and 4 connections);
# the socket column shows each cell as a fraction of the floor for the bytes and keys of its
# calls (a 128 × 4 KiB batch: 512 KiB per call; an existence check: a bare round trip).
# Every round also starts and ends with `moonkv bench memcpy --fresh 256MiB --threads 2`: two
# threads writing 4 MiB copies with streaming stores into memory no cache holds, as a fresh 4 MiB
# put does, and with `moonkv bench latency`: a dependent load out of 256 MiB (a cache miss) and
# one line's round trip between CPUs 0 and 1 (on the development VM 53-73 ns at some hours and
# 330 ns at others, as the host places its vCPUs). On the development VM that rate halves for
# seconds at a time, which moves the fresh
# puts with it; the results list it per round.
#   WARM=1          before the first round, write and remove about CALLS x 4 MiB + 256 MiB of
#                   fresh keys (untimed, 64 MiB objects) on each cluster, so that no round pays
#                   for first writes into its segment's pages (slow on a VM whose host backs
#                   guest memory lazily); WARM=0 skips it. Its output goes to OUT_DIR/warm.
#   PREFAULT=1      start moonkv's node with --prefault (its segment committed at start; on this
#                   VM that takes about 9 s per GiB, and the node's readiness wait must allow it)
#
# Layout: upstream = its metadata server, mooncake_master and mooncake_client (its storage
# process, SEG bytes) started by cluster.sh; moonkv = `moonkv up`: its master and one node
# (SEG bytes) in one process, what a user runs on one host (MK_SPLIT=1: `moonkv master` and
# `moonkv node` as separate processes instead). Every client holds no memory of the store, so every byte goes
# from the client process to the storage process or back. Five systems over those two clusters:
#   upstream        upstream's client, setup(..., "tcp", ...): every byte over loopback TCP
#   moonkv          moonkv's drop-in, setup(...) with global_segment_size 0: the node copies
#                   straight to and from the caller's registered buffers (same-host copies)
#   socket          the same with MOONKV_SAME_HOST=0: every byte over loopback TCP
#   up-shm          upstream's same-host path: `--dummy 127.0.0.1:21052`, setup_dummy against its
#                   storage process, buffers from alloc_from_mem_pool (shared memory that the
#                   storage process maps and copies from, MC_STORE_MEMCPY=1)
#   mk-standalone   moonkv's drop-in the same way: `--dummy` with the node's "data" address
#                   from its ready line; the node names its master, the pool is moonkv's
# up-shm against mk-standalone is the like-for-like same-host comparison; socket against
# upstream the like-for-like TCP one. moonkv's class is put under upstream's import path by a
# two-file shim package first on PYTHONPATH.
# Everything runs in a private network namespace (`unshare -n`, only 127.0.0.1), so the fixed
# ports cannot clash with anything else on the machine.
set -euo pipefail
SELF=$(readlink -f "$0")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
# shellcheck source=scripts/machine.sh
. "$ROOT/scripts/machine.sh"
cd "$ROOT"

OUT=$(mkdir -p "${1:-target/bench-upstream}" && cd "${1:-target/bench-upstream}" && pwd)
VENV=${VENV:-$HOME/.cache/mooncake-venv}
TOOLS=$(cd "${UPSTREAM_TOOLS:-$ROOT/../shared/tools/upstream}" && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-3}
CALLS=${CALLS:-300}
SMALL_N=${SMALL_N:-5000}
export SEG=${SEG:-4294967296}
export UPSTREAM_VENV=$VENV
PY=$VENV/bin/python
MC_BENCH=$TOOLS/mc_bench.py
export RUST_LOG=${RUST_LOG:-warn}

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
wait_port() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "port $1 not up" >&2
    return 1
}

# ---- set-up (with the machine's network), then the rest in a private namespace ------------
if [[ ${BENCH_UPSTREAM_NETNS:-} != 1 ]]; then
    [[ -x $VENV/bin/mooncake_master ]] || "$TOOLS/cluster.sh" venv >&2
    if ! "$PY" -c 'import moonkv' 2>/dev/null; then
        log "installing moonkv's Python package into $VENV (release build, several minutes)"
        "$VENV/bin/pip" install --quiet ./crates/moonkv-py >&2
    fi
    if [[ -z ${MOONKV_BIN:-} ]]; then
        cargo build --release -p moonkv >&2
        MOONKV_BIN=$ROOT/target/release/moonkv
    fi
    export MOONKV_BIN VENV UPSTREAM_TOOLS=$TOOLS
    exec unshare -n env BENCH_UPSTREAM_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$SELF" "$OUT"
fi

read -r -a SYSTEMS <<<"${SYSTEMS:-upstream moonkv up-shm mk-standalone}"
if [[ ${SOCKET_TOO:-} == 1 && " ${SYSTEMS[*]} " != *" socket "* ]]; then
    # next to upstream, the run it is compared with
    SYSTEMS=(socket "${SYSTEMS[@]}")
fi
for s in "${SYSTEMS[@]}"; do
    case $s in upstream | moonkv | socket | up-shm | mk-standalone) ;; *) echo "unknown system $s" >&2 && exit 2 ;; esac
done

SHIM=$OUT/shim
mkdir -p "$SHIM/mooncake" "$OUT/raw"
rm -f "$OUT"/raw/*
: >"$SHIM/mooncake/__init__.py"
printf 'from moonkv import MooncakeDistributedStore, ReplicateConfig  # noqa: F401\n' >"$SHIM/mooncake/store.py"

UP_DIR=$OUT/upstream
MK_MASTER= MK_NODE=
stop_all() {
    [[ -n $MK_NODE ]] && kill "$MK_NODE" 2>/dev/null
    [[ -n $MK_MASTER ]] && kill "$MK_MASTER" 2>/dev/null
    "$TOOLS/cluster.sh" stop "$UP_DIR" >/dev/null 2>&1
    wait 2>/dev/null || true
}
trap stop_all EXIT

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "uptime before: $(uptime)"
    echo "nproc: $(nproc)"
    echo "cpu: $(machine_cpu)"
    echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
    echo "kernel: $(uname -r)"
    echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
    echo "moonkv: $("$MOONKV_BIN" --version), binary $MOONKV_BIN, checkout $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo '?')"
    echo "moonkv python package: $("$PY" -c 'import moonkv, os; print(os.path.dirname(moonkv.__file__))')"
    echo "upstream: $("$VENV/bin/pip" show mooncake-transfer-engine-non-cuda 2>/dev/null | awk '/^Version/ {print $2}') $("$VENV/bin/mooncake_master" --version 2>&1 | grep -i -m1 'debug build' || true)"
    echo "runs: $RUNS, dataplane ${DURATION}s per op and size, batch $CALLS calls, small $SMALL_N keys, segment $SEG bytes, cells ${CELLS:-all}, systems ${SYSTEMS[*]}, client prefix '${CLIENT_PREFIX:-}', warm-up ${WARM:-1}"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt" >&2

log "starting upstream"
"$TOOLS/cluster.sh" start "$UP_DIR" >&2
log "starting moonkv"
if [[ ${MK_SPLIT:-0} == 1 ]]; then
    "$MOONKV_BIN" master --rpc-address 127.0.0.1 --rpc-port 50051 --metrics-port 9003 \
        >"$OUT/moonkv-master.log" 2>&1 &
    MK_MASTER=$!
    wait_port 50051 30
    "$MOONKV_BIN" node --master 127.0.0.1:50051 --segment-size "$SEG" ${PREFAULT:+--prefault} >"$OUT/moonkv-node.log" 2>&1 &
    MK_NODE=$!
else
    # What a user runs on one host: `moonkv up`, the master and its node in one process (the
    # event stream on, as there by default); its ready line names the node's data address.
    "$MOONKV_BIN" up --rpc-address 127.0.0.1 --rpc-port 50051 --metrics-port 9003 \
        --segment-size "$SEG" ${PREFAULT:+--prefault} >"$OUT/moonkv-node.log" 2>&1 &
    MK_NODE=$!
fi
READY_STEPS=100
[[ -n ${PREFAULT:-} ]] && READY_STEPS=1800
for _ in $(seq "$READY_STEPS"); do grep -q '"event":"ready"' "$OUT/moonkv-node.log" && break; sleep 0.1; done
grep -q '"event":"ready"' "$OUT/moonkv-node.log" || { echo "moonkv node not ready" >&2; exit 1; }
# standalone clients go through the node's data address, which it chose itself (port 0)
MK_DATA=$(grep -m1 '"event":"ready"' "$OUT/moonkv-node.log" | sed -n 's/.*"data":"\([^"]*\)".*/\1/p')
[[ -n $MK_DATA ]] || { echo "no data address in the moonkv node's ready line" >&2; exit 1; }
echo "moonkv node data address: $MK_DATA" >>"$OUT/machine.txt"

# ---- one mc_bench invocation against one system ---------------------------------------------
# run SYS ROUND CELL ARGS...: stdout (JSON lines) to raw/CELL.SYS.ROUND.jsonl, stderr beside it.
run() {
    local sys=$1 round=$2 cell=$3
    shift 3
    local base=${RAW_DIR:-$OUT/raw}/$cell.$sys.$round rc=0 MC_BENCH=$MC_BENCH
    [[ $cell == pair ]] && MC_BENCH=$ROOT/scripts/batch_pair.py
    log "round $round  $cell  $sys"
    case $sys in
    upstream)
        env -u PYTHONPATH MC_BENCH_SYS=upstream MC_TCP_BIND_ADDRESS=127.0.0.1 \
            timeout 600 "${PREFIX[@]}" "$PY" "$MC_BENCH" "$@" --master 127.0.0.1:21051 \
            --metadata http://127.0.0.1:21080/metadata >"$base.jsonl" 2>"$base.err" || rc=$? ;;
    up-shm)
        # --dummy ignores --master/--metadata: the storage process knows its master
        env -u PYTHONPATH MC_BENCH_SYS=up-shm MC_TCP_BIND_ADDRESS=127.0.0.1 \
            timeout 600 "${PREFIX[@]}" "$PY" "$MC_BENCH" "$@" --dummy 127.0.0.1:21052 \
            >"$base.jsonl" 2>"$base.err" || rc=$? ;;
    socket)
        env PYTHONPATH="$SHIM" MC_BENCH_SYS=socket MOONKV_SAME_HOST=0 \
            timeout 600 "${PREFIX[@]}" "$PY" "$MC_BENCH" "$@" --master 127.0.0.1:50051 \
            --metadata P2PHANDSHAKE >"$base.jsonl" 2>"$base.err" || rc=$? ;;
    mk-standalone)
        env PYTHONPATH="$SHIM" MC_BENCH_SYS=mk-standalone \
            timeout 600 "${PREFIX[@]}" "$PY" "$MC_BENCH" "$@" --dummy "$MK_DATA" \
            >"$base.jsonl" 2>"$base.err" || rc=$? ;;
    *)
        env PYTHONPATH="$SHIM" MC_BENCH_SYS=moonkv \
            timeout 600 "${PREFIX[@]}" "$PY" "$MC_BENCH" "$@" --master 127.0.0.1:50051 \
            --metadata P2PHANDSHAKE >"$base.jsonl" 2>"$base.err" || rc=$? ;;
    esac
    if [[ $rc != 0 ]]; then
        echo "$rc" >"$base.rc"
        log "  exit $rc: $(tail -n 2 "$base.err" | tr '\n' ' ')"
    fi
    return 0
}

read -r -a CELLS <<<"${CELLS:-batch4k batch128k one4m pair dp1 dp4 small}"
read -r -a PREFIX <<<"${CLIENT_PREFIX:-}"
cell_args() {
    case $1 in
    batch4k) echo batch --batch 128 --size 4096 --calls "$CALLS" ;;
    batch128k) echo batch --batch 32 --size 131072 --calls "$CALLS" ;;
    # one 4 MiB object per call in the batch cells' cycle (fresh keys, put, get, exists): the
    # like-for-like reference of a 32 x 128 KiB batch, which moves the same 4 MiB per call
    one4m) echo batch --batch 1 --size 4194304 --calls "$CALLS" ;;
    # both of the above, alternating call by call in one process (scripts/batch_pair.py)
    pair) echo --batch 32 --size 131072 --calls "$CALLS" ;;
    dp1) echo dataplane --sizes 1048576,4194304,16777216,67108864 --clients 1 --duration "$DURATION" ;;
    dp4) echo dataplane --sizes 1048576,4194304,16777216,67108864 --clients 4 --duration "$DURATION" ;;
    small) echo small --n "$SMALL_N" --size 4096 ;;
    esac
}

# ---- warm both clusters --------------------------------------------------------------------
# The first write into a segment page the process never touched is slow where the host backs
# guest memory lazily: about 0.16 GB/s on the development VM (docs/benchmarks.md, *First writes
# into a segment are slow on this VM*). Without this pass, the first round of whichever system
# writes first into each cluster pays for it, and its median is the worse of the two others.
# The largest footprint of fresh keys is a batch cell's (CALLS x 4 MiB); each cluster gets that
# and 256 MiB more, written and removed, capped at three quarters of its segment.
if [[ ${WARM:-1} != 0 ]]; then
    WARM_OBJ=$((64 << 20))
    WARM_BYTES=$(((CALLS * 4 + 256) << 20))
    ((WARM_BYTES > SEG / 4 * 3)) && WARM_BYTES=$((SEG / 4 * 3))
    WARM_CALLS=$(((WARM_BYTES + 8 * WARM_OBJ - 1) / (8 * WARM_OBJ)))
    mkdir -p "$OUT/warm"
    for sys in upstream moonkv; do
        log "warming the $sys cluster: $WARM_CALLS untimed calls of 8 x 64 MiB fresh keys"
        RAW_DIR=$OUT/warm run "$sys" 0 warm batch --batch 8 --size "$WARM_OBJ" --calls "$WARM_CALLS"
    done
fi

# The rate of fresh writes now (see the header); `$1` names the probe in raw/.
fresh_probe() {
    "$MOONKV_BIN" bench memcpy --sizes 4MiB --fresh 256MiB --threads 2 --repeat 3 --duration 200ms \
        --json >"$OUT/raw/fresh.$1.json" 2>/dev/null || log "  fresh-write probe failed"
    # and what a cache miss and a line passed between the two CPUs cost now (see the header)
    "$MOONKV_BIN" bench latency --spans 256MiB --loads 500000 --round-trips 100000 --json \
        >"$OUT/raw/latency.$1.json" 2>/dev/null || log "  latency probe failed"
}

T0=$(date +%s)
for ((r = 1; r <= RUNS; r++)); do
    order=("${SYSTEMS[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#SYSTEMS[@]} - 1; i >= 0; i--)); do order+=("${SYSTEMS[i]}"); done
    fi
    fresh_probe "$r.start"
    for cell in "${CELLS[@]}"; do
        read -r -a a <<<"$(cell_args "$cell")"
        for sys in "${order[@]}"; do run "$sys" "$r" "$cell" "${a[@]}"; done
    done
    fresh_probe "$r.end"
    # the machine's copy rate in this round: the ceiling of the same-host cells
    log "round $r  memcpy probe"
    "$MOONKV_BIN" bench memcpy --sizes 1MiB,4MiB,16MiB,64MiB --json >"$OUT/raw/memcpy.$r.json" 2>/dev/null ||
        log "  memcpy probe failed"
    # the loopback TCP floor of one call of each size: the ceiling of the socket cells
    log "round $r  loopback probe"
    "$MOONKV_BIN" bench tcp --sizes 0,4KiB,512KiB,1MiB,4MiB,16MiB,64MiB --clients 1,4 --json \
        >"$OUT/raw/tcp.$r.json" 2>/dev/null || log "  loopback probe failed"
done
log "python cells done in $(($(date +%s) - T0)) s"

# ---- moonkv's Rust client against the same moonkv cluster, once ----------------------------
if [[ ${SKIP_RUST:-} != 1 ]]; then
    log "moonkv bench store (Rust client)"
    {
        "$MOONKV_BIN" bench store --master 127.0.0.1:50051 --batch 128 --sizes 4KiB,128KiB --calls 40
        "$MOONKV_BIN" bench store --master 127.0.0.1:50051 --batch 32 --sizes 128KiB --calls 40
        "$MOONKV_BIN" bench store --master 127.0.0.1:50051 --sizes 4KiB,1MiB,4MiB,16MiB,64MiB \
            --concurrency 1,4 --duration "${DURATION}s" --no-tcp-probe
    } >"$OUT/rust-bench.txt" 2>"$OUT/rust-bench.err" || echo "moonkv bench store failed: $(tail -n 2 "$OUT/rust-bench.err")" >&2
fi
echo "uptime after: $(uptime)" >>"$OUT/machine.txt"
log "total $(($(date +%s) - T0)) s"

# ---- medians and ratios ---------------------------------------------------------------------
# Per cell, first the same-host table (mk-standalone ÷ up-shm, the like-for-like comparison when
# both run on one host, with moonkv's default client and the TCP pair beside it), then moonkv ÷
# upstream against the targets of issues 11 and 12. A table is printed when both of its systems ran.
TARGET_SHM=${TARGET_SHM:-1.5} "$PY" - "$OUT" <<'PYEOF' | tee "$OUT/results.md"
import glob, json, os, statistics, sys
out = sys.argv[1]
TARGET_SHM = float(os.environ["TARGET_SHM"])
rows = {}      # (cell, op, size, clients) -> sys -> round -> record
failed = []
for path in sorted(glob.glob(os.path.join(out, "raw", "*.jsonl"))):
    cell, system, rnd = os.path.basename(path)[: -len(".jsonl")].split(".")
    rc_path = path[: -len(".jsonl")] + ".rc"
    if os.path.exists(rc_path):
        err = open(path[: -len(".jsonl")] + ".err").read().strip().splitlines()
        failed.append((cell, system, rnd, open(rc_path).read().strip(), err[-1] if err else ""))
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        key = (cell, d["op"], d["size"], d["clients"])
        rows.setdefault(key, {}).setdefault(system, {})[rnd] = d

TARGET = {
    ("batch4k", "batch_put_from"): ("keys/s", 3.0, "≥3× (#11), ≥2× (#12)"),
    ("batch4k", "batch_get_into"): ("keys/s", 3.0, "≥3× (#11), ≥2× (#12)"),
    ("batch4k", "batch_exists"): ("keys/s", 2.0, "≥2× (#12)"),
    ("batch128k", "batch_put_from"): ("GB/s", 2.0, "≥2× (#11, #12)"),
    ("batch128k", "batch_get_into"): ("GB/s", 2.0, "≥2× (#11, #12)"),
    ("batch128k", "batch_exists"): ("keys/s", None, "–"),
    ("dp1", "put"): ("GB/s", 2.0, "≥1× (#11), ≥2× (#12)"),
    ("dp1", "get"): ("GB/s", 2.0, "≥1× (#11), ≥2× (#12)"),
    ("dp4", "put"): ("GB/s", 2.0, "≥1× (#11), ≥2× (#12)"),
    ("dp4", "get"): ("GB/s", 2.0, "≥1× (#11), ≥2× (#12)"),
    ("small", "put"): ("ops/s", 2.0, "≥2× (#11)"),
    ("small", "get"): ("ops/s", 2.0, "≥2× (#11)"),
    ("small", "exists"): ("ops/s", None, "–"),
}
TITLE = {
    "batch4k": "batch of 128 × 4 KiB (`batch --batch 128 --size 4096`)",
    "batch128k": "batch of 32 × 128 KiB (`batch --batch 32 --size 131072`)",
    "dp1": "single objects, 1 client thread (`dataplane --clients 1`)",
    "dp4": "single objects, 4 client threads sharing one store (`dataplane --clients 4`)",
    "small": "single 4 KiB objects, fresh keys, one thread (`small --size 4096`)",
}
OPS = ["batch_put_from", "batch_get_into", "batch_exists", "put", "get", "exists"]

def metric(d, unit):
    return d["gb_per_s"] if unit == "GB/s" else d["keys_per_s"]

def fmt(v, unit):
    if v is None:
        return "–"
    return f"{v:.3f}" if unit == "GB/s" else f"{v:,.0f}"

def size_label(n):
    for u, s in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= u and n % u == 0:
            return f"{n // u} {s}"
    return str(n)

def med(recs, f):
    vals = [f(d) for d in recs.values() if f(d) is not None]
    return statistics.median(vals) if vals else None

def ratio(a, b):
    return a / b if a and b else None

def xs(r):
    return "%.2f×" % r if r else "–"

def per_round(a, b, unit):
    # the quotient within each round: how far one round moves the ratio
    rr = [metric(a[r], unit) / metric(b[r], unit) for r in a if r in b and metric(b[r], unit)]
    return ("%.2f–%.2f" % (min(rr), max(rr))) if rr else "–"

def p50(recs):
    v = med(recs, lambda d: d["p50_us"])
    return "–" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"

def errors(recs):
    return sum(d["errors"] for d in recs.values())

# the memcpy probe of every round (`moonkv bench memcpy --json`): size -> median GB/s
copies = {}
for path in glob.glob(os.path.join(out, "raw", "memcpy.*.json")):
    for line in open(path):
        if line.startswith("{"):
            d = json.loads(line)
            copies.setdefault(d["size"], []).append(d["gb_per_s"])
MEMCPY = {size: statistics.median(v) for size, v in copies.items()}

# the loopback probe of every round (`moonkv bench tcp --json`): (size, clients) -> medians
floors = {}
for path in glob.glob(os.path.join(out, "raw", "tcp.*.json")):
    for line in open(path):
        if line.startswith("{"):
            d = json.loads(line)
            floors.setdefault((d["size"], d["clients"]), []).append(d)
LOOPBACK = {k: (statistics.median(d["gb_per_s"] for d in v), statistics.median(d["calls_per_s"] for d in v))
            for k, v in floors.items()}

def call_shape(cell, op, size):
    # (bytes one way, keys, client threads) of one call of a cell
    keys = {"batch4k": 128, "batch128k": 32}.get(cell, 1)
    clients = 4 if cell == "dp4" else 1
    if "exist" in op:
        return 0, keys, clients
    return size * keys, keys, clients

def of_loopback(cell, op, size, value, unit):
    # a socket cell as a fraction of the loopback floor of calls of its shape
    if value is None:
        return None
    nbytes, keys, clients = call_shape(cell, op, size)
    floor = LOOPBACK.get((nbytes, clients))
    if not floor:
        return None
    gb, calls = floor
    limit = gb if unit == "GB/s" else calls * keys
    return value / limit if limit else None

def pct(f):
    return "–" if f is None else f"{100 * f:.0f}%"

def of_memcpy_f(cell, size, gbps, unit):
    # a same-host GB/s cell as a fraction of one thread's memcpy of the bytes of one call
    if unit != "GB/s" or gbps is None:
        return None
    call = size * 32 if cell == "batch128k" else size
    m = MEMCPY.get(call)
    return gbps / m if m else None

def of_memcpy(cell, size, gbps, unit):
    return pct(of_memcpy_f(cell, size, gbps, unit))

def has(per, *systems):
    return all(per.get(s) for s in systems)

summary = []   # (cell, op, size, ratio) of mk-standalone ÷ up-shm
summary28 = [] # (cell, op, size, over issue 28's same-host line: ≥2× up-shm or ≥85% of memcpy)
socket28 = []  # (cell, op, size, socket ÷ TCP, socket ÷ loopback, over issue 28's socket line)
order = ["batch4k", "batch128k", "dp1", "dp4", "small"]
for cell in order:
    keys = sorted(k for k in rows if k[0] == cell)
    if not keys:
        continue
    keys.sort(key=lambda k: (k[2], OPS.index(k[1])))
    print(f"\n#### {TITLE[cell]}\n")

    if any(has(rows[k], "mk-standalone", "up-shm") for k in keys):
        print(f"Same host: mk-standalone (moonkv, setup_dummy through its node) ÷ up-shm (upstream, setup_dummy"
              f" through its storage process); target ≥{TARGET_SHM:g}×. Beside it: moonkv's default client"
              f" (same-host copies) ÷ up-shm, and socket (MOONKV_SAME_HOST=0) ÷ upstream over TCP.\n")
        print("| op | size | mk-standalone | up-shm | unit | **× up-shm** (medians) | × per round, min–max "
              "| mk-standalone p50 µs | up-shm p50 µs | errors st/shm | "
              f"≥{TARGET_SHM:g}× | mk-standalone ÷ memcpy | up-shm ÷ memcpy | moonkv | moonkv ÷ up-shm | socket | upstream TCP | socket ÷ TCP | socket ÷ loopback |")
        print("|---|--:|--:|--:|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|")
        for k in keys:
            _, op, size, clients = k
            unit = TARGET.get((cell, op), ("keys/s",))[0]
            per = rows[k]
            st, shm = per.get("mk-standalone", {}), per.get("up-shm", {})
            m = lambda s: med(per.get(s, {}), lambda d: metric(d, unit))
            r = ratio(m("mk-standalone"), m("up-shm"))
            if r is not None:
                summary.append((cell, op, size, r))
                summary28.append((cell, op, size, r >= 2.0 or (of_memcpy_f(cell, size, m("mk-standalone"), unit) or 0) >= 0.85))
            sock = ratio(m("socket"), m("upstream"))
            floor = of_loopback(cell, op, size, m("socket"), unit)
            if sock is not None:
                socket28.append((cell, op, size, sock, floor, sock >= 2.0 or (floor or 0) >= 0.85))
            verdict = "–" if r is None else ("met" if r >= TARGET_SHM else "**missed**")
            print(f"| {op} | {size_label(size)} | {fmt(m('mk-standalone'), unit)} | {fmt(m('up-shm'), unit)} | {unit} | "
                  f"**{xs(r)}** | {per_round(st, shm, unit)} | "
                  f"{p50(st)} | {p50(shm)} | "
                  f"{errors(st)}/{errors(shm)} | {verdict} | "
                  f"{of_memcpy(cell, size, m('mk-standalone'), unit)} | {of_memcpy(cell, size, m('up-shm'), unit)} | "
                  f"{fmt(m('moonkv'), unit)} | {xs(ratio(m('moonkv'), m('up-shm')))} | "
                  f"{fmt(m('socket'), unit)} | {fmt(m('upstream'), unit)} | {xs(ratio(m('socket'), m('upstream')))} | "
                  f"{pct(of_loopback(cell, op, size, m('socket'), unit))} |")
        print()

    if any(has(rows[k], "moonkv", "upstream") for k in keys):
        print("moonkv's default client ÷ upstream's client over TCP, against the targets of issues 11 and 12.\n")
        print("| op | size | moonkv | upstream | unit | × upstream (medians) | × per round, min–max | moonkv p50 µs | upstream p50 µs | errors mk/up | target | | moonkv, socket only | × socket only |")
        print("|---|--:|--:|--:|---|--:|--:|--:|--:|--:|---|---|--:|--:|")
        for k in keys:
            _, op, size, clients = k
            unit, need, tlabel = TARGET.get((cell, op), ("keys/s", None, "–"))
            per = rows[k]
            mk, up = per.get("moonkv", {}), per.get("upstream", {})
            m = med(mk, lambda d: metric(d, unit))
            u = med(up, lambda d: metric(d, unit))
            r = ratio(m, u)
            sk = med(per.get("socket", {}), lambda d: metric(d, unit))
            verdict = ""
            if r is not None and need is not None:
                if cell in ("dp1", "dp4"):
                    verdict = ("#11 met" if r >= 1.0 else "#11 **missed**") + ", " + ("#12 met" if r >= 2.0 else "#12 **missed**")
                elif cell == "batch4k" and op != "batch_exists":
                    verdict = ("#11 met" if r >= 3.0 else "#11 **missed**") + ", " + ("#12 met" if r >= 2.0 else "#12 **missed**")
                else:
                    verdict = "met" if r >= need else "**missed**"
            print(f"| {op} | {size_label(size)} | {fmt(m, unit)} | {fmt(u, unit)} | {unit} | {xs(r)} | "
                  f"{per_round(mk, up, unit)} | "
                  f"{p50(mk)} | {p50(up)} | "
                  f"{errors(mk)}/{errors(up)} | {tlabel} | {verdict} | "
                  f"{fmt(sk, unit)} | {xs(ratio(m, sk))} |")
        print()

    for k in keys:
        for s, recs in rows[k].items():
            f = next((d["first_error"] for d in recs.values() if d.get("first_error")), None)
            if f:
                print(f"{s} {k[1]} {size_label(k[2])}: {errors(recs)} errors, first `{f}`\n")

# the fresh-write probe at the start and end of every round: round -> [start, end] GB/s
fresh = {}
for path in sorted(glob.glob(os.path.join(out, "raw", "fresh.*.json"))):
    round_, when = os.path.basename(path).split(".")[1:3]
    for line in open(path):
        if line.startswith("{"):
            fresh.setdefault(int(round_), {})[when] = json.loads(line)["gb_per_s"]
if fresh:
    print("\nfresh-write probe (`moonkv bench memcpy --sizes 4MiB --fresh 256MiB --threads 2`: two threads, "
          "streaming stores into memory no cache holds), GB/s at the start and end of each round: "
          + ", ".join(f"round {r} {v.get('start', float('nan')):.1f} / {v.get('end', float('nan')):.1f}"
                      for r, v in sorted(fresh.items())) + ".")
# the latency probe beside it: round -> when -> (ns per load out of 256 MiB, ns per line round trip)
lat = {}
for path in sorted(glob.glob(os.path.join(out, "raw", "latency.*.json"))):
    round_, when = os.path.basename(path).split(".")[1:3]
    for line in open(path):
        if line.startswith("{"):
            d = json.loads(line)
            slot = lat.setdefault(int(round_), {}).setdefault(when, [None, None])
            slot[0 if d["op"] == "load" else 1] = d["ns"]
if lat:
    f = lambda v: "–" if v is None else f"{v:.0f}"
    print("\nlatency probe (`moonkv bench latency --spans 256MiB`: a dependent load out of 256 MiB, and one line's round trip between CPUs 0 and 1), ns at the start and end of each round: "
          + ", ".join(f"round {r} " + " / ".join(f"{f(v.get(w, [None, None])[0])} and {f(v.get(w, [None, None])[1])}" for w in ("start", "end"))
                      for r, v in sorted(lat.items())) + ".")
if MEMCPY:
    print("\nmemcpy probe (`moonkv bench memcpy`, one thread), median of the rounds: "
          + ", ".join(f"{size_label(k)} {v:.2f} GB/s" for k, v in sorted(MEMCPY.items())) + ".")
if summary:
    met = [x for x in summary if x[3] >= TARGET_SHM]
    print(f"\nmk-standalone ÷ up-shm ≥{TARGET_SHM:g}× in {len(met)} of {len(summary)} cells.")
    missed = [x for x in summary if x[3] < TARGET_SHM]
    if missed:
        print("Under it: " + ", ".join(f"{c} {op} {size_label(sz)} {r:.2f}×" for c, op, sz, r in missed) + ".")
if LOOPBACK:
    print("\nloopback probe (`moonkv bench tcp`, bytes per call one way, a 16-byte answer back), median of the rounds: "
          + ", ".join(f"{size_label(k[0]) if k[0] else 'round trip'} × {k[1]} {v[0]:.2f} GB/s {v[1]:,.0f} calls/s"
                      for k, v in sorted(LOOPBACK.items(), key=lambda kv: (kv[0][1], kv[0][0]))) + ".")
if summary28:
    under = [x for x in summary28 if not x[3]]
    print(f"\nIssue 28, same host (≥2× up-shm, or ≥85% of memcpy): {len(summary28) - len(under)} of {len(summary28)} cells."
          + (" Under it: " + ", ".join(f"{c} {op} {size_label(sz)}" for c, op, sz, _ in under) + "." if under else ""))
if socket28:
    under = [x for x in socket28 if not x[5]]
    print(f"Issue 28, socket (≥2× upstream TCP, or ≥85% of the loopback probe): {len(socket28) - len(under)} of {len(socket28)} cells."
          + (" Under it: " + ", ".join(f"{c} {op} {size_label(sz)} {r:.2f}× / {pct(f)}" for c, op, sz, r, f, _ in under) + "." if under else ""))
# A 32 × 128 KiB batch moves 4 MiB per call, like one 4 MiB object (issue 28 holds it to ≥80%
# of one). Two references: one 4 MiB object per call in the same fresh-key cycle (`one4m`), and
# the one-thread 4 MiB cell of `dataplane`, which rewrites one key whose bytes stay in the cache.
batch_rows = []
for system in ["mk-standalone", "moonkv", "socket", "up-shm", "upstream"]:
    for op, one_op in (("batch_put_from", "put"), ("batch_get_into", "get")):
        b = rows.get(("batch128k", op, 131072, 1), {}).get(system)
        fresh = rows.get(("one4m", op, 4194304, 1), {}).get(system)
        hot = rows.get(("dp1", one_op, 4194304, 1), {}).get(system)
        if not b or not (fresh or hot):
            continue
        g = lambda recs: med(recs, lambda d: d["gb_per_s"]) if recs else None
        gb, gf, gh = g(b), g(fresh), g(hot)
        batch_rows.append((system, op, gb, gf, gh))
if batch_rows:
    print("\nBatches against one object (GB/s medians; a 32 × 128 KiB batch and one 4 MiB object both move 4 MiB per call):\n")
    print("| system | op | 32 × 128 KiB | one 4 MiB, fresh keys (`one4m`) | batch ÷ it | one 4 MiB, rewritten (`dataplane`) | batch ÷ it |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for system, op, gb, gf, gh in batch_rows:
        print(f"| {system} | {op} | {fmt(gb, 'GB/s')} | {fmt(gf, 'GB/s')} | {pct(ratio(gb, gf))} | {fmt(gh, 'GB/s')} | {pct(ratio(gb, gh))} |")
# The same two, alternating call by call in one process (`pair`): the ratio of each round, then
# the median of those ratios, so that both sides of a ratio met the same machine.
pair_rows = []
for system in ["mk-standalone", "moonkv", "socket", "up-shm", "upstream"]:
    for op in ("batch_put_from", "batch_get_into"):
        b = rows.get(("pair", op, 131072, 1), {}).get(system)
        o = rows.get(("pair", op, 4194304, 1), {}).get(system)
        if not b or not o:
            continue
        rounds = sorted(set(b) & set(o))
        per = [ratio(b[r]["gb_per_s"], o[r]["gb_per_s"]) for r in rounds]
        per = [x for x in per if x is not None]
        if not per:
            continue
        g = lambda recs: med(recs, lambda d: d["gb_per_s"])
        pair_rows.append((system, op, g(b), g(o), statistics.median(per), min(per), max(per)))
if pair_rows:
    print("\nBatches against one object, call by call (`pair`: one 32 × 128 KiB cycle and one 4 MiB cycle per step, alternating; GB/s medians, the ratio the median of the rounds' ratios; issue 28's line is 80%):\n")
    print("| system | op | 32 × 128 KiB | one 4 MiB | batch ÷ one | rounds |")
    print("|---|---|--:|--:|--:|--:|")
    for system, op, gb, go, r, lo, hi in pair_rows:
        print(f"| {system} | {op} | {fmt(gb, 'GB/s')} | {fmt(go, 'GB/s')} | {pct(r)} | {pct(lo)}–{pct(hi)} |")
if failed:
    print("\nInvocations that exited non-zero:\n")
    for cell, system, rnd, rc, last in failed:
        print(f"- {cell} {system} round {rnd}: exit {rc}: `{last}`")
PYEOF
