"""Exceptions of the Pythonic layer (``moonkv.Client``).

Every exception carries the upstream error ``code`` (a negative integer, the same numbers the
drop-in ``MooncakeDistributedStore`` returns) and its ``name`` (for example
``"OBJECT_NOT_FOUND"``), plus the ``message`` moonkv wrote for it. The class is chosen by the
code, so ``except moonkv.ObjectNotFoundError`` and ``except KeyError`` both catch a miss.
"""

from __future__ import annotations

__all__ = [
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
    "error_for",
]


class MoonkvError(Exception):
    """A moonkv call failed; ``code`` and ``name`` say how (upstream's numbering)."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(code, name, message)
        self.code = code
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return f"{self.name} ({self.code}): {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code}, name={self.name!r}, message={self.message!r})"


class ObjectNotFoundError(MoonkvError, KeyError):
    """No object under this key (``OBJECT_NOT_FOUND``, -704)."""

    __str__ = MoonkvError.__str__


class ObjectExistsError(MoonkvError):
    """``put`` of a key that already exists (``OBJECT_ALREADY_EXISTS``, -705); use ``upsert``."""


class InvalidKeyError(MoonkvError, ValueError):
    """The key is empty, too long or not UTF-8 (``INVALID_KEY``, -400)."""


class InvalidParamsError(MoonkvError, ValueError):
    """A bad argument: empty batch, lists of different lengths, buffer too small, empty value
    (``INVALID_PARAMS``, -600)."""


class NoSpaceError(MoonkvError):
    """No segment has room for the object (``NO_AVAILABLE_HANDLE``, -200)."""


class ObjectBusyError(MoonkvError):
    """The object is being read or replicated (``OBJECT_HAS_LEASE`` -706 and similar); retry or
    pass ``force=True``."""


class LeaseExpiredError(MoonkvError):
    """A read outlived its lease and the object changed meanwhile (``LEASE_EXPIRED``, -707)."""


class UnavailableError(MoonkvError, ConnectionError):
    """The master or a node could not be reached, or the client is closed (``RPC_FAIL`` -900,
    ``TRANSFER_FAIL`` -800, ``UNAVAILABLE_IN_CURRENT_STATUS`` -1010)."""


class StoreTimeoutError(UnavailableError, TimeoutError):
    """The master did not answer in time (``RPC_TIMEOUT``, -901)."""


_BY_CODE = {
    -704: ObjectNotFoundError,
    -705: ObjectExistsError,
    -400: InvalidKeyError,
    -600: InvalidParamsError,
    -200: NoSpaceError,
    -706: ObjectBusyError,
    -708: ObjectBusyError,
    -714: ObjectBusyError,
    -707: LeaseExpiredError,
    -800: UnavailableError,
    -900: UnavailableError,
    -901: StoreTimeoutError,
    -1010: UnavailableError,
    -1011: UnavailableError,
}


def error_for(code: int, name: str, message: str) -> MoonkvError:
    """The exception object for an error ``code`` (used by the extension)."""
    return _BY_CODE.get(code, MoonkvError)(code, name, message)
