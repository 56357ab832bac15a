"""HTTP transport of the synchronous client (internal).

Requests are described by :class:`Request` values built in ``_api.py`` and executed here
with ``http.client``, so the asyncio client can reuse the same request building and
response parsing with its own transport.

Connections: each thread keeps a small stack of idle keep-alive connections; a call takes
one, and gives it back when the response was read completely and the server did not ask
to close. A streaming call holds its connection until the stream is exhausted or closed,
so other calls from the same thread meanwhile get their own connection.

Retries: a kept-alive connection may have been closed by the server while idle. Before
reuse the socket is polled for EOF; if a reused connection still fails before any byte of
the answer arrived, the request is sent once more on a fresh connection, but only for
idempotent methods (GET, PUT, DELETE), so a command is never run twice.

Thread rules: one :class:`SyncTransport` may be shared by any number of threads.
"""
from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from .errors import SandboxError, TidepoolError, Timeout, Unavailable, error_from_response

__all__ = ["Request", "Response", "SyncTransport", "DEFAULT", "error_for"]


class _Default:
    """Sentinel: use the client's default timeout."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()

_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
_MAX_IDLE_PER_THREAD = 4


@dataclass
class Request:
    """One HTTP request, independent of the transport that sends it.

    ``timeout`` is the socket read timeout in seconds, ``None`` to wait forever, or
    ``DEFAULT`` for the client's timeout.
    """

    method: str
    path: str
    query: List[Tuple[str, str]] = field(default_factory=list)
    body: Optional[bytes] = None
    content_type: Optional[str] = None
    timeout: Any = DEFAULT
    headers: Dict[str, str] = field(default_factory=dict)

    @property
    def idempotent(self) -> bool:
        """True when sending the request twice has the effect of sending it once."""
        return self.method.upper() in _IDEMPOTENT

    def target(self, base_path: str = "") -> str:
        """Path plus encoded query string."""
        path = base_path.rstrip("/") + self.path
        if self.query:
            path += "?" + urllib.parse.urlencode(self.query, quote_via=urllib.parse.quote, safe="/")
        return path


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


class _Retry(Exception):
    """Internal: the reused connection was stale; send again on a fresh one."""


class SyncTransport:
    """Sends :class:`Request` values over keep-alive ``http.client`` connections."""

    def __init__(self, url: str, api_key: Optional[str], timeout: Optional[float], user_agent: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"unsupported Tidepool URL {url!r}: expected http://HOST:PORT")
        self.url = url
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._https else 80)
        self._base_path = parsed.path.rstrip("/")
        self._timeout = timeout
        self._headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: "set[http.client.HTTPConnection]" = set()
        self._closed = False

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

    # -- requests ----------------------------------------------------------------

    def _read_timeout(self, req: Request) -> Optional[float]:
        return self._timeout if req.timeout is DEFAULT else req.timeout

    def _send(self, conn: http.client.HTTPConnection, req: Request, reused: bool) -> http.client.HTTPResponse:
        headers = dict(self._headers)
        headers.update(req.headers)
        if req.content_type:
            headers["Content-Type"] = req.content_type
        try:
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(self._read_timeout(req))
            conn.request(req.method, req.target(self._base_path), body=req.body, headers=headers)
            return conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as e:
            self._discard(conn)
            if reused and req.idempotent:
                raise _Retry() from e
            raise Unavailable("unavailable", f"connection to {self.url} lost: {e}", None) from None
        except socket.timeout:
            self._discard(conn)
            raise Timeout("deadline_exceeded", f"no answer from {self.url} for {req.method} {req.path} in time", None) from None
        except (ConnectionRefusedError, socket.gaierror) as e:
            self._discard(conn)
            raise Unavailable("unavailable", f"cannot connect to {self.url}: {e}", None) from None
        except (OSError, http.client.HTTPException) as e:
            self._discard(conn)
            raise Unavailable("unavailable", f"{req.method} {req.path} to {self.url} failed: {e}", None) from None

    def _open(self, req: Request) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        for _ in range(2):
            conn, reused = self._acquire()
            try:
                return conn, self._send(conn, req, reused)
            except _Retry:
                continue
        conn = self._new_connection()
        return conn, self._send(conn, req, False)

    def _read_all(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, req: Request) -> bytes:
        try:
            body = resp.read()
        except socket.timeout:
            self._discard(conn)
            raise Timeout("deadline_exceeded", f"answer to {req.method} {req.path} stalled", None) from None
        except (OSError, http.client.HTTPException) as e:
            self._discard(conn)
            raise Unavailable("unavailable", f"answer to {req.method} {req.path} cut: {e}", None) from None
        if resp.will_close:
            self._discard(conn)
        else:
            self._release(conn)
        return body

    def request(self, req: Request) -> Response:
        """Sends ``req`` and returns the answer; statuses >= 400 raise the matching error."""
        conn, resp = self._open(req)
        body = self._read_all(conn, resp, req)
        if resp.status >= 400:
            raise error_for(resp.status, body)
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)

    def stream_lines(self, req: Request) -> "LineStream":
        """Sends ``req`` and returns its answer as a stream of lines (NDJSON).

        An error status raises before any line is returned.
        """
        conn, resp = self._open(req)
        if resp.status >= 400:
            body = self._read_all(conn, resp, req)
            raise error_for(resp.status, body)
        return LineStream(self, conn, resp, req)


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
        return self._transport._read_all(conn, self._resp, self._req)

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


Body = Union[bytes, bytearray, memoryview, str]
