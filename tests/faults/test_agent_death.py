"""A sandbox whose tp-agent dies (SIGKILL of its host pid, as an OOM kill or a crash
would) is reported as ended promptly, and calls in flight fail quickly instead of
hanging; nothing of it is left on the host.

The same while tidepoold is down (live restore, src/node/sandbox_manager.h): the
restarted daemon records a sandbox whose agent died as stopped with end_reason
daemon_restart (found gone), one whose agent is alive but never answers as agent_lost,
cleans both up, and adopts the other sandboxes with their records unchanged."""
import os
import random
import signal
import threading
import time
import uuid

import pytest

import tidepool
from faultlib import netns_holders, netns_of, no_retry_client, store_rows, wait_no_host_leaks
from tp_testlib import BUILD, Daemon, leaks_of, processes_of, wait_until


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


# -- an agent that dies (or hangs) while the daemon is down --------------------------


def _gone(pid):
    """True once `pid` is no more, zombie included (reaped by its parent)."""
    return not os.path.exists(f"/proc/{pid}")


def _ended_with(daemon, client, sb, reason):
    """Asserts that `sb` is reported stopped with end_reason `reason`, by the API and in the
    store alike, that it refuses work, and that nothing of it is left on the host."""
    info = client.get(sb.id).info
    assert info.state == "stopped", info
    assert info.end_reason == reason, info
    assert info.ended_at is not None and info.ended_at >= info.created_at, info
    row = store_rows(daemon.data_dir)[sb.id]
    assert (row["state"], row["end_reason"]) == ("stopped", reason), row
    with pytest.raises(tidepool.Conflict):
        client.get(sb.id).exec("true")
    with pytest.raises(tidepool.TidepoolError):
        client.get(sb.id).files.read("/etc/hostname")
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=30, interval=0.2,
               what=f"{sb.id} to be cleaned up")


def _restart_with(daemon, client, tamper):
    """kill -9 of tidepoold; `tamper(victim)` while it is down; start it again. Returns
    (victim, the other sandboxes, their infos before, their background processes, the
    network namespaces of all)."""
    tag = uuid.uuid4().hex[:8]
    victim = client.create(ttl=600, labels={"agent-death": tag, "role": "victim"})
    others = [client.create(ttl=600 + 60 * i, labels={"agent-death": tag, "role": f"other{i}"}, memory_mb=256 + 64 * i)
              for i in range(2)]
    for sb in [victim] + others:
        sb.files.write("/root/kept.txt", sb.id.encode())
    procs = {sb.id: sb.start("echo p1; while [ ! -e /root/go ]; do sleep 0.05; done; echo p2") for sb in others}
    before = {sb.id: client.get(sb.id).info for sb in others}
    netns = netns_of(p for sb in [victim] + others for p in processes_of(sb.id))
    daemon.stop(signal.SIGKILL)
    try:
        tamper(victim)
    finally:
        daemon.start()
    return victim, others, before, procs, netns


def _check_bystanders_adopted(client, others, before, procs):
    for sb in others:
        got = client.get(sb.id)
        assert got.state == "running", got.info
        assert got.info.end_reason is None, got.info
        assert got.info.raw == before[sb.id].raw, (got.info.raw, before[sb.id].raw)
        assert got.files.read("/root/kept.txt") == sb.id.encode()
        assert got.exec("echo adopted").stdout == "adopted\n"
        got.files.write("/root/go", b"")
        r = got.process(procs[sb.id].pid).wait(timeout=60)
        assert (r.exit_code, r.stdout) == (0, "p1\np2\n"), r


def test_agent_killed_while_the_daemon_is_down(client, daemon):
    """The agent (the sandbox's PID 1) is SIGKILLed while tidepoold is down: the restarted
    daemon finds the sandbox gone, records it stopped with end_reason daemon_restart,
    removes what is left of it, and adopts the others as they were."""
    def kill_agent(victim):
        pid = _agent_pid(victim)
        os.kill(pid, signal.SIGKILL)
        # Dead and reaped (its pid namespace and cgroup emptied with it).
        wait_until(lambda: _gone(pid) and not processes_of(victim.id), timeout=30, interval=0.05,
                   what="the killed agent to be gone")

    victim, others, before, procs, netns = _restart_with(daemon, client, kill_agent)
    _ended_with(daemon, client, victim, "daemon_restart")
    _check_bystanders_adopted(client, others, before, procs)
    for sb in others:
        sb.kill()
    wait_until(lambda: not netns_holders(netns), timeout=30, interval=0.2, what="the network namespaces to go")


def test_agent_hung_while_the_daemon_is_down(client, daemon):
    """The agent is stopped (SIGSTOP: alive, never answering) while tidepoold is down: the
    restarted daemon gives up on it after its agent timeout, records it stopped with
    end_reason agent_lost, destroys it (the stopped process included), and adopts the
    others."""
    stopped = {}

    def stop_agent(victim):
        stopped["pid"] = _agent_pid(victim)
        os.kill(stopped["pid"], signal.SIGSTOP)
        wait_until(lambda: _proc_state(stopped["pid"]) == "T", timeout=30, what="the agent to be stopped")

    try:
        victim, others, before, procs, netns = _restart_with(daemon, client, stop_agent)
        _ended_with(daemon, client, victim, "agent_lost")
        wait_until(lambda: _gone(stopped["pid"]), timeout=30, interval=0.05, what="the hung agent to be killed")
        _check_bystanders_adopted(client, others, before, procs)
        for sb in others:
            sb.kill()
        wait_until(lambda: not netns_holders(netns), timeout=30, interval=0.2, what="the network namespaces to go")
    finally:
        if "pid" in stopped and not _gone(stopped["pid"]):
            os.kill(stopped["pid"], signal.SIGCONT)


def _proc_state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_uid_range_of_a_hung_agent_serves_again_after_the_restart():
    """The sandbox given up as agent_lost is cleaned up entirely, its uid range included:
    with two ranges, one adopted sandbox and the lost one's range freed, a new sandbox
    can be created. (The killed init is reaped by host PID 1, not by the daemon: its range
    is held 'in use on the host' until a later scan finds no process with its ids.) Its
    own daemon (uid ranges of its own, far from other daemons')."""
    # Above the default ranges (1048576 + 16384 * 65536), below 2^31.
    base = 1_200_000_000 + random.randrange(4096) * 2 * 65536
    d = Daemon(BUILD, extra_args=["--uid-base", str(base), "--uid-ranges", "2"])
    d.start()
    ids = []
    try:
        with no_retry_client(d.url) as c:
            kept, lost = c.create(ttl=600), c.create(ttl=600)
            ids += [kept.id, lost.id]
            with pytest.raises(tidepool.Unavailable):  # both ranges are taken
                ids.append(c.create(ttl=60).id)
            pid = _agent_pid(lost)
            d.stop(signal.SIGKILL)
            os.kill(pid, signal.SIGSTOP)
            d.start()
            assert c.get(lost.id).info.end_reason == "agent_lost", c.get(lost.id).info
            assert c.get(kept.id).state == "running"
            wait_until(lambda: _gone(pid), timeout=30, interval=0.05, what="the hung agent to be killed and reaped")
            fresh = c.create(ttl=60)
            ids.append(fresh.id)
            assert fresh.exec("echo fresh").stdout == "fresh\n"
    finally:
        if d.alive():
            with no_retry_client(d.url) as c:
                for sid in ids:
                    try:
                        c.kill(sid)
                    except tidepool.TidepoolError:
                        pass
        d.stop()
        try:
            wait_no_host_leaks(d.data_dir)
        finally:
            d.cleanup()
