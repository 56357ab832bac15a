"""The trajectory log under faults (docs/trajectory-log.md): a trainer killed mid-rollout
and restarted runs every step exactly once; after kill -9 of tidepoold the log is intact,
fast-forward works and a step that was running is not run again; a torn final record
(a crash mid-write) is ignored."""
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import tidepool
from faultlib import no_retry_client
from tp_testlib import REPO, wait_until

TRAINER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[4])
    import tidepool
    url, tid, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = tidepool.Client(url, timeout=60)
    traj = tidepool.Trajectory.create(client, tid, ttl=600)
    print("sandbox", traj.sandbox.id, flush=True)
    for i in range(1, n + 1):
        print("start", i, flush=True)
        if i % 3 == 0:
            traj.write(f"/tmp/w{i}", str(i))
        else:
            r = traj.exec(f"echo {i} >> /tmp/steps; sleep 0.3; echo out{i}")
            assert r.stdout == f"out{i}\\n", r
        print("done", i, flush=True)
    print("finished", flush=True)
""")


class Trainer:
    """A trainer process running TRAINER; its stdout lines are collected as they come."""

    def __init__(self, daemon, tid, n, script):
        self.lines = []
        self.p = subprocess.Popen(["/usr/bin/python3",
                                   script, daemon.url, tid, str(n), str(REPO / "sdk" / "python")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.strip())

    def saw(self, line):
        return line in self.lines

    def kill(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)
        self.t.join(10)

    def finish(self):
        rc = self.p.wait(120)
        self.t.join(10)
        assert rc == 0, self.p.stderr.read()
        return self.lines


def test_a_trainer_killed_mid_rollout_and_restarted_runs_every_step_exactly_once(daemon, client, track, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    tid = f"e2e-{uuid.uuid4().hex[:8]}"
    n = 12
    sid = None
    # Killed three times, each time in the middle of a step (the steps take 0.3 s).
    for kill_at in (2, 5, 8):
        tr = Trainer(daemon, tid, n, script)
        wait_until(lambda: tr.saw(f"start {kill_at}"), timeout=60, what=f"step {kill_at} to start")
        time.sleep(0.15)
        tr.kill()
        sb_line = [l for l in tr.lines if l.startswith("sandbox ")]
        assert sb_line, tr.lines
        sid = sid or sb_line[0].split()[1]
        track(sid)
        assert sb_line[0].split()[1] == sid                       # the same sandbox every time
        assert not tr.saw(f"done {kill_at}")
    lines = Trainer(daemon, tid, n, script).finish()
    assert lines[-1] == "finished" and lines[0] == f"sandbox {sid}"
    sb = client.get(sid)
    execs = [i for i in range(1, n + 1) if i % 3]
    assert sb.files.read("/tmp/steps") == "".join(f"{i}\n" for i in execs).encode()   # each once
    for i in range(3, n + 1, 3):
        assert sb.files.read(f"/tmp/w{i}") == str(i).encode()
    # The log has each step once, in order, with its result.
    keyed = [e for e in sb.log() if e.kind == "call" and e.key and e.key.startswith(tid + "/")]
    assert [e.key for e in keyed] == [f"{tid}/{i}" for i in range(1, n + 1)]
    assert all(e.status == 200 for e in keyed)
    sb.kill()


def test_kill9_of_the_daemon_keeps_the_log_fast_forward_and_the_running_step_is_not_rerun(daemon, client, track):
    tid = f"k9-{uuid.uuid4().hex[:8]}"
    traj = tidepool.Trajectory.create(client, tid, ttl=600)
    sb = traj.sandbox
    outs = [traj.exec(f"echo {i} >> /tmp/steps; echo {i}").stdout for i in range(1, 4)]
    before = sb.log(output=True)
    # Step 4 is running when the daemon dies.
    k4 = traj.key(4)
    caught = {}

    def step4():
        with no_retry_client(daemon.url) as c:
            try:
                c.get(sb.id).exec("echo start4 >> /tmp/steps; sleep 5; echo end4 >> /tmp/steps",
                                  idempotency_key=k4)
            except tidepool.TidepoolError as e:
                caught["e"] = e

    t = threading.Thread(target=step4)
    t.start()
    wait_until(lambda: b"start4" in sb.files.read("/tmp/steps"), timeout=30, what="step 4 to start")
    daemon.restart(kill9=True)
    t.join(30)
    assert "e" in caught
    after = sb.log(output=True)
    # Intact: every record as it was, then the step that was cut short, answered 503.
    assert [(e.seq, e.key, e.status, e.answer) for e in after[:len(before)]] == \
        [(e.seq, e.key, e.status, e.answer) for e in before]
    lost = [e for e in after if e.key == k4]
    assert len(lost) == 1 and lost[0].status == 503 and "restarted" in lost[0].result["message"]
    # Fast-forward: the same trajectory again gets the recorded results, runs nothing.
    again = tidepool.Trajectory(client.get(sb.id), tid)
    assert [again.exec(f"echo {i} >> /tmp/steps; echo {i}").stdout for i in range(1, 4)] == outs
    # Step 4's retry gets its recorded answer: it is not run a second time.
    with no_retry_client(daemon.url) as c:
        with pytest.raises(tidepool.Unavailable):
            c.get(sb.id).exec("echo start4 >> /tmp/steps; sleep 5; echo end4 >> /tmp/steps",
                              idempotency_key=k4)
    again.step = 4
    assert again.exec("echo 5 >> /tmp/steps; echo 5").stdout == "5\n"   # live from step 5
    assert sb.files.read("/tmp/steps") == b"1\n2\n3\nstart4\n5\n"
    assert [e.seq for e in sb.log()] == list(range(1, len(sb.log()) + 1))
    sb.kill()


# A record in the documented format (docs/trajectory-log.md), to write a torn one by hand.
def _crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _record(key, target, answer):
    def field(tag, value):
        return struct.pack("<HI", tag, len(value)) + value
    p = bytes([1]) + field(22, struct.pack("<Q", 999)) + field(1, key.encode()) + field(2, b"POST") + \
        field(3, target.encode()) + field(10, struct.pack("<I", 200)) + field(11, b"application/json") + \
        field(12, answer) + field(14, struct.pack("<Q", len(answer))) + \
        field(15, struct.pack("<I", _crc32c(answer)))
    ln = struct.pack("<I", len(p))
    return struct.pack("<I", 0x52535054) + ln + struct.pack("<I", _crc32c(p, _crc32c(ln))) + p


def _logical_end(path):
    """The end of the last whole record (the rest is preallocated zeros or torn bytes)."""
    data = open(path, "rb").read()
    assert data[:8] == b"TPSTEPS\n" and struct.unpack("<I", data[8:12])[0] == 2
    off = 16
    while off + 12 <= len(data):
        magic, ln, _ = struct.unpack("<III", data[off:off + 12])
        if magic != 0x52535054:
            break
        off += 12 + ln
    return off


def test_a_torn_final_record_is_ignored(daemon, client):
    sb = client.create(ttl=600)
    sb.exec("echo a >> /tmp/t", idempotency_key="torn/1")
    before = sb.log()
    path = os.path.join(daemon.data_dir, "sandboxes", sb.id, "steps.log")
    daemon.stop(signal.SIGKILL)  # a crash ...
    end = _logical_end(path)
    whole = _record("torn/2", f"/v1/sandboxes/{sb.id}/exec", b'{"exit_code":0}')
    with open(path, "r+b") as f:  # ... in the middle of writing the next record
        f.seek(end)
        f.write(whole[: len(whole) // 2])
    daemon.start()
    assert "torn final record" in daemon.log_tail(200)
    after = sb.log()
    assert [(e.seq, e.key) for e in after[:len(before)]] == [(e.seq, e.key) for e in before]
    assert not [e for e in after if e.key == "torn/2"]
    # The key of the torn record was never recorded: it runs; the log goes on after it.
    r = client.get(sb.id).exec("echo b >> /tmp/t; cat /tmp/t", idempotency_key="torn/2")
    assert r.stdout == "a\nb\n"
    seqs = [e.seq for e in sb.log()]
    assert seqs == list(range(1, len(seqs) + 1))
    # A whole record written after a crash is read back (the format is as documented).
    sb.kill()
    wait_until(lambda: sb.log()[-1].event == "ended", timeout=15, what="the ended event")
    daemon.stop(signal.SIGKILL)
    end = _logical_end(path)
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(_record("hand/1", f"/v1/sandboxes/{sb.id}/exec", b'{"exit_code":7}'))
    daemon.start()
    hand = [e for e in sb.log() if e.key == "hand/1"]
    assert len(hand) == 1 and hand[0].status == 200 and hand[0].seq == 999


def _follow(url, sid, after, seen, upto=None):
    """Follows the log of `sid` after the cursor `after`, appending each entry's seq to
    `seen`, until the ended event ("ended"), the stream's end without it ("eof"), an
    error (the exception), or `upto` entries ("left": the follower closes its stream)."""
    with no_retry_client(url) as c:
        try:
            stream = c.get(sid).follow_log(after=after)
            got = 0
            for e in stream:
                seen.append((e.seq, e.key, e.event))
                got += 1
                if e.event == "ended":
                    return "ended"
                if upto is not None and got == upto:
                    stream.close()
                    return "left"
            return "eof"
        except tidepool.TidepoolError as e:
            return e


def test_a_follower_resumes_from_its_cursor_after_kill9_of_the_daemon(daemon, client):
    """A follower cut by kill -9 of tidepoold, and one that had left earlier, reconnect to
    the restarted daemon with after=<last seq seen>: each then has every entry once, in
    order: those written before the crash, the one the restart wrote for the step that
    was running (503), and those written after it, to the ended event."""
    tid = f"fk-{uuid.uuid4().hex[:8]}"
    sb = client.create(ttl=600)
    for i in range(1, 4):
        sb.exec(f"echo {i}", idempotency_key=f"{tid}/{i}")
    # Follower b read two entries and left; follower a is caught up, waiting for more.
    b_seen, a_seen, a_end = [], [], {}
    assert _follow(daemon.url, sb.id, 0, b_seen, upto=2) == "left"
    a = threading.Thread(target=lambda: a_end.setdefault("how", _follow(daemon.url, sb.id, 0, a_seen)))
    a.start()
    wait_until(lambda: len(a_seen) == 4, timeout=30, what="the follower to catch up")
    # A keyed step is running when the daemon dies.
    inflight = f"{tid}/4"
    caught = {}

    def step4():
        with no_retry_client(daemon.url) as c:
            try:
                c.get(sb.id).exec("echo start >> /tmp/s; sleep 30", idempotency_key=inflight)
            except tidepool.TidepoolError as e:
                caught["e"] = e

    t = threading.Thread(target=step4)
    t.start()
    wait_until(lambda: sb.files.exists("/tmp/s"), timeout=30, what="step 4 to start")
    old_pid = daemon.pid
    daemon.restart(kill9=True)
    assert daemon.pid != old_pid
    a.join(30)
    t.join(30)
    assert not a.is_alive() and not t.is_alive() and "e" in caught
    assert a_end["how"] != "ended", a_end                      # cut, not ended
    assert [s for s, _, _ in a_seen] == [1, 2, 3, 4] and [s for s, _, _ in b_seen] == [1, 2]
    # Steps while nobody follows, then the follower back from its cursor, then more steps.
    sb = client.get(sb.id)
    for i in range(5, 7):
        sb.exec(f"echo {i}", idempotency_key=f"{tid}/{i}")
    a = threading.Thread(target=lambda: a_end.update(how=_follow(daemon.url, sb.id, a_seen[-1][0], a_seen)))
    a.start()
    for i in range(7, 10):
        sb.exec(f"echo {i}", idempotency_key=f"{tid}/{i}")
        wait_until(lambda: any(k == f"{tid}/{i}" for _, k, _ in a_seen), timeout=30,
                   what=f"step {i} to reach the follower")
    sb.kill()
    a.join(60)
    assert not a.is_alive() and a_end["how"] == "ended", a_end
    assert _follow(daemon.url, sb.id, b_seen[-1][0], b_seen) == "ended"
    logged = [(e.seq, e.key, e.event) for e in sb.log()]
    assert [s for s, _, _ in logged] == list(range(1, len(logged) + 1))
    assert a_seen == logged and b_seen == logged                # no gap, no duplicate
    steps = [k for _, k, _ in logged if k and k.startswith(tid + "/")]
    assert steps == [f"{tid}/{i}" for i in range(1, 10)]
    cut = [e for e in sb.log() if e.key == inflight]
    assert len(cut) == 1 and cut[0].status == 503
    assert logged[-1][2] == "ended"
