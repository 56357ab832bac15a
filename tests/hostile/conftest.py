"""Fixtures of the hostile-code containment suite (issue 6).

Every case runs hostile code inside a real sandbox of a real tidepoold and asserts two
things: the attempt is contained (refused, confined to the sandbox, or cut at a limit),
and nothing outside noticed: the daemon still answers /health and a "bystander" sandbox,
created once per module, still runs commands and still holds the files it was given.

The integration suite's fixtures (daemon, client, sandbox, payload, track, make_client,
the autouse leak check after every test and the failure-log hook) are reused as they
are: tests/integration/conftest.py is loaded under another module name and its
fixtures re-exported here. This directory therefore gets its own session daemon (a
conftest's fixtures are scoped to its directory), which keeps the hostile cases away
from the integration suite's daemon.

Run as root after the build, from the repository root:

    /usr/bin/python3 -m pytest -q tests/hostile          (TIDEPOOL_BUILD=build-dir)

Fixtures added here:
    bystander   module-wide sandbox with a secret file; `check()` asserts it is healthy
    healthy     autouse: after each case, the daemon answers and the bystander is intact
    hostile     a fresh sandbox for one case (default limits, killed after the test)
"""
from __future__ import annotations

import pathlib
import sys
import uuid

import pytest

_INTEGRATION = pathlib.Path(__file__).resolve().parents[1] / "integration"
if str(_INTEGRATION) not in sys.path:
    sys.path.insert(0, str(_INTEGRATION))

from tp_testlib import health_ok, reuse_integration_fixtures  # noqa: E402  (puts the SDK on sys.path)
import tidepool  # noqa: E402

reuse_integration_fixtures(globals(), "tp_integration_conftest")


class Bystander:
    """A sandbox that minds its own business while its neighbours misbehave."""

    def __init__(self, sb: tidepool.Sandbox) -> None:
        self.sb = sb
        self.secret = uuid.uuid4().hex
        self.path = f"/work/bystander-{self.secret[:8]}"
        sb.files.write(self.path, self.secret.encode())
        r = sb.exec(f"mkdir -p /tmp/by && echo {self.secret} > /tmp/by/note")
        assert r.ok, r

    def check(self) -> None:
        r = self.sb.exec(f"cat {self.path} /tmp/by/note; echo alive", timeout=30)
        assert r.ok, f"bystander cannot run commands: {r!r}"
        assert r.stdout == f"{self.secret}{self.secret}\nalive\n", r.stdout
        assert self.sb.files.read(self.path) == self.secret.encode()
        assert self.sb.refresh().state == "running"


@pytest.fixture(scope="module")
def bystander(daemon):
    """One healthy sandbox per module (created with its own client; killed at module end)."""
    c = tidepool.Client(daemon.url, timeout=60)
    sb = c.create(image="host", ttl=1800, labels={"role": "bystander"})
    daemon.created.add(sb.id)
    try:
        yield Bystander(sb)
    finally:
        try:
            sb.kill()
        except tidepool.TidepoolError:
            pass
        c.close()


@pytest.fixture(autouse=True)
def healthy(daemon, bystander):
    """After every case: the daemon serves and the bystander is untouched."""
    yield
    assert daemon.alive(), f"tidepoold died:\n{daemon.log_tail()}"
    assert health_ok(daemon.url), "tidepoold does not answer /health"
    bystander.check()


@pytest.fixture
def hostile(sandbox) -> tidepool.Sandbox:
    """The integration suite's `sandbox` (host image, killed after the test), under this suite's name."""
    return sandbox
