"""One store shared by many Python threads: every call is correct under concurrency, and the
threads run in parallel instead of queueing behind the GIL."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from conftest import Pool, pattern

THREADS = 16


def test_sixteen_threads_share_one_store(store, key):
    size = 256 << 10
    pools = [Pool(store, 2 * size) for _ in range(THREADS)]

    def work(t: int) -> int:
        pool = pools[t]
        ok = 0
        for i in range(20):
            name = f"{key}-{t}-{i}"
            data = pattern(name, size)
            pool.write(0, data)
            assert store.put_from(name, pool.ptr, size) == 0
            assert store.get_into(name, pool.ptr + size, size) == size
            assert pool.read(size, size) == data
            assert store.is_exist(name) == 1
            assert store.get(name) == data
            assert store.remove(name, force=True) == 0
            ok += 1
        return ok

    with ThreadPoolExecutor(THREADS) as ex:
        assert sum(ex.map(work, range(THREADS))) == THREADS * 20
    for p in pools:
        p.close()


def test_threads_overlap_their_waits(store, key):
    """Sixteen threads each waiting on batch reads finish in much less than sixteen times one
    thread's time: the waits overlap (GIL released, store shared without a big lock)."""
    size = 64 << 10
    keys = [f"{key}-{i}" for i in range(32)]
    values = [pattern(k, size) for k in keys]
    assert store.put_batch(keys, values) == 0

    def reads(n: int) -> None:
        for _ in range(n):
            assert store.get_batch(keys) == values

    rounds = 8
    started = time.monotonic()
    reads(rounds)
    one = time.monotonic() - started

    threads = [threading.Thread(target=reads, args=(rounds,)) for _ in range(THREADS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    many = time.monotonic() - started
    # Serialised, 16 threads would take 16x; allow generous slack for a loaded 2-core machine.
    assert many < one * THREADS * 0.75, (one, many)
