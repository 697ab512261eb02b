"""`moonkv indexer hash` against an independent computation of vLLM's documented block hash.

vLLM v1 (`vllm/v1/core/kv_cache_utils.py`, `sha256_cbor`): the root is
`sha256(cbor2.dumps(PYTHONHASHSEED, canonical=True))`; each full block hashes
`(parent digest, tuple(token ids), extra keys or None)` the same way, where the extra keys are
the LoRA name on every block and the cache salt on the first block. The index keeps the low 64
bits of each digest, big-endian. SGLang HiCache pages: `sha256(previous digest || tokens as
little-endian u32)`. Every vector must agree byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import subprocess

import cbor2
import pytest

from conftest import moonkv_bin


def vllm_chain(tokens, block_size, seed, lora=None, salt=None):
    def h(value):
        return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()

    root = h(seed)
    parent = root
    out = []
    for i in range(len(tokens) // block_size):
        extra = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        parent = h((parent, block, tuple(extra) if extra else None))
        out.append(parent)
    return root, out


def sglang_chain(tokens, block_size):
    prior = None
    out = []
    for i in range(len(tokens) // block_size):
        hasher = hashlib.sha256()
        if prior is not None:
            hasher.update(prior)
        for t in tokens[i * block_size : (i + 1) * block_size]:
            hasher.update(t.to_bytes(4, "little", signed=False))
        prior = hasher.digest()
        out.append(prior)
    return out


def rust_chain(tokens, block_size, profile="vllm_sha256_cbor", seed=None, lora=None, salt=None):
    args = [
        moonkv_bin(), "indexer", "hash", "--json", "--profile", profile,
        "--block-size", str(block_size), "--tokens", ",".join(map(str, tokens)),
    ]
    if seed is not None:
        args += ["--seed", seed]
    if lora is not None:
        args += ["--lora-name", lora]
    if salt is not None:
        args += ["--cache-salt", salt]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def low64(digest: bytes) -> int:
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


TOKENS = {
    "small": list(range(1, 34)),
    "wide": [0, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 151_643, 7, 7, 7, 7, 7, 7, 7],
    "long": [(i * 7919) % 152_064 for i in range(1000)],
}


@pytest.mark.parametrize("name", sorted(TOKENS))
@pytest.mark.parametrize("block_size", [1, 4, 16, 64])
@pytest.mark.parametrize("seed", ["0", "42", "12345"])
@pytest.mark.parametrize("lora,salt", [(None, None), ("sql-adapter", None), (None, "tenant-a"), ("l", "s")])
def test_vllm_sha256_cbor_agrees(name, block_size, seed, lora, salt):
    tokens = TOKENS[name]
    root, expected = vllm_chain(tokens, block_size, seed, lora, salt)
    got = rust_chain(tokens, block_size, seed=seed, lora=lora, salt=salt)
    assert got["root"] == root.hex()
    assert [b["digest"] for b in got["blocks"]] == [d.hex() for d in expected]
    assert [b["hash"] for b in got["blocks"]] == [low64(d) for d in expected]


def test_default_seed_is_zero_and_partial_blocks_are_not_hashed():
    root, expected = vllm_chain(list(range(10)), 4, "0")
    got = rust_chain(list(range(10)), 4)
    assert got["root"] == root.hex() and len(got["blocks"]) == 2
    assert [b["digest"] for b in got["blocks"]] == [d.hex() for d in expected]


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_sglang_pages_agree(block_size):
    tokens = TOKENS["long"]
    got = rust_chain(tokens, block_size, profile="sglang_sha256")
    assert got["root"] is None
    assert [b["digest"] for b in got["blocks"]] == [d.hex() for d in sglang_chain(tokens, block_size)]
