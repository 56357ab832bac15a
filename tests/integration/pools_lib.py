"""Helpers of the pools and jobs tests (test_pools_jobs*.py): HTTP calls against a real
daemon, answers decoded."""
import base64
import json
import os

import pytest

from tp_testlib import api_call, cgroup_dirs_of


def call(daemon, method, path, body=None, timeout=120):
    st, headers, raw = api_call(daemon, method, path, body, timeout=timeout)
    try:
        obj = json.loads(raw) if raw and headers.get("content-type", "").startswith("application/json") else raw
    except ValueError:
        obj = raw
    return st, headers, obj


def ok(daemon, method, path, body=None, want=(200, 201)):
    st, _, obj = call(daemon, method, path, body)
    assert st in want, f"{method} {path}: {st} {obj}"
    return obj


def sh(daemon, sid, script, timeout=60):
    r = ok(daemon, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": ["sh", "-c", script], "timeout": timeout})
    return r["exit_code"], base64.b64decode(r["stdout"]).decode(), base64.b64decode(r["stderr"]).decode()


def pool(daemon, name):
    for p in ok(daemon, "GET", "/v1/pools")["pools"]:
        if p["template"] == name:
            return p
    return None


def freezer_state(sid):
    """The sandbox's freezer state: FROZEN/THAWED (v1) or 1/0 (v2); None without one."""
    for d in cgroup_dirs_of(sid):
        for f in ("freezer.state", "cgroup.freeze"):
            p = os.path.join(d, f)
            if os.path.exists(p) and ("freezer" in d or f == "cgroup.freeze"):
                return open(p).read().strip()
    return None


@pytest.fixture
def job(daemon):
    """Jobs made by the test (make(**fields)), ended afterwards."""
    made = []

    def make(**fields):
        j = ok(daemon, "POST", "/v1/jobs", fields)
        made.append(j["id"])
        return j
    yield make
    for j in made:
        call(daemon, "DELETE", f"/v1/jobs/{j}")
