#!/usr/bin/env python3
"""Writes the KV event golden vectors used by crates/moonkv-events/tests/golden.rs.

The maps are built here independently of the Rust encoder, from the field table in
docs/events.md, and packed with the Python `msgpack` package (smallest-form integers,
str8 for 32..255-byte strings, as msgpack-c does). Run from the repository root:

    pip install msgpack
    python3 tests/peer/gen_event_golden.py          # rewrite the vectors
    python3 tests/peer/gen_event_golden.py --check  # fail if a vector differs
"""
import pathlib
import sys

import msgpack

OUT = pathlib.Path(__file__).resolve().parents[2] / "crates/moonkv-events/tests/golden"
TS = 1739145600000

CFG_A = dict(backend_id="b1", model_name="m", block_size=16, additional_salt=None,
             lora_name=None, dp_rank=0)
CFG_B = dict(backend_id="store-1", model_name=None, block_size=300, additional_salt="salt",
             lora_name="lora-7", dp_rank=2)

LEGACY = {"stored": "BlockStored", "removed": "BlockRemoved", "cleared": "AllBlocksCleared"}


def event_map(cfg, legacy, emit_key, event_id, ts, kind, tenant, key=None, group=None, medium=None):
    m = {"event_id": event_id, "timestamp": ts, "event_type": kind}
    if legacy:
        m["type"] = LEGACY[kind]
    m["model_name"] = cfg["model_name"]
    m["block_size"] = cfg["block_size"] or None
    m["additional_salt"] = cfg["additional_salt"]
    m["lora_name"] = cfg["lora_name"]
    m["tenant_id"] = tenant
    m["backend_id"] = cfg["backend_id"]
    m["medium"] = medium if kind != "cleared" else None
    m["dp_rank"] = cfg["dp_rank"]
    if kind == "cleared":
        return m
    m["group_id"] = group
    if emit_key:
        m["object_key"] = key
    m["seq_hashes"] = []
    if legacy:
        m["block_hashes"] = []
    m["base_block_idx"] = None
    if kind == "stored":
        m["parent_hash"] = None
        m["token_ids"] = None
        if legacy:
            m["parent_block_hash"] = None
    return m


def payload(cfg, events):
    return msgpack.packb([TS, events, cfg["dp_rank"]], use_bin_type=True)


def vectors():
    out = {}
    for legacy in (True, False):
        lg = "on" if legacy else "off"
        for emit_key in (True, False):
            kg = "on" if emit_key else "off"
            st = event_map(CFG_A, legacy, emit_key, 1, TS, "stored", "default", "42", "g1", "disk")
            rm = event_map(CFG_A, legacy, emit_key, 1, TS, "removed", "default", "42", None, "cpu")
            out[f"stored_legacy-{lg}_key-{kg}"] = payload(CFG_A, [st])
            out[f"removed_legacy-{lg}_key-{kg}"] = payload(CFG_A, [rm])
        cl = event_map(CFG_A, legacy, True, 1, TS, "cleared", "default")
        out[f"cleared_legacy-{lg}"] = payload(CFG_A, [cl])
    long_key = "k" * 40  # str8
    mixed = [
        event_map(CFG_B, True, True, 2**32 + 1, TS + 1, "stored", "tenant-\u00e4", long_key, "7", "cpu"),
        event_map(CFG_B, True, True, 2**32 + 2, TS + 2, "removed", "tenant-\u00e4", "x\u00ff\u6f22", None, "disk"),
        event_map(CFG_B, True, True, 2**32 + 3, TS + 3, "cleared", "tenant-\u00e4"),
    ]
    out["batch_mixed"] = payload(CFG_B, mixed)
    return out


def reference_check(vecs):
    # The reference's byte-level example is the same removed event with seq_hashes and
    # block_hashes [42] (254 bytes); ours sends both empty (keys are never parsed).
    rm = vecs["removed_legacy-on_key-on"]
    assert len(rm) == 252, len(rm)
    assert rm.count(b"\x90") == 2


def to_hex(name, data):
    lines = [f"# {name}: {len(data)} bytes; regenerate with tests/peer/gen_event_golden.py"]
    for i in range(0, len(data), 32):
        lines.append(data[i:i + 32].hex(" "))
    return "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    vecs = vectors()
    reference_check(vecs)
    OUT.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name, data in sorted(vecs.items()):
        path = OUT / f"{name}.hex"
        text = to_hex(name, data)
        if check:
            if not path.exists() or path.read_text() != text:
                print(f"differs: {path}")
                bad += 1
        else:
            path.write_text(text)
    print(f"{len(vecs)} vectors {'checked' if check else 'written'}, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
