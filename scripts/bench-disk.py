#!/usr/bin/env python3
"""The disk tier's figures for docs/benchmarks.md.

- offload throughput: 8 parallel `moonkv put` writers of 16 MiB objects into a node (256 MiB of
  memory) whose memory
  offloads everything above 5 %; the rate is measured from the master's `master_offloaded_bytes`
  over the samples where the offload backlog was non-empty (offload was the bottleneck), next to
  `dd oflag=direct` writing the same bytes to the same directory;
- disk-hit get throughput: `moonkv get` of the offloaded objects (promotion off, so every read is
  served from disk), 1 and 4 readers;
- node RSS while reading a 1 GiB disk object: peak resident set (VmHWM) before and after.

Usage: scripts/bench-disk.py [--moonkv target/release/moonkv] [--dir DIR]
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MIB = 1 << 20


def start(cmd, env=None):
    """Starts a moonkv process and returns (process, ready line fields)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    line = proc.stdout.readline()
    ready = json.loads(line)
    return proc, ready


def metrics(admin):
    text = urllib.request.urlopen(f"http://{admin}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.split(" ", 1)
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


def metric(m, name):
    return m.get(name, m.get(name + "_total", 0.0))


def vm(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def dd_direct(directory, size_mib):
    path = os.path.join(directory, "dd.bin")
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size_mib // 4}", "oflag=direct", "conv=fsync"],
        capture_output=True, text=True, check=True,
    ).stderr
    os.remove(path)
    m = re.search(r"copied, ([0-9.]+) s", out)
    secs = float(m.group(1))
    return size_mib * MIB / secs / 1e9


def cluster(moonkv, directory, segment, capacity):
    master, mready = start([
        moonkv, "master", "--rpc-port", "0", "--metrics-port", "0",
        "--offload-high-watermark-ratio", "0.05", "--offload-low-watermark-ratio", "0",
        "--promotion-on-hit", "false", "--put-space-wait", "4s",
    ])
    node, nready = start([
        moonkv, "node", "--master", mready["rpc"], "--segment-size", segment,
        "--data-bind", "127.0.0.1:0", "--disk-dir", directory, "--disk-capacity", capacity,
    ])
    return master, mready, node, nready


def run(cmd, env, data=None):
    r = subprocess.run(cmd, input=data, capture_output=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd}: {r.stderr.decode()}")
    return r


def offload_bench(moonkv, directory, objects, size_mib, writers):
    master, mready, node, _ = cluster(moonkv, directory, "256MiB", "4GiB")
    env = dict(os.environ, MOONKV_MASTER=mready["rpc"])
    admin = mready["admin"]
    payload = os.urandom(size_mib * MIB)
    samples = []
    done = threading.Event()

    def sample():
        while not done.is_set():
            m = metrics(admin)
            samples.append((time.monotonic(), metric(m, "master_offloaded_bytes"), metric(m, "master_offloads_pending")))
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    keys = [f"o{i}" for i in range(objects)]

    def write(part):
        for k in part:
            run([moonkv, "put", k, "-"], env, payload)

    started = time.monotonic()
    threads = [threading.Thread(target=write, args=(keys[w::writers],)) for w in range(writers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    put_secs = time.monotonic() - started
    total = objects * size_mib * MIB
    # Everything above 5 % of memory leaves it: with 16 MiB objects in 256 MiB, every object.
    while True:
        m = metrics(admin)
        if metric(m, "master_offloads_pending") == 0 and metric(m, "master_offloaded_bytes") >= total - 13 * MIB:
            break
        time.sleep(0.02)
    done.set()
    t.join()
    busy_bytes, busy_secs = 0.0, 0.0
    for (t0, b0, p0), (t1, b1, _) in zip(samples, samples[1:]):
        if p0 > 0:
            busy_bytes += b1 - b0
            busy_secs += t1 - t0
    m = metrics(admin)
    result = {
        "objects": objects,
        "object_mib": size_mib,
        "writers": writers,
        "put_seconds": put_secs,
        "offload_gbps": busy_bytes / busy_secs / 1e9 if busy_secs else 0.0,
        "dropped": metric(m, "master_dropped_objects"),
        "put_waits": metric(m, "master_put_space_waits"),
    }
    # Disk hits: every object lives on disk only now.
    for readers in (1, 4):
        t0 = time.monotonic()

        def read(part):
            for k in part:
                run([moonkv, "get", k, "-o", "/dev/null"], env)

        rs = [threading.Thread(target=read, args=(keys[r::readers],)) for r in range(readers)]
        for th in rs:
            th.start()
        for th in rs:
            th.join()
        secs = time.monotonic() - t0
        result[f"disk_get_gbps_{readers}"] = total / secs / 1e9
        result[f"disk_get_ms_{readers}"] = secs / objects * readers * 1000
    node.terminate()
    master.terminate()
    node.wait()
    master.wait()
    return result


def rss_bench(moonkv, directory, mib):
    master, mready, node, _ = cluster(moonkv, directory, f"{mib + 64}MiB", f"{2 * mib + 64}MiB")
    env = dict(os.environ, MOONKV_MASTER=mready["rpc"])
    admin = mready["admin"]
    path = os.path.join(directory, "big.in")
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MIB))
    run([moonkv, "put", "big", path], env)
    os.remove(path)
    while metric(metrics(admin), "master_offloads_completed") < 1 or metric(metrics(admin), "master_offloads_pending") > 0:
        time.sleep(0.05)
    before_hwm, before_rss = vm(node.pid, "VmHWM"), vm(node.pid, "VmRSS")
    peak = [before_rss]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], vm(node.pid, "VmRSS"))
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    t0 = time.monotonic()
    run([moonkv, "get", "big", "-o", "/dev/null"], env)
    secs = time.monotonic() - t0
    done.set()
    t.join()
    after_hwm = vm(node.pid, "VmHWM")
    node.terminate()
    master.terminate()
    node.wait()
    master.wait()
    return {
        "rss_before_mib": before_rss / 1024,
        "rss_peak_during_read_mib": peak[0] / 1024,
        "hwm_growth_mib": (after_hwm - before_hwm) / 1024,
        "read_seconds": secs,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moonkv", default="target/release/moonkv")
    ap.add_argument("--dir", default=None, help="disk directory (default: a new one under target/)")
    ap.add_argument("--objects", type=int, default=64)
    ap.add_argument("--object-mib", type=int, default=16)
    ap.add_argument("--rss-mib", type=int, default=1024, help="size of the object read for the RSS figure")
    args = ap.parse_args()
    base = args.dir or tempfile.mkdtemp(prefix="bench-disk-", dir="target")
    os.makedirs(base, exist_ok=True)
    try:
        out = {"dd_oflag_direct_gbps": dd_direct(base, args.objects * args.object_mib)}
        d1 = os.path.join(base, "offload")
        os.makedirs(d1)
        out.update(offload_bench(args.moonkv, d1, args.objects, args.object_mib, 8))
        d2 = os.path.join(base, "rss")
        os.makedirs(d2)
        out.update(rss_bench(args.moonkv, d2, args.rss_mib))
        print(json.dumps(out, indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
