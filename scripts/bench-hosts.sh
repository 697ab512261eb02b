#!/usr/bin/env bash
# Cross-host data-plane benchmark on one machine: the master and a node in one network
# namespace ("node host"), the benchmark client in the root namespace ("client host"), joined by
# a veth pair capped at RATE with tbf, and a user-space relay (`moonkv bench relay`) that adds
# RTT on the data plane (this kernel has no netem). Needs root, iproute2 and tc.
#
#   RTTS="0.1ms 1ms" RATE=10gbit MOONKV_BIN=target/release/moonkv scripts/bench-hosts.sh OUT_DIR
#
# With UPSTREAM=1 it also starts upstream Mooncake (metadata server, master, storage process with
# a 2 GiB segment, TCP) in the same node host and runs the shared Python driver (`mc_bench.py`,
# UPSTREAM_TOOLS) against both systems through the same link and relay, interleaved per RTT:
# upstream's own client, and moonkv's drop-in over its socket path (MOONKV_SAME_HOST=0). The
# storage process advertises 10.250.0.2 for its data port (MC_TCP_BIND_ADDRESS sets the
# `tcp_data_host` of its segment descriptor), an address both namespaces hold, so the client
# host reaches the data port only through a relay on 10.250.0.2 (as moonkv's node is reached
# through the relay on 10.250.0.254). Its data listener is on every address of the node host. Needs the upstream venv (`cluster.sh venv`) with moonkv's
# package installed (`pip install ./crates/moonkv-py`).
set -euo pipefail
BIN=${MOONKV_BIN:-target/release/moonkv}
RTTS=${RTTS:-"0.1ms 1ms"}
RATE=${RATE:-10gbit}
DURATION=${DURATION:-2s}
OUT=${1:-/tmp/bench-hosts}
mkdir -p "$OUT"
NS=mkbench$$
H=mkbh$$
P=mkbp$$
cleanup() {
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    ip netns del "$NS" 2>/dev/null || true
    ip link del "$H" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$NS"
ip link add "$H" type veth peer name "$P"
ip link set "$P" netns "$NS"
ip addr add 10.250.0.254/24 dev "$H"
ip link set "$H" up
ip -n "$NS" addr add 10.250.0.1/24 dev "$P"
ip -n "$NS" link set "$P" up
ip -n "$NS" link set lo up
# The link's rate, both ways.
tc qdisc add dev "$H" root tbf rate "$RATE" burst 4mb latency 10ms
ip netns exec "$NS" tc qdisc add dev "$P" root tbf rate "$RATE" burst 4mb latency 10ms

ready() { # file field
    for _ in $(seq 200); do
        if [ -s "$1" ]; then
            python3 -c "import json,sys;print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])" "$1" "$2" && return
        fi
        sleep 0.05
    done
    echo "no ready line in $1" >&2; exit 1
}

ip netns exec "$NS" "$BIN" master --rpc-address 10.250.0.1 --rpc-port 0 --metrics-host 10.250.0.1 \
    --metrics-port 0 > "$OUT/master.out" 2> "$OUT/master.log" &
RPC=$(ready "$OUT/master.out" rpc)
PORT=17600
ip netns exec "$NS" "$BIN" node --master "$RPC" --segment-size 2GiB --data-bind "0.0.0.0:$PORT" \
    --advertise-host 10.250.0.254 > "$OUT/node.out" 2> "$OUT/node.log" &
ready "$OUT/node.out" data > /dev/null
{
    echo "# Cross-host data plane ($(date -u +%F), rate $RATE, client and node on separate hosts)"
    for RTT in $RTTS; do
        "$BIN" bench relay --listen "10.250.0.254:$PORT" --target "10.250.0.1:$PORT" --rtt "$RTT" \
            > "$OUT/relay.out" 2> "$OUT/relay.log" &
        RELAY=$!
        ready "$OUT/relay.out" relay > /dev/null
        echo
        echo "## RTT $RTT"
        echo
        echo "### single objects, 1 client"
        MOONKV_SAME_HOST=0 "$BIN" bench store --master "$RPC" --sizes 1MiB,4MiB,16MiB,64MiB \
            --concurrency 1 --duration "$DURATION" --no-tcp-probe
        echo
        echo "### batches of 128 x 4 KiB"
        MOONKV_SAME_HOST=0 "$BIN" bench store --master "$RPC" --batch 128 --sizes 4KiB --no-tcp-probe
        echo
        echo "### batches of 32 x 128 KiB"
        MOONKV_SAME_HOST=0 "$BIN" bench store --master "$RPC" --batch 32 --sizes 128KiB --no-tcp-probe
        kill "$RELAY"; wait "$RELAY" 2>/dev/null || true
    done
} | tee "$OUT/results.md"

[[ ${UPSTREAM:-} == 1 ]] || exit 0
VENV=${VENV:-$HOME/.cache/mooncake-venv}
TOOLS=${UPSTREAM_TOOLS:-$(dirname "$0")/../../shared/tools/upstream}
PY=$VENV/bin/python
SHIM=$OUT/shim
mkdir -p "$SHIM/mooncake"
: > "$SHIM/mooncake/__init__.py"
printf 'from moonkv import MooncakeDistributedStore, ReplicateConfig  # noqa: F401\n' > "$SHIM/mooncake/store.py"
export GLOG_logtostderr=1
ip -n "$NS" addr add 10.250.0.2/32 dev lo
ip addr add 10.250.0.2/32 dev "$H"
ip netns exec "$NS" "$VENV/bin/mooncake_http_metadata_server" --host 10.250.0.1 --port 21080 \
    > "$OUT/up-meta.log" 2>&1 &
sleep 1
ip netns exec "$NS" "$VENV/bin/mooncake_master" --rpc_address=10.250.0.1 --rpc_port=21051 \
    --metrics_host=10.250.0.1 --metrics_port=21003 > "$OUT/up-master.log" 2>&1 &
sleep 2
MC_TCP_BIND_ADDRESS=10.250.0.2 ip netns exec "$NS" "$VENV/bin/mooncake_client" --host=10.250.0.2 \
    --global_segment_size=2147483648 --master_server_address=10.250.0.1:21051 \
    --metadata_server=http://10.250.0.1:21080/metadata --port=21052 --protocol=tcp \
    > "$OUT/up-storage.log" 2>&1 &
for _ in $(seq 100); do grep -q "Starting real client service" "$OUT/up-storage.log" && break; sleep 0.1; done
UP_DATA=$(grep -o "listen on port [0-9]*" "$OUT/up-storage.log" | awk '{print $4}')
[[ -n $UP_DATA ]] || { echo "upstream's storage process did not start: $(tail -3 "$OUT/up-storage.log")" >&2; exit 1; }
# Its segment must name the relayed address, or the bytes would bypass the relay.
SEGMENT=$(grep -o "name 10.250.0.2:[0-9]*" "$OUT/up-storage.log" | head -1 | sed 's/name //')
curl -s "http://10.250.0.1:21080/metadata?key=mooncake%2Fram%2F${SEGMENT/:/%3A}" | grep -q '"tcp_data_host":"10.250.0.2"' \
    || { echo "upstream's segment does not advertise 10.250.0.2 for its data port" >&2; exit 1; }
mc() { # system cell args...
    local sys=$1; shift
    if [[ $sys == upstream ]]; then
        MC_TCP_BIND_ADDRESS=10.250.0.254 MC_BENCH_SYS=upstream timeout 600 "$PY" "$TOOLS/mc_bench.py" "$@" \
            --master 10.250.0.1:21051 --metadata http://10.250.0.1:21080/metadata
    else
        PYTHONPATH=$SHIM MOONKV_SAME_HOST=0 MC_BENCH_SYS=moonkv timeout 600 "$PY" "$TOOLS/mc_bench.py" "$@" \
            --master "$RPC" --metadata P2PHANDSHAKE
    fi
}
: > "$OUT/python.jsonl"
for RTT in $RTTS; do
    RELAYS=()
    "$BIN" bench relay --listen "10.250.0.254:$PORT" --target "10.250.0.1:$PORT" --rtt "$RTT" > "$OUT/relay.out" 2>> "$OUT/relay.log" &
    RELAYS+=($!)
    "$BIN" bench relay --listen "10.250.0.2:$UP_DATA" --target "10.250.0.1:$UP_DATA" --rtt "$RTT" \
        > "$OUT/relay-up.out" 2>> "$OUT/relay.log" &
    RELAYS+=($!)
    for f in "$OUT/relay.out" "$OUT/relay-up.out"; do ready "$f" relay > /dev/null; done
    for sys in upstream moonkv; do
        for cell in "dataplane --sizes 1048576,4194304,16777216,67108864 --clients 1 --duration ${DURATION%s}" \
            "batch --batch 128 --size 4096 --calls 100" "batch --batch 32 --size 131072 --calls 100"; do
            # shellcheck disable=SC2086
            mc "$sys" $cell 2> "$OUT/mc-$sys.err" | grep '^{' | sed "s/^{/{\"rtt\": \"$RTT\", /" >> "$OUT/python.jsonl" \
                || echo "$sys $cell failed: $(tail -n 2 "$OUT/mc-$sys.err")" >&2
        done
    done
    kill "${RELAYS[@]}"; wait "${RELAYS[@]}" 2>/dev/null || true
done
RATE_GBPS=$(python3 -c "import re,sys;m=re.match(r'([0-9.]+)([kmg]?)bit',sys.argv[1]);print(float(m.group(1))*{'':1,'k':1e3,'m':1e6,'g':1e9}[m.group(2)]/8e9)" "$RATE")
python3 - "$OUT/python.jsonl" "$RATE_GBPS" <<'PYEOF' | tee -a "$OUT/results.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
link = float(sys.argv[2])
def rtt_ms(r):
    return float(r.rstrip("ms")) if r.endswith("ms") else float(r.rstrip("us")) / 1000
print(f"\n## Same driver (mc_bench.py), upstream TCP vs moonkv's drop-in over its socket (link {link:.2f} GB/s)\n")
print("| RTT | cell | op | upstream | moonkv | moonkv ÷ upstream | moonkv share of link / round trips per call | errors up / mk |")
print("|---|---|---|--:|--:|--:|--:|--:|")
by = {}
for r in rows:
    cell = f"{r['size'] // 1024} KiB × {r['batch']}" if r["mode"] == "batch" else f"{r['size'] >> 20} MiB"
    by.setdefault((r["rtt"], r["mode"], cell, r["op"]), {})[r["sys"]] = r
for (rtt, mode, cell, op), s in by.items():
    up, mk = s.get("upstream"), s.get("moonkv")
    if not up or not mk:
        continue
    unit = "gb_per_s" if mode == "dataplane" else "keys_per_s"
    ratio = mk[unit] / up[unit] if up[unit] else float("inf")
    if mode == "dataplane":
        share = f"{mk['gb_per_s'] / link:.0%} of the link"
        fmt = lambda r: f"{r['gb_per_s']:.2f} GB/s"
    else:
        share = f"{mk['p50_us'] / 1000 / rtt_ms(rtt):.1f} RTT (p50 {mk['p50_us'] / 1000:.2f} ms)"
        fmt = lambda r: f"{r['keys_per_s'] / 1000:.1f}k keys/s"
    print(f"| {rtt} | {cell} | {op} | {fmt(up)} | {fmt(mk)} | {ratio:.2f}× | {share} | {up['errors']} / {mk['errors']} |")
# What the round trip itself costs a batch call: the growth of its p50 between the shortest and
# the longest RTT, in units of the RTT's growth (transmission, master calls and CPU cancel out).
rtts = sorted({r["rtt"] for r in rows}, key=rtt_ms)
if len(rtts) >= 2:
    lo, hi = rtts[0], rtts[-1]
    span = rtt_ms(hi) - rtt_ms(lo)
    print(f"\n### Round trips a batch call pays for its RTT ((p50 at {hi} - p50 at {lo}) / {span:.2f} ms)\n")
    print("| cell | op | upstream p50 ms | upstream RTTs | moonkv p50 ms | moonkv RTTs |")
    print("|---|---|--:|--:|--:|--:|")
    for (rtt, mode, cell, op), s in by.items():
        if rtt != hi or mode != "batch" or op == "batch_exists":
            continue
        base = by.get((lo, mode, cell, op), {})
        cols = []
        for sys_ in ("upstream", "moonkv"):
            a, b = base.get(sys_), s.get(sys_)
            if not a or not b:
                cols += ["–", "–"]
                continue
            cols += [f"{a['p50_us'] / 1000:.2f} → {b['p50_us'] / 1000:.2f}", f"{(b['p50_us'] - a['p50_us']) / 1000 / span:.1f}"]
        print(f"| {cell} | {op} | {' | '.join(cols)} |")
PYEOF
