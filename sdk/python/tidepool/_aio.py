"""HTTP/1.1 transport of the asyncio client (internal), on asyncio streams only.

Sends the same :class:`~tidepool._http.Request` values as the sync transport and applies
the same retry rules (``_retry.py``): every state-changing request carries one
``Idempotency-Key`` for all its attempts; connection failures and 503 answers are retried
with exponential backoff and jitter.

Connections: a pool of keep-alive connections shared by every task of the client.
At most ``max_connections`` requests are in flight at once (HTTP/1.1 has one request per
connection at a time); further calls wait for a free slot. An idle connection the server
closed is detected before reuse. A call that is cancelled or times out closes its
connection (its answer was not read), which also tells the daemon to stop a command
that runs for nobody.

Bodies: ``Content-Length``, ``Transfer-Encoding: chunked``, or until the server closes.

Thread rules: use one :class:`AsyncTransport` from tasks of one event loop at a time;
used from a new loop later (a second ``asyncio.run``), it drops the old loop's pool.
"""
from __future__ import annotations

import asyncio
import socket
import urllib.parse
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Tuple, TypeVar

from ._http import DEFAULT, Failure, Request, Response, Retries, complete_answer, unix_socket_path
from ._retry import DEFAULT_RETRY, RetryPolicy
from .errors import SandboxError, Timeout, Unavailable

__all__ = ["AsyncTransport", "AsyncLineStream"]

T = TypeVar("T")

_LIMIT = 1 << 20           # longest header line accepted
_READ_BLOCK = 1 << 16
_BODYLESS_METHODS = ("POST", "PUT", "PATCH")


class _Conn:
    """One keep-alive connection."""

    __slots__ = ("reader", "writer", "uses")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.uses = 0

    def usable(self) -> bool:
        # EOF already seen (server closed it while idle), or the transport is closing.
        if self.writer.is_closing() or self.reader.at_eof() or self.reader.exception() is not None:
            return False
        return True

    def close(self) -> None:
        try:
            self.writer.close()
        except (OSError, RuntimeError):  # loop already closed
            pass


class _Head:
    __slots__ = ("status", "headers", "keep_alive")

    def __init__(self, status: int, headers: Dict[str, str], keep_alive: bool) -> None:
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive


class _BodyReader:
    """Reads one answer's body in pieces: by length, chunked, or until EOF."""

    def __init__(self, reader: asyncio.StreamReader, head: _Head, method: str) -> None:
        self._r = reader
        te = head.headers.get("transfer-encoding", "").lower()
        self.chunked = "chunked" in te
        self.remaining: Optional[int] = None
        self.done = False
        self.until_eof = False
        if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
            self.done = True
        elif self.chunked:
            pass
        elif "content-length" in head.headers:
            try:
                self.remaining = int(head.headers["content-length"])
            except ValueError:
                raise SandboxError("internal", f"bad Content-Length {head.headers['content-length']!r}") from None
            self.done = self.remaining == 0
        else:
            self.until_eof = True
        self._chunk_left = 0

    async def read(self) -> bytes:
        """The next piece of the body; b"" at its end."""
        if self.done:
            return b""
        if self.remaining is not None:
            data = await self._r.read(min(self.remaining, _READ_BLOCK))
            if not data:
                raise asyncio.IncompleteReadError(b"", self.remaining)
            self.remaining -= len(data)
            self.done = self.remaining == 0
            return data
        if self.until_eof:
            data = await self._r.read(_READ_BLOCK)
            if not data:
                self.done = True
            return data
        # chunked
        if self._chunk_left == 0:
            line = await self._r.readline()
            if not line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(line, None)
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise SandboxError("internal", f"bad chunk size {size_text[:40]!r}") from None
            if size == 0:
                # Trailers, then the empty line.
                while True:
                    t = await self._r.readline()
                    if not t.endswith(b"\n"):
                        raise asyncio.IncompleteReadError(t, None)
                    if t in (b"\r\n", b"\n"):
                        break
                self.done = True
                return b""
            self._chunk_left = size
        data = await self._r.read(min(self._chunk_left, _READ_BLOCK))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._chunk_left)
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            crlf = await self._r.readline()
            if crlf not in (b"\r\n", b"\n"):
                raise SandboxError("internal", "chunk not followed by CRLF")
        return data

    async def read_all(self) -> bytes:
        parts: List[bytes] = []
        while True:
            d = await self.read()
            if not d:
                return b"".join(parts)
            parts.append(d)


_NET_ERRORS = (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError)


class AsyncTransport:
    """Sends :class:`Request` values over pooled keep-alive connections (asyncio)."""

    def __init__(self, url: str, api_key: Optional[str], timeout: Optional[float], user_agent: str,
                 retry: RetryPolicy = DEFAULT_RETRY, max_connections: int = 256) -> None:
        parsed = urllib.parse.urlsplit(url)
        self._unix = unix_socket_path(parsed, url)
        if self._unix is None and (parsed.scheme != "http" or not parsed.hostname):
            raise ValueError(f"unsupported Tidepool URL {url!r}: expected http://HOST:PORT or unix:/PATH")
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.url = url
        self._host = parsed.hostname or "localhost"
        self._port = parsed.port or 80
        self._base_path = "" if self._unix else parsed.path.rstrip("/")
        self._timeout = timeout
        self.retry = retry
        self.max_connections = max_connections
        host_header = self._host if self._port == 80 else f"{self._host}:{self._port}"
        if ":" in self._host and not self._host.startswith("["):
            host_header = f"[{self._host}]:{self._port}"
        fixed = [f"Host: {host_header}", f"User-Agent: {user_agent}"]
        if api_key and self._unix is None:  # the unix socket knows the caller by its uid
            fixed.append(f"Authorization: Bearer {api_key}")
        self._fixed_headers = "\r\n".join(fixed) + "\r\n"
        self._idle: List[_Conn] = []
        self._all: Set[_Conn] = set()
        self._sem: Optional[asyncio.Semaphore] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        #: When set to a list, every attempt appends ``(method, path)`` (for tests and tracing).
        self.trace: Optional[List[Tuple[str, str]]] = None

    # -- connections -------------------------------------------------------------

    def _slots(self) -> asyncio.Semaphore:
        # Created on first use so that it belongs to the running loop (Python 3.9). A
        # client reused from another loop (a second asyncio.run) starts a fresh pool:
        # connections and the semaphore of a finished loop cannot be used.
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:
            for c in list(self._all):
                c.close()
            self._all.clear()
            self._idle.clear()
            self._loop = loop
            self._sem = asyncio.Semaphore(self.max_connections)
        return self._sem

    async def _connect(self) -> _Conn:
        if self._closed:
            raise Unavailable("unavailable", "client is closed", None)
        try:
            if self._unix is not None:
                coro = asyncio.open_unix_connection(self._unix, limit=_LIMIT)
            else:
                coro = asyncio.open_connection(self._host, self._port, limit=_LIMIT)
            if self._timeout is not None:
                reader, writer = await asyncio.wait_for(coro, self._timeout)
            else:
                reader, writer = await coro
        except asyncio.TimeoutError:
            raise Failure(Unavailable("unavailable", f"cannot connect to {self.url}: timed out", None), sent=False) from None
        except OSError as e:
            raise Failure(Unavailable("unavailable", f"cannot connect to {self.url}: {e}", None), sent=False) from None
        sock = writer.get_extra_info("socket")
        if sock is not None and self._unix is None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        conn = _Conn(reader, writer)
        self._all.add(conn)
        return conn

    async def _acquire(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable():
                return conn
            self._discard(conn)
        return await self._connect()

    def _release(self, conn: _Conn) -> None:
        if self._closed or not conn.usable():
            self._discard(conn)
        else:
            self._idle.append(conn)

    def _discard(self, conn: _Conn) -> None:
        self._all.discard(conn)
        conn.close()

    async def close(self) -> None:
        """Closes every connection; later calls raise :class:`Unavailable`."""
        self._closed = True
        conns = list(self._all)
        self._all.clear()
        self._idle.clear()
        for c in conns:
            c.close()
        for c in conns:
            try:
                await asyncio.wait_for(c.writer.wait_closed(), 1.0)
            except (OSError, asyncio.TimeoutError, RuntimeError):
                pass

    # -- one attempt -------------------------------------------------------------

    def _read_timeout(self, req: Request) -> Optional[float]:
        return self._timeout if req.timeout is DEFAULT else req.timeout

    def _encode(self, req: Request) -> bytes:
        lines = [f"{req.method} {req.target(self._base_path)} HTTP/1.1\r\n", self._fixed_headers]
        headers = {"Accept": "application/json"}
        headers.update(req.headers)
        if req.content_type:
            headers["Content-Type"] = req.content_type
        for k, v in headers.items():
            lines.append(f"{k}: {v}\r\n")
        if req.body is not None:
            lines.append(f"Content-Length: {len(req.body)}\r\n")
        elif req.method in _BODYLESS_METHODS:
            lines.append("Content-Length: 0\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        return head + req.body if req.body is not None and len(req.body) < (1 << 16) else head

    async def _send_and_read_head(self, conn: _Conn, req: Request) -> _Head:
        """Writes the request and reads the answer's status line and headers."""
        reused = conn.uses > 0
        conn.uses += 1
        got_byte = False
        try:
            if self.trace is not None:
                self.trace.append((req.method, req.path))
            data = self._encode(req)
            conn.writer.write(data)
            if req.body is not None and len(req.body) >= (1 << 16):
                conn.writer.write(req.body)
            await conn.writer.drain()
            while True:
                line = await conn.reader.readline()
                if not line:
                    raise asyncio.IncompleteReadError(b"", None)
                got_byte = True
                parts = line.split(None, 2)
                if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
                    raise SandboxError("internal", f"malformed status line {line[:80]!r}")
                status = int(parts[1])
                headers: Dict[str, str] = {}
                while True:
                    h = await conn.reader.readline()
                    if not h.endswith(b"\n"):
                        raise asyncio.IncompleteReadError(h, None)
                    if h in (b"\r\n", b"\n"):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                if 100 <= status < 200:
                    continue  # 100 Continue and friends: the real answer follows
                version = parts[0]
                conn_hdr = headers.get("connection", "").lower()
                keep = ("close" not in conn_hdr) if version != b"HTTP/1.0" else ("keep-alive" in conn_hdr)
                return _Head(status, headers, keep)
        except SandboxError:
            raise Failure(Unavailable("unavailable", f"bad answer from {self.url} to {req.method} {req.path}", None),
                          sent=True) from None
        except _NET_ERRORS as e:
            what = "connection lost" if not got_byte else "answer cut"
            raise Failure(Unavailable("unavailable", f"{what} during {req.method} {req.path} to {self.url}: {e!r}", None),
                          sent=True, stale=reused and not got_byte) from None

    async def _timed(self, aw: Awaitable[T], timeout: Optional[float], req: Request) -> T:
        if timeout is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, timeout)
        except asyncio.TimeoutError:
            raise Timeout("deadline_exceeded", f"no answer from {self.url} for {req.method} {req.path} in time", None) from None

    async def _attempt(self, req: Request) -> Response:
        async with self._slots():
            conn = await self._acquire()
            ok = False
            try:
                async def roundtrip() -> Tuple[_Head, bytes]:
                    head = await self._send_and_read_head(conn, req)
                    try:
                        body = await _BodyReader(conn.reader, head, req.method).read_all()
                    except SandboxError as e:
                        raise Failure(Unavailable("unavailable", f"bad answer body: {e.message}", None), sent=True) from None
                    except _NET_ERRORS as e:
                        raise Failure(Unavailable("unavailable", f"answer to {req.method} {req.path} cut: {e!r}", None),
                                      sent=True) from None
                    return head, body

                head, body = await self._timed(roundtrip(), self._read_timeout(req), req)
                ok = head.keep_alive
            finally:
                if ok:
                    self._release(conn)
                else:
                    self._discard(conn)
        return complete_answer(head.status, head.headers, body)

    async def _with_retries(self, req: Request, attempt_fn: Callable[[Request], Awaitable[T]]) -> T:
        retries = Retries(req, self.retry)
        while True:
            retries.start()
            try:
                return await attempt_fn(req)
            except Failure as f:
                delay = retries.delay_after(f)
            if delay is not None:
                await asyncio.sleep(delay)

    async def request(self, req: Request) -> Response:
        """Sends ``req`` (retrying transient failures) and returns the answer; statuses
        >= 400 raise the matching error."""
        return await self._with_retries(req, self._attempt)

    async def stream_lines(self, req: Request) -> "AsyncLineStream":
        """Sends ``req`` and returns its answer as an async stream of lines (NDJSON).

        An error status raises before any line is returned. Failures before the answer's
        headers are retried like :meth:`request`; a stream cut later is not.
        """
        async def attempt(r: Request) -> AsyncLineStream:
            slots = self._slots()
            await slots.acquire()
            conn: Optional[_Conn] = None
            handed_over = False
            try:
                conn = await self._acquire()
                head = await self._timed(self._send_and_read_head(conn, r), self._read_timeout(r), r)
                if head.status >= 400:
                    body = await self._timed(_BodyReader(conn.reader, head, r.method).read_all(),
                                             self._read_timeout(r), r)
                    if head.keep_alive:
                        self._release(conn)
                    else:
                        self._discard(conn)
                    conn = None
                    complete_answer(head.status, head.headers, body)  # raises: status >= 400
                stream = AsyncLineStream(self, conn, head, r, slots)
                handed_over = True
                return stream
            finally:
                if not handed_over:
                    if conn is not None:
                        self._discard(conn)
                    slots.release()

        return await self._with_retries(req, attempt)


class AsyncLineStream:
    """Lines of a streamed answer; owns its connection (and pool slot) until exhausted or closed."""

    def __init__(self, transport: AsyncTransport, conn: _Conn, head: _Head, req: Request,
                 slots: asyncio.Semaphore) -> None:
        self._t = transport
        self._conn: Optional[_Conn] = conn
        self._head = head
        self._req = req
        self._slots = slots
        self._body = _BodyReader(conn.reader, head, req.method)
        self._buf = b""
        self.content_type: str = head.headers.get("content-type", "").split(";")[0].strip().lower()

    def __aiter__(self) -> "AsyncLineStream":
        return self

    async def _piece(self) -> bytes:
        try:
            return await self._t._timed(self._body.read(), self._t._read_timeout(self._req), self._req)
        except Timeout:
            self.close()
            raise Timeout("deadline_exceeded", f"stream of {self._req.method} {self._req.path} stalled", None) from None
        except (SandboxError,) + _NET_ERRORS as e:
            self.close()
            raise Unavailable("unavailable", f"stream of {self._req.method} {self._req.path} cut: {e!r}", None) from None
        except BaseException:
            self.close()  # cancelled: the rest of the answer will never be read
            raise

    async def __anext__(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl + 1], self._buf[nl + 1:]
                return line
            if self._conn is None:
                raise StopAsyncIteration
            data = await self._piece()
            if not data:
                self._finish()
                if self._buf:
                    line, self._buf = self._buf, b""
                    return line
                raise StopAsyncIteration
            self._buf += data

    async def read_rest(self) -> bytes:
        """Reads whatever is left of the body (for non-NDJSON answers)."""
        parts = [self._buf]
        self._buf = b""
        while self._conn is not None:
            data = await self._piece()
            if not data:
                self._finish()
                break
            parts.append(data)
        return b"".join(parts)

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._body.done and self._head.keep_alive:
            self._t._release(conn)
        else:
            self._t._discard(conn)
        self._slots.release()

    def close(self) -> None:
        """Abandons the stream; the connection is closed since its answer was not read."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._t._discard(conn)
            self._slots.release()

    async def __aenter__(self) -> "AsyncLineStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()
