"""Standalone mode (`setup_dummy`): a process that knows only a node on its machine becomes a
pure client of that node's master; `alloc_from_mem_pool` hands out memory the node copies to
and from directly. Against real `moonkv master` and `moonkv node` processes."""

from __future__ import annotations

import ctypes
import socket
import time

import moonkv
import pytest
from conftest import (
    Master,
    Node,
    Pool,
    kill_long_upserters,
    pattern,
    python_child,
    segments,
    within,
)

OK = 0
INVALID_PARAMS = -600


@pytest.fixture(scope="module")
def node():
    m = Master()
    n = Node(m.addr, 256 << 20)
    yield m, n
    n.kill()
    m.stop()


@pytest.fixture
def standalone(node):
    _, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 16 << 20, n.data) == OK
    yield s
    s.close()


def test_the_process_holds_no_segment_and_finds_the_master_through_the_node(node, standalone):
    m, n = node
    assert [x["te_endpoint"] for x in segments(m)] == [n.data]
    assert standalone.health_check() == OK
    assert standalone.get_hostname() == n.data


def test_every_copying_and_metadata_call_works(standalone, key):
    s = standalone
    assert s.put(key, b"hello") == OK
    assert s.get(key) == b"hello"
    assert s.put_parts(key + "-p", b"ab", b"cd") == OK
    assert s.get(key + "-p") == b"abcd"
    assert s.put_batch([key + "-1", key + "-2"], [b"one", b"two"]) == OK
    assert s.get_batch([key + "-1", key + "-2", key + "-none"]) == [b"one", b"two", b""]
    assert s.upsert(key, b"replaced") == OK
    assert s.get(key) == b"replaced"
    assert s.upsert_batch([key + "-1"], [b"uno"]) == OK
    assert bytes(s.get_buffer(key + "-1")) == b"uno"
    assert s.is_exist(key) == 1 and s.is_exist(key + "-none") == 0
    assert s.batch_is_exist([key, key + "-none"]) == [1, 0]
    assert s.get_size(key) == len(b"replaced")
    assert s.get_replica_desc(key)[0].is_memory_replica()
    # The reads above hold read leases: a plain remove is refused, a forced one goes through.
    assert s.remove(key) == -706
    assert s.remove(key, True) == OK
    assert s.batch_remove([key + "-1", key + "-2"], True) == [OK, OK]
    assert s.get(key) == b""


def test_zero_copy_calls_on_pool_memory_and_on_any_other_memory(standalone, key):
    s = standalone
    size = 1 << 20
    src, dst = s.alloc_from_mem_pool(size), s.alloc_from_mem_pool(size)
    assert src and dst and src % 64 == 0 and dst >= src + size
    # Pool memory is registered already; registering it (as upstream's callers do) is a no-op.
    assert s.register_buffer(src, size) == OK
    assert s.register_buffer(dst, size) == OK
    ctypes.memmove(src, pattern("pool", size), size)
    assert s.put_from(key, src, size) == OK
    assert s.get_into(key, dst, size) == size
    assert ctypes.string_at(dst, size) == pattern("pool", size)
    half = size // 2
    assert s.batch_put_from([key + "-a", key + "-b"], [src, src + half], [half, half]) == [OK, OK]
    assert s.batch_get_into([key + "-a", key + "-b"], [dst + half, dst], [half, half]) == [half, half]
    assert ctypes.string_at(dst, half) == pattern("pool", size)[half:]
    assert s.unregister_buffer(src) == OK
    # Memory that is not the pool's: registered as in setup mode.
    other = Pool(s, size)
    other.write(0, pattern("other", size))
    assert s.upsert_from(key, other.ptr, size) == OK
    assert s.get_into(key, dst, size) == size
    assert ctypes.string_at(dst, size) == pattern("other", size)
    assert s.batch_put_from_multi_buffers([key + "-m"], [[src, other.ptr]], [[100, 200]]) == [OK]
    assert s.get_size(key + "-m") == 300
    other.close()


def test_the_pool_runs_out_cleanly_and_only_standalone_stores_have_one(node, key):
    m, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(1 << 20, 1 << 20, n.data) == OK
    assert s.alloc_from_mem_pool(1 << 20) != 0
    assert s.alloc_from_mem_pool(1) == 0
    assert s.alloc_from_mem_pool(0) == 0
    s.close()
    assert s.alloc_from_mem_pool(64) == 0
    plain = moonkv.MooncakeDistributedStore()
    assert plain.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", m.addr) == OK
    assert plain.alloc_from_mem_pool(64) == 0
    plain.close()
    none = moonkv.MooncakeDistributedStore()
    assert none.setup_dummy(0, 1 << 20, n.data) == OK
    assert none.alloc_from_mem_pool(64) == 0
    assert none.put(key, b"x") == OK
    none.close()


def _vm_flags_at(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split(":", 1)[1].split()
    raise AssertionError(f"no mapping holds {address:#x}")


def test_the_pool_starts_on_a_huge_page_advised_for_huge_pages(node, key):
    _, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(8 << 20, 1 << 20, n.data) == OK
    try:
        first = s.alloc_from_mem_pool(4 << 20)
        assert first != 0 and first % (2 << 20) == 0, hex(first)
        try:
            thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
        except OSError:
            thp = "[never]"
        if "[never]" not in thp:
            assert "hg" in _vm_flags_at(first), "the pool is not advised MADV_HUGEPAGE"
        # The pool still moves bytes both ways.
        ctypes.memset(first, 0x5A, 4 << 20)
        assert s.put_from(key, first, 4 << 20) == OK
        back = s.alloc_from_mem_pool(4 << 20)
        assert back != 0
        assert s.get_into(key, back, 4 << 20) == 4 << 20
        assert ctypes.string_at(back, 4 << 20) == b"\x5a" * (4 << 20)
    finally:
        s.close()


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))


def test_standalone_stores_dropped_without_close_give_their_pools_back(node, key):
    """What careless callers do: set up, write through the pool, and let the store go."""
    import gc

    _, n = node

    def one(i: int) -> None:
        s = moonkv.MooncakeDistributedStore()
        assert s.setup_dummy(64 << 20, 1 << 20, n.data) == OK
        buf = s.alloc_from_mem_pool(4 << 20)
        ctypes.memset(buf, i & 0xFF, 4 << 20)
        assert s.put_from(f"{key}-{i}", buf, 4 << 20) == OK
        assert s.remove(f"{key}-{i}") == OK
        # no close(): the store is garbage

    for i in range(3):
        one(i)
    gc.collect()
    before = _vm_size()
    for i in range(3, 23):
        one(i)
        gc.collect()
    grown = _vm_size() - before
    # 20 pools of 64 MiB would be 1.3 GiB of address space, 2 MiB of alignment each 40 MiB.
    assert grown < 16 << 20, f"address space grew by {grown >> 20} MiB over 20 dropped stores"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_bad_server_addresses_fail_with_a_code_within_the_deadline(node):
    m, _ = node
    for address in [_closed_port(), "not-an-address", "", m.addr]:
        s = moonkv.MooncakeDistributedStore()
        started = time.monotonic()
        rc = s.setup_dummy(1 << 20, 1 << 20, address)
        assert rc < 0, address
        assert time.monotonic() - started < 15, address
        assert s.health_check() == 1
    with pytest.raises(TypeError):
        moonkv.MooncakeDistributedStore().setup_dummy(-1, 1 << 20, "127.0.0.1:1")
    with pytest.raises(TypeError):
        moonkv.MooncakeDistributedStore().setup_dummy(1.5, 1 << 20, "127.0.0.1:1")
    with pytest.raises(TypeError):
        moonkv.MooncakeDistributedStore().setup_dummy(1, 1, 1234)


def test_setup_dummy_twice_is_refused_and_close_then_setup_works(node, key):
    m, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(1 << 20, 1 << 20, n.data) == OK
    assert s.setup_dummy(1 << 20, 1 << 20, n.data) == INVALID_PARAMS
    assert s.put(key, b"a") == OK
    assert s.close() == OK
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 1 << 20, "tcp", "", m.addr) == OK
    assert s.get(key) == b"a"
    s.close()


def test_standalone_mode_with_a_shared_secret(tmp_path, monkeypatch, key):
    """With a secret everywhere, the node names its master to a process that proves the secret,
    and a process without it gets a negative code, not a hang or an open door."""
    secret = tmp_path / "secret"
    secret.write_text("standalone-test-shared-secret-0123\n")
    m = Master("--auth-secret-file", str(secret))
    n = Node(m.addr, 64 << 20, "--auth-secret-file", str(secret))
    try:
        monkeypatch.delenv("MOONKV_AUTH_SECRET", raising=False)
        monkeypatch.delenv("MOONKV_AUTH_SECRET_FILE", raising=False)
        outsider = moonkv.MooncakeDistributedStore()
        assert outsider.setup_dummy(16 << 20, 16 << 20, n.data) < 0
        outsider.close()

        monkeypatch.setenv("MOONKV_AUTH_SECRET_FILE", str(secret))
        s = moonkv.MooncakeDistributedStore()
        assert s.setup_dummy(16 << 20, 16 << 20, n.data) == OK
        value = pattern(key, 200_000)
        assert s.put(key, value) == OK
        assert s.get(key) == value
        buf = s.alloc_from_mem_pool(len(value))
        assert buf and s.register_buffer(buf, len(value)) == OK
        assert s.get_into(key, buf, len(value)) == len(value)
        assert ctypes.string_at(buf, len(value)) == value
        s.close()
    finally:
        n.kill()
        m.stop()


def test_a_buffer_registered_inside_the_pool_bounds_the_ranges_that_start_in_it(standalone, key):
    """Pool memory is registered as a whole, yet a caller that registers 32 bytes of it and
    asks for bytes 30..34 is refused, as for any registered buffer, instead of writing into
    the pool memory that follows."""
    s = standalone
    data = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    assert s.put(key, data) == OK
    ptr = s.alloc_from_mem_pool(64)
    assert ptr and s.register_buffer(ptr, 32) == OK
    ctypes.memset(ptr, ord("_"), 64)
    past = s.get_into_ranges([ptr], [[key]], [[[30]]], [[[0]]], [[[4]]])
    assert past[0][0][0] < 0
    assert s.get_into(key, ptr + 16, 32) < 0
    assert ctypes.string_at(ptr, 64) == b"_" * 64, "nothing written past the buffer"
    inside = s.get_into_ranges([ptr], [[key]], [[[28]]], [[[0]]], [[[4]]])
    assert inside == [[[4]]]
    assert ctypes.string_at(ptr + 28, 4) == data[:4]
    # Unregistered, the 32 bytes are plain pool memory again, bounded only by the pool.
    assert s.unregister_buffer(ptr) == OK
    assert s.get_into_ranges([ptr], [[key]], [[[30]]], [[[0]]], [[[4]]]) == [[[4]]]


def _pool_maps(pid: int | str) -> list[str]:
    with open(f"/proc/{pid}/maps") as f:
        return [l for l in f if "/memfd:moonkv-pool" in l]


def test_the_node_maps_the_pool_and_copies_through_it(node, key):
    """The pool is a sealed memfd that the node maps too: its copies are memcpy, not system
    calls (`moonkv_node::shared_pool`)."""
    _, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(16 << 20, 1 << 20, n.data) == OK
    try:
        buf = s.alloc_from_mem_pool(8 << 20)
        assert any(" rw-s " in l for l in _pool_maps("self")), "the pool is not a shared memfd"
        src = pattern(key, 4 << 20)
        ctypes.memmove(buf, src, len(src))
        assert s.put_from(key, buf, 4 << 20) == OK
        mine = {l.split()[4] for l in _pool_maps("self")}
        theirs = {l.split()[4] for l in _pool_maps(n.proc.pid)}
        assert mine & theirs, "the node did not map this process's pool"
        back = buf + (4 << 20)
        assert s.get_into(key, back, 4 << 20) == 4 << 20
        assert ctypes.string_at(back, 4 << 20) == src
    finally:
        s.close()


def test_long_calls_and_short_ones_keep_every_byte_at_odd_offsets_and_sizes(node, key):
    """A call of 8 MiB or more makes the node write into its segment with streaming stores,
    a shorter one with ordinary stores (`moonkv_node::copy`): both give back exactly the bytes
    put, whatever the alignment and length of the caller's ranges."""
    _, n = node
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 1 << 20, n.data) == OK
    try:
        pool = s.alloc_from_mem_pool(60 << 20)
        assert pool != 0
        # One long object, starting 100 bytes into the pool: not aligned for the stores.
        size = (16 << 20) + 77
        src = pattern(f"{key}-one", size)
        ctypes.memmove(pool + 100, src, size)
        assert s.put_from(f"{key}-one", pool + 100, size) == OK
        back = pool + (20 << 20) + 3
        ctypes.memset(back, 0, size)
        assert s.get_into(f"{key}-one", back, size) == size
        assert ctypes.string_at(back, size) == src
        # A long batch (three objects, 9 MiB and a few bytes) and a short one (under 8 MiB).
        for tag, sizes in (("long", [(5 << 20) + 1, (3 << 20) + 4095, (1 << 20) + 33]),
                           ("short", [(3 << 20) + 5, 4097, (2 << 20) - 1])):
            keys = [f"{key}-{tag}-{i}" for i in range(len(sizes))]
            datas = [pattern(k, z) for k, z in zip(keys, sizes)]
            at, ptrs = pool + 64 + 1, []
            for d in datas:
                ctypes.memmove(at, d, len(d))
                ptrs.append(at)
                at += len(d) + 13
            assert s.batch_put_from(keys, ptrs, sizes) == [OK] * len(keys), tag
            outs = [pool + (40 << 20) + 7 + i * (6 << 20) for i in range(len(sizes))]
            for o, z in zip(outs, sizes):
                ctypes.memset(o, 0, z)
            assert s.batch_get_into(keys, outs, sizes) == sizes, tag
            for o, d in zip(outs, datas):
                assert ctypes.string_at(o, len(d)) == d, tag
        # Replacing a long object with a short one and back leaves the last one's bytes.
        short = pattern(f"{key}-again", 4096 + 5)
        ctypes.memmove(pool, short, len(short))
        assert s.upsert_from(f"{key}-one", pool, len(short)) == OK
        assert s.get_into(f"{key}-one", back, len(short)) == len(short)
        assert ctypes.string_at(back, len(short)) == short
    finally:
        s.close()


def test_a_caller_killed_during_long_replacements_leaves_whole_objects_and_a_serving_node(
    node, key
):
    """A process replacing a 16 MiB object in a loop (long calls: streaming stores into the
    segment) is SIGKILLed mid-call, several times: readers then see the old bytes or the new
    ones, whole, or the write still in flight, never a mix; a live writer takes the key over
    at once, and the node keeps serving long calls."""
    _, n = node
    kill_long_upserters(n.data, key)


def test_a_caller_killed_during_large_gets_leaves_the_object_whole_and_the_node_serving(
    node, key
):
    """A process reading a 16 MiB object in a loop into its pool at an odd offset (gets past
    the node's streaming bound on any machine: streaming stores into the caller's pool) is
    SIGKILLed mid-call, several times. The node's copy into the dead process's pool must not
    wedge the object: after each kill it still reads back whole, into another store's pool at
    another odd offset, and an upsert of it in place goes through at once."""
    _, n = node
    size = 16 << 20
    old = pattern(f"{key}-old", size)
    new = pattern(f"{key}-new", size)
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(3 * size, 1 << 20, n.data) == OK
    try:
        buf = s.alloc_from_mem_pool(size + 128) + 65
        ctypes.memmove(buf, old, size)
        assert s.put_from(key, buf, size) == OK
        for round_, delay in enumerate((0.0, 0.01, 0.03, 0.07)):
            value = old if round_ % 2 == 0 else new
            child = python_child("worker.py", "long-gets", n.data, key, str(size))
            try:
                assert child.stdout.readline().split() == ["go", str(size)]
                time.sleep(delay)
            finally:
                child.kill()
                child.wait(timeout=10)
            ctypes.memset(buf, 0, size)
            assert s.get_into(key, buf, size) == size
            assert ctypes.string_at(buf, size) == value, f"changed by a kill {delay} s in"
            following = new if value is old else old
            ctypes.memmove(buf, following, size)
            rc, _ = within(5.0, s.upsert_from, key, buf, size)
            assert rc == OK
            ctypes.memset(buf, 0, size)
            assert s.get_into(key, buf, size) == size
            assert ctypes.string_at(buf, size) == following
    finally:
        s.close()


def test_a_pool_made_where_a_closed_one_was_gets_its_own_bytes(node, key):
    """A store whose connections attached while pool A existed, copying into pool B made at A's
    old addresses: the node sees that A is gone (its id no longer there) and copies by system
    call, never into A's old file."""
    _, n = node
    x = moonkv.MooncakeDistributedStore()
    a = moonkv.MooncakeDistributedStore()
    assert a.setup_dummy(32 << 20, 1 << 20, n.data) == OK
    assert x.setup_dummy(8 << 20, 1 << 20, n.data) == OK
    try:
        a_buf = a.alloc_from_mem_pool(4 << 20)
        xb = x.alloc_from_mem_pool(1 << 20)
        ctypes.memset(xb, 1, 1 << 20)
        # x's connections attach now, while a's pool exists
        assert x.put_from(f"{key}-warm", xb, 1 << 20) == OK
        a.close()
        b = moonkv.MooncakeDistributedStore()
        # (a local buffer that holds the largest object, for `get`)
        assert b.setup_dummy(32 << 20, 8 << 20, n.data) == OK
        try:
            b_buf = b.alloc_from_mem_pool(4 << 20)
            # (usually b's pool is where a's was; the bytes must be right either way)
            assert x.register_buffer(b_buf, 4 << 20) == OK
            for i, size in enumerate((4096, 1 << 20, 4 << 20)):
                src = pattern(f"{key}-{i}", size)
                ctypes.memmove(b_buf, src, size)
                assert x.put_from(f"{key}-{i}", b_buf, size) == OK
                ctypes.memset(b_buf, 0, size)
                assert x.get_into(f"{key}-{i}", b_buf, size) == size
                assert ctypes.string_at(b_buf, size) == src, f"a_buf={a_buf:#x} b_buf={b_buf:#x}"
                got = b.get(f"{key}-{i}")
                assert got == src
        finally:
            b.close()
    finally:
        x.close()
