"""The call sequences of the inference-engine connectors (reference §6), run against the
drop-in class exactly as those connectors drive upstream's."""

from __future__ import annotations

import ctypes
import hashlib

import moonkv
from conftest import Pool, pattern


def page_hashes(tokens: list[int], page: int) -> list[str]:
    """SGLang-style keys: a sha256 chain over token pages."""
    out, prev = [], b""
    for i in range(0, len(tokens) - len(tokens) % page, page):
        prev = hashlib.sha256(prev + bytes(str(tokens[i : i + page]), "ascii")).digest()
        out.append(prev.hex())
    return out


def prefix_hits(exists: list[int]) -> int:
    hits = 0
    for e in exists:
        if e != 1:
            break
        hits += 1
    return hits


def test_sglang_hicache_sequence(tenant_store):
    store = tenant_store
    pages, page_bytes, tp = 16, 8 << 10, 0
    # The whole host KV pool is registered once: K and V halves, page-first.
    pool = Pool(store, pages * 2 * page_bytes * 2)
    half = pages * 2 * page_bytes
    model = "sglang_llama"
    hashes = page_hashes(list(range(pages * 4)), 4)
    keys, ptrs, sizes, groups = [], [], [], []
    for p, h in enumerate(hashes):
        for j, suffix in enumerate(("k", "v")):
            keys.append(f"{model}_{h}_{tp}_{suffix}")
            ptrs.append(pool.ptr + (2 * p + j) * page_bytes)
            sizes.append(page_bytes)
            groups.append(f"sglang-hicache:{h}")
            pool.write((2 * p + j) * page_bytes, pattern(keys[-1], page_bytes))
    # Warm-up like SGLang's: put 4 KiB, is_exist, get.
    assert store.put("warmup_key", b"\0" * 4096) == 0
    assert store.is_exist("warmup_key") == 1
    assert store.get("warmup_key") == b"\0" * 4096

    exists = store.batch_is_exist(keys)
    assert exists == [0] * len(keys)
    missing = [i for i, e in enumerate(exists) if e != 1]
    config = moonkv.ReplicateConfig()
    config.group_ids = [groups[i] for i in missing]
    results = store.batch_put_from([keys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing], config)
    assert results == [0] * len(missing)

    # Lookup: the longest run of consecutive hits, per page (both K and V present).
    exist = store.batch_is_exist(keys)
    assert prefix_hits(exist) == len(keys)
    assert store.remove(keys[10], force=True) == 0  # page 5's K goes away
    per_page = [min(exist_k, exist_v) for exist_k, exist_v in zip(*[iter(store.batch_is_exist(keys))] * 2)]
    assert prefix_hits(per_page) == 5

    # Prefetch the first five pages into the second half of the pool.
    dest = [pool.ptr + half + i * page_bytes for i in range(10)]
    got = store.batch_get_into(keys[:10], dest, sizes[:10])
    assert all(n > 0 for n in got) and got == sizes[:10]
    for i in range(10):
        assert pool.read(half + i * page_bytes, page_bytes) == pattern(keys[i], page_bytes)

    # clear() is remove_all().
    assert store.remove_all(True) == len(keys) - 1 + 1  # + the warm-up key
    assert store.batch_is_exist(keys) == [0] * len(keys)
    pool.close()


def test_vllm_per_layer_scatter_gather(store, key):
    layers, blocks, block_bytes = 4, 6, 16 << 10
    # One registered tensor per layer (K and V interleaved per block).
    kv_caches = [Pool(store, blocks * 2 * block_bytes) for _ in range(layers)]
    keys, addrs, sizes = [], [], []
    for b in range(blocks):
        keys.append(f"llama@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{key}{b:04x}")
        per_key_addrs, per_key_sizes = [], []
        for layer, cache in enumerate(kv_caches):
            for kv in (0, 1):
                offset = (2 * b + kv) * block_bytes
                cache.write(offset, pattern(f"{keys[-1]}/{layer}/{kv}", block_bytes))
                per_key_addrs.append(cache.ptr + offset)
                per_key_sizes.append(block_bytes)
        addrs.append(per_key_addrs)
        sizes.append(per_key_sizes)

    config = moonkv.ReplicateConfig()
    config.preferred_segments = [store.get_hostname()]
    assert store.batch_put_from_multi_buffers(keys, addrs, sizes, config) == [0] * blocks
    assert store.batch_is_exist(keys) == [1] * blocks
    expected = [b"".join(ctypes.string_at(a, s) for a, s in zip(addrs[b], sizes[b])) for b in range(blocks)]
    assert [store.get(k) for k in keys] == expected

    # Load into fresh caches: every layer's block lands where it belongs.
    fresh = [Pool(store, blocks * 2 * block_bytes) for _ in range(layers)]
    dest = [[fresh[layer].ptr + (2 * b + kv) * block_bytes for layer in range(layers) for kv in (0, 1)] for b in range(blocks)]
    got = store.batch_get_into_multi_buffers(keys, dest, sizes)
    assert got == [layers * 2 * block_bytes] * blocks
    for b in range(blocks):
        for layer in range(layers):
            for kv in (0, 1):
                offset = (2 * b + kv) * block_bytes
                assert fresh[layer].read(offset, block_bytes) == pattern(f"{keys[b]}/{layer}/{kv}", block_bytes)
    # Too little room for an object is an error for that key only.
    short = [list(s) for s in sizes]
    short[0][-1] -= 1
    got = store.batch_get_into_multi_buffers(keys[:2], dest[:2], short[:2])
    assert got[0] < 0 and got[1] == layers * 2 * block_bytes
    # An address outside the registered caches is refused for that key.
    bad = [list(d) for d in dest[:2]]
    bad[1][3] = 0x10
    got = store.batch_get_into_multi_buffers(keys[:2], bad, sizes[:2])
    assert got[0] > 0 and got[1] == -600
    assert store.batch_put_from_multi_buffers(keys[:1], [[0x10]], [[10]]) == [-600]
    assert store.batch_put_from_multi_buffers(keys[:2], addrs[:1], sizes[:2]) == [-600, -600]
    # Replaced from the fresh caches (the loaded copy, bytes changed): a put keeps the first
    # value, an upsert takes the new one.
    for p in fresh:
        p.write(0, b"\xee" * block_bytes)
    assert store.batch_put_from_multi_buffers(keys[:1], dest[:1], sizes[:1]) == [0]
    assert store.get(keys[0]) == expected[0]
    assert store.batch_upsert_from_multi_buffers(keys[:1], dest[:1], sizes[:1], config) == [0]
    assert store.get(keys[0]) == b"".join(ctypes.string_at(a, s) for a, s in zip(dest[0], sizes[0]))
    assert store.get(keys[0]) != expected[0]
    assert store.batch_upsert_from_multi_buffers(keys[:2], addrs[:1], sizes[:2]) == [-600, -600]
    for p in kv_caches + fresh:
        p.close()


def test_lmcache_put_parts_with_metadata(store, key):
    # LMCache keys: fmt@model@world_size@worker_id@chunk_hash.
    keys = [f"vllm@/models/opt-125m@1@0@{key}{i:02x}" for i in range(4)]
    chunk = 256 << 10
    metas = [i.to_bytes(4, "little") * 7 for i in range(4)]  # 28-byte chunk metadata
    assert all(len(m) == 28 for m in metas)
    config = moonkv.ReplicateConfig()
    config.replica_num = 1
    config.preferred_segment = store.get_hostname()
    for k, m in zip(keys, metas):
        assert store.put_parts(k, m, memoryview(pattern(k, chunk)), config=config) == 0
    assert all(store.is_exist(k) == 1 for k in keys)

    pool = Pool(store, 4 * (chunk + 28))
    ptrs = [pool.ptr + i * (chunk + 28) for i in range(4)]
    got = store.batch_get_into(keys, ptrs, [chunk + 28] * 4)
    assert got == [chunk + 28] * 4
    for i, k in enumerate(keys):
        assert pool.read(i * (chunk + 28), 28) == metas[i]
        assert pool.read(i * (chunk + 28) + 28, chunk) == pattern(k, chunk)
    handles = store.batch_get_buffer(keys)
    assert bytes(handles[0][:28]) == metas[0]

    # put_from of the same layout from registered memory, and the metadata-first form.
    pool.write(0, b"m" * 28 + b"d" * 100)
    assert store.put_from(key + "-zc", pool.ptr, 128) == 0
    assert store.put_from_with_metadata(key + "-meta", pool.ptr + 28, pool.ptr, 100, 28) == 0
    assert store.get(key + "-meta") == b"m" * 28 + b"d" * 100
    pool.close()


def test_get_into_ranges_buffer_major(store, key):
    a, b = f"{key}-a", f"{key}-b"
    assert store.put(a, pattern(a, 10_000)) == 0
    assert store.put(b, pattern(b, 5_000)) == 0
    pool = Pool(store, 64 << 10)
    result = store.get_into_ranges(
        [pool.ptr, pool.ptr + 32_768],
        [[a, b], [b]],
        [[[0, 100], [2000]], [[0, 4000]]],
        [[[0, 9000], [10]], [[4990, 0]]],
        [[[100, 1000], [50]], [[10, 20]]],
    )
    assert result == [[[100, 1000], [50]], [[10, 20]]]
    assert pool.read(0, 100) == pattern(a, 10_000)[:100]
    assert pool.read(100, 1000) == pattern(a, 10_000)[9000:10_000]
    assert pool.read(2000, 50) == pattern(b, 5_000)[10:60]
    assert pool.read(32_768, 10) == pattern(b, 5_000)[4990:]
    assert pool.read(32_768 + 4000, 20) == pattern(b, 5_000)[:20]
    # Past the object's end, a miss, an unregistered buffer, shapes that do not line up.
    result = store.get_into_ranges([pool.ptr, 0x10], [[a, f"{key}-absent"], [a]], [[[0], [0]], [[0]]], [[[9990], [0]], [[0]]], [[[20], [5]], [[5]]])
    assert result[0][0][0] < 0 and result[0][1][0] == -704 and result[1][0][0] == -600
    assert store.get_into_ranges([pool.ptr], [[a], [b]], [[[0]]], [[[0]]], [[[1]]]) == [[[-600]]]
    # Overlapping destinations are refused; overlapping sources are fine.
    result = store.get_into_ranges([pool.ptr], [[a, b]], [[[0], [5]]], [[[0], [0]]], [[[10], [10]]])
    assert result == [[[-600], [-600]]]
    result = store.get_into_ranges([pool.ptr], [[a]], [[[0, 100]]], [[[0, 5]]], [[[10, 10]]])
    assert result == [[[10, 10]]]
    assert pool.read(0, 10) == pattern(a, 10_000)[:10] and pool.read(100, 10) == pattern(a, 10_000)[5:15]
    pool.close()
