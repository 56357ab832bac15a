"""The SDK's Trajectory and log calls: step keys, the requests they build, the answers
they parse (against the fake daemon and pure functions; the real daemon's behaviour is in
tests/integration/test_trajectory.py)."""
import asyncio
import base64
import inspect
import json

import pytest

import tidepool
from tidepool import _api
from tidepool.models import parse_answer, parse_log, parse_replay


def keys(fake):
    return [r.headers.get("idempotency-key") for r in fake.requests if r.method != "GET"]


def test_steps_are_numbered_from_the_trajectory_id(fake, client):
    sb = client.create(ttl=60)
    traj = tidepool.Trajectory(sb, "run7/r3")
    traj.exec("echo a")
    traj.write("/x", "data")
    traj.mkdir("/d", parents=True)
    traj.remove("/x")
    p = traj.start("sleep 1")
    try:
        traj.wait(p, timeout=0.01)
    except tidepool.Timeout:
        pass  # the fake's process runs on; the call was step 6 all the same
    traj.kill(p)
    assert traj.step == 7
    assert keys(fake)[-7:] == [f"run7/r3/{i}" for i in range(1, 8)]
    # A trainer that comes back re-runs its code with the same id: the same keys again.
    again = tidepool.Trajectory(sb, "run7/r3")
    again.exec("echo a")
    assert keys(fake)[-1] == "run7/r3/1"
    # From a step on (a branch continues after its step k).
    later = tidepool.Trajectory(sb, "b", start=4)
    later.exec("true")
    assert keys(fake)[-1] == "b/5" and later.key(2) == "b/2" and later.prefix == "b/"


def test_create_is_keyed_so_a_restarted_trainer_gets_its_sandbox_back(fake, client):
    traj = tidepool.Trajectory.create(client, "t9", ttl=60)
    assert keys(fake)[-1] == "t9/sandbox" and traj.sandbox.state == "running"


def test_bad_trajectory_ids_and_steps():
    for bad in ("", "has space", "x" * 151, None):
        with pytest.raises(ValueError):
            tidepool.Trajectory(object(), bad)
    with pytest.raises(ValueError):
        tidepool.Trajectory(object(), "t", start=-1)
    t = tidepool.Trajectory(object(), "t")
    with pytest.raises(ValueError):
        t._branch_request(0, "b")


def test_async_trajectory_numbers_the_same_and_has_the_same_methods(fake):
    sync_names = {n for n, v in vars(tidepool.Trajectory).items() if not n.startswith("_") and callable(v)}
    async_names = {n for n, v in vars(tidepool.AsyncTrajectory).items() if not n.startswith("_") and callable(v)}
    assert sync_names <= async_names | {"create"}, sync_names - async_names
    for n in sync_names - {"create"}:
        assert list(inspect.signature(getattr(tidepool.Trajectory, n)).parameters) == \
            list(inspect.signature(getattr(tidepool.AsyncTrajectory, n)).parameters), n

    async def main():
        async with tidepool.AsyncClient(fake.url, timeout=10) as c:
            sb = await c.create(ttl=60)
            traj = tidepool.Trajectory(sb, "a1")  # an asyncio sandbox: an AsyncTrajectory
            assert isinstance(traj, tidepool.AsyncTrajectory)
            await traj.exec("echo a")
            await traj.write("/x", "d")
            assert traj.step == 2

    asyncio.run(main())
    assert keys(fake)[-2:] == ["a1/1", "a1/2"]


def test_log_and_replay_requests():
    r = _api.log_("n0-abc", after=5, limit=10, output=True)
    assert (r.method, r.path, r.query) == ("GET", "/v1/sandboxes/n0-abc/log",
                                           [("after", "5"), ("limit", "10"), ("output", "true")])
    f = _api.log_("n0-abc", follow=True)
    assert ("follow", "true") in f.query and f.timeout is None
    with pytest.raises(ValueError):
        _api.log_("n0-abc", after=-1)
    res = _api.log_result("n0-abc", "T/3")
    assert res.path == "/v1/sandboxes/n0-abc/log/result" and res.query == [("key", "T/3")]
    with pytest.raises(ValueError):
        _api.log_result("n0-abc", "")
    rp = _api.replay("n0-abc", to_key="T/3", branch=True, rekey=("T/", "B/"))
    assert rp.method == "POST" and rp.timeout is None
    assert json.loads(rp.body) == {"to_key": "T/3", "branch": True, "rekey": {"from": "T/", "to": "B/"}}
    assert json.loads(_api.replay("n0-abc", 4, keep=True).body) == {"to_step": 4, "keep": True}
    with pytest.raises(ValueError):
        _api.replay("n0-abc", to_step=0)
    t = tidepool.Trajectory(object(), "T")
    t.sandbox = type("S", (), {"id": "n0-abc"})()
    assert json.loads(t._branch_request(2, "B").body) == {
        "to_key": "T/2", "branch": True, "rekey": {"from": "T/", "to": "B/"}}
    assert json.loads(t._replay_request(3, False).body) == {"to_key": "T/3"}


def test_log_entries_reports_and_recorded_answers_parse():
    out = base64.b64encode(b"hi\n").decode()
    answer = json.dumps({"exit_code": 0, "signal": 0, "stdout": out, "stderr": ""}).encode()
    entries = parse_log({"entries": [
        {"seq": 1, "kind": "event", "event": "created", "time": "2026-01-02T03:04:05.678Z",
         "detail": {"image": "host"}},
        {"seq": 2, "kind": "call", "key": "T/1", "method": "POST", "target": "/v1/sandboxes/x/exec",
         "status": 200, "result": {"exit_code": 0}, "content_type": "application/json",
         "answer": base64.b64encode(answer).decode(), "duration_ms": 1.5}]})
    assert entries[0].event == "created" and entries[0].detail == {"image": "host"}
    assert entries[0].time.year == 2026 and entries[0].key is None
    assert entries[1].exec_result().stdout == "hi\n" and entries[1].result == {"exit_code": 0}
    stream = b"\n".join([
        json.dumps({"type": "started", "pid": 3}).encode(),
        json.dumps({"type": "stdout", "data": base64.b64encode(b"a").decode()}).encode(),
        json.dumps({"type": "exit", "exit_code": 2}).encode()])
    r = parse_answer("application/x-ndjson", stream)
    assert r.exit_code == 2 and r.stdout == "a" and r.pid == 3
    assert parse_answer("application/json", b'{"path":"/x"}') == {"path": "/x"}
    assert parse_answer("application/json", b"") is None
    rep = parse_replay({"source": "n0-a", "sandbox": {"id": "n0-b", "state": "running"}, "kept": True,
                        "to_step": 3, "replayed": 2, "skipped": [1], "matched": False, "divergences": 1,
                        "first_divergence": {"seq": 3, "key": "T/2", "call": "POST x", "field": "stdout",
                                             "recorded": "1", "replayed": "2"}, "notes": []},
                       lambda info: info)
    assert rep.sandbox.id == "n0-b" and rep.first_divergence.field == "stdout" and not rep.matched
