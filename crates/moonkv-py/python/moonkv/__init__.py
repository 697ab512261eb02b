"""moonkv: the Python client of the moonkv distributed KV-cache store.

Two layers over one Rust core:

* ``moonkv.MooncakeDistributedStore`` is a drop-in for ``mooncake.store.MooncakeDistributedStore``
  (same method names, argument order, keyword names and integer results), so a connector
  switches with ``from moonkv import MooncakeDistributedStore``.
* ``moonkv.Client`` is the Pythonic layer: exceptions (``moonkv.MoonkvError`` and subclasses,
  each with ``code`` and ``name``), values as bytes / bytearray / memoryview / NumPy arrays,
  and a context manager::

      with moonkv.Client("127.0.0.1:50051") as kv:
          kv.put("k", b"v")
          assert kv.get("k") == b"v"

Every call releases the GIL while it waits; one store or client may be shared by threads.
See docs/python.md for the method table and the zero-copy rules.
"""

from __future__ import annotations

import atexit as _atexit
import enum as _enum

from . import _moonkv
from ._moonkv import (
    MAX_KEY_LEN,
    Client,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ReplicaDescriptor,
    ReplicateConfig,
    __version__,
)
from .errors import (
    InvalidKeyError,
    InvalidParamsError,
    LeaseExpiredError,
    MoonkvError,
    NoSpaceError,
    ObjectBusyError,
    ObjectExistsError,
    ObjectNotFoundError,
    StoreTimeoutError,
    UnavailableError,
    error_for as _error_for,
)

__all__ = [
    "MooncakeDistributedStore",
    "Client",
    "ReplicateConfig",
    "SoftPinAction",
    "ReplicaStatus",
    "ObjectDataType",
    "BufferHandle",
    "ReplicaDescriptor",
    "MemoryDescriptor",
    "DiskDescriptor",
    "Descriptor",
    "MoonkvError",
    "ObjectNotFoundError",
    "ObjectExistsError",
    "InvalidKeyError",
    "InvalidParamsError",
    "NoSpaceError",
    "ObjectBusyError",
    "LeaseExpiredError",
    "UnavailableError",
    "StoreTimeoutError",
    "MAX_KEY_LEN",
    "NOT_IMPLEMENTED",
]


class SoftPinAction(_enum.IntEnum):
    """``ReplicateConfig.soft_pin_action``."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ReplicaStatus(_enum.IntEnum):
    """``ReplicaDescriptor.status`` (upstream's numbering; moonkv lists readable replicas, so
    ``COMPLETE`` is what reads see)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ObjectDataType(_enum.IntEnum):
    """``ReplicateConfig.data_type``: a tag kept for compatibility, not used by moonkv."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class BufferHandle(bytearray):
    """What ``get_buffer`` returns: the object's bytes in a bytearray (so ``memoryview``,
    ``numpy.frombuffer`` and ``torch.frombuffer`` work on it), with upstream's ``ptr()`` and
    ``size()``. It holds its share of the local buffer until it is garbage-collected."""

    def ptr(self) -> int:
        """Address of the bytes (valid while the handle lives and is not resized)."""
        return _moonkv._bytearray_address(self)

    def size(self) -> int:
        """Length in bytes."""
        return len(self)


# Upstream methods moonkv does not have. Each raises NotImplementedError naming itself rather
# than pretending to succeed.
NOT_IMPLEMENTED = {
    "init_all": "transfer-engine initialisation; setup() does everything",
    "mount_segment": "mounting file-backed segments",
    "unmount_segment": "unmounting segments by id",
    "allocate_and_mount_segment": "mounting extra segments after setup",
    "unmount_and_free_segment": "unmounting segments by id",
    "unmount_local_disk_segment": "the client-side SSD tier (moonkv nodes have a disk tier instead)",
    "get_offload_rpc_read_count": "the client-side SSD tier",
    "create_copy_task": "replica copy tasks",
    "create_move_task": "replica move tasks",
    "query_task": "replica copy/move tasks",
    "_get_pyclient_capsule": "upstream's internal client handle",
}
# The tensor helpers (moonkv/tensor.py) are mixed into the class below; the tensor methods they
# lack join the list.
from . import tensor as _tensor  # noqa: E402
from .indexer import Indexer, IndexerError  # noqa: E402,F401

NOT_IMPLEMENTED.update(_tensor.NOT_IMPLEMENTED)


def _not_implemented(name: str, what: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(
            f"MooncakeDistributedStore.{name} is not implemented by moonkv ({what})"
        )

    method.__name__ = name
    method.__qualname__ = f"MooncakeDistributedStore.{name}"
    method.__doc__ = f"Not implemented by moonkv: {what}. Raises NotImplementedError."
    return method


class MooncakeDistributedStore(_tensor.TensorMethods, _moonkv.MooncakeDistributedStore):
    """Drop-in for ``mooncake.store.MooncakeDistributedStore``; see docs/python.md."""

    __slots__ = ()


for _name, _what in NOT_IMPLEMENTED.items():
    setattr(MooncakeDistributedStore, _name, _not_implemented(_name, _what))
del _name, _what


def bind_to_numa_node(node: int) -> None:
    """Not implemented by moonkv (upstream binds the thread to a NUMA node)."""
    raise NotImplementedError("moonkv.bind_to_numa_node is not implemented by moonkv")


_moonkv._install(_error_for, BufferHandle)
# Stores never closed unmount their memory when the interpreter exits, before Python tears
# down the objects holding them (garbage collection closes the others as it frees them).
_atexit.register(_moonkv._close_all)
