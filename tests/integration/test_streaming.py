"""Streaming exec: chunks arrive while the command runs, in order, binary-safe."""
import time

import tidepool


def _split(items):
    chunks = [i for i in items if isinstance(i, tidepool.OutputChunk)]
    results = [i for i in items if isinstance(i, tidepool.ExecResult)]
    assert len(results) == 1 and isinstance(items[-1], tidepool.ExecResult)
    return chunks, results[0]


def test_first_chunk_arrives_while_command_runs(sandbox):
    """Causal check, no timing: the command prints, then waits until the client (having seen
    the first chunk) creates a file; only then does it print again and end. Without real
    streaming the client would never see the first chunk before the command ends, and the
    command would give up waiting and say so."""
    cmd = ("echo first; i=0; while [ ! -e /tmp/go ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
           "if [ -e /tmp/go ]; then echo second; else echo gave-up; fi")
    gen = sandbox.exec_stream(cmd, timeout=60)
    first = next(gen)
    assert first == tidepool.OutputChunk("stdout", b"first\n")
    sandbox.files.write("/tmp/go", b"")
    rest = list(gen)
    chunks, res = _split(rest)
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"second\n"
    assert res.exit_code == 0 and res.stdout_bytes == b"first\nsecond\n"


def test_chunk_timestamps_follow_production(sandbox):
    """print, sleep, print: the first chunk is received well before the second one; the gap
    between them is at least as large as the wait before the first (relative, not absolute)."""
    t0 = time.monotonic()
    stamps = []
    for item in sandbox.exec_stream("echo a; sleep 1; echo b"):
        stamps.append((time.monotonic(), item))
    chunk_times = [t for t, i in stamps if isinstance(i, tidepool.OutputChunk)]
    data = b"".join(i.data for _, i in stamps if isinstance(i, tidepool.OutputChunk))
    assert data == b"a\nb\n"
    assert len(chunk_times) >= 2
    t_first, t_last = chunk_times[0], chunk_times[-1]
    # Buffered delivery would put both chunks at the end: gap ~0, wait ~the whole run.
    assert t_last - t_first > 0.5 * (t_last - t0)


def test_order_preserved_per_stream(sandbox):
    r = list(sandbox.exec_stream("i=1; while [ $i -le 300 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done"))
    chunks, res = _split(r)
    out = b"".join(c.data for c in chunks if c.stream == "stdout").decode()
    err = b"".join(c.data for c in chunks if c.stream == "stderr").decode()
    assert out == "".join(f"out{i}\n" for i in range(1, 301))
    assert err == "".join(f"err{i}\n" for i in range(1, 301))
    assert res.stdout == out and res.stderr == err and res.exit_code == 0


def test_binary_safe(sandbox):
    data = bytes(range(256)) * 64
    sandbox.files.write("/tmp/all.bin", data)
    chunks, res = _split(list(sandbox.exec_stream(["cat", "/tmp/all.bin"])))
    assert b"".join(c.data for c in chunks) == data
    assert res.stdout_bytes == data
    # And the all-at-once form, and through stdin.
    assert sandbox.exec(["cat", "/tmp/all.bin"]).stdout_bytes == data
    chunks, res = _split(list(sandbox.exec_stream(["cat"], stdin=data)))
    assert res.stdout_bytes == data


def test_stream_exit_status_and_signal(sandbox):
    _, res = _split(list(sandbox.exec_stream("echo x; exit 7")))
    assert res.exit_code == 7
    _, res = _split(list(sandbox.exec_stream("kill -9 $$")))
    assert res.signal == 9


def test_stream_timeout(sandbox):
    items = list(sandbox.exec_stream("echo begin; sleep 100", timeout=1))
    chunks, res = _split(items)
    assert res.timed_out
    assert b"".join(c.data for c in chunks) == b"begin\n"


def test_large_stream(sandbox):
    chunks, res = _split(list(sandbox.exec_stream("head -c 2000000 /dev/zero")))
    assert sum(len(c.data) for c in chunks) == 2000000


def test_abandoned_stream_leaves_daemon_and_sandbox_usable(sandbox):
    gen = sandbox.exec_stream("echo one; sleep 5; echo two")
    assert next(gen).data == b"one\n"
    gen.close()
    assert sandbox.exec("echo still").stdout == "still\n"
