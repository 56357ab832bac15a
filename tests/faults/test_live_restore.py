"""Live restore: tidepoold goes away in the middle of everything and comes back.

One scenario, run twice: once with `kill -9` (a crash) and once with SIGTERM on a daemon
that releases its sandboxes (an upgrade: tidepoold without --stop-sandboxes-on-exit). At
the moment the daemon goes, one sandbox has a background process printing a numbered
line every 20 ms, one is in the middle of a plain exec, one streams an exec, one has a
short TTL, and a streamed batch of sandboxes is being created. After the restart on the
same data directory:

  - every sandbox that was running is still running, with its files, and exec works;
  - its record is unchanged: id, image, tier, limits, labels, env, created_at, ttl and
    expires_at; the short TTL still ends its sandbox (end_reason ttl) after the restart;
  - the background process ran on and none of its output is lost or doubled;
  - the exec and the streamed exec cut off have a well-defined outcome (docs/
    trajectory-log.md, "A daemon that dies mid-call"): their clients got an error, not a
    hang and not a result; the output a stream delivered is a prefix of the command's;
    their command was stopped and is never run again: a retry of the call's
    Idempotency-Key (and GET .../log/result) answers an `unavailable` error;
  - the batch is reported item by item: each item the stream reported ready is a
    sandbox that runs and execs, and every sandbox of the batch that reached the store is
    running (and execs) or stopped with a restart reason; none is left `creating`;
  - killing everything afterwards leaves nothing on the host.

A retry of the interrupted batch's own key is test_batch_cut_by_kill9_is_reported_to_its_retry
(and of a single create's, test_create_cut_by_kill9_is_answered_503_to_its_retry).
"""
import base64
import http.client
import json
import os
import pathlib
import signal
import sqlite3
import threading
import time
import uuid

import pytest

import tidepool
from faultlib import cgroup_processes, netns_of, no_retry_client, store_rows, wait_no_host_leaks
from tp_testlib import processes_of, wait_until

LINES = 400  # the printer's lines, one every 20 ms: it outlasts the restart
SHORT_TTL = 30  # seconds: the sandbox whose TTL must still end it after the restart
BATCH = 12
# The build directory of an earlier version (e.g. the main branch's), whose daemon makes
# the sandboxes that this build's daemon then adopts.
PREVIOUS_BUILD = os.environ.get("TIDEPOOL_PREVIOUS_BUILD", "")
RESTART_REASONS = ("daemon_restart", "daemon_shutdown", "failed", "agent_lost")


def _cmdlines(sandbox_id):
    """The command lines of the sandbox's processes, as the host sees them."""
    out = []
    for p in processes_of(sandbox_id):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return out


def _runs(sandbox_id, marker):
    return any(marker in c for c in _cmdlines(sandbox_id))


def stream_batch(daemon, body, key, items, timeout=180):
    """POST /v1/sandboxes/batch (streamed) with Idempotency-Key `key`; every item line goes
    into `items` (index -> ("ready", id) or ("error", code)) as it arrives; returns the
    done line, or raises when the stream ends without one."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/sandboxes/batch", body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        r = conn.getresponse()
        if r.status != 200:
            raise tidepool.TidepoolError(f"batch answered {r.status}: {r.read()[:500]!r}")
        if (r.getheader("Content-Type") or "").startswith("application/json"):  # answered whole
            whole = json.loads(r.read())
            for sb in whole.get("sandboxes") or []:
                items[len(items)] = ("ready", sb["id"])
            for e in whole.get("errors") or []:
                items[e["index"]] = ("error", e["code"])
            return {"done": True, "whole": whole}
        while True:
            line = r.readline()
            if not line:
                raise ConnectionError("the batch stream ended before its done line")
            obj = json.loads(line)
            if obj.get("done"):
                return obj
            idx = obj["index"]
            assert idx not in items, f"item {idx} reported twice: {obj}"
            items[idx] = ("ready", obj["sandbox"]["id"]) if "sandbox" in obj else ("error", obj["error"]["code"])
    finally:
        conn.close()


def _cut_off_call_is_unavailable(retry, result):
    """A keyed call cut off by the daemon's going: its retry, and its recorded answer,
    are an `unavailable` error (never a result of the command run again)."""
    with pytest.raises(tidepool.Unavailable) as e:
        retry()
    try:
        got = result()
    except tidepool.Unavailable as f:
        got = f
    assert isinstance(got, tidepool.Unavailable), f"the recorded answer of a cut-off call: {got!r}"
    return e.value


@pytest.mark.parametrize("how", ["kill9", "term"])
def test_restart_mid_work_keeps_every_sandbox(daemon, client, how):
    tag = uuid.uuid4().hex[:8]
    labels = {"live": tag}
    if how == "term":  # an upgrade: a daemon that releases its sandboxes when it stops
        daemon.keep_sandboxes = True
        daemon.stop()
        daemon.start()
    # Each with a shape of its own, so that a record mixed up with another's shows.
    printer_sb = client.create(ttl=600, labels={**labels, "role": "printer"}, memory_mb=256, env={"ROLE": "printer"})
    busy_sb = client.create(ttl=700, labels={**labels, "role": "busy"}, pids=300, idle_timeout=900)
    stream_sb = client.create(ttl=800, labels={**labels, "role": "stream"}, cpus=0.5, disk_mb=512)
    short_sb = client.create(ttl=SHORT_TTL, labels={**labels, "role": "short"})
    mine = [printer_sb, busy_sb, stream_sb, short_sb]
    for sb in mine:
        sb.files.write("/root/kept.txt", sb.id.encode())
    netns = netns_of(p for sb in mine for p in processes_of(sb.id))
    printer = printer_sb.start(f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.02; done")
    outcome = {}
    ekey, skey, bkey = (f"{k}-{uuid.uuid4().hex}" for k in ("exec", "stream", "batch"))
    exec_cmd = "echo run >> /root/exec-runs; sleep 60; echo late"
    stream_cmd = "echo run >> /root/stream-runs; for i in $(seq 1 400); do echo s $i; sleep 0.02; done"

    def plain_exec():
        try:
            with no_retry_client(daemon.url, timeout=120) as c:
                outcome["exec"] = c.get(busy_sb.id).exec(exec_cmd, idempotency_key=ekey)
        except Exception as e:  # noqa: BLE001 - cut off by the daemon going away
            outcome["exec"] = e

    streamed = []

    def stream():
        try:
            with no_retry_client(daemon.url, timeout=60) as c:
                for item in c.get(stream_sb.id).exec_stream(stream_cmd, idempotency_key=skey):
                    if isinstance(item, tidepool.ExecResult):
                        outcome["stream"] = item
                        return
                    streamed.append(item)
        except Exception as e:  # noqa: BLE001
            outcome["stream"] = e

    items = {}

    def batch():
        try:
            outcome["batch"] = stream_batch(daemon, {"count": BATCH, "ttl_seconds": 600,
                                                     "labels": {**labels, "role": "batch"}, "stream": True},
                                            bkey, items)
        except Exception as e:  # noqa: BLE001
            outcome["batch"] = e

    threads = [threading.Thread(target=f) for f in (plain_exec, stream, batch)]
    for t in threads:
        t.start()
    wait_until(lambda: len(streamed) >= 3 and _runs(busy_sb.id, "sleep 60") and (items or "batch" in outcome),
               timeout=60, interval=0.01, what="the exec, the stream and the batch to be under way")
    netns |= netns_of(int(p.split()[0]) for p in cgroup_processes(daemon.data_dir))
    before = {sb.id: client.get(sb.id).info for sb in mine}
    gone_at = time.monotonic()
    daemon.stop(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
    for t in threads:
        t.join(max(0.1, gone_at + 60 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"a client hung after the daemon went away: {outcome}"
    try:
        daemon.start()
        with no_retry_client(daemon.url) as c:
            for sb in mine:
                got = c.get(sb.id)
                # The record as it was: image, tier, limits, labels, env, created_at, ttl,
                # expires_at (the short one may have expired meanwhile: then only its state
                # and end moved on).
                if sb is short_sb and got.state != "running":
                    assert got.end_reason == "ttl", got.info
                else:
                    assert got.state == "running", got.info
                    assert got.info.raw == before[sb.id].raw, (got.info.raw, before[sb.id].raw)
                    assert got.files.read("/root/kept.txt") == sb.id.encode()
                    assert got.exec("echo back").stdout == "back\n"
                for field in ("image", "tier", "memory_mb", "cpus", "pids", "disk_mb", "ttl_seconds",
                              "idle_timeout_seconds", "labels", "env", "created_at", "expires_at"):
                    assert getattr(got.info, field) == getattr(before[sb.id], field), (field, got.info, before[sb.id])
            # The printer ran on through the restart, under the same pid in its sandbox;
            # every line arrives once, in order.
            assert printer.info.os_pid and printer.info.os_pid > 1, printer.info
            assert c.get(printer_sb.id).process(printer.pid).refresh().os_pid == printer.info.os_pid
            res = c.get(printer_sb.id).process(printer.pid).wait(timeout=60)
            assert res.exit_code == 0, res
            assert res.stdout == "".join(f"line {i}\n" for i in range(1, LINES + 1)), res.stdout[-400:]

            # The exec and the stream cut off: an error for their clients, their commands
            # stopped and never run again, and the same error for a retry of their key.
            for what in ("exec", "stream"):
                assert isinstance(outcome.get(what), tidepool.TidepoolError), (what, outcome.get(what))
            got = b"".join(ch.data for ch in streamed if ch.stream == "stdout").decode()
            assert "".join(f"s {i}\n" for i in range(1, LINES + 1)).startswith(got) and got, got
            stream_again = c.get(stream_sb.id)
            _cut_off_call_is_unavailable(lambda: list(stream_again.exec_stream(stream_cmd, idempotency_key=skey)),
                                         lambda: stream_again.step_result(skey))
            busy_again = c.get(busy_sb.id)
            _cut_off_call_is_unavailable(lambda: busy_again.exec(exec_cmd, idempotency_key=ekey),
                                         lambda: busy_again.step_result(ekey))
            wait_until(lambda: not _runs(stream_sb.id, "stream-runs") and not _runs(busy_sb.id, "sleep 60"),
                       timeout=30, interval=0.1, what="the cut-off commands to be stopped")
            assert stream_again.files.read("/root/stream-runs") == b"run\n"
            assert busy_again.files.read("/root/exec-runs") == b"run\n"
            # One record per key (the outcome above), none added for its intent, which is
            # no entry of the log.
            for sb_again, k in ((stream_again, skey), (busy_again, ekey)):
                entries = sb_again.log()
                recs = [e for e in entries if e.key == k]
                assert len(recs) == 1, recs
                assert not [e for e in entries if e.event == "intent"], entries
                assert [e.seq for e in entries] == list(range(1, len(entries) + 1)), entries

            # The batch, item by item: nothing of it left creating.
            assert set(items) <= set(range(BATCH)), items
            ready = {sid for kind, sid in items.values() if kind == "ready"}
            for sid in ready:
                got = c.get(sid)
                assert got.state == "running", got.info
                assert got.exec("echo b").stdout == "b\n"
            stored = {s.id: s for s in c.list(labels={**labels, "role": "batch"}, all=True)}
            daemon.created.update(stored)
            assert ready <= set(stored), (ready, set(stored))
            assert len(stored) <= BATCH, sorted(stored)
            rows = store_rows(daemon.data_dir)
            assert not [sid for sid in stored if rows[sid]["state"] == "creating"], rows
            for sid, s in stored.items():
                state = s.refresh().state
                if state == "running":
                    assert c.get(sid).exec("echo b").stdout == "b\n"
                else:
                    assert state == "stopped", s
                    # A clean stop ends what it was still creating (daemon_shutdown).
                    assert rows[sid]["end_reason"] in RESTART_REASONS, rows[sid]
            if isinstance(outcome.get("batch"), dict):  # it finished before the daemon went
                assert len(items) == BATCH and ready == set(stored), (items, sorted(stored))

            # The short TTL still holds: it ends the sandbox at its recorded expiry.
            info = wait_until(lambda: (i := c.get(short_sb.id).info).state == "stopped" and i,
                              timeout=SHORT_TTL + 120, interval=0.5, what="the short TTL to end its sandbox")
            assert info.end_reason == "ttl", info
            assert info.expires_at == before[short_sb.id].expires_at and info.ended_at >= info.expires_at, info
            for sid in set(stored) | {sb.id for sb in mine}:
                c.kill(sid)
        wait_no_host_leaks(daemon.data_dir, netns)
    finally:
        if how == "term":  # back to the session's daemon, which ends its sandboxes on exit
            daemon.keep_sandboxes = False
            daemon.stop()
            daemon.start()


def test_batch_cut_by_kill9_is_reported_to_its_retry(daemon):
    """The client of a batch cut short by kill -9 retries it with the same Idempotency-Key
    (as the SDK does). The restarted daemon must not run it a second time: the retry is
    answered 503 `unavailable` from the record of the call it died answering (or, had the
    answer been recorded, item by item, each item a sandbox of the first run that runs and
    execs or an error), and no new sandbox appears (docs/trajectory-log.md: a keyed step
    in flight when the daemon dies is answered to its retry, never run twice)."""
    count = 48
    labels = {"live": uuid.uuid4().hex[:8], "role": "batch"}
    body = {"count": count, "ttl_seconds": 600, "labels": labels, "stream": True}
    key = f"batch-{uuid.uuid4().hex}"
    items, outcome = {}, {}

    def batch():
        try:
            outcome["done"] = stream_batch(daemon, body, key, items)
        except Exception as e:  # noqa: BLE001
            outcome["error"] = e

    t = threading.Thread(target=batch)
    t.start()
    wait_until(lambda: items or not t.is_alive(), timeout=60, interval=0.005, what="the batch's first item")
    daemon.stop(signal.SIGKILL)
    t.join(60)
    assert not t.is_alive(), "the batch's client hung after the daemon died"
    daemon.start()
    with no_retry_client(daemon.url) as c:
        first = {s.id for s in c.list(labels=labels, all=True)}
        daemon.created.update(first)
        try:
            if "done" in outcome:
                pytest.skip("the batch completed before the kill (host too fast); nothing was cut short")
            retry = {}
            try:
                stream_batch(daemon, body, key, retry)
            except tidepool.TidepoolError as e:  # answered as a whole error: accounted for, nothing run
                retry = {"error": str(e)}
            after = {s.id for s in c.list(labels=labels, all=True)}
            daemon.created.update(after)
            assert after == first, f"the retry ran the batch again: {len(after - first)} new sandboxes"
            if "error" in retry:  # the batch cut short: answered 503 from its record
                assert "answered 503" in retry["error"] and "unavailable" in retry["error"], retry
            else:
                assert set(retry) == set(range(count)), sorted(retry)
                for idx, (kind, sid) in retry.items():
                    if kind == "ready":
                        assert sid in first, (idx, sid)
                        assert c.get(sid).exec("echo b").stdout == "b\n"
                    if idx in items:
                        assert retry[idx] == items[idx], (idx, retry[idx], items[idx])
        finally:
            for sid in {s.id for s in c.list(labels=labels, all=True)}:
                daemon.created.add(sid)
                c.kill(sid)


def _cut_keyed_create(daemon, labels, key):
    """POST /v1/sandboxes with Idempotency-Key `key`, and kill -9 of tidepoold as soon as
    its sandbox is in the store (being created: the call's intent is written by then);
    the daemon is started again. Returns post (which sends that create again) and
    whether the first one was answered before the kill."""
    body = json.dumps({"ttl_seconds": 600, "labels": labels}).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key}

    def post():
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
        try:
            conn.request("POST", "/v1/sandboxes", body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    outcome = {}

    def create():
        try:
            outcome["done"] = post()
        except Exception as e:  # noqa: BLE001 - cut off by the daemon's death
            outcome["error"] = e

    db = sqlite3.connect(f"file:{os.path.join(daemon.data_dir, 'state.db')}?mode=ro", uri=True, timeout=10)

    def ids():
        return {r[0] for r in db.execute("SELECT id FROM sandboxes")}

    try:
        before = ids()
        t = threading.Thread(target=create)
        t.start()
        wait_until(lambda: ids() - before or not t.is_alive(),
                   timeout=60, interval=0.001, what="the sandbox to be in the store")
        daemon.stop(signal.SIGKILL)
    finally:
        db.close()
    t.join(60)
    assert not t.is_alive(), "the create's client hung after the daemon died"
    daemon.start()
    return post, "done" in outcome


def test_create_cut_by_kill9_is_answered_503_to_its_retry(daemon):
    """A keyed single create (POST /v1/sandboxes) cut short by kill -9 while its sandbox
    is being created: the retry of its key after the restart is answered 503
    `unavailable` from the record (or, when the answer was recorded just before the kill,
    with that answer), the same every time, and never makes a second sandbox. (A create
    answered before the kill cuts nothing short: tried again, up to 5 times.)"""
    for attempt in range(5):
        labels = {"live": uuid.uuid4().hex[:8], "role": "create"}
        post, answered = _cut_keyed_create(daemon, labels, f"create-{uuid.uuid4().hex}")
        with no_retry_client(daemon.url) as c:
            first = {s.id for s in c.list(labels=labels, all=True)}
            daemon.created.update(first)
            try:
                if answered:
                    continue
                assert len(first) <= 1, first
                status, answer = post()
                if status == 201:  # answered and recorded just before the kill: that sandbox
                    assert json.loads(answer)["id"] in first, (answer, first)
                else:
                    assert status == 503, (status, answer)
                    err = json.loads(answer)
                    assert err["code"] == "unavailable", err
                    assert "the daemon restarted while this call was being answered" in err["message"], err
                assert post() == (status, answer)  # and again: one record, read back
                after = {s.id for s in c.list(labels=labels, all=True)}
                daemon.created.update(after)
                assert after == first, f"the retry created again: {after - first}"
                return
            finally:
                for sid in {s.id for s in c.list(labels=labels, all=True)}:
                    daemon.created.add(sid)
                    c.kill(sid)
    pytest.skip("every create was answered before the kill (host too fast); nothing was cut short")


@pytest.mark.skipif(not PREVIOUS_BUILD, reason="TIDEPOOL_PREVIOUS_BUILD names no earlier build")
def test_sandboxes_of_a_previous_build_are_adopted_after_kill9(daemon, client):
    """adopt() does not care who made a sandbox: sandboxes an earlier version's daemon made
    (its run dir and layout, its way of starting them) are adopted by this build's daemon
    after a kill -9, keep their files and running commands, and go without a trace."""
    this_build = daemon.binary
    earlier = pathlib.Path(PREVIOUS_BUILD) / "bin" / "tidepoold"
    assert earlier.exists(), earlier
    netns = set()
    daemon.stop(signal.SIGKILL)
    daemon.binary = earlier
    try:
        daemon.start()
        sbs = [client.create(ttl=600) for _ in range(3)]
        for sb in sbs:
            sb.files.write("/root/kept.txt", sb.id.encode())
        netns = netns_of(p for sb in sbs for p in processes_of(sb.id))
        printer = sbs[0].start(f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.02; done")
        daemon.stop(signal.SIGKILL)
    finally:
        daemon.binary = this_build
        daemon.start()
    with no_retry_client(daemon.url) as c:
        for sb in sbs:
            got = c.get(sb.id)
            assert got.state == "running", got.info
            assert got.files.read("/root/kept.txt") == sb.id.encode()
            assert got.exec("echo adopted").stdout == "adopted\n"
        res = c.get(sbs[0].id).process(printer.pid).wait(timeout=60)
        assert res.exit_code == 0, res
        assert res.stdout == "".join(f"line {i}\n" for i in range(1, LINES + 1)), res.stdout[-400:]
        # This build's sandboxes beside them.
        new = c.create(ttl=600)
        daemon.created.add(new.id)
        assert new.exec("echo new").stdout == "new\n"
        for sid in [sb.id for sb in sbs] + [new.id]:
            c.kill(sid)
    wait_no_host_leaks(daemon.data_dir, netns)


def test_ended_sandboxes_logs_and_keys_are_served_right_after_a_restart(daemon):
    """A restarted daemon reads the logs of ended sandboxes after it serves, in the
    background (docs/trajectory-log.md, "Recovery"). Right after a kill -9 and a start:
    each ended sandbox lists its whole history, a keyed exec sent again replays its
    recorded answer (nothing runs), and a keyed exec on the running sandbox runs once."""

    def call(method, path, body=None, key=None):
        conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
        try:
            headers = {"Content-Type": "application/json"}
            if key:
                headers["Idempotency-Key"] = key
            conn.request(method, path, body=None if body is None else json.dumps(body).encode(),
                         headers=headers)
            r = conn.getresponse()
            data = r.read()
            return r.status, r.getheader("Idempotent-Replayed"), json.loads(data) if data else None
        finally:
            conn.close()

    def stdout(answer):  # base64 in an exec's JSON answer
        return base64.b64decode(answer["stdout"]).decode()

    ended = []
    for i in range(40):
        s, _, sb = call("POST", "/v1/sandboxes", {"ttl_seconds": 600})
        assert s == 201, sb
        s, _, out = call("POST", f"/v1/sandboxes/{sb['id']}/exec", {"cmd": f"echo run {i}"},
                         key=f"ended-{i}")
        assert s == 200 and stdout(out) == f"run {i}\n", out
        s, _, _ = call("DELETE", f"/v1/sandboxes/{sb['id']}")
        assert s in (200, 204)
        ended.append(sb["id"])
    s, _, live = call("POST", "/v1/sandboxes", {"ttl_seconds": 600})
    assert s == 201, live
    daemon.stop(signal.SIGKILL)
    daemon.start()
    try:
        # Keys first, before anything reads those logs: find() must wait for the reader.
        # (With 40 logs the reader may be done already; the races themselves are in
        # tests/unit/node/step_log_test.cpp.)
        for i in reversed(range(len(ended))):
            s, replayed, out = call("POST", f"/v1/sandboxes/{ended[i]}/exec", {"cmd": f"echo run {i}"},
                                    key=f"ended-{i}")
            assert (s, replayed) == (200, "true") and stdout(out) == f"run {i}\n", (s, replayed, out)
        for i in reversed(range(len(ended))):
            s, _, log = call("GET", f"/v1/sandboxes/{ended[i]}/log")
            assert s == 200, log
            entries = log["entries"]
            assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1)), entries
            assert entries[0]["event"] == "created" and entries[-1]["event"] == "ended", entries
            assert [e.get("key") for e in entries if e["kind"] == "call"][0] == f"ended-{i}", entries
        s, replayed, out = call("POST", f"/v1/sandboxes/{live['id']}/exec",
                                {"cmd": "echo x >> /tmp/once; wc -l < /tmp/once"}, key="live-1")
        assert (s, replayed) == (200, None) and stdout(out).strip() == "1", (s, replayed, out)
        s, replayed, out = call("POST", f"/v1/sandboxes/{live['id']}/exec",
                                {"cmd": "echo x >> /tmp/once; wc -l < /tmp/once"}, key="live-1")
        assert (s, replayed) == (200, "true") and stdout(out).strip() == "1", (s, replayed, out)
    finally:
        call("DELETE", f"/v1/sandboxes/{live['id']}")
