"""`moonkv.MooncakeDistributedStore`: every method with good and bad input, upstream's return
conventions (0 / negative codes, byte counts, one result per key, b"" on a miss)."""

from __future__ import annotations

import ctypes
import socket

import numpy as np
import pytest

import moonkv
from conftest import Master, Pool, eventually, pattern, setup_store, within

INVALID_KEY = -400
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
RPC_FAIL = -900
NO_AVAILABLE_HANDLE = -200


# ---- setup, lifecycle ----------------------------------------------------------------------


def test_setup_positional_form_embeds_a_node(master):
    s = setup_store(master.addr, segment=32 << 20)
    try:
        host, port = s.get_hostname().rsplit(":", 1)
        # No port named: one of upstream's range, 12300-14300 (MC_STORE_CLIENT_MIN/MAX_PORT).
        assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
        socket.create_connection((host, int(port)), timeout=5).close()
        assert s.health_check() == 0
    finally:
        assert s.close() == 0
    assert s.health_check() == 1


def test_the_port_range_variables_move_the_embedded_node_and_a_full_range_fails_clearly(
    master, monkeypatch
):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        monkeypatch.setenv("MC_STORE_CLIENT_MIN_PORT", str(port))
        monkeypatch.setenv("MC_STORE_CLIENT_MAX_PORT", str(port))
        monkeypatch.setenv("MC_STORE_CLIENT_SETUP_RETRIES", "3")
        s = moonkv.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", master.addr) < 0
        s.close()
    finally:
        taken.close()
    # The same single port, now free, is the one the node takes.
    s = moonkv.MooncakeDistributedStore()
    try:
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", master.addr) == 0
        assert s.get_hostname() == f"127.0.0.1:{port}"
    finally:
        s.close()
    monkeypatch.setenv("MC_STORE_CLIENT_MIN_PORT", "14000")
    monkeypatch.setenv("MC_STORE_CLIENT_MAX_PORT", "13000")
    s = moonkv.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", master.addr) == INVALID_PARAMS
    s.close()


def test_setup_pure_requester_keeps_its_hostname(master, key):
    s = moonkv.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master.addr) == 0
    try:
        assert s.get_hostname() == "127.0.0.1"
        # Nothing contributes memory in this master but other tests' stores (module fixture not
        # used here), so the write may find no segment; either way it is an integer answer.
        assert isinstance(s.put(key, b"x"), int)
    finally:
        s.close()


def test_setup_dict_form_with_human_sizes(master, key):
    s = moonkv.MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": "32mb",
        "local_buffer_size": "4MB",
        "protocol": "tcp",
        "master_server_address": master.addr,
    }
    assert s.setup(config) == 0
    try:
        assert s.put(key, b"dict form") == 0
        assert s.get(key) == b"dict form"
        # 4 MB (decimal) bounds the copying calls.
        assert s.put(key + "-big", b"x" * 4_000_001) == INVALID_PARAMS
    finally:
        s.close()


@pytest.mark.parametrize(
    "change",
    [
        {"protocol": "rdma"},
        {"global_segment_size": "50%"},
        {"local_buffer_size": "12 parsecs"},
        {"local_hostname": None},
        {"metadata_server": None},
        {"master_server_addr": "redis://127.0.0.1:6379"},
        {"master_server_addr": "etcd://"},
        {"enable_ssd_offload": True},
    ],
)
def test_setup_refuses_bad_settings_with_a_code(master, change, caplog):
    args = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": 16 << 20,
        "local_buffer_size": 16 << 20,
        "protocol": "tcp",
        "rdma_devices": "",
        "master_server_addr": master.addr,
    }
    args.update(change)
    s = moonkv.MooncakeDistributedStore()
    with caplog.at_level("ERROR", logger="moonkv"):
        assert s.setup(**args) == INVALID_PARAMS
    assert caplog.records, "the reason is logged"
    assert s.health_check() == 1


def test_setup_without_a_master_fails_within_the_deadline():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    s = moonkv.MooncakeDistributedStore()
    rc, _ = within(20, s.setup, "127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", dead)
    assert rc < 0
    assert s.health_check() == 1


@pytest.mark.parametrize("name,value", [("MOONKV_SPIN_US", "fast"), ("MOONKV_CALLER_LANES", "-1"), ("MOONKV_SPIN_US", "1.5"), ("MOONKV_SAME_HOST", "maybe")])
def test_setup_refuses_caller_lane_settings_that_are_not_whole_numbers(master, monkeypatch, caplog, name, value):
    monkeypatch.setenv(name, value)
    s = moonkv.MooncakeDistributedStore()
    with caplog.at_level("ERROR", logger="moonkv"):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master.addr) == INVALID_PARAMS
    assert any(name in r.getMessage() for r in caplog.records), "the variable is named"
    assert s.health_check() == 1


@pytest.mark.parametrize("lanes,spin,same_host", [("0", "200", "1"), ("1", "0", "1"), ("16", "200", "1"), ("16", "200", "0"), ("0", "200", "0")])
def test_data_calls_give_the_same_answers_with_and_without_caller_lanes(store, master, monkeypatch, key, lanes, spin, same_host):
    # `store` holds the memory (its embedded node); this one reaches it over the network, or
    # (same-host copies on) has that node copy straight to and from its buffers.
    monkeypatch.setenv("MOONKV_CALLER_LANES", lanes)
    monkeypatch.setenv("MOONKV_SPIN_US", spin)
    monkeypatch.setenv("MOONKV_SAME_HOST", same_host)
    s = setup_store(master.addr, segment=0)
    try:
        value = bytes(range(256)) * 17
        assert s.put(key, value) == 0
        assert s.is_exist(key) == 1
        assert s.get(key) == value
        n = len(value)
        buf = ctypes.create_string_buffer(4 * n)
        ptr = ctypes.addressof(buf)
        assert s.register_buffer(ptr, 4 * n) == 0
        assert s.get_into(key, ptr, n) == n
        assert buf.raw[:n] == value
        keys = [f"{key}-{i}" for i in range(4)]
        parts = [bytes([i]) * n for i in range(4)]
        ctypes.memmove(ptr, b"".join(parts), 4 * n)
        ptrs = [ptr + i * n for i in range(4)]
        assert s.batch_put_from(keys, ptrs, [n] * 4) == [0] * 4
        assert s.batch_is_exist(keys + [key + "-missing"]) == [1, 1, 1, 1, 0]
        ctypes.memset(ptr, 0xEE, 4 * n)
        assert s.batch_get_into(keys, ptrs, [n] * 4) == [n] * 4
        assert buf.raw == b"".join(parts)
        assert s.get(key + "-missing") == b""
        assert s.unregister_buffer(ptr) == 0
        assert s.remove(key, True) == 0
        assert s.batch_remove(keys, True) == [0] * 4
    finally:
        s.close()


def test_setup_twice_is_refused(store, master):
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master.addr) == INVALID_PARAMS


def test_calls_before_setup_and_after_close_fail_cleanly(master, key):
    s = moonkv.MooncakeDistributedStore()
    for store in (s, setup_store(master.addr, segment=0)):
        if store is not s:
            store.close()
        assert store.put(key, b"v") == INVALID_PARAMS
        assert store.get(key) == b""
        assert store.get_buffer(key) is None
        assert store.is_exist(key) == INVALID_PARAMS
        assert store.batch_is_exist([key, key]) == [INVALID_PARAMS] * 2
        assert store.get_into(key, 1, 1) == INVALID_PARAMS
        assert store.batch_get_into([key], [1], [1]) == [INVALID_PARAMS]
        assert store.register_buffer(1, 1) == INVALID_PARAMS
        assert store.remove_all() == INVALID_PARAMS
        assert store.get_hostname() == ""
        assert store.health_check() == 1
        assert store.close() == 0


# ---- copying API ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8).copy()],
    ids=["bytes", "bytearray", "memoryview", "numpy"],
)
def test_put_get_any_buffer(store, key, make):
    data = pattern(key, 100_000)
    assert store.put(key, make(data)) == 0
    assert store.get(key) == data
    assert store.get_size(key) == len(data)


def test_put_numpy_float_array_stores_its_bytes(store, key):
    array = np.arange(1024, dtype=np.float32).reshape(32, 32)
    assert store.put(key, array) == 0
    back = np.frombuffer(store.get(key), dtype=np.float32).reshape(32, 32)
    assert (back == array).all()


def test_put_of_an_existing_key_is_a_noop_success(store, key):
    assert store.put(key, b"first") == 0
    assert store.put(key, b"second") == 0
    assert store.get(key) == b"first"


def test_upsert_replaces(store, key):
    assert store.upsert(key, b"one") == 0
    assert store.upsert(key, b"two, longer") == 0
    assert store.get(key) == b"two, longer"
    assert store.upsert_parts(key, b"a", bytearray(b"b"), memoryview(b"c")) == 0
    assert store.get(key) == b"abc"
    assert store.upsert_batch([key, key + "2"], [b"x", b"y"]) == 0
    assert store.get_batch([key, key + "2"]) == [b"x", b"y"]


def test_get_miss_is_empty_bytes(store, key):
    assert store.get(key) == b""
    assert store.get_batch([key]) == [b""]
    assert store.get_buffer(key) is None


@pytest.mark.parametrize(
    "bad, code",
    [("", INVALID_KEY), ("x" * 5000, INVALID_KEY), (b"\xff\xfe", INVALID_KEY), ("\udcff", INVALID_KEY)],
    ids=["empty", "too-long", "bytes-not-utf8", "lone-surrogate"],
)
def test_bad_keys_get_invalid_key(store, bad, code):
    assert store.put(bad, b"v") == code
    assert store.get(bad) == b""
    assert store.is_exist(bad) == code
    assert store.get_size(bad) == code
    assert store.remove(bad) == code
    assert store.batch_is_exist([bad, "fine-but-absent-key"]) == [code, 0]


def test_bytes_keys_are_accepted_like_upstream(store, key):
    assert store.put(key.encode(), b"v") == 0
    assert store.get(key) == b"v"


def test_wrong_argument_types_raise_type_error(store, key):
    with pytest.raises(TypeError):
        store.put(123, b"v")
    with pytest.raises(TypeError):
        store.put(key, 123)
    with pytest.raises(TypeError):
        store.batch_is_exist(key)  # a str is not a list of keys
    with pytest.raises(TypeError):
        store.get_into(key, "not a pointer", 10)
    with pytest.raises((TypeError, OverflowError)):
        store.get_into(key, -1, 10)


def test_empty_value_is_invalid(store, key):
    assert store.put(key, b"") == INVALID_PARAMS


def test_local_buffer_size_bounds_copying_calls(master, key):
    s = setup_store(master.addr, segment=32 << 20, buffer=1 << 20)
    try:
        assert s.put(key, b"x" * (1 << 20)) == 0
        assert s.put(key + "-big", b"x" * ((1 << 20) + 1)) == INVALID_PARAMS
        first = s.get_buffer(key)
        assert first is not None and len(first) == 1 << 20
        # The handle holds the whole local buffer until it goes away.
        assert s.get_buffer(key) is None
        assert s.get(key) == b""
        del first
        assert s.get(key) == b"x" * (1 << 20)
    finally:
        s.close()
    zero = setup_store(master.addr, segment=32 << 20, buffer=0)
    try:
        assert zero.put(key + "-zero", b"x") == INVALID_PARAMS
        # The zero-copy calls are not bounded by it.
        p = Pool(zero, 4096)
        p.write(0, b"abc")
        assert zero.put_from(key + "-zc", p.ptr, 3) == 0
        p.close()
    finally:
        zero.close()


def test_get_buffer_is_a_buffer(store, key):
    data = pattern(key, 5000)
    assert store.put(key, data) == 0
    handle = store.get_buffer(key)
    assert isinstance(handle, moonkv.BufferHandle)
    assert handle.size() == len(handle) == 5000
    assert bytes(memoryview(handle)) == data
    assert ctypes.string_at(handle.ptr(), 5000) == data
    assert np.frombuffer(handle, dtype=np.uint8).tobytes() == data
    handles = store.batch_get_buffer([key, key + "-missing"])
    assert bytes(handles[0]) == data and handles[1] is None


def test_put_batch_and_get_batch(store, key):
    keys = [f"{key}-{i}" for i in range(10)]
    values = [pattern(k, 1000 + i) for i, k in enumerate(keys)]
    assert store.put_batch(keys, values) == 0
    assert store.get_batch(keys) == values
    assert store.put_batch(keys, values[:3]) == INVALID_PARAMS
    assert store.put_batch([], []) == 0
    assert store.get_batch([]) == []
    assert store.batch_get_buffer([]) == []


def test_put_parts_concatenates(store, key):
    meta = b"M" * 28
    data = pattern(key, 10_000)
    assert store.put_parts(key, meta, memoryview(data)) == 0
    assert store.get(key) == meta + data
    assert store.put_parts(key + "-empty") == INVALID_PARAMS


# ---- registered memory ---------------------------------------------------------------------


def test_register_and_unregister(store):
    p = (ctypes.c_char * 8192)()
    ptr = ctypes.addressof(p)
    assert store.register_buffer(ptr, 8192) == 0
    assert store.register_buffer(ptr, 8192) == 0  # same range again: no-op
    assert store.register_buffer(ptr + 100, 100) == INVALID_PARAMS  # overlaps
    assert store.register_buffer(0, 100) == INVALID_PARAMS
    assert store.register_buffer(ptr, 0) == INVALID_PARAMS
    assert store.unregister_buffer(ptr) == 0
    assert store.unregister_buffer(ptr) == INVALID_PARAMS
    assert store.unregister_buffer(12345) == INVALID_PARAMS


def test_put_from_and_get_into(store, pool, key):
    data = pattern(key, 300_000)
    pool.write(0, data)
    assert store.put_from(key, pool.ptr, len(data)) == 0
    assert store.get_into(key, pool.ptr + 1_000_000, 400_000) == len(data)
    assert pool.read(1_000_000, len(data)) == data
    assert store.upsert_from(key, pool.ptr + 1, 10) == 0
    assert store.get(key) == data[1:11]


def test_zero_copy_refuses_memory_outside_registered_buffers(store, pool, key):
    assert store.put(key, b"0123456789") == 0
    # Never dereferenced: the address is checked first.
    assert store.put_from(key + "-x", 0x10, 100) == INVALID_PARAMS
    assert store.get_into(key, 0x10, 100) == INVALID_PARAMS
    # Starts inside, ends past the end of the registration.
    assert store.get_into(key, pool.ptr + pool.size - 5, 10) == INVALID_PARAMS
    assert store.put_from(key + "-y", pool.ptr + pool.size - 5, 10) == INVALID_PARAMS
    assert store.get_into(key, pool.ptr, 10) == 10


def test_get_into_a_buffer_too_small_and_a_miss(store, pool, key):
    assert store.put(key, b"0123456789") == 0
    assert store.get_into(key, pool.ptr, 9) == INVALID_PARAMS
    assert store.get_into(key + "-absent", pool.ptr, 100) == OBJECT_NOT_FOUND
    assert store.get_into("", pool.ptr, 100) == INVALID_KEY


def test_batch_put_from_and_batch_get_into(store, pool, key):
    keys = [f"{key}-{i}" for i in range(8)]
    size = 64 << 10
    for i, k in enumerate(keys):
        pool.write(i * size, pattern(k, size))
    ptrs = [pool.ptr + i * size for i in range(8)]
    assert store.batch_put_from(keys, ptrs, [size] * 8) == [0] * 8
    dest = [pool.ptr + (1 << 20) + i * size for i in range(8)]
    assert store.batch_get_into(keys, dest, [size] * 8) == [size] * 8
    for i, k in enumerate(keys):
        assert pool.read((1 << 20) + i * size, size) == pattern(k, size)


def test_batch_forms_report_each_key(store, pool, key):
    keys = [f"{key}-a", f"{key}-b", "", f"{key}-c"]
    pool.write(0, b"abcd")
    ptrs = [pool.ptr, 0x10, pool.ptr, pool.ptr + 1]
    assert store.batch_put_from(keys, ptrs, [1, 1, 1, 1]) == [0, INVALID_PARAMS, INVALID_KEY, 0]
    got = store.batch_get_into(
        [keys[0], keys[1], keys[3], f"{key}-absent"],
        [pool.ptr + 100, pool.ptr + 200, 0x10, pool.ptr + 300],
        [10, 10, 10, 10],
    )
    assert got == [1, OBJECT_NOT_FOUND, INVALID_PARAMS, OBJECT_NOT_FOUND]
    assert pool.read(100, 1) == b"a"


def test_batch_mismatched_and_empty(store, pool, key):
    assert store.batch_put_from([key, key + "2"], [pool.ptr], [1, 1]) == [INVALID_PARAMS] * 2
    assert store.batch_get_into([key], [pool.ptr, pool.ptr], [1]) == [INVALID_PARAMS]
    assert store.batch_put_from([], [], []) == []
    assert store.batch_get_into([], [], []) == []
    assert store.batch_is_exist([]) == []
    assert store.batch_remove([]) == []
    assert store.batch_upsert_from([], [], []) == []


def test_batch_get_into_refuses_overlapping_destinations(store, pool, key):
    assert store.put(key, b"0123456789") == 0
    assert store.put(key + "2", b"abcdefghij") == 0
    got = store.batch_get_into([key, key + "2"], [pool.ptr, pool.ptr + 5], [10, 10])
    assert got == [INVALID_PARAMS, INVALID_PARAMS]
    assert store.batch_get_into([key, key + "2"], [pool.ptr, pool.ptr + 10], [10, 10]) == [10, 10]


def test_batch_upsert_from(store, pool, key):
    pool.write(0, b"xy")
    assert store.batch_upsert_from([key, key + "2"], [pool.ptr, pool.ptr + 1], [1, 1]) == [0, 0]
    pool.write(0, b"XY")
    assert store.batch_upsert_from([key, key + "2"], [pool.ptr, pool.ptr + 1], [1, 1]) == [0, 0]
    assert store.get_batch([key, key + "2"]) == [b"X", b"Y"]


def test_unregister_waits_for_calls_and_refuses_later_ones(store, key):
    p = Pool(store, 1 << 20)
    p.write(0, b"z" * 1000)
    assert store.put_from(key, p.ptr, 1000) == 0
    p.close()
    assert store.get_into(key, p.ptr, 1000) == INVALID_PARAMS


# ---- metadata ------------------------------------------------------------------------------


def test_is_exist_and_sizes(store, key):
    assert store.is_exist(key) == 0
    assert store.put(key, b"12345") == 0
    assert store.is_exist(key) == 1
    assert store.batch_is_exist([key, key + "-no"]) == [1, 0]
    assert store.get_size(key) == 5
    assert store.get_size(key + "-no") == OBJECT_NOT_FOUND


def test_replica_descriptors(store, key):
    assert store.put(key, b"12345") == 0
    [replica] = store.get_replica_desc(key)
    assert replica.status == moonkv.ReplicaStatus.COMPLETE
    assert replica.is_memory_replica() and not replica.is_disk_replica()
    desc = replica.get_memory_descriptor().buffer_descriptor
    assert desc.size == 5 and desc.buffer_address > 0
    assert desc.transport_endpoint == store.get_hostname()
    with pytest.raises(ValueError):
        replica.get_disk_descriptor()
    assert store.get_replica_desc(key + "-no") == []
    both = store.batch_get_replica_desc([key, key + "-no"])
    assert list(both) == [key] and len(both[key]) == 1


def test_remove_forms(store, key):
    assert store.put(key, b"v") == 0
    assert store.remove(key, True) == 0
    assert store.remove(key) == OBJECT_NOT_FOUND
    assert store.put_batch([key, key + "2"], [b"a", b"b"]) == 0
    assert store.batch_remove([key, key + "-no", ""], force=True) == [0, OBJECT_NOT_FOUND, INVALID_KEY]


def test_remove_by_regex_and_remove_all(tenant_store, key):
    s = tenant_store
    assert s.put_batch([f"{key}-a1", f"{key}-a2", f"{key}-b1"], [b"1", b"2", b"3"]) == 0
    assert s.remove_by_regex(f"^{key}-a", force=True) == 2
    assert s.is_exist(f"{key}-b1") == 1
    assert s.remove_all(force=True) == 1
    assert s.remove_all(force=True) == 0
    assert s.remove_by_regex("(unclosed") < 0


def test_a_read_lease_blocks_a_plain_remove(store, key):
    assert store.put(key, b"v") == 0
    assert store.get(key) == b"v"  # takes a read lease
    assert store.remove(key) == -706  # OBJECT_HAS_LEASE
    assert store.remove(key, force=True) == 0


def test_batch_replica_clear_drops_only_the_callers_unleased_replicas(key):
    # A lease of 2 s: long enough that a clear right after a read sees it running, short enough
    # that the clears polled below (bounded by WAIT) see it run out.
    m = Master("--default-kv-lease-ttl", "2s")
    a = setup_store(m.addr, segment=16 << 20)
    b = setup_store(m.addr, segment=16 << 20)
    try:
        two = moonkv.ReplicateConfig(replica_num=2)
        assert a.put(f"{key}-two", b"both", two) == 0
        assert len(a.get_replica_desc(f"{key}-two")) == 2
        assert a.put(f"{key}-one", b"one") == 0
        assert b.put(f"{key}-theirs", b"theirs") == 0
        assert a.get(f"{key}-two") == b"both"  # a read lease
        assert a.is_exist(f"{key}-one") == 1  # so is this
        assert a.batch_replica_clear([f"{key}-two", f"{key}-one"]) == []
        assert a.is_exist(f"{key}-two") == 1 and a.get(f"{key}-one") == b"one"

        # Only a's own replica of `two`, by its segment's name; b's copy still answers.
        own = a.get_hostname()
        eventually(
            "the lease runs out",
            lambda: a.batch_replica_clear([f"{key}-two"], segment_name=own) == [f"{key}-two"],
        )
        assert [r.endpoint for r in a.get_replica_desc(f"{key}-two")] == [b.get_hostname()]
        assert a.get(f"{key}-two") == b"both"
        assert b.batch_replica_clear([f"{key}-two"], segment_name=own) == []

        # Everything of the keys a wrote; the empty, unknown and other client's keys stay out.
        asked = ["", "x" * (moonkv.MAX_KEY_LEN + 1), f"{key}-missing", f"{key}-theirs", f"{key}-one"]
        cleared = eventually("the lease runs out", lambda: a.batch_replica_clear(asked))
        assert cleared == [f"{key}-one"]
        assert a.get(f"{key}-one") == b"" and a.is_exist(f"{key}-one") == 0
        assert b.get(f"{key}-theirs") == b"theirs"
        assert a.batch_replica_clear([]) == []
        with pytest.raises(TypeError):
            a.batch_replica_clear("one-key-not-a-list")
    finally:
        assert a.close() == 0 and b.close() == 0
        m.stop()
    # A closed store clears nothing and says so by an empty list.
    assert a.batch_replica_clear([f"{key}-two"]) == []


# ---- ReplicateConfig ----------------------------------------------------------------------


def test_replicate_config_attributes(store, key):
    c = moonkv.ReplicateConfig()
    assert c.replica_num == 1 and c.with_hard_pin is False
    assert c.soft_pin_action == moonkv.SoftPinAction.PRESERVE
    c.replica_num = 2  # best effort: one node is enough
    c.with_hard_pin = True
    c.soft_pin_action = moonkv.SoftPinAction.ENABLE
    c.preferred_segments = [store.get_hostname()]
    c.group_ids = ["g1"]
    assert "replica_num=2" in repr(c)
    assert store.put(key, b"pinned", c) == 0
    assert store.put(key + "-kw", b"kw", config=moonkv.ReplicateConfig(with_hard_pin=True)) == 0
    assert store.get(key) == b"pinned"
    with pytest.raises(TypeError):  # pybind11's rule for an enum out of range
        c.soft_pin_action = 7
    with pytest.raises(NotImplementedError, match="nof_replica_num"):
        c.nof_replica_num = 1
    with pytest.raises(NotImplementedError, match="dfs_replica_num"):
        c.dfs_replica_num = 1
    c.dfs_replica_num = 0
    assert c.dfs_replica_num == 0
    local = moonkv.ReplicateConfig(prefer_alloc_in_same_node=True)
    assert store.put(key + "-local", b"local", local) == 0
    assert store.get_replica_desc(key + "-local")[0].endpoint == store.get_hostname()
    local.replica_num = 2
    assert store.put(key + "-local2", b"local", local) == INVALID_PARAMS


def test_methods_moonkv_lacks_raise_not_implemented(store):
    for name in ["create_copy_task", "query_task", "mount_segment"]:
        with pytest.raises(NotImplementedError, match=name):
            getattr(store, name)("a", "b")
    assert set(moonkv.NOT_IMPLEMENTED) >= {"create_move_task", "query_task"}
    with pytest.raises(NotImplementedError):
        moonkv.bind_to_numa_node(0)
