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


def test_sixteen_waits_overlap(fresh_master):
    """Sixteen threads each wait out a 2 s health-check deadline on a hung master: together they
    take about 2 s, not 32 s, because every wait releases the GIL and the store has no big lock."""
    from conftest import setup_store

    store = setup_store(fresh_master.addr, segment=0)
    try:
        fresh_master.pause()
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(store.health_check())) for _ in range(THREADS)]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - started
        assert answers == [2] * THREADS
        assert elapsed < 8, elapsed
    finally:
        fresh_master.resume()
        store.close()
