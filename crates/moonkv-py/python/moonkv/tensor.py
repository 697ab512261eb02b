"""Tensor helpers of ``moonkv.MooncakeDistributedStore``: upstream's ``put_tensor`` /
``get_tensor`` family for NumPy arrays and PyTorch CPU tensors.

Each tensor is one object: a small versioned header (dtype, framework, shape, axis order; see
``moonkv/_tensor_format.py``) followed by its elements. ``get_tensor`` gives back the same
dtype, shape and strides, as a NumPy array or, for a tensor stored from PyTorch, a PyTorch
tensor when torch can be imported (torch is never imported otherwise). The bytes move through
the zero-copy calls (``moonkv/_tensor_io.py``), so ``local_buffer_size`` does not bound them.

Results follow the rest of the drop-in: writes return 0 or a negative code, reads return the
tensor or ``None`` (a miss, or a failure logged on logger ``moonkv``), batch forms one result per
key; wrong argument types raise ``TypeError``.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional, Union

from . import _tensor_format as fmt
from . import _tensor_io as tio
from ._moonkv import ReplicateConfig

log = logging.getLogger("moonkv")

INVALID_PARAMS = tio.INVALID_PARAMS
OBJECT_NOT_FOUND = tio.OBJECT_NOT_FOUND

# Bounds on what a caller may ask for: more shards than any deployment has, larger than memory.
_MAX_SHARDS = 1 << 16
_MAX_OBJECT = 1 << 62

_CPU_ONLY = "reading into CUDA memory (moonkv's tensor helpers are CPU-only)"
_SPECS = (
    "TensorParallelism, ReadTarget and writer_partition specs: the *_with_parallelism forms "
    "store and read whole tensors only, and the *_with_tp forms split along one dimension"
)
# Tensor methods of upstream's class that moonkv does not have.
NOT_IMPLEMENTED = {
    "get_tensor_into_cuda": _CPU_ONLY,
    "batch_get_tensor_into_cuda": _CPU_ONLY,
    "save_tensor_to_safetensor": "safetensors files",
    "load_tensor_from_safetensor": "safetensors files",
}


# ---- arguments -------------------------------------------------------------------------------


def _key(key: Any) -> Any:
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"a key must be str or bytes, not {type(key).__name__}")
    return key


def _items(obj: Any, what: str) -> List[Any]:
    if isinstance(obj, (str, bytes)):
        raise TypeError(f"{what} must be a list, not {type(obj).__name__}")
    try:
        return list(obj)
    except TypeError:
        raise TypeError(f"{what} must be a list, not {type(obj).__name__}") from None


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return int(value)


def _numbers(obj: Any, what: str) -> List[int]:
    numbers = [_int(v, what) for v in _items(obj, what)]
    if any(n < 0 for n in numbers):
        raise TypeError(f"{what} must hold non-negative integers")
    return numbers


def _config(config: Any) -> Optional[ReplicateConfig]:
    if config is not None and not isinstance(config, ReplicateConfig):
        raise TypeError(f"config must be a ReplicateConfig, not {type(config).__name__}")
    return config


def _tp(tp_rank: Any, tp_size: Any, split_dim: Any) -> tuple:
    return _int(tp_rank, "tp_rank"), _int(tp_size, "tp_size"), _int(split_dim, "split_dim")


def shard_key(key: Any, rank: int) -> Any:
    """The key of shard `rank` of a tensor stored under `key` by the ``*_with_tp`` forms."""
    return key + b"_tp_%d" % rank if isinstance(key, bytes) else f"{key}_tp_{rank}"


def _keys_and_tensors(keys: Any, tensors: Any, what: str) -> tuple:
    keys = [_key(k) for k in _items(keys, "keys")]
    tensors = _items(tensors, "tensors_list")
    if len(keys) != len(tensors):
        log.error("%s: %d keys but %d tensors", what, len(keys), len(tensors))
        return keys, None
    return keys, tensors


def _buffers(keys: Any, buffer_ptrs: Any, sizes: Any, what: str) -> tuple:
    keys = [_key(k) for k in _items(keys, "keys")]
    ptrs, sizes = _numbers(buffer_ptrs, "buffer_ptrs"), _numbers(sizes, "sizes")
    if not len(keys) == len(ptrs) == len(sizes):
        log.error("%s: %d keys, %d buffer pointers and %d sizes: the lists must have the same "
                  "length", what, len(keys), len(ptrs), len(sizes))
        return keys, None, None
    return keys, ptrs, sizes


# ---- writes ----------------------------------------------------------------------------------


def _piece(what: str, key: Any, tensor: Any) -> Union[tio.Piece, int]:
    try:
        return tio.piece(key, fmt.as_array(tensor))
    except fmt.Unsupported as e:
        log.error("%s(%r): %s", what, key, e)
        return INVALID_PARAMS


def _shards(what: str, key: Any, tensor: Any, tp_size: int, split_dim: int) -> List[Any]:
    """The pieces of `tensor` split in `tp_size` along `split_dim` (shard r holds rows
    [n*r//tp_size, n*(r+1)//tp_size) of that dimension), or one code when it cannot be split."""
    try:
        array = fmt.as_array(tensor)
    except fmt.Unsupported as e:
        log.error("%s(%r): %s", what, key, e)
        return [INVALID_PARAMS]
    if tp_size > _MAX_SHARDS:
        log.error("%s(%r): tp_size %d; at most %d shards", what, key, tp_size, _MAX_SHARDS)
        return [INVALID_PARAMS]
    data = array.data
    dim = split_dim + data.ndim if split_dim < 0 else split_dim
    if not 0 <= dim < data.ndim:
        log.error("%s(%r): split_dim %d of a %d-dimensional tensor", what, key, split_dim,
                  data.ndim)
        return [INVALID_PARAMS]
    extent = data.shape[dim]
    pieces = []
    for rank in range(tp_size):
        index = [slice(None)] * data.ndim
        index[dim] = slice(extent * rank // tp_size, extent * (rank + 1) // tp_size)
        part = fmt.Array(data[tuple(index)], array.dtype, array.framework)
        shard = fmt.Shard(rank, tp_size, dim, extent)
        pieces.append(tio.piece(shard_key(key, rank), part, shard))
    return pieces


def _write(store, what: str, keys, tensors, config, upsert: bool) -> List[int]:
    config = _config(config)
    keys, tensors = _keys_and_tensors(keys, tensors, what)
    if tensors is None:
        return [INVALID_PARAMS] * len(keys)
    items = [_piece(what, k, t) for k, t in zip(keys, tensors)]
    return tio.write(store, items, config, upsert)


def _write_tp(store, what: str, keys, tensors, tp, config, upsert: bool) -> List[int]:
    """Every shard of every tensor in one write; per base key, its first failing shard's code."""
    _, tp_size, split_dim = _tp(*tp)
    if tp_size <= 1:
        return _write(store, what, keys, tensors, config, upsert)
    config = _config(config)
    keys, tensors = _keys_and_tensors(keys, tensors, what)
    if tensors is None:
        return [INVALID_PARAMS] * len(keys)
    items: List[Any] = []
    spans = []
    for key, tensor in zip(keys, tensors):
        shards = _shards(what, key, tensor, tp_size, split_dim)
        spans.append((len(items), len(shards)))
        items += shards
    codes = tio.write(store, items, config, upsert)
    return [next((c for c in codes[a:a + n] if c != 0), 0) for a, n in spans]


def _write_from(store, what: str, keys, buffer_ptrs, sizes, config, upsert: bool) -> List[int]:
    """Writes tensor objects the caller holds in registered memory (header and elements, as
    ``get_tensor_into`` leaves them); each header is checked first."""
    config = _config(config)
    keys, ptrs, sizes = _buffers(keys, buffer_ptrs, sizes, what)
    if ptrs is None:
        return [INVALID_PARAMS] * len(keys)
    codes = [_check_object(store, what, k, p, s) for k, p, s in zip(keys, ptrs, sizes)]
    go = [i for i, c in enumerate(codes) if c == 0]
    if go:
        call = store.batch_upsert_from if upsert else store.batch_put_from
        results = call([keys[i] for i in go], [ptrs[i] for i in go], [sizes[i] for i in go], config)
        for i, rc in zip(go, results):
            codes[i] = int(rc)
    return codes


def _check_object(store, what: str, key: Any, ptr: int, size: int) -> int:
    if ptr == 0 or size >= _MAX_OBJECT:
        log.error("%s(%r): buffer_ptr %#x with size %d is no buffer", what, key, ptr, size)
        return INVALID_PARAMS
    # The header is read from caller memory: only from memory the caller registered, so a
    # wrong pointer is refused instead of crashing the process.
    if not store._is_registered(ptr, size):
        log.error("%s(%r): %#x+%d is not inside a registered buffer (register_buffer first)",
                  what, key, ptr, size)
        return INVALID_PARAMS
    try:
        fmt.parse_header(tio.caller_memory(ptr, size))
    except fmt.NotATensor as e:
        log.error("%s(%r): the buffer holds no tensor object: %s", what, key, e)
        return INVALID_PARAMS
    return 0


def _write_tp_from(store, what: str, keys, buffer_ptrs, sizes, tp, config) -> List[int]:
    """Splits the tensor objects held in caller memory and writes their shards."""
    _, tp_size, _ = _tp(*tp)
    if tp_size <= 1:
        return _write_from(store, what, keys, buffer_ptrs, sizes, config, False)
    keys, ptrs, sizes = _buffers(keys, buffer_ptrs, sizes, what)
    if ptrs is None:
        return [INVALID_PARAMS] * len(keys)
    codes = [_check_object(store, what, k, p, s) for k, p, s in zip(keys, ptrs, sizes)]
    tensors = [_decode(what, k, tio.caller_memory(p, s)) if c == 0 else None
               for k, p, s, c in zip(keys, ptrs, sizes, codes)]
    codes = [0 if t is not None else INVALID_PARAMS for t in tensors]
    go = [i for i, c in enumerate(codes) if c == 0]
    results = _write_tp(store, what, [keys[i] for i in go], [tensors[i] for i in go], tp, config,
                        False)
    for i, rc in zip(go, results):
        codes[i] = rc
    return codes


# ---- reads -----------------------------------------------------------------------------------


def _decode(what: str, key: Any, raw: Any, tp: Optional[tuple] = None) -> Any:
    """The tensor in `raw` (object bytes, or the code reading them failed with), or None."""
    if isinstance(raw, int):
        if raw == OBJECT_NOT_FOUND:
            log.debug("%s(%r): no such object", what, key)
        else:
            log.error("%s(%r): the read failed with %d", what, key, raw)
        return None
    try:
        tensor, header = fmt.decode(raw)
    except fmt.NotATensor as e:
        log.error("%s(%r): not a tensor object: %s", what, key, e)
        return None
    if tp is not None:
        rank, size = tp
        shard = header.shard
        if shard is None or (shard.rank, shard.size) != (rank, size):
            found = "a whole tensor" if shard is None else f"shard {shard.rank} of {shard.size}"
            log.error("%s(%r): holds %s, not shard %d of %d", what, key, found, rank, size)
            return None
    return tensor


def _read(store, what: str, keys: List[Any], tp: Optional[tuple] = None) -> List[Any]:
    if not keys:
        return []
    return [_decode(what, k, raw, tp) for k, raw in zip(keys, tio.read(store, keys))]


def _read_keys(base_keys: List[Any], tp: tuple) -> tuple:
    """The keys to read for rank `tp_rank` of `tp_size`, and the shard to expect (None whole)."""
    tp_rank, tp_size, _ = _tp(*tp)
    if tp_size <= 1:
        return base_keys, None
    return [shard_key(k, tp_rank) for k in base_keys], (tp_rank, tp_size)


def _refused_batch(what: str, keys, buffer_ptrs) -> Optional[List[int]]:
    """A batch read into buffers whose arguments are unusable as a whole (lists of different
    lengths, a null pointer) answers INVALID_PARAMS for every key, as upstream's does, instead
    of a tensor or None per key; `None` when the batch can go ahead."""
    if buffer_ptrs is None:  # _buffers logged the lengths
        return [INVALID_PARAMS] * len(keys)
    if any(ptr == 0 for ptr in buffer_ptrs):
        log.error("%s: a buffer pointer is 0", what)
        return [INVALID_PARAMS] * len(keys)
    return None


def _read_into(store, what: str, keys, buffer_ptrs, sizes, expect=None) -> List[Any]:
    """Reads each object into the caller's registered buffer; arrays viewing that memory."""
    if buffer_ptrs is None:
        return [None] * len(keys)
    ptrs = buffer_ptrs
    if len(keys) == 1:
        results = [store.get_into(keys[0], ptrs[0], sizes[0])]
    else:
        results = store.batch_get_into(keys, ptrs, sizes) if keys else []
    out = []
    for key, ptr, size, n in zip(keys, ptrs, sizes, results):
        n = int(n)
        if n == INVALID_PARAMS:
            log.error("%s(%r): reading into %#x+%d failed (INVALID_PARAMS: is the buffer "
                      "registered and as large as the object?)", what, key, ptr, size)
            out.append(None)
            continue
        out.append(_decode(what, key, n if n < 0 else tio.caller_memory(ptr, n), expect))
    return out


class TensorMethods:
    """The tensor helpers, mixed into ``moonkv.MooncakeDistributedStore``."""

    __slots__ = ()

    # -- whole tensors

    def put_tensor(self, key, tensor, config=None) -> int:
        """Stores `tensor` (NumPy array or PyTorch CPU tensor) under `key`; 0 or a negative code
        (0 also when the key exists: the first value stays)."""
        return _write(self, "put_tensor", [_key(key)], [tensor], config, False)[0]

    def pub_tensor(self, key, tensor, config=None) -> int:
        """``put_tensor`` with a ReplicateConfig."""
        return _write(self, "pub_tensor", [_key(key)], [tensor], config, False)[0]

    def upsert_tensor(self, key, tensor, config=None) -> int:
        """Stores or replaces `tensor` under `key`."""
        return _write(self, "upsert_tensor", [_key(key)], [tensor], config, True)[0]

    def upsert_pub_tensor(self, key, tensor, config=None) -> int:
        """``upsert_tensor`` with a ReplicateConfig."""
        return _write(self, "upsert_pub_tensor", [_key(key)], [tensor], config, True)[0]

    def batch_put_tensor(self, keys, tensors_list, config=None) -> List[int]:
        """``put_tensor`` for each key, in one batch; a code per key."""
        return _write(self, "batch_put_tensor", keys, tensors_list, config, False)

    def batch_pub_tensor(self, keys, tensors_list, config=None) -> List[int]:
        """``batch_put_tensor`` with a ReplicateConfig."""
        return _write(self, "batch_pub_tensor", keys, tensors_list, config, False)

    def batch_upsert_tensor(self, keys, tensors_list, config=None) -> List[int]:
        """``upsert_tensor`` for each key; a code per key."""
        return _write(self, "batch_upsert_tensor", keys, tensors_list, config, True)

    def batch_upsert_pub_tensor(self, keys, tensors_list, config=None) -> List[int]:
        """``batch_upsert_tensor`` with a ReplicateConfig."""
        return _write(self, "batch_upsert_pub_tensor", keys, tensors_list, config, True)

    def get_tensor(self, key):
        """The tensor stored under `key`, in new memory; None on a miss or error (logged)."""
        return _read(self, "get_tensor", [_key(key)])[0]

    def batch_get_tensor(self, keys) -> list:
        """``get_tensor`` for each key (None where it failed)."""
        return _read(self, "batch_get_tensor", [_key(k) for k in _items(keys, "keys")])

    # -- registered memory

    def get_tensor_into(self, key, buffer_ptr, size):
        """Reads the tensor object (header and elements) into `[buffer_ptr, buffer_ptr + size)`,
        registered with ``register_buffer``; returns a tensor viewing that memory, or None."""
        keys, ptrs, sizes = _buffers([key], [buffer_ptr], [size], "get_tensor_into")
        return _read_into(self, "get_tensor_into", keys, ptrs, sizes)[0]

    def batch_get_tensor_into(self, keys, buffer_ptrs, sizes) -> list:
        """``get_tensor_into`` for each key, in one batch."""
        keys, ptrs, sizes = _buffers(keys, buffer_ptrs, sizes, "batch_get_tensor_into")
        refused = _refused_batch("batch_get_tensor_into", keys, ptrs)
        if refused is not None:
            return refused
        return _read_into(self, "batch_get_tensor_into", keys, ptrs, sizes)

    def put_tensor_from(self, key, buffer_ptr, size, config=None) -> int:
        """Stores the tensor object held at `[buffer_ptr, buffer_ptr + size)` (registered; laid
        out as ``get_tensor_into`` leaves it) after checking its header."""
        return _write_from(self, "put_tensor_from", [key], [buffer_ptr], [size], config, False)[0]

    def batch_put_tensor_from(self, keys, buffer_ptrs, sizes, config=None) -> List[int]:
        """``put_tensor_from`` for each key; a code per key."""
        return _write_from(self, "batch_put_tensor_from", keys, buffer_ptrs, sizes, config, False)

    def upsert_tensor_from(self, key, buffer_ptr, size, config=None) -> int:
        """``put_tensor_from`` that replaces an existing object."""
        return _write_from(self, "upsert_tensor_from", [key], [buffer_ptr], [size], config, True)[0]

    def batch_upsert_tensor_from(self, keys, buffer_ptrs, sizes, config=None) -> List[int]:
        """``upsert_tensor_from`` for each key; a code per key."""
        return _write_from(self, "batch_upsert_tensor_from", keys, buffer_ptrs, sizes, config,
                           True)

    # -- tensor-parallel shards: shard r of n lives under f"{key}_tp_{r}"

    def put_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0,
                           config=None) -> int:
        """Splits `tensor` along `split_dim` into `tp_size` shards and stores every one
        (`tp_rank` is accepted for compatibility); with `tp_size <= 1`, ``put_tensor``."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "put_tensor_with_tp", [_key(key)], [tensor], tp, config, False)[0]

    def batch_put_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1, split_dim=0,
                                 config=None) -> List[int]:
        """``put_tensor_with_tp`` for each key; per key 0 or its first failing shard's code."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "batch_put_tensor_with_tp", base_keys, tensors_list, tp, config,
                         False)

    def pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1,
                           split_dim=0) -> int:
        """``put_tensor_with_tp`` with a ReplicateConfig (upstream's argument order)."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "pub_tensor_with_tp", [_key(key)], [tensor], tp, config, False)[0]

    def batch_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0, tp_size=1,
                                 split_dim=0) -> List[int]:
        """``batch_put_tensor_with_tp`` with a ReplicateConfig."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "batch_pub_tensor_with_tp", base_keys, tensors_list, tp, config,
                         False)

    def upsert_tensor_with_tp(self, key, tensor, tp_rank=0, tp_size=1, split_dim=0,
                              config=None) -> int:
        """``put_tensor_with_tp`` that replaces existing shards."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "upsert_tensor_with_tp", [_key(key)], [tensor], tp, config, True)[0]

    def batch_upsert_tensor_with_tp(self, base_keys, tensors_list, tp_rank=0, tp_size=1,
                                    split_dim=0, config=None) -> List[int]:
        """``upsert_tensor_with_tp`` for each key."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "batch_upsert_tensor_with_tp", base_keys, tensors_list, tp, config,
                         True)

    def upsert_pub_tensor_with_tp(self, key, tensor, config=None, tp_rank=0, tp_size=1,
                                  split_dim=0) -> int:
        """``upsert_tensor_with_tp`` with a ReplicateConfig."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "upsert_pub_tensor_with_tp", [_key(key)], [tensor], tp, config,
                         True)[0]

    def batch_upsert_pub_tensor_with_tp(self, base_keys, tensors_list, config=None, tp_rank=0,
                                        tp_size=1, split_dim=0) -> List[int]:
        """``batch_upsert_tensor_with_tp`` with a ReplicateConfig."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp(self, "batch_upsert_pub_tensor_with_tp", base_keys, tensors_list, tp,
                         config, True)

    def get_tensor_with_tp(self, key, tp_rank=0, tp_size=1, split_dim=0):
        """Shard `tp_rank` of `tp_size` (checked against the shard's header); with
        `tp_size <= 1`, ``get_tensor``. `split_dim` is accepted for compatibility."""
        keys, expect = _read_keys([_key(key)], (tp_rank, tp_size, split_dim))
        return _read(self, "get_tensor_with_tp", keys, expect)[0]

    def batch_get_tensor_with_tp(self, base_keys, tp_rank=0, tp_size=1, split_dim=0) -> list:
        """``get_tensor_with_tp`` for each key."""
        base = [_key(k) for k in _items(base_keys, "base_keys")]
        keys, expect = _read_keys(base, (tp_rank, tp_size, split_dim))
        return _read(self, "batch_get_tensor_with_tp", keys, expect)

    def get_tensor_with_tp_into(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0):
        """``get_tensor_into`` of shard `tp_rank` of `tp_size`."""
        base, ptrs, sizes = _buffers([key], [buffer_ptr], [size], "get_tensor_with_tp_into")
        keys, expect = _read_keys(base, (tp_rank, tp_size, split_dim))
        return _read_into(self, "get_tensor_with_tp_into", keys, ptrs, sizes, expect)[0]

    def batch_get_tensor_with_tp_into(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0) -> list:
        """``get_tensor_with_tp_into`` for each key."""
        what = "batch_get_tensor_with_tp_into"
        base, ptrs, sizes = _buffers(base_keys, buffer_ptrs, sizes, what)
        refused = _refused_batch(what, base, ptrs)
        if refused is not None:
            return refused
        keys, expect = _read_keys(base, (tp_rank, tp_size, split_dim))
        return _read_into(self, what, keys, ptrs, sizes, expect)

    def put_tensor_with_tp_from(self, key, buffer_ptr, size, tp_rank=0, tp_size=1, split_dim=0,
                                config=None) -> int:
        """Splits the tensor object held at `buffer_ptr` and stores its shards."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp_from(self, "put_tensor_with_tp_from", [key], [buffer_ptr], [size], tp,
                              config)[0]

    def batch_put_tensor_with_tp_from(self, base_keys, buffer_ptrs, sizes, tp_rank=0, tp_size=1,
                                      split_dim=0, config=None) -> List[int]:
        """``put_tensor_with_tp_from`` for each key."""
        tp = (tp_rank, tp_size, split_dim)
        return _write_tp_from(self, "batch_put_tensor_with_tp_from", base_keys, buffer_ptrs, sizes,
                              tp, config)

    # -- the unified parallelism forms, for whole tensors: with no spec (None, upstream's
    # default) each is its plain form; any spec raises NotImplementedError naming it.

    def put_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                    writer_partition=None) -> int:
        """``put_tensor`` when `parallelism` and `writer_partition` are None."""
        _whole("put_tensor_with_parallelism", parallelism=parallelism,
               writer_partition=writer_partition)
        return self.put_tensor(key, tensor, config)

    def batch_put_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                          config=None, writer_partitions=None) -> List[int]:
        """``batch_put_tensor`` when no key has a spec."""
        _whole("batch_put_tensor_with_parallelism", parallelisms=parallelisms,
               writer_partitions=writer_partitions)
        return self.batch_put_tensor(keys, tensors_list, config)

    def put_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                         config=None, writer_partition=None) -> int:
        """``put_tensor_from`` when `parallelism` and `writer_partition` are None."""
        _whole("put_tensor_with_parallelism_from", parallelism=parallelism,
               writer_partition=writer_partition)
        return self.put_tensor_from(key, buffer_ptr, size, config)

    def batch_put_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes, parallelisms=None,
                                               config=None, writer_partitions=None) -> List[int]:
        """``batch_put_tensor_from`` when no key has a spec."""
        _whole("batch_put_tensor_with_parallelism_from", parallelisms=parallelisms,
               writer_partitions=writer_partitions)
        return self.batch_put_tensor_from(keys, buffer_ptrs, sizes, config)

    def upsert_tensor_with_parallelism(self, key, tensor, parallelism=None, config=None,
                                       writer_partition=None) -> int:
        """``upsert_tensor`` when `parallelism` and `writer_partition` are None."""
        _whole("upsert_tensor_with_parallelism", parallelism=parallelism,
               writer_partition=writer_partition)
        return self.upsert_tensor(key, tensor, config)

    def batch_upsert_tensor_with_parallelism(self, keys, tensors_list, parallelisms=None,
                                             config=None, writer_partitions=None) -> List[int]:
        """``batch_upsert_tensor`` when no key has a spec."""
        _whole("batch_upsert_tensor_with_parallelism", parallelisms=parallelisms,
               writer_partitions=writer_partitions)
        return self.batch_upsert_tensor(keys, tensors_list, config)

    def upsert_tensor_with_parallelism_from(self, key, buffer_ptr, size, parallelism=None,
                                            config=None, writer_partition=None) -> int:
        """``upsert_tensor_from`` when `parallelism` and `writer_partition` are None."""
        _whole("upsert_tensor_with_parallelism_from", parallelism=parallelism,
               writer_partition=writer_partition)
        return self.upsert_tensor_from(key, buffer_ptr, size, config)

    def batch_upsert_tensor_with_parallelism_from(self, keys, buffer_ptrs, sizes,
                                                  parallelisms=None, config=None,
                                                  writer_partitions=None) -> List[int]:
        """``batch_upsert_tensor_from`` when no key has a spec."""
        _whole("batch_upsert_tensor_with_parallelism_from", parallelisms=parallelisms,
               writer_partitions=writer_partitions)
        return self.batch_upsert_tensor_from(keys, buffer_ptrs, sizes, config)

    def get_tensor_with_parallelism(self, key, target=None):
        """``get_tensor`` when `target` is None (the tensor as stored)."""
        _whole("get_tensor_with_parallelism", target=target)
        return self.get_tensor(key)

    def batch_get_tensor_with_parallelism(self, keys, targets=None) -> list:
        """``batch_get_tensor`` when no key has a target."""
        _whole("batch_get_tensor_with_parallelism", targets=targets)
        return self.batch_get_tensor(keys)

    def get_tensor_with_parallelism_into(self, key, buffer_ptr, size, target=None):
        """``get_tensor_into`` when `target` is None."""
        _whole("get_tensor_with_parallelism_into", target=target)
        return self.get_tensor_into(key, buffer_ptr, size)

    def batch_get_tensor_with_parallelism_into(self, keys, buffer_ptrs, sizes,
                                               targets=None) -> list:
        """``batch_get_tensor_into`` when no key has a target."""
        _whole("batch_get_tensor_with_parallelism_into", targets=targets)
        return self.batch_get_tensor_into(keys, buffer_ptrs, sizes)


def _whole(what: str, **specs: Any) -> None:
    """Refuses a parallelism, read-target or writer-partition spec (a batch's list of them
    counts as none when every entry is None): moonkv stores and reads whole tensors here."""
    for name, spec in specs.items():
        if spec is None:
            continue
        if isinstance(spec, (list, tuple)) and all(item is None for item in spec):
            continue
        raise NotImplementedError(
            f"MooncakeDistributedStore.{what}: {name} is not implemented by moonkv ({_SPECS}); "
            f"pass None to store or read the whole tensor"
        )
