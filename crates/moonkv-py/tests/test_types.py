"""Upstream's binding conventions for Python types, table-driven: a value of the wrong type or
out of range for a typed attribute or argument raises TypeError (never OverflowError or
ValueError), None clears optional attributes, and accepted values read back as set."""

from __future__ import annotations

import moonkv
import pytest
from moonkv import ObjectDataType, SoftPinAction

U32, U64 = 2**32, 2**64


# attribute: (accepted values and what reads back, values that raise TypeError)
ATTRIBUTES = {
    "replica_num": ([(1, 1), (3, 3), (U32 - 1, U32 - 1)], [-1, U32, 1.5, "1", None, [1]]),
    "soft_pin_action": (
        [(0, 0), (2, 2), (SoftPinAction.ENABLE, 1)],
        [-1, 3, 1.0, "ENABLE", None],
    ),
    "soft_pin_ttl_ms": ([(0, 0), (60_000, 60_000), (U64 - 1, U64 - 1), (None, None)], [-1, U64, 1.5, "10"]),
    "with_hard_pin": ([(True, True), (False, False), (1, True), (0, False)], ["yes", [1], b"x"]),
    "with_soft_pin": ([(True, True), (False, False)], ["yes", [1]]),
    "prefer_alloc_in_same_node": ([(True, True), (0, False)], ["no", {}]),
    "with_disk_replica": ([(True, True), (False, False)], ["x", ()]),
    "preferred_segments": ([([], []), (["a:1", "b:2"], ["a:1", "b:2"])], ["a:1", [1], None, 5]),
    "preferred_segment": ([("a:1", "a:1"), ("", "")], [None, 1, ["a"]]),
    "group_ids": ([(None, None), (["g"], ["g"])], ["g", [1], 3]),
    "data_type": ([(0, 0), (ObjectDataType.KVCACHE, 1), (9, 9)], [-1, 10, 1.5, "TENSOR"]),
    "nof_replica_num": ([(0, 0)], [-1, 1.5, U32, "0"]),
    "dfs_replica_num": ([(0, 0)], [-1, 1.5, U32, "0"]),
}


@pytest.mark.parametrize("name", sorted(ATTRIBUTES))
def test_replicate_config_attribute_types(name):
    good, bad = ATTRIBUTES[name]
    config = moonkv.ReplicateConfig()
    for value, expected in good:
        setattr(config, name, value)
        assert getattr(config, name) == expected, (name, value)
    before = getattr(config, name)
    for value in bad:
        with pytest.raises(TypeError):
            setattr(config, name, value)
        assert getattr(config, name) == before, f"{name} changed by a refused {value!r}"


def test_every_replicate_config_attribute_is_in_the_table():
    public = {
        a
        for a in dir(moonkv.ReplicateConfig())
        if not a.startswith("_") and not callable(getattr(moonkv.ReplicateConfig(), a))
    }
    assert public == set(ATTRIBUTES) | {"preferred_nof_segments"}


def test_keyword_construction_follows_the_same_rules():
    assert moonkv.ReplicateConfig(replica_num=2, soft_pin_ttl_ms=None).replica_num == 2
    with pytest.raises(TypeError):
        moonkv.ReplicateConfig(soft_pin_ttl_ms=-1)
    with pytest.raises(TypeError):
        moonkv.ReplicateConfig(replica_num=-1)


def test_unsupported_tiers_still_say_not_implemented():
    for name in ["nof_replica_num", "dfs_replica_num"]:
        with pytest.raises(NotImplementedError):
            setattr(moonkv.ReplicateConfig(), name, 1)


# method: argument tuples that must raise TypeError
METHODS = {
    "put": [(1, b"x"), ("k", 5), ("k", b"x", "config")],
    "put_parts": [(1, b"x"), ("k", 5)],
    "put_batch": [("k", [b"x"]), (["k"], b"x"), ([1], [b"x"])],
    "upsert": [(None, b"x"), ("k", 1.5)],
    "get": [(1,), (None,)],
    "get_batch": [("k",), ([1],)],
    "get_buffer": [(1,)],
    "put_from": [("k", -1, 1), ("k", 1, -1), ("k", 1.5, 1), ("k", 1, "1"), ("k", U64, 1)],
    "upsert_from": [("k", -1, 1), ("k", 1, U64)],
    "get_into": [("k", -1, 10), ("k", 1.5, 10), ("k", 1, "10"), (1, 1, 1)],
    "batch_put_from": [("k", [1], [1]), (["k"], [-1], [1]), (["k"], [1], [1.5])],
    "batch_get_into": [(["k"], [1.5], [1]), (["k"], [1], [-1]), ("k", [1], [1])],
    "batch_put_from_multi_buffers": [(["k"], [[-1]], [[1]]), (["k"], [1], [1])],
    "batch_upsert_from_multi_buffers": [(["k"], [[-1]], [[1]]), (["k"], [1], [1])],
    "batch_put_session_start": [("k", [1]), (["k"], [-1]), (["k"], [1.5])],
    "batch_put_from_multi_buffer_ranges": [(["k"], [[-1]], [[1]], [[0]]), (["k"], [1], [1], [0])],
    "batch_get_into_multi_buffer_ranges": [(["k"], [[1]], [[1]], [[-1]])],
    "batch_put_session_end": [("k",), ([1],)],
    "batch_get_session_start": [("k",)],
    "batch_get_session_end": [("k",)],
    "batch_replica_clear": [("k",), (["k"], 1)],
    "put_from_with_metadata": [("k", -1, 1, 1, 1), ("k", 1, 1, 1.5, 1)],
    "register_buffer": [(-1, 10), (1, U64), ("1", 10), (1.0, 10)],
    "unregister_buffer": [("x",), (-1,)],
    "is_exist": [(1,)],
    "batch_is_exist": [("k",), ([None],)],
    "get_size": [(b"k", 1)],
    "remove": [(1,), ("k", "force")],
    "batch_remove": [("k",), ([1],)],
    "remove_by_regex": [(1,)],
    "setup_dummy": [(-1, 1, "a:1"), (1.5, 1, "a:1"), (1, 1, 5)],
    "alloc_from_mem_pool": [(-1,), (1.5,), ("1",)],
}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_method_argument_types(store, method):
    for args in METHODS[method]:
        with pytest.raises(TypeError):
            getattr(store, method)(*args)


def test_a_store_stays_usable_after_refused_arguments(store, key):
    for method, cases in METHODS.items():
        for args in cases:
            try:
                getattr(store, method)(*args)
            except TypeError:
                pass
    assert store.put(key, b"fine") == 0
    assert store.get(key) == b"fine"


def test_batch_arguments_read_the_same_from_lists_tuples_and_other_iterables(store, pool, key):
    present, absent = f"{key}-a", f"{key}-b"
    assert store.put(present, b"here") == 0
    expected = [1, 0]
    assert store.batch_is_exist([present, absent]) == expected
    assert store.batch_is_exist((present, absent)) == expected
    assert store.batch_is_exist(k for k in (present, absent)) == expected
    assert store.batch_is_exist(iter([present, absent])) == expected

    # A list subclass may iterate its own way: its iteration, not its storage, is the argument.
    class Backwards(list):
        def __iter__(self):
            return reversed(self[:])

    assert store.batch_is_exist(Backwards([present, absent])) == [0, 1]

    for keys, ptrs, sizes in [
        ([present], [pool.ptr], [4]),
        ((present,), (pool.ptr,), (4,)),
        (iter([present]), (a for a in [pool.ptr]), range(4, 5)),
    ]:
        pool.write(0, b"\0" * 4)
        assert store.batch_get_into(keys, ptrs, sizes) == [4]
        assert pool.read(0, 4) == b"here"


def test_careless_batch_arguments_raise_their_own_error_and_leave_the_store_usable(store, key):
    # A generator that fails halfway: its own exception reaches the caller, nothing is sent.
    def failing():
        yield f"{key}-x"
        raise RuntimeError("the caller's generator broke")

    with pytest.raises(RuntimeError, match="generator broke"):
        store.batch_is_exist(failing())

    # One list shared by threads while another thread keeps growing and shrinking it: every
    # call reads some consistent length of it, answers one code per key read, and nothing
    # crashes.
    import threading

    assert store.put(f"{key}-0", b"v") == 0
    shared = [f"{key}-0"]
    stop = threading.Event()
    bad = []

    def mutate():
        i = 0
        while not stop.is_set():
            shared.append(f"{key}-{i % 7}")
            if len(shared) > 64:
                del shared[1:32]
            i += 1

    def read():
        for _ in range(200):
            got = store.batch_is_exist(shared)
            if not 1 <= len(got) <= 65 or any(c not in (0, 1) for c in got) or got[0] != 1:
                bad.append(got)

    writer = threading.Thread(target=mutate)
    readers = [threading.Thread(target=read) for _ in range(4)]
    writer.start()
    for t in readers:
        t.start()
    for t in readers:
        t.join(timeout=60)
    stop.set()
    writer.join(timeout=10)
    assert not any(t.is_alive() for t in readers) and not bad, bad[:1]
    assert store.put(f"{key}-after", b"fine") == 0
    assert store.get(f"{key}-after") == b"fine"
