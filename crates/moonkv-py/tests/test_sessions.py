"""Put and get sessions: a batch started once, moved layer by layer in byte ranges, ended once
(`batch_put_session_*`, `batch_get_session_*`, `*_multi_buffer_ranges`). Against real `moonkv
master` and `moonkv node` processes, embedded and standalone stores alike."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import threading

import moonkv
import pytest
from conftest import Master, Node, Pool, eventually, pattern, setup_store

OK = 0
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
LEASE_EXPIRED = -707
LAYERS, PAGE, KEYS = 4, 4096, 3
SIZE = LAYERS * PAGE


@pytest.fixture(scope="module")
def node():
    m = Master()
    n = Node(m.addr, 128 << 20)
    yield m, n
    n.kill()
    m.stop()


@pytest.fixture(params=["embedded", "standalone"])
def s(request, node):
    m, n = node
    if request.param == "embedded":
        store = setup_store(m.addr, segment=32 << 20)
    else:
        store = moonkv.MooncakeDistributedStore()
        assert store.setup_dummy(32 << 20, 16 << 20, n.data) == OK
    yield store
    store.close()


def layerwise_put(s, keys, src: Pool):
    """Writes object i's layer l from `src` at i*SIZE + l*PAGE, one call per layer."""
    assert s.batch_put_session_start(keys, [SIZE] * len(keys)) == [OK] * len(keys)
    for layer in range(LAYERS):
        ptrs = [[src.ptr + i * SIZE + layer * PAGE] for i in range(len(keys))]
        offsets = [[layer * PAGE] for _ in keys]
        got = s.batch_put_from_multi_buffer_ranges(keys, ptrs, [[PAGE]] * len(keys), offsets)
        assert got == [PAGE] * len(keys), f"layer {layer}"


def test_layer_by_layer_put_and_get_round_trip(s, key):
    keys = [f"{key}-{i}" for i in range(KEYS)]
    src, dst = Pool(s, KEYS * SIZE), Pool(s, KEYS * SIZE)
    data = pattern(key, KEYS * SIZE)
    src.write(0, data)
    layerwise_put(s, keys, src)
    # Not readable before its end.
    assert s.is_exist(keys[0]) == 0
    assert s.batch_put_session_end(keys) == [OK] * KEYS
    assert s.get(keys[1]) == data[SIZE : 2 * SIZE]

    assert s.batch_get_session_start(keys) == [OK] * KEYS
    # Layers in reverse order, each page landing where the caller says.
    for layer in reversed(range(LAYERS)):
        ptrs = [[dst.ptr + i * SIZE + layer * PAGE] for i in range(KEYS)]
        offsets = [[layer * PAGE] for _ in keys]
        got = s.batch_get_into_multi_buffer_ranges(keys, ptrs, [[PAGE]] * KEYS, offsets)
        assert got == [PAGE] * KEYS
    assert dst.read(0, KEYS * SIZE) == data
    # Several ranges of one key in one call, the sum of their sizes answered.
    dst.write(0, bytes(SIZE))
    got = s.batch_get_into_multi_buffer_ranges(
        [keys[2]], [[dst.ptr + 100, dst.ptr]], [[10, 7]], [[SIZE - 10, 3]]
    )
    assert got == [17]
    assert dst.read(100, 10) == data[3 * SIZE - 10 : 3 * SIZE]
    assert dst.read(0, 7) == data[2 * SIZE + 3 : 2 * SIZE + 10]
    assert s.batch_get_session_end(keys) == OK
    # Ended: no session any more.
    assert s.batch_get_into_multi_buffer_ranges([keys[0]], [[dst.ptr]], [[1]], [[0]]) == [
        INVALID_PARAMS
    ]
    src.close()
    dst.close()


def test_bad_ranges_fail_their_key_only_and_sessions_open_once(s, key):
    keys = [f"{key}-a", f"{key}-b", f"{key}-c"]
    src = Pool(s, SIZE)
    src.write(0, pattern(key, SIZE))
    assert s.batch_put_session_start(keys[:2], [SIZE, SIZE]) == [OK, OK]
    assert s.batch_put_session_start([keys[0], keys[2], keys[2]], [SIZE] * 3) == [
        INVALID_PARAMS,  # already open
        OK,
        INVALID_PARAMS,  # named twice
    ]
    unregistered = ctypes.create_string_buffer(PAGE)
    got = s.batch_put_from_multi_buffer_ranges(
        keys + [f"{key}-none", f"{key}-d"],
        [[src.ptr], [src.ptr], [ctypes.addressof(unregistered)], [src.ptr], [src.ptr, src.ptr]],
        [[SIZE], [PAGE], [PAGE], [PAGE], [PAGE]],
        [[0], [SIZE - PAGE + 1], [0], [0], [0]],  # b: past the end; d: two offsets, one size
    )
    assert got == [SIZE, INVALID_PARAMS, INVALID_PARAMS, INVALID_PARAMS, INVALID_PARAMS]
    # Lists of different lengths: every key refused.
    assert s.batch_put_from_multi_buffer_ranges(keys, [[src.ptr]], [[1]], [[0]]) == [
        INVALID_PARAMS
    ] * 3
    assert s.batch_put_session_end([keys[0], f"{key}-none"]) == [OK, INVALID_PARAMS]
    assert s.get(keys[0]) == pattern(key, SIZE)
    # Revoked: nothing readable, the key free for a plain put at once.
    assert s.batch_put_session_revoke(keys[1:]) == [OK, OK]
    assert s.batch_put_session_revoke([keys[1]]) == [INVALID_PARAMS]
    assert s.is_exist(keys[1]) == 0
    assert s.put(keys[1], b"plain") == OK
    # A written object cannot be written through an ended session.
    assert s.batch_put_from_multi_buffer_ranges([keys[0]], [[src.ptr]], [[1]], [[0]]) == [
        INVALID_PARAMS
    ]
    # Get sessions: a missing key, and destinations that overlap.
    assert s.batch_get_session_start([keys[0], f"{key}-none"]) == [OK, OBJECT_NOT_FOUND]
    dst = Pool(s, SIZE)
    assert s.batch_get_into_multi_buffer_ranges(
        [keys[0]], [[dst.ptr, dst.ptr + 10]], [[20, 20]], [[0, 100]]
    ) == [INVALID_PARAMS]
    assert s.batch_get_into_multi_buffer_ranges([keys[0]], [[dst.ptr]], [[20]], [[SIZE - 19]]) == [
        INVALID_PARAMS
    ]
    assert s.batch_get_into_multi_buffer_ranges([keys[0]], [[dst.ptr]], [[20]], [[SIZE - 20]]) == [
        20
    ]
    assert s.batch_get_session_end([keys[0]]) == OK
    src.close()
    dst.close()


def test_an_end_waits_for_range_writes_of_other_threads(s, key):
    """A thread writes a large range while another ends the session: either the write got in
    first and the end waits for it (every byte is there), or the end sealed the session first
    and the write is refused. Never an ended object with a write still landing."""
    size = 8 << 20
    src = Pool(s, size)
    src.write(0, pattern(key, size))
    for round in range(6):
        k = f"{key}-{round}"
        assert s.batch_put_session_start([k], [size]) == [OK]
        barrier = threading.Barrier(2)
        written = []

        def write():
            barrier.wait()
            written.extend(s.batch_put_from_multi_buffer_ranges([k], [[src.ptr]], [[size]], [[0]]))

        t = threading.Thread(target=write)
        t.start()
        barrier.wait()
        ended = s.batch_put_session_end([k])
        t.join(timeout=60)
        assert not t.is_alive()
        assert ended == [OK]
        assert written in ([size], [INVALID_PARAMS])
        if written == [size]:
            assert s.get(k) == pattern(key, size)
    src.close()


def test_sessions_of_a_store_that_is_not_set_up():
    s = moonkv.MooncakeDistributedStore()
    assert s.batch_put_session_start(["k"], [1]) == []
    assert s.batch_put_from_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_put_session_end(["k"]) == []
    assert s.batch_put_session_revoke(["k"]) == []
    assert s.batch_get_session_start(["k"]) == []
    assert s.batch_get_into_multi_buffer_ranges(["k"], [[1]], [[1]], [[0]]) == []
    assert s.batch_get_session_end(["k"]) == INVALID_PARAMS
    with pytest.raises(TypeError):
        s.batch_put_session_start("k", [1])


def test_a_get_session_ends_with_its_read_lease(key):
    m = Master("--default-kv-lease-ttl", "1s")
    s = setup_store(m.addr, segment=16 << 20)
    try:
        assert s.put(key, b"x" * 64) == OK
        dst = Pool(s, 64)
        assert s.batch_get_session_start([key]) == [OK]

        def read():
            return s.batch_get_into_multi_buffer_ranges([key], [[dst.ptr]], [[64]], [[0]])[0]

        assert read() == 64
        eventually("the session's lease runs out", lambda: read() == LEASE_EXPIRED)
        assert read() == INVALID_PARAMS  # the session is gone with its lease
        assert s.batch_get_session_start([key]) == [OK]
        assert read() == 64
        dst.close()
    finally:
        s.close()
        m.stop()


CHILD = """
import ctypes, sys, threading, moonkv
s = moonkv.MooncakeDistributedStore()
assert s.setup_dummy(64 << 20, 16 << 20, sys.argv[1]) == 0
size = 16 << 20
buf = s.alloc_from_mem_pool(size)
ctypes.memset(buf, 0x5A, size)
keys = [sys.argv[2] + "-0", sys.argv[2] + "-1"]
assert s.batch_put_session_start(keys, [size, size]) == [0, 0]
def write():
    while True:
        s.batch_put_from_multi_buffer_ranges(keys, [[buf], [buf]], [[size], [size]], [[0], [0]])
threading.Thread(target=write, daemon=True).start()
print("writing", flush=True)
sys.stdin.read()
"""


def test_a_process_killed_while_writing_a_session_leaves_nothing_readable(key):
    """SIGKILL in the middle of a session's range writes: no key of it becomes readable, an
    upsert takes a key over at once, a put once the master's discard timeout passed, and the
    node keeps serving."""
    m = Master("--put-start-discard-timeout-sec", "1")
    n = Node(m.addr, 128 << 20)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, n.data, key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "writing"
        child.kill()
        child.wait(timeout=30)
        s = moonkv.MooncakeDistributedStore()
        assert s.setup_dummy(16 << 20, 16 << 20, n.data) == OK
        k0, k1 = f"{key}-0", f"{key}-1"
        assert s.batch_is_exist([k0, k1]) == [0, 0]
        assert s.get(k0) == b""
        assert s.upsert(k0, b"taken over") == OK
        assert s.get(k0) == b"taken over"
        # Until the discard timeout the abandoned write holds the key: a put answers 0 (a key
        # that exists, upstream's convention) and stores nothing.
        eventually(
            "the abandoned write can be replaced",
            lambda: s.put(k1, b"later") == OK and s.get(k1) == b"later",
        )
        assert s.put(f"{key}-other", b"x" * 4096) == OK
        assert s.get(f"{key}-other") == b"x" * 4096
        s.close()
    finally:
        n.kill()
        m.stop()


def test_a_store_dropped_without_close_with_open_sessions(node, key):
    m, n = node
    s = setup_store(m.addr, segment=16 << 20)
    src = Pool(s, SIZE)
    src.write(0, pattern(key, SIZE))
    assert s.put(f"{key}-read", b"r" * 64) == OK
    assert s.batch_put_session_start([f"{key}-w"], [SIZE]) == [OK]
    assert s.batch_put_from_multi_buffer_ranges([f"{key}-w"], [[src.ptr]], [[PAGE]], [[0]]) == [PAGE]
    assert s.batch_get_session_start([f"{key}-read"]) == [OK]
    del s, src  # no close(), no session ended
    gc.collect()
    other = setup_store(m.addr, segment=16 << 20)
    try:
        assert other.is_exist(f"{key}-w") == 0
        assert other.upsert(f"{key}-w", b"fresh") == OK
        assert other.get(f"{key}-w") == b"fresh"
    finally:
        other.close()
