"""An exec that removes its sandbox when the command ends ("remove": true, what
`tidepool run` sends): the stop is stored before the exit is answered, a "removed"
event ends the stream, and whatever ends the command (its end, its timeout, a client
that went away) the sandbox ends and leaves nothing on the host."""
import base64
import contextlib
import glob
import json
import socket
import threading
import time

import tidepool
from tp_testlib import BUILD, Daemon, api_call as call, leaks_of, wait_until


def stream_lines(daemon, sid, body):
    s, h, b = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", body)
    assert s == 200 and h["content-type"].startswith("application/x-ndjson"), (s, b)
    return [json.loads(line) for line in b.decode().splitlines()]


def state_of(daemon, sid):
    s, _, b = call(daemon, "GET", f"/v1/sandboxes/{sid}")
    assert s == 200, b
    return json.loads(b)


def test_the_exit_is_followed_by_removed_and_the_sandbox_ends(daemon, client):
    sb = client.create(ttl=600)
    events = stream_lines(daemon, sb.id, {"cmd": "echo hi; exit 3", "stream": True, "remove": True})
    assert [e["type"] for e in events] == ["started", "stdout", "exit", "removed"], events
    assert base64.b64decode(events[1]["data"]) == b"hi\n" and events[2]["exit_code"] == 3
    rec = events[3]["sandbox"]
    assert rec["id"] == sb.id and rec["end_reason"] == "deleted"
    # Its stop was stored before that answer: no exec gets in after it.
    s, _, b = call(daemon, "POST", f"/v1/sandboxes/{sb.id}/exec", {"cmd": "true"})
    assert s in (404, 409), (s, b)
    wait_until(lambda: state_of(daemon, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")
    assert state_of(daemon, sb.id)["end_reason"] == "deleted"
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), 30, what="nothing left of it")
    # The trajectory log has the exec (its answer with the exit) and the sandbox's end.
    s, _, b = call(daemon, "GET", f"/v1/sandboxes/{sb.id}/log")
    assert s == 200
    entries = json.loads(b)["entries"]
    execs = [e for e in entries if e["kind"] == "call" and e["target"].endswith("/exec")]
    assert execs[0]["status"] == 200 and execs[0]["result"]["exit_code"] == 3, entries
    assert execs[0]["request"]["body"]["remove"] is True
    assert entries[-1]["event"] == "ended" and entries[-1]["seq"] > execs[0]["seq"], entries


def test_a_timeout_and_a_client_that_went_away_remove_it_too(daemon, client):
    sb = client.create(ttl=600)
    events = stream_lines(daemon, sb.id, {"cmd": "sleep 30", "stream": True, "remove": True, "timeout": 0.5})
    assert events[-2]["type"] == "exit" and events[-2]["timed_out"] and events[-1]["type"] == "removed"
    wait_until(lambda: state_of(daemon, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")

    sb = client.create(ttl=600)
    body = json.dumps({"cmd": "echo up; sleep 60", "stream": True, "remove": True}).encode()
    s = socket.create_connection(("127.0.0.1", daemon.port))
    s.sendall(f"POST /v1/sandboxes/{sb.id}/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while b"started" not in got:
        got += s.recv(4096)
    s.close()  # a client killed mid-command: the command is killed and the sandbox removed
    wait_until(lambda: state_of(daemon, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")
    assert state_of(daemon, sb.id)["end_reason"] == "deleted"
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), 30, what="nothing left of it")


def test_remove_needs_a_stream_and_a_live_sandbox(daemon, client):
    sb = client.create(ttl=600)
    for body in ({"cmd": "true", "remove": True}, {"cmd": "true", "stream": True, "remove": "yes"}):
        s, _, b = call(daemon, "POST", f"/v1/sandboxes/{sb.id}/exec", body)
        assert s == 400 and json.loads(b)["code"] == "invalid_argument", (body, b)
    s, _, b = call(daemon, "POST", f"/v1/sandboxes/{sb.id}/processes", {"cmd": "true", "remove": True})
    assert s == 400 and "remove" in json.loads(b)["message"], b
    # Refused requests changed nothing: the sandbox still runs commands.
    assert sb.exec("echo ok").stdout == "ok\n"
    s, _, b = call(daemon, "POST", "/v1/sandboxes/n0-000000000000/exec",
                   {"cmd": "true", "stream": True, "remove": True})
    assert s == 404, b


def test_a_replay_of_a_step_that_removed_its_sandbox_keeps_the_replay_running(daemon, client):
    sb = client.create(ttl=600)
    assert sb.exec("echo one > /tmp/a").exit_code == 0
    events = stream_lines(daemon, sb.id, {"cmd": "cat /tmp/a", "stream": True, "remove": True})
    assert events[-1]["type"] == "removed"
    wait_until(lambda: state_of(daemon, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")
    s, _, b = call(daemon, "POST", f"/v1/sandboxes/{sb.id}/replay", {"branch": True})
    assert s == 200, b
    rep = json.loads(b)
    assert rep["replayed"] == 2 and rep["divergences"] == 0, rep
    branch = rep["sandbox"]["id"]
    try:
        # The branch goes on live: the replayed step did not remove it.
        assert state_of(daemon, branch)["state"] == "running"
        time.sleep(0.2)
        assert state_of(daemon, branch)["state"] == "running"
        events = stream_lines(daemon, branch, {"cmd": "cat /tmp/a", "stream": True})
        assert base64.b64decode(events[1]["data"]) == b"one\n"
    finally:
        call(daemon, "DELETE", f"/v1/sandboxes/{branch}")


def _deferred(daemon) -> int:
    s, _, b = call(daemon, "GET", "/metrics")
    assert s == 200
    line = next(l for l in b.decode().splitlines() if l.startswith("tidepool_sandbox_teardowns_deferred_total "))
    return int(float(line.split()[1]))


@contextlib.contextmanager
def _busy_client(daemon, sandbox_id):
    """Another client's requests, a few milliseconds apart, for as long as the block runs."""
    busy = threading.Event()
    busy.set()

    def poll():
        while busy.is_set():
            call(daemon, "GET", f"/v1/sandboxes/{sandbox_id}")
            time.sleep(0.002)

    t = threading.Thread(target=poll)
    t.start()
    try:
        yield
    finally:
        busy.clear()
        t.join()


def _run_removing(daemon, sid):
    events = stream_lines(daemon, sid, {"cmd": "true", "stream": True, "remove": True})
    assert events[-1]["type"] == "removed" and events[-1]["sandbox"]["end_reason"] == "deleted"
    s, _, b = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "true"})
    assert s in (404, 409), (s, b)


@contextlib.contextmanager
def _own_daemon(*args):
    # A quiet window of a second (--pool-quiet-ms): a stall of the busy client on a
    # loaded CI machine never makes the node look quiet.
    d = Daemon(BUILD, extra_args=["--pool-quiet-ms", "1000", *args])
    d.start()
    try:
        yield d, tidepool.Client(d.url)
    finally:
        d.stop()
        d.cleanup()


def test_while_other_clients_are_busy_the_teardown_waits_frozen_and_still_leaves_nothing():
    """Teardown pacing: the stop is stored and answered as before; the teardown (frozen
    meanwhile) waits until clients are quiet, at most a second, and then nothing is left."""
    with _own_daemon() as (d, c):
        other = c.create(ttl=600)
        sb = c.create(ttl=600)
        with _busy_client(d, other.id):
            _run_removing(d, sb.id)
            wait_until(lambda: _deferred(d) == 1, 10, what="the teardown deferred")
            # Meanwhile it is shown stopping, never running (it may have stopped already),
            # and a follower of its log waits for its ended event.
            followed = []
            follower = threading.Thread(target=lambda: followed.extend(sb.follow_log()))
            follower.start()
            assert state_of(d, sb.id)["state"] in ("stopping", "stopped")
            # Frozen while it waits: its freezer cgroup (v1 freezer.state, v2 cgroup.freeze).
            checked = 0
            for path in (glob.glob(f"/sys/fs/cgroup/freezer/tidepool-*/{sb.id}/freezer.state")
                         + glob.glob(f"/sys/fs/cgroup/tidepool-*/{sb.id}/cgroup.freeze")):
                try:
                    assert open(path).read().strip() in ("FROZEN", "FREEZING", "1"), path
                    checked += 1
                except FileNotFoundError:
                    pass  # torn down meanwhile
            # None seen: only because it was torn down meanwhile.
            assert checked or state_of(d, sb.id)["state"] == "stopped"
            st, _, body = call(d, "GET", "/v1/sandboxes?state=running")
            assert st == 200 and sb.id not in body.decode(), body
            st, _, body = call(d, "GET", "/v1/sandboxes?state=stopping")
            assert st == 200, body
            assert sb.id in body.decode() or state_of(d, sb.id)["state"] == "stopped", body
            # Clients still busy: the delay bound ends the wait.
            wait_until(lambda: state_of(d, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")
            follower.join(30)
            assert not follower.is_alive()
            assert followed and followed[-1].event == "ended", [e.event or e.kind for e in followed]
        assert state_of(d, sb.id)["end_reason"] == "deleted"
        wait_until(lambda: not leaks_of(sb.id, d.pid, d.data_dir), 30, what="nothing left of it")
        assert other.exec("echo ok").stdout == "ok\n"


def test_deferred_teardowns_0_tears_down_at_once():
    """--deferred-teardowns 0: busy clients or not, every teardown runs at once."""
    with _own_daemon("--deferred-teardowns", "0") as (d, c):
        other = c.create(ttl=600)
        sb = c.create(ttl=600)
        with _busy_client(d, other.id):
            _run_removing(d, sb.id)
            wait_until(lambda: state_of(d, sb.id)["state"] == "stopped", 30, what="the sandbox to stop")
        assert _deferred(d) == 0
        wait_until(lambda: not leaks_of(sb.id, d.pid, d.data_dir), 30, what="nothing left of it")
