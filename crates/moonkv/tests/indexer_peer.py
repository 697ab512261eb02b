"""An engine peer for tests/indexer.rs: publishes vLLM-format (tagged maps, 4-frame replay
replies) or SGLang-format (tagged arrays, 3-frame replay replies) KV events with pyzmq and
msgpack, driven by JSON commands on stdin, one answer line per command on stdout.

Commands: {"op": "wait_sub"} (until a subscriber's subscription arrives), {"op": "store",
"hashes", "parent", "tokens", "medium"}, {"op": "remove", "hashes", "medium"}, {"op": "clear"},
{"op": "drop"} (the next batch gets a sequence number and a place in the replay ring but is not
sent), {"op": "query", "url", "body"} (POST /query in MessagePack with the token ids as one
little-endian int32 bin; answers the decoded reply), {"op": "exit"}.
"""

from __future__ import annotations

import argparse
import array
import json
import queue
import sys
import threading
import time
import urllib.request

import msgpack
import zmq


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--format", choices=["vllm", "sglang"], required=True)
    ap.add_argument("--block-size", type=int, required=True)
    args = ap.parse_args()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)  # an XPUB shows when a subscriber's subscription arrives
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    ready = {
        "event": "ready",
        "endpoint": pub.getsockopt_string(zmq.LAST_ENDPOINT),
        "replay": router.getsockopt_string(zmq.LAST_ENDPOINT),
    }
    print(json.dumps(ready), flush=True)

    commands: queue.Queue = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put({"op": "exit"})

    threading.Thread(target=read_stdin, daemon=True).start()

    seq = 0
    ring: list[tuple[int, bytes]] = []
    drop_next = False
    subscribed = False
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(pub, zmq.POLLIN)

    def event_stored(c):
        if args.format == "vllm":
            return {
                "type": "BlockStored",
                "block_hashes": c["hashes"],
                "parent_block_hash": c.get("parent"),
                "token_ids": c["tokens"],
                "block_size": args.block_size,
                "lora_id": None,
                "medium": c.get("medium"),
                "lora_name": None,
            }
        return ["BlockStored", c["hashes"], c.get("parent"), c["tokens"], args.block_size, None, c.get("medium")]

    def event_removed(c):
        if args.format == "vllm":
            return {"type": "BlockRemoved", "block_hashes": c["hashes"], "medium": c.get("medium")}
        return ["BlockRemoved", c["hashes"], c.get("medium")]

    def event_cleared():
        return {"type": "AllBlocksCleared"} if args.format == "vllm" else ["AllBlocksCleared"]

    def publish(event) -> int:
        nonlocal seq, drop_next
        payload = msgpack.packb([time.time(), [event], 0], use_bin_type=True)
        s = seq
        seq += 1
        ring.append((s, payload))
        if drop_next:
            drop_next = False
        else:
            pub.send_multipart([b"", s.to_bytes(8, "big"), payload])
        return s

    def serve_replay() -> None:
        frames = router.recv_multipart()
        ident, start = frames[0], int.from_bytes(frames[2], "big")
        for s, payload in ring:
            if s >= start:
                if args.format == "vllm":
                    router.send_multipart([ident, b"", b"", s.to_bytes(8, "big"), payload])
                else:
                    router.send_multipart([ident, b"", s.to_bytes(8, "big"), payload])
        end = [ident, b"", b"", b"\xff" * 8, b""] if args.format == "vllm" else [ident, b"", b"\xff" * 8, b""]
        router.send_multipart(end)

    def query(c) -> dict:
        body = dict(c["body"])
        ids = array.array("i", body.pop("token_ids"))
        if sys.byteorder != "little":
            ids.byteswap()
        body["token_ids"] = ids.tobytes()
        req = urllib.request.Request(
            c["url"] + "/query",
            data=msgpack.packb(body, use_bin_type=True),
            method="POST",
            headers={"Content-Type": "application/msgpack"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"] == "application/msgpack", resp.headers
            return msgpack.unpackb(resp.read(), raw=False)

    waiting_sub = False
    while True:
        for sock, _ in poller.poll(20):
            if sock is router:
                serve_replay()
            elif sock is pub:
                msg = pub.recv()
                if msg[:1] == b"\x01":
                    subscribed = True
        if waiting_sub and subscribed:
            waiting_sub = False
            print(json.dumps({"ok": True}), flush=True)
        try:
            c = commands.get_nowait()
        except queue.Empty:
            continue
        op = c["op"]
        if op == "exit":
            break
        if op == "wait_sub":
            waiting_sub = True
            continue
        if op == "store":
            out = {"seq": publish(event_stored(c))}
        elif op == "remove":
            out = {"seq": publish(event_removed(c))}
        elif op == "clear":
            out = {"seq": publish(event_cleared())}
        elif op == "drop":
            drop_next = True
            out = {"ok": True}
        elif op == "query":
            out = query(c)
        else:
            out = {"error": f"unknown op {op}"}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
