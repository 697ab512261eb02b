"""How the tensor helpers move objects: registered memory and the drop-in's zero-copy calls.

Writes go through ``batch_put_from_multi_buffers`` (a header buffer and the tensor's own memory,
no copy) when the tensor lies dense in memory, else through one staging buffer per call holding
every object (header, then the elements) and ``batch_put_from`` / ``batch_upsert_from``. Reads
ask the master for the objects' sizes, read each into memory of its own with ``batch_get_into``
and hand back arrays that view it. None of this is bounded by ``local_buffer_size``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

from . import _tensor_format as fmt

log = logging.getLogger("moonkv")

INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
# Reads that find the object grew between asking its size and reading it try this many times.
_READ_ATTEMPTS = 3


class Lending:
    """The registrations the tensor helpers hold for calls under way, shared between threads.

    A region is registered one byte longer than the memory it covers, so it never equals a
    range the caller registered itself: registering an equal range is a no-op, and the
    unregistration at the end of the call would then drop the caller's own. Calls whose memory
    is covered by a region already held share it; the last one out unregisters it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(store) -> [start, end, users]; ids are stable because the store is alive while
        # one of its calls holds a region.
        self._held: Dict[int, List[List[int]]] = {}

    @contextlib.contextmanager
    def lend(self, store: Any, spans: Sequence[Tuple[int, int]]) -> Iterator[List[int]]:
        """Registers the memory of `spans` (address, length > 0) for the body of the `with`;
        yields, per span, 0 when it is registered, else the code its registration was refused
        with (its memory overlaps a buffer the caller registered, or another call's region)."""
        regions, region_of = _merge(spans)
        taken: List[List[int]] = []
        codes: List[int] = []
        with self._lock:
            held = self._held.setdefault(id(store), [])
            for start, end in regions:
                entry = next((e for e in held if e[0] <= start and end <= e[1]), None)
                if entry is None:
                    rc = store.register_buffer(start, end - start + 1)
                    if rc != 0:
                        codes.append(rc)
                        continue
                    entry = [start, end, 0]
                    held.append(entry)
                entry[2] += 1
                taken.append(entry)
                codes.append(0)
        try:
            yield [codes[region_of[i]] for i in range(len(spans))]
        finally:
            self._release(store, taken)

    def _release(self, store: Any, taken: List[List[int]]) -> None:
        with self._lock:
            held = self._held.get(id(store), [])
            for entry in taken:
                entry[2] -= 1
                if entry[2] == 0:
                    held.remove(entry)
                    store.unregister_buffer(entry[0])
            if not held:
                self._held.pop(id(store), None)


def _merge(spans: Sequence[Tuple[int, int]]) -> Tuple[List[Tuple[int, int]], List[int]]:
    """Regions [start, end) covering `spans`, touching or overlapping spans joined, and the
    region of each span."""
    regions: List[Tuple[int, int]] = []
    region_of = [0] * len(spans)
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end = spans[i][0], spans[i][0] + spans[i][1]
        if regions and start <= regions[-1][1]:
            regions[-1] = (regions[-1][0], max(regions[-1][1], end))
        else:
            regions.append((start, end))
        region_of[i] = len(regions) - 1
    return regions, region_of


LENDING = Lending()


class Piece(NamedTuple):
    """One object to write: a key, the tensor and how its elements lie."""

    key: Any
    array: fmt.Array
    order: Tuple[int, ...]
    dense: bool
    header: bytes

    @property
    def nbytes(self) -> int:
        return int(self.array.data.nbytes)


def piece(key: Any, array: fmt.Array, shard: Optional[fmt.Shard] = None) -> Piece:
    order, dense = fmt.layout(array.data)
    return Piece(key, array, order, dense, fmt.encode_header(array, order, shard))


# Whether the store has the multi-buffer put (a build of the extension may lack it).
_multi_buffers = True


def write(store: Any, items: List[Union[Piece, int]], config: Any, upsert: bool) -> List[int]:
    """Writes each Piece of `items` (an int there is already that item's result); a code per
    item."""
    codes = [item if isinstance(item, int) else 0 for item in items]
    todo = [(i, p) for i, p in enumerate(items) if not isinstance(p, int)]
    in_place = [not upsert and p.dense and p.nbytes > 0 for _, p in todo]
    direct = [ip for ip, yes in zip(todo, in_place) if yes]
    staged = [ip for ip, yes in zip(todo, in_place) if not yes]
    if direct and _multi_buffers:
        staged += _write_in_place(store, direct, config, codes)
    else:
        staged += direct
    if staged:
        _write_staged(store, sorted(staged, key=lambda ip: ip[0]), config, upsert, codes)
    return codes


def _write_in_place(store: Any, todo: List[Tuple[int, Piece]], config: Any, codes: List[int]):
    """Headers from one buffer, elements from the tensors' own memory; returns the items whose
    memory could not be registered (they are written through a staging buffer instead)."""
    global _multi_buffers
    np = fmt.numpy()
    headers = np.frombuffer(b"".join(p.header for _, p in todo), dtype=np.uint8).copy()
    base = headers.ctypes.data
    spans = [(base, headers.nbytes)] + [(p.array.data.ctypes.data, p.nbytes) for _, p in todo]
    with LENDING.lend(store, spans) as refusals:
        if refusals[0]:
            return todo
        go, later, offsets, offset = [], [], [], 0
        for (i, p), refused in zip(todo, refusals[1:]):
            (later if refused else go).append((i, p))
            if not refused:
                offsets.append(offset)
            offset += len(p.header)
        if not go:
            return later
        try:
            results = store.batch_put_from_multi_buffers(
                [p.key for _, p in go],
                [[base + off, p.array.data.ctypes.data] for off, (_, p) in zip(offsets, go)],
                [[len(p.header), p.nbytes] for _, p in go],
                config,
            )
        except NotImplementedError:
            _multi_buffers = False
            return todo
    for (i, _), rc in zip(go, results):
        codes[i] = int(rc)
    return later


def _write_staged(store, todo: List[Tuple[int, Piece]], config, upsert: bool, codes: List[int]):
    """Every object of `todo` laid out in one staging buffer, written with one batch call."""
    np = fmt.numpy()
    sizes = [len(p.header) + p.nbytes for _, p in todo]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // fmt.ALIGN) * fmt.ALIGN
    arena = np.empty(total, dtype=np.uint8)
    for offset, (_, p) in zip(offsets, todo):
        head = len(p.header)
        arena[offset:offset + head] = np.frombuffer(p.header, dtype=np.uint8)
        if p.nbytes:
            data = p.array.data
            stored = [data.shape[axis] for axis in p.order]
            dst = arena[offset + head:offset + head + p.nbytes].view(data.dtype).reshape(stored)
            np.copyto(dst, data.transpose(p.order))
    base = arena.ctypes.data
    with LENDING.lend(store, [(base, total)]) as refusals:
        if refusals[0]:
            log.error("tensor write: registering a %d-byte staging buffer failed (%d)", total,
                      refusals[0])
            results = [refusals[0]] * len(todo)
        else:
            call = store.batch_upsert_from if upsert else store.batch_put_from
            results = call([p.key for _, p in todo], [base + o for o in offsets], sizes, config)
    for (i, _), rc in zip(todo, results):
        codes[i] = int(rc)


# ---- reads -----------------------------------------------------------------------------------


def read(store: Any, keys: List[Any]) -> List[Union[Any, int]]:
    """Each object as a 1-D uint8 array of its own, or the code reading it failed with."""
    if len(keys) == 1:
        return [_read_one(store, keys[0])]
    sizes = _sizes(store, keys)
    out: List[Union[Any, int]] = [size if size < 0 else _empty() for size in sizes]
    wanted = [i for i, size in enumerate(sizes) if size > 0]
    results = _read_into_own(store, [keys[i] for i in wanted], [sizes[i] for i in wanted])
    for i, result in zip(wanted, results):
        # A read that found the object grown since its size was asked is read again alone.
        out[i] = _read_one(store, keys[i]) if _too_small(result) else result
    return out


def _too_small(result: Any) -> bool:
    """Whether a read answered INVALID_PARAMS: its buffer was smaller than the object."""
    return isinstance(result, int) and result == INVALID_PARAMS


def _empty() -> Any:
    np = fmt.numpy()
    return np.empty(0, dtype=np.uint8)


def _sizes(store: Any, keys: List[Any]) -> List[int]:
    """Object sizes from one master request; OBJECT_NOT_FOUND for the keys it did not list."""
    found = store.batch_get_replica_desc(keys)
    sizes = []
    for key in keys:
        replicas = found.get(key if isinstance(key, str) else _text(key)) or []
        sizes.append(int(replicas[0].size) if replicas else OBJECT_NOT_FOUND)
    return sizes


def _text(key: bytes) -> Any:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return key


def _read_one(store: Any, key: Any) -> Union[Any, int]:
    result: Union[Any, int] = OBJECT_NOT_FOUND
    for _ in range(_READ_ATTEMPTS):
        size = store.get_size(key)
        if size <= 0:
            return int(size) if size < 0 else _empty()
        result = _read_into_own(store, [key], [int(size)])[0]
        if not _too_small(result):
            return result
    return result


def _read_into_own(store: Any, keys: List[Any], sizes: List[int]) -> List[Union[Any, int]]:
    """Reads each key into a new buffer of the given size; the filled part, or a code
    (INVALID_PARAMS when the object outgrew its buffer)."""
    if not keys:
        return []
    np = fmt.numpy()
    bufs = [np.empty(size, dtype=np.uint8) for size in sizes]
    ptrs = [buf.ctypes.data for buf in bufs]
    out: List[Union[Any, int]] = []
    with LENDING.lend(store, list(zip(ptrs, sizes))) as refusals:
        go = [i for i, refused in enumerate(refusals) if not refused]
        if len(go) == 1:
            results = [store.get_into(keys[go[0]], ptrs[go[0]], sizes[go[0]])]
        else:
            results = store.batch_get_into([keys[i] for i in go], [ptrs[i] for i in go],
                                           [sizes[i] for i in go])
    by_item = dict(zip(go, results))
    for i, buf in enumerate(bufs):
        if i not in by_item:
            log.error("tensor read: registering a %d-byte buffer failed (%d)", sizes[i],
                      refusals[i])
            out.append(int(refusals[i]))
            continue
        n = int(by_item[i])
        out.append(buf[:n] if n >= 0 else n)
    return out


def caller_memory(ptr: int, size: int) -> Any:
    """A writable uint8 array over `size` bytes of the caller's memory at `ptr` (the caller
    keeps that memory alive while the array is used)."""
    import ctypes

    np = fmt.numpy()
    if size == 0:
        return np.empty(0, dtype=np.uint8)
    return np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(ptr))
