#!/usr/bin/env python3
"""Checks the moonkv event stream with an independent peer: pyzmq SUB + Python msgpack.

Runs the `publish_fixture` binary of moonkv-testkit, subscribes, and verifies framing,
sequence numbers, batch shape, field names, field order and the nil-vs-absent rules of
docs/events.md. `cargo test -p moonkv-testkit --test python_peers` builds the binary and runs
this script; by hand, from the repository root (needs `pip install pyzmq msgpack`):

    cargo build -p moonkv-testkit --bin publish_fixture
    python3 tests/peer/events_peer.py [path/to/publish_fixture]

Prints "N passed, M failed" and exits non-zero on failure.
"""
import os
import subprocess
import sys

import msgpack
import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BIN = os.path.join(ROOT, "target", "debug", "publish_fixture")

ENVELOPE = ["event_id", "timestamp", "event_type", "type", "model_name", "block_size",
            "additional_salt", "lora_name", "tenant_id", "backend_id", "medium", "dp_rank"]
PER_OBJECT = ["group_id", "object_key", "seq_hashes", "block_hashes", "base_block_idx"]
STORED_TAIL = ["parent_hash", "token_ids", "parent_block_hash"]
LEGACY = {"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}


def expected_keys(kind, legacy):
    keys = ENVELOPE + ([] if kind == "cleared" else PER_OBJECT) + (STORED_TAIL if kind == "stored" else [])
    legacy_only = {"type", "block_hashes", "parent_block_hash"}
    return [k for k in keys if legacy or k not in legacy_only]


def run(binary, legacy):
    args = [binary, "tcp://127.0.0.1:0"] + ([] if legacy else ["no-legacy"])
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    failures = []
    try:
        first = proc.stdout.readline().split()
        assert first[0] == "endpoint", first
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.RCVTIMEO, 5000)
        sub.connect(first[1])
        sub.recv_multipart()  # a probe: the subscription is live
        proc.stdin.write("go\n")
        proc.stdin.flush()
        last_seq, events, done = None, [], False
        while not done:
            frames = sub.recv_multipart()
            if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
                failures.append(f"bad framing: {[len(f) for f in frames]}")
                break
            seq = int.from_bytes(frames[1], "big")
            if last_seq is not None and seq != last_seq + 1:
                failures.append(f"sequence {last_seq} -> {seq}")
            last_seq = seq
            batch = msgpack.unpackb(frames[2], raw=False)
            if not (isinstance(batch, list) and len(batch) == 3 and len(batch[1]) <= 64):
                failures.append("bad batch shape")
                continue
            if batch[2] != 0 or not isinstance(batch[0], int):
                failures.append(f"bad batch header {batch[0]!r} {batch[2]!r}")
            for ev in batch[1]:
                tenant = ev.get("tenant_id")
                if tenant == "__end__":
                    done = True
                elif tenant != "__probe__":
                    events.append(ev)
        out = proc.stdout.readline().split()
        proc.wait(timeout=10)
        if out[:1] != ["done"]:
            failures.append(f"fixture did not finish: {out}")
        failures += check_events(events, legacy)
        sub.close(0)
        ctx.term()
    finally:
        if proc.poll() is None:
            proc.kill()
    return failures


def check_events(events, legacy):
    failures = []
    if len(events) != 130:
        return [f"expected 130 events, got {len(events)}"]
    ids = [e["event_id"] for e in events]
    if ids != list(range(ids[0], ids[0] + 130)):
        failures.append("event ids not consecutive")
    for i, ev in enumerate(events):
        kind = ["stored", "removed", "cleared"][i % 3]
        if ev["event_type"] != kind:
            failures.append(f"event {i}: type {ev['event_type']}")
            continue
        if list(ev.keys()) != expected_keys(kind, legacy):
            failures.append(f"event {i} ({kind}): keys {list(ev.keys())}")
        if legacy and ev["type"] != LEGACY[kind]:
            failures.append(f"event {i}: legacy type {ev['type']}")
        want_common = {"model_name": "m", "block_size": 16, "additional_salt": None,
                       "lora_name": None, "tenant_id": "t", "backend_id": "b1", "dp_rank": 0}
        for k, v in want_common.items():
            if ev[k] != v:
                failures.append(f"event {i}: {k}={ev[k]!r}")
        if kind == "cleared":
            if ev["medium"] is not None:
                failures.append(f"event {i}: cleared medium {ev['medium']!r}")
            continue
        want = {"object_key": f"key-{i}-\u00e9", "seq_hashes": [], "base_block_idx": None,
                "medium": "cpu" if kind == "stored" else "disk",
                "group_id": "g" if kind == "stored" else None}
        if legacy:
            want["block_hashes"] = []
        if kind == "stored":
            want.update(parent_hash=None, token_ids=None)
            if legacy:
                want["parent_block_hash"] = None
        for k, v in want.items():
            if ev.get(k, "<absent>") != v:
                failures.append(f"event {i}: {k}={ev.get(k, '<absent>')!r}, want {v!r}")
    return failures


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_BIN
    passed = failed = 0
    for legacy in (True, False):
        failures = run(binary, legacy)
        name = f"fixture stream, legacy {'on' if legacy else 'off'}"
        if failures:
            failed += 1
            print(f"FAIL {name}")
            for f in failures[:20]:
                print(f"  {f}")
        else:
            passed += 1
            print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
