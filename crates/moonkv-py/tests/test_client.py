"""`moonkv.Client`, the Pythonic layer: exceptions with names and codes, buffer-protocol values,
the context manager, and batch calls with one entry per key."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

import moonkv
from conftest import pattern


@pytest.fixture(scope="module")
def kv(master):
    with moonkv.Client(master.addr, segment_size="64MiB") as client:
        yield client


def test_context_manager_closes(master):
    with moonkv.Client(master.addr) as client:
        assert not client.closed
        assert client.healthy()
    assert client.closed
    with pytest.raises(moonkv.UnavailableError) as info:
        client.get("k")
    assert info.value.code == -1010 and "closed" in info.value.message
    client.close()  # idempotent


def test_put_get_exists_size_remove(kv, key):
    data = pattern(key, 200_000)
    kv.put(key, data)
    assert key in kv and kv.exists(key)
    assert kv.get(key) == data
    assert kv.size(key) == len(data)
    [replica] = kv.replicas(key)
    assert replica.is_memory_replica() and replica.endpoint == kv.hostname
    kv.remove(key, force=True)
    assert key not in kv


def test_a_miss_is_object_not_found(kv, key):
    with pytest.raises(moonkv.ObjectNotFoundError) as info:
        kv.get(key)
    assert isinstance(info.value, KeyError) and isinstance(info.value, moonkv.MoonkvError)
    assert (info.value.code, info.value.name) == (-704, "OBJECT_NOT_FOUND")
    assert key in str(info.value)
    with pytest.raises(KeyError):
        kv.size(key)
    with pytest.raises(moonkv.ObjectNotFoundError):
        kv.remove(key)


def test_put_of_an_existing_key_raises_and_upsert_replaces(kv, key):
    kv.put(key, b"one")
    with pytest.raises(moonkv.ObjectExistsError) as info:
        kv.put(key, b"two")
    assert info.value.code == -705
    kv.upsert(key, b"two")
    assert kv.get(key) == b"two"


@pytest.mark.parametrize(
    "bad",
    ["", "x" * 5000, b"\xff", "\udcff"],
    ids=["empty", "too-long", "bytes-not-utf8", "lone-surrogate"],
)
def test_bad_keys_raise_invalid_key(kv, bad):
    for call in (lambda: kv.put(bad, b"v"), lambda: kv.get(bad), lambda: kv.exists(bad), lambda: kv.get_many([bad])):
        with pytest.raises(moonkv.InvalidKeyError) as info:
            call()
        assert info.value.code == -400 and isinstance(info.value, ValueError)


def test_wrong_types_raise_type_error(kv, key):
    with pytest.raises(TypeError):
        kv.put(1, b"v")
    with pytest.raises(TypeError):
        kv.put(key, "text is not a buffer")
    with pytest.raises(TypeError):
        kv.get_many(key)


def test_values_are_any_buffer(kv, key, tmp_path):
    array = np.arange(4096, dtype=np.int64)
    kv.put(key + "-np", array)
    assert np.array_equal(np.frombuffer(kv.get(key + "-np"), dtype=np.int64), array)
    kv.put(key + "-mv", memoryview(b"abcdef")[2:])
    assert kv.get(key + "-mv") == b"cdef"
    path = tmp_path / "f"
    path.write_bytes(b"mapped bytes")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        kv.put(key + "-mmap", m)
    assert kv.get(key + "-mmap") == b"mapped bytes"
    with pytest.raises((BufferError, ValueError)):  # NumPy refuses a non-contiguous export
        kv.put(key + "-strided", np.arange(10)[::2])


def test_get_into_writes_in_place(kv, key):
    data = pattern(key, 50_000)
    kv.put(key, data)
    out = bytearray(60_000)
    assert kv.get_into(key, out) == len(data)
    assert bytes(out[: len(data)]) == data
    dest = np.zeros(50_000, dtype=np.uint8)
    assert kv.get_into(key, dest) == 50_000 and dest.tobytes() == data
    view = memoryview(out)[10:]
    assert kv.get_into(key, view) == 50_000 and bytes(out[10:50_010]) == data
    with pytest.raises(moonkv.InvalidParamsError) as info:
        kv.get_into(key, bytearray(10))
    assert "too small" in info.value.message
    with pytest.raises(BufferError):
        kv.get_into(key, b"read-only bytes" * 10000)


def test_batches_answer_per_key(kv, key):
    keys = [f"{key}-{i}" for i in range(5)]
    values = [pattern(k, 1000 * (i + 1)) for i, k in enumerate(keys)]
    assert kv.put_many(keys, values) == [None] * 5
    again = kv.put_many(keys[:1], [b"x"])
    assert isinstance(again[0], moonkv.ObjectExistsError)
    got = kv.get_many(keys + [key + "-absent"])
    assert got[:5] == values and isinstance(got[5], moonkv.ObjectNotFoundError)
    buffers = [bytearray(len(v)) for v in values] + [bytearray(4)]
    sizes = kv.get_into_many(keys + [key + "-absent"], buffers)
    assert sizes[:5] == [len(v) for v in values] and isinstance(sizes[5], moonkv.ObjectNotFoundError)
    assert [bytes(b) for b in buffers[:5]] == values
    assert kv.exists_many(keys + [key + "-absent"]) == [True] * 5 + [False]
    removed = kv.remove_many(keys[:2] + [key + "-absent"], force=True)
    assert removed[:2] == [None, None] and isinstance(removed[2], moonkv.ObjectNotFoundError)


def test_batch_arguments_are_checked(kv, key):
    for call in (lambda: kv.put_many([], []), lambda: kv.get_many([]), lambda: kv.exists_many([])):
        with pytest.raises(moonkv.InvalidParamsError, match="empty"):
            call()
    with pytest.raises(moonkv.InvalidParamsError, match="2 keys but 1 values"):
        kv.put_many([key, key + "2"], [b"a"])
    shared = bytearray(100)
    kv.put(key, b"0123456789")
    kv.put(key + "2", b"0123456789")
    with pytest.raises(moonkv.InvalidParamsError, match="share memory"):
        kv.get_into_many([key, key + "2"], [memoryview(shared)[:50], memoryview(shared)[40:]])


def test_regex_and_remove_all_in_a_tenant(master, key):
    with moonkv.Client(master.addr, tenant=f"t-{key[-8:]}", segment_size="16MiB") as t:
        t.put_many([f"{key}-a", f"{key}-b", f"{key}-c"], [b"1", b"2", b"3"])
        assert t.remove_by_regex(f"{key}-[ab]", force=True) == 2
        assert t.remove_all(force=True) == 1


def test_replicate_config_is_accepted(kv, key):
    kv.put(key, b"v", config=moonkv.ReplicateConfig(with_hard_pin=True, preferred_segments=[kv.hostname]))
    assert kv.replicas(key)[0].segment_name == kv.hostname


def test_bad_constructor_arguments(master):
    with pytest.raises(moonkv.InvalidParamsError):
        moonkv.Client(master.addr, segment_size="50%")
    with pytest.raises(moonkv.InvalidParamsError):
        moonkv.Client(master.addr, rpc_timeout=0)


def test_errors_module():
    e = moonkv.errors.error_for(-901, "RPC_TIMEOUT", "slow")
    assert isinstance(e, moonkv.StoreTimeoutError) and isinstance(e, TimeoutError)
    assert isinstance(e, moonkv.UnavailableError) and isinstance(e, ConnectionError)
    assert str(e) == "RPC_TIMEOUT (-901): slow"
    assert type(moonkv.errors.error_for(-12345, "X", "y")) is moonkv.MoonkvError
