"""Several processes against one real master: two Python workers with embedded nodes exchange
objects; one killed in the middle of its puts leaves nothing torn and the others keep working;
a master that dies or hangs gives errors within deadlines, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import moonkv
from conftest import WAIT, Lines, Master, pattern, python_child, setup_store, within


class Worker:
    def __init__(self, *args: str) -> None:
        self.proc = python_child("worker.py", *args)
        self.lines = Lines(self.proc.stdout)
        self.hostname = self.lines.next()
        assert ":" in self.hostname, self.hostname

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.lines.next()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=WAIT)

    def quit(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=WAIT)


def test_two_processes_exchange_objects(master, key):
    a, b = Worker("serve", master.addr), Worker("serve", master.addr)
    try:
        assert a.hostname != b.hostname
        assert a.ask(f"put {key}-from-a 3000000") == "0"
        assert b.ask(f"check {key}-from-a 3000000") == "ok"
        assert b.ask(f"put {key}-from-b 12345") == "0"
        assert a.ask(f"check {key}-from-b 12345") == "ok"
        # And this process reads both, wherever the master placed them.
        local = setup_store(master.addr, segment=0)
        try:
            assert local.get(f"{key}-from-a") == pattern(f"{key}-from-a", 3000000)
            assert local.get(f"{key}-from-b") == pattern(f"{key}-from-b", 12345)
        finally:
            local.close()
    finally:
        a.quit()
        b.quit()


def test_a_process_killed_mid_put_leaves_nothing_torn(key):
    # The dead process's segment stays mounted until the master's client TTL runs out; a short
    # TTL lets the test see placement recover too.
    master = Master("--client-live-ttl-sec", "2")
    here = setup_store(master.addr, segment=128 << 20)
    other = Worker("serve", master.addr)
    size = 4 << 20
    flood = Worker("flood", master.addr, key, str(size), here.get_hostname())
    try:
        finished = {}
        started = -1
        # Let a few puts complete, then kill it right after it announces the next one.
        while started < 3:
            line = flood.lines.next().split()
            if line[0] == "start":
                started = int(line[1])
            else:
                finished[int(line[1])] = int(line[2])
        flood.kill()
        assert all(rc == 0 for rc in finished.values()), finished
        for i in range(started + 1):
            name = f"{key}-{i}"
            got = here.get(name)
            if i in finished:
                assert got == pattern(name, size), f"{name} was acknowledged"
            else:
                assert got in (b"", pattern(name, size)), f"{name} is torn"
        # The survivors keep working, with each other and on their own.
        mine = moonkv.ReplicateConfig(preferred_segments=[here.get_hostname()])
        assert here.put(f"{key}-after", pattern(f"{key}-after", size), mine) == 0
        assert other.ask(f"check {key}-after {size}") == "ok"
        assert here.health_check() == 0
        # Until the master drops the dead segment, a put placed on it fails (TRANSFER_FAIL)
        # and is revoked; after that every put lands on a live node.
        # Twenty successes in a row mean the dead segment is out of placement.
        deadline = time.monotonic() + WAIT
        attempt = streak = 0
        while streak < 20:
            assert time.monotonic() < deadline, "placement never recovered"
            rc = other.ask(f"put {key}-later-{attempt} 1000")
            assert rc in ("0", "-800"), rc
            streak = streak + 1 if rc == "0" else 0
            attempt += 1
        assert here.get(f"{key}-later-{attempt - 1}") == pattern(f"{key}-later-{attempt - 1}", 1000)
    finally:
        if flood.proc.poll() is None:
            flood.kill()
        other.quit()
        here.close()
        master.stop()


def test_master_down_errors_within_the_deadline(fresh_master, key):
    store = setup_store(fresh_master.addr, segment=32 << 20)
    client = moonkv.Client(fresh_master.addr)
    try:
        assert store.put(key, b"before") == 0
        fresh_master.stop()
        assert within(5, store.health_check)[0] == 2
        rc, _ = within(20, store.put, key + "-2", b"after")
        assert rc < 0
        assert within(20, store.get, key)[0] == b""
        assert within(20, store.is_exist, key)[0] < 0
        assert within(20, store.batch_is_exist, [key, key + "-2"])[0][0] < 0
        started = time.monotonic()
        with pytest.raises(moonkv.UnavailableError) as info:
            client.get(key)
        assert time.monotonic() - started < 20
        assert info.value.code in (-900, -901)
    finally:
        client.close()
        store.close()


def test_hung_master_times_out_and_the_gil_is_released(fresh_master, key):
    store = setup_store(fresh_master.addr, segment=32 << 20)
    try:
        assert store.put(key, b"v") == 0
        fresh_master.pause()
        answers = []
        waiter = threading.Thread(target=lambda: answers.append(store.health_check()))
        waiter.start()
        # While the other thread waits on the hung master, this one keeps running.
        gaps, last = [], time.monotonic()
        while waiter.is_alive():
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            time.sleep(0.001)
        waiter.join(WAIT)
        assert answers == [2]
        assert len(gaps) > 100 and max(gaps) < 0.5, max(gaps)
        rc, elapsed = within(30, store.is_exist, key)
        assert rc == -901, rc  # RPC_TIMEOUT
        fresh_master.resume()
        assert within(10, store.is_exist, key)[0] == 1
    finally:
        fresh_master.resume()
        store.close()


def test_an_embedded_node_refuses_an_unusable_secret(master):
    """A malformed MOONKV_AUTH_SECRET stops the embedded node instead of serving openly."""
    script = (
        "import moonkv, sys\n"
        "s = moonkv.MooncakeDistributedStore()\n"
        "rc = s.setup('127.0.0.1', 'unused', '16MiB', '16MiB', 'tcp', '', sys.argv[1])\n"
        "print(rc)\n"
    )
    env = dict(os.environ, MOONKV_AUTH_SECRET="short")
    done = subprocess.run(
        [sys.executable, "-c", script, master.addr],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.strip().splitlines()[-1]) < 0, done.stdout
