"""More of issue 13 against a real daemon: a batch served from a warm pool, a streamed
batch that delivers items before it completes, the SDK's background heartbeat, an exec
that resumes a sandbox of a still-lapsed job, and the pool, pause and job series of
/metrics. (test_pools_jobs.py has the first round.)"""
import datetime
import http.client
import json
import re
import time
import uuid

import pytest

from pools_lib import call, freezer_state, job, ok, pool, sh  # noqa: F401 (job: a fixture)
from tp_testlib import api_call, wait_until


# -- helpers ----------------------------------------------------------------------


def pool_full(daemon, name, size):
    p = pool(daemon, name)
    return p if p and p["ready"] == size and p["creating"] == 0 else None


def uid():
    return uuid.uuid4().hex[:8]


def state_of(daemon, sid):
    return ok(daemon, "GET", f"/v1/sandboxes/{sid}")["state"]


def job_state(daemon, jid):
    return ok(daemon, "GET", f"/v1/jobs/{jid}")["state"]


def delete_all(daemon, ids):
    for sid in ids:
        call(daemon, "DELETE", f"/v1/sandboxes/{sid}")


@pytest.fixture
def template(daemon):
    """Templates made by the test, deleted (their pools drained) afterwards."""
    made = []

    def make(**fields):
        t = ok(daemon, "POST", "/v1/templates", {"name": "it-" + uid(), **fields})
        made.append(t["name"])
        return t
    yield make
    for n in made:
        call(daemon, "DELETE", f"/v1/templates/{n}")
    wait_until(lambda: all(pool(daemon, n) is None for n in made), 30, what="pools gone")


class BatchStream:
    """A streamed (NDJSON) batch read line by line as the daemon writes it."""

    def __init__(self, daemon, body):
        self.conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=300)
        self.conn.request("POST", "/v1/sandboxes/batch", body=json.dumps({**body, "stream": True}),
                          headers={"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.read()
        assert self.resp.getheader("Content-Type", "").startswith("application/x-ndjson")

    def next_line(self):
        raw = self.resp.readline()
        return json.loads(raw) if raw.strip() else None

    def rest(self):
        out = []
        while (line := self.next_line()) is not None:
            out.append(line)
        return out

    def close(self):
        self.conn.close()


# -- /metrics ------------------------------------------------------------------------


def metrics(daemon):
    st, headers, raw = api_call(daemon, "GET", "/metrics")
    assert st == 200 and headers["content-type"].startswith("text/plain")
    return raw.decode()


def series(text, name, **labels):
    """The value of one series (None when it is not there): the line of `name` whose labels
    are exactly `labels`."""
    want = {k: str(v) for k, v in labels.items()}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{([^}]*)\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if got == want:
            return float(m.group(3))
    return None


def has_type(text, name, kind):
    return f"# TYPE {name} {kind}" in text


# -- 1. a batch served from a warm pool ----------------------------------------------


def test_a_batch_larger_than_its_pool_is_served_from_the_pool_first_then_cold(daemon, track, template):
    size, count = 3, 7
    # A shape of its own (72 MiB): no other request of the suite matches this pool.
    t = template(memory_mb=72, pool_min=size, pool_max=size)
    wait_until(lambda: pool_full(daemon, t["name"], size), 60, what="pool filled")
    # Use the pool first, leaving a mark in each sandbox handed out: none may come back.
    used = set()
    for _ in range(2):
        st, headers, sb = call(daemon, "POST", "/v1/sandboxes", {"template": t["name"]})
        assert st == 201 and headers.get("tidepool-from-pool") == "true", sb
        track(sb["id"])
        used.add(sb["id"])
        assert sh(daemon, sb["id"], "echo used > /tmp/used-by-a-client")[0] == 0
        ok(daemon, "DELETE", f"/v1/sandboxes/{sb['id']}")
    wait_until(lambda: pool_full(daemon, t["name"], size), 60, what="pool refilled")
    before = pool(daemon, t["name"])
    tag = uid()

    b = BatchStream(daemon, {"count": count, "template": t["name"], "labels": {"batch": tag}})
    try:
        lines = b.rest()
    finally:
        b.close()
    items, done = lines[:-1], lines[-1]
    ids = [i["sandbox"]["id"] for i in items if "sandbox" in i]
    for sid in ids:
        track(sid)
    try:
        assert sorted(i["index"] for i in items) == list(range(count)), "every item reported once"
        assert [i for i in items if "sandbox" not in i] == [], "no item failed"
        pooled = {i["index"] for i in items if i["from_pool"]}
        # The pool is asked first: the first items are its (a refill that finished
        # meanwhile may serve one more); the rest, beyond what the pool held, are cold.
        assert set(range(size)) <= pooled, f"items from the pool: {sorted(pooled)}"
        assert len(pooled) < count, "some items must have been created cold"
        assert done == {"done": True, "ok": True, "created": count, "from_pool": len(pooled), "failed": 0}
        after = pool(daemon, t["name"])
        assert after["hits"] - before["hits"] == len(pooled)
        assert after["misses"] - before["misses"] == count - len(pooled)
        # Never a used sandbox: distinct, new ids, every one the client's (listed, with
        # the batch's label and the template's shape), each with an empty /tmp.
        assert len(set(ids)) == count and not set(ids) & used
        listed = ok(daemon, "GET", f"/v1/sandboxes?label=batch={tag}")["sandboxes"]
        assert sorted(s["id"] for s in listed) == sorted(ids)
        assert all(s["template"] == t["name"] and s["memory_mb"] == 72 and s["state"] == "running"
                   for s in listed)
        for sid in ids:
            code, out, err = sh(daemon, sid, "ls -A /tmp")
            assert code == 0 and out == "", f"{sid} has a used /tmp: {out!r} {err!r}"
        # A plain (not streamed) batch says how many came from the pool, too.
        wait_until(lambda: pool_full(daemon, t["name"], size), 60, what="pool refilled after the batch")
        r = ok(daemon, "POST", "/v1/sandboxes/batch", {"count": size + 1, "template": t["name"]})
        plain = [s["id"] for s in r["sandboxes"]]
        for sid in plain:
            track(sid)
        ids += plain
        assert r["errors"] == [] and len(plain) == size + 1
        assert size <= r["from_pool"] <= size + 1
        assert len(set(ids)) == len(ids) and not set(ids) & used
    finally:
        delete_all(daemon, ids)


# -- 2. a streamed batch delivers items before it completes -----------------------------


def ready_at(daemon, sid):
    """When the sandbox became ready: its log's "created" event (unix seconds, ms precision)."""
    entries = ok(daemon, "GET", f"/v1/sandboxes/{sid}/log")["entries"]
    created = [e for e in entries if e.get("event") == "created"]
    assert created, entries
    return datetime.datetime.fromisoformat(created[0]["time"].replace("Z", "+00:00")).timestamp()


def test_a_streamed_batch_delivers_its_first_item_while_later_ones_are_still_being_created(daemon, track, template):
    # One sandbox from a warm pool (handed out at once), the rest made cold: the first
    # item is ready long before the last, whatever the machine's load.
    count, tag = 12, uid()
    t = template(memory_mb=40, pool_min=1, pool_max=1)  # a shape of its own
    wait_until(lambda: pool_full(daemon, t["name"], 1), 60, what="pool filled")
    b = BatchStream(daemon, {"count": count, "template": t["name"], "labels": {"batch": tag}})
    ids = []
    try:
        first = b.next_line()
        # When the first item reached the client (the daemon's clock is this host's).
        received = time.time()
        assert first is not None and "sandbox" in first, first
        ids.append(first["sandbox"]["id"])
        track(first["sandbox"]["id"])
        assert first.get("from_pool") is True, first
        # The first sandbox is usable while the batch goes on.
        code, out, _ = sh(daemon, first["sandbox"]["id"], "echo first")
        assert code == 0 and out == "first\n"
        lines = b.rest()
    finally:
        b.close()
        # Whatever happened, nothing of the batch outlives the test.
        for sb in ok(daemon, "GET", f"/v1/sandboxes?label=batch={tag}")["sandboxes"]:
            track(sb["id"])
    items, done = lines[:-1], lines[-1]
    later = [i["sandbox"]["id"] for i in items if "sandbox" in i]
    for sid in later:
        track(sid)
    ids += later
    try:
        assert done["done"] is True and done["ok"] is True and done["created"] == count
        assert sorted([first["index"]] + [i["index"] for i in items]) == list(range(count))
        assert len(set(ids)) == count
        # The first item was in the client's hands before the last sandbox of the batch
        # was ready (its created event): a daemon that answered once all were made could
        # not do that, however fast or slow either side runs.
        last_ready = max(ready_at(daemon, sid) for sid in later)
        assert received < last_ready, (received, last_ready)
    finally:
        delete_all(daemon, ids)


# -- 3. the SDK's heartbeat keeps a short lease alive ---------------------------------


def test_the_sdk_heartbeat_keeps_a_short_lease_alive_while_a_job_without_one_is_paused(daemon, client, track, job):
    lease = 3
    # The control: the same short lease, no heartbeat.
    bare = job(lease_seconds=lease, grace_seconds=600)
    st, _, control = call(daemon, "POST", "/v1/sandboxes", {"memory_mb": 64, "job": bare["id"]})
    assert st == 201, control
    track(control["id"])
    with client.job(name="heartbeat-" + uid(), lease=lease, grace=600) as j:
        assert j.heartbeating and j.heartbeat_interval < lease
        sb = j.create(memory_mb=64)
        assert sb.exec("echo hi").stdout == "hi\n"

        def kept_alive():
            got = ok(daemon, "GET", f"/v1/jobs/{j.id}")
            st = state_of(daemon, sb.id)
            assert got["state"] == "active" and "lapsed_at" not in got, got
            assert st == "running", f"the heartbeated job's sandbox is {st}"
            assert got["use"]["paused"] == 0

        # The job without heartbeats lapses and its sandbox is paused...
        t0 = time.monotonic()

        def control_paused():
            kept_alive()
            return job_state(daemon, bare["id"]) == "lapsed" and state_of(daemon, control["id"]) == "paused"
        wait_until(control_paused, 60, interval=0.2, what="the job without heartbeats paused")
        assert freezer_state(control["id"]) in ("FROZEN", "1")
        # ...while the heartbeated one stays active for several more lease periods.
        wait_until(lambda: kept_alive() or time.monotonic() - t0 > 4 * lease, 60, interval=0.2,
                   what="four lease periods")
        kept_alive()
        assert freezer_state(sb.id) in ("THAWED", "0")
        assert j.heartbeat_error is None
        assert j.heartbeats >= 3, f"{j.heartbeats} heartbeats in four lease periods"
        # Still usable, without a resume on the way.
        resumes = series(metrics(daemon), "tidepool_sandbox_resumes_total")
        assert sb.exec("echo still").stdout == "still\n"
        assert series(metrics(daemon), "tidepool_sandbox_resumes_total") == resumes
    # Leaving the block stopped the heartbeats and ended the job with its sandbox.
    assert not j.heartbeating
    assert ok(daemon, "GET", f"/v1/jobs/{j.id}")["state"] == "ended"
    wait_until(lambda: state_of(daemon, sb.id) == "stopped", 30, what="the job's sandbox removed")
    assert ok(daemon, "GET", f"/v1/sandboxes/{sb.id}")["end_reason"] == "job_ended"


# -- 4. an exec resumes a sandbox of a still-lapsed job --------------------------------


def test_an_exec_to_a_sandbox_of_a_still_lapsed_job_resumes_it_with_files_and_processes(daemon, track, job):
    j = job(lease_seconds=2, grace_seconds=600)
    st, _, sb = call(daemon, "POST", "/v1/sandboxes", {"memory_mb": 64, "job": j["id"]})
    assert st == 201, sb
    sid = sb["id"]
    track(sid)
    assert sh(daemon, sid, "echo kept > /tmp/file")[0] == 0
    proc = ok(daemon, "POST", f"/v1/sandboxes/{sid}/processes",
              {"cmd": ["sh", "-c", "while :; do echo t >> /tmp/ticks; sleep 0.05; done"]})
    wait_until(lambda: job_state(daemon, j["id"]) == "lapsed", 30, what="lease lapsed")
    wait_until(lambda: state_of(daemon, sid) == "paused", 30, what="paused")
    assert freezer_state(sid) in ("FROZEN", "1")
    resumes = series(metrics(daemon), "tidepool_sandbox_resumes_total")
    # No heartbeat: the job stays lapsed, and the exec itself resumes the sandbox.
    code, out, err = sh(daemon, sid, "cat /tmp/file; wc -l < /tmp/ticks")
    assert code == 0, err
    assert out.splitlines()[0] == "kept"
    ticks = int(out.splitlines()[1])
    assert ticks > 0
    assert series(metrics(daemon), "tidepool_sandbox_resumes_total") == resumes + 1
    assert state_of(daemon, sid) == "running"
    assert freezer_state(sid) in ("THAWED", "0")
    got = ok(daemon, "GET", f"/v1/jobs/{j['id']}")
    assert got["state"] == "lapsed", "an exec is not a heartbeat"
    assert got["use"]["paused"] == 0 and got["use"]["sandboxes"] == 1
    # The background process was frozen, not killed: it runs on.
    assert ok(daemon, "GET", f"/v1/sandboxes/{sid}/processes/{proc['pid']}")["state"] == "running"
    wait_until(lambda: int(sh(daemon, sid, "wc -l < /tmp/ticks")[1]) > ticks, 30, what="the process runs on")
    # The lapsed job still takes no new sandbox; the resumed one is not paused again.
    st, _, e = call(daemon, "POST", "/v1/sandboxes", {"memory_mb": 64, "job": j["id"]})
    assert st == 409 and "lapsed" in e["message"], e
    assert state_of(daemon, sid) == "running"
    ok(daemon, "DELETE", f"/v1/jobs/{j['id']}")
    wait_until(lambda: state_of(daemon, sid) == "stopped", 30, what="job ended")
    assert ok(daemon, "GET", f"/v1/sandboxes/{sid}")["end_reason"] == "job_ended"


# -- 5. /metrics: pools, histograms, paused count, jobs -------------------------------


def test_metrics_report_pools_acquire_and_create_times_paused_count_and_job_use(daemon, track, template, job):
    size, count = 2, 3
    t = template(memory_mb=80, pool_min=size, pool_max=size)
    j = job(quota={"sandboxes": 5, "memory_mb": 400, "cpus": 3})
    wait_until(lambda: pool_full(daemon, t["name"], size), 60, what="pool filled")
    m0 = metrics(daemon)
    for name, kind in (("tidepool_pool_ready", "gauge"), ("tidepool_pool_target", "gauge"),
                       ("tidepool_pool_hits_total", "counter"), ("tidepool_pool_misses_total", "counter"),
                       ("tidepool_pool_acquire_seconds", "histogram"),
                       ("tidepool_sandbox_create_duration_seconds", "histogram"),
                       ("tidepool_sandboxes", "gauge"), ("tidepool_job_sandboxes", "gauge"),
                       ("tidepool_job_memory_mb", "gauge"), ("tidepool_job_quota", "gauge")):
        assert has_type(m0, name, kind), f"no '# TYPE {name} {kind}' in /metrics"
    tl = {"template": t["name"]}
    assert series(m0, "tidepool_pool_ready", **tl) == size
    assert series(m0, "tidepool_pool_target", **tl) == size
    hits0 = series(m0, "tidepool_pool_hits_total", **tl)
    misses0 = series(m0, "tidepool_pool_misses_total", **tl)
    acquired0 = series(m0, "tidepool_pool_acquire_seconds_count")
    created0 = series(m0, "tidepool_sandbox_create_duration_seconds_count")
    paused0 = series(m0, "tidepool_sandboxes", state="paused")
    assert None not in (hits0, misses0, acquired0, created0, paused0)
    jl = {"job": j["id"]}
    assert series(m0, "tidepool_job_sandboxes", **jl) == 0
    assert series(m0, "tidepool_job_memory_mb", **jl) == 0
    assert series(m0, "tidepool_job_quota", quota="sandboxes", **jl) == 5
    assert series(m0, "tidepool_job_quota", quota="memory_mb", **jl) == 400
    assert series(m0, "tidepool_job_quota", quota="cpus", **jl) == 3

    # A batch of the template in the job, larger than the pool.
    r = ok(daemon, "POST", "/v1/sandboxes/batch", {"count": count, "template": t["name"], "job": j["id"]})
    ids = [s["id"] for s in r["sandboxes"]]
    for sid in ids:
        track(sid)
    try:
        assert r["errors"] == [] and len(ids) == count
        pooled = r["from_pool"]
        assert size <= pooled < count
        m1 = metrics(daemon)
        assert series(m1, "tidepool_pool_hits_total", **tl) == hits0 + pooled
        assert series(m1, "tidepool_pool_misses_total", **tl) == misses0 + count - pooled
        assert series(m1, "tidepool_pool_acquire_seconds_count") == acquired0 + pooled
        assert series(m1, "tidepool_pool_acquire_seconds_bucket", le="+Inf") == acquired0 + pooled
        # Every cold create is timed (refills of the pool too, hence at least).
        assert series(m1, "tidepool_sandbox_create_duration_seconds_count") >= created0 + count - pooled
        assert series(m1, "tidepool_job_sandboxes", **jl) == count
        assert series(m1, "tidepool_job_memory_mb", **jl) == 80 * count
        # The pool refills to its target, and the gauges follow.
        wait_until(lambda: pool_full(daemon, t["name"], size), 60, what="pool refilled")
        m2 = metrics(daemon)
        assert series(m2, "tidepool_pool_ready", **tl) == size
        assert series(m2, "tidepool_pool_target", **tl) == size
        assert series(m2, "tidepool_pool_creating", **tl) == 0
        # The refills that replaced the pooled hand-outs were timed as well.
        assert series(m2, "tidepool_sandbox_create_duration_seconds_count") >= created0 + count

        # Paused: 1 more while one is paused, back after it resumes.
        assert ok(daemon, "POST", f"/v1/sandboxes/{ids[0]}/pause")["state"] == "paused"
        m3 = metrics(daemon)
        assert series(m3, "tidepool_sandboxes", state="paused") == paused0 + 1
        assert ok(daemon, "GET", f"/v1/jobs/{j['id']}")["use"]["paused"] == 1
        assert ok(daemon, "POST", f"/v1/sandboxes/{ids[0]}/resume")["state"] == "running"
        assert series(metrics(daemon), "tidepool_sandboxes", state="paused") == paused0

        # Job use follows a removal, and the job's series go when it ends.
        ok(daemon, "DELETE", f"/v1/sandboxes/{ids[-1]}")
        wait_until(lambda: series(metrics(daemon), "tidepool_job_sandboxes", **jl) == count - 1, 30,
                   what="job use after a delete")
        assert series(metrics(daemon), "tidepool_job_memory_mb", **jl) == 80 * (count - 1)
        ok(daemon, "DELETE", f"/v1/jobs/{j['id']}")
        m4 = metrics(daemon)
        assert series(m4, "tidepool_job_sandboxes", **jl) is None
        assert series(m4, "tidepool_job_quota", quota="sandboxes", **jl) is None
    finally:
        delete_all(daemon, ids)
