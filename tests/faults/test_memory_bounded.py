"""Daemon memory stays bounded when keyed commands print a lot: recorded answers live in
the step log on disk, not in memory (docs/trajectory-log.md), and the HTTP server frees an
answer's buffers once it is sent. Before the step log, 100 keyed execs of 4 MB output
each took tidepoold's RSS from 11 to 649 MiB."""
import base64
import os
import http.client
import json
import uuid

import pytest

from tp_testlib import rss_kb

OUT = 4_000_000
CMD = f"head -c {OUT} /dev/zero | tr '\\0' a"


def _exec(daemon, sandbox_id, key):
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=120)
    try:
        conn.request("POST", f"/v1/sandboxes/{sandbox_id}/exec", body=json.dumps({"cmd": CMD}),
                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        r = conn.getresponse()
        return r.status, r.getheader("Idempotent-Replayed"), r.read()
    finally:
        conn.close()


def _check(status, body):
    assert status == 200, body[:300]
    j = json.loads(body)
    assert j["exit_code"] == 0 and not j["stdout_truncated"], {k: j[k] for k in j if k != "stdout"}
    out = base64.b64decode(j["stdout"])
    assert len(out) == OUT and out.count(b"a") == OUT


@pytest.mark.skipif("ASAN_OPTIONS" in os.environ,
                    reason="ASan keeps freed memory in its quarantine (256 MiB): the g++ build measures RSS")
def test_rss_stays_bounded_over_100_keyed_execs_of_4mb(daemon, sandbox):
    # Warm up: the first big answers size the allocator's arenas.
    for _ in range(3):
        _check(*_exec(daemon, sandbox.id, str(uuid.uuid4()))[::2])
    before = rss_kb(daemon.pid)
    keys = []
    for _ in range(100):
        key = str(uuid.uuid4())
        keys.append(key)
        status, replayed, body = _exec(daemon, sandbox.id, key)
        assert replayed is None
        _check(status, body)
    after = rss_kb(daemon.pid)
    growth_mib = (after - before) / 1024
    print(f"tidepoold RSS {before} -> {after} KiB over 100 keyed execs of {OUT} bytes")
    assert growth_mib < 100, f"tidepoold RSS grew by {growth_mib:.0f} MiB ({before} -> {after} KiB)"
    # Every answer was recorded: a repeat comes from the log (a side file), unchanged.
    for key in (keys[0], keys[-1]):
        status, replayed, body = _exec(daemon, sandbox.id, key)
        assert replayed == "true"
        _check(status, body)
    assert (rss_kb(daemon.pid) - before) / 1024 < 100
