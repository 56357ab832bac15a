"""Templates, pools, jobs (heartbeats, steps, quotas), batches (gang, streamed) and
pause/resume, sync and asyncio, against the fake daemon."""
import asyncio
import json
import threading

import pytest

import tidepool
from tidepool.models import BatchStreamParser


def requests_to(fake, prefix, method=None):
    return [r for r in fake.requests if r.path.startswith(prefix) and (method is None or r.method == method)]


def wait_heartbeats(fake, job_id, n):
    """Waits (bounded, not timed) until the fake saw n heartbeats of job_id."""
    with fake.cond:
        ok = fake.cond.wait_for(
            lambda: len(requests_to(fake, f"/v1/jobs/{job_id}/heartbeat")) >= n, timeout=30)
    assert ok, "the background heartbeats never came"


# -- templates and pools -------------------------------------------------------------


def test_template_create_sends_the_spec_and_parses_the_answer(client, fake):
    t = client.create_template("py", image="host", memory_mb=256, cpus=0.5, ttl=90.5, env={"A": "1"},
                               priority="best-effort", pool_min=2, pool_max=8)
    req = fake.requests[-1]
    assert (req.method, req.path) == ("POST", "/v1/templates")
    assert req.json() == {"name": "py", "image": "host", "memory_mb": 256, "cpus": 0.5, "ttl_seconds": 91,
                          "env": {"A": "1"}, "priority": "best-effort", "pool_min": 2, "pool_max": 8}
    assert isinstance(t, tidepool.Template)
    assert (t.name, t.version, t.pool_min, t.pool_max, t.priority) == ("py", 1, 2, 8, "best-effort")
    assert isinstance(t.pool, tidepool.Pool) and t.pool.template == "py"
    assert t.created_at is not None
    with pytest.raises(tidepool.Conflict):
        client.create_template("py")


def test_put_get_list_delete_template(client, fake):
    t = client.put_template("a/b", memory_mb=128)
    assert fake.requests[-1].method == "PUT" and fake.requests[-1].path == "/v1/templates/a%2Fb"
    assert "version" not in fake.requests[-1].json()
    t2 = client.put_template("a/b", version=t.version, memory_mb=256)
    assert fake.requests[-1].json()["version"] == 1 and t2.version == 2 and t2.memory_mb == 256
    with pytest.raises(tidepool.Conflict) as ei:
        client.put_template("a/b", version=1)
    assert "version 2" in ei.value.message
    assert client.get_template("a/b").memory_mb == 256
    assert [x.name for x in client.list_templates()] == ["a/b"]
    assert client.delete_template("a/b").name == "a/b"
    with pytest.raises(tidepool.NotFound):
        client.get_template("a/b")
    with pytest.raises(tidepool.NotFound):
        client.delete_template("a/b")


def test_template_arguments_are_checked_before_sending(client, fake):
    n = len(fake.requests)
    with pytest.raises(ValueError):
        client.create_template("")
    with pytest.raises(ValueError):
        client.create_template("x", priority="urgent")
    with pytest.raises(TypeError):
        client.create_template("x", pool_max="8")
    with pytest.raises(TypeError):
        client.create_template("x", flavour="mint")  # not a field
    with pytest.raises(ValueError):
        client.create_template("x", version=3)  # a version is for put_template
    assert len(fake.requests) == n


def test_pools_are_parsed(client, fake):
    client.create_template("py", pool_min=1, pool_max=4)
    fake.pool_ready["py"] = 1
    [p] = client.pools()
    assert fake.requests[-1].path == "/v1/pools"
    assert (p.template, p.ready, p.min, p.max, p.hits, p.misses) == ("py", 1, 1, 4, 3, 1)
    assert p.hit_rate == 0.75 and p.cold_create_seconds == 0.2 and p.raw["rate_per_second"] == 0.5


# -- creates with a template, job, step and priority ---------------------------------


def test_create_from_template_leaves_its_fields_to_the_daemon(client, fake):
    client.create_template("py", memory_mb=256, pool_max=2)
    fake.pool_ready["py"] = 1
    sb = client.create(template="py", priority="best-effort")
    assert fake.requests[-1].json() == {"template": "py", "priority": "best-effort"}
    assert sb.info.from_pool is True and sb.memory_mb == 256 and sb.info.template == "py"
    cold = client.create(template="py", image="host")
    assert fake.requests[-1].json() == {"image": "host", "template": "py"}
    assert cold.info.from_pool is False
    plain = client.create()
    assert fake.requests[-1].json() == {"image": "host", "tier": "container"}
    assert plain.info.from_pool is False


def test_unknown_template_is_not_found(client):
    with pytest.raises(tidepool.NotFound) as ei:
        client.create(template="nope")
    assert "nope" in ei.value.message


def test_create_checks_priority_and_step(client, fake):
    n = len(fake.requests)
    with pytest.raises(ValueError):
        client.create(priority="urgent")
    with pytest.raises(ValueError):
        client.create(step="1")  # a step needs a job
    assert len(fake.requests) == n


# -- batches: gang and streamed ------------------------------------------------------


def test_gang_batch_raises_the_first_failure(client, fake):
    fake.batch_fail = {2}
    with pytest.raises(tidepool.QuotaExceeded) as ei:
        client.create_batch(4, template=None, gang=True, ttl=60)
    assert fake.requests[-1].json()["gang"] is True
    assert "gang batch" in ei.value.message
    assert all(s["state"] == "stopped" for s in fake.sandboxes.values())  # all released
    res = client.create_batch(4)
    assert "gang" not in fake.requests[-1].json() and len(res) == 3 and res.errors[0].index == 2


def test_batch_stream_yields_sandboxes_as_they_come(client, fake):
    client.create_template("py", pool_max=4)
    fake.pool_ready["py"] = 2
    fake.batch_fail = {3}
    stream = client.create_batch_stream(5, template="py", labels={"run": "r"})
    assert isinstance(stream, tidepool.BatchStream)
    assert not requests_to(fake, "/v1/sandboxes/batch")  # nothing sent before iterating
    got = []
    with stream:
        for sb in stream:
            assert isinstance(sb, tidepool.Sandbox) and sb.state == "running"
            got.append(sb)
        req = fake.requests[-1]
        assert req.json() == {"template": "py", "labels": {"run": "r"}, "count": 5, "stream": True}
        assert "application/x-ndjson" in req.headers["accept"]
        assert len(got) == 4 and stream.sandboxes == got
        assert [i.from_pool for i in stream.items if i.sandbox][:2] == [True, True]  # pooled first
        assert stream.from_pool == 2
        assert stream.errors == [(3, "resource_exhausted", "no room")]
        assert stream.summary["created"] == 4 and not stream.ok
        assert isinstance(stream.items[-1].error, tidepool.QuotaExceeded) or stream.items[-1].sandbox
    # Leaving the with block killed every sandbox it yielded.
    assert all(fake.sandboxes[sb.id]["state"] == "stopped" for sb in got)
    with pytest.raises(RuntimeError):
        list(stream)  # a stream is iterated once


def test_gang_batch_stream_raises_with_the_released_ids(client, fake):
    fake.batch_fail = {1}
    stream = client.create_batch_stream(3, gang=True)
    seen = []
    with pytest.raises(tidepool.QuotaExceeded) as ei:
        for sb in stream:
            seen.append(sb.id)
    assert sorted(ei.value.released) == sorted(seen) and len(seen) == 2
    assert fake.requests[-1].json()["gang"] is True


def test_batch_stream_parser_rejects_broken_streams():
    p = BatchStreamParser(lambda info: info)
    assert p.feed(b"\n") is None
    item = p.feed(b'{"index": 4, "error": {"code": "not_found", "message": "template x"}}\n')
    assert item.index == 4 and isinstance(item.error, tidepool.NotFound)
    item = p.feed(b'{"index": 0, "sandbox": {"id": "n0-1", "state": "running"}, "from_pool": true}')
    assert item.sandbox.id == "n0-1" and item.sandbox.from_pool is True
    with pytest.raises(tidepool.SandboxError):
        p.feed(b"not json")
    with pytest.raises(tidepool.SandboxError):
        p.feed(b'{"index": 1}')
    assert isinstance(p.missing_done(), tidepool.SandboxError)
    assert p.feed(b'{"done": true, "ok": true, "created": 1}') is None and p.done["created"] == 1


def test_batch_stream_cut_before_its_summary_is_an_error(client, fake, monkeypatch):
    import tidepool.client as tc

    stream = client.create_batch_stream(2)
    real = tc.BatchStream._take

    def take(self, line):
        if b'"done"' in line:
            return None  # as if the summary line never came
        return real(self, line)

    monkeypatch.setattr(tc.BatchStream, "_take", take)
    with pytest.raises(tidepool.SandboxError) as ei:
        with stream:
            list(stream)
    assert "summary" in ei.value.message


# -- jobs ------------------------------------------------------------------------------


def test_job_context_creates_heartbeats_and_ends(client, fake):
    job = client.job("run7", lease=30, grace=5, max_sandboxes=4, max_memory_mb=4096, max_cpus=2.5,
                     labels={"team": "rl"}, heartbeat_interval=0.01)
    assert not requests_to(fake, "/v1/jobs")  # created on entering
    with pytest.raises(RuntimeError):
        job.id
    with job:
        create = requests_to(fake, "/v1/jobs", "POST")[0]
        assert create.json() == {"name": "run7", "lease_seconds": 30, "grace_seconds": 5,
                                 "quota": {"sandboxes": 4, "memory_mb": 4096, "cpus": 2.5},
                                 "labels": {"team": "rl"}}
        assert job.id.startswith("job-") and job.heartbeating
        wait_heartbeats(fake, job.id, 3)
        sb = job.create(memory_mb=64)
        assert requests_to(fake, "/v1/sandboxes", "POST")[-1].json() == {"image": "host", "tier": "container",
                                                                           "memory_mb": 64, "job": job.id}
        assert "idempotency-key" not in requests_to(fake, f"/v1/jobs/{job.id}/heartbeat")[0].headers
    assert not job.heartbeating
    beats = len(requests_to(fake, f"/v1/jobs/{job.id}/heartbeat"))
    job_requests = requests_to(fake, f"/v1/jobs/{job.id}")
    assert (job_requests[-1].method, job_requests[-1].path) == ("DELETE", f"/v1/jobs/{job.id}")
    assert job.info.state == "ended" and job.heartbeats >= 2  # 3 sent: 2 answered before the exit
    assert fake.sandboxes[sb.id]["end_reason"] == "job_ended"
    # Nothing more is sent after the exit: the thread is gone.
    assert len(requests_to(fake, f"/v1/jobs/{job.id}/heartbeat")) == beats
    assert job.end() is job.info  # ending again sends nothing
    assert len(requests_to(fake, f"/v1/jobs/{job.id}", "DELETE")) == 1


def test_default_heartbeat_interval_is_a_fraction_of_the_lease(client):
    job = client.job(lease=30)
    assert job.heartbeat_interval == 20  # lease unknown before the create: the default 60
    with job:
        assert job.heartbeat_interval == 10
    with pytest.raises(ValueError):
        client.job(heartbeat_interval=0)


def test_heartbeat_stops_when_the_job_is_gone_and_keeps_going_otherwise(client, fake):
    fake.heartbeat_fail = [(500, "internal")]
    with client.job(heartbeat_interval=0.01) as job:
        wait_heartbeats(fake, job.id, 3)
        assert isinstance(job.heartbeat_error, tidepool.SandboxError) and job.heartbeating
        fake.heartbeat_fail = [(409, "conflict")]
        job._thread.join(timeout=30)
        assert not job.heartbeating and isinstance(job.heartbeat_error, tidepool.Conflict)


def test_job_exit_ends_it_on_an_exception_too(client, fake):
    with pytest.raises(ZeroDivisionError):
        with client.job(heartbeat_interval=60) as job:
            1 / 0
    assert job.info.state == "ended" and not job.heartbeating


def test_quota_refusal_names_the_quota(client, fake):
    with client.job(max_sandboxes=1, heartbeat_interval=60) as job:
        job.create()
        with pytest.raises(tidepool.QuotaExceeded) as ei:
            job.create()
        assert "quota sandboxes" in ei.value.message and ei.value.status == 429
        info = job.refresh()
        assert info.use["sandboxes"] == 1 and info.quota["sandboxes"] == 1
        assert [j.id for j in client.list_jobs()] == [job.id]
        assert client.get_job(job.id).use["sandboxes"] == 1
    assert client.list_jobs() == [] and [j.id for j in client.list_jobs(all=True)] == [job.id]
    with pytest.raises(tidepool.NotFound):
        client.create(job=job.id)  # an ended job takes no more


def test_step_exit_ends_the_step(client, fake):
    with client.job(heartbeat_interval=60) as job:
        other = job.create()
        with job.step("s/1") as step:
            a = step.create()
            b = step.create_batch(2)
            assert fake.requests[-1].json()["step"] == "s/1" and fake.requests[-1].json()["job"] == job.id
            assert a.info.step == "s/1"
        end = fake.requests[-1]
        assert (end.method, end.path) == ("DELETE", f"/v1/jobs/{job.id}/steps/s%2F1")
        assert step.reclaimed == 3
        assert fake.sandboxes[a.id]["end_reason"] == "step_ended"
        assert all(fake.sandboxes[s.id]["state"] == "stopped" for s in b)
        assert fake.sandboxes[other.id]["state"] == "running"  # not of the step
        with pytest.raises(KeyError):
            with job.step("2") as s2:
                s2.create()
                raise KeyError("body")
        assert s2.reclaimed == 1
        assert job.end_step("never-used") == 0
        with pytest.raises(TypeError):
            job.create(job="other")


# -- pause and resume ----------------------------------------------------------------


def test_pause_and_resume(client, fake):
    sb = client.create()
    assert sb.pause() is sb and sb.state == "paused"
    assert fake.requests[-1].path == f"/v1/sandboxes/{sb.id}/pause"
    assert sb.resume().state == "running"
    assert fake.requests[-1].path == f"/v1/sandboxes/{sb.id}/resume"
    sb.kill()
    with pytest.raises(tidepool.Conflict):
        sb.pause()
    with pytest.raises(tidepool.Conflict):
        sb.resume()


# -- asyncio ---------------------------------------------------------------------------


def test_async_job_step_stream_and_pause(fake):
    async def main():
        async with tidepool.AsyncClient(fake.url, timeout=10) as client:
            await client.create_template("py", pool_max=2)
            fake.pool_ready["py"] = 1
            sb = await client.create(template="py")
            assert sb.info.from_pool is True
            assert (await sb.pause()).state == "paused" and (await sb.resume()).state == "running"
            assert [p.template for p in await client.pools()] == ["py"]
            assert [t.name for t in await client.list_templates()] == ["py"]
            async with client.job("a", heartbeat_interval=0.01) as job:
                assert isinstance(job, tidepool.AsyncJob) and job.heartbeating
                while job.heartbeats < 2:
                    await asyncio.sleep(0.01)
                async with job.step("1") as step:
                    got = []
                    async with step.create_batch_stream(3) as stream:
                        async for s in stream:
                            got.append(s)
                        assert len(got) == 3 and stream.ok
                        assert requests_to(fake, "/v1/sandboxes/batch")[-1].json()["step"] == "1"
                    s1 = await step.create()
                assert step.reclaimed == 1 and fake.sandboxes[s1.id]["end_reason"] == "step_ended"
                assert all(fake.sandboxes[s.id]["state"] == "stopped" for s in got)
            assert not job.heartbeating and job.info.state == "ended"
            beats = len(requests_to(fake, f"/v1/jobs/{job.id}/heartbeat"))
            await asyncio.sleep(0.05)
            assert len(requests_to(fake, f"/v1/jobs/{job.id}/heartbeat")) == beats
            fake.batch_fail = {0}
            with pytest.raises(tidepool.QuotaExceeded):
                await client.create_batch(2, gang=True)
            with pytest.raises(tidepool.QuotaExceeded) as ei:
                async for _ in client.create_batch_stream(2, gang=True):
                    pass
            assert len(ei.value.released) == 1

    asyncio.run(main())


def test_async_job_ends_when_the_body_is_cancelled(fake):
    async def main():
        async with tidepool.AsyncClient(fake.url, timeout=10) as client:
            job = client.job(heartbeat_interval=60)
            started = asyncio.Event()

            async def body():
                async with job:
                    started.set()
                    await asyncio.sleep(3600)

            task = asyncio.ensure_future(body())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert job.info.state == "ended" and not job.heartbeating

    asyncio.run(main())
