"""A second Python process with an embedded node, driven by the tests over stdin/stdout.

    worker.py serve <master>                 answers commands: put KEY SIZE, check KEY SIZE, quit
    worker.py exit-mid-put <master> <key> <size>
                                             no segment of its own; a daemon thread puts KEY,
                                             and on "quit" the process exits without close()
    worker.py flood <master> <prefix> <size> <preferred segment>
                                             puts PREFIX-0, PREFIX-1, ... forever, announcing
                                             "start I" before and "done I RC" after each put
    worker.py long-upserts <node data address> <key> <size>
                                             standalone mode: replaces KEY with the same
                                             SIZE bytes from its pool forever, announcing
                                             "go" after the first replacement
    worker.py batch-upserts <node data address> <key> <n> <size>
                                             standalone mode: replaces KEY-0 .. KEY-(N-1), SIZE
                                             bytes each, in one batch_upsert_from forever,
                                             announcing "go RC..." after the first batch
    worker.py own-batch-upserts <master> <key> <n> <size>
                                             set up with the master and no segment, its buffer
                                             its own memory: replaces KEY-0 .. KEY-(N-1) as
                                             batch-upserts does, announcing "go RC..."
    worker.py long-gets <node data address> <key> <size>
                                             standalone mode: reads KEY (SIZE bytes) into its
                                             pool, 3 bytes past a cache line, forever,
                                             announcing "go RC" after the first read

Every answer is one line; the first line is the node's hostname.
"""

from __future__ import annotations

import sys

import moonkv
from conftest import pattern


def open_store(master: str) -> moonkv.MooncakeDistributedStore:
    store = moonkv.MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(f"setup failed {rc}", flush=True)
        sys.exit(1)
    print(store.get_hostname(), flush=True)
    return store


def serve(master: str) -> None:
    store = open_store(master)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] == "put":
            key, size = words[1], int(words[2])
            print(store.put(key, pattern(key, size)), flush=True)
        elif words[0] == "check":
            key, size = words[1], int(words[2])
            got = store.get(key)
            verdict = "ok" if got == pattern(key, size) else ("miss" if got == b"" else "torn")
            print(verdict, flush=True)
    store.close()


def exit_mid_put(master: str, key: str, size: int) -> None:
    import threading

    store = moonkv.MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master)
    if rc != 0:
        print(f"setup failed {rc}", flush=True)
        sys.exit(1)
    value = pattern(key, size)
    threading.Thread(target=lambda: store.put(key, value), daemon=True).start()
    print("putting", flush=True)
    sys.stdin.readline()
    # The interpreter exits with the put still running in its daemon thread.
    sys.exit(0)


def flood(master: str, prefix: str, size: int, preferred: str) -> None:
    store = open_store(master)
    config = moonkv.ReplicateConfig(preferred_segments=[preferred])
    i = 0
    while True:
        key = f"{prefix}-{i}"
        value = pattern(key, size)
        print(f"start {i}", flush=True)
        print(f"done {i} {store.put(key, value, config)}", flush=True)
        i += 1


def standalone_store(data: str, size: int):
    """A store in standalone mode against the node at DATA, with room in its pool for SIZE
    bytes; exits when setup fails."""
    store = moonkv.MooncakeDistributedStore()
    if store.setup_dummy(size + (4 << 20), 1 << 20, data) != 0:
        print("setup_dummy failed", flush=True)
        sys.exit(1)
    return store


def forever(call) -> None:
    """Calls CALL() forever, announcing "go RC" after the first call."""
    print(f"go {call()}", flush=True)
    while True:
        call()


def long_upserts(data: str, key: str, size: int) -> None:
    import ctypes

    store = standalone_store(data, size)
    buf = store.alloc_from_mem_pool(size)
    ctypes.memmove(buf, pattern(f"{key}-new", size), size)
    forever(lambda: store.upsert_from(key, buf, size))


def batch_upserts(data: str, key: str, n: int, size: int) -> None:
    import ctypes

    store = standalone_store(data, n * size)
    buf = store.alloc_from_mem_pool(n * size)
    keys = [f"{key}-{i}" for i in range(n)]
    ctypes.memmove(buf, b"".join(pattern(f"{k}-new", size) for k in keys), n * size)
    ptrs = [buf + i * size for i in range(n)]
    print("go " + " ".join(map(str, store.batch_upsert_from(keys, ptrs, [size] * n))), flush=True)
    while True:
        store.batch_upsert_from(keys, ptrs, [size] * n)


def own_batch_upserts(master: str, key: str, n: int, size: int) -> None:
    import ctypes
    import mmap

    store = moonkv.MooncakeDistributedStore()
    if store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", master) != 0:
        print("setup failed", flush=True)
        sys.exit(1)
    keys = [f"{key}-{i}" for i in range(n)]
    memory = mmap.mmap(-1, n * size)
    memory[:] = b"".join(pattern(f"{k}-new", size) for k in keys)
    buf = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    if store.register_buffer(buf, n * size) != 0:
        print("register_buffer failed", flush=True)
        sys.exit(1)
    ptrs = [buf + i * size for i in range(n)]
    print("go " + " ".join(map(str, store.batch_upsert_from(keys, ptrs, [size] * n))), flush=True)
    while True:
        store.batch_upsert_from(keys, ptrs, [size] * n)


def long_gets(data: str, key: str, size: int) -> None:
    store = standalone_store(data, size)
    buf = store.alloc_from_mem_pool(size + 64) + 3
    forever(lambda: store.get_into(key, buf, size))


if __name__ == "__main__":
    mode, master = sys.argv[1], sys.argv[2]
    if mode == "serve":
        serve(master)
    elif mode == "long-upserts":
        long_upserts(master, sys.argv[3], int(sys.argv[4]))
    elif mode == "batch-upserts":
        batch_upserts(master, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "own-batch-upserts":
        own_batch_upserts(master, sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif mode == "long-gets":
        long_gets(master, sys.argv[3], int(sys.argv[4]))
    elif mode == "exit-mid-put":
        exit_mid_put(master, sys.argv[3], int(sys.argv[4]))
    else:
        flood(master, sys.argv[3], int(sys.argv[4]), sys.argv[5])
