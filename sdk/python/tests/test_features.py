"""SDK unit tests of batches, background processes, tar transfers, retries and
idempotency keys, against the fake daemon."""
import io
import os
import socket
import tarfile
import time

import pytest

import tidepool
from tidepool._retry import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.01)


@pytest.fixture
def fclient(fake):
    c = tidepool.Client(fake.url, timeout=10, retry=FAST)
    yield c
    c.close()


# -- batch ---------------------------------------------------------------------------


def test_create_batch_reports_each_item(fclient, fake):
    fake.batch_fail = {1, 3}
    res = fclient.create_batch(5, memory_mb=64, labels={"run": "r"})
    req = fake.requests[-1]
    assert (req.method, req.path) == ("POST", "/v1/sandboxes/batch")
    assert req.json() == {"image": "host", "tier": "container", "memory_mb": 64, "labels": {"run": "r"}, "count": 5}
    assert len(res) == 3 and all(isinstance(s, tidepool.Sandbox) for s in res)
    assert res.errors == [(1, "resource_exhausted", "no room"), (3, "resource_exhausted", "no room")]
    idx, code, msg = res.errors[0]
    assert (idx, code) == (1, "resource_exhausted") and res.errors[0].message == "no room"
    assert not res.ok
    with res:
        pass
    assert all(fake.sandboxes[s.id]["state"] == "stopped" for s in res)


def test_create_batch_bad_count(fclient):
    with pytest.raises(tidepool.InvalidArgument):
        fclient.create_batch(0)
    with pytest.raises(TypeError):
        fclient.create_batch("3")


# -- background processes -------------------------------------------------------------


def test_background_process_wait_and_output(fclient, fake):
    sb = fclient.create()
    fake.exec_handler = lambda sid, req: {"exit_code": 4, "stdout": b"out", "stderr": b"err"}
    h = sb.exec(["make"], background=True)
    assert isinstance(h, tidepool.ProcessHandle) and h.pid > 0
    assert fake.requests[-1].path == f"/v1/sandboxes/{sb.id}/processes"
    r = h.wait()
    assert r.exit_code == 4 and r.stdout == "out" and r.stderr == "err"
    with pytest.raises(tidepool.CommandFailed):
        h.wait(check=True)
    assert h.poll().exit_code == 4
    assert [p.pid for p in sb.processes()] == [h.pid]


def test_background_process_stdin_and_kill(fclient, fake):
    sb = fclient.create()
    h = sb.start(["cat"], stdin_open=True)
    assert fake.requests[-1].json() == {"cmd": ["cat"], "stdin_open": True}
    assert h.poll() is None and h.info.running
    with pytest.raises(tidepool.Timeout):
        h.wait(timeout=0.05)
    assert fake.requests[-1].query == {"timeout": ["0.05"]}
    h.send_stdin(b"ab\x00")
    h.send_stdin("c", eof=True)
    assert fake.requests[-1].query == {"eof": ["true"]}
    assert fake.requests[-1].body == b"c"
    assert h.wait(timeout=5).stdout_bytes == b"ab\x00c"
    with pytest.raises(tidepool.Conflict):
        h.send_stdin(b"late")
    k = sb.start("sleep 100")
    k.kill()
    assert fake.requests[-1].json() == {"signal": 9}
    r = k.wait()
    assert r.signal == 9 and not r.ok
    assert sb.process(k.pid).refresh().state == "exited"
    with pytest.raises(tidepool.NotFound):
        sb.process(99999).refresh()


# -- tar -----------------------------------------------------------------------------


def _tree(root):
    os.makedirs(os.path.join(root, "a", "b"))
    with open(os.path.join(root, "top.txt"), "w") as f:
        f.write("top")
    with open(os.path.join(root, "a", "b", "deep.bin"), "wb") as f:
        f.write(bytes(range(256)))
    os.chmod(os.path.join(root, "a", "b", "deep.bin"), 0o755)


def test_upload_dir_is_one_request(fclient, fake, tmp_path):
    sb = fclient.create()
    _tree(tmp_path / "src")
    before = len(fake.requests)
    n = sb.files.upload_dir(str(tmp_path / "src"), "/work/proj")
    reqs = fake.requests[before:]
    assert [(r.method, r.path) for r in reqs] == [("PUT", f"/v1/sandboxes/{sb.id}/files/tar")]
    assert reqs[0].headers["content-type"] == "application/x-tar"
    assert reqs[0].query == {"path": ["/work/proj"]} and n == len(reqs[0].body)
    assert sb.files.read("/work/proj/a/b/deep.bin") == bytes(range(256))
    assert sb.files.read("/work/proj/top.txt") == b"top"
    with tarfile.open(fileobj=io.BytesIO(reqs[0].body)) as tf:
        m = tf.getmember("a/b/deep.bin")
        assert m.mode & 0o777 == 0o755 and m.uid == 0


def test_download_dir_roundtrip(fclient, fake, tmp_path):
    sb = fclient.create()
    _tree(tmp_path / "src")
    sb.files.upload_dir(str(tmp_path / "src"), "/w")
    names = sb.files.download_dir("/w", str(tmp_path / "out"))
    assert "a/b/deep.bin" in names and "top.txt" in names
    assert (tmp_path / "out" / "a" / "b" / "deep.bin").read_bytes() == bytes(range(256))
    assert (tmp_path / "out" / "top.txt").read_text() == "top"
    with pytest.raises(tidepool.NotFound):
        sb.files.download_dir("/nope", str(tmp_path / "x"))


@pytest.mark.parametrize("name,kind,link", [
    ("../evil", tarfile.REGTYPE, ""),
    ("/abs", tarfile.REGTYPE, ""),
    ("ln", tarfile.SYMTYPE, "/etc/passwd"),
    ("ln2", tarfile.SYMTYPE, "../../x"),
    ("dev", tarfile.CHRTYPE, ""),
])
def test_download_dir_refuses_hostile_entries(fclient, fake, tmp_path, name, kind, link):
    sb = fclient.create()
    sb.files.write("/w/ok", b"1")
    fake.tar_extra = {name: (kind, link)}
    with pytest.raises(tidepool.InvalidArgument):
        sb.files.download_dir("/w", str(tmp_path / "out"))
    assert not (tmp_path / "evil").exists() and not os.path.lexists(tmp_path / "out" / "ln")


def test_upload_dir_needs_a_directory(fclient, tmp_path):
    sb = fclient.create()
    with pytest.raises(NotADirectoryError):
        sb.files.upload_dir(str(tmp_path / "missing"), "/w")


# -- idempotency keys and retries ------------------------------------------------------


def test_every_mutating_request_carries_a_key_and_gets_none(fclient, fake):
    sb = fclient.create()
    sb.exec("true")
    sb.files.write("/a", b"x")
    sb.files.read("/a")
    sb.files.mkdir("/d")
    sb.files.remove("/a")
    sb.kill()
    for r in fake.requests:
        key = r.headers.get("idempotency-key")
        if r.method == "GET":
            assert key is None
        else:
            assert key and len(key) == 36, (r.method, r.path)
    keys = [r.headers.get("idempotency-key") for r in fake.requests if r.method != "GET"]
    assert len(set(keys)) == len(keys)  # one key per logical call


def test_lost_answer_is_retried_with_the_same_key_and_runs_once(fclient, fake):
    sb = fclient.create()
    fake.drop = 1  # the exec runs, but its answer is lost
    before = fake.executions
    r = sb.exec("echo once")
    assert r.stdout == "echo once"
    assert fake.executions == before + 1
    execs = [q for q in fake.requests if q.path.endswith("/exec")]
    assert len(execs) == 2
    assert execs[0].headers["idempotency-key"] == execs[1].headers["idempotency-key"]


def test_caller_key_is_sent_and_a_repeat_replays(fclient, fake):
    sb = fclient.create()
    before = fake.executions
    a = sb.exec("echo x", idempotency_key="traj-1/step-3")
    b = sb.exec("echo x", idempotency_key="traj-1/step-3")
    assert fake.requests[-1].headers["idempotency-key"] == "traj-1/step-3"
    assert a.stdout == b.stdout and fake.executions == before + 1


def test_503_is_retried_with_backoff_and_the_same_key(fclient, fake):
    sb = fclient.create()
    for _ in range(2):
        fake.inject.append((503, b'{"code":"unavailable","message":"busy"}'))
    r = sb.exec("echo ok")
    assert r.stdout == "echo ok"
    execs = [q for q in fake.requests if q.path.endswith("/exec")]
    assert len(execs) == 3 and len({q.headers["idempotency-key"] for q in execs}) == 1


def test_retries_give_up_after_max_attempts(fake):
    c = tidepool.Client(fake.url, timeout=10, retry=RetryPolicy(max_attempts=2, initial_backoff=0.001))
    for _ in range(3):
        fake.inject.append((503, b'{"code":"unavailable","message":"busy"}'))
    with pytest.raises(tidepool.Unavailable):
        c.health()
    assert len(fake.requests) == 2
    fake.inject.clear()
    c.close()


def test_get_is_retried_after_a_lost_answer(fclient, fake):
    fake.drop = 2
    assert fclient.health()["status"] == "ok"
    assert len(fake.requests) == 3


def test_no_retry_policy(fake):
    c = tidepool.Client(fake.url, timeout=10, retry=RetryPolicy(max_attempts=1))
    fake.drop = 1
    with pytest.raises(tidepool.Unavailable):
        c.health()
    c.close()


def test_connection_refused_is_retried_with_backoff():
    # A bound socket that does not listen refuses connections, and while it is held no
    # other process (a daemon of a test running in parallel) can take its port.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        policy = RetryPolicy(max_attempts=4, initial_backoff=0.05, max_backoff=0.2, jitter=0)
        c = tidepool.Client(f"http://127.0.0.1:{port}", timeout=5, retry=policy)
        t0 = time.monotonic()
        with pytest.raises(tidepool.Unavailable):
            c.create()  # nothing reached the daemon, so even a POST may go again
        assert time.monotonic() - t0 >= 0.05 + 0.1 + 0.2 - 0.01
        c.close()
    finally:
        s.close()


def test_reused_key_with_other_route_is_conflict(fclient, fake):
    sb = fclient.create()
    sb.exec("true", idempotency_key="k1")
    with pytest.raises(tidepool.Conflict):
        sb.files.write("/x", b"1", idempotency_key="k1")


def test_retry_policy_validation_and_delay():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2)
    p = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, multiplier=2, jitter=0)
    assert [p.delay(i) for i in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    assert p.delay(0, retry_after=0.5) == 0.5 and p.delay(0, retry_after=9) == 1.0
    j = RetryPolicy(initial_backoff=0.1, jitter=0.5)
    assert all(0.05 <= j.delay(0) <= 0.1 for _ in range(50))


def test_streaming_exec_sends_a_key(fclient, fake):
    sb = fclient.create()
    list(sb.exec_stream("x", idempotency_key="s-1"))
    assert fake.requests[-1].headers["idempotency-key"] == "s-1"


# -- error hierarchy ------------------------------------------------------------------


def test_hierarchy():
    assert issubclass(tidepool.PayloadTooLarge, tidepool.InvalidArgument)
    assert issubclass(tidepool.InsufficientStorage, tidepool.QuotaExceeded)
    for cls in (tidepool.NotFound, tidepool.Conflict, tidepool.InvalidArgument, tidepool.Timeout,
                tidepool.Unavailable, tidepool.QuotaExceeded, tidepool.SandboxError, tidepool.CommandFailed):
        assert issubclass(cls, tidepool.TidepoolError)
