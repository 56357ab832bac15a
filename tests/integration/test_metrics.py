"""Metrics, health and version."""
import re

import tidepool
from tp_testlib import http_raw

NAMES = [
    "tidepool_sandboxes",
    "tidepool_sandbox_creations_total",
    "tidepool_sandbox_creation_failures_total",
    "tidepool_exec_total",
    "tidepool_exec_duration_seconds_bucket",
    "tidepool_exec_duration_seconds_sum",
    "tidepool_exec_duration_seconds_count",
    "tidepool_http_requests_total",
]


def _value(text, name, labels=None):
    total = None
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if not m or m.group(1) != name:
            continue
        if labels and not all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            continue
        total = (total or 0.0) + float(m.group(3))
    return total


def test_health_and_version(client):
    assert client.health()["status"] == "ok"
    v = client.version()
    assert v["api"] == "v1" and v["version"] and "container" in v["tiers"]


def test_metrics_exposition(client, daemon):
    status, ctype, body = http_raw(daemon.url, "GET", "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    text = body.decode()
    for name in NAMES:
        assert _value(text, name) is not None, f"{name} missing from /metrics"
    assert "# TYPE tidepool_exec_duration_seconds histogram" in text
    assert "# TYPE tidepool_exec_total counter" in text


def test_metrics_count_what_happens(client):
    before = client.metrics()
    with client.create(ttl=600) as sb:
        sb.exec("true")
        sb.exec("true")
        during = client.metrics()
        assert _value(during, "tidepool_sandboxes", {"state": "running"}) >= 1
    try:
        client.create(memory_mb=1)
    except tidepool.InvalidArgument:
        pass
    after = client.metrics()
    assert _value(after, "tidepool_sandbox_creations_total") >= _value(before, "tidepool_sandbox_creations_total") + 1
    assert _value(after, "tidepool_exec_total") >= _value(before, "tidepool_exec_total") + 2
    assert _value(after, "tidepool_exec_duration_seconds_count") >= _value(before, "tidepool_exec_duration_seconds_count") + 2
    assert _value(after, "tidepool_http_requests_total") > _value(before, "tidepool_http_requests_total")
