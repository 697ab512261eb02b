"""Standalone callers of `moonkv up`: the node takes their puts and gets whole (PUT_LOCAL,
GET_LOCAL) and reaches the master in its own process by calls. Real processes; the answers and
bytes must be those of the usual path, and a caller killed mid-put must leave whole values or
none."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
import urllib.request

import moonkv
import pytest
from conftest import Server, kill_long_upserters, pattern, python_child

OK = 0


class Up(Server):
    """A `moonkv up` child process (events off, so tests may run side by side)."""

    def __init__(self, size: str = "256MiB", env: dict | None = None, flags: tuple = ()) -> None:
        super().__init__(
            "up", "--rpc-port", "0", "--metrics-port", "0", "--segment-size", size,
            "--enable-kv-events", "false", *flags, env=env,
        )
        self.data: str = self.ready["data"]
        self.admin: str = self.ready["admin"]

    def counter(self, name: str, admin: str | None = None) -> int:
        with urllib.request.urlopen(f"http://{admin or self.admin}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return int(float(line.split()[1]))
        return 0


@pytest.fixture(scope="module")
def up():
    u = Up()
    yield u
    u.stop()


def test_puts_and_batches_through_the_node_keep_bytes_and_answers(up, key):
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 1 << 20, up.data) == OK
    try:
        pool = s.alloc_from_mem_pool(24 << 20)
        back = s.alloc_from_mem_pool(8 << 20)
        assert s.put_from(f"{key}-warm", pool, 64) == OK  # attaches the pool's connection
        singles = up.counter("master_put_start_requests_total")
        sizes = [1, 4096 + 3, 1 << 20, (3 << 20) + 77]
        for i, size in enumerate(sizes):
            data = pattern(f"{key}-{i}", size)
            ctypes.memmove(pool + 11, data, size)
            assert s.put_from(f"{key}-{i}", pool + 11, size) == OK
            # A second put: 0 as upstream answers, and the first writer's bytes stay.
            ctypes.memset(pool + 11, 0x5A, size)
            assert s.put_from(f"{key}-{i}", pool + 11, size) == OK
            assert s.get_into(f"{key}-{i}", back, size) == size
            assert ctypes.string_at(back, size) == data
            new = pattern(f"{key}-{i}-new", size)
            ctypes.memmove(pool + 11, new, size)
            assert s.upsert_from(f"{key}-{i}", pool + 11, size) == OK
            assert s.get_into(f"{key}-{i}", back, size) == size
            assert ctypes.string_at(back, size) == new
        # A batch with one key that exists already (0, and its bytes stay), then its
        # replacement.
        kept = pattern(f"{key}-0-new", 1)
        keys = [f"{key}-b{i}" for i in range(6)] + [f"{key}-0"]
        lens = [1000 * (i + 1) + i for i in range(7)]
        ptrs, at, datas = [], 0, []
        for k, n in zip(keys, lens):
            d = pattern(k, n)
            ctypes.memmove(pool + at, d, n)
            ptrs.append(pool + at)
            datas.append(d)
            at += n
        assert s.batch_put_from(keys, ptrs, lens) == [OK] * 7
        assert s.get_into(f"{key}-0", back, 1) == 1
        assert ctypes.string_at(back, 1) == kept
        upserts = up.counter("master_batch_upsert_start_requests_total")
        assert s.batch_upsert_from(keys, ptrs, lens) == [OK] * 7
        # One request for the whole batch, not one per key.
        assert up.counter("master_batch_upsert_start_requests_total") == upserts + 1
        outs = [back + sum(lens[:i]) for i in range(7)]
        assert s.batch_get_into(keys, outs, lens) == lens
        for o, d in zip(outs, datas):
            assert ctypes.string_at(o, len(d)) == d
        # None of it took the three-step path.
        assert up.counter("master_put_start_requests_total") == singles
        assert up.counter("master_batch_put_start_requests_total") > 0
    finally:
        s.close()


def test_gets_through_the_node_keep_bytes_and_answers(up, key):
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 1 << 20, up.data) == OK
    try:
        src = s.alloc_from_mem_pool(8 << 20)
        dst = s.alloc_from_mem_pool(8 << 20)
        sizes = [1, 4096 + 3, 128 << 10, (3 << 20) + 77]
        keys = [f"{key}-{i}" for i in range(len(sizes))]
        datas = [pattern(k, n) for k, n in zip(keys, sizes)]
        for k, d in zip(keys, datas):
            ctypes.memmove(src, d, len(d))
            assert s.put_from(k, src, len(d)) == OK
        assert s.get_into(keys[0], dst, 1) == 1  # attaches the connection
        singles = up.counter("master_get_replica_list_requests_total")
        for k, d in zip(keys, datas):
            # A buffer larger than the object: its size, its bytes, nothing after them.
            ctypes.memset(dst, 0xEE, len(d) + 64)
            assert s.get_into(k, dst + 5, len(d) + 50) == len(d)
            assert ctypes.string_at(dst + 5, len(d)) == d
            assert ctypes.string_at(dst + 5 + len(d), 50) == b"\xee" * 50
        # Upstream's codes: a missing key, and (taken the usual way) a buffer too small.
        assert s.get_into(f"{key}-missing", dst, 4096) == -704
        assert s.get_into(keys[1], dst, 100) == -600
        assert up.counter("master_get_replica_list_requests_total") == singles + 1
        # A batch at odd offsets, with the same two kinds of failure among the keys.
        names = keys + [f"{key}-missing", keys[2]]
        lens = sizes + [10, 1000]
        outs = [dst + 3 + sum(lens[:i]) + 7 * i for i in range(len(names))]
        got = s.batch_get_into(names, outs, lens)
        assert got == sizes + [-704, -600]
        for o, d in zip(outs, datas):
            assert ctypes.string_at(o, len(d)) == d
        assert bytes(s.get_buffer(keys[1])) == datas[1]  # other read forms still work
    finally:
        s.close()


def thread_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            continue
    return names


@pytest.mark.parametrize("helper", ["on", "off"])
def test_copies_shared_with_the_copy_helper_keep_every_byte(key, helper):
    """Puts and gets of 2 MiB or more, which the node shares with its copy helper thread, in
    whole keys and in pieces; `MOONKV_COPY_HELPER=off` starts no helper and copies the same."""
    u = Up(env={"MOONKV_COPY_HELPER": "off"} if helper == "off" else None)
    s = moonkv.MooncakeDistributedStore()
    try:
        assert s.setup_dummy(64 << 20, 1 << 20, u.data) == OK
        src = s.alloc_from_mem_pool(16 << 20)
        dst = s.alloc_from_mem_pool(16 << 20)
        # One object cut in pieces, then a batch mixing whole keys and pieces.
        for rnd in range(3):
            sizes = [(4 << 20) - 3] if rnd == 0 else [128 << 10] * 20 + [600 << 10, 4096, 2 << 20]
            keys = [f"{key}-{rnd}-{i}" for i in range(len(sizes))]
            datas = [pattern(k, n) for k, n in zip(keys, sizes)]
            at = [sum(sizes[:i]) + 64 * i for i in range(len(sizes))]
            for a, d in zip(at, datas):
                ctypes.memmove(src + a, d, len(d))
            assert s.batch_put_from(keys, [src + a for a in at], sizes) == [OK] * len(keys)
            ctypes.memset(dst, 0xEE, 16 << 20)
            assert s.batch_get_into(keys, [dst + a for a in at], sizes) == sizes
            for a, d in zip(at, datas):
                assert ctypes.string_at(dst + a, len(d)) == d
                assert ctypes.string_at(dst + a + len(d), 64) == b"\xee" * 64
            assert s.get_into(keys[-1], dst, len(datas[-1])) == len(datas[-1])
            assert ctypes.string_at(dst, len(datas[-1])) == datas[-1]
        names = thread_names(u.proc.pid)
        assert ("moonkv-copy" in names) == (helper == "on"), names
    finally:
        s.close()
        u.stop()


def test_threads_sharing_a_store_put_through_the_node_at_once(up, key):
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(64 << 20, 1 << 20, up.data) == OK
    n, size = 8, 256 << 10
    barrier = threading.Barrier(n)
    errors: list = []
    bufs = [s.alloc_from_mem_pool(size) for _ in range(n)]

    def worker(t: int) -> None:
        try:
            barrier.wait(timeout=30)
            for j in range(20):
                d = pattern(f"{key}-{t}-{j}", size)
                ctypes.memmove(bufs[t], d, size)
                assert s.upsert_from(f"{key}-{t}", bufs[t], size) == OK
                ctypes.memset(bufs[t], 0, size)
                assert s.get_into(f"{key}-{t}", bufs[t], size) == size
                assert ctypes.string_at(bufs[t], size) == d
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    s.close()
    assert not errors, errors


def test_a_caller_killed_mid_put_leaves_whole_values_or_none(up, key):
    """A caller SIGKILLed mid-upsert (1 MiB: one request the node copies on one thread, and
    16 MiB: one request it copies on two) leaves whole values or none, never a mix."""
    kill_long_upserters(up.data, f"{key}-1m", 1 << 20)
    kill_long_upserters(up.data, key)


def kill_batch_upserter(
    target: str, key: str, n: int, size: int, delay: float, mode: str = "batch-upserts"
) -> None:
    """A child process upserting keys `{key}-0` .. `{key}-{n-1}` of `size` bytes in one batch,
    again and again (`worker.py MODE`: standalone against the node at `target`, or with
    `own-batch-upserts` from its own memory through the master at `target`): SIGKILLed `delay`
    seconds after its first batch succeeded."""
    child = python_child("worker.py", mode, target, key, str(n), str(size))
    try:
        assert child.stdout.readline().split() == ["go"] + ["0"] * n
        time.sleep(delay)
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_caller_killed_mid_batch_leaves_every_key_whole_or_none(up, key):
    """A caller SIGKILLed mid-batch (32 x 128 KiB upserts the node takes whole, copied on two
    threads, at several points of the call) leaves each key whole, old or new, or without a
    value, never a mix; a live caller then takes every key over in one batch, and reads back
    its own bytes."""
    n, size = 32, 128 << 10
    keys = [f"{key}-{i}" for i in range(n)]
    old = [pattern(f"{k}-old", size) for k in keys]
    new = [pattern(f"{k}-new", size) for k in keys]
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(n * size * 3, 1 << 20, up.data) == OK
    try:
        buf = s.alloc_from_mem_pool(n * size)
        ptrs = [buf + i * size for i in range(n)]
        ctypes.memmove(buf, b"".join(old), n * size)
        assert s.batch_put_from(keys, ptrs, [size] * n) == [OK] * n
        for delay in (0.0, 0.002, 0.01, 0.03):
            kill_batch_upserter(up.data, key, n, size, delay)
            for i, k in enumerate(keys):
                ctypes.memset(ptrs[i], 0, size)
                rc = s.get_into(k, ptrs[i], size)
                if rc == size:
                    got = ctypes.string_at(ptrs[i], size)
                    assert got in (old[i], new[i]), f"{k}: a mix after a kill {delay} s in"
                else:
                    # REPLICA_IS_NOT_READY (in flight until reclaimed) or OBJECT_NOT_FOUND.
                    assert rc in (-703, -704), (k, rc)
            ctypes.memmove(buf, b"".join(old), n * size)
            assert s.batch_upsert_from(keys, ptrs, [size] * n) == [OK] * n
            ctypes.memset(buf, 0, n * size)
            assert s.batch_get_into(keys, ptrs, [size] * n) == [size] * n
            assert ctypes.string_at(buf, n * size) == b"".join(old)
    finally:
        s.close()


@pytest.mark.parametrize("n,size", [(128, 4096), (32, 128 << 10)])
def test_a_caller_copying_from_its_own_memory_killed_mid_batch_leaves_keys_whole(
    up, key, n, size
):
    """A caller set up with the master, whose buffers are its own memory (the node copies a run
    of neighbouring keys with one system call), SIGKILLed at several points of a batch of
    upserts: each key is whole, old or new, or without a value, never a mix; a live caller of
    the same kind then takes every key over in one batch and reads its own bytes back."""
    import mmap

    keys = [f"{key}-{i}" for i in range(n)]
    old = b"".join(pattern(f"{k}-old", size) for k in keys)
    new = [pattern(f"{k}-new", size) for k in keys]
    s = moonkv.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", up.ready["rpc"]) == OK
    memory = mmap.mmap(-1, n * size)
    buf = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    try:
        assert s.register_buffer(buf, n * size) == OK
        ptrs = [buf + i * size for i in range(n)]
        memory[:] = old
        assert s.batch_put_from(keys, ptrs, [size] * n) == [OK] * n
        for delay in (0.0, 0.002, 0.01, 0.03):
            kill_batch_upserter(up.ready["rpc"], key, n, size, delay, mode="own-batch-upserts")
            memory[:] = bytes(n * size)
            got = s.batch_get_into(keys, ptrs, [size] * n)
            for i, k in enumerate(keys):
                if got[i] == size:
                    value = memory[i * size : (i + 1) * size]
                    assert value in (old[i * size : (i + 1) * size], new[i]), (
                        f"{k}: a mix after a kill {delay} s in"
                    )
                else:
                    # REPLICA_IS_NOT_READY (in flight until reclaimed) or OBJECT_NOT_FOUND.
                    assert got[i] in (-703, -704), (k, got[i])
            memory[:] = old
            assert s.batch_upsert_from(keys, ptrs, [size] * n) == [OK] * n
            memory[:] = bytes(n * size)
            assert s.batch_get_into(keys, ptrs, [size] * n) == [size] * n
            assert memory[:] == old
    finally:
        s.close()


@pytest.mark.parametrize("same_host", ["0", "1"])
def test_callers_given_the_master_hand_their_puts_to_the_node(up, key, monkeypatch, same_host):
    """A caller set up with the master's address, not the node's: once its first put showed
    where writes land, its puts go to the node whole (PUT_WHOLE over the socket with
    MOONKV_SAME_HOST=0, PUT_LOCAL on the same host), with the bytes and answers of the usual
    path, from threads sharing the store too."""
    monkeypatch.setenv("MOONKV_SAME_HOST", same_host)
    s = moonkv.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", up.ready["rpc"]) == OK
    try:
        assert s.put(f"{key}-warm", b"w") == OK
        singles = up.counter("master_put_start_requests_total")
        handed = up.counter("master_batch_put_start_requests_total")
        for size in [1, 4096, 300_001, 1 << 20]:
            k = f"{key}-{size}"
            data = pattern(k, size)
            assert s.put(k, data) == OK
            # A second put: 0 as upstream answers, and the first writer's bytes stay.
            assert s.put(k, b"x" * size) == OK
            assert s.get(k) == data
            assert s.upsert(k, pattern(f"{k}-new", size)) == OK
            assert s.get(k) == pattern(f"{k}-new", size)
        buf = ctypes.create_string_buffer(8 * 5000)
        ptr = ctypes.addressof(buf)
        assert s.register_buffer(ptr, 8 * 5000) == OK
        keys = [f"{key}-b{i}" for i in range(7)] + [f"{key}-1"]
        ctypes.memmove(ptr, b"".join(pattern(k, 5000) for k in keys), 8 * 5000)
        assert s.batch_put_from(keys, [ptr + i * 5000 for i in range(8)], [5000] * 8) == [OK] * 8
        for k in keys[:-1]:
            assert s.get(k) == pattern(k, 5000)
        assert s.get(f"{key}-1") == pattern(f"{key}-1-new", 1), "the existing key kept its bytes"

        barrier = threading.Barrier(4)
        errors: list = []

        def writer(t: int) -> None:
            try:
                barrier.wait(timeout=30)
                for i in range(40):
                    k = f"{key}-t{t}-{i}"
                    rc = s.put(k, pattern(k, 4096 + i))
                    if rc != OK:
                        errors.append((k, rc))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        for t in range(4):
            for i in range(40):
                k = f"{key}-t{t}-{i}"
                assert s.get(k) == pattern(k, 4096 + i)
        # None of it took the three-step path: the node started every write.
        assert up.counter("master_put_start_requests_total") == singles
        assert up.counter("master_batch_put_start_requests_total") > handed + 160
    finally:
        s.close()


@pytest.mark.parametrize("same_host", ["0", "1"])
def test_callers_given_the_master_take_their_gets_from_the_node(up, key, monkeypatch, same_host):
    """Once a caller given the master hands its puts to its node, its gets go there whole too
    (GET_WHOLE over the socket with MOONKV_SAME_HOST=0, GET_LOCAL on the same host): the bytes
    and codes of the usual path, from threads sharing the store behind a barrier, and no
    replica list asked by the caller itself."""
    monkeypatch.setenv("MOONKV_SAME_HOST", same_host)
    s = moonkv.MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", up.ready["rpc"]) == OK
    try:
        sizes = [1, 4096, 300_001, 1 << 20]
        keys = [f"{key}-g{i}" for i in range(len(sizes))]
        assert s.put(f"{key}-warm", b"w") == OK
        for k, n in zip(keys, sizes):
            assert s.put(k, pattern(k, n)) == OK
        size = 2 << 20
        buf = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(buf)
        assert s.register_buffer(ptr, size) == OK
        assert s.get_into(keys[0], ptr, 10) == 1  # the node's STATS, and the connection
        singles = up.counter("master_get_replica_list_requests_total")
        for k, n in zip(keys, sizes):
            ctypes.memset(ptr, 0xEE, n + 64)
            assert s.get_into(k, ptr + 3, n + 50) == n
            assert ctypes.string_at(ptr + 3, n) == pattern(k, n)
            assert ctypes.string_at(ptr + 3 + n, 50) == b"\xee" * 50
        assert s.get_into(f"{key}-missing", ptr, 4096) == -704
        lens = [1, 4096, 10, 100_000]
        names = [keys[0], keys[1], f"{key}-missing", keys[1]]
        outs = [ptr + sum(lens[:i]) for i in range(len(names))]
        assert s.batch_get_into(names, outs, lens) == [1, 4096, -704, 4096]
        assert ctypes.string_at(outs[3], 4096) == pattern(keys[1], 4096)

        barrier = threading.Barrier(4)
        errors: list = []

        def reader(t: int) -> None:
            mine = ctypes.create_string_buffer(1 << 20)
            at = ctypes.addressof(mine)
            try:
                assert s.register_buffer(at, 1 << 20) == OK
                barrier.wait(timeout=30)
                for i in range(30):
                    k, n = keys[i % 3], sizes[i % 3]
                    got = s.get_into(k, at, 1 << 20)
                    if got != n or ctypes.string_at(at, n) != pattern(k, n):
                        errors.append((t, k, got))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert up.counter("master_get_replica_list_requests_total") == singles
        # Codes of the usual path for what the node leaves to it: a buffer too small.
        assert s.get_into(keys[2], ptr, 100) == -600
        for k, n in zip(keys, sizes):
            assert s.get(k) == pattern(k, n)
        got = s.get_batch(keys + [f"{key}-missing"])
        assert got[:-1] == [pattern(k, n) for k, n in zip(keys, sizes)]
    finally:
        s.close()


def test_callers_killed_mid_batch_leave_an_event_stream_a_router_can_follow(key):
    """A router following `moonkv up`'s KV event stream while callers are SIGKILLed mid-batch
    (32 x 128 KiB upserts taken whole by the node, whose answering thread sends the batch's
    events itself): the stream has no gap and no event out of order, nothing is dropped, and
    once a live caller has rewritten every key, the last event of each says it is stored."""
    zmq = pytest.importorskip("zmq")
    msgpack = pytest.importorskip("msgpack")
    n, size = 32, 128 << 10
    keys = [f"{key}-{i}" for i in range(n)]
    server = Server(
        "up", "--rpc-port", "0", "--metrics-port", "0", "--segment-size", "256MiB",
        "--kv-events-bind-endpoint", "tcp://127.0.0.1:*", "--kv-events-backend-id", "b",
    )
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 50)
    sub.connect(server.ready["kv_events"])
    s = moonkv.MooncakeDistributedStore()
    try:
        assert s.setup_dummy(n * size * 3, 1 << 20, server.ready["data"]) == OK
        buf = s.alloc_from_mem_pool(n * size)
        ptrs = [buf + i * size for i in range(n)]
        messages = []

        def drain() -> None:
            # Until nothing arrives for a receive timeout.
            while True:
                try:
                    messages.append(sub.recv_multipart())
                except zmq.Again:
                    return

        # The subscription reaches the publisher some time after connect: probe until a message
        # arrives (bounded), then start from a clean stream.
        for probe in range(200):
            assert s.put(f"{key}-probe-{probe}", b"p") == OK
            try:
                messages.append(sub.recv_multipart())
                break
            except zmq.Again:
                pass
        assert messages, "the subscriber never joined"
        drain()
        ctypes.memmove(buf, b"".join(pattern(f"{k}-old", size) for k in keys), n * size)
        assert s.batch_put_from(keys, ptrs, [size] * n) == [OK] * n
        for delay in (0.0, 0.002, 0.01, 0.03):
            kill_batch_upserter(server.ready["data"], key, n, size, delay)
            assert s.batch_upsert_from(keys, ptrs, [size] * n) == [OK] * n
        assert s.batch_get_into(keys, ptrs, [size] * n) == [size] * n
        drain()
        status_url = f"http://{server.ready['admin']}/kv_events/status"
        with urllib.request.urlopen(status_url, timeout=10) as r:
            status = json.loads(r.read())
        assert status["dropped_events"] == 0, status
        # Anything the master's own duties published meanwhile.
        drain()
        # The stream: consecutive sequence numbers, event ids one apart, through the last one
        # the publisher had assigned.
        seqs = [int.from_bytes(m[1], "big") for m in messages]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap or a reordering"
        events = [e for m in messages for e in msgpack.unpackb(m[2], raw=False)[1]]
        ids = [e["event_id"] for e in events]
        assert ids == list(range(ids[0], ids[0] + len(ids))), "event ids out of order"
        assert ids[-1] >= status["last_event_id"], (ids[-1], status)
        last = {}
        for e in events:
            if e.get("object_key") in keys:
                last[e["object_key"]] = e["event_type"]
        assert last == {k: "stored" for k in keys}, last
    finally:
        s.close()
        sub.close(linger=0)
        ctx.term()
        server.stop()


@pytest.mark.parametrize("local_socket", [True, False])
def test_same_host_callers_reach_the_node_through_its_local_socket(key, local_socket):
    """Standalone callers on the node's machine connect to its local socket (a Unix socket it
    names in STATS) and attach there: the same bytes and codes as over TCP, from four threads
    sharing one store behind a barrier, and from callers SIGKILLed mid-put. With
    `--no-local-socket` they attach over TCP instead, with the same answers."""
    flags = ("--node-metrics-addr", "127.0.0.1:0")
    if not local_socket:
        flags += ("--no-local-socket",)
    u = Up(flags=flags)
    node = u.ready["node_metrics"]

    def local_opened() -> int:
        return u.counter("node_data_local_connections_opened_total", node)

    try:
        s = moonkv.MooncakeDistributedStore()
        assert s.setup_dummy(64 << 20, 1 << 20, u.data) == OK
        try:
            pool = s.alloc_from_mem_pool(8 << 20)
            back = s.alloc_from_mem_pool(8 << 20)
            copies = u.counter("node_data_same_host_requests_total", node)
            for size in [1, 4096, 300_001, 4 << 20]:
                k = f"{key}-{size}"
                data = pattern(k, size)
                ctypes.memmove(pool, data, size)
                assert s.put_from(k, pool, size) == OK
                ctypes.memset(back, 0, size)
                assert s.get_into(k, back, size) == size
                assert ctypes.string_at(back, size) == data
            assert s.get_into(f"{key}-missing", back, 16) < 0
            assert u.counter("node_data_same_host_requests_total", node) > copies, (
                "the bytes were copied straight to and from this process"
            )
            opened = local_opened()
            if local_socket:
                assert opened >= 1, "the store's connections go through the local socket"
            else:
                assert opened == 0

            barrier = threading.Barrier(4)
            errors: list = []

            def worker(t: int) -> None:
                try:
                    mine = s.alloc_from_mem_pool(1 << 20)
                    barrier.wait(timeout=30)
                    for i in range(30):
                        k = f"{key}-t{t}-{i}"
                        data = pattern(k, 70_000 + i)
                        ctypes.memmove(mine, data, len(data))
                        if s.put_from(k, mine, len(data)) != OK:
                            errors.append(("put", k))
                        ctypes.memset(mine, 0, len(data))
                        if s.get_into(k, mine, len(data)) != len(data):
                            errors.append(("get", k))
                        elif ctypes.string_at(mine, len(data)) != data:
                            errors.append(("bytes", k))
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            assert not errors, errors
        finally:
            s.close()
        before = local_opened()
        kill_long_upserters(u.data, f"{key}-killed", 4 << 20)
        if local_socket:
            assert local_opened() > before, "the killed callers came through the local socket"
        else:
            assert local_opened() == 0
    finally:
        u.stop()


def test_stores_made_and_dropped_in_a_loop_leave_no_local_connections_behind(key):
    """Stores set up against a node on this machine, used through its local socket (and the
    master's), then closed or merely dropped, twenty times over: every connection they opened,
    to the node and to the master, closes again, and both keep serving."""
    import gc

    u = Up(flags=("--node-metrics-addr", "127.0.0.1:0"))
    node = u.ready["node_metrics"]
    established = 'master_rpc_connections{state="established"}'
    try:
        baseline = u.counter("node_data_connections_open", node)
        master_baseline = u.counter(established)
        master_local = u.counter("master_rpc_local_connections_opened_total")
        for i in range(20):
            s = moonkv.MooncakeDistributedStore()
            assert s.setup_dummy(16 << 20, 1 << 20, u.data) == OK
            buf = s.alloc_from_mem_pool(1 << 20)
            data = pattern(f"{key}-{i}", 300_000)
            ctypes.memmove(buf, data, len(data))
            assert s.put_from(f"{key}-{i}", buf, len(data)) == OK
            ctypes.memset(buf, 0, len(data))
            assert s.get_into(f"{key}-{i}", buf, len(data)) == len(data)
            assert ctypes.string_at(buf, len(data)) == data
            assert s.is_exist(f"{key}-{i}") == 1
            if i % 2 == 0:
                s.close()
            del s
            gc.collect()
        assert u.counter("node_data_local_connections_opened_total", node) >= 20
        assert u.counter("master_rpc_local_connections_opened_total") - master_local >= 20
        deadline = time.monotonic() + 30
        while u.counter(established) > master_baseline:
            assert time.monotonic() < deadline, (
                f"{u.counter(established)} master connections still open, "
                f"{master_baseline} before the stores"
            )
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while u.counter("node_data_connections_open", node) > baseline:
            assert time.monotonic() < deadline, (
                f"{u.counter('node_data_connections_open', node)} connections still open, "
                f"{baseline} before the stores"
            )
            time.sleep(0.05)
        s = moonkv.MooncakeDistributedStore()
        assert s.setup_dummy(16 << 20, 1 << 20, u.data) == OK
        assert s.is_exist(f"{key}-19") == 1
        s.close()
    finally:
        u.stop()


@pytest.mark.parametrize("same_host", ["1", "0"])
def test_callers_on_the_masters_machine_call_it_through_its_local_socket(key, monkeypatch, same_host):
    """A store given the master's address on this machine reconnects to the master's local
    socket: `is_exist`, puts, gets and removes answer as over TCP, from four threads sharing the
    store behind a barrier, and the master counts the connection. A store with same-host copies
    off (`MOONKV_SAME_HOST=0`, standing for a caller on another host) keeps to TCP, as does
    every store of a master started with `--no-local-socket`."""
    monkeypatch.setenv("MOONKV_SAME_HOST", same_host)
    for local_socket in (True, False):
        u = Up(flags=() if local_socket else ("--no-local-socket",))
        try:
            # The embedded node's own master client counts too: measure from here.
            before = u.counter("master_rpc_local_connections_opened_total")
            s = moonkv.MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", u.ready["rpc"]) == OK
            try:
                k = f"{key}-{int(local_socket)}"
                assert s.is_exist(k) == 0
                assert s.put(k, b"v" * 5000) == OK
                assert s.is_exist(k) == 1
                assert s.get(k) == b"v" * 5000
                barrier = threading.Barrier(4)
                errors: list = []

                def worker(t: int) -> None:
                    try:
                        barrier.wait(timeout=30)
                        for i in range(40):
                            name = f"{k}-t{t}-{i}"
                            if s.put(name, pattern(name, 3000)) != OK:
                                errors.append(("put", name))
                            if s.is_exist(name) != 1:
                                errors.append(("exists", name))
                            # Forced: the put's lease does not hold the remove back.
                            if s.remove(name, True) != OK:
                                errors.append(("remove", name))
                            if s.is_exist(name) != 0:
                                errors.append(("gone", name))
                    except Exception as e:  # noqa: BLE001
                        errors.append(e)

                threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=120)
                assert not errors, errors[:5]
                # The get holds a read lease; a forced remove does not wait for it.
                assert s.remove(k, True) == OK
                assert s.is_exist(k) == 0
            finally:
                s.close()
            opened = u.counter("master_rpc_local_connections_opened_total") - before
            if local_socket and same_host == "1":
                assert opened >= 1, "the store's master connection is the local socket"
            else:
                assert opened == 0, "the store kept to TCP"
        finally:
            u.stop()
