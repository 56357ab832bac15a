"""AsyncClient against the fake daemon: the same behaviour as the sync client, plus
pooling, concurrency and cancellation."""
import asyncio
import inspect
import json
import socket
import threading

import pytest

import tidepool
from fake_server import error_cases
from tidepool._retry import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_backoff=0.001, max_backoff=0.01)


def run(coro):
    return asyncio.run(coro)


def aclient(fake, **kw):
    kw.setdefault("timeout", 10)
    kw.setdefault("retry", FAST)
    return tidepool.AsyncClient(fake.url, **kw)


def test_same_public_methods_as_sync():
    pairs = [(tidepool.Client, tidepool.AsyncClient), (tidepool.Sandbox, tidepool.AsyncSandbox),
             (tidepool.Files, tidepool.AsyncFiles), (tidepool.ProcessHandle, tidepool.AsyncProcessHandle)]
    for sync_cls, async_cls in pairs:
        sync_names = {n for n, v in vars(sync_cls).items() if not n.startswith("_") and callable(v)}
        async_names = {n for n, v in vars(async_cls).items() if not n.startswith("_") and callable(v)}
        assert sync_names <= async_names, (sync_cls, sync_names - async_names)
        for n in sync_names:
            s_params = list(inspect.signature(getattr(sync_cls, n)).parameters)
            a_params = list(inspect.signature(getattr(async_cls, n)).parameters)
            assert s_params == a_params, (sync_cls.__name__, n)


def test_basic_calls_and_keep_alive(fake):
    async def main():
        async with aclient(fake) as c:
            assert (await c.health())["status"] == "ok"
            assert (await c.version())["api"] == "v1"
            assert "tidepool_exec_total" in await c.metrics()
            sb = await c.create(memory_mb=256, labels={"a": "1"}, ttl=60)
            assert isinstance(sb, tidepool.AsyncSandbox) and sb.memory_mb == 256
            assert fake.requests[-1].json() == {"image": "host", "tier": "container", "memory_mb": 256,
                                                "ttl_seconds": 60, "labels": {"a": "1"}}
            assert (await c.get(sb.id)).id == sb.id
            assert [s.id for s in await c.list(labels={"a": "1"})] == [sb.id]
            r = await sb.exec(["echo", "hi"])
            assert r.stdout == "echo hi" and r.ok
            await sb.files.write("/x/y", b"\x00\xff")
            assert await sb.files.read("/x/y") == b"\x00\xff"
            async with sb:
                pass
            assert sb.state == "stopped"
            assert await c.kill("n0-unknown") is None
        assert fake.connections == 1
    run(main())


def test_exec_fields_and_check(fake):
    fake.exec_handler = lambda sid, req: {"exit_code": 2, "stdout": b"o", "stderr": b"e", "duration": 0.25,
                                          "stdout_truncated": True}

    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            r = await sb.exec("x", timeout=3, env={"K": "v"}, cwd="/tmp", user=5, stdin="in",
                              max_output_bytes=7)
            assert fake.requests[-1].json() == {"cmd": "x", "timeout": 3.0, "env": {"K": "v"}, "cwd": "/tmp",
                                                "user": 5, "stdin": "aW4=", "max_output_bytes": 7}
            assert (r.exit_code, r.stdout, r.stderr, r.duration, r.truncated) == (2, "o", "e", 0.25, True)
            with pytest.raises(tidepool.CommandFailed):
                await sb.exec("x", check=True)
    run(main())


@pytest.mark.parametrize("status,code,cls", error_cases(tidepool))
def test_error_mapping(fake, status, code, cls):
    for _ in range(FAST.max_attempts if status == 503 else 1):
        fake.inject.append((status, json.dumps({"code": code, "message": "why"}).encode()))

    async def main():
        async with aclient(fake) as c:
            with pytest.raises(cls) as ei:
                await c.health()
            assert (ei.value.code, ei.value.message, ei.value.status) == (code, "why", status)
            assert (await c.health())["status"] == "ok"
    run(main())


def test_stream_chunks_arrive_early_and_in_order(fake):
    release = threading.Event()
    data = bytes(range(256))
    fake.exec_handler = lambda sid, req: [
        ("stdout", b"first\n"), ("wait", release), ("stderr", data), ("stdout", b"third\n"),
        ("exit", {"exit_code": 0, "duration": 1.0})]

    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            gen = sb.exec_stream("x")
            first = await gen.__anext__()
            assert first == tidepool.OutputChunk("stdout", b"first\n") and not release.is_set()
            release.set()
            rest = [i async for i in gen]
            assert rest[0] == tidepool.OutputChunk("stderr", data)
            assert rest[1] == tidepool.OutputChunk("stdout", b"third\n")
            res = rest[-1]
            assert isinstance(res, tidepool.ExecResult) and res.stderr_bytes == data and res.pid == 42
            await c.health()
        assert fake.connections == 1
    run(main())


def test_stream_error_event_and_missing_exit(fake):
    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            fake.exec_handler = lambda sid, req: [("stdout", b"x"), ("error", "internal", "agent died")]
            with pytest.raises(tidepool.SandboxError) as ei:
                [i async for i in sb.exec_stream("x")]
            assert ei.value.message == "agent died"
            fake.exec_handler = lambda sid, req: [("stdout", b"x")]
            with pytest.raises(tidepool.SandboxError):
                [i async for i in sb.exec_stream("x")]
            fake.exec_handler = lambda sid, req: [("exit", {"exit_code": 3})]
            with pytest.raises(tidepool.CommandFailed):
                [i async for i in sb.exec_stream("x", check=True)]
            fake.inject.append((200, json.dumps({"exit_code": 0, "stdout": "aGk="}).encode()))
            items = [i async for i in sb.exec_stream("x")]
            assert items[0].data == b"hi" and items[-1].stdout == "hi"
    run(main())


def test_abandoned_stream_releases_its_slot(fake):
    release = threading.Event()
    fake.exec_handler = lambda sid, req: [("stdout", b"a"), ("wait", release), ("exit", {"exit_code": 0})]

    async def main():
        async with aclient(fake, max_connections=1) as c:
            sb = await c.create()
            gen = sb.exec_stream("x")
            await gen.__anext__()
            await gen.aclose()
            release.set()
            # With one slot, this would hang if the stream had kept it.
            assert (await asyncio.wait_for(c.health(), 5))["status"] == "ok"
    run(main())


def test_concurrency_pool_and_limit(fake):
    fake.delay = 0.05

    async def main():
        async with aclient(fake, max_connections=4) as c:
            sb = await c.create()
            rs = await asyncio.gather(*(sb.exec(["echo", str(i)]) for i in range(20)))
            assert [r.stdout for r in rs] == [f"echo {i}" for i in range(20)]
    run(main())
    assert fake.connections <= 4


def test_cancel_mid_exec_closes_the_connection_and_context_kills(fake):
    started = threading.Event()
    release = threading.Event()

    def handler(sid, req):
        started.set()
        release.wait(5)
        return {"exit_code": 0}

    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            fake.exec_handler = handler

            async def body():
                async with sb:
                    await sb.exec("sleep 100")

            task = asyncio.ensure_future(body())
            while not started.is_set():
                await asyncio.sleep(0.01)
            task.cancel()
            fake.exec_handler = lambda sid, req: {"exit_code": 0}
            with pytest.raises(asyncio.CancelledError):
                await task
            release.set()
            return sb

    sb = run(main())
    assert fake.sandboxes[sb.id]["state"] == "stopped"
    assert [r.method for r in fake.requests][-1] == "DELETE"


def test_cancel_during_create_kills_what_was_created(fake):
    fake.delay = 0.3

    async def main():
        async with aclient(fake) as c:
            task = asyncio.ensure_future(c.create())
            while not any(r.method == "POST" for r in fake.requests):
                await asyncio.sleep(0.01)   # the request reached the fake, which answers slowly
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    run(main())
    posts = [r for r in fake.requests if r.method == "POST"]
    assert len(posts) == 2 and posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]
    assert len(fake.sandboxes) == 1
    assert all(s["state"] == "stopped" for s in fake.sandboxes.values())


def test_batch_async_with_kills_all(fake):
    fake.batch_fail = {0}

    async def main():
        async with aclient(fake) as c:
            batch = await c.create_batch(4)
            assert len(batch) == 3 and batch.errors[0].index == 0
            async with batch:
                rs = await asyncio.gather(*(sb.exec("true") for sb in batch))
                assert all(r.ok for r in rs)
            return batch
    batch = run(main())
    assert all(fake.sandboxes[sb.id]["state"] == "stopped" for sb in batch)


def test_processes(fake):
    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            h = await sb.start(["cat"], stdin_open=True)
            assert isinstance(h, tidepool.AsyncProcessHandle)
            assert await h.poll() is None
            with pytest.raises(tidepool.Timeout):
                await h.wait(timeout=0.05)
            await h.send_stdin(b"data")
            await h.close_stdin()
            assert (await h.wait()).stdout_bytes == b"data"
            k = await sb.exec("sleep 9", background=True)
            await k.kill(15)
            assert (await k.wait()).signal == 15
            assert len(await sb.processes()) == 2
    run(main())


def test_files_and_tar(fake, tmp_path):
    (tmp_path / "src" / "d").mkdir(parents=True)
    for i in range(50):
        (tmp_path / "src" / "d" / f"f{i}.txt").write_text(str(i))

    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            c._transport.trace = []
            await sb.files.upload_dir(str(tmp_path / "src"), "/w")
            assert c._transport.trace == [("PUT", f"/v1/sandboxes/{sb.id}/files/tar")]
            assert await sb.files.read_text("/w/d/f7.txt") == "7"
            names = await sb.files.download_dir("/w", str(tmp_path / "out"))
            assert len([n for n in names if n.endswith(".txt")]) == 50
            assert (tmp_path / "out" / "d" / "f49.txt").read_text() == "49"
            assert [e.name for e in await sb.files.list("/w")] == ["d"]
            assert (await sb.files.stat("/w/d")).is_dir
            assert await sb.files.exists("/w/d/f1.txt")
            await sb.files.remove("/w", recursive=True)
            assert not await sb.files.exists("/w/d/f1.txt")
            assert (await sb.files.mkdir("/m/n", parents=True)).is_dir
            with pytest.raises(tidepool.NotFound):
                await sb.files.read("/nope")
    run(main())


def test_retries_with_same_key(fake):
    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            before = fake.executions
            fake.drop = 1
            r = await sb.exec("echo once")
            assert r.stdout == "echo once" and fake.executions == before + 1
            for _ in range(2):
                fake.inject.append((503, b'{"code":"unavailable","message":"busy"}'))
            assert (await sb.exec("echo two")).stdout == "echo two"
            execs = [q for q in fake.requests if q.path.endswith("/exec")]
            assert len(execs) == 5
            assert execs[0].headers["idempotency-key"] == execs[1].headers["idempotency-key"]
            assert len({q.headers["idempotency-key"] for q in execs[2:]}) == 1
            fake.drop = 1
            assert (await c.health())["status"] == "ok"
    run(main())


def test_server_closing_idle_connections_is_survived(fake):
    async def main():
        async with aclient(fake) as c:
            await c.health()
            fake.drop_connections()
            await asyncio.sleep(0.05)
            assert (await c.health())["status"] == "ok"
            fake.drop_connections()
            assert (await c.create()).state == "running"
    run(main())


def test_timeout_and_refused(fake):
    async def main():
        fake.delay = 0.5
        c = tidepool.AsyncClient(fake.url, timeout=0.1, retry=FAST)
        with pytest.raises(tidepool.Timeout):
            await c.health()
        fake.delay = 0
        assert (await c.health())["status"] == "ok"
        await c.close()
        with pytest.raises(tidepool.Unavailable):
            await c.health()
        # Bound without listening: refused, and the port cannot be taken meanwhile.
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        try:
            c2 = tidepool.AsyncClient(f"http://127.0.0.1:{port}", retry=FAST)
            with pytest.raises(tidepool.Unavailable) as ei:
                await c2.create()
            assert ei.value.status is None
            await c2.close()
        finally:
            s.close()
    run(main())


def test_api_key_and_url_from_environment(fake, monkeypatch):
    monkeypatch.setenv("TIDEPOOL_URL", fake.url + "/")
    monkeypatch.setenv("TIDEPOOL_API_KEY", "sekrit")

    async def main():
        async with tidepool.AsyncClient() as c:
            assert c.url == fake.url
            await c.health()
    run(main())
    assert fake.requests[-1].headers["authorization"] == "Bearer sekrit"
    assert fake.requests[-1].headers["host"].startswith("127.0.0.1:")


def test_large_bodies(fake):
    big = bytes(range(256)) * 4096  # 1 MiB

    async def main():
        async with aclient(fake) as c:
            sb = await c.create()
            await sb.files.write("/big", big)
            assert await sb.files.read("/big") == big
    run(main())


def test_client_reused_from_a_second_event_loop(fake):
    c = aclient(fake)

    async def once():
        return (await c.health())["status"]

    assert run(once()) == "ok"
    assert run(once()) == "ok"   # a new loop: the old loop's connections are not reused
    run(c.close())
