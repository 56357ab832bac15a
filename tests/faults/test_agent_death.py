"""A sandbox whose tp-agent dies (SIGKILL of its host pid, as an OOM kill or a crash
would) is reported as ended promptly, and calls in flight fail quickly instead of
hanging; nothing of it is left on the host."""
import os
import signal
import threading
import time

import pytest

import tidepool
from faultlib import netns_holders, netns_of
from tp_testlib import leaks_of, processes_of, wait_until


def _agent_pid(sb):
    """Host pid of the sandbox's init (tp-agent)."""
    for p in processes_of(sb.id):
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() == "tp-agent":
                    with open(f"/proc/{p}/status") as s:
                        nspid = [l for l in s if l.startswith("NSpid:")][0].split()
                    if nspid[-1] == "1":  # PID 1 of the sandbox, not a command's init
                        return p
        except (OSError, IndexError):
            pass
    raise AssertionError(f"no tp-agent PID 1 found for {sb.id}")


def test_agent_killed_during_exec(client, daemon):
    sb = client.create(ttl=600)
    other = client.create(ttl=600)
    netns = netns_of(processes_of(sb.id))
    outcome = {}

    streamed = {"chunks": 0}

    def run():
        try:
            outcome["result"] = sb.exec("sleep 120")
        except Exception as e:  # noqa: BLE001
            outcome["error"] = e

    def run_stream():
        try:
            for item in sb.exec_stream("while :; do echo tick; sleep 0.1; done"):
                if isinstance(item, tidepool.ExecResult):
                    streamed["result"] = item
                else:
                    streamed["chunks"] += 1
        except Exception as e:  # noqa: BLE001
            streamed["error"] = e

    threads = [threading.Thread(target=run), threading.Thread(target=run_stream)]
    for t in threads:
        t.start()
    wait_until(lambda: streamed["chunks"] >= 2 and len(processes_of(sb.id)) >= 5, timeout=30,
               what="both commands to run")
    os.kill(_agent_pid(sb), signal.SIGKILL)
    t0 = time.monotonic()
    for t in threads:
        t.join(max(0.1, t0 + 15 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a command in flight hung after the agent died"
    for what, out in (("exec", outcome), ("exec_stream", streamed)):
        assert "error" in out, f"{what} returned {out.get('result')} after its agent was killed"
        assert isinstance(out["error"], tidepool.TidepoolError), repr(out["error"])
    # Reported ended promptly, with a reason.
    info = wait_until(lambda: (i := client.get(sb.id).info).state in ("stopped", "lost") and i,
                      timeout=10, what="the sandbox to be reported ended")
    assert info.end_reason == "failed", info
    assert time.monotonic() - t0 < 15
    with pytest.raises(tidepool.Conflict):
        sb.exec("true")
    with pytest.raises(tidepool.TidepoolError):
        sb.files.read("/etc/hostname")
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
               what="the sandbox to be cleaned up")
    assert not netns_holders(netns)
    # The daemon and the other sandbox are unaffected.
    assert other.exec("echo ok").stdout == "ok\n"


def test_agent_killed_while_idle(client, daemon):
    sb = client.create(ttl=600)
    os.kill(_agent_pid(sb), signal.SIGKILL)
    info = wait_until(lambda: (i := client.get(sb.id).info).state in ("stopped", "lost") and i,
                      timeout=10, what="the sandbox to be reported ended")
    assert info.end_reason == "failed", info
    with pytest.raises(tidepool.Conflict):
        sb.exec("true")
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
               what="the sandbox to be cleaned up")
