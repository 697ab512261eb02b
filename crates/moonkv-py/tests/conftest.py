"""Fixtures: a real `moonkv master` on loopback with ephemeral ports, and stores set up on it.

The command is `$MOONKV_BIN` if set, else the `moonkv` script the installed package put beside
this interpreter (`pip install ./crates/moonkv-py`, or the wheel), else `moonkv` on `PATH`.
Tests import the installed package, never the source tree.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# Deadline of every wait on a child process; nothing sleeps for a fixed time.
WAIT = 30.0


def moonkv_bin() -> str:
    path = os.environ.get("MOONKV_BIN")
    if path is None:
        beside = Path(sys.executable).parent / "moonkv"
        path = str(beside) if beside.is_file() else shutil.which("moonkv")
    if not path or not Path(path).is_file():
        pytest.exit(
            f"moonkv command not found (looked at {path or 'PATH'}): install the package "
            "(pip install ./crates/moonkv-py) or set MOONKV_BIN",
            2,
        )
    return path


class Lines:
    """Lines of a child's stdout, read by a thread so every wait has a deadline."""

    def __init__(self, stream) -> None:
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self._queue.put(line)
        self._queue.put(None)

    def next(self, timeout: float = WAIT) -> str:
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout}s") from None
        if line is None:
            raise AssertionError("the process closed its output")
        return line.rstrip("\n")


class Server:
    """A `moonkv` child process that serves once it printed its JSON ready line."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.proc = subprocess.Popen(
            [moonkv_bin(), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=None if env is None else {**os.environ, **env},
        )
        self.lines = Lines(self.proc.stdout)
        self.ready: dict = json.loads(self.lines.next())
        assert self.ready["event"] == "ready", self.ready

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)


class Master(Server):
    """A `moonkv master` child process."""

    def __init__(self, *flags: str) -> None:
        super().__init__("master", "--rpc-port", "0", "--metrics-port", "0", *flags)
        self.addr: str = self.ready["rpc"]
        self.admin: str = self.ready["admin"]

    def pause(self) -> None:
        """Stops the master and returns once every one of its threads is stopped: the signal is
        delivered asynchronously, and a thread still running could answer one more request."""
        self.proc.send_signal(signal.SIGSTOP)
        tasks = f"/proc/{self.proc.pid}/task"
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            states = []
            for tid in os.listdir(tasks):
                try:
                    with open(f"{tasks}/{tid}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except FileNotFoundError:
                    continue
            if states and all(s in ("T", "t") for s in states):
                return
            time.sleep(0.001)
        raise AssertionError(f"master {self.proc.pid} did not stop within {WAIT} s")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)


class Node(Server):
    """A `moonkv node` child process serving `size` bytes for `master_addr`."""

    def __init__(self, master_addr: str, size: int | str = 64 << 20, *flags: str) -> None:
        super().__init__(
            "node", "--master", master_addr, "--segment-size", str(size), "--data-bind", "127.0.0.1:0", *flags
        )
        self.data: str = self.ready["data"]

    kill = Server.stop


def segments(master: "Master") -> list[dict]:
    """The master's `/get_segments_detail` list (memory segments only)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{master.admin}/get_segments_detail", timeout=WAIT) as r:
        detail = json.loads(r.read())
    return [s for s in detail["segments"] if s.get("medium") == "cpu"]


def eventually(what: str, check, timeout: float = WAIT, step: float = 0.02):
    """Polls `check` until it returns a truthy value (returned) or `timeout` passes (fails)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last: {got!r})")
        time.sleep(step)


@pytest.fixture(scope="module")
def master():
    m = Master()
    yield m
    m.stop()


@pytest.fixture
def fresh_master():
    """A master of the test's own, for tests that stop or pause it."""
    m = Master()
    yield m
    m.resume()
    m.stop()


def setup_store(addr: str, segment: int | str = 64 << 20, buffer: int | str = 16 << 20, tenant: str = "default"):
    import moonkv

    store = moonkv.MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment, buffer, "tcp", "", addr, tenant_id=tenant)
    assert rc == 0, rc
    return store


@pytest.fixture(scope="module")
def store(master):
    """A store with an embedded node (64 MiB) and a 16 MiB local buffer, shared by a module."""
    s = setup_store(master.addr)
    yield s
    s.close()


@pytest.fixture
def tenant_store(master):
    """A store of the test's own tenant, so remove_all and regex removal touch nothing else."""
    s = setup_store(master.addr, tenant=f"t{uuid.uuid4().hex[:12]}")
    yield s
    s.close()


@pytest.fixture
def key():
    """A key prefix no other test uses."""
    return f"k-{uuid.uuid4().hex}"


class Pool:
    """Caller memory (a ctypes array) registered with a store for the zero-copy calls."""

    def __init__(self, store, size: int) -> None:
        self.store = store
        self.buf = (ctypes.c_char * size)()
        self.ptr = ctypes.addressof(self.buf)
        self.size = size
        assert store.register_buffer(self.ptr, size) == 0

    def write(self, offset: int, data: bytes) -> None:
        ctypes.memmove(self.ptr + offset, data, len(data))

    def read(self, offset: int, length: int) -> bytes:
        return ctypes.string_at(self.ptr + offset, length)

    def close(self) -> None:
        assert self.store.unregister_buffer(self.ptr) == 0


@pytest.fixture
def pool(store):
    p = Pool(store, 4 << 20)
    yield p
    p.close()


def pattern(seed: str, size: int) -> bytes:
    """Bytes that depend on `seed` and on each position, so a torn or shifted copy shows."""
    block = (seed.encode() * (64 // max(1, len(seed)) + 1))[:64]
    out = bytearray()
    i = 0
    while len(out) < size:
        out += bytes((b + i) & 0xFF for b in block)
        i += 1
    return bytes(out[:size])


def python_child(script: str, *args: str) -> subprocess.Popen:
    """Runs `script` (a file next to this one) in a new interpreter."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name(script)), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_long_upserters(data: str, key: str, size: int = 16 << 20) -> None:
    """Against the node at `data`, standalone: a child process replacing `key` (SIZE bytes) in
    a loop is SIGKILLed mid-call, several times. Readers then see the old bytes or the new ones
    whole, or no value (a node that took the put whole revoked it when its caller died: the
    replaced value went at the start), or the write still in flight (-703), never a mix; a live
    writer takes the key over at once, and the node keeps serving long calls."""
    import moonkv

    old = pattern(f"{key}-old", size)
    new = pattern(f"{key}-new", size)
    s = moonkv.MooncakeDistributedStore()
    assert s.setup_dummy(size * 3, 1 << 20, data) == 0
    try:
        buf = s.alloc_from_mem_pool(size)
        ctypes.memmove(buf, old, size)
        assert s.put_from(key, buf, size) == 0
        for delay in (0.0, 0.01, 0.03, 0.07):
            child = python_child("worker.py", "long-upserts", data, key, str(size))
            try:
                assert child.stdout.readline().split() == ["go", "0"]
                time.sleep(delay)
            finally:
                child.kill()
                child.wait(timeout=10)
            ctypes.memset(buf, 0, size)
            rc = s.get_into(key, buf, size)
            if rc == size:
                got = ctypes.string_at(buf, size)
                assert got in (old, new), f"a mix of two values after a kill {delay} s in"
            else:
                # REPLICA_IS_NOT_READY (in flight until reclaimed) or OBJECT_NOT_FOUND.
                assert rc in (-703, -704), rc
            ctypes.memmove(buf, old, size)
            assert s.upsert_from(key, buf, size) == 0
            ctypes.memset(buf, 0, size)
            assert s.get_into(key, buf, size) == size
            assert ctypes.string_at(buf, size) == old
    finally:
        s.close()


def within(seconds: float, fn, *args):
    """Runs fn and asserts it returned within `seconds`; returns (result, elapsed)."""
    started = time.monotonic()
    result = fn(*args)
    elapsed = time.monotonic() - started
    assert elapsed < seconds, f"{getattr(fn, '__name__', fn)} took {elapsed:.1f}s"
    return result, elapsed
