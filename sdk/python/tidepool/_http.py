"""HTTP transport of the synchronous client (internal).

Requests are described by :class:`Request` values built in ``_api.py`` and executed here
with ``http.client``; the asyncio transport (``_aio.py``) sends the same values and both
parse answers with the same code.

Connections: each thread keeps a small stack of idle keep-alive connections; a call takes
one, and gives it back when the response was read completely and the server did not ask
to close. A streaming call holds its connection until the stream is exhausted or closed,
so other calls from the same thread meanwhile get their own connection.

Retries (policy in ``_retry.py``): every state-changing request carries an
``Idempotency-Key`` header, the same on every attempt of one call. A connection refused,
reset or closed before the whole answer arrived, and an answer of 503, are retried with
exponential backoff and jitter; requests that are neither GETs nor keyed are never
re-sent after they may have reached the daemon. A kept-alive connection the server
closed while idle is detected before reuse; if a reused connection still fails before
any byte of the answer arrived, the request goes again at once on a fresh connection.

Where: ``http://HOST:PORT`` (TCP; an API key, when given, is sent as ``Authorization:
Bearer``) or ``unix:/PATH`` (the daemon's unix socket, where it knows the caller by its uid
and no key is needed). :func:`default_url` picks the socket when it exists.

Thread rules: one :class:`SyncTransport` may be shared by any number of threads.
"""
from __future__ import annotations

import http.client
import json
import os
import select
import stat
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from ._retry import (DEFAULT_RETRY, IDEMPOTENCY_HEADER, MUTATING_METHODS, ON_DISCONNECT_HEADER, RetryPolicy,
                     new_idempotency_key)
from .errors import SandboxError, TidepoolError, Timeout, Unavailable, error_from_response

__all__ = ["Request", "Response", "SyncTransport", "DEFAULT", "error_for", "prepare", "Failure",
           "default_url", "DEFAULT_SOCKET"]

#: The daemon's unix socket when ``TIDEPOOL_SOCKET`` does not name another.
DEFAULT_SOCKET = "/run/tidepool/tidepool.sock"
_DEFAULT_TCP_URL = "http://127.0.0.1:7070"


def default_url() -> str:
    """``$TIDEPOOL_URL``, else ``unix:`` + the socket (``$TIDEPOOL_SOCKET`` or
    :data:`DEFAULT_SOCKET`) when it exists, else ``http://127.0.0.1:7070``."""
    env = os.environ.get("TIDEPOOL_URL")
    if env:
        return env
    path = os.environ.get("TIDEPOOL_SOCKET") or DEFAULT_SOCKET
    try:
        if stat.S_ISSOCK(os.stat(path).st_mode):
            return "unix:" + path
    except OSError:
        pass
    return _DEFAULT_TCP_URL


def unix_socket_path(parsed: urllib.parse.SplitResult, url: str) -> Optional[str]:
    """The socket path of a ``unix:`` URL, None for other schemes."""
    if parsed.scheme != "unix":
        return None
    path = parsed.path
    if not path.startswith("/"):
        raise ValueError(f"unsupported Tidepool URL {url!r}: expected unix:/PATH/TO/SOCKET")
    return path


class _UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over an AF_UNIX stream socket."""

    def __init__(self, path: str, timeout: Optional[float]) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _Default:
    """Sentinel: use the client's default timeout."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_IDLE_PER_THREAD = 4


@dataclass
class Request:
    """One HTTP request, independent of the transport that sends it.

    ``timeout`` is the read timeout in seconds, ``None`` to wait forever, or ``DEFAULT``
    for the client's timeout.
    """

    method: str
    path: str
    query: List[Tuple[str, Union[str, bytes]]] = field(default_factory=list)
    body: Optional[bytes] = None
    content_type: Optional[str] = None
    timeout: Any = DEFAULT
    headers: Dict[str, str] = field(default_factory=dict)
    #: Running it twice does no harm (a function-tier run changes nothing): it may be
    #: retried without an idempotency key, and gets none by default (the daemon would
    #: record its answer durably).
    stateless: bool = False

    @property
    def retryable(self) -> bool:
        """True when sending the request again cannot run anything twice: it changes
        nothing, or it carries an idempotency key the daemon recognises on a repeat."""
        return self.method.upper() in _SAFE or self.stateless or IDEMPOTENCY_HEADER in self.headers

    def target(self, base_path: str = "") -> str:
        """Path plus encoded query string."""
        path = base_path.rstrip("/") + self.path
        if self.query:
            path += "?" + urllib.parse.urlencode(self.query, quote_via=urllib.parse.quote, safe="/")
        return path


def prepare(req: Request, idempotency_key: Optional[str] = None) -> Request:
    """Gives a state-changing request its idempotency key (the caller's, else a uuid4).

    Called once per logical call, before the first attempt, so every retry repeats the key.
    A key of the caller's own makes the call a step: a command it starts runs to its end
    even if this client goes away (``Tidepool-On-Disconnect: finish``), its result kept
    for the key; with the SDK's own key the daemon kills it unless a retry comes soon.
    """
    if req.method.upper() in MUTATING_METHODS and IDEMPOTENCY_HEADER not in req.headers and not (
            req.stateless and not idempotency_key):
        req.headers[IDEMPOTENCY_HEADER] = idempotency_key or new_idempotency_key()
    elif idempotency_key:
        req.headers[IDEMPOTENCY_HEADER] = idempotency_key
    if idempotency_key:
        req.headers[ON_DISCONNECT_HEADER] = "finish"
    return req


def json_request(method: str, path: str, obj: Any, **kwargs: Any) -> Request:
    """A request whose body is ``obj`` encoded as JSON."""
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return Request(method, path, body=body, content_type="application/json", **kwargs)


@dataclass
class Response:
    """A complete (non-streamed) answer."""

    status: int
    headers: Dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body decoded as JSON; a malformed body raises :class:`SandboxError`."""
        try:
            return json.loads(self.body.decode("utf-8")) if self.body else {}
        except (ValueError, UnicodeDecodeError) as e:
            raise SandboxError("internal", f"malformed JSON answer (HTTP {self.status}): {e}", self.status) from None


def error_for(status: int, body: bytes) -> TidepoolError:
    """Exception for an error answer: the JSON ``{code, message}`` if present, else the text."""
    code: Optional[str] = None
    message = ""
    try:
        obj = json.loads(body.decode("utf-8"))
        if isinstance(obj, dict):
            code = obj.get("code") if isinstance(obj.get("code"), str) else None
            message = str(obj.get("message", ""))
    except (ValueError, UnicodeDecodeError):
        pass
    if not message:
        message = body.decode("utf-8", errors="replace").strip()[:500] or http.client.responses.get(status, "error")
    return error_from_response(status, code, message)


def retry_after(headers: Dict[str, str]) -> Optional[float]:
    """The ``Retry-After`` header in seconds, when present and numeric."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class Failure(Exception):
    """Internal: one attempt failed.

    ``error`` is what the caller sees if no retry follows; ``sent`` is False when the
    request certainly did not reach the daemon (so any request may go again); ``stale``
    marks a reused keep-alive connection that failed before any answer byte (retried at
    once, without backoff); ``retry_after`` is the server's hint in seconds.
    """

    def __init__(self, error: TidepoolError, sent: bool, stale: bool = False,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.sent = sent
        self.stale = stale
        self.retry_after = retry_after

    def may_retry(self, req: Request) -> bool:
        """True when this failure allows sending ``req`` again (policy permitting)."""
        return not self.sent or req.retryable


def complete_answer(status: int, headers: Dict[str, str], body: bytes) -> Response:
    """The :class:`Response` of a whole answer; an error status raises its error (503 as a
    retryable :class:`Failure`)."""
    if status == 503:
        raise Failure(error_for(status, body), sent=True, retry_after=retry_after(headers))
    if status >= 400:
        raise error_for(status, body)
    return Response(status, headers, body)


class Retries:
    """The retry decisions of one logical call (no I/O, no sleeping: the transport waits)."""

    def __init__(self, req: Request, policy: RetryPolicy) -> None:
        prepare(req)
        self._req = req
        self._policy = policy
        self._attempt = 0
        self._stale_retries = 0

    def start(self) -> None:
        """Counts the attempt about to be made."""
        self._attempt += 1

    def delay_after(self, f: Failure) -> Optional[float]:
        """Seconds to wait before trying again after ``f`` (None: retry at once, without
        backoff); raises ``f.error`` when no retry follows."""
        if not f.may_retry(self._req):
            raise f.error from None
        if f.stale and self._stale_retries < 2:
            # Not counted: the server closed an idle connection, nothing is wrong.
            self._stale_retries += 1
            self._attempt -= 1
            return None
        if not self._policy.allows(self._attempt):
            raise f.error from None
        return self._policy.delay(self._attempt - 1, f.retry_after)


class SyncTransport:
    """Sends :class:`Request` values over keep-alive ``http.client`` connections."""

    def __init__(self, url: str, api_key: Optional[str], timeout: Optional[float], user_agent: str,
                 retry: RetryPolicy = DEFAULT_RETRY) -> None:
        parsed = urllib.parse.urlsplit(url)
        self._unix = unix_socket_path(parsed, url)
        if self._unix is None and (parsed.scheme not in ("http", "https") or not parsed.hostname):
            raise ValueError(f"unsupported Tidepool URL {url!r}: expected http://HOST:PORT or unix:/PATH")
        self.url = url
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname or "localhost"
        self._port = parsed.port or (443 if self._https else 80)
        self._base_path = "" if self._unix else parsed.path.rstrip("/")
        self._timeout = timeout
        self.retry = retry
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        # The unix socket knows the caller by its uid: a key is only for TCP.
        if api_key and self._unix is None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: "set[http.client.HTTPConnection]" = set()
        self._closed = False
        #: When set to a list, every attempt appends ``(method, path)`` (for tests and tracing).
        self.trace: Optional[List[Tuple[str, str]]] = None

    # -- connections -------------------------------------------------------------

    def _idle(self) -> List[http.client.HTTPConnection]:
        idle = getattr(self._local, "idle", None)
        if idle is None:
            idle = []
            self._local.idle = idle
        return idle

    def _new_connection(self) -> http.client.HTTPConnection:
        if self._closed:
            raise Unavailable("unavailable", "client is closed", None)
        if self._unix is not None:
            conn: http.client.HTTPConnection = _UnixHTTPConnection(self._unix, self._timeout)
        else:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self._timeout)
        with self._lock:
            self._all.add(conn)
        return conn

    def _acquire(self) -> Tuple[http.client.HTTPConnection, bool]:
        """Returns (connection, reused)."""
        idle = self._idle()
        while idle:
            conn = idle.pop()
            if conn.sock is not None and not self._stale(conn.sock):
                return conn, True
            self._discard(conn)
        return self._new_connection(), False

    @staticmethod
    def _stale(sock: socket.socket) -> bool:
        # An idle keep-alive socket that is readable has been closed by the server
        # (or carries garbage): either way it must not be reused.
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def _release(self, conn: http.client.HTTPConnection) -> None:
        idle = self._idle()
        if self._closed or len(idle) >= _MAX_IDLE_PER_THREAD or conn.sock is None:
            self._discard(conn)
        else:
            idle.append(conn)

    def _discard(self, conn: http.client.HTTPConnection) -> None:
        try:
            conn.close()
        finally:
            with self._lock:
                self._all.discard(conn)

    def close(self) -> None:
        """Closes every connection of every thread; later calls raise :class:`Unavailable`."""
        self._closed = True
        with self._lock:
            conns = list(self._all)
            self._all.clear()
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    # -- one attempt -------------------------------------------------------------

    def _read_timeout(self, req: Request) -> Optional[float]:
        return self._timeout if req.timeout is DEFAULT else req.timeout

    def _send(self, req: Request) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends one attempt and reads the status line and headers; raises :class:`Failure`."""
        conn, reused = self._acquire()
        headers = dict(self._headers)
        headers.update(req.headers)
        if req.content_type:
            headers["Content-Type"] = req.content_type
        connected = conn.sock is not None
        try:
            if conn.sock is None:
                conn.connect()
                connected = True
            conn.sock.settimeout(self._read_timeout(req))
            if self.trace is not None:
                self.trace.append((req.method, req.path))
            conn.request(req.method, req.target(self._base_path), body=req.body, headers=headers)
            return conn, conn.getresponse()
        except socket.timeout:
            self._discard(conn)
            if not connected:
                raise Failure(Unavailable("unavailable", f"cannot connect to {self.url}: timed out", None), sent=False) from None
            raise Timeout("deadline_exceeded", f"no answer from {self.url} for {req.method} {req.path} in time", None) from None
        except (ConnectionRefusedError, socket.gaierror) as e:
            self._discard(conn)
            raise Failure(Unavailable("unavailable", f"cannot connect to {self.url}: {e}", None), sent=False) from None
        except (OSError, http.client.HTTPException) as e:
            self._discard(conn)
            err = Unavailable("unavailable", f"connection to {self.url} lost during {req.method} {req.path}: {e}", None)
            # A reused idle connection the server closed meanwhile: not a daemon failure.
            raise Failure(err, sent=connected, stale=reused) from None

    def _read_all(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, req: Request) -> bytes:
        try:
            body = resp.read()
        except socket.timeout:
            self._discard(conn)
            raise Timeout("deadline_exceeded", f"answer to {req.method} {req.path} stalled", None) from None
        except (OSError, http.client.HTTPException) as e:
            self._discard(conn)
            raise Failure(Unavailable("unavailable", f"answer to {req.method} {req.path} cut: {e}", None), sent=True) from None
        if resp.will_close:
            self._discard(conn)
        else:
            self._release(conn)
        return body

    def _attempt(self, req: Request) -> Response:
        conn, resp = self._send(req)
        body = self._read_all(conn, resp, req)
        return complete_answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)

    # -- calls -------------------------------------------------------------------

    def _with_retries(self, req: Request, attempt_fn: Any) -> Any:
        retries = Retries(req, self.retry)
        while True:
            retries.start()
            try:
                return attempt_fn(req)
            except Failure as f:
                delay = retries.delay_after(f)
            if delay is not None:
                time.sleep(delay)

    def request(self, req: Request) -> Response:
        """Sends ``req`` (retrying transient failures) and returns the answer; statuses
        >= 400 raise the matching error."""
        return self._with_retries(req, self._attempt)

    def stream_lines(self, req: Request) -> "LineStream":
        """Sends ``req`` and returns its answer as a stream of lines (NDJSON).

        An error status raises before any line is returned. Failures before the answer's
        headers are retried like :meth:`request`; a stream cut later is not.
        """
        def attempt(r: Request) -> LineStream:
            conn, resp = self._send(r)
            if resp.status >= 400:
                complete_answer(resp.status, {k.lower(): v for k, v in resp.getheaders()},
                                self._read_all(conn, resp, r))
            return LineStream(self, conn, resp, r)

        try:
            return self._with_retries(req, attempt)
        except Failure as f:  # pragma: no cover - _with_retries converts every Failure
            raise f.error from None


class LineStream:
    """Lines of a streamed answer; owns its connection until exhausted or closed."""

    def __init__(
        self,
        transport: SyncTransport,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        req: Request,
    ) -> None:
        self._transport = transport
        self._conn: Optional[http.client.HTTPConnection] = conn
        self._resp = resp
        self._req = req
        self.content_type: str = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._conn is None:
            raise StopIteration
        try:
            line = self._resp.readline()
        except socket.timeout:
            self.close()
            raise Timeout("deadline_exceeded", f"stream of {self._req.method} {self._req.path} stalled", None) from None
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise Unavailable("unavailable", f"stream of {self._req.method} {self._req.path} cut: {e}", None) from None
        if not line:
            self._finish()
            raise StopIteration
        return line

    def read_rest(self) -> bytes:
        """Reads whatever is left of the body (for non-NDJSON answers)."""
        if self._conn is None:
            return b""
        conn, self._conn = self._conn, None
        try:
            return self._transport._read_all(conn, self._resp, self._req)
        except Failure as f:
            raise f.error from None

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._resp.isclosed() and not self._resp.will_close:
            self._transport._release(conn)
        else:
            self._transport._discard(conn)

    def close(self) -> None:
        """Abandons the stream; the connection is closed since its answer was not read."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._discard(conn)

    def __enter__(self) -> "LineStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
