"""A hostile client of the API (issue 12): connection floods, slow requests and bodies
that expand in memory.

Expected: the daemon's connection slots are bounded and shared between clients (idle
connections make room for new ones; a client at its cap is answered 503), time spent
waiting for a client's request bytes is limited (but never an answer, however long it
streams), accept() failures back off instead of spinning, and request bodies are
refused (413 / 400, JSON {code, message}) before they cost more memory than a small
multiple of their size.

Most cases start a daemon of their own with small limits (--max-connections ...) so that
they stay far below the host's descriptor limit.
"""
from __future__ import annotations

import functools
import io
import json
import os
import resource
import socket
import subprocess
import tarfile
import threading
import time
from typing import Dict, List, Optional, Tuple
from urllib.parse import quote

import pytest

import tidepool
from tp_testlib import BUILD, Daemon, http_raw, status_kb, wait_until

MAX_CONN = 64
PER_CLIENT = 48
IDLE_S = 3
HEADER_S = 2
BODY_S = 5


# -- helpers ----------------------------------------------------------------------


def _connect(port: int, timeout: float = 10) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    return s


def _read_response(s: socket.socket, timeout: float = 30) -> Tuple[int, Dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length (status, lower-case headers, body)."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a full header: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:n]


def _json_error(status: int, headers: Dict[str, str], body: bytes, want_status: int, want_code: str) -> dict:
    assert status == want_status, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json"), headers
    j = json.loads(body)
    assert set(j) == {"code", "message"} and j["code"] == want_code and j["message"], j
    return j


def _closed_by_peer(s: socket.socket, within: float) -> Optional[float]:
    """Seconds until the peer closed the connection (EOF or reset), None if it did not within."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < within:
        try:
            if s.recv(4096) == b"":
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - t0
    return None


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _timed_health(url: str) -> float:
    t0 = time.monotonic()
    status, _, body = http_raw(url, "GET", "/health", timeout=10)
    dt = time.monotonic() - t0
    assert status == 200 and json.loads(body)["status"] == "ok", (status, body)
    return dt


def _unix_client(d: Daemon) -> tidepool.Client:
    return tidepool.Client(f"unix:{d.socket}", timeout=60)


@pytest.fixture(scope="module")
def limited():
    """A daemon with few connection slots and short timeouts."""
    d = Daemon(BUILD, extra_args=[
        "--max-connections", str(MAX_CONN), "--max-connections-per-client", str(PER_CLIENT),
        "--idle-timeout", str(IDLE_S), "--header-timeout", str(HEADER_S),
        "--body-timeout", str(BODY_S)])
    try:
        d.start()
        yield d
    finally:
        d.stop()
        d.cleanup()


# -- connections ------------------------------------------------------------------


def test_idle_connections_cannot_lock_out_other_clients(limited):
    """Attempt: hold 3x the daemon's connection slots open and idle (as 21,000 idle connections
    once took every descriptor of the daemon).
    Expected: idle connections make room for new ones: /health answers at once, a sandbox can
    be created over TCP and over the unix socket, and the daemon's descriptors stay bounded."""
    fds_before = _fds(limited.pid)
    held: List[socket.socket] = []
    try:
        for _ in range(3 * MAX_CONN):
            held.append(_connect(limited.port))
        time.sleep(0.5)  # let the daemon accept them all
        fds = _fds(limited.pid)
        assert fds <= fds_before + MAX_CONN + 8, f"{fds} descriptors (from {fds_before})"
        lat = [_timed_health(limited.url) for _ in range(20)]
        print(f"/health with {len(held)} idle connections opened: max {max(lat) * 1000:.1f} ms, "
              f"median {sorted(lat)[len(lat) // 2] * 1000:.1f} ms")
        with tidepool.Client(limited.url, timeout=60) as c:
            sb = c.create(image="host", ttl=300)
            try:
                assert sb.exec("echo tcp").stdout == "tcp\n"
            finally:
                sb.kill()
        with _unix_client(limited) as c:
            sb = c.create(image="host", ttl=300)
            try:
                assert sb.exec("echo unix").stdout == "unix\n"
            finally:
                sb.kill()
    finally:
        for s in held:
            s.close()


def test_busy_connections_beyond_the_per_client_cap_get_503(limited):
    """Attempt: one client keeps as many requests in progress as it may (bodies announced and
    not sent), then opens more.
    Expected: past its cap the client gets 503 JSON {code: unavailable}; another client (the
    unix socket, known by uid) is still served."""
    held: List[socket.socket] = []
    try:
        for _ in range(PER_CLIENT):
            s = _connect(limited.port)
            s.sendall(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{")
            held.append(s)
        time.sleep(0.5)
        s = _connect(limited.port)
        try:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = _read_response(s)
        finally:
            s.close()
        j = _json_error(status, headers, body, 503, "unavailable")
        assert "connections" in j["message"], j
        status, _, body = _unix_get(limited.socket, "/health")
        assert status == 200, body
    finally:
        for s in held:
            s.close()
    # Once they are gone the client is served again.
    wait_until(lambda: _health_status(limited.url) == 200, 10, what="/health over TCP again")


def _health_status(url: str) -> int:
    try:
        return http_raw(url, "GET", "/health", timeout=5)[0]
    except OSError:
        return 0


def _unix_get(path: str, target: str) -> Tuple[int, Dict[str, str], bytes]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return _read_response(s)
    finally:
        s.close()


def test_slowloris_header_is_cut_at_the_header_timeout(limited):
    """Attempt: a request header sent one line at a time, forever (slowloris); and a connection
    that sends nothing at all.
    Expected: the first is closed once its header took longer than --header-timeout, the second
    after --idle-timeout; neither is ever answered."""
    slow = _connect(limited.port)
    idle = _connect(limited.port)
    try:
        t0 = time.monotonic()
        slow.sendall(b"GET /health HTTP/1.1\r\n")
        slow.settimeout(0.5)
        closed_after = None
        got = b""
        while time.monotonic() - t0 < HEADER_S + 15:
            try:
                slow.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - t0
                break
            try:
                chunk = slow.recv(4096)
                if chunk == b"":
                    closed_after = time.monotonic() - t0
                    break
                got += chunk
            except socket.timeout:
                pass
            except ConnectionResetError:
                closed_after = time.monotonic() - t0
                break
        assert closed_after is not None, f"a header trickled in for {HEADER_S + 15}s and was not cut off"
        assert b"200" not in got, got
        print(f"slowloris header closed after {closed_after:.1f}s (--header-timeout {HEADER_S})")
        idle_closed = _closed_by_peer(idle, IDLE_S + 15)
        assert idle_closed is not None, "an idle connection was never closed"
        print(f"idle connection closed after {time.monotonic() - t0:.1f}s (--idle-timeout {IDLE_S})")
    finally:
        slow.close()
        idle.close()


def test_long_streams_and_keep_alive_outlive_the_timeouts(limited):
    """Expected: the timeouts count only time spent waiting for the client's request: a
    command that streams for longer than all of them runs to its end, and a keep-alive
    connection that sends its next request in time is served again."""
    with tidepool.Client(limited.url, timeout=60) as c:
        sb = c.create(image="host", ttl=300)
        try:
            n = max(IDLE_S, HEADER_S, BODY_S) + 3
            events = list(sb.exec_stream(f"for i in $(seq {n}); do echo $i; sleep 1; done"))
            res = events[-1]
            assert getattr(res, "exit_code", None) == 0, events[-3:]
            out = b"".join(getattr(e, "data", b"") for e in events[:-1])
            assert out.split() == [str(i).encode() for i in range(1, n + 1)], out
            # A quiet stream (nothing written for longer than the idle timeout) too.
            r = sb.exec(f"sleep {IDLE_S + 2}; echo late")
            assert r.stdout == "late\n"
        finally:
            sb.kill()
    s = _connect(limited.port)
    try:
        for _ in range(3):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, _ = _read_response(s)
            assert status == 200
            time.sleep(IDLE_S / 3)
    finally:
        s.close()


def test_accept_backs_off_when_out_of_descriptors(monkeypatch):
    """Attempt: more connections than the daemon has descriptors for (it runs with an
    open-file limit of 256 and a connection limit above that), so accept() fails with EMFILE.
    Expected: the accept loop waits between attempts instead of spinning: little CPU and a
    few log lines over several seconds; once the connections are gone it serves again."""
    d = Daemon(BUILD, extra_args=["--max-connections", "2000", "--idle-timeout", "600"])

    def small_fd_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    held: List[socket.socket] = []
    try:
        with monkeypatch.context() as m:
            m.setattr(subprocess, "Popen", functools.partial(subprocess.Popen, preexec_fn=small_fd_limit))
            d.start()
        for _ in range(400):
            held.append(_connect(d.port))
        time.sleep(1)
        assert d.alive()
        log0, cpu0 = d.log_size(), _cpu_seconds(d.pid)
        time.sleep(4)
        log1, cpu1 = d.log_size(), _cpu_seconds(d.pid)
        print(f"at the descriptor limit: {cpu1 - cpu0:.2f}s CPU and {log1 - log0} bytes of log in 4s")
        assert cpu1 - cpu0 < 1.0, f"the accept loop spins: {cpu1 - cpu0:.2f}s CPU in 4s"
        assert log1 - log0 < 4096, f"{log1 - log0} bytes of log in 4s:\n{d.log_tail(10)}"
        assert "Too many open files" in d.log_tail(200) and "suppressed" in d.log_tail(200), d.log_tail(20)
        for s in held:
            s.close()
        held.clear()
        wait_until(lambda: _health_status(d.url) == 200, 15, what="/health after the flood")
    finally:
        for s in held:
            s.close()
        d.stop()
        d.cleanup()


# -- bodies -----------------------------------------------------------------------


def _post_in_thread(port: int, head: bytes, body_chunks) -> Tuple[socket.socket, threading.Thread]:
    s = _connect(port, timeout=120)
    s.sendall(head)

    def send():
        try:
            for c in body_chunks:
                s.sendall(c)
        except OSError:
            pass  # refused: the daemon closed the connection
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return s, t


def _labels_chunks(total: int, chunk: int = 1 << 20):
    """{"labels":[0,0,...]} of exactly `total` bytes, in pieces of about `chunk`."""
    prefix, suffix = b'{"labels":[0', b"]}"
    yield prefix
    left = total - len(prefix) - len(suffix)
    if left % 2:
        yield b" "
        left -= 1
    piece = b",0" * (chunk // 2)
    while left > 0:
        n = min(left, len(piece))
        yield piece[:n]
        left -= n
    yield suffix


def test_large_json_body_is_refused_before_it_is_read(daemon):
    """Attempt: POST /v1/sandboxes with a 100 MB {"labels": [0,0,...]} body (once 2.4 GB of
    daemon memory; the old 1 GiB body limit allowed about 24 GB).
    Expected: 413 JSON as soon as the header is in; the daemon's peak RSS (VmHWM) grows by far
    less than 200 MiB."""
    total = 100 << 20
    hwm0 = status_kb(daemon.pid)["VmHWM"]
    head = (f"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {total}\r\n\r\n").encode()
    s, t = _post_in_thread(daemon.port, head, _labels_chunks(total))
    try:
        status, headers, body = _read_response(s, timeout=120)
    finally:
        s.close()
        t.join(60)
    j = _json_error(status, headers, body, 413, "payload_too_large")
    assert str(total) in j["message"], j
    # The same body chunked (no length announced): cut at the JSON limit as it comes.
    chunked = (b"%x\r\n%s\r\n" % (len(c), c) for c in _labels_chunks(total))
    head = (b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    s, t = _post_in_thread(daemon.port, head, chunked)
    try:
        status, headers, body = _read_response(s, timeout=120)
    finally:
        s.close()
        t.join(60)
    _json_error(status, headers, body, 413, "payload_too_large")
    hwm1 = status_kb(daemon.pid)["VmHWM"]
    print(f"tidepoold VmHWM {hwm0} -> {hwm1} KiB for two 100 MB labels bodies")
    assert hwm1 - hwm0 < 200 * 1024, f"peak RSS grew by {(hwm1 - hwm0) // 1024} MiB"
    assert http_raw(daemon.url, "GET", "/health")[0] == 200


def test_dense_json_within_the_size_limit_is_refused_within_its_memory_budget(daemon):
    """Attempt: a body just under the JSON size limit that is nothing but tiny elements
    (2 bytes of text, 16+ bytes of memory each).
    Expected: 413 JSON from the bounded parser (its budget is a small multiple of the body's
    size), peak RSS grows by far less than 200 MiB."""
    total = (4 << 20) - 4096
    body = b"".join(_labels_chunks(total))
    assert len(body) == total
    hwm0 = status_kb(daemon.pid)["VmHWM"]
    status, ct, ans = http_raw(daemon.url, "POST", "/v1/sandboxes", body=body,
                               headers={"Content-Type": "application/json"})
    _json_error(status, {"content-type": ct}, ans, 413, "payload_too_large")
    assert "elements" in json.loads(ans)["message"]
    hwm1 = status_kb(daemon.pid)["VmHWM"]
    print(f"tidepoold VmHWM {hwm0} -> {hwm1} KiB for a {total}-byte dense body")
    assert hwm1 - hwm0 < 200 * 1024


def test_deep_nesting_is_refused_with_400(daemon):
    """Attempt: labels nested 100,000 levels deep.
    Expected: 400 JSON {code: invalid_argument} naming the nesting, the daemon unharmed."""
    depth = 100_000
    body = b'{"labels":' + b"[" * depth + b"]" * depth + b"}"
    status, ct, ans = http_raw(daemon.url, "POST", "/v1/sandboxes", body=body,
                               headers={"Content-Type": "application/json"})
    j = _json_error(status, {"content-type": ct}, ans, 400, "invalid_argument")
    assert "nested" in j["message"], j


def test_uploads_keep_their_own_larger_limit(sandbox):
    """Expected: the small JSON limit is not the limit of raw uploads (files, archives)."""
    data = os.urandom(6 << 20)
    sandbox.files.write("/tmp/big.bin", data)
    assert sandbox.files.read("/tmp/big.bin") == data


@pytest.mark.parametrize("where", ["memory", "spool"])
def test_bodies_in_flight_share_a_budget(where):
    """Attempt: uploads that each stay under the upload limit, but together exceed what the
    daemon gives to request bodies at once: memory (--max-body-memory-mb 8, with uploads kept
    in memory by a high --spool-threshold-kb) or the spool directory (--max-spool-mb 8: uploads
    above the threshold go to disk as they arrive). One held open mid-body (5 of its 6 MiB
    sent), then a second sent in full.
    Expected: the second gets 503 JSON (Retry-After) once its bytes no longer fit; once the
    first is gone, the same upload is taken in (and answered 404: no such sandbox)."""
    args = (["--max-body-memory-mb", "8", "--spool-threshold-kb", "65536"] if where == "memory"
            else ["--max-spool-mb", "8"])
    d = Daemon(BUILD, extra_args=args + ["--body-timeout", "60"])
    size = 6 << 20
    head = (f"PUT /v1/sandboxes/n0-000000000000/files?path=/x HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()
    try:
        d.start()
        first = _connect(d.port)
        first.sendall(head + b"x" * (5 << 20))
        time.sleep(1)
        s, t = _post_in_thread(d.port, head, [b"y" * size])
        try:
            status, headers, body = _read_response(s)
        finally:
            s.close()
            t.join(60)
        j = _json_error(status, headers, body, 503, "unavailable")
        word = "bodies" if where == "memory" else "spooling"
        assert headers.get("retry-after") == "1" and word in j["message"], (headers, j)
        first.close()

        def taken() -> bool:
            s, t = _post_in_thread(d.port, head, [b"z" * size])
            try:
                return _read_response(s)[0] == 404
            finally:
                s.close()
                t.join(60)
        wait_until(taken, 10, what="the budget to be free again")
    finally:
        d.stop()
        d.cleanup()


def test_upload_without_a_key_is_refused_before_its_body_is_read():
    """Attempt: over TCP without an API key, announce a 500 MB upload.
    Expected: 401 JSON from the header alone (with WWW-Authenticate); the body is never taken in."""
    d = Daemon(BUILD, insecure_tcp=False)
    try:
        d.start()
        s = _connect(d.port)
        try:
            s.sendall(f"PUT /v1/sandboxes/n0-000000000000/files?path=/x HTTP/1.1\r\nHost: x\r\n"
                      f"Content-Length: {500 << 20}\r\n\r\n".encode())
            status, headers, body = _read_response(s)
        finally:
            s.close()
        _json_error(status, headers, body, 401, "unauthenticated")
        assert headers.get("www-authenticate") == "Bearer", headers
        assert status_kb(d.pid)["VmHWM"] < 200 * 1024
    finally:
        d.stop()
        d.cleanup()


def test_partly_failed_tar_upload_is_400_not_404(daemon, sandbox):
    """Attempt: an archive whose first member extracts and whose second (a hard link to a file
    that is not in it) cannot.
    Expected: 400 JSON saying the archive may be partly extracted, not 404."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"fine\n"
        ti = tarfile.TarInfo("ok.txt")
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
        link = tarfile.TarInfo("broken")
        link.type = tarfile.LNKTYPE
        link.linkname = "not-in-the-archive"
        tar.addfile(link)
    status, ct, ans = http_raw(daemon.url, "PUT",
                               f"/v1/sandboxes/{sandbox.id}/files/tar?path={quote('/tmp/up')}",
                               body=buf.getvalue(), headers={"Content-Type": "application/x-tar"})
    j = _json_error(status, {"content-type": ct}, ans, 400, "invalid_argument")
    assert "partly extracted" in j["message"], j
    assert sandbox.files.read("/tmp/up/ok.txt") == b"fine\n"
