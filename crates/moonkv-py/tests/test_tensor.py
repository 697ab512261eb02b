"""The tensor helpers of `moonkv.MooncakeDistributedStore` (put_tensor, get_tensor, their batch,
registered-memory and tensor-parallel forms) against a real master: dtype, shape and strides
round-trip, bad objects and bad arguments answer like the rest of the drop-in."""

from __future__ import annotations

import itertools
import logging
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

import moonkv
from moonkv import _tensor_io
from conftest import Pool, setup_store

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def sample(dtype: str, shape=(5, 7), seed: int = 0) -> np.ndarray:
    """Distinct values of `dtype` (so a shifted or transposed copy shows)."""
    values = np.random.default_rng(seed).integers(0, 100, size=shape)
    if dtype == "bool":
        return values % 2 == 1
    if dtype.startswith("complex"):
        return (values + 1j * values[::-1]).astype(dtype)
    return values.astype(dtype)


def assert_same(back, expected: np.ndarray, strides=True) -> None:
    assert isinstance(back, np.ndarray), type(back)
    assert back.dtype == expected.dtype
    assert back.shape == expected.shape
    if strides:
        assert back.strides == expected.strides
    assert np.array_equal(back, expected)


@pytest.fixture(params=["in place", "staged"])
def write_path(request, monkeypatch):
    """Runs a test with dense tensors written from their own memory, then through a staging
    buffer (as upserts and non-dense tensors always are)."""
    if request.param == "staged":
        monkeypatch.setattr(_tensor_io, "_multi_buffers", False)
    return request.param


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_numpy_dtype_round_trips(store, key, dtype, write_path):
    array = sample(dtype)
    assert store.put_tensor(key, array) == 0
    assert_same(store.get_tensor(key), array)


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex128"])
def test_zero_dimensional_and_empty_arrays(store, key, dtype, write_path):
    arrays = [
        np.array(sample(dtype, (1,))[0], dtype=dtype),
        np.zeros((0,), dtype),
        np.zeros((3, 0, 2), dtype),
    ]
    for i, array in enumerate(arrays):
        assert store.put_tensor(f"{key}-{i}", array) == 0
        assert_same(store.get_tensor(f"{key}-{i}"), array)


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_any_axis_permutation_keeps_its_strides(store, key, order, write_path):
    array = sample("float32", (4, 5, 6)).transpose(order)
    assert store.put_tensor(key, array) == 0
    back = store.get_tensor(key)
    assert_same(back, array)
    assert back.flags.c_contiguous == array.flags.c_contiguous
    assert back.flags.f_contiguous == array.flags.f_contiguous


def test_fortran_order_and_axes_of_length_one(store, key, write_path):
    cases = [
        np.asfortranarray(sample("int16", (3, 8))),
        np.ascontiguousarray(sample("int16", (3, 1, 4))),
        np.asfortranarray(sample("int16", (3, 1, 4))),
        sample("int16", (2, 1, 5)).transpose(2, 1, 0),
    ]
    for i, array in enumerate(cases):
        assert store.put_tensor(f"{key}-{i}", array) == 0
        assert_same(store.get_tensor(f"{key}-{i}"), array)


def test_strided_views_come_back_dense_in_their_axis_order(store, key):
    base = sample("float64", (10, 12))
    cases = {
        "steps": (base[::2, 1::3], "C"),
        "transposed steps": (base.T[::3, ::2], "F"),
        "reversed": (base[::-1], "C"),
        "broadcast": (np.broadcast_to(base[0], (4, 12)), "C"),
        "column": (base[:, 3], "C"),
    }
    for name, (view, order) in cases.items():
        assert store.put_tensor(f"{key}-{name}", view) == 0
        back = store.get_tensor(f"{key}-{name}")
        assert_same(back, view, strides=False)
        assert back.strides == np.empty(view.shape, view.dtype, order=order).strides, name


def test_big_endian_arrays_come_back_native(store, key):
    array = sample("int32").astype(">i4")
    assert store.put_tensor(key, array) == 0
    back = store.get_tensor(key)
    assert back.dtype == np.dtype("int32") and np.array_equal(back, array)


def test_objects_larger_than_the_local_buffer(master, key, write_path):
    s = setup_store(master.addr, segment=32 << 20, buffer=1 << 20)
    try:
        array = sample("float32", (1024, 1024))  # 4 MiB through a 1 MiB local buffer
        assert s.put_tensor(key, array) == 0
        assert s.upsert_tensor(key + "-up", array.T) == 0
        assert_same(s.get_tensor(key), array)
        assert_same(s.get_tensor(key + "-up"), array.T)
    finally:
        s.close()


def test_dense_tensors_are_written_from_their_own_memory(store, key, monkeypatch):
    def no_staging(*args):
        raise AssertionError("a dense tensor went through a staging buffer")

    monkeypatch.setattr(_tensor_io, "_write_staged", no_staging)
    arrays = [
        sample("float32", (8, 8)),
        np.asfortranarray(sample("int8", (3, 5))),
        sample("int64", (2, 3, 4)).transpose(1, 2, 0),
        sample("uint16", (6, 5))[1:4],
    ]
    keys = [f"{key}-{i}" for i in range(len(arrays))]
    assert store.batch_put_tensor(keys, arrays) == [0] * len(arrays)
    assert store.put_tensor_with_tp(key + "-tp", arrays[0], tp_size=4) == 0
    for got, array in zip(store.batch_get_tensor(keys), arrays):
        assert_same(got, array, strides=array.flags.c_contiguous or array.flags.f_contiguous)


def test_put_keeps_the_first_value_upsert_replaces(store, key):
    first, second = sample("int32", seed=1), sample("int32", (2, 3), seed=2)
    assert store.put_tensor(key, first) == 0
    assert store.put_tensor(key, second) == 0
    assert_same(store.get_tensor(key), first)
    assert store.upsert_tensor(key, second) == 0
    assert_same(store.get_tensor(key), second)
    assert store.upsert_pub_tensor(key, first, moonkv.ReplicateConfig()) == 0
    assert_same(store.get_tensor(key), first)


def test_pub_tensor_takes_a_config(store, key):
    array = sample("uint8")
    assert store.pub_tensor(key, array, moonkv.ReplicateConfig(replica_num=1)) == 0
    assert store.batch_pub_tensor([key + "-b"], [array], moonkv.ReplicateConfig()) == [0]
    assert_same(store.get_tensor(key + "-b"), array)


def test_bytes_keys(store, key):
    array = sample("int8")
    assert store.put_tensor(key.encode(), array) == 0
    assert_same(store.get_tensor(key), array)
    assert store.put_tensor_with_tp(key.encode() + b"-tp", array, tp_size=2) == 0
    assert_same(store.get_tensor_with_tp(key + "-tp", 1, 2), array[2:])


def test_a_miss_is_none(store, key):
    assert store.get_tensor(key + "-absent") is None
    assert store.get_tensor_with_tp(key + "-absent", 0, 2) is None


def test_returned_arrays_own_their_memory(store, key):
    array = sample("float32")
    assert store.put_tensor(key, array) == 0
    first, second = store.get_tensor(key), store.get_tensor(key)
    first[0, 0] = -1
    assert second[0, 0] == array[0, 0]
    assert first.flags.writeable


# ---- batches ---------------------------------------------------------------------------------


def test_batch_put_and_get(store, key, write_path):
    arrays = [sample(d, seed=i) for i, d in enumerate(["float16", "int64", "bool"])]
    arrays += [np.zeros((0, 3), "float32"), sample("uint16", (6, 4)).T, sample("int8")[::2]]
    keys = [f"{key}-{i}" for i in range(len(arrays))]
    assert store.batch_put_tensor(keys, arrays) == [0] * len(arrays)
    back = store.batch_get_tensor(keys + [key + "-absent"])
    assert back[-1] is None
    for got, array in zip(back, arrays):
        assert_same(got, array, strides=array.flags.c_contiguous or array.flags.f_contiguous)
    upserted = [a[..., ::-1] for a in arrays[:3]]
    assert store.batch_upsert_tensor(keys[:3], upserted) == [0, 0, 0]
    for got, array in zip(store.batch_get_tensor(keys[:3]), upserted):
        assert np.array_equal(got, array)


def test_batch_of_one_tensor_under_two_keys_and_of_overlapping_views(store, key, write_path):
    base = sample("int32", (8, 8))
    views = [base, base, base[2:6], base[4:], base[:, 1]]
    keys = [f"{key}-{i}" for i in range(len(views))]
    assert store.batch_put_tensor(keys, views) == [0] * len(views)
    for got, view in zip(store.batch_get_tensor(keys), views):
        assert np.array_equal(got, view)


def test_batch_answers_per_key(store, key):
    keys = [key + "-a", "", key + "-c"]
    arrays = [sample("int8"), sample("int8"), np.array(["text"])]
    assert store.batch_put_tensor(keys, arrays) == [0, -400, INVALID_PARAMS]
    assert store.batch_put_tensor([], []) == []
    assert store.batch_get_tensor([]) == []
    assert (
        store.batch_put_tensor([key + "-x", key + "-y"], [sample("int8")]) == [INVALID_PARAMS] * 2
    )


# ---- registered memory -----------------------------------------------------------------------


def inside(array: np.ndarray, pool: Pool) -> bool:
    return (
        pool.ptr <= array.ctypes.data and array.ctypes.data + array.nbytes <= pool.ptr + pool.size
    )


def test_get_tensor_into_views_the_callers_buffer(store, pool, key):
    array = sample("float32", (16, 9)).T
    assert store.put_tensor(key, array) == 0
    back = store.get_tensor_into(key, pool.ptr + 4096, 100_000)
    assert_same(back, array)
    assert inside(back, pool)
    back[0, 0] = 123.0
    assert store.get_tensor_into(key, pool.ptr + 4096, 100_000)[0, 0] == array[0, 0]


def test_put_tensor_from_a_buffer_filled_by_get_tensor_into(store, pool, key):
    array = sample("int16", (5, 6))
    assert store.put_tensor(key, array) == 0
    size = store.get_size(key)
    assert store.get_tensor_into(key, pool.ptr, size) is not None
    assert store.put_tensor_from(key + "-copy", pool.ptr, size) == 0
    assert_same(store.get_tensor(key + "-copy"), array)
    assert store.upsert_tensor_from(key, pool.ptr, size) == 0
    assert store.batch_put_tensor_from(
        [key + "-b1", key + "-b2"], [pool.ptr, pool.ptr], [size, size]
    ) == [0, 0]
    assert store.batch_upsert_tensor_from([key + "-b1"], [pool.ptr], [size]) == [0]
    assert_same(store.get_tensor(key + "-b2"), array)


def test_tensor_from_memory_that_is_not_registered_is_refused_without_reading_it(store, key):
    # Addresses no registered buffer covers, down to one that is not mapped at all: refused
    # with INVALID_PARAMS before a byte of the "header" is read.
    scratch = bytearray(4096)
    import ctypes

    unregistered = ctypes.addressof((ctypes.c_char * len(scratch)).from_buffer(scratch))
    for ptr in [unregistered, 0x1000, (1 << 47) - 4096]:
        assert store.put_tensor_from(key, ptr, 4096) == -600
        assert store.batch_put_tensor_from([key], [ptr], [4096]) == [-600]
        assert store.put_tensor_with_tp_from(key, ptr, 4096, tp_size=2) == -600
    assert store.is_exist(key) == 0


def test_batch_get_tensor_into(store, pool, key):
    arrays = [sample("float64", seed=1), sample("uint8", (3, 3), seed=2)]
    keys = [key + "-0", key + "-1"]
    assert store.batch_put_tensor(keys, arrays) == [0, 0]
    out = store.batch_get_tensor_into(
        keys + [key + "-absent"],
        [pool.ptr, pool.ptr + 65536, pool.ptr + 131072],
        [65536, 65536, 65536],
    )
    assert out[2] is None
    for got, array in zip(out, arrays):
        assert_same(got, array)
        assert inside(got, pool)
    # Arguments unusable as a whole: INVALID_PARAMS for every key, not a tensor or None each.
    assert store.batch_get_tensor_into(keys, [pool.ptr], [65536]) == [INVALID_PARAMS] * 2
    assert store.batch_get_tensor_into(keys, [pool.ptr, 0], [65536] * 2) == [INVALID_PARAMS] * 2
    assert store.batch_get_tensor_with_tp_into(keys, [pool.ptr], [65536], tp_size=2) == [
        INVALID_PARAMS
    ] * 2


def test_into_forms_refuse_unregistered_small_and_non_tensor_buffers(store, pool, key, caplog):
    array = sample("int64", (10, 10))
    assert store.put_tensor(key, array) == 0
    unregistered = np.empty(4096, np.uint8)
    assert store.get_tensor_into(key, unregistered.ctypes.data, 4096) is None
    assert store.get_tensor_into(key, pool.ptr, 100) is None
    assert "INVALID_PARAMS" in caplog.text
    pool.write(0, b"not a tensor header" * 10)
    assert store.put_tensor_from(key + "-x", pool.ptr, 190) == INVALID_PARAMS
    assert store.put_tensor_from(key + "-x", pool.ptr, 10) == INVALID_PARAMS
    assert store.put_tensor_from(key + "-x", 0, 1000) == INVALID_PARAMS
    assert store.put_tensor_from(key + "-x", pool.ptr, 1 << 63) == INVALID_PARAMS
    assert store.is_exist(key + "-x") == 0


def test_tensors_inside_a_registered_buffer_and_registered_tensors(store, pool, key):
    # A view of the caller's registered pool: written, and the pool stays registered.
    in_pool = np.frombuffer(pool.buf, dtype=np.int32, count=1024)
    in_pool[:] = np.arange(1024)
    assert store.put_tensor(key, in_pool) == 0
    assert_same(store.get_tensor(key), in_pool)
    assert store.get_into(key, pool.ptr, pool.size) > 0
    # A tensor the caller registered itself, exactly: its registration outlives the call.
    own = sample("float32", (64, 64))
    assert store.register_buffer(own.ctypes.data, own.nbytes) == 0
    try:
        assert store.put_tensor(key + "-own", own) == 0
        assert store.put_from(key + "-raw", own.ctypes.data, own.nbytes) == 0
    finally:
        assert store.unregister_buffer(own.ctypes.data) == 0


def test_no_registration_outlives_a_call(store, key):
    array = sample("float64", (32, 32))
    assert store.put_tensor(key, array) == 0
    assert store.put_tensor_with_tp(key + "-tp", array, tp_size=4) == 0
    back = store.get_tensor(key)
    for memory in (array, back):
        assert store.register_buffer(memory.ctypes.data, memory.nbytes) == 0
        assert store.unregister_buffer(memory.ctypes.data) == 0
    assert not _tensor_io.LENDING._held


# ---- tensor-parallel shards ------------------------------------------------------------------


@pytest.mark.parametrize("tp_size", [2, 4])
@pytest.mark.parametrize("split_dim", [0, 1])
def test_tp_split_and_reassemble(store, key, tp_size, split_dim, write_path):
    array = sample("float32", (9, 7, 3))
    assert store.put_tensor_with_tp(key, array, tp_size=tp_size, split_dim=split_dim) == 0
    assert store.is_exist(key) == 0
    shards = [store.get_tensor_with_tp(key, rank, tp_size, split_dim) for rank in range(tp_size)]
    n = array.shape[split_dim]
    for rank, shard in enumerate(shards):
        assert store.is_exist(f"{key}_tp_{rank}") == 1
        assert shard.shape[split_dim] == n * (rank + 1) // tp_size - n * rank // tp_size
        assert_same(store.get_tensor(f"{key}_tp_{rank}"), shard)
    assert_same(np.concatenate(shards, axis=split_dim), array, strides=False)


def test_tp_shards_are_checked_on_read(store, key, caplog):
    array = sample("int32", (8, 4))
    assert store.put_tensor_with_tp(key, array, tp_rank=1, tp_size=2) == 0
    assert store.get_tensor_with_tp(key, 0, 4) is None
    assert "not shard 0 of 4" in caplog.text
    assert store.put_tensor(key + "-whole_tp_0", array) == 0
    assert store.get_tensor_with_tp(key + "-whole", 0, 2) is None
    # tp_size 1 is the whole tensor under the key itself.
    assert store.put_tensor_with_tp(key + "-one", array, tp_size=1) == 0
    assert_same(store.get_tensor_with_tp(key + "-one"), array)


def test_tp_more_shards_than_rows_and_bad_splits(store, key):
    array = sample("int8", (3, 2))
    assert store.put_tensor_with_tp(key, array, tp_size=4) == 0
    shards = [store.get_tensor_with_tp(key, r, 4) for r in range(4)]
    assert [s.shape[0] for s in shards] == [0, 1, 1, 1]
    assert np.array_equal(np.concatenate(shards), array)
    assert store.put_tensor_with_tp(key + "-x", array, tp_size=2, split_dim=2) == INVALID_PARAMS
    assert (
        store.put_tensor_with_tp(key + "-0d", np.float32(1.0) * np.ones(()), tp_size=2)
        == INVALID_PARAMS
    )
    assert store.put_tensor_with_tp(key + "-many", array, tp_size=1 << 40) == INVALID_PARAMS
    assert store.put_tensor_with_tp(key + "-neg", array, tp_size=2, split_dim=-1) == 0
    assert np.array_equal(store.get_tensor_with_tp(key + "-neg", 1, 2), array[:, 1:])


def test_tp_batch_and_registered_memory_forms(store, pool, key):
    arrays = [sample("float16", (6, 4), seed=1), sample("int64", (4, 6), seed=2)]
    keys = [key + "-a", key + "-b"]
    assert store.batch_put_tensor_with_tp(keys, arrays, tp_size=2, split_dim=1) == [0, 0]
    for rank in range(2):
        got = store.batch_get_tensor_with_tp(keys, rank, 2)
        into = store.batch_get_tensor_with_tp_into(
            keys, [pool.ptr, pool.ptr + 8192], [8192, 8192], rank, 2
        )
        for g, i, array in zip(got, into, arrays):
            half = array.shape[1] // 2
            assert np.array_equal(g, array[:, rank * half : (rank + 1) * half])
            assert np.array_equal(i, g) and inside(i, pool)
    assert np.array_equal(
        store.get_tensor_with_tp_into(keys[0], pool.ptr, 8192, 1, 2), arrays[0][:, 2:]
    )
    # A whole tensor object in registered memory, split from there.
    assert store.put_tensor(key + "-whole", arrays[1]) == 0
    size = store.get_size(key + "-whole")
    assert store.get_tensor_into(key + "-whole", pool.ptr, size) is not None
    assert store.put_tensor_with_tp_from(key + "-from", pool.ptr, size, tp_size=2) == 0
    assert store.batch_put_tensor_with_tp_from(
        [key + "-from2"], [pool.ptr], [size], tp_size=4, split_dim=1
    ) == [0]
    assert np.array_equal(store.get_tensor_with_tp(key + "-from", 1, 2), arrays[1][2:])
    assert np.array_equal(store.get_tensor_with_tp(key + "-from2", 3, 4), arrays[1][:, 4:])
    assert store.batch_pub_tensor_with_tp(
        [key + "-pub"], [arrays[0]], moonkv.ReplicateConfig(), 0, 2, 0
    ) == [0]
    assert store.upsert_tensor_with_tp(key + "-pub", arrays[0][::-1], tp_size=2) == 0
    assert store.batch_upsert_tensor_with_tp([key + "-pub"], [arrays[0]], 0, 2) == [0]
    assert np.array_equal(store.get_tensor_with_tp(key + "-pub", 1, 2), arrays[0][3:])


# ---- bad objects -----------------------------------------------------------------------------


def stored_object(store, key: str, array: np.ndarray) -> bytearray:
    assert store.put_tensor(key, array) == 0
    return bytearray(store.get(key))


def corrupt(raw: bytearray, offset: int, fmt: str, value) -> bytes:
    out = bytearray(raw)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def crafted(shape, dtype=b"float32", data=b"") -> bytes:
    """A tensor object built from the documented header layout (docs/python.md)."""
    ndim = len(shape)
    head = struct.pack(
        "<4sBBBB16sQIIIIQQ", b"MKVT", 1, 0, ndim, 0, dtype, len(data), 0, 0, 0, 0, 0, 0
    )
    head += struct.pack(f"<{ndim}Q", *shape) + bytes(range(ndim))
    return head + bytes(-len(head) % 64) + data


def test_a_crafted_object_reads_back(store, key):
    assert store.put(key, crafted((2, 2), b"int16", struct.pack("<4h", 1, 2, 3, 4))) == 0
    assert_same(store.get_tensor(key), np.array([[1, 2], [3, 4]], np.int16))


def test_objects_that_are_not_tensors_read_as_none_with_a_reason(store, key, caplog):
    caplog.set_level(logging.ERROR, logger="moonkv")
    raw = stored_object(store, key, sample("float32", (4, 4)))
    cases = {
        "plain": (b"hello, not a tensor" * 20, "no tensor header"),
        "short": (b"MKVT", "shorter than a tensor header"),
        "truncated": (bytes(raw[:-3]), "the object holds"),
        "header only": (bytes(raw[:70]), "shorter than its"),
        "magic": (b"XXXX" + bytes(raw[4:]), "no tensor header"),
        "version": (corrupt(raw, 4, "<B", 9), "version 9"),
        "framework": (corrupt(raw, 5, "<B", 7), "framework"),
        "ndim": (corrupt(raw, 6, "<B", 200), "200 dimensions"),
        "flags": (corrupt(raw, 7, "<B", 0x80), "flags"),
        "dtype": (corrupt(raw, 8, "<16s", b"float128"), "unknown dtype"),
        "huge shape": (corrupt(raw, 64, "<Q", 1 << 60), "absurd shape"),
        "shape": (corrupt(raw, 64, "<Q", 5), "needs"),
        "data length": (corrupt(raw, 24, "<Q", 1 << 62), "the header says"),
        "axis order": (corrupt(raw, 81, "<B", 0), "not a permutation"),
        "extra byte": (bytes(raw) + b"\0", "the object holds"),
        "empty huge": (crafted((0, 1 << 39, 1 << 39, 1 << 39)), "shape (0,"),
    }
    for name, (value, reason) in cases.items():
        caplog.clear()
        assert store.upsert(f"{key}-{name}", value) == 0
        assert store.get_tensor(f"{key}-{name}") is None, name
        assert reason in caplog.text, (name, caplog.text)
    names = [f"{key}-{name}" for name in cases]
    assert store.batch_get_tensor(names) == [None] * len(names)


def test_a_bad_object_in_registered_memory_is_not_stored(store, pool, key):
    raw = stored_object(store, key, sample("int32", (3, 3)))
    bad = corrupt(raw, 8, "<16s", b"nonsense")
    pool.write(0, bad)
    assert store.put_tensor_from(key + "-bad", pool.ptr, len(bad)) == INVALID_PARAMS
    assert (
        store.put_tensor_with_tp_from(key + "-bad", pool.ptr, len(bad), tp_size=2) == INVALID_PARAMS
    )
    assert store.get_tensor_into(key + "-absent", pool.ptr, 4096) is None
    assert store.upsert(key + "-bad", bad) == 0
    assert store.get_tensor_into(key + "-bad", pool.ptr, 4096) is None


# ---- bad arguments ---------------------------------------------------------------------------


def test_wrong_argument_types_raise_type_error(store, key):
    array = sample("int8")
    calls = [
        lambda: store.put_tensor(123, array),
        lambda: store.put_tensor(key, [1, 2, 3]),
        lambda: store.put_tensor(key, 3.5),
        lambda: store.put_tensor(key, None),
        lambda: store.put_tensor(key, array, config="x"),
        lambda: store.batch_put_tensor(key, [array]),
        lambda: store.batch_put_tensor([key], 5),
        lambda: store.batch_put_tensor([key, key + "2"], [array, "text"]),
        lambda: store.get_tensor(None),
        lambda: store.batch_get_tensor("abc"),
        lambda: store.get_tensor_into(key, "0x10", 10),
        lambda: store.batch_get_tensor_into([key], [-1], [10]),
        lambda: store.put_tensor_from(key, 1.5, 10),
        lambda: store.put_tensor_with_tp(key, array, tp_size="2"),
        lambda: store.get_tensor_with_tp(key, tp_rank=None, tp_size=2),
    ]
    for call in calls:
        with pytest.raises(TypeError):
            call()
    assert store.is_exist(key) == 0


def test_unsupported_dtypes_are_invalid_params(store, key, caplog):
    for i, array in enumerate(
        [
            np.array([object()]),
            np.array(["a", "b"]),
            np.zeros(3, "datetime64[s]"),
            np.zeros(2, [("a", "i4"), ("b", "f4")]),
        ]
    ):
        assert store.put_tensor(f"{key}-{i}", array) == INVALID_PARAMS
    assert "is not supported" in caplog.text


def test_other_buffer_and_dlpack_exporters(store, key):
    assert store.put_tensor(key, memoryview(bytearray(b"abcdef")).cast("B", (2, 3))) == 0
    assert_same(store.get_tensor(key), np.frombuffer(b"abcdef", np.uint8).reshape(2, 3))
    assert store.put_tensor(key + "-scalar", np.float64(2.5)) == 0
    assert store.get_tensor(key + "-scalar") == 2.5


def test_a_closed_store_answers_codes(master, key):
    s = setup_store(master.addr, segment=0)
    s.close()
    assert s.put_tensor(key, sample("int8")) < 0
    assert s.get_tensor(key) is None
    assert s.batch_get_tensor([key, key]) == [None, None]


def test_threads_share_memory_and_registrations(store, key):
    base = sample("float32", (64, 64))
    errors = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                k = f"{key}-{n}-{i}"
                assert store.batch_put_tensor([k, k + "-v"], [base, base[n : n + 8]]) == [0, 0]
                assert store.put_tensor_with_tp(k + "-tp", base, tp_size=2) == 0
                assert np.array_equal(store.get_tensor(k + "-v"), base[n : n + 8])
                assert np.array_equal(store.get_tensor_with_tp(k + "-tp", 1, 2), base[32:])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not _tensor_io.LENDING._held


def test_numpy_and_torch_are_imported_only_when_needed(master, key):
    script = (
        "import sys, moonkv\n"
        "assert 'numpy' not in sys.modules and 'torch' not in sys.modules\n"
        "import numpy as np\n"
        "s = moonkv.MooncakeDistributedStore()\n"
        f"assert s.setup('127.0.0.1', 'P2PHANDSHAKE', 16 << 20, 16 << 20, 'tcp', '', {master.addr!r}) == 0\n"
        f"assert s.put_tensor({key!r}, np.arange(6).reshape(2, 3)) == 0\n"
        f"assert s.get_tensor({key!r}).tolist() == [[0, 1, 2], [3, 4, 5]]\n"
        "s.close()\n"
        "assert 'torch' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_tensor_methods_upstream_has_and_moonkv_lacks(store):
    for name in [
        "get_tensor_into_cuda",
        "save_tensor_to_safetensor",
    ]:
        with pytest.raises(NotImplementedError, match=name):
            getattr(store, name)("a", "b")


def test_parallelism_forms_move_whole_tensors_and_refuse_specs(store, pool, key):
    a, b = sample("float32", (4, 6), seed=3), sample("int64", (3,), seed=4)
    assert store.put_tensor_with_parallelism(key + "-a", a) == 0
    assert store.put_tensor_with_parallelism(key + "-a", b) == 0  # a put keeps the first value
    assert_same(store.get_tensor_with_parallelism(key + "-a"), a)
    assert store.upsert_tensor_with_parallelism(key + "-a", b, None, moonkv.ReplicateConfig()) == 0
    assert_same(store.get_tensor_with_parallelism(key + "-a", target=None), b)
    keys = [key + "-b1", key + "-b2"]
    assert store.batch_put_tensor_with_parallelism(keys, [a, b], parallelisms=[None, None]) == [0, 0]
    assert store.batch_upsert_tensor_with_parallelism(keys, [b, a]) == [0, 0]
    for got, want in zip(store.batch_get_tensor_with_parallelism(keys, targets=[None, None]), [b, a]):
        assert_same(got, want)
    size = store.get_size(keys[1])
    back = store.get_tensor_with_parallelism_into(keys[1], pool.ptr, size)
    assert_same(back, a)
    assert inside(back, pool)
    assert store.put_tensor_with_parallelism_from(key + "-from", pool.ptr, size) == 0
    assert store.upsert_tensor_with_parallelism_from(key + "-from", pool.ptr, size) == 0
    assert store.batch_put_tensor_with_parallelism_from([key + "-f2"], [pool.ptr], [size]) == [0]
    assert store.batch_upsert_tensor_with_parallelism_from([key + "-f2"], [pool.ptr], [size]) == [0]
    assert_same(store.get_tensor(key + "-f2"), a)
    got = store.batch_get_tensor_with_parallelism_into([keys[1]], [pool.ptr], [size])
    assert_same(got[0], a)
    # Any spec is refused before anything is written, naming the argument.
    spec = object()
    with pytest.raises(NotImplementedError, match="parallelism is not implemented"):
        store.put_tensor_with_parallelism(key + "-x", a, spec)
    with pytest.raises(NotImplementedError, match="writer_partitions"):
        store.batch_put_tensor_with_parallelism([key + "-x"], [a], writer_partitions=[spec])
    with pytest.raises(NotImplementedError, match="target"):
        store.get_tensor_with_parallelism(key + "-a", spec)
    with pytest.raises(NotImplementedError, match="targets"):
        store.batch_get_tensor_with_parallelism_into([key + "-a"], [pool.ptr], [size], [None, spec])
    assert store.is_exist(key + "-x") == 0


# ---- PyTorch ---------------------------------------------------------------------------------

TORCH_DTYPES = [
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int8",
    "int32",
    "int64",
    "uint8",
    "bool",
    "complex64",
    "float8_e4m3fn",
]


@needs_torch
@pytest.mark.parametrize("dtype", TORCH_DTYPES)
def test_torch_tensors_come_back_as_torch_tensors(store, key, dtype, write_path):
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    source = torch.from_numpy(sample("float32", (4, 6))).to(getattr(torch, dtype))
    for i, tensor in enumerate([source, source.t(), source[:, ::2], source[1]]):
        k = f"{key}-{i}"
        assert store.put_tensor(k, tensor) == 0
        back = store.get_tensor(k)
        assert isinstance(back, torch.Tensor)
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        if dtype.startswith("float8"):  # no equality on float8: compare the bits
            back, tensor = back.view(torch.uint8), tensor.view(torch.uint8)
        assert torch.equal(back, tensor)
        if tensor.is_contiguous() or tensor.t().is_contiguous():
            assert back.stride() == tensor.stride()


@needs_torch
def test_torch_special_tensors_and_batches(store, key, pool):
    weights = torch.randn(6, 8, dtype=torch.bfloat16, requires_grad=True)
    conj = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()
    zero_d = torch.tensor(7, dtype=torch.int16)
    keys = [key + "-w", key + "-c", key + "-z"]
    assert store.batch_put_tensor(keys, [weights, conj, zero_d]) == [0, 0, 0]
    w, c, z = store.batch_get_tensor(keys)
    assert torch.equal(w, weights.detach()) and not w.requires_grad
    assert torch.equal(c, conj.resolve_conj()) and z.shape == () and int(z) == 7
    into = store.get_tensor_into(keys[0], pool.ptr, 65536)
    assert isinstance(into, torch.Tensor) and torch.equal(into, w)
    assert pool.ptr <= into.data_ptr() < pool.ptr + 65536
    assert store.put_tensor_with_tp(key + "-tp", weights, tp_size=4, split_dim=1) == 0
    shards = [store.get_tensor_with_tp(key + "-tp", r, 4) for r in range(4)]
    assert all(s.dtype == torch.bfloat16 for s in shards)
    assert torch.equal(torch.cat(shards, dim=1), weights.detach())
    mixed = store.batch_get_tensor([keys[2], key + "-absent"])
    assert mixed[1] is None and isinstance(mixed[0], torch.Tensor)
