"""A client of `moonkv indexer`: ask how much of a prompt each instance holds, per tier.

    from moonkv import Indexer
    hits = Indexer("http://indexer:13333").query(token_ids, model="llama", block_size=16)
    # {"vllm-0": {"longest_matched": 256, "GPU": 128, "CPU": 256, "DISK": 256, "DP": {"0": 256}}}

Only the standard library is needed. With `msgpack` installed, `Indexer(url, msgpack=True)`
sends MessagePack with the token ids as one little-endian int32 byte string, which is what
makes long prompts cheap to send and parse.
"""

from __future__ import annotations

import array
import json
import sys
import urllib.error
import urllib.request
from typing import Any, Iterable, Optional

__all__ = ["Indexer", "IndexerError"]


class IndexerError(RuntimeError):
    """The indexer refused a request; `status` and `code` say why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


class Indexer:
    """The HTTP API of `moonkv indexer` at `url` (for example `http://127.0.0.1:13333`)."""

    def __init__(self, url: str, *, msgpack: bool = False, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._msgpack = None
        if msgpack:
            import msgpack as _msgpack  # optional dependency, imported only when asked for

            self._msgpack = _msgpack

    def query(
        self,
        token_ids: Iterable[int],
        *,
        model: str,
        block_size: int,
        tenant_id: Optional[str] = None,
        instance_id: Optional[str] = None,
        lora_name: Optional[str] = None,
        cache_salt: Optional[str] = None,
    ) -> dict:
        """Matched prefix tokens per instance of the tenant: `longest_matched`, `GPU`, `CPU`,
        `DISK` (cumulative, GPU <= CPU <= DISK) and `DP` (per data-parallel rank). Instances
        holding nothing are left out."""
        body: dict[str, Any] = {"model": model, "block_size": block_size}
        if self._msgpack is not None:
            ids = array.array("i", token_ids)
            if sys.byteorder != "little":
                ids.byteswap()
            body["token_ids"] = ids.tobytes()
        else:
            body["token_ids"] = list(token_ids)
        for name, value in (
            ("tenant_id", tenant_id),
            ("instance_id", instance_id),
            ("lora_name", lora_name),
            ("cache_salt", cache_salt),
        ):
            if value is not None:
                body[name] = value
        answer = self._post("/query", body)
        return answer.get(tenant_id or "default", {})

    def register(self, **source: Any) -> dict:
        """`POST /register` with the source's fields (`type`, `endpoint`, `modelname`,
        `instance_id`, `block_size`, ...)."""
        return self._post("/register", source)

    def unregister(self, instance_id: str, **fields: Any) -> dict:
        """`POST /unregister`: every source of `instance_id` (narrowed by `tenant_id`,
        `dp_rank`, `type`, `endpoint`)."""
        return self._post("/unregister", {"instance_id": instance_id, **fields})

    def health(self) -> dict:
        """`GET /health`."""
        return self._request(urllib.request.Request(self.url + "/health"), json_answer=True)

    def _post(self, path: str, body: dict) -> Any:
        if self._msgpack is not None:
            data = self._msgpack.packb(body, use_bin_type=True)
            ctype = "application/msgpack"
        else:
            data = json.dumps(body).encode()
            ctype = "application/json"
        req = urllib.request.Request(
            self.url + path, data=data, method="POST", headers={"Content-Type": ctype}
        )
        return self._request(req, json_answer=self._msgpack is None)

    def _request(self, req: urllib.request.Request, json_answer: bool) -> Any:
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                err = self._decode(raw, e.headers.get("Content-Type", ""))
                raise IndexerError(e.code, err.get("code", ""), err.get("error", "")) from None
            except (ValueError, AttributeError):
                raise IndexerError(e.code, "http", raw.decode(errors="replace")) from None
        return json.loads(raw) if json_answer else self._msgpack.unpackb(raw, raw=False)

    def _decode(self, raw: bytes, ctype: str) -> dict:
        if "msgpack" in ctype and self._msgpack is not None:
            return self._msgpack.unpackb(raw, raw=False)
        return json.loads(raw)
