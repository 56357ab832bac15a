"""Restart: after tidepoold is killed (-9) and started again on the same data directory, every
sandbox of the previous run ends in one of the two documented outcomes (src/node/sandbox_manager.h):

- adopted (live restore, a tier whose sandboxes outlive the daemon): it is still running, with
  its record (ttl, labels) unchanged, its files, and its background processes (output kept in
  files under the data dir), and it works like any other;
- or, when its tier cannot hand it over, stored stopped with end_reason daemon_restart (gone) or
  agent_lost (its agent did not answer), with nothing of it left on the host.

A daemon stopped with SIGTERM under --stop-sandboxes-on-exit (the test harness) stops them."""
import glob
import json
import os
import signal
import sqlite3
import subprocess
import uuid

import pytest

import tidepool
from pools_lib import call, freezer_state, ok, pool, sh
from tp_testlib import api_call, free_port, health_ok, leaks_of, processes_of, wait_until


def test_restart_adopts_or_cleans_up_previous_sandboxes(client, daemon):
    tag = uuid.uuid4().hex[:8]
    old = [client.create(ttl=600, labels={"restart": tag}) for _ in range(3)]
    for sb in old:
        sb.files.write("/work/x", b"x")
        assert sb.exec("echo before").stdout == "before\n"
    # A background process that spans the restart (it waits for a file written after it).
    procs = {sb.id: sb.exec("echo p1; while [ ! -e /work/go ]; do sleep 0.05; done; echo p2",
                            background=True) for sb in old}
    before = {sb.id: client.get(sb.id).info for sb in old}
    assert all(processes_of(sb.id) for sb in old)
    old_pid = daemon.pid

    daemon.restart(kill9=True)
    assert daemon.pid != old_pid

    infos = {sb.id: client.get(sb.id).info for sb in old}
    adopted = [sb for sb in old if infos[sb.id].state == "running"]
    # One tier, one policy: all or none of them come back.
    assert len(adopted) in (0, len(old)), infos
    for sb in old:
        info = infos[sb.id]
        if adopted:
            assert info.end_reason in (None, ""), info
            assert info.expires_at == before[sb.id].expires_at, (info, before[sb.id])
            assert info.labels == before[sb.id].labels
            assert sb.files.read("/work/x") == b"x"
            assert sb.exec("echo again").stdout == "again\n"
            sb.files.write("/work/go", b"")
            r = procs[sb.id].wait(timeout=60)
            assert (r.exit_code, r.stdout) == (0, "p1\np2\n"), r
            sb.kill()
        else:
            assert info.state == "stopped", info
            assert info.end_reason in ("daemon_restart", "agent_lost"), info
            with pytest.raises(tidepool.Conflict):
                sb.exec("true")
    # Nothing of the old sandboxes remains on the host.
    for sb in old:
        wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
                   what=f"{sb.id} to be cleaned up")
    assert [s.id for s in client.list(labels={"restart": tag})] == []
    # The restarted daemon serves new sandboxes.
    with client.create(ttl=600) as sb:
        assert sb.exec("echo after").stdout == "after\n"


def test_a_sandbox_that_died_while_the_daemon_was_down_is_lost_and_its_files_go(client, daemon):
    """A sandbox whose processes are killed while no daemon runs cannot be adopted: the
    restarted daemon records it agent_lost or daemon_restart and removes what it left,
    its background processes' output files under the data dir included."""
    sb = client.create(ttl=600)
    sb.exec("echo out; sleep 1000", background=True)
    proc_files = os.path.join(daemon.data_dir, "sandboxes", sb.id, "proc-*")
    assert glob.glob(proc_files)
    daemon.stop(signal.SIGKILL)
    for pid in processes_of(sb.id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # gone already, with its pid namespace's init
    wait_until(lambda: not processes_of(sb.id), timeout=15, interval=0.1,
               what=f"the processes of {sb.id} to be gone")
    daemon.start()
    info = client.get(sb.id).info
    assert info.state == "stopped" and info.end_reason in ("daemon_restart", "agent_lost"), info
    assert glob.glob(proc_files) == []
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
               what=f"{sb.id} to be cleaned up")


def test_delete_without_wait_answers_202_and_ends_like_any_delete_across_a_kill9(client, daemon):
    """DELETE ?wait=false is answered once the stop is stored (202, "stopping"); the
    teardown goes on, and a daemon killed meanwhile finishes it after its restart: the
    sandbox is never adopted back, whichever came first."""
    sbs = [client.create(ttl=600) for _ in range(3)]
    for sb in sbs:
        assert sb.exec("sleep 1000 &").exit_code == 0
    # A background process of the API: its output files under the data dir go with the stop.
    sbs[1].exec("echo out; sleep 1000", background=True)
    proc_files = lambda sb: glob.glob(os.path.join(daemon.data_dir, "sandboxes", sb.id, "proc-*"))
    assert proc_files(sbs[1])
    st, _, body = api_call(daemon, "DELETE", f"/v1/sandboxes/{sbs[0].id}?wait=maybe")
    assert st == 400 and b"wait" in body, body
    answers = [api_call(daemon, "DELETE", f"/v1/sandboxes/{sb.id}?wait=false") for sb in sbs]
    for st, _, body in answers:
        rec = json.loads(body)
        assert (st, rec["state"], rec["end_reason"]) == (202, "stopping", "deleted"), (st, rec)
    daemon.restart(kill9=True)
    for sb in sbs:
        info = wait_until(lambda: (i := client.get(sb.id).info).state == "stopped" and i, timeout=30,
                          what=f"{sb.id} to be stopped")
        assert info.end_reason == "deleted", info
        wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
                   what=f"{sb.id} to be cleaned up")
        assert not proc_files(sb)
    # An ended sandbox: its final record, 200, either way.
    st, _, body = api_call(daemon, "DELETE", f"/v1/sandboxes/{sbs[0].id}?wait=false")
    assert st == 200 and json.loads(body)["state"] == "stopped", body


def test_a_paused_sandbox_is_still_paused_after_a_kill9_restart(daemon):
    """The new daemon thaws a frozen sandbox to reach its agent, then freezes it again: a
    client's pause outlives the restart, and the first request after it resumes the
    sandbox as before."""
    sb = ok(daemon, "POST", "/v1/sandboxes", {"ttl_seconds": 600})
    sid = sb["id"]
    try:
        assert sh(daemon, sid, "echo kept > /tmp/file")[0] == 0
        assert ok(daemon, "POST", f"/v1/sandboxes/{sid}/pause")["state"] == "paused"
        assert freezer_state(sid) in ("FROZEN", "1")

        daemon.restart(kill9=True)

        assert ok(daemon, "GET", f"/v1/sandboxes/{sid}")["state"] == "paused"
        assert freezer_state(sid) in ("FROZEN", "1")
        assert sh(daemon, sid, "cat /tmp/file")[:2] == (0, "kept\n")
        assert ok(daemon, "GET", f"/v1/sandboxes/{sid}")["state"] == "running"
        assert freezer_state(sid) in ("THAWED", "0")
    finally:
        call(daemon, "DELETE", f"/v1/sandboxes/{sid}")
    wait_until(lambda: not leaks_of(sid, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
               what=f"{sid} to be cleaned up")


def test_graceful_restart(client, daemon):
    sb = client.create(ttl=600)
    daemon.restart(kill9=False)
    try:
        assert client.get(sb.id).state in ("stopped", "lost")
    except tidepool.NotFound:
        pass  # a graceful stop may forget what it destroyed
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
               what=f"{sb.id} to be cleaned up")


def test_a_warm_pools_sandboxes_are_adopted_back_into_it(daemon):
    """Pooled sandboxes (made by a template's pool, not handed out) outlive the daemon like
    any other: after kill -9 and a start, the pool holds the same ones, nothing of them is
    removed as a leftover, and no record says "running" for a sandbox that is gone."""
    def pooled_live():
        db = sqlite3.connect(f"file:{os.path.join(daemon.data_dir, 'state.db')}?mode=ro", uri=True)
        try:
            return {r[0] for r in db.execute(
                "SELECT id FROM sandboxes WHERE pooled = 1 AND ended_at_ms = 0 AND template = ?", (name,))}
        finally:
            db.close()

    name = "it-" + uuid.uuid4().hex[:8]
    ok(daemon, "POST", "/v1/templates", {"name": name, "memory_mb": 64, "pool_min": 2, "pool_max": 2})
    try:
        wait_until(lambda: pool(daemon, name)["ready"] == 2, 60, what="pool filled")
        before = pooled_live()
        assert len(before) == 2 and all(processes_of(i) for i in before), before

        daemon.restart(kill9=True)

        assert pool(daemon, name)["ready"] == 2
        assert pooled_live() == before  # the same ones: none stopped, none made again
        assert all(processes_of(i) for i in before)
        st, headers, sb = call(daemon, "POST", "/v1/sandboxes", {"template": name})
        assert st == 201 and headers.get("tidepool-from-pool") == "true", sb
        assert sb["id"] in before
        r = ok(daemon, "POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": ["echo", "adopted"]})
        assert r["exit_code"] == 0
        ok(daemon, "DELETE", f"/v1/sandboxes/{sb['id']}")
    finally:
        call(daemon, "DELETE", f"/v1/templates/{name}")
    wait_until(lambda: pool(daemon, name) is None, 30, what="pool gone")
    for i in before:
        wait_until(lambda: not leaks_of(i, daemon.pid, daemon.data_dir), timeout=15, interval=0.2,
                   what=f"{i} to be cleaned up")


def test_a_second_daemon_on_the_same_data_dir_refuses_to_start_and_leaves_the_first_alone(
        client, daemon):
    """Two daemons on one data dir (`make run` beside a systemd unit): the second stops
    before it opens anything there, with one line naming the first, instead of adopting
    the first one's sandboxes and killing what it takes for leftovers."""
    sb = client.create(ttl=600)
    assert sb.exec("echo x > /tmp/mark; echo ok").stdout == "ok\n"
    before = sorted(processes_of(sb.id))
    port = free_port()
    sock = os.path.join(daemon.tmp, "second.sock")
    second = subprocess.run(
        [str(daemon.binary), "--listen", f"127.0.0.1:{port}", "--data-dir", daemon.data_dir,
         "--socket", sock, "--insecure-tcp", "--stop-sandboxes-on-exit"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert second.returncode != 0, second
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert "is in use" in lines[0] and f"(pid {daemon.pid})" in lines[0], lines[0]
    assert not health_ok(f"http://127.0.0.1:{port}")
    assert not os.path.exists(sock)
    # The first daemon and its sandbox go on as before.
    assert daemon.alive()
    assert sorted(processes_of(sb.id)) == before
    assert sb.exec("cat /tmp/mark").stdout == "x\n"
    assert client.get(sb.id).info.state == "running"
    sb.kill()
