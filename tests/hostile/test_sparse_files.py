"""Sparse files against the file and tar downloads (issue 12, item 12).

A sandbox makes files of any apparent size for free (`truncate -s 100G`); reading them
back sends every hole as zeros. The daemon used to collect a whole download before
answering: a 511 MB sparse file cost it +0.5 to 1 GiB, the tar of a directory holding a
100G one +1.3 to 1.8 GiB for minutes before a 413.

Expected: downloads stream with a bounded buffer. The daemon's resident memory (VmRSS
sampled throughout, and its peak VmHWM, reset before each case) grows by less than
MEM_BOUND however large the file; a file over the download limit is refused (413) before
a byte is sent, its apparent size counting; a tar download the client walks away from
stops (tar is killed) and leaves the daemon healthy, with nothing behind; past the limit a
tar is cut off (an incomplete chunked answer). The same bound holds for an exec stream
whose client stops reading: the command blocks instead of filling the daemon.
"""
from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import socket
import threading
import time
from typing import Dict, Optional
from urllib.parse import quote

import pytest

import tidepool
from tp_testlib import BUILD, Daemon, health_ok, http_raw, status_kb, wait_until

MiB = 1 << 20
GiB = 1 << 30
# What one download may add to the daemon's memory (it holds about 1 MiB).
MEM_BOUND = 64 * MiB


def _status(pid: int) -> Dict[str, int]:
    """/proc/<pid>/status's memory fields in bytes."""
    return {k: v * 1024 for k, v in status_kb(pid).items()}


class MemoryWatch:
    """Samples the daemon's VmRSS on a thread while a download runs. Once growth over the
    baseline passes MEM_BOUND it shuts the download's socket, so that a daemon that
    buffers fails the case instead of hanging it until its own limits answer."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        # Reset the peak (VmHWM) so that earlier cases in this daemon do not hide ours.
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            self.hwm_reset = True
        except OSError:
            self.hwm_reset = False
        self.base = _status(pid)["VmRSS"]
        self.peak = self.base
        self.sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            rss = _status(self.pid)["VmRSS"]
            self.peak = max(self.peak, rss)
            if rss - self.base > MEM_BOUND and self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> int:
        """Stops sampling; returns the growth (bytes) of the larger of peak VmRSS and VmHWM."""
        self._stop.set()
        self._t.join()
        st = _status(self.pid)
        peak = max(self.peak, st["VmHWM"] if self.hwm_reset else 0)
        return peak - self.base


@contextlib.contextmanager
def watched(daemon, what: str):
    """Runs a download under a MemoryWatch; fails the case when the daemon's memory grew by
    MEM_BOUND or more (also when the watch had to cut the download off), naming the growth."""
    watch = MemoryWatch(daemon.pid)
    try:
        yield watch
    except (OSError, http.client.HTTPException) as e:
        growth = watch.stop()
        pytest.fail(f"{what}: {e!r} with daemon memory grown by {growth // MiB} MiB (the test cuts "
                    f"a download off once it passes {MEM_BOUND // MiB} MiB)")
    growth = watch.stop()
    print(f"tidepoold memory growth for {what}: {growth // 1024} KiB "
          f"(baseline VmRSS {watch.base // 1024} KiB)")
    assert growth < MEM_BOUND, f"{what}: daemon memory grew by {growth // MiB} MiB"


def _get(daemon, path: str) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port)
    conn.request("GET", path)
    return conn


def _files_path(sb, path: str, tar: bool = False) -> str:
    return f"/v1/sandboxes/{sb.id}/files{'/tar' if tar else ''}?path={quote(path)}"


@pytest.mark.parametrize("size", [511 * MiB, 2 * GiB], ids=["511MiB", "2GiB"])
def test_sparse_file_download_streams_in_bounded_memory(daemon, hostile, size):
    """Next to a 100G sparse file, a sparse file of `size` with a marker at its end is read
    whole through GET .../files. Expected: 200, every byte (zeros, then the marker), daemon
    memory growth < MEM_BOUND. (Before: 511 MiB cost +520 MiB here; 2 GiB was a 413.)"""
    r = hostile.exec(f"mkdir -p /work && truncate -s 100G /work/huge && truncate -s {size} /work/f"
                     f" && printf END | dd of=/work/f bs=1 seek={size - 3} conv=notrunc status=none"
                     f" && stat -c %s /work/f")
    assert r.ok, r
    assert int(r.stdout) == size
    got = 0
    tail = b""
    with watched(daemon, f"a {size}-byte sparse file download") as watch:
        conn = _get(daemon, _files_path(hostile, "/work/f"))
        try:
            watch.sock = conn.sock
            resp = conn.getresponse()
            assert resp.status == 200, resp.read(2000)
            first = resp.read(MiB)
            assert first == bytes(len(first)) and len(first) == MiB, "the prefix must be zeros"
            got += len(first)
            while True:
                piece = resp.read(4 * MiB)
                if not piece:
                    break
                got += len(piece)
                tail = (tail + piece)[-16:]
        finally:
            conn.close()
    assert got == size
    assert tail.endswith(b"END") and tail[:-3] == bytes(len(tail) - 3)


def test_sparse_file_over_the_download_limit_is_refused_first(daemon, hostile):
    """A 100G sparse file is over the default download limit (8 GiB) by its apparent size.
    Expected: 413 JSON before any byte, naming the apparent size; no memory growth."""
    r = hostile.exec("mkdir -p /work && truncate -s 100G /work/huge")
    assert r.ok, r
    with watched(daemon, "a 100G sparse file over the download limit") as watch:
        conn = _get(daemon, _files_path(hostile, "/work/huge"))
        try:
            watch.sock = conn.sock
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    assert resp.status == 413, body
    assert b"apparent size" in body and str(100 * GiB).encode() in body, body


def test_tar_of_a_100g_sparse_file_streams_and_stops_when_the_client_leaves(daemon, hostile):
    """GET .../files/tar of a directory holding a 100G sparse file; the client reads 300 MiB
    of the archive, then closes the connection. Expected: the archive starts at once (a tar
    header), daemon memory growth < MEM_BOUND, tar is killed once the client left, the
    daemon answers /health and a new exec afterwards. (Before: +1.3 GiB, then a 413.)"""
    r = hostile.exec("mkdir -p /work/t && echo small > /work/t/a && truncate -s 100G /work/t/huge")
    assert r.ok, r
    got = 0
    with watched(daemon, "300 MiB of the tar of a 100G sparse file") as watch:
        conn = _get(daemon, _files_path(hostile, "/work/t", tar=True))
        try:
            watch.sock = conn.sock
            resp = conn.getresponse()
            assert resp.status == 200, resp.read(2000)
            assert resp.getheader("Content-Type") == "application/x-tar"
            head = resp.read(512)
            assert head[257:262] == b"ustar", head[:300]
            got = len(head)
            while got < 300 * MiB:
                piece = resp.read(min(4 * MiB, 300 * MiB - got))
                assert piece, f"the archive ended after {got} bytes"
                got += len(piece)
        finally:
            conn.close()  # walks away in the middle of the archive
    assert got == 300 * MiB

    def tar_running() -> bool:
        ps = hostile.exec("cat /proc/[0-9]*/comm 2>/dev/null")
        return "tar" in ps.stdout.split()

    # The client left: tar is killed (it would otherwise block on its full pipe forever).
    wait_until(lambda: not tar_running(), timeout=60, what="tar to be killed")
    assert health_ok(daemon.url)
    r = hostile.exec("echo still here")
    assert r.ok and r.stdout == "still here\n", r


@pytest.fixture
def small_limit():
    """A daemon of its own with a 4 MiB download limit."""
    d = Daemon(BUILD, extra_args=["--max-download-mb", "4"])
    try:
        d.start()
        yield d
    finally:
        d.stop()
        d.cleanup()


def test_download_limit_and_stream_shapes(small_limit):
    """With --max-download-mb 4: a 5 MiB sparse file is refused (413) before any byte; a 3 MB
    file streams chunked and arrives intact (HEAD gets the head only, and the connection
    stays usable); a small file keeps its Content-Length; the tar of a tree over the limit
    starts (200) and is then cut off: the chunked answer ends without its last chunk, which
    the client sees as an incomplete read, and its tar is killed."""
    d = small_limit
    with tidepool.Client(d.url, timeout=120) as c:
        sb = c.create(image="host", ttl=600)
        try:
            r = sb.exec("mkdir -p /w && head -c 3000000 /dev/urandom > /w/small && truncate -s 5M /w/big"
                        " && echo hello > /w/tiny && sha256sum /w/small")
            assert r.ok, r
            want = r.stdout.split()[0]

            status, _, body = http_raw(d.url, "GET", _files_path(sb, "/w/big"))
            assert status == 413 and b"5242880" in body and b"4194304" in body, body

            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
            try:
                conn.request("GET", _files_path(sb, "/w/small"))
                resp = conn.getresponse()
                assert resp.status == 200
                assert resp.getheader("Transfer-Encoding") == "chunked"
                assert hashlib.sha256(resp.read()).hexdigest() == want
                conn.request("HEAD", _files_path(sb, "/w/small"))
                resp = conn.getresponse()
                assert resp.status == 200 and resp.read() == b""
                conn.request("GET", _files_path(sb, "/w/tiny"))
                resp = conn.getresponse()
                assert resp.getheader("Content-Length") == "6" and resp.read() == b"hello\n"
            finally:
                conn.close()

            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=120)
            got = 0
            try:
                conn.request("GET", _files_path(sb, "/w", tar=True))
                resp = conn.getresponse()
                assert resp.status == 200
                with pytest.raises(http.client.IncompleteRead) as ei:
                    resp.read()
                got = len(ei.value.partial)
            finally:
                conn.close()
            assert 0 < got <= 4 * MiB

            def tar_running() -> bool:
                return "tar" in sb.exec("cat /proc/[0-9]*/comm 2>/dev/null").stdout.split()

            wait_until(lambda: not tar_running(), timeout=60, what="tar to be killed")
        finally:
            sb.kill()


def test_exec_stream_is_paced_by_a_client_that_stops_reading(daemon, hostile):
    """An exec with "stream": true writes zeros without end (64 KiB at a time, counting
    its writes in a file), with max_output_bytes at its 1 GiB maximum. The client reads
    the first events, then stops reading. Expected: the command blocks on its output pipe
    (its count stops moving while the client does not read), the daemon's memory grows by
    less than MEM_BOUND, reading again resumes the output, and closing the connection kills
    the command. (Before: output the client had not read piled up in the daemon, up to
    max_output_bytes per stream, and the command ran on.)"""
    script = ("i=0; while :; do head -c 65536 /dev/zero || exit; i=$((i+1));"
              " echo $i > /tmp/count; done")
    body = json.dumps({"cmd": ["sh", "-c", script], "stream": True,
                       "max_output_bytes": 1 << 30}).encode()

    def count() -> int:
        r = hostile.exec("cat /tmp/count 2>/dev/null || echo 0")
        return int(r.stdout.strip() or 0)

    with watched(daemon, "an exec stream its client stopped reading") as watch:
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
        try:
            conn.request("POST", f"/v1/sandboxes/{hostile.id}/exec", body=body,
                         headers={"Content-Type": "application/json"})
            watch.sock = conn.sock
            resp = conn.getresponse()
            assert resp.status == 200, resp.read(2000)
            assert json.loads(resp.readline())["type"] == "started"
            assert json.loads(resp.readline())["type"] == "stdout"
            # The client stops reading. What is in flight fills the socket buffers and
            # the window; then the command must stop.
            wait_until(lambda: count() > 0, timeout=30, what="the command to write")
            stalled = None
            for _ in range(60):
                before = count()
                time.sleep(1.0)
                if count() == before:
                    stalled = before
                    break
            assert stalled is not None, f"the command ran on while nobody read ({count()} writes)"
            # 64 KiB per write: what the kernel's socket buffers, the daemon and the
            # agent hold between them, well below the 1 GiB the command could send.
            assert stalled * 64 * 1024 < 256 * MiB, stalled
            # Reading resumes the output.
            got = 0
            while got < 32 * MiB:
                line = resp.readline()
                assert line, "the stream ended"
                got += len(line)
            wait_until(lambda: count() > stalled, timeout=30, what="the command to resume")
        finally:
            conn.close()  # the client leaves: the command is killed

    def running() -> bool:
        ps = hostile.exec("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
        return "/tmp/count" in ps.stdout

    wait_until(lambda: not running(), timeout=60, what="the command to be killed")
