"""Commands: exit codes, signals, stdin, env, cwd, user, output caps, timeouts."""
import pytest

import tidepool
from tp_testlib import wait_until


def test_exit_codes(sandbox):
    assert sandbox.exec("exit 3").exit_code == 3
    assert sandbox.exec(["false"]).exit_code == 1
    r = sandbox.exec("echo hello; exit 0")
    assert r.exit_code == 0 and r.ok and r.stdout == "hello\n" and r.stderr == ""
    assert r.signal is None and not r.timed_out and not r.oom_killed
    assert r.duration >= 0


def test_signals(sandbox):
    r = sandbox.exec("kill -9 $$")
    assert r.signal == 9 and r.exit_code == -1 and not r.ok
    r = sandbox.exec("kill -TERM $$")
    assert r.signal == 15


def test_check_raises_command_failed(sandbox):
    with pytest.raises(tidepool.CommandFailed) as ei:
        sandbox.exec("echo oops >&2; exit 4", check=True)
    assert ei.value.result.exit_code == 4 and "oops" in ei.value.message


def test_stdout_stderr_separate(sandbox):
    r = sandbox.exec("echo out; echo err >&2")
    assert r.stdout == "out\n" and r.stderr == "err\n"


def test_argv_is_not_resplit(sandbox):
    r = sandbox.exec(["printf", "[%s]", "a b", "c;d", "$HOME"])
    assert r.stdout == "[a b][c;d][$HOME]"


def test_env_cwd_user_stdin(sandbox):
    assert sandbox.exec("printf %s \"$FOO\"", env={"FOO": "bar baz"}).stdout == "bar baz"
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.exec("pwd").stdout == "/\n"
    assert sandbox.exec("id -u").stdout == "0\n"
    assert sandbox.exec("id -u", user=1000).stdout == "1000\n"
    data = bytes(range(256)) * 16
    r = sandbox.exec(["cat"], stdin=data)
    assert r.stdout_bytes == data
    assert sandbox.exec("wc -l", stdin="a\nb\nc\n").stdout.strip() == "3"


def test_missing_program(sandbox):
    r = sandbox.exec("/no/such/program")
    assert r.exit_code == 127
    try:
        r = sandbox.exec(["/no/such/program"])
    except (tidepool.NotFound, tidepool.InvalidArgument):
        return
    assert r.exit_code != 0


def test_output_cap_and_truncation(sandbox):
    r = sandbox.exec("head -c 100000 /dev/zero; head -c 10 /dev/zero >&2", max_output_bytes=1000)
    assert r.stdout_truncated and r.truncated and not r.stderr_truncated
    assert len(r.stdout_bytes) <= 1000 and len(r.stderr_bytes) == 10
    r = sandbox.exec("head -c 4000000 /dev/urandom | wc -c")
    assert r.stdout.strip() == "4000000" and not r.truncated


def test_large_output(sandbox):
    r = sandbox.exec("head -c 3000000 /dev/zero")
    assert len(r.stdout_bytes) == 3000000 and not r.truncated


def test_peak_memory_reported(sandbox):
    r = sandbox.exec(["sh", "-c", "true"])
    assert r.max_rss_kb is None or r.max_rss_kb >= 0
    r = sandbox.exec(["python3", "-c", "b = bytearray(50 * 1024 * 1024); print(len(b))"])
    assert r.stdout == f"{50 * 1024 * 1024}\n"
    if r.max_rss_kb is not None:
        assert r.max_rss_kb >= 40 * 1024


def test_timeout_returns_timed_out(sandbox):
    r = sandbox.exec("sleep 100", timeout=1)
    assert r.timed_out and not r.ok
    assert r.duration < 100
    # The sandbox is fine afterwards.
    assert sandbox.exec("echo ok").stdout == "ok\n"


def test_timeout_kills_daemonised_grandchildren(sandbox):
    cmd = ("setsid sh -c 'echo $$ > /tmp/gc.pid; exec sleep 1000' </dev/null >/dev/null 2>&1 & "
           "while [ ! -s /tmp/gc.pid ]; do sleep 0.05; done; echo started; sleep 1000")
    r = sandbox.exec(cmd, timeout=1.5)
    assert r.timed_out
    pid = sandbox.files.read("/tmp/gc.pid").decode().strip()
    assert pid.isdigit()

    # The grandchild left the command's session and process group, yet it must be gone.
    # (Killed processes are reaped by the agent: allow it a moment.)
    def gone():
        r = sandbox.exec(f"if kill -0 {pid} 2>/dev/null || [ -e /proc/{pid} ]; then echo alive; "
                         f"else echo gone; fi")
        return r.stdout.strip() == "gone"
    wait_until(gone, timeout=5, interval=0.1, what=f"grandchild {pid} to disappear")
    ps = sandbox.exec("for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done").stdout.split()
    assert "sleep" not in ps


def test_zombies_are_reaped(sandbox):
    # An orphaned child becomes a child of PID 1 (tp-agent), which must reap it.
    sandbox.exec("sh -c 'sleep 0.2 &' ; true")
    def no_zombies():
        states = sandbox.exec("cat /proc/[0-9]*/stat 2>/dev/null | awk '{print $3}'").stdout.split()
        return "Z" not in states
    wait_until(no_zombies, timeout=10, interval=0.2, what="zombies to be reaped")
