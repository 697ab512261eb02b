"""`moonkv.Indexer` against a real `moonkv indexer`, fed by a vLLM-format publisher (pyzmq +
msgpack) in this process: register, query in JSON and in MessagePack, removal, unregister and
precise errors, as a router would call them."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import moonkv
from conftest import eventually, moonkv_bin

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

BLOCK = 4


@pytest.fixture
def indexer():
    proc = subprocess.Popen(
        [moonkv_bin(), "indexer", "--host", "127.0.0.1", "--http-port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["event"] == "ready", ready
    yield f"http://{ready['http']}"
    proc.kill()
    proc.wait(timeout=30)


class Engine:
    """A vLLM-format KV event publisher (multipart: topic, 8-byte sequence, msgpack batch)."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:*")
        self.endpoint = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0

    def send(self, *events) -> None:
        payload = msgpack.packb([time.time(), list(events), 0], use_bin_type=True)
        self.pub.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def close(self) -> None:
        self.pub.close()
        self.ctx.term()


def stored(hashes, parent, tokens, medium="GPU"):
    return ["BlockStored", hashes, parent, tokens, BLOCK, None, medium]


def test_a_router_registers_an_engine_and_queries_its_prefix_in_json_and_msgpack(indexer):
    plain, packed = moonkv.Indexer(indexer), moonkv.Indexer(indexer, msgpack=True)
    assert plain.health()
    engine = Engine()
    try:
        plain.register(type="vLLM", endpoint=engine.endpoint, modelname="m", instance_id="w0", block_size=BLOCK)
        prompt = list(range(100, 111))  # two full blocks and a partial one
        # The subscription takes a moment to arrive: publish until the first block shows.
        def first_block_seen():
            engine.send(stored([1], None, prompt[:BLOCK]))
            return plain.query(prompt, model="m", block_size=BLOCK).get("w0")

        got = eventually("the engine's first block indexed", first_block_seen, timeout=20, step=0.1)
        assert got["longest_matched"] == BLOCK
        engine.send(stored([2], 1, prompt[BLOCK : 2 * BLOCK]))
        eventually(
            "the second block indexed",
            lambda: plain.query(prompt, model="m", block_size=BLOCK).get("w0", {}).get("longest_matched") == 2 * BLOCK,
        )
        # The trailing partial block never counts; JSON and MessagePack agree.
        for client in (plain, packed):
            hits = client.query(prompt, model="m", block_size=BLOCK)
            assert hits["w0"]["longest_matched"] == 2 * BLOCK
            assert hits["w0"]["GPU"] == 2 * BLOCK
        # A prompt that diverges in its first block matches nothing; another model knows nothing.
        assert plain.query([7] * 8, model="m", block_size=BLOCK) == {}
        assert plain.query(prompt, model="other", block_size=BLOCK) == {}
        # A removed block shortens the match to what is left before it.
        engine.send(["BlockRemoved", [2], "GPU"])
        eventually(
            "the removal applied",
            lambda: plain.query(prompt, model="m", block_size=BLOCK).get("w0", {}).get("longest_matched") == BLOCK,
        )
        plain.unregister("w0")
        assert packed.query(prompt, model="m", block_size=BLOCK) == {}
    finally:
        engine.close()


def test_bad_requests_get_precise_errors(indexer):
    client = moonkv.Indexer(indexer)
    with pytest.raises(moonkv.IndexerError) as e:
        client.query([1, 2, 3, 4], model="m", block_size=0)
    assert 400 <= e.value.status < 500, e.value
    with pytest.raises(moonkv.IndexerError) as e:
        client.register(type="nonsense", endpoint="tcp://127.0.0.1:1", modelname="m", instance_id="x", block_size=4)
    assert 400 <= e.value.status < 500, e.value
