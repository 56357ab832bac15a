"""Large uploads are spooled to disk, not held in the daemon's memory (issue 12).

An upload above --spool-threshold-kb (1 MiB by default) is written to an unlinked file under
the data directory as it arrives and goes on into the sandbox one piece at a time: a file
upload as chunked file writes, a tar archive or a process's stdin through stdin writes that
the agent acknowledges once each piece is in the command's pipe. So neither the daemon nor
the agent holds more than a piece, whatever the upload's size, and a command that stops
reading its stdin holds the upload back instead of filling memory.
"""
from __future__ import annotations

import hashlib
import http.client
import io
import os
import tarfile
import threading
import time

import pytest

import tidepool
from tp_testlib import BUILD, Daemon, status_kb

MIB = 1 << 20


def _request(url: str, method: str, path: str, body: bytes, headers=None, timeout: float = 120):
    """One raw request; (status, lower-cased headers, body)."""
    host, port = url.split("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def _hwm_kb(pid: int) -> int:
    return status_kb(pid)["VmHWM"]


def _reset_hwm(pid: int) -> None:
    # Writing 5 to clear_refs resets the peak resident set (VmHWM) to the current RSS.
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def _pattern(size: int) -> bytes:
    """Bytes that do not compress and are cheap to make: 4 MiB of random data, repeated."""
    block = os.urandom(4 * MIB)
    return (block * (size // len(block) + 1))[:size]


def test_a_large_file_upload_does_not_grow_the_daemon(daemon, client):
    sb = client.create(image="host", disk_mb=1024, memory_mb=512, ttl=600)
    data = _pattern(300 * MIB)
    _reset_hwm(daemon.pid)
    before = _hwm_kb(daemon.pid)
    sb.files.write("/big.bin", data)
    grown_mib = (_hwm_kb(daemon.pid) - before) / 1024
    assert grown_mib < 64, f"the daemon's peak RSS grew by {grown_mib:.0f} MiB for a 300 MiB upload"
    r = sb.exec(["sha256sum", "/big.bin"])
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    # Nothing of the upload stays in the spool directory (its files have no name anyway).
    assert os.listdir(os.path.join(daemon.data_dir, "spool")) == []


def test_a_large_tar_upload_streams_into_tar(daemon, client):
    sb = client.create(image="host", disk_mb=1024, memory_mb=256, ttl=600)
    big = _pattern(200 * MIB)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        ti = tarfile.TarInfo("tree/big.bin")
        ti.size = len(big)
        tar.addfile(ti, io.BytesIO(big))
        small = b"small\n"
        ti = tarfile.TarInfo("tree/small.txt")
        ti.size = len(small)
        tar.addfile(ti, io.BytesIO(small))
    archive = buf.getvalue()
    _reset_hwm(daemon.pid)
    before = _hwm_kb(daemon.pid)
    status, _, body = _request(daemon.url, "PUT", f"/v1/sandboxes/{sb.id}/files/tar?path=/up",
                               archive)
    assert status == 200, body
    grown_mib = (_hwm_kb(daemon.pid) - before) / 1024
    assert grown_mib < 64, f"the daemon's peak RSS grew by {grown_mib:.0f} MiB for a 200 MiB archive"
    r = sb.exec(["sh", "-c", "sha256sum /up/tree/big.bin; cat /up/tree/small.txt"])
    lines = r.stdout.splitlines()
    assert lines[0].split()[0] == hashlib.sha256(big).hexdigest()
    assert lines[1] == "small"
    # The agent held a piece at a time: its peak stayed far below the archive's size.
    agent_hwm_mib = sb.exec(["sh", "-c", "grep VmHWM /proc/1/status"]).stdout.split()[1]
    assert int(agent_hwm_mib) / 1024 < 32, agent_hwm_mib


def test_a_large_stdin_upload_waits_for_a_process_that_does_not_read(daemon, client):
    """A process that reads nothing holds the upload back (the request waits); once it
    reads, all of it arrives, once, in order."""
    sb = client.create(image="host", memory_mb=256, ttl=600)
    # Waits for /go before reading its stdin.
    h = sb.start(["sh", "-c", "while [ ! -e /go ]; do sleep 0.05; done; sha256sum"],
                 stdin_open=True)
    data = _pattern(64 * MIB)
    result = {}

    def send():
        result["r"] = _request(daemon.url, "POST",
                               f"/v1/sandboxes/{sb.id}/processes/{h.pid}/stdin?eof=1", data)

    t = threading.Thread(target=send)
    t.start()
    time.sleep(1.0)
    assert t.is_alive(), "the upload finished although nothing read it"
    agent_kb = int(sb.exec(["sh", "-c", "grep VmRSS /proc/1/status"]).stdout.split()[1])
    assert agent_kb < 32 * 1024, f"the agent holds {agent_kb} kB of a stdin nobody reads"
    sb.files.write("/go", b"")
    t.join(120)
    assert not t.is_alive()
    assert result["r"][0] == 204, result["r"]
    done = h.wait(timeout=120)
    assert done.stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_every_upload_route_takes_a_spooled_body():
    """With a tiny threshold every upload is spooled: files, trees, stdin, image archives and a
    retried keyed upload (replayed, not run twice) all work as they do from memory."""
    d = Daemon(BUILD, extra_args=["--spool-threshold-kb", "1"])
    try:
        d.start()
        c = tidepool.Client(d.url)
        sb = c.create(image="host", ttl=600)
        try:
            data = os.urandom(300_000)
            sb.files.write("/f.bin", data)
            assert sb.files.read("/f.bin") == data
            src = os.path.join(d.tmp, "tree")
            os.makedirs(os.path.join(src, "sub"))
            with open(os.path.join(src, "sub", "a.bin"), "wb") as f:
                f.write(data)
            sb.files.upload_dir(src, "/tree")
            assert sb.files.read("/tree/sub/a.bin") == data
            h = sb.start(["sha256sum"], stdin_open=True)
            h.send_stdin(data, eof=True)
            assert h.wait(timeout=60).stdout.split()[0] == hashlib.sha256(data).hexdigest()
            # A keyed upload sent twice runs once (the spooled body's hash is its fingerprint).
            key = {"Idempotency-Key": "spooled-upload-1"}
            path = f"/v1/sandboxes/{sb.id}/files?path=/k.bin"
            s1, h1, _ = _request(d.url, "PUT", path, data, headers=key)
            s2, h2, _ = _request(d.url, "PUT", path, data, headers=key)
            assert (s1, s2) == (200, 200)
            assert h2.get("idempotent-replayed") == "true", h2
            s3, _, b3 = _request(d.url, "PUT", path, data[:-1] + bytes([data[-1] ^ 1]), headers=key)
            assert s3 == 409, b3
            # An image archive (a one-file layer) imported from the spool.
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                ti = tarfile.TarInfo("etc/payload.bin")
                ti.size = len(data)
                tar.addfile(ti, io.BytesIO(data))
            st, _, body = _request(d.url, "POST", "/v1/images/import?name=spooled&version=1",
                                   buf.getvalue())
            assert st in (200, 201), body
        finally:
            c.kill(sb.id)
    finally:
        d.stop()
        d.cleanup()
