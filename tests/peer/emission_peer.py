#!/usr/bin/env python3
"""Checks which events a real `moonkv master` emits, with an independent peer (pyzmq + msgpack).

Starts the master with events on, drives it through tests/peer/moonkv_client.py (a client
written from docs/protocol.md), and checks frames, types, nil-vs-absent rules, event order and
the emission table of SPEC §4 for: put, upsert, remove, batch and regex removal, RemoveAll with
and without a leased object, RemoveAll of an empty tenant, revoke, and eviction.

    python3 tests/peer/emission_peer.py path/to/moonkv

Prints "N passed, M failed" and exits non-zero on failure.
"""
import json
import os
import subprocess
import sys
import time

import msgpack
import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moonkv_client import Client, MoonkvError  # noqa: E402

OBJECT_NOT_FOUND = -704
PER_OBJECT_ONLY = ["object_key", "group_id", "seq_hashes", "block_hashes", "base_block_idx"]


class Stream:
    """A SUB socket that checks framing and sequence continuity of everything it reads."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.RCVTIMEO, 200)
        self.sub.connect(endpoint)
        self.last_seq = None
        self.last_event_id = 0
        self.problems = []
        # What the stream says is readable: (tenant, key, medium).
        self.available = set()

    def drain(self, want, deadline_s=10.0):
        """Reads until `want` events arrived or the deadline passed; returns them."""
        events, deadline = [], time.time() + deadline_s
        while len(events) < want and time.time() < deadline:
            try:
                frames = self.sub.recv_multipart()
            except zmq.Again:
                continue
            events.extend(self.check_message(frames))
        return events

    def quiet(self, wait_s=0.5):
        """Returns whatever arrives within `wait_s` (expected: nothing)."""
        return self.drain(10**9, wait_s)

    def check_message(self, frames):
        if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
            self.problems.append(f"bad framing {[len(f) for f in frames]}")
            return []
        seq = int.from_bytes(frames[1], "big")
        if self.last_seq is not None and seq != self.last_seq + 1:
            self.problems.append(f"sequence jumped {self.last_seq} -> {seq}")
        self.last_seq = seq
        payload = msgpack.unpackb(frames[2], raw=False)
        if not (isinstance(payload, list) and len(payload) == 3 and isinstance(payload[1], list)):
            self.problems.append(f"bad payload shape {payload!r}")
            return []
        if not 1 <= len(payload[1]) <= 64:
            self.problems.append(f"{len(payload[1])} events in one message")
        for ev in payload[1]:
            if ev["event_id"] <= self.last_event_id:
                self.problems.append(f"event id {ev['event_id']} after {self.last_event_id}")
            self.last_event_id = ev["event_id"]
            self.check_fields(ev)
            self.track(ev)
        return payload[1]

    def track(self, ev):
        kind, tenant = ev["event_type"], ev["tenant_id"]
        if kind == "cleared":
            self.available = {a for a in self.available if a[0] != tenant}
            return
        entry = (tenant, ev["object_key"], ev["medium"])
        if kind == "stored":
            self.available.add(entry)
        elif entry in self.available:
            self.available.remove(entry)
        else:
            self.problems.append(f"removed {entry} that the stream never stored")

    def check_fields(self, ev):
        kind = ev["event_type"]
        legacy = {"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}[kind]
        expect = {"type": legacy, "backend_id": "peer-backend", "model_name": None, "lora_name": None,
                  "additional_salt": None, "block_size": None, "dp_rank": 0}
        for k, v in expect.items():
            if ev.get(k, "<absent>") != v:
                self.problems.append(f"{kind}: {k}={ev.get(k, '<absent>')!r}, expected {v!r}")
        if kind == "cleared":
            if ev["medium"] is not None:
                self.problems.append("cleared with a medium")
            for k in PER_OBJECT_ONLY:
                if k in ev:
                    self.problems.append(f"cleared carries {k} (must be absent)")
            return
        if ev["medium"] not in ("cpu", "disk"):
            self.problems.append(f"medium {ev['medium']!r}")
        for k, v in {"seq_hashes": [], "block_hashes": [], "base_block_idx": None}.items():
            if ev.get(k, "<absent>") != v:
                self.problems.append(f"{kind}: {k}={ev.get(k, '<absent>')!r}")
        if "group_id" not in ev or "object_key" not in ev:
            self.problems.append(f"{kind} lacks group_id/object_key")
        if kind == "stored":
            for k in ("parent_hash", "token_ids", "parent_block_hash"):
                if ev.get(k, "<absent>") is not None:
                    self.problems.append(f"stored: {k}={ev.get(k, '<absent>')!r}")


def http_get(addr, path):
    import urllib.request
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
        return r.read().decode()


def summary(events):
    return [(e["event_type"], e.get("tenant_id"), e.get("object_key"), e.get("medium")) for e in events]


def main(binary):
    proc = subprocess.Popen(
        [binary, "master", "--rpc-port", "0", "--metrics-port", "0", "--enable-kv-events", "true",
         "--kv-events-bind-endpoint", "tcp://127.0.0.1:0", "--kv-events-backend-id", "peer-backend",
         "--default-kv-lease-ttl", "60s", "--eviction-high-watermark-ratio", "0.5", "--eviction-ratio", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    passed, failed = 0, []

    def check(name, got, want):
        nonlocal passed
        if got == want:
            passed += 1
        else:
            failed.append(f"{name}: got {got}, want {want}")

    try:
        ready = json.loads(proc.stdout.readline())
        stream = Stream(ready["kv_events"])
        c = Client(ready["rpc"])
        c.mount(1, "seg-1", 64 << 20)
        # Slow joiner: put probe objects until the subscription is live.
        for i in range(200):
            c.put("probe", f"probe-{i}", 64)
            if stream.drain(1, 0.1):
                break
        stream.quiet(0.3)
        # Events sent before the subscription was live are lost (ZMQ slow joiner): start the
        # stream's view from the master's snapshot, as docs/events.md tells subscribers to.
        snapshot = json.loads(http_get(ready["admin"], "/kv_events/snapshot"))
        stream.available = {(o["tenant_id"], o["object_key"], m) for o in snapshot["objects"] for m in o["media"]}

        c.put("default", "k1", 4096)
        check("put → stored cpu", summary(stream.drain(1)), [("stored", "default", "k1", "cpu")])

        c.put("default", "k1", 4096, upsert=True)
        check("upsert → removed then stored", summary(stream.drain(2)),
              [("removed", "default", "k1", "cpu"), ("stored", "default", "k1", "cpu")])

        c.call("Remove", "default", "k1", False)
        check("remove → removed cpu", summary(stream.drain(1)), [("removed", "default", "k1", "cpu")])

        for key in ("a1", "a2", "b1"):
            c.put("default", key, 1024)
        stream.drain(3)
        c.call("BatchRemove", "default", ["a1", "a2", "missing"], False)
        # A batch takes each shard's lock once, so events follow shard order, not key order.
        check("batch remove", sorted(summary(stream.drain(2))),
              [("removed", "default", "a1", "cpu"), ("removed", "default", "a2", "cpu")])
        removed = c.call("RemoveByRegex", "default", "^b", False)
        check("regex remove count", removed, 1)
        check("regex remove", summary(stream.drain(1)), [("removed", "default", "b1", "cpu")])

        ids = c.put_start("default", "revoked", 2048)
        c.put_revoke("default", "revoked", ids)
        check("revoke → nothing", summary(stream.quiet()), [])

        for key in ("x1", "x2"):
            c.put("t1", key, 1024)
        stream.drain(2)
        check("remove_all count", c.call("RemoveAll", "t1", False), 2)
        got = summary(stream.drain(3))
        check("remove_all → removed each, then cleared", sorted(got[:2]) + got[2:],
              [("removed", "t1", "x1", "cpu"), ("removed", "t1", "x2", "cpu"), ("cleared", "t1", None, None)])

        for key in ("y1", "y2"):
            c.put("t2", key, 1024)
        stream.drain(2)
        check("exist grants a lease", c.call("ExistKey", "t2", "y1"), True)
        check("remove_all with a leased object", c.call("RemoveAll", "t2", False), 1)
        check("leased → removed for the other only, no cleared", summary(stream.drain(2, 1.0)),
              [("removed", "t2", "y2", "cpu")])

        check("remove_all of an empty tenant", c.call("RemoveAll", "t3", False), 0)
        check("empty tenant → nothing", summary(stream.quiet()), [])

        try:
            c.call("GetReplicaList", "default", "k1")
            failed.append("k1 still readable after remove")
        except MoonkvError as e:
            check("removed object is gone", e.code, OBJECT_NOT_FOUND)

        # Eviction: 20 × 3 MiB on a 64 MiB segment crosses the 0.5 watermark.
        for i in range(20):
            try:
                c.put("ev", f"big-{i}", 3 << 20)
            except MoonkvError:
                pass
        events = stream.drain(40, 5.0)
        evicted = [e for e in events if e["event_type"] == "removed"]
        check("eviction emits removed cpu", bool(evicted) and all(e["medium"] == "cpu" for e in evicted), True)
        for e in evicted:
            try:
                c.call("GetReplicaList", e["tenant_id"], e["object_key"])
                failed.append(f"{e['object_key']} readable after its removed event")
            except MoonkvError as err:
                if err.code != OBJECT_NOT_FOUND:
                    failed.append(f"{e['object_key']}: {err}")

        # The stream's view must equal the master's placement snapshot.
        stream.quiet(0.5)
        snapshot = json.loads(http_get(ready["admin"], "/kv_events/snapshot"))
        placed = {(o["tenant_id"], o["object_key"], m) for o in snapshot["objects"] for m in o["media"]}
        check("stream view equals the master's snapshot", stream.available == placed, True)
        check("snapshot watermark is the last event id", snapshot["watermark_event_id"], stream.last_event_id)
        failed.extend(stream.problems)
    finally:
        proc.kill()
        proc.wait()
    print(f"{passed} passed, {len(failed)} failed")
    for f in failed:
        print("FAIL:", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
