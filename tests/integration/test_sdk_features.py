"""SDK features against the real daemon: batches, background processes, bulk tar
transfers, error mapping for every class, and retries that never run anything twice."""
import asyncio
import hashlib
import json
import os
import socket
import threading
import uuid

import pytest

from tp_testlib import free_port, http_raw, wait_until

import tidepool
from tidepool._retry import RetryPolicy

SMALL = dict(image="host", memory_mb=64, cpus=0.25, pids=64, ttl=600)
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.02, max_backoff=0.2)


# -- batch ---------------------------------------------------------------------------


def test_create_batch_sync(client):
    with client.create_batch(5, **SMALL, labels={"t": "batch-sync"}) as batch:
        assert batch.ok and len(batch) == 5
        ids = {sb.id for sb in batch}
        assert len(ids) == 5 and all(sb.state == "running" for sb in batch)
        assert {sb.exec("hostname").stdout.strip() for sb in batch} == ids
        assert {s.id for s in client.list(labels={"t": "batch-sync"})} == ids
    assert client.list(labels={"t": "batch-sync"}) == []


def test_create_batch_reports_per_item_failures(client):
    # A count out of range is a 400 for the whole call.
    with pytest.raises(tidepool.InvalidArgument):
        client.create_batch(0, **SMALL)
    with pytest.raises(tidepool.InvalidArgument):
        client.create_batch(1001, **SMALL)
    with pytest.raises(tidepool.InvalidArgument):
        client.create_batch(2, image="host", memory_mb=1)


# -- background processes --------------------------------------------------------------


def test_background_process_lifecycle(sandbox):
    h = sandbox.exec("echo started; sleep 0.3; echo done >&2; exit 5", background=True)
    assert isinstance(h, tidepool.ProcessHandle) and h.pid > 0
    assert any(p.pid == h.pid for p in sandbox.processes())
    r = h.wait(timeout=30)
    assert (r.exit_code, r.stdout, r.stderr) == (5, "started\n", "done\n")
    assert h.poll().exit_code == 5


def test_background_process_stdin_and_kill(sandbox):
    cat = sandbox.start(["cat"], stdin_open=True)
    with pytest.raises(tidepool.Timeout):
        cat.wait(timeout=0.3)
    assert cat.poll() is None
    cat.send_stdin(b"line 1\n\x00\xff")
    cat.send_stdin("line 2\n", eof=True)
    r = cat.wait(timeout=30)
    assert r.exit_code == 0 and r.stdout_bytes == b"line 1\n\x00\xffline 2\n"

    sandbox.exec("cp /bin/sleep /tmp/tpmark_bg", check=True)
    count = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c tpmark_bg || true"
    tree = sandbox.start("/tmp/tpmark_bg 300 & /tmp/tpmark_bg 300 & wait")
    wait_until(lambda: sandbox.exec(count).stdout.strip() == "2", timeout=10, what="two sleepers")
    assert tree.poll() is None
    tree.kill()
    r = tree.wait(timeout=30)
    assert not r.ok and (r.signal == 9 or r.exit_code != 0)
    wait_until(lambda: sandbox.exec(count).stdout.strip() == "0", timeout=10, what="the tree to be gone")
    with pytest.raises(tidepool.NotFound):
        sandbox.process(999999).refresh()


# -- bulk files ------------------------------------------------------------------------


def test_upload_1000_files_in_one_request(client, sandbox, tmp_path, daemon):
    src = tmp_path / "tree"
    expected = {}
    for i in range(1000):
        d = src / f"d{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        data = f"file {i}\n".encode() * (i % 7 + 1)
        (d / f"f{i:04d}.txt").write_bytes(data)
        expected[f"d{i % 10}/f{i:04d}.txt"] = hashlib.sha256(data).hexdigest()
    (src / "d0" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(src / "d0" / "run.sh", 0o755)

    before = _requests_total(daemon)
    client._transport.trace = []
    n = sandbox.files.upload_dir(str(src), "/work/tree")
    trace, client._transport.trace = client._transport.trace, None
    assert trace == [("PUT", f"/v1/sandboxes/{sandbox.id}/files/tar")]   # exactly one request
    # Requests the daemon answered meanwhile: the PUT, plus the first /metrics call itself
    # (counted once its answer completed, after it rendered the first total).
    assert _requests_total(daemon) - before == 2
    assert n > 0
    r = sandbox.exec("cd /work/tree && find . -name '*.txt' | wc -l && ./d0/run.sh")
    assert r.stdout.split() == ["1000", "ran"]
    sums = sandbox.exec("cd /work/tree && find . -name '*.txt' -exec sha256sum {} +").stdout
    got = {name[2:]: h for h, name in (line.split() for line in sums.splitlines())}
    assert got == expected

    out = tmp_path / "back"
    client._transport.trace = []
    names = sandbox.files.download_dir("/work/tree", str(out))
    assert client._transport.trace == [("GET", f"/v1/sandboxes/{sandbox.id}/files/tar")]
    client._transport.trace = None
    assert sum(1 for nm in names if nm.endswith(".txt")) == 1000
    for rel, h in list(expected.items())[::97]:
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == h
    assert os.access(out / "d0" / "run.sh", os.X_OK)
    with pytest.raises(tidepool.NotFound):
        sandbox.files.download_dir("/no/such/dir", str(tmp_path / "x"))


def _requests_total(daemon) -> int:
    status, _, body = http_raw(daemon.url, "GET", "/metrics")
    total = 0
    for line in body.decode().splitlines():
        if line.startswith("tidepool_http_requests_total"):
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


# -- error mapping ---------------------------------------------------------------------


def test_error_classes_from_the_real_daemon(client, sandbox, daemon):
    # NotFound (404)
    with pytest.raises(tidepool.NotFound) as ei:
        client.get("n0-000000000000")
    assert (ei.value.code, ei.value.status) == ("not_found", 404)
    # InvalidArgument (400)
    with pytest.raises(tidepool.InvalidArgument) as ei:
        client.create(image="host", memory_mb=1)
    assert (ei.value.code, ei.value.status) == ("invalid_argument", 400)
    with pytest.raises(tidepool.InvalidArgument):
        sandbox.exec("true", timeout=0)
    with pytest.raises(tidepool.InvalidArgument):
        sandbox.exec("true", idempotency_key="k" * 201)   # the contract allows at most 200
    # PermissionDenied (403): the host image's /usr is read-only.
    with pytest.raises((tidepool.PermissionDenied, tidepool.InvalidArgument)) as ei:
        sandbox.files.write("/usr/bin/tidepool-nope", b"x")
    assert ei.value.status in (403, 400)
    # PayloadTooLarge (413) / InsufficientStorage (507): both are kinds of the classes.
    with client.create(image="host", memory_mb=64, disk_mb=4, ttl=600) as small:
        with pytest.raises((tidepool.PayloadTooLarge, tidepool.InsufficientStorage)) as ei:
            small.files.write("/work/big.bin", os.urandom(8 * 1024 * 1024))
        assert isinstance(ei.value, (tidepool.InvalidArgument, tidepool.QuotaExceeded))
    # Conflict (409): a stopped sandbox.
    dead = client.create(**SMALL)
    dead.kill()
    with pytest.raises(tidepool.Conflict) as ei:
        dead.exec("true")
    assert (ei.value.code, ei.value.status) == ("conflict", 409)
    # Conflict (409): an idempotency key reused on another route.
    key = str(uuid.uuid4())
    sandbox.exec("true", idempotency_key=key)
    with pytest.raises(tidepool.Conflict):
        sandbox.files.write("/tmp/k", b"x", idempotency_key=key)
    # Timeout: a wait that ends before the process does.
    h = sandbox.start("sleep 30")
    with pytest.raises(tidepool.Timeout):
        h.wait(timeout=0.2)
    h.kill()
    # Unavailable: nobody listens.
    with pytest.raises(tidepool.Unavailable) as ei:
        tidepool.Client(f"http://127.0.0.1:{free_port()}", retry=FAST).health()
    assert ei.value.status is None
    # CommandFailed: check=True.
    with pytest.raises(tidepool.CommandFailed):
        sandbox.exec("exit 4", check=True)
    # All of them are TidepoolErrors carrying code and message.
    assert issubclass(tidepool.CommandFailed, tidepool.TidepoolError)


# -- idempotency: nothing runs twice ---------------------------------------------------

APPEND = "echo line >> /tmp/ledger; wc -l < /tmp/ledger"


def test_same_key_twice_runs_once_raw(sandbox, daemon):
    key = f"it-{uuid.uuid4()}"
    body = json.dumps({"cmd": APPEND}).encode()
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    hdr = {"Content-Type": "application/json", "Idempotency-Key": key}
    s1, _, b1 = http_raw(daemon.url, "POST", path, body, hdr)
    s2, _, b2 = http_raw(daemon.url, "POST", path, body, hdr)
    assert s1 == s2 == 200 and json.loads(b1) == json.loads(b2)
    assert sandbox.files.read("/tmp/ledger") == b"line\n"


def test_same_key_twice_runs_once_sdk(sandbox, make_async_client):
    key = f"traj-{uuid.uuid4()}/step-1"
    a = sandbox.exec(APPEND, idempotency_key=key)
    b = sandbox.exec(APPEND, idempotency_key=key)
    assert a.stdout == b.stdout == "1\n"

    async def main():
        async with make_async_client() as ac:
            sb = await ac.get(sandbox.id)
            return await sb.exec(APPEND, idempotency_key=key)
    assert run(main()).stdout == "1\n"
    assert sandbox.files.read("/tmp/ledger") == b"line\n"
    # A fresh key runs again.
    assert sandbox.exec(APPEND).stdout == "2\n"


def test_replayed_stream_runs_once_and_carries_the_same_output(sandbox, make_async_client):
    key = f"stream-{uuid.uuid4()}"
    cmd = "echo line >> /tmp/ledger; echo out; echo err >&2; wc -l < /tmp/ledger"
    first = list(sandbox.exec_stream(cmd, idempotency_key=key))
    again = list(sandbox.exec_stream(cmd, idempotency_key=key))

    async def main():
        async with make_async_client() as ac:
            sb = await ac.get(sandbox.id)
            return [i async for i in sb.exec_stream(cmd, idempotency_key=key)]
    third = run(main())
    for items in (first, again, third):
        res = items[-1]
        assert isinstance(res, tidepool.ExecResult)
        assert (res.exit_code, res.stdout, res.stderr) == (0, "out\n1\n", "err\n")
        assert b"".join(i.data for i in items[:-1] if i.stream == "stdout") == b"out\n1\n"
    assert sandbox.files.read("/tmp/ledger") == b"line\n"


def _raw_put(conn, path, key):
    conn.request("PUT", path + "?path=/tmp/raw.txt", body=b"v1", headers={"Idempotency-Key": key})
    r = conn.getresponse()
    r.read()
    return r


def test_key_reuse_on_another_route_is_refused_raw(sandbox, daemon):
    key = f"raw-{uuid.uuid4()}"
    path = f"/v1/sandboxes/{sandbox.id}/files"
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        assert _raw_put(conn, path, key).status == 200
        assert _raw_put(conn, path, key).status == 200
        conn.request("DELETE", path + "?path=/tmp/raw.txt", headers={"Idempotency-Key": key})
        r = conn.getresponse()
        body = r.read()
        assert r.status == 409 and json.loads(body)["code"] == "conflict"
    finally:
        conn.close()
    assert sandbox.files.read("/tmp/raw.txt") == b"v1"


def test_replay_is_marked_raw(sandbox, daemon):
    key = f"raw-{uuid.uuid4()}"
    path = f"/v1/sandboxes/{sandbox.id}/files"
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=30)
    try:
        assert _raw_put(conn, path, key).getheader("Idempotent-Replayed") is None
        assert _raw_put(conn, path, key).getheader("Idempotent-Replayed") == "true"
    finally:
        conn.close()


class CuttingProxy:
    """A TCP proxy to the daemon that lets requests through but cuts the connection
    instead of delivering the first ``cuts`` answers (after the daemon produced them)."""

    def __init__(self, target_port: int, cuts: int = 1, partial: bool = False) -> None:
        self.target_port = target_port
        self.cuts = cuts
        self.partial = partial   # deliver the first bytes of the answer, then cut
        self.connections = 0
        self.cut_count = 0
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stop = False
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while not self.stop:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            u = socket.create_connection(("127.0.0.1", self.target_port))
            for a, b, answers in ((c, u, False), (u, c, True)):
                t = threading.Thread(target=self._pump, args=(a, b, answers, c, u), daemon=True)
                t.start()
                self.threads.append(t)

    def _pump(self, src, dst, answers, c, u) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if answers:
                    with self.lock:
                        cut = self.cut_count < self.cuts
                        if cut:
                            self.cut_count += 1
                    if cut:
                        if self.partial:
                            dst.sendall(data[: max(1, len(data) // 3)])
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        self.srv.close()
        for t in self.threads:
            t.join(5)


@pytest.mark.parametrize("partial", [False, True], ids=["cut-before-answer", "cut-mid-answer"])
def test_lost_answer_is_retried_without_running_twice(sandbox, daemon, partial, make_client):
    proxy = CuttingProxy(daemon.port, cuts=1, partial=partial)
    try:
        c = make_client(timeout=60, retry=FAST)
        c._transport = tidepool.client.SyncTransport(proxy.url, None, 60, "it", FAST)
        sb = c.get(sandbox.id)       # goes through the proxy: its answer is cut, then retried
        r = sb.exec(APPEND)          # a fresh connection: delivered
        assert r.stdout == "1\n"
        proxy.cuts += 1              # cut the next answer: the exec's
        r = sb.exec(APPEND)
        assert r.stdout == "2\n" and r.exit_code == 0
        assert proxy.cut_count == 2
        assert sandbox.files.read("/tmp/ledger") == b"line\nline\n"
        c.close()
    finally:
        proxy.close()


def test_lost_answer_is_retried_without_running_twice_async(sandbox, daemon, make_async_client):
    proxy = CuttingProxy(daemon.port, cuts=0)

    async def main():
        async with make_async_client(timeout=60, retry=FAST) as ac:
            ac._transport = tidepool._aio.AsyncTransport(proxy.url, None, 60, "it", FAST)
            sb = await ac.get(sandbox.id)
            proxy.cuts = proxy.cut_count + 1
            r1 = await sb.exec(APPEND)
            proxy.cuts = proxy.cut_count + 1
            fe = await sb.files.write("/tmp/w.txt", b"written once")
            await ac._transport.close()
            return r1, fe

    try:
        r1, fe = run(main())
    finally:
        proxy.close()
    assert r1.stdout == "1\n" and fe.size == len(b"written once")
    assert proxy.cut_count == 2
    assert sandbox.files.read("/tmp/ledger") == b"line\n"


def test_create_retried_after_a_lost_answer_creates_one_sandbox(daemon, make_client):
    proxy = CuttingProxy(daemon.port, cuts=1)
    label = f"once-{uuid.uuid4().hex[:8]}"
    try:
        c = make_client(timeout=60, retry=FAST)
        c._transport = tidepool.client.SyncTransport(proxy.url, None, 60, "it", FAST)
        sb = c.create(**SMALL, labels={"t": label})
        assert proxy.cut_count == 1
        live = c.list(labels={"t": label})
        assert [s.id for s in live] == [sb.id]
        sb.kill()
        c.close()
    finally:
        proxy.close()


def run(coro):
    return asyncio.run(coro)
