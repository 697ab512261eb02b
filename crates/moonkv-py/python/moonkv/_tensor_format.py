"""The object format of the tensor helpers (``moonkv/tensor.py``): a header, then the elements.

Header, little-endian, version 1::

    offset  size  field
    0       4     magic b"MKVT"
    4       1     version (1)
    5       1     framework the tensor came from: 0 NumPy, 1 PyTorch
    6       1     ndim (0 to 64)
    7       1     flags: bit 0 set when the object is one shard of a split tensor
    8       16    dtype name, ASCII, NUL-padded ("float16", "bool", "bfloat16", ...)
    24      8     length of the elements in bytes
    32      4     shard: rank            } zero unless flags bit 0
    36      4     shard: shard count     }
    40      4     shard: split dimension }
    44      4     reserved (0)
    48      8     shard: extent of the split dimension in the whole tensor
    56      8     reserved (0)
    64      8*n   shape, one u64 per axis
    64+8n   n     axis order: the axes from outermost to innermost in memory
    ...           zeros up to a multiple of 64 bytes, where the elements begin

The elements are stored densely in the order the axis-order field gives, so a C-ordered array
has the order 0..n-1, a Fortran-ordered one n-1..0, and a transposed view its permutation; read
back, the array has the same strides (an axis of length 1 gets the stride NumPy gives a fresh
array of that order). A strided view with gaps is stored dense in the same axis order.

This module knows nothing of the store: it turns arrays into (header, elements) and bytes back
into arrays, and never allocates on the word of a header (a view of bytes already read).
"""

from __future__ import annotations

import struct
import sys
from typing import Any, NamedTuple, Optional, Tuple

MAGIC = b"MKVT"
VERSION = 1
ALIGN = 64
MAX_NDIM = 64
NUMPY, TORCH = 0, 1
FLAG_SHARD = 1

_FIXED = struct.Struct("<4sBBBB16sQIIIIQQ")
FIXED_LEN = _FIXED.size  # 64

# The dtypes NumPy has, by name, and the little-endian type of their stored bits.
_NUMPY_TYPES = {
    "bool": "|b1",
    "int8": "|i1",
    "uint8": "|u1",
    "int16": "<i2",
    "uint16": "<u2",
    "int32": "<i4",
    "uint32": "<u4",
    "int64": "<i8",
    "uint64": "<u8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
}
# PyTorch dtypes NumPy lacks: their bits travel as an integer type of the same width.
_TORCH_ONLY = {
    "bfloat16": "<i2",
    "float8_e4m3fn": "|u1",
    "float8_e5m2": "|u1",
    "float8_e4m3fnuz": "|u1",
    "float8_e5m2fnuz": "|u1",
}
_TORCH_BITS = {"<i2": "int16", "|u1": "uint8"}
# No axis of a real array comes near this (it keeps the element count of an empty array's
# other axes within what NumPy can index).
_MAX_EXTENT = 1 << 40

_np: Any = None


def numpy() -> Any:
    """NumPy, imported on first use: ``import moonkv`` does not need it, the tensor helpers do."""
    global _np
    if _np is None:
        try:
            import numpy
        except ImportError:
            raise ImportError("moonkv's tensor helpers need NumPy (pip install numpy)") from None
        _np = numpy
    return _np


class Unsupported(ValueError):
    """A tensor moonkv cannot store (its dtype, its device, its layout): ``INVALID_PARAMS``."""


class NotATensor(ValueError):
    """Bytes that are not a tensor object of this format, with the reason."""


class Array(NamedTuple):
    """A tensor ready to store: its elements as a NumPy array (for PyTorch-only dtypes, their
    bits in an integer type of the same width), the dtype name and the framework it came from."""

    data: Any
    dtype: str
    framework: int


class Shard(NamedTuple):
    """Where a shard sits in the tensor it was split from."""

    rank: int
    size: int
    split_dim: int
    extent: int


class Header(NamedTuple):
    """A parsed, checked header."""

    length: int
    dtype: str
    framework: int
    shape: Tuple[int, ...]
    order: Tuple[int, ...]
    data_len: int
    shard: Optional[Shard]


def header_len(ndim: int) -> int:
    """Bytes before the elements for a tensor of `ndim` axes."""
    return -(-(FIXED_LEN + 9 * ndim) // ALIGN) * ALIGN


# ---- tensors in ------------------------------------------------------------------------------


def as_array(obj: Any) -> Array:
    """The tensor `obj` as an Array. TypeError when it is no tensor at all, Unsupported when it
    is one moonkv cannot store. Never imports torch: a PyTorch tensor means torch is loaded."""
    np = numpy()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return _from_torch(torch, obj)
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj)
    if hasattr(obj, "__dlpack__"):
        try:
            return _from_numpy(np.from_dlpack(obj))
        except (TypeError, ValueError, BufferError, RuntimeError) as e:
            raise Unsupported(f"cannot read the {type(obj).__name__} through DLPack: {e}") from None
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(
            "a tensor must be a NumPy array, a PyTorch tensor or an object exporting DLPack or "
            f"the buffer protocol, not {type(obj).__name__}"
        ) from None
    try:
        return _from_numpy(np.asarray(view))
    except (TypeError, ValueError) as e:
        raise Unsupported(f"cannot read the {type(obj).__name__} as an array: {e}") from None


def _from_numpy(arr: Any, framework: int = NUMPY) -> Array:
    dtype = arr.dtype
    if dtype.fields is not None or dtype.subdtype is not None or dtype.name not in _NUMPY_TYPES:
        raise Unsupported(f"dtype {dtype} is not supported")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.astype(dtype.newbyteorder("<"), order="K")
    return Array(arr, dtype.name, framework)


def _from_torch(torch: Any, tensor: Any) -> Array:
    if tensor.device.type != "cpu":
        raise Unsupported(f"a tensor on {tensor.device}: moonkv stores CPU tensors")
    if tensor.layout != torch.strided:
        raise Unsupported(f"a {tensor.layout} tensor: moonkv stores strided (dense) tensors")
    tensor = tensor.detach().resolve_conj().resolve_neg()
    name = str(tensor.dtype).rsplit(".", 1)[-1]
    try:
        if name in _TORCH_ONLY:
            bits = getattr(torch, _TORCH_BITS[_TORCH_ONLY[name]])
            return Array(tensor.view(bits).numpy(), name, TORCH)
        if name in _NUMPY_TYPES:
            return _from_numpy(tensor.numpy(), TORCH)
    except (TypeError, RuntimeError) as e:
        raise Unsupported(f"cannot read the torch.{name} tensor: {e}") from None
    raise Unsupported(f"dtype torch.{name} is not supported")


def layout(arr: Any) -> Tuple[Tuple[int, ...], bool]:
    """The axis order of `arr` (outermost in memory first) and whether its elements fill one
    block of memory in that order with no gap (then they can be stored as they lie)."""
    ndim = arr.ndim
    if arr.flags.c_contiguous:
        return tuple(range(ndim)), True
    if arr.flags.f_contiguous:
        return tuple(reversed(range(ndim))), True
    shape, strides = arr.shape, arr.strides
    if any(s == 0 and d > 1 for s, d in zip(strides, shape)):
        # An axis that repeats the same elements (a broadcast): stored dense in C order.
        return tuple(range(ndim)), False
    # Largest stride outermost; between equal strides the longer axis is outer, so an axis of
    # length 1 sits inside the axis whose stride it shares.
    order = sorted(range(ndim), key=lambda i: (abs(strides[i]), shape[i]), reverse=True)
    expected = arr.itemsize
    for axis in reversed(order):
        if shape[axis] == 1:
            continue
        if strides[axis] != expected:
            return tuple(order), False
        expected *= shape[axis]
    return tuple(order), True


def encode_header(array: Array, order: Tuple[int, ...], shard: Optional[Shard] = None) -> bytes:
    """The header of `array` stored in `order`."""
    arr = array.data
    ndim = arr.ndim
    if ndim > MAX_NDIM:
        raise Unsupported(f"{ndim} dimensions; at most {MAX_NDIM}")
    rank, size, split_dim, extent = shard if shard is not None else (0, 0, 0, 0)
    fixed = _FIXED.pack(
        MAGIC, VERSION, array.framework, ndim, FLAG_SHARD if shard is not None else 0,
        array.dtype.encode("ascii"), arr.nbytes, rank, size, split_dim, 0, extent, 0,
    )
    body = fixed + struct.pack(f"<{ndim}Q", *arr.shape) + bytes(order)
    return body + bytes(header_len(ndim) - len(body))


# ---- tensors out -----------------------------------------------------------------------------


def parse_header(raw: Any) -> Header:
    """Checks the header at the start of `raw` (the whole object, any bytes-like) against the
    object's length; NotATensor says what is wrong."""
    total = len(raw)
    if total < FIXED_LEN:
        raise NotATensor(f"{total} bytes, shorter than a tensor header ({FIXED_LEN})")
    fields = _FIXED.unpack(bytes(raw[:FIXED_LEN]))
    magic, version, framework, ndim, flags, dtype_raw, data_len = fields[:7]
    rank, size, split_dim, _, extent, _ = fields[7:]
    if magic != MAGIC:
        raise NotATensor(f"no tensor header (the object starts with {magic!r})")
    if version != VERSION:
        raise NotATensor(f"tensor format version {version}; this moonkv reads version {VERSION}")
    if framework not in (NUMPY, TORCH):
        raise NotATensor(f"unknown framework tag {framework}")
    if flags & ~FLAG_SHARD:
        raise NotATensor(f"unknown flags {flags:#x}")
    if ndim > MAX_NDIM:
        raise NotATensor(f"{ndim} dimensions; at most {MAX_NDIM}")
    dtype = dtype_raw.rstrip(b"\0").decode("ascii", "replace")
    if dtype not in _NUMPY_TYPES and dtype not in _TORCH_ONLY:
        raise NotATensor(f"unknown dtype {dtype!r}")
    length = header_len(ndim)
    if total < length:
        raise NotATensor(f"{total} bytes, shorter than its {length}-byte header")
    shape = struct.unpack_from(f"<{ndim}Q", bytes(raw[FIXED_LEN:FIXED_LEN + 8 * ndim]))
    order = tuple(bytes(raw[FIXED_LEN + 8 * ndim:FIXED_LEN + 9 * ndim]))
    if sorted(order) != list(range(ndim)):
        raise NotATensor(f"axis order {order} is not a permutation of {ndim} axes")
    itemsize = numpy().dtype(_bits_type(dtype)).itemsize
    expected = itemsize
    for extent_of_axis in shape:
        expected *= extent_of_axis
        if expected > total:
            break
    if max(shape, default=0) >= _MAX_EXTENT:
        raise NotATensor(f"absurd shape {shape}")
    if expected != data_len or length + data_len != total:
        raise NotATensor(
            f"shape {shape} of {dtype} needs {expected} bytes; the header says {data_len} and "
            f"the object holds {total - length}"
        )
    shard = None
    if flags & FLAG_SHARD:
        if not (size >= 1 and rank < size and split_dim < ndim):
            raise NotATensor(
                f"bad shard fields: rank {rank} of {size}, split dimension {split_dim}"
            )
        shard = Shard(rank, size, split_dim, extent)
    return Header(length, dtype, framework, tuple(shape), order, data_len, shard)


def _bits_type(dtype: str) -> str:
    return _NUMPY_TYPES.get(dtype) or _TORCH_ONLY[dtype]


def decode(raw: Any) -> Tuple[Any, Header]:
    """The tensor in `raw` (a 1-D uint8 NumPy array holding the whole object) as a view of
    `raw`, with its header. A tensor stored from PyTorch comes back as a PyTorch tensor when
    torch can be imported, else as a NumPy array (NotATensor for a PyTorch-only dtype)."""
    np = numpy()
    header = parse_header(raw)
    order = header.order
    stored_shape = [header.shape[axis] for axis in order]
    elements = raw[header.length:header.length + header.data_len]
    bits = np.dtype(_bits_type(header.dtype))
    try:
        # An empty tensor views nothing; a fresh one has NumPy's strides for its shape.
        if header.data_len:
            arr = elements.view(bits).reshape(stored_shape)
        else:
            arr = np.empty(stored_shape, bits)
    except ValueError as e:
        raise NotATensor(f"shape {header.shape}: {e}") from None
    arr = arr.transpose(inverse(order))
    if header.framework == TORCH:
        torch = _import_torch()
        tensor = _to_torch(torch, arr, header.dtype) if torch is not None else None
        if tensor is not None:
            return tensor, header
    if header.dtype in _TORCH_ONLY:
        raise NotATensor(f"a torch.{header.dtype} tensor, and PyTorch cannot be imported here")
    return arr, header


def _to_torch(torch: Any, arr: Any, dtype: str) -> Any:
    """`arr` as a PyTorch tensor sharing its memory; None when this torch has no such dtype
    (older releases lack the wider unsigned types)."""
    try:
        tensor = torch.from_numpy(arr)
        if dtype in _TORCH_ONLY:
            tensor = tensor.view(getattr(torch, dtype))
    except (TypeError, RuntimeError, AttributeError):
        return None
    return tensor


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def inverse(order: Tuple[int, ...]) -> Tuple[int, ...]:
    """The permutation that undoes `order`."""
    out = [0] * len(order)
    for position, axis in enumerate(order):
        out[axis] = position
    return tuple(out)
