"""Tidepool Python SDK: create sandboxes, run commands, move files.

Standard library only. Quick start::

    import tidepool

    client = tidepool.Client()                 # $TIDEPOOL_URL or http://127.0.0.1:7070
    with client.create(image="host", memory_mb=512, ttl=600) as sb:
        r = sb.exec("echo hello; exit 3")
        print(r.exit_code, r.stdout)           # 3 hello

Errors are typed exceptions, all subclasses of :class:`TidepoolError`.
"""
from .client import DEFAULT_URL, Client, Files, Sandbox
from .errors import (
    CommandFailed,
    Conflict,
    InsufficientStorage,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
    SandboxError,
    TidepoolError,
    Timeout,
    Unauthenticated,
    Unavailable,
)
from .models import ExecResult, FileEntry, OutputChunk, SandboxInfo
from .version import __version__

__all__ = [
    "Client",
    "Sandbox",
    "Files",
    "SandboxInfo",
    "ExecResult",
    "OutputChunk",
    "FileEntry",
    "TidepoolError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "QuotaExceeded",
    "SandboxError",
    "Unavailable",
    "Timeout",
    "InsufficientStorage",
    "CommandFailed",
    "DEFAULT_URL",
    "__version__",
]
