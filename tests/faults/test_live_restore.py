"""Live restore: tidepoold goes away in the middle of everything and comes back.

One scenario, run twice: once with `kill -9` (a crash) and once with SIGTERM on a daemon
that releases its sandboxes (an upgrade: tidepoold without --stop-sandboxes-on-exit). At
the moment the daemon goes, one sandbox has a background process printing a numbered
line every 20 ms, one is in the middle of a plain exec, one streams an exec, and a batch
of sandboxes is being created. After the restart on the same data directory:

  - every sandbox that was running is still running, with its files, and exec works;
  - the background process ran on and none of its output is lost or doubled;
  - the batch is reported item by item: each sandbox of it that reached the store is
    running or stopped with a restart reason, never left `creating`;
  - the clients cut off got an error, not a hang;
  - killing everything afterwards leaves nothing on the host.
"""
import os
import pathlib
import signal
import threading
import time
import uuid

import pytest

import tidepool
from faultlib import cgroup_processes, netns_of, no_retry_client, store_rows, wait_no_host_leaks
from tp_testlib import processes_of, wait_until

LINES = 400  # the printer's lines, one every 20 ms: it outlasts the restart
# The build directory of an earlier version (e.g. the main branch's), whose daemon makes
# the sandboxes that this build's daemon then adopts.
PREVIOUS_BUILD = os.environ.get("TIDEPOOL_PREVIOUS_BUILD", "")


@pytest.mark.parametrize("how", ["kill9", "term"])
def test_restart_mid_work_keeps_every_sandbox(daemon, client, how):
    tag = uuid.uuid4().hex[:8]
    labels = {"live": tag}
    if how == "term":  # an upgrade: a daemon that releases its sandboxes when it stops
        daemon.keep_sandboxes = True
        daemon.stop()
        daemon.start()
    printer_sb = client.create(ttl=600, labels=labels)
    busy_sb = client.create(ttl=600, labels=labels)
    stream_sb = client.create(ttl=600, labels=labels)
    mine = [printer_sb, busy_sb, stream_sb]
    for sb in mine:
        sb.files.write("/root/kept.txt", sb.id.encode())
    netns = netns_of(p for sb in mine for p in processes_of(sb.id))
    printer = printer_sb.start(f"for i in $(seq 1 {LINES}); do echo line $i; sleep 0.02; done")
    outcome = {}

    def plain_exec():
        try:
            with no_retry_client(daemon.url, timeout=60) as c:
                outcome["exec"] = c.get(busy_sb.id).exec("sleep 5; echo late")
        except Exception as e:  # noqa: BLE001 - cut off by the daemon going away
            outcome["exec"] = e

    streamed = []

    def stream():
        try:
            with no_retry_client(daemon.url, timeout=60) as c:
                for item in c.get(stream_sb.id).exec_stream("for i in $(seq 1 400); do echo s $i; sleep 0.02; done"):
                    if isinstance(item, tidepool.ExecResult):
                        outcome["stream"] = item
                        return
                    streamed.append(item)
        except Exception as e:  # noqa: BLE001
            outcome["stream"] = e

    def batch():
        try:
            with no_retry_client(daemon.url, timeout=180) as c:
                outcome["batch"] = c.create_batch(12, ttl=600, labels=labels)
        except Exception as e:  # noqa: BLE001
            outcome["batch"] = e

    threads = [threading.Thread(target=f) for f in (plain_exec, stream, batch)]
    before = len(cgroup_processes(daemon.data_dir))
    for t in threads:
        t.start()
    wait_until(lambda: len(streamed) >= 3 and len(cgroup_processes(daemon.data_dir)) >= before + 3,
               timeout=60, interval=0.01, what="the stream and the batch to be under way")
    netns |= netns_of(int(p.split()[0]) for p in cgroup_processes(daemon.data_dir))
    gone_at = time.monotonic()
    daemon.stop(signal.SIGKILL if how == "kill9" else signal.SIGTERM)
    for t in threads:
        t.join(max(0.1, gone_at + 60 - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"a client hung after the daemon went away: {outcome}"
    try:
        daemon.start()
        with no_retry_client(daemon.url) as c:
            for sb in mine:
                assert c.get(sb.id).state == "running", c.get(sb.id).info
                assert c.get(sb.id).files.read("/root/kept.txt") == sb.id.encode()
                assert c.get(sb.id).exec("echo back").stdout == "back\n"
            # The printer ran on through the restart; every line arrives once, in order.
            res = c.get(printer_sb.id).process(printer.pid).wait(timeout=60)
            assert res.exit_code == 0, res
            assert res.stdout == "".join(f"line {i}\n" for i in range(1, LINES + 1)), res.stdout[-400:]
            # The batch, item by item: nothing of it left creating.
            ours = {s.id: s for s in c.list(labels=labels, all=True)}
            daemon.created.update(ours)
            rows = store_rows(daemon.data_dir)
            batch_ids = set(ours) - {sb.id for sb in mine}
            for sid in batch_ids:
                state = ours[sid].refresh().state
                if state == "running":
                    assert c.get(sid).exec("echo b").stdout == "b\n"
                else:
                    assert state == "stopped", ours[sid]
                    # A clean stop ends what it was still creating (daemon_shutdown).
                    assert rows[sid]["end_reason"] in ("daemon_restart", "daemon_shutdown", "failed",
                                                       "agent_lost"), rows[sid]
            if isinstance(outcome.get("batch"), list):  # it finished before the daemon went
                assert {s.id for s in outcome["batch"]} <= batch_ids
            # The cut-off exec and stream got an answer or an error; the commands of a
            # crash are not rerun.
            assert "exec" in outcome and "stream" in outcome, outcome
            for sid in ours:
                c.kill(sid)
        wait_no_host_leaks(daemon.data_dir, netns)
    finally:
        if how == "term":  # back to the session's daemon, which ends its sandboxes on exit
            daemon.keep_sandboxes = False
            daemon.stop()
            daemon.start()


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
