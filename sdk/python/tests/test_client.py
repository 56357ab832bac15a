"""SDK unit tests against the in-memory fake daemon (no real daemon needed)."""
import datetime as dt
import json
import socket
import threading

import pytest

import tidepool
from fake_server import error_cases


# -- client and sandboxes ----------------------------------------------------------


def test_url_from_environment(monkeypatch):
    monkeypatch.setenv("TIDEPOOL_URL", "http://10.1.2.3:9999/")
    assert tidepool.Client().url == "http://10.1.2.3:9999"
    monkeypatch.delenv("TIDEPOOL_URL")
    assert tidepool.Client().url == "http://127.0.0.1:7070"
    assert tidepool.Client("http://h:1").url == "http://h:1"


def test_bad_url_is_rejected():
    with pytest.raises(ValueError):
        tidepool.Client("ftp://x")


def test_health_version_metrics(client):
    assert client.health()["status"] == "ok"
    assert client.version()["api"] == "v1"
    assert "tidepool_exec_total" in client.metrics()


def test_create_sends_contract_fields(client, fake):
    sb = client.create(memory_mb=256, cpus=0.5, ttl=dt.timedelta(minutes=10), idle_timeout=1.5,
                       labels={"run": "a"}, env={"X": "1"}, disk_mb=64, pids=100)
    body = fake.requests[-1].json()
    assert fake.requests[-1].method == "POST" and fake.requests[-1].path == "/v1/sandboxes"
    assert body == {"image": "host", "tier": "container", "memory_mb": 256, "cpus": 0.5,
                    "ttl_seconds": 600, "idle_timeout_seconds": 2, "labels": {"run": "a"},
                    "env": {"X": "1"}, "disk_mb": 64, "pids": 100}
    assert isinstance(sb, tidepool.Sandbox)
    assert sb.state == "running" and sb.id.startswith("n0-")
    assert sb.labels == {"run": "a"} and sb.memory_mb == 256 and sb.info.cpus == 0.5
    assert isinstance(sb.info.created_at, dt.datetime)


def test_create_omits_unset_fields(client, fake):
    client.create()
    assert fake.requests[-1].json() == {"image": "host", "tier": "container"}


def test_create_rejects_non_numeric_ttl(client):
    with pytest.raises(TypeError):
        client.create(ttl="10m")


def test_get_list_and_label_filter(client, fake):
    a = client.create(labels={"job": "x", "k": "1"})
    client.create(labels={"job": "y"})
    assert client.get(a.id).id == a.id
    got = client.list(labels={"job": "x", "k": "1"})
    assert [s.id for s in got] == [a.id]
    assert fake.requests[-1].query["label"] == ["job=x", "k=1"]
    assert len(client.list()) == 2
    client.list(state="stopped")
    assert fake.requests[-1].query["state"] == ["stopped"]


def test_kill_refresh_and_context_manager(client, fake):
    with client.create() as sb:
        assert sb.refresh().state == "running"
    assert sb.state == "stopped" and sb.end_reason == "deleted"
    assert fake.requests[-1].method == "DELETE"
    assert client.get(sb.id).state == "stopped"


def test_context_manager_kills_on_exception(client, fake):
    with pytest.raises(RuntimeError):
        with client.create() as sb:
            raise RuntimeError("boom")
    assert fake.sandboxes[sb.id]["state"] == "stopped"


def test_context_manager_keeps_body_exception_when_kill_fails(client, fake):
    with pytest.raises(RuntimeError):
        with client.create():
            fake.inject.append((500, b'{"code":"internal","message":"kill failed"}'))
            raise RuntimeError("body")


def test_kill_of_unknown_sandbox_is_not_an_error(client, fake):
    sb = client.create()
    del fake.sandboxes[sb.id]
    sb.kill()
    assert sb.state == "stopped"


def test_unknown_attribute_raises_attribute_error(client):
    sb = client.create()
    with pytest.raises(AttributeError):
        sb.no_such_field


# -- errors ------------------------------------------------------------------------


@pytest.mark.parametrize("status,code,cls", error_cases(tidepool) + [(418, "teapot", tidepool.SandboxError)])
def test_error_mapping(client, fake, status, code, cls):
    # 503 is retried: make every attempt fail.
    for _ in range(tidepool.RetryPolicy().max_attempts if status == 503 else 1):
        fake.inject.append((status, json.dumps({"code": code, "message": "why"}).encode()))
    with pytest.raises(cls) as ei:
        client.health()
    assert isinstance(ei.value, tidepool.TidepoolError)
    assert (ei.value.code, ei.value.message, ei.value.status) == (code, "why", status)
    assert code in str(ei.value)
    # The connection stays usable after an error answer.
    assert client.health()["status"] == "ok"


def test_error_without_json_body(client, fake):
    fake.inject.append((502, b"bad gateway"))
    with pytest.raises(tidepool.SandboxError) as ei:
        client.health()
    assert ei.value.status == 502 and "bad gateway" in ei.value.message


def test_real_not_found_and_conflict(client, fake):
    with pytest.raises(tidepool.NotFound):
        client.get("n0-000000000000")
    sb = client.create()
    sb.kill()
    with pytest.raises(tidepool.Conflict):
        sb.exec("true")


def test_connection_refused_is_unavailable():
    # Bound without listening: refused, and the port cannot be taken meanwhile.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        with pytest.raises(tidepool.Unavailable) as ei:
            tidepool.Client(f"http://127.0.0.1:{port}", timeout=5).health()
        assert ei.value.status is None
    finally:
        s.close()


def test_client_timeout_is_timeout(fake):
    fake.delay = 1.0
    c = tidepool.Client(fake.url, timeout=0.2)
    with pytest.raises(tidepool.Timeout):
        c.health()
    fake.delay = 0
    assert c.health()["status"] == "ok"  # a fresh connection replaces the timed-out one
    c.close()


def test_api_key_header(fake, monkeypatch):
    monkeypatch.setenv("TIDEPOOL_API_KEY", "k123")
    c = tidepool.Client(fake.url)
    c.health()
    assert fake.requests[-1].headers["authorization"] == "Bearer k123"
    c2 = tidepool.Client(fake.url, api_key="other")
    c2.health()
    assert fake.requests[-1].headers["authorization"] == "Bearer other"


def test_closed_client_raises_unavailable(client):
    client.close()
    with pytest.raises(tidepool.Unavailable):
        client.health()


# -- connections -------------------------------------------------------------------


def test_keep_alive_reuses_one_connection(client, fake):
    for _ in range(5):
        client.health()
    sb = client.create()
    sb.exec("true")
    sb.files.write("/a", b"x")
    assert sb.files.read("/a") == b"x"
    assert fake.connections == 1


def test_server_closing_idle_connection_is_survived(client, fake):
    client.health()
    fake.drop_connections()
    assert client.health()["status"] == "ok"
    fake.drop_connections()
    # POST is not retried blindly, but a closed idle connection is detected before use.
    assert client.create().state == "running"
    assert fake.connections == 3


def test_threads_share_a_client(client, fake):
    sb = client.create()
    errors = []

    def work(i):
        try:
            for j in range(10):
                r = sb.exec(["echo", f"{i}-{j}"])
                assert r.stdout == f"echo {i}-{j}"
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fake.connections <= 9


# -- exec --------------------------------------------------------------------------


def test_exec_request_and_result(client, fake):
    sb = client.create()
    seen = {}

    def handler(sid, req):
        seen.update(req)
        return {"exit_code": 3, "stdout": b"ok\xff", "stderr": b"err", "duration": 0.5,
                "max_rss_kb": 1234, "timed_out": False, "oom_killed": False,
                "stdout_truncated": True, "stderr_truncated": False}

    fake.exec_handler = handler
    r = sb.exec(["python3", "-c", "x"], timeout=2.5, env={"A": "b"}, cwd="/tmp", user=1000,
                stdin=b"\x00in", max_output_bytes=10)
    assert seen == {"cmd": ["python3", "-c", "x"], "timeout": 2.5, "env": {"A": "b"}, "cwd": "/tmp",
                    "user": 1000, "stdin": "AGlu", "max_output_bytes": 10}
    assert r.exit_code == 3 and r.signal is None and not r.ok
    assert r.stdout_bytes == b"ok\xff" and r.stdout == "ok\ufffd" and r.stderr == "err"
    assert r.duration == 0.5 and r.max_rss_kb == 1234
    assert r.truncated and r.stdout_truncated and not r.stderr_truncated


def test_exec_string_command_and_str_stdin(client, fake):
    sb = client.create()
    seen = {}
    fake.exec_handler = lambda sid, req: seen.update(req) or {"exit_code": 0}
    r = sb.exec("echo hi | wc -c", stdin="é")
    assert seen["cmd"] == "echo hi | wc -c" and seen["stdin"] == "w6k="
    assert r.ok and r.stdout == ""


def test_exec_signal_and_check(client, fake):
    sb = client.create()
    fake.exec_handler = lambda sid, req: {"exit_code": -1, "signal": 9, "stderr": b"Killed"}
    r = sb.exec("kill -9 $$")
    assert r.exit_code == -1 and r.signal == 9 and not r.ok
    with pytest.raises(tidepool.CommandFailed) as ei:
        sb.exec("kill -9 $$", check=True)
    assert ei.value.result.signal == 9 and "signal 9" in ei.value.message
    fake.exec_handler = lambda sid, req: {"exit_code": 0}
    assert sb.exec("true", check=True).ok


def test_exec_invalid_timeout_is_invalid_argument(client):
    sb = client.create()
    with pytest.raises(tidepool.InvalidArgument):
        sb.exec("true", timeout=0)
    with pytest.raises(tidepool.InvalidArgument):
        sb.exec("true", timeout=-1)


def test_exec_rejects_bad_cmd_types(client):
    sb = client.create()
    with pytest.raises(TypeError):
        sb.exec(b"echo")
    with pytest.raises(ValueError):
        sb.exec([])


def test_exec_stream_delivers_chunks_before_the_command_ends(client, fake):
    sb = client.create()
    release = threading.Event()
    fake.exec_handler = lambda sid, req: [
        ("stdout", b"first\n"), ("wait", release), ("stderr", b"second\n"), ("stdout", b"third\n"),
        ("exit", {"exit_code": 0, "duration": 1.0})]
    items = []
    gen = sb.exec_stream(["sh", "-c", "..."])
    first = next(gen)
    # The server is still blocked before sending anything else: the chunk arrived early.
    assert first == tidepool.OutputChunk("stdout", b"first\n")
    assert not release.is_set()
    release.set()
    items = list(gen)
    assert items[:2] == [tidepool.OutputChunk("stderr", b"second\n"), tidepool.OutputChunk("stdout", b"third\n")]
    res = items[-1]
    assert isinstance(res, tidepool.ExecResult) and len(items) == 3
    assert res.stdout_bytes == b"first\nthird\n" and res.stderr_bytes == b"second\n"
    assert res.pid == 42
    assert fake.requests[-1].json()["stream"] is True
    # The connection went back to the pool after a complete stream.
    client.health()
    assert fake.connections == 1


def test_exec_stream_is_binary_safe(client, fake):
    sb = client.create()
    data = bytes(range(256))
    fake.exec_handler = lambda sid, req: [("stdout", data[:100]), ("stdout", data[100:]),
                                          ("exit", {"exit_code": 0})]
    chunks = [c for c in sb.exec_stream("cat") if isinstance(c, tidepool.OutputChunk)]
    assert b"".join(c.data for c in chunks) == data


def test_exec_stream_error_event(client, fake):
    sb = client.create()
    fake.exec_handler = lambda sid, req: [("stdout", b"x"), ("error", "internal", "agent died")]
    gen = sb.exec_stream("x")
    assert next(gen).data == b"x"
    with pytest.raises(tidepool.SandboxError) as ei:
        next(gen)
    assert ei.value.code == "internal" and ei.value.message == "agent died"


def test_exec_stream_without_exit_is_an_error(client, fake):
    sb = client.create()
    fake.exec_handler = lambda sid, req: [("stdout", b"x")]
    with pytest.raises(tidepool.SandboxError):
        list(sb.exec_stream("x"))


def test_exec_stream_check(client, fake):
    sb = client.create()
    fake.exec_handler = lambda sid, req: [("exit", {"exit_code": 2})]
    with pytest.raises(tidepool.CommandFailed) as ei:
        list(sb.exec_stream("x", check=True))
    assert ei.value.result.exit_code == 2


def test_exec_stream_conflict_raises_before_chunks(client, fake):
    sb = client.create()
    sb.kill()
    with pytest.raises(tidepool.Conflict):
        next(sb.exec_stream("x"))


def test_exec_stream_closed_early_drops_connection(client, fake):
    sb = client.create()
    release = threading.Event()
    fake.exec_handler = lambda sid, req: [("stdout", b"a"), ("wait", release), ("exit", {"exit_code": 0})]
    gen = sb.exec_stream("x")
    next(gen)
    gen.close()
    release.set()
    assert client.health()["status"] == "ok"
    assert fake.connections == 2


def test_exec_stream_accepts_a_plain_json_answer(client, fake):
    sb = client.create()
    fake.inject.append((200, json.dumps({"exit_code": 0, "stdout": "aGk=", "stderr": ""}).encode()))
    items = list(sb.exec_stream("x"))
    assert items[0] == tidepool.OutputChunk("stdout", b"hi") and items[-1].stdout == "hi"


# -- files -------------------------------------------------------------------------


def test_files_roundtrip(client, fake):
    sb = client.create()
    data = bytes(range(256)) * 4
    e = sb.files.write("/work/dir/a b.bin", data, mode=0o755)
    assert fake.requests[-1].query == {"path": ["/work/dir/a b.bin"], "mode": ["755"]}
    assert e.type == "file" and e.size == len(data) and e.mode == 0o755 and e.name == "a b.bin"
    assert sb.files.read("/work/dir/a b.bin") == data
    sb.files.write("/work/dir/t.txt", "héllo")
    assert sb.files.read_text("/work/dir/t.txt") == "héllo"
    names = [x.name for x in sb.files.list("/work/dir")]
    assert names == ["a b.bin", "t.txt"]
    st = sb.files.stat("/work/dir")
    assert st.is_dir and not st.is_file
    assert sb.files.exists("/work/dir/t.txt") and not sb.files.exists("/nope")
    sb.files.remove("/work/dir/t.txt")
    with pytest.raises(tidepool.NotFound):
        sb.files.read("/work/dir/t.txt")
    with pytest.raises(tidepool.Conflict):
        sb.files.remove("/work/dir")
    sb.files.remove("/work/dir", recursive=True)
    assert fake.requests[-1].query["recursive"] == ["true"]
    assert not sb.files.exists("/work/dir/a b.bin")


def test_mkdir(client, fake):
    sb = client.create()
    with pytest.raises(tidepool.NotFound):
        sb.files.mkdir("/x/y")
    e = sb.files.mkdir("/x/y", parents=True)
    assert e.is_dir and e.path == "/x/y"
    assert fake.requests[-1].query["parents"] == ["true"]


def test_files_argument_checks(client):
    sb = client.create()
    with pytest.raises(ValueError):
        sb.files.read("")
    with pytest.raises(TypeError):
        sb.files.write("/a", 123)
    with pytest.raises(tidepool.InvalidArgument):
        sb.files.read("relative")


def test_sandbox_id_is_escaped(client, fake):
    with pytest.raises(tidepool.NotFound):
        client.get("../health")
    assert fake.requests[-1].path == "/v1/sandboxes/..%2Fhealth"


# -- models ------------------------------------------------------------------------


def test_time_parsing_handles_z_and_nanoseconds():
    info = tidepool.SandboxInfo.from_json({"id": "a", "state": "stopped",
                                           "created_at": "2024-01-02T03:04:05.123456789Z",
                                           "ended_at": "garbage", "end_reason": "ttl"})
    assert info.created_at == dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.timezone.utc)
    assert info.ended_at is None and info.end_reason == "ttl" and not info.live


def test_unknown_fields_are_kept():
    r = tidepool.ExecResult.from_json({"exit_code": 0, "new_field": 1})
    assert r.raw["new_field"] == 1 and r.ok and r.signal is None


def test_exec_result_repr_is_short():
    r = tidepool.ExecResult(exit_code=-1, signal=9, stdout_bytes=b"x" * 10000, oom_killed=True)
    text = repr(r)
    assert "signal=9" in text and "oom_killed=True" in text and "+9800 bytes" in text
    assert len(text) < 600
