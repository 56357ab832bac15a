"""Typed errors raised by the Tidepool SDK.

Every error the daemon returns is a JSON body ``{"code": ..., "message": ...}`` with a
fitting HTTP status (see ``api/openapi.yaml``). The SDK turns it into one exception class
per code so callers can ``except tidepool.NotFound`` instead of comparing strings.
Transport failures map onto the same classes: a refused or reset connection is
:class:`Unavailable`, a client-side timeout is :class:`Timeout`.

The hierarchy::

    TidepoolError                 .code, .message, .status
    ├── InvalidArgument           400 invalid_argument
    │   ├── PayloadTooLarge       413 payload_too_large
    │   └── UnsafeArchive         (SDK) a downloaded archive broke the unpacking rules
    ├── Unauthenticated           401 unauthenticated
    ├── PermissionDenied          403 permission_denied
    ├── NotFound                  404 not_found
    ├── Conflict                  409 conflict
    ├── QuotaExceeded             429 resource_exhausted
    │   └── InsufficientStorage   507 insufficient_storage
    ├── SandboxError              500 internal (and unexpected statuses)
    ├── Unavailable               503 unavailable, connection refused/reset
    ├── Timeout                   504 deadline_exceeded, client-side timeout
    └── CommandFailed             exec(..., check=True) and the command failed
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:  # pragma: no cover - imported for type checkers only
    from .models import ExecResult

__all__ = [
    "TidepoolError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "UnsafeArchive",
    "QuotaExceeded",
    "SandboxError",
    "Unavailable",
    "Timeout",
    "InsufficientStorage",
    "CommandFailed",
    "error_from_response",
]


# Filled by the subclasses that map a status and a code (see TidepoolError.__init_subclass__).
_BY_STATUS: Dict[int, Type["TidepoolError"]] = {}
_BY_CODE: Dict[str, Type["TidepoolError"]] = {}


class TidepoolError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the server's error code (``"not_found"``, ...) or an SDK code for
            transport failures (``"unavailable"``, ``"deadline_exceeded"``).
        message: human-readable explanation.
        status: HTTP status of the response, or ``None`` when no response arrived.
    """

    #: Default code for this class, used when the server sent none.
    default_code: str = "internal"

    def __init_subclass__(cls, code: Optional[str] = None, status: Optional[int] = None, **kwargs: Any) -> None:
        # ``class NotFound(TidepoolError, code="not_found", status=404)`` sets the default
        # code and makes error_from_response pick the class for that status and code.
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.default_code = code
        if status is not None:
            _BY_STATUS[status] = cls
            _BY_CODE[cls.default_code] = cls

    def __init__(self, code: Optional[str] = None, message: str = "", status: Optional[int] = None) -> None:
        self.code: str = code or self.default_code
        self.message: str = message
        self.status: Optional[int] = status
        super().__init__(code, message, status)

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}: {self.message}{where}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, status={self.status!r})"


class InvalidArgument(TidepoolError, code="invalid_argument", status=400):
    """The request was malformed or a value was out of range (HTTP 400)."""


class Unauthenticated(TidepoolError, code="unauthenticated", status=401):
    """No or a wrong API key (HTTP 401)."""


class PermissionDenied(TidepoolError, code="permission_denied", status=403):
    """The caller may not do this: wrong key scope, or a host path it cannot read (HTTP 403)."""


class NotFound(TidepoolError, code="not_found", status=404):
    """The sandbox, file or image does not exist (HTTP 404)."""


class Conflict(TidepoolError, code="conflict", status=409):
    """The sandbox is in the wrong state for the call, e.g. exec on a stopped sandbox (HTTP 409)."""


class PayloadTooLarge(InvalidArgument, code="payload_too_large", status=413):
    """The request body is larger than the server accepts (HTTP 413); a kind of
    :class:`InvalidArgument`."""


class UnsafeArchive(InvalidArgument):
    """A tree downloaded from a sandbox (``download_dir``) was refused: the archive was
    unreadable, or an entry would land, link or point outside the target directory, pass
    through a symlink, replace a directory or symlink, or is a device or fifo. Raised by
    the SDK itself (``status`` is ``None``); a kind of :class:`InvalidArgument`."""

    default_code = "unsafe_archive"


class QuotaExceeded(TidepoolError, code="resource_exhausted", status=429):
    """A quota or the node's capacity is exhausted (HTTP 429)."""


class SandboxError(TidepoolError, code="internal", status=500):
    """The server failed internally (HTTP 500) or answered with an unexpected status."""


class Unavailable(TidepoolError, code="unavailable", status=503):
    """The daemon cannot be reached or is overloaded (HTTP 503, connection refused or reset)."""


class Timeout(TidepoolError, code="deadline_exceeded", status=504):
    """The server or the client gave up waiting (HTTP 504 or a client-side socket timeout)."""


class InsufficientStorage(QuotaExceeded, code="insufficient_storage", status=507):
    """The sandbox's disk limit is reached (HTTP 507); a kind of :class:`QuotaExceeded`."""


class CommandFailed(TidepoolError):
    """Raised by ``exec(..., check=True)`` when the command did not exit with status 0.

    Attributes:
        result: the full :class:`~tidepool.ExecResult` of the command.
    """

    default_code = "command_failed"

    def __init__(self, result: "ExecResult", message: Optional[str] = None) -> None:
        self.result: "ExecResult" = result
        if message is None:
            if result.timed_out:
                message = "command timed out"
            elif result.signal:
                message = f"command killed by signal {result.signal}"
            else:
                message = f"command exited with status {result.exit_code}"
            tail = result.stderr.strip()[-500:]
            if tail:
                message += f": {tail}"
        super().__init__("command_failed", message, None)


def error_from_response(status: Optional[int], code: Optional[str], message: str) -> TidepoolError:
    """Build the exception for an error answer.

    The HTTP status decides the class; the code decides when the status is unknown
    (e.g. an ``{"type": "error"}`` event inside a stream, which has no status of its own).
    """
    cls: Optional[Type[TidepoolError]] = _BY_STATUS.get(status) if status is not None else None
    if cls is None and code:
        cls = _BY_CODE.get(code)
    if cls is None:
        cls = SandboxError
    return cls(code or cls.default_code, message, status)
