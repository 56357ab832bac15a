"""Templates, warm pools, jobs, pause/resume and `top` through the `tidepool` CLI (and the
SDK's job and batch calls) against the real daemon."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import uuid

import pytest

import tidepool
from tp_testlib import wait_until

BUILD = pathlib.Path(os.environ.get("TIDEPOOL_BUILD") or pathlib.Path(__file__).resolve().parents[2] / "build")
CLI = str(BUILD.resolve() / "bin" / "tidepool")
ERROR_LINE = re.compile(r"^tidepool: [^\n]+\n$")


def tp(daemon, *args, timeout=120):
    env = dict(os.environ, TIDEPOOL_URL=daemon.url)
    return subprocess.run([CLI, *args], capture_output=True, env=env, timeout=timeout, text=True)


def ok(daemon, *args):
    p = tp(daemon, *args)
    assert p.returncode == 0, f"tidepool {' '.join(args)} -> {p.returncode}: {p.stderr}"
    return p.stdout


def fails(daemon, *args, rc=1, contains=()):
    p = tp(daemon, *args)
    assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    assert ERROR_LINE.match(p.stderr), f"expected one 'tidepool: ...' line, got {p.stderr!r}"
    for c in contains:
        assert c in p.stderr, p.stderr
    return p.stderr


@pytest.fixture
def name(daemon):
    """A fresh template name, removed (with its pool) after the test."""
    n = f"t-{uuid.uuid4().hex[:8]}"
    yield n
    tp(daemon, "templates", "rm", n)


@pytest.fixture
def created(daemon, track):
    """Runs `tidepool create ...`, registers the id for the leak check, returns it."""
    ids = []

    def create(*args):
        sid = ok(daemon, "create", "--ttl", "10m", *args).strip()
        track(sid)
        ids.append(sid)
        return sid
    yield create
    for sid in ids:
        tp(daemon, "rm", sid)


def test_templates_create_replace_get_ls_rm(daemon, name):
    assert ok(daemon, "templates", "create", name, "--memory", "128M", "--cpus", "0.5", "--ttl", "5m",
              "--label", "team=rl", "--priority", "best-effort") == f"{name} 1\n"
    fails(daemon, "templates", "create", name, contains=("exists",))
    t = json.loads(ok(daemon, "templates", "get", name))
    assert (t["memory_mb"], t["cpus"], t["ttl_seconds"], t["labels"], t["priority"]) == \
        (128, 0.5, 300, {"team": "rl"}, "best-effort")
    rows = [line.split() for line in ok(daemon, "templates", "ls").splitlines()]
    assert rows[0][0] == "NAME" and any(r[0] == name and "128M" in r for r in rows[1:])
    assert name in {x["name"] for x in json.loads(ok(daemon, "templates", "ls", "--json"))}

    assert ok(daemon, "templates", "replace", name, "--memory", "256M", "--version", "1") == f"{name} 2\n"
    fails(daemon, "templates", "replace", name, "--version", "1", contains=("version 2",))
    assert json.loads(ok(daemon, "templates", "get", name))["memory_mb"] == 256
    assert json.loads(ok(daemon, "templates", "replace", name, "--json"))["version"] == 3

    assert ok(daemon, "templates", "rm", name) == f"{name}\n"
    fails(daemon, "templates", "get", name, contains=("not found",))
    fails(daemon, "templates", "rm", name, contains=("not found",))


def test_template_usage_errors_exit_2(daemon):
    fails(daemon, "templates", "create", "x", "--priority", "urgent", rc=2, contains=("--priority",))
    fails(daemon, "templates", "create", "x", "--pool-min", "3", "--pool-max", "1", rc=2, contains=("--pool-min",))
    fails(daemon, "templates", "replace", "x", "--version", "0", rc=2, contains=("--version",))
    fails(daemon, "templates", rc=2)
    fails(daemon, "templates", "create", "bad name!", rc=1)  # the daemon refuses the name


def test_create_and_run_from_a_template(daemon, name, created, client):
    ok(daemon, "templates", "create", name, "--memory", "96M", "--env", "FROM=template")
    sid = created("--template", name)
    sb = client.get(sid)
    assert (sb.memory_mb, sb.info.template, sb.env.get("FROM")) == (96, name, "template")
    sid2 = created("--template", name, "--memory", "64M")  # a flag overrides the template
    assert client.get(sid2).memory_mb == 64
    p = tp(daemon, "run", "--template", name, "--", "sh", "-c", "echo $FROM")
    assert p.returncode == 0 and p.stdout == "template\n", p.stderr


def test_unknown_template_is_one_line(daemon):
    fails(daemon, "create", "--template", "no-such-template", contains=("no-such-template", "not found"))
    fails(daemon, "run", "--template", "no-such-template", "--", "true", contains=("no-such-template",))
    fails(daemon, "create", "--step", "1", rc=2, contains=("--job",))


def test_warm_pool_hands_out_a_ready_sandbox(daemon, name, client):
    ok(daemon, "templates", "create", name, "--memory", "64M", "--pool-min", "1", "--pool-max", "1")

    def ready():
        pools = {p["template"]: p for p in json.loads(ok(daemon, "pools", "--json"))}
        return pools.get(name, {}).get("ready", 0) >= 1
    wait_until(ready, 120, 0.2, "the pool to fill")
    table = ok(daemon, "pools")
    assert table.splitlines()[0].split()[:3] == ["TEMPLATE", "READY", "CREATING"]
    assert any(line.split()[0] == name for line in table.splitlines()[1:])
    with client.create(template=name) as sb:
        assert sb.info.from_pool is True and sb.memory_mb == 64
        assert sb.exec("echo pooled").stdout == "pooled\n"
    pool = next(p for p in client.pools() if p.template == name)
    assert pool.hits >= 1
    ok(daemon, "templates", "rm", name)  # drains the pool's refill too


def test_jobs_quota_heartbeat_end(daemon, created, client):
    job = ok(daemon, "jobs", "create", "--name", "cli-run", "--lease", "2m", "--quota-sandboxes", "1").strip()
    try:
        sid = created("--job", job, "--memory", "64M")
        err = fails(daemon, "create", "--job", job, "--memory", "64M", contains=(job, "sandboxes", "quota"))
        assert "limit 1" in err
        info = json.loads(ok(daemon, "jobs", "get", job))
        assert info["use"]["sandboxes"] == 1 and info["quota"]["sandboxes"] == 1 and info["name"] == "cli-run"
        rows = [line.split() for line in ok(daemon, "jobs", "ls").splitlines()]
        assert rows[0][0] == "ID" and any(r[0] == job and "1/1" in r for r in rows[1:])
        assert ok(daemon, "jobs", "heartbeat", job) == f"{job}\n"
        assert json.loads(ok(daemon, "jobs", "heartbeat", job, "--json"))["state"] == "active"
        assert ok(daemon, "jobs", "end", job) == f"{job}\n"
        assert client.get(sid).end_reason == "job_ended"
        fails(daemon, "jobs", "heartbeat", job, contains=("ended",))
        fails(daemon, "create", "--job", job, contains=(job,))
        assert job not in {j["id"] for j in json.loads(ok(daemon, "jobs", "ls", "--json"))}
        assert job in {j["id"] for j in json.loads(ok(daemon, "jobs", "ls", "--all", "--json"))}
    finally:
        tp(daemon, "jobs", "end", job)


def test_jobs_end_step(daemon, created, client):
    job = ok(daemon, "jobs", "create").strip()
    try:
        a1 = created("--job", job, "--step", "a", "--memory", "64M")
        a2 = created("--job", job, "--step", "a", "--memory", "64M")
        b = created("--job", job, "--step", "b", "--memory", "64M")
        assert ok(daemon, "jobs", "end-step", job, "a") == "2\n"
        assert {client.get(s).end_reason for s in (a1, a2)} == {"step_ended"}
        assert client.get(b).state == "running"
        assert json.loads(ok(daemon, "jobs", "end-step", job, "a", "--json"))["reclaimed"] == 0
    finally:
        tp(daemon, "jobs", "end", job)
    fails(daemon, "jobs", "end-step", job, "b", contains=("ended",))
    fails(daemon, "jobs", "get", "no-such-job", contains=("not found",))
    fails(daemon, "jobs", "create", "--lease", "0", rc=2, contains=("--lease",))


def test_pause_and_resume(daemon, created, client):
    sid = created("--memory", "64M")
    assert ok(daemon, "pause", sid) == f"{sid}\n"
    assert client.get(sid).state == "paused"
    assert ok(daemon, "resume", sid) == f"{sid}\n"
    assert client.get(sid).state == "running"
    fails(daemon, "pause", "n0-000000000000", contains=("not found",))
    p = tp(daemon, "pause", sid, "n0-000000000000")  # one line per failure, the rest done
    assert p.returncode == 1 and p.stdout == f"{sid}\n" and ERROR_LINE.match(p.stderr)
    ok(daemon, "rm", sid)
    fails(daemon, "resume", sid)


def test_top_once(daemon, name, created):
    ok(daemon, "templates", "create", name)
    job = ok(daemon, "jobs", "create", "--name", "top-job").strip()
    try:
        created("--job", job, "--memory", "64M")
        frame = ok(daemon, "top", "--once")
        assert "\x1b" not in frame
        assert re.search(r"^Sandboxes: creating \d+  running [1-9]\d*  paused \d+", frame, re.M), frame
        assert re.search(r"^creates\s+\d+\s+-$", frame, re.M), frame  # one frame: totals, no rate
        assert re.search(rf"^{re.escape(name)}\s", frame, re.M), frame
        assert re.search(rf"^{re.escape(job)}\s+top-job\s+active\s+1\s", frame, re.M), frame
    finally:
        tp(daemon, "jobs", "end", job)
    fails(daemon, "top", "--interval", "0", rc=2, contains=("--interval",))
    fails(daemon, "top", "--once", "--url", "http://127.0.0.1:1", contains=("cannot reach",))


def test_sdk_job_step_and_streamed_batch(daemon, name, client):
    client.create_template(name, memory_mb=64)
    with client.job("sdk-run", lease=60, max_sandboxes=3, heartbeat_interval=0.2) as job:
        with job.step("1") as step:
            got = []
            for sb in step.create_batch_stream(2, template=name):
                client._registry.add(sb.id)
                client.created.append(sb.id)
                got.append(sb)
            assert len(got) == 2 and all(sb.info.job == job.id and sb.info.step == "1" for sb in got)
            with pytest.raises(tidepool.QuotaExceeded) as ei:
                job.create_batch(2, template=name, gang=True)
            assert "quota" in ei.value.message
        assert step.reclaimed == 2
        assert {client.get(sb.id).end_reason for sb in got} == {"step_ended"}
        assert job.refresh().use["sandboxes"] == 0
        assert job.heartbeating
    assert not job.heartbeating and client.get_job(job.id).state == "ended"
