"""The trajectory log (docs/trajectory-log.md) through a real daemon and the SDK: every
state-changing call in order with its key, caller and result; exactly-once by key; the
result channel (by key, and a follower from a cursor); provenance through the CLI;
replay and branch; the SDK's Trajectory, sync and asyncio."""
import asyncio
import base64
import hashlib
import http.client
import io
import json
import os
import socket
import subprocess
import tarfile
import threading
import time
import uuid

import pytest

import tidepool
from tp_testlib import Daemon, api_call as call, wait_until


def send_and_leave(daemon, path, body, key, finish=False):
    """Sends a request and closes the connection before any answer."""
    s = socket.create_connection(("127.0.0.1", daemon.port))
    data = json.dumps(body).encode()
    key_header = f"Idempotency-Key: {key}\r\n" if key else ""
    if finish:
        key_header += "Tidepool-On-Disconnect: finish\r\n"
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"{key_header}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    time.sleep(0.3)
    s.close()


def test_every_state_changing_call_is_logged_in_order(daemon, client):
    sb = client.create(ttl=600, labels={"t": "log"})
    sid = sb.id
    sb.exec("echo one")                                        # keyed (the SDK's own key)
    s, _, _ = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "echo two; exit 3"})
    assert s == 200                                            # no key: logged all the same
    sb.files.write("/tmp/f", "data")
    sb.files.remove("/tmp/f")
    p = sb.start("sleep 0.2; exit 4")
    assert p.wait().exit_code == 4
    s, _, _ = call(daemon, "GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname")
    assert s == 200                                            # reads are not logged
    sb.kill()
    entries = wait_until(lambda: (e := sb.log()) and e[-1].event == "ended" and e,
                         timeout=15, what="the ended event")
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    kinds = [(e.kind, e.event or f"{e.method} {e.target.split(sid, 1)[1]}") for e in entries]
    assert kinds[0] == ("event", "created")
    assert kinds[-1] == ("event", "ended")
    calls = [k for t, k in kinds if t == "call"]
    assert calls == ["POST /exec", "POST /exec", "PUT /files?path=/tmp/f", "DELETE /files?path=/tmp/f",
                     "POST /processes", "POST /processes/1/wait", "DELETE "], calls
    assert ("event", "process_exit") in kinds
    created = entries[0].detail
    assert created["image"] == "host" and created["labels"] == {"t": "log"} and created["ttl_seconds"] == 600
    by = [e for e in entries if e.kind == "call"]
    assert by[0].key and by[1].key is None                     # keyed by the SDK / not keyed
    assert by[0].result["exit_code"] == 0 and by[0].result["stdout_bytes"] == 4
    assert by[1].result["exit_code"] == 3
    assert by[1].request["body"] == {"cmd": "echo two; exit 3"}
    assert by[0].caller["transport"] == "tcp"
    assert all(e.status and e.time and e.duration_ms >= 0 for e in by)
    assert entries[-1].detail["end_reason"] == "deleted"
    # The full answers on request.
    full = sb.log(output=True)
    assert full[1].exec_result().stdout == "one\n"
    # Paged from a cursor.
    assert [e.seq for e in sb.log(after=2, limit=2)] == [3, 4]


def test_tidepool_log_prints_the_history(daemon, client, build_dir):
    sb = client.create(ttl=600)
    sb.exec(["sh", "-c", "echo hi"], idempotency_key="prov/1")
    sb.files.write("/tmp/x", b"12345", idempotency_key="prov/2")
    cli = [str(build_dir / "bin" / "tidepool"), "--url", daemon.url]
    out = subprocess.run(cli + ["log", sb.id], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["SEQ", "TIME", "(UTC)"]
    assert "created (image host)" in lines[1]
    assert "prov/1" in lines[2] and "exec sh -c 'echo hi'" in lines[2] and "exit 0 (3 B out, 0 B err)" in lines[2]
    assert "prov/2" in lines[3] and "write /tmp/x (5 B)" in lines[3]
    js = subprocess.run(cli + ["log", sb.id, "--json"], capture_output=True, text=True, timeout=60)
    assert js.returncode == 0
    doc = json.loads(js.stdout)
    assert [e["seq"] for e in doc["entries"]] == [1, 2, 3] and doc["bytes"] > 0
    ans = subprocess.run(cli + ["log", sb.id, "--key", "prov/1"], capture_output=True, text=True, timeout=60)
    assert ans.returncode == 0 and base64.b64decode(json.loads(ans.stdout)["stdout"]) == b"hi\n"
    # Bad input: a clear one-line error and a non-zero exit.
    bad = subprocess.run(cli + ["log", "n0-000000000000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stderr.startswith("tidepool: ") and "not found" in bad.stderr
    bad = subprocess.run(cli + ["log", sb.id, "--key", "prov/9"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "prov/9" in bad.stderr
    bad = subprocess.run(cli + ["log", sb.id, "--limit", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    # tidepool replay: exit 0 when every step matched, 3 with the first divergence.
    rp = subprocess.run(cli + ["replay", sb.id], capture_output=True, text=True, timeout=120)
    assert rp.returncode == 0 and "every step matched" in rp.stdout and "(removed)" in rp.stdout, rp
    sb.exec("cat /proc/sys/kernel/random/uuid", idempotency_key="prov/3")
    rp = subprocess.run(cli + ["replay", sb.id], capture_output=True, text=True, timeout=120)
    assert rp.returncode == 3 and "key prov/3" in rp.stdout and ": stdout" in rp.stdout, rp
    bad = subprocess.run(cli + ["replay", sb.id, "--to", "1", "--to-key", "x"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2


def test_a_step_sent_twice_runs_once_sequentially_and_concurrently(daemon, sandbox):
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    step = {"cmd": "echo step >> /tmp/steps; wc -l < /tmp/steps"}
    a = call(daemon, "POST", path, step, "once/1")
    b = call(daemon, "POST", path, step, "once/1")
    assert a[0] == b[0] == 200 and a[2] == b[2]
    assert b[1].get("idempotent-replayed") == "true"
    assert b[1].get("server-timing", "").startswith("replay;dur=")
    # Eight at once, the step slow enough that they overlap.
    slow = {"cmd": "sleep 0.5; echo slow >> /tmp/steps; wc -l < /tmp/steps"}
    answers = [None] * 8

    def go(i):
        answers[i] = call(daemon, "POST", path, slow, "once/2")

    ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(x[0] == 200 and x[2] == answers[0][2] for x in answers)
    assert sandbox.files.read("/tmp/steps") == b"step\nslow\n"  # each ran once
    keyed = [e.key for e in sandbox.log() if e.kind == "call" and e.key and e.key.startswith("once/")]
    assert keyed == ["once/1", "once/2"]                        # one record each
    # The same key with another command is refused, naming both requests.
    s, _, body = call(daemon, "POST", path, {"cmd": "echo other >> /tmp/steps"}, "once/1")
    assert s == 409
    msg = json.loads(body)["message"]
    assert msg.count(f"POST {path}") == 2 and msg.count("sha256:") == 2, msg
    assert sandbox.files.read("/tmp/steps") == b"step\nslow\n"


def test_a_client_that_lost_its_connection_gets_the_whole_result_by_key(daemon, sandbox):
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    big = 300_000  # above the inline limit: the answer is in a side file
    step = {"cmd": f"sleep 1; head -c {big} /dev/zero | tr '\\0' a; echo ran >> /tmp/ran"}
    # A step (Tidepool-On-Disconnect: finish) runs to its end however late its client comes
    # back; a keyed call without it is killed once the retry grace (5 s) passed unanswered.
    send_and_leave(daemon, path, step, "lost/1", finish=True)
    send_and_leave(daemon, path, {"cmd": "sleep 8; echo late >> /tmp/late"}, "lost/0")
    time.sleep(6.5)
    r = sandbox.step_result("lost/1")
    assert r.exit_code == 0 and r.stdout_bytes == b"a" * big
    assert sandbox.files.read("/tmp/ran") == b"ran\n"
    killed = sandbox.step_result("lost/0")
    assert killed.signal == 9 and not sandbox.files.exists("/tmp/late")
    # A streamed step whose client left after its first event: the same.
    stream = dict(step, stream=True, cmd="sleep 1; seq 1 50000; echo ran >> /tmp/ran")
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    conn.request("POST", path, body=json.dumps(stream).encode(),
                 headers={"Content-Type": "application/json", "Idempotency-Key": "lost/2"})
    resp = conn.getresponse()
    assert json.loads(resp.readline())["type"] == "started"
    conn.close()
    r = sandbox.step_result("lost/2")
    assert r.stdout == "".join(f"{i}\n" for i in range(1, 50001))
    assert sandbox.files.read("/tmp/ran") == b"ran\nran\n"
    with pytest.raises(tidepool.NotFound):
        sandbox.step_result("lost/3")
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    conn.request("POST", path, body=b'{"cmd":"true"}',
                 headers={"Content-Type": "application/json", "Tidepool-On-Disconnect": "maybe"})
    bad = conn.getresponse()
    assert bad.status == 400 and b"Tidepool-On-Disconnect" in bad.read()
    conn.close()
    # Without a key a command dies with its connection (nobody could get its result).
    send_and_leave(daemon, path, {"cmd": "sleep 2; echo late >> /tmp/ran"}, None)
    time.sleep(2.5)
    assert sandbox.files.read("/tmp/ran") == b"ran\nran\n"


def test_a_follower_resumes_from_its_cursor_without_gaps_or_duplicates(daemon, client):
    sb = client.create(ttl=600)
    n = 40
    seen = []
    done = threading.Event()

    def follow():
        after = 0
        while True:
            got = 0
            for e in sb.follow_log(after=after):
                seen.append(e.seq)
                after = e.seq
                got += 1
                if e.event == "ended":
                    done.set()
                    return
                if got == 7:
                    break  # the connection goes; resume from the cursor
            time.sleep(0.05)

    t = threading.Thread(target=follow)
    t.start()
    for i in range(n):
        sb.exec(f"echo {i}")
    sb.kill()
    assert done.wait(60), seen
    t.join(10)
    last = sb.log()[-1].seq
    assert seen == list(range(1, last + 1))                     # every seq once, in order
    assert last >= n + 2                                        # created, n execs, delete, ended


def test_a_follow_of_an_ended_sandbox_ends(daemon, client):
    sb = client.create(ttl=600)
    sb.exec("true")
    sb.kill()
    wait_until(lambda: sb.log()[-1].event == "ended", timeout=15, what="the ended event")
    got = list(sb.follow_log())
    assert got[-1].event == "ended" and [e.seq for e in got] == list(range(1, len(got) + 1))
    assert list(sb.follow_log(after=got[-1].seq)) == []


def test_bad_log_requests(daemon, sandbox):
    base = f"/v1/sandboxes/{sandbox.id}"
    for q in ("?after=-1", "?after=x", "?limit=0", "?limit=10001", "?follow=maybe"):
        s, _, b = call(daemon, "GET", base + "/log" + q)
        assert s == 400 and json.loads(b)["code"] == "invalid_argument", (q, b)
    s, _, b = call(daemon, "GET", "/v1/sandboxes/n0-000000000000/log")
    assert s == 404
    # A keyed call on a sandbox that never was makes no log for it (its answer is kept
    # node-wide: a repeat still gets it).
    ghost = "n0-111111111111"
    for _ in range(2):
        s, h, _ = call(daemon, "POST", f"/v1/sandboxes/{ghost}/exec", {"cmd": "true"}, "ghost/1")
        assert s == 404
    assert h.get("idempotent-replayed") == "true"
    assert call(daemon, "GET", f"/v1/sandboxes/{ghost}/log")[0] == 404
    assert not os.path.exists(os.path.join(daemon.data_dir, "sandboxes", ghost))
    s, _, b = call(daemon, "GET", base + "/log/result")
    assert s == 400 and "key" in json.loads(b)["message"]
    for body in ({"to_step": 0}, {"to_step": "x"}, {"nope": 1}, {"to_step": 1, "to_key": "a"},
                 {"rekey": {"from": ""}}, {"rekey": "x"}):
        s, _, b = call(daemon, "POST", base + "/replay", body)
        assert s == 400, (body, b)
    s, _, b = call(daemon, "POST", base + "/replay", {"to_step": 9999})
    assert s == 400 and "past the end" in json.loads(b)["message"]
    s, _, b = call(daemon, "POST", base + "/replay", {"to_key": "no/such"})
    assert s == 404
    s, _, b = call(daemon, "POST", "/v1/sandboxes/n0-000000000000/replay", {})
    assert s == 404


def test_replay_matches_reports_the_first_divergence_and_branches_continue_live(daemon, client, track):
    traj = tidepool.Trajectory.create(client, f"rp-{uuid.uuid4().hex[:6]}", ttl=600)
    traj.mkdir("/w", parents=True)                              # step 1
    traj.write("/w/a", "one\n")                                 # step 2
    traj.exec("cat /w/a >> /w/log; hostname")                  # step 3 (the hostname is the id)
    traj.exec("echo two > /w/b")                                # step 4
    traj.exec("ls /w; cat /w/log")                              # step 5
    rep = traj.replay()
    assert rep.matched and rep.first_divergence is None, rep
    assert rep.replayed == 5 and not rep.kept
    assert rep.sandbox.state == "stopped"                       # a plain replay removes it
    # A step that differs each run is the first divergence.
    traj.exec("cat /proc/sys/kernel/random/uuid")               # step 6
    traj.exec("true")                                           # step 7
    rep = traj.replay()
    assert not rep.matched and rep.divergences == 1
    d = rep.first_divergence
    assert d.key == traj.key(6) and d.field == "stdout" and d.recorded != d.replayed
    # Up to a step only.
    rep = traj.replay(to_step=5)
    assert rep.matched and rep.replayed == 5
    # A branch at step 3 continues live from the state after step 3.
    br = traj.branch(3)
    track(br.sandbox.id)
    assert br.step == 3 and br.report.matched and br.sandbox.state == "running"
    assert br.sandbox.files.read("/w/log") == b"one\n"
    assert not br.sandbox.files.exists("/w/b")                  # step 4 was not replayed
    r = br.exec("echo live >> /w/log; cat /w/log")             # step 4 of the branch, live
    assert r.stdout == "one\nlive\n"
    keys = [e.key for e in br.log()]
    assert keys == [br.key(i) for i in range(1, 5)]             # replayed steps re-keyed
    assert br.sandbox.labels.get("replay_of") == traj.sandbox.id
    events = [e.event for e in br.sandbox.log() if e.kind == "event"]
    assert events[:2] == ["created", "replay"] and "replay_finished" in events
    # The original is untouched.
    assert traj.sandbox.files.read("/w/log") == b"one\n"
    # Branching again with the same id (a restarted trainer) gives the same branch.
    again = traj.branch(3, id=br.id)
    assert again.sandbox.id == br.sandbox.id
    br.sandbox.kill()


def test_a_restarted_trainer_fast_forwards_and_continues_live(daemon, client):
    tid = f"ff-{uuid.uuid4().hex[:6]}"

    def rollout(stop_after=None):
        traj = tidepool.Trajectory.create(client, tid, ttl=600)
        outs = []
        for i in range(1, 7):
            if stop_after is not None and i > stop_after:
                break
            outs.append(traj.exec(f"echo {i} >> /tmp/steps; wc -l < /tmp/steps").stdout)
        return traj, outs

    first, outs1 = rollout(stop_after=4)
    second, outs2 = rollout()                                   # "restarted": same id, same code
    assert second.sandbox.id == first.sandbox.id                # the keyed create came back
    assert outs2[:4] == outs1                                   # fast-forwarded: recorded results
    assert outs2 == [f"{i}\n" for i in range(1, 7)]
    assert second.sandbox.files.read("/tmp/steps") == b"".join(f"{i}\n".encode() for i in range(1, 7))
    assert [e.key for e in second.log()] == [second.key(i) for i in range(1, 7)]
    assert second.result(2).stdout == "2\n"


def test_async_trajectory(daemon, make_async_client, track):
    tid = f"as-{uuid.uuid4().hex[:6]}"

    async def rollout(n):
        async with make_async_client(timeout=60) as c:
            traj = await tidepool.AsyncTrajectory.create(c, tid, ttl=600)
            assert isinstance(tidepool.Trajectory(traj.sandbox, tid), tidepool.AsyncTrajectory)
            await traj.write("/tmp/a", "x")
            outs = [(await traj.exec(f"echo {i} >> /tmp/s; wc -l < /tmp/s")).stdout for i in range(n)]
            chunks = [c async for c in traj.exec_stream("cat /tmp/s")]
            entries = await traj.log()
            rep = await traj.replay()
            br = await traj.branch(2)
            track(br.sandbox.id)
            b_out = (await br.exec("cat /tmp/s")).stdout
            await br.sandbox.kill()
            return traj.sandbox.id, outs, chunks, entries, rep, b_out

    sid, outs, chunks, entries, rep, b_out = asyncio.run(rollout(3))
    assert outs == ["1\n", "2\n", "3\n"]
    assert chunks[-1].stdout == "0\n1\n2\n"
    assert [e.key for e in entries] == [f"{tid}/{i}" for i in range(1, 6)]
    assert rep.matched, rep
    assert b_out == "0\n"                                       # after step 2: the write, one exec
    # Again, as a restarted trainer: fast-forwarded, nothing ran twice.
    sid2, outs2, _, _, _, _ = asyncio.run(rollout(3))
    assert sid2 == sid and outs2 == outs


def test_trajectory_log_off_records_keyed_calls_only(build_dir, track):
    d = Daemon(build_dir, extra_args=["--trajectory-log", "off"])
    try:
        d.start()
        with tidepool.Client(d.url, timeout=60) as c:
            sb = c.create(ttl=600)
            track(sb.id)
            s, _, _ = call(d, "POST", f"/v1/sandboxes/{sb.id}/exec", {"cmd": "true"})
            assert s == 200
            sb.exec("echo keyed", idempotency_key="off/1")
            entries = sb.log()
            assert [(e.kind, e.key) for e in entries] == [("call", "off/1")]   # no events, no unkeyed
            assert sb.exec("echo keyed", idempotency_key="off/1").stdout == "keyed\n"
            sb.kill()
            # Without an ended event a follow of the ended sandbox still ends.
            followed = list(sb.follow_log())
            assert followed and all(e.kind == "call" and e.key for e in followed)
    finally:
        d.stop()
        d.cleanup()


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the daemon's unix socket (the caller is then its uid and gid)."""

    def __init__(self, path, timeout=60):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def _raw(daemon, method, target, body=b"", content_type="application/json", key=None, unix=False):
    """One request with any body and content type; returns (status, body bytes)."""
    conn = (_UnixConnection(daemon.socket) if unix
            else http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60))
    headers = {"Content-Type": content_type}
    if key:
        headers["Idempotency-Key"] = key
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    try:
        conn.request(method, target, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _tar_of(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_uploads_stdin_signals_removes_and_pause_resume_are_logged_in_order(daemon, client):
    """Each state-changing route of api/openapi.yaml not covered above (tar upload, mkdir,
    stdin, signal, file remove, pause, resume; refused ones too) has its record, in the
    order the calls were made, with its method, target, key, caller and status; reads
    are not logged."""
    sb = client.create(ttl=600)
    sid = sb.id
    base = f"/v1/sandboxes/{sid}"
    made = []  # (method, target, key, status, transport) of each call, in order

    def do(method, target, body=b"", content_type="application/json", key=None, unix=False, want=None):
        s, b = _raw(daemon, method, base + target, body, content_type, key, unix)
        assert want is None or s == want, (method, target, s, b)
        made.append((method, base + target, key, s, "unix" if unix else "tcp"))
        return b

    tar = _tar_of({"a.txt": b"alpha\n", "sub/b.txt": b"beta\n"})
    up = json.loads(do("PUT", "/files/tar?path=/tmp/up", tar, "application/x-tar", want=200))
    assert up == {"path": "/tmp/up", "bytes": len(tar)}
    do("POST", "/files/mkdir?path=/tmp/dir", want=201, key="cov/mkdir")
    # A background process that reads its stdin: stdin written, then closed.
    p1 = json.loads(do("POST", "/processes", {"cmd": "cat > /tmp/in", "stdin_open": True}, want=201))["pid"]
    do("POST", f"/processes/{p1}/stdin", b"hello ", "application/octet-stream", want=204)
    do("POST", f"/processes/{p1}/stdin?eof=true", b"world", "application/octet-stream",
       want=204, key="cov/stdin")
    assert json.loads(do("POST", f"/processes/{p1}/wait", want=200))["result"]["exit_code"] == 0
    # One ended by a signal (15), over the unix socket.
    p2 = json.loads(do("POST", "/processes", {"cmd": ["sleep", "600"]}, want=201))["pid"]
    do("POST", f"/processes/{p2}/signal", {"signal": 15}, want=204, unix=True)
    assert json.loads(do("POST", f"/processes/{p2}/wait", want=200))["result"]["signal"] == 15
    # A refused call on a live sandbox is a state-changing call too: logged with its status.
    do("POST", "/processes/999/signal", {"signal": 9}, want=404)
    do("DELETE", "/files?path=/tmp/up/a.txt", want=204)
    do("DELETE", "/files?path=/tmp/up/sub&recursive=true", want=204, key="cov/rmr")
    do("POST", "/pause", want=200)
    assert client.get(sid).state == "paused"
    s, _ = _raw(daemon, "GET", base + "/files?path=/tmp/in")    # a read: not logged
    assert s == 200
    do("POST", "/resume", want=200, unix=True)
    assert client.get(sid).state == "running"
    # The calls had their effects.
    assert sb.files.read("/tmp/in") == b"hello world"
    assert sb.files.exists("/tmp/dir") and not sb.files.exists("/tmp/up/a.txt")
    assert not sb.files.exists("/tmp/up/sub")

    entries = sb.log()
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    calls = [e for e in entries if e.kind == "call"]
    got = [(e.method, e.target, e.key, e.status, e.caller.get("transport")) for e in calls]
    assert got == made, "\n".join(map(str, got))
    for e in calls:
        if e.caller["transport"] == "unix":
            assert e.caller["uid"] == os.getuid() and e.caller["gid"] == os.getgid(), e.caller
        assert e.time and e.duration_ms >= 0
    # What each record says of its request and result.
    by_target = {e.target.split(sid, 1)[1]: e for e in calls}
    tar_rec = by_target["/files/tar?path=/tmp/up"]
    assert tar_rec.request["bytes"] == len(tar) and tar_rec.result["path"] == "/tmp/up"
    assert tar_rec.request["sha256"] == hashlib.sha256(tar).hexdigest()
    assert by_target[f"/processes/{p1}/stdin?eof=true"].request["bytes"] == len(b"world")
    assert by_target[f"/processes/{p2}/signal"].request["body"] == {"signal": 15}
    assert by_target["/processes/999/signal"].result.get("code") == "not_found"
    assert by_target["/pause"].result.get("state") == "paused"
    assert by_target["/resume"].result.get("state") == "running"
    # Both background processes' ends are events of the log.
    exits = {e.detail.get("pid"): e.detail for e in entries if e.event == "process_exit"}
    assert exits[p1].get("exit_code") == 0 and exits[p2].get("signal") == 15, exits
    # A keyed one repeated is answered from its record and not logged again.
    n = len(entries)
    s, _ = _raw(daemon, "POST", base + "/files/mkdir?path=/tmp/dir", key="cov/mkdir")
    assert s == 201 and len(sb.log()) == n
    sb.kill()


class _Lines:
    """A subprocess's stdout lines, collected by a thread as they come."""

    def __init__(self, argv):
        self.lines = []
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def end(self, timeout):
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(10)
            raise AssertionError(f"still following {timeout}s after the sandbox ended: {self.lines}")
        self.t.join(10)
        return rc, self.p.stderr.read()


def test_tidepool_log_follow_prints_steps_as_they_run_and_ends_with_the_sandbox(daemon, client, build_dir):
    """`tidepool log --follow ID` (src/cli/cmd_log.cpp) prints each record as it is
    written, as a table row or (--json) as the daemon's NDJSON, and exits 0 once the
    sandbox's ended event came."""
    sb = client.create(ttl=600)
    cli = [str(build_dir / "bin" / "tidepool"), "--url", daemon.url, "log"]
    table = _Lines(cli + ["--follow", sb.id])
    nd = _Lines(cli + [sb.id, "--follow", "--json"])
    try:
        # Both are following before the first step: its rows come from the follow, not a listing.
        wait_until(lambda: len(table.lines) >= 2 and nd.lines, timeout=30, what="the created event on both")
        assert "created (image host)" in table.lines[1] and json.loads(nd.lines[0])["event"] == "created"
        assert table.lines[0].split() == ["SEQ", "TIME", "(UTC)", "KEY", "/", "STEP", "/", "RESULT"]
        n = 5
        for i in range(1, n + 1):
            sb.exec(f"echo {i}; exit {i}", idempotency_key=f"cf/{i}")
            # Each step shows while the sandbox still runs (in order, before the next one).
            row = wait_until(lambda: [l for l in table.lines if f"cf/{i} " in l], timeout=30,
                             what=f"the row of step {i}")
            assert len(row) == 1 and f"exec echo {i}; exit {i}" in row[0] and f"exit {i} (2 B out, 0 B err)" in row[0], row
            wait_until(lambda: any(json.loads(l).get("key") == f"cf/{i}" for l in nd.lines), timeout=30,
                       what=f"the entry of step {i}")
        assert table.p.poll() is None and nd.p.poll() is None    # still following a live sandbox
        sb.kill()
        rc, err = table.end(60)
        assert rc == 0, err
        rc, err = nd.end(60)
        assert rc == 0, err
    finally:
        for f in (table, nd):
            if f.p.poll() is None:
                f.p.kill()
                f.p.wait(10)
    entries = [json.loads(l) for l in nd.lines]
    logged = [e.raw for e in sb.log()]
    assert [e["seq"] for e in entries] == [e["seq"] for e in logged] == list(range(1, len(logged) + 1))
    assert entries == logged                                    # the daemon's entries, as listed
    assert entries[-1]["event"] == "ended" and entries[-1]["detail"]["end_reason"] == "deleted"
    assert [e["key"] for e in entries if e["kind"] == "call" and e["method"] == "POST"] == \
        [f"cf/{i}" for i in range(1, n + 1)]
    rows = table.lines[1:]
    assert [r.split()[0] for r in rows] == [str(e["seq"]) for e in entries]
    assert "created (image host)" in rows[0] and "delete sandbox" in rows[-2] and "ended (deleted)" in rows[-1]
    # Following a sandbox that has ended prints its whole log and exits 0 at once.
    again = subprocess.run(cli + ["--follow", "--json", sb.id], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and [json.loads(l) for l in again.stdout.splitlines()] == entries
    after = subprocess.run(cli + ["--follow", "--json", "--after", str(len(entries)), sb.id],
                           capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and after.stdout == ""
    bad = subprocess.run(cli + ["--follow", "n0-000000000000"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "not found" in bad.stderr


def test_step_retention_deletes_a_removed_sandboxs_log_and_keeps_a_live_ones(build_dir, track):
    """--step-retention 3s (swept every retention/2, at least every second): the log of a
    sandbox that ended goes once it ended more than the retention ago, with its keys; a
    live sandbox's log stays however old its last record, and goes once it ended too."""
    d = Daemon(build_dir, extra_args=["--step-retention", "3s"])
    try:
        d.start()
        with tidepool.Client(d.url, timeout=60) as c:
            def log_path(sid):
                return os.path.join(d.data_dir, "sandboxes", sid, "steps.log")

            live = c.create(ttl=600)
            track(live.id)
            live.exec("echo kept", idempotency_key="ret/live")
            gone = c.create(ttl=600)
            track(gone.id)
            gone.exec("echo gone", idempotency_key="ret/gone")
            live_entries = [e.raw for e in live.log()]
            live_mtime = os.stat(log_path(live.id)).st_mtime_ns
            assert gone.step_result("ret/gone").stdout == "gone\n"
            assert os.path.exists(log_path(gone.id))
            gone.kill()
            ended = time.time_ns()
            assert live_mtime < ended
            wait_until(lambda: not os.path.exists(log_path(gone.id)), timeout=30,
                       what="the ended sandbox's log to be deleted")
            assert not os.path.exists(os.path.join(d.data_dir, "sandboxes", gone.id, "steps.d"))
            # At that sweep the live sandbox's log was older still (nothing written to it since
            # before the other ended): only being live kept it.
            assert os.stat(log_path(live.id)).st_mtime_ns == live_mtime
            assert [e.raw for e in live.log()] == live_entries
            assert live.step_result("ret/live").stdout == "kept\n"
            assert live.exec("echo kept", idempotency_key="ret/live").stdout == "kept\n"   # fast-forward
            assert c.get(live.id).state == "running" and c.get(gone.id).state == "stopped"
            # The removed sandbox's log and keys are gone with it.
            with pytest.raises(tidepool.NotFound):
                gone.step_result("ret/gone")
            s, _, b = call(d, "GET", f"/v1/sandboxes/{gone.id}/log")
            # (the sandbox is still known, stopped: an empty log; a node that forgot it: 404)
            assert s == 404 or (s == 200 and json.loads(b)["entries"] == [] and json.loads(b)["records"] == 0), (s, b)
            # Logged once the sweep removed the log's files (after the file the wait saw go).
            def removal_logged():
                t = d.log_tail(10**6)
                return t if f"step log of {gone.id} removed (retention)" in t else None
            log = wait_until(removal_logged, timeout=30, what="the removal to be logged")
            assert f"step log of {live.id} removed" not in log
            # The live one's log goes too once it has ended.
            live.kill()
            wait_until(lambda: not os.path.exists(log_path(live.id)), timeout=30,
                       what="the second sandbox's log to be deleted after its end")
    finally:
        d.stop()
        d.cleanup()
