#!/usr/bin/env bash
# Cross-host data-plane benchmark on one machine: the master and a node in one network
# namespace ("node host"), the benchmark client in the root namespace ("client host"), joined by
# a veth pair capped at RATE with tbf, and a user-space relay (`moonkv bench relay`) that adds
# RTT on the data plane (this kernel has no netem). Needs root, iproute2 and tc.
#
#   RTTS="0.1ms 1ms" RATE=10gbit MOONKV_BIN=target/release/moonkv scripts/bench-hosts.sh OUT_DIR
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
