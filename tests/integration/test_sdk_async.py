"""The asyncio client against the real daemon: parity with the sync client, many
concurrent rollouts through one client, cancellation, streaming."""
import asyncio
import time

import pytest

import tidepool


def run(coro):
    return asyncio.run(coro)


SMALL = dict(image="host", memory_mb=64, cpus=0.25, pids=64, ttl=600)


def _describe(r: tidepool.ExecResult):
    return (r.exit_code, r.signal, r.stdout_bytes, r.stderr_bytes, r.timed_out, r.truncated)


def test_sync_and_async_parity(client, make_async_client):
    """The same calls through both clients give the same answers."""
    cmds = [
        "echo out; echo err >&2; exit 3",
        ["printf", "a\\x00b\\xff"],
        "head -c 100 /dev/zero",
        "kill -9 $$",
    ]

    sync_sb = client.create(**SMALL)
    try:
        sync_results = [_describe(sync_sb.exec(c)) for c in cmds]
        sync_results.append(_describe(sync_sb.exec("head -c 5000 /dev/zero", max_output_bytes=1000)))
        sync_results.append(_describe(sync_sb.exec("sleep 5", timeout=0.5)))
        sync_sb.files.write("/w/f.bin", bytes(range(256)), mode=0o600)
        sync_files = (sync_sb.files.read("/w/f.bin"), sync_sb.files.stat("/w/f.bin").mode & 0o777,
                      [e.name for e in sync_sb.files.list("/w")])
        sync_stream = [i for i in sync_sb.exec_stream("echo a; echo b >&2; echo c")]
        with pytest.raises(tidepool.NotFound) as sync_nf:
            sync_sb.files.read("/nope")
    finally:
        sync_sb.kill()
    with pytest.raises(tidepool.Conflict) as sync_conflict:
        sync_sb.exec("true")

    async def main():
        async with make_async_client(timeout=60) as ac:
            sb = await ac.create(**SMALL)
            async with sb:
                results = [_describe(await sb.exec(c)) for c in cmds]
                results.append(_describe(await sb.exec("head -c 5000 /dev/zero", max_output_bytes=1000)))
                results.append(_describe(await sb.exec("sleep 5", timeout=0.5)))
                await sb.files.write("/w/f.bin", bytes(range(256)), mode=0o600)
                files = (await sb.files.read("/w/f.bin"), (await sb.files.stat("/w/f.bin")).mode & 0o777,
                         [e.name for e in await sb.files.list("/w")])
                stream = [i async for i in sb.exec_stream("echo a; echo b >&2; echo c")]
                with pytest.raises(tidepool.NotFound) as nf:
                    await sb.files.read("/nope")
            with pytest.raises(tidepool.Conflict) as conflict:
                await sb.exec("true")
            return results, files, stream, nf.value, conflict.value

    results, files, stream, nf, conflict = run(main())
    assert results == sync_results
    assert files == sync_files
    def per_stream(items):
        # Order is defined within a stream; across stdout and stderr it is a race.
        return {name: b"".join(i.data for i in items if isinstance(i, tidepool.OutputChunk) and i.stream == name)
                for name in ("stdout", "stderr")}
    assert per_stream(stream) == per_stream(sync_stream) == {"stdout": b"a\nc\n", "stderr": b"b\n"}
    assert _describe(stream[-1]) == _describe(sync_stream[-1])
    assert (nf.code, nf.status) == (sync_nf.value.code, sync_nf.value.status) == ("not_found", 404)
    assert (conflict.code, conflict.status) == (sync_conflict.value.code, sync_conflict.value.status)


def test_100_concurrent_rollouts_through_one_client(make_async_client):
    """100 episodes at once: batch create, a few steps each (write, run, read), reward,
    cleanup; one AsyncClient, one event loop."""
    n = 100

    async def episode(sb: tidepool.AsyncSandbox, i: int) -> int:
        await sb.files.write("/work/answer.txt", f"{i}\n")
        r = await sb.exec(["sh", "-c", "cat /work/answer.txt; hostname"], cwd="/work")
        got, host = r.stdout.split()
        assert host == sb.id
        r2 = await sb.exec(f"test $(cat /work/answer.txt) -eq {i} && echo pass")
        return 1 if r2.stdout == "pass\n" and int(got) == i else 0

    async def main():
        async with make_async_client(timeout=120) as ac:
            t0 = time.monotonic()
            batch = await ac.create_batch(n, **SMALL, labels={"test": "rollouts100"})
            async with batch:
                assert not batch.errors, batch.errors[:3]
                assert len({sb.id for sb in batch}) == n
                rewards = await asyncio.gather(*(episode(sb, i) for i, sb in enumerate(batch)))
            live = await ac.list(labels={"test": "rollouts100"})
            return rewards, live, time.monotonic() - t0

    rewards, live, _ = run(main())
    assert rewards == [1] * n
    assert live == []


def test_cancel_mid_exec_kills_the_command_and_the_context_kills_the_sandbox(make_async_client):
    async def main():
        async with make_async_client(timeout=60) as ac:
            sb = await ac.create(**SMALL)
            async with sb:
                # A uniquely named copy of sleep, so another exec can look for it in /proc.
                await sb.exec("cp /bin/sleep /tmp/tpmark_cancel", check=True)
                task = asyncio.ensure_future(sb.exec("/tmp/tpmark_cancel 300"))
                count = "for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done | grep -c tpmark_cancel || true"
                seen = False
                for _ in range(200):
                    if (await sb.exec(count)).stdout.strip() == "1":
                        seen = True
                        break
                    await asyncio.sleep(0.05)
                assert seen, "the long command never became visible"
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # The daemon noticed the dropped connection and killed the command.
                gone = False
                for _ in range(100):
                    if (await sb.exec(count)).stdout.strip() == "0":
                        gone = True
                        break
                    await asyncio.sleep(0.1)
                assert gone, "the cancelled command is still running"

            # Cancel the body of `async with`: the sandbox is still killed.
            sb2 = await ac.create(**SMALL)

            async def body():
                async with sb2:
                    await sb2.exec("sleep 300")

            t = asyncio.ensure_future(body())
            await asyncio.sleep(0.5)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            return sb, (await ac.get(sb.id)).state, (await ac.get(sb2.id)).state

    sb, st1, st2 = run(main())
    assert st1 == "stopped" and st2 == "stopped"


def test_async_streaming_order_and_binary(make_async_client):
    data = bytes(range(256)) * 64

    async def main():
        async with make_async_client(timeout=60) as ac:
            async with await ac.create(**SMALL) as sb:
                await sb.files.write("/tmp/all.bin", data)
                items = [i async for i in sb.exec_stream(["cat", "/tmp/all.bin"])]
                binary = b"".join(i.data for i in items[:-1])
                res = items[-1]
                items2 = [i async for i in sb.exec_stream(
                    "i=1; while [ $i -le 200 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done")]
                # Causal check: the first chunk arrives while the command still waits for us.
                gen = sb.exec_stream("echo first; i=0; while [ ! -e /tmp/go ] && [ $i -lt 400 ]; do "
                                     "sleep 0.05; i=$((i+1)); done; [ -e /tmp/go ] && echo second || echo gave-up",
                                     timeout=60)
                first = await gen.__anext__()
                await sb.files.write("/tmp/go", b"")
                rest = [i async for i in gen]
                return binary, res, items2, first, rest

    binary, res, items2, first, rest = run(main())
    assert binary == data and res.stdout_bytes == data and res.exit_code == 0
    out = b"".join(c.data for c in items2[:-1] if c.stream == "stdout").decode()
    err = b"".join(c.data for c in items2[:-1] if c.stream == "stderr").decode()
    assert out == "".join(f"out{i}\n" for i in range(1, 201))
    assert err == "".join(f"err{i}\n" for i in range(1, 201))
    assert first == tidepool.OutputChunk("stdout", b"first\n")
    assert rest[-1].stdout_bytes == b"first\nsecond\n"
