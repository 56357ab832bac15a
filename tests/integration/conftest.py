"""Fixtures of the integration suite: a real tidepoold driven through the Python SDK.

Run as root after the build, from the repository root:

    /usr/bin/python3 -m pytest -q tests/integration

Environment:
    TIDEPOOL_BUILD   build directory holding bin/ and payloads/ (default: <repo>/build)

Fixtures for test modules (test_cli.py uses these too):
    daemon      session-wide running daemon: .url, .data_dir, .pid, .port, .log_path,
                .env() (os.environ plus TIDEPOOL_URL), .restart(kill9=True), .alive()
    build_dir   pathlib.Path of the build directory (binaries in build_dir / "bin")
    client      a tidepool.Client for the daemon that records every sandbox it creates;
                on teardown it kills those that are still live
    make_async_client  factory of tidepool.AsyncClient that record their sandboxes (also
                batches) the same way
    sandbox     one fresh sandbox (default limits), killed after the test
    payload     function name -> host path of build/payloads/<name> (fails if missing)
    track       function sandbox_id -> None: register a sandbox created another way (CLI)
                so that the leak check covers it

Helpers (wait_until, http_raw, health_ok, leaks_of, processes_of, upload_payload, ...) are
in tp_testlib.py: import them from there, not from conftest.

After every test an autouse check verifies that nothing of the sandboxes the test
created is left on the host (cgroup directories, processes, mounts) and that the
daemon's open file descriptors return to their level before the test.
"""
from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Dict, Iterable, List, Set

import pytest

from tp_testlib import BUILD, FD_SLACK, LEAK_POLL, Daemon, fd_count, fd_targets, leaks_after_stop, leaks_of

import tidepool  # noqa: E402  (tp_testlib put the SDK on sys.path)


@pytest.fixture(scope="session")
def build_dir() -> pathlib.Path:
    return BUILD


@pytest.fixture(scope="session")
def daemon(build_dir):
    if os.geteuid() != 0:
        pytest.skip("the integration suite needs root (sandboxes use namespaces and cgroups)")
    d = Daemon(build_dir)
    try:
        d.start()
    except BaseException:
        d.stop(signal.SIGKILL)
        d.cleanup()
        raise
    yield d
    rc = d.stop()
    # A graceful stop must end every sandbox: nothing of any of them may remain.
    leaks = leaks_after_stop(d)
    keep = os.environ.get("TIDEPOOL_KEEP_TMP")
    if not keep:
        d.cleanup()
    assert rc in (0, -signal.SIGTERM), f"tidepoold exited with {rc} on SIGTERM:\n{d.log_tail()}"
    assert not leaks, f"left behind after the daemon stopped: {leaks}"


class TrackingClient(tidepool.Client):
    """A Client that records the ids of the sandboxes it creates."""

    def __init__(self, url: str, registry: Set[str], **kw) -> None:
        super().__init__(url, **kw)
        self.created: List[str] = []
        self._registry = registry

    def create(self, *args, **kwargs) -> tidepool.Sandbox:
        sb = super().create(*args, **kwargs)
        self.created.append(sb.id)
        self._registry.add(sb.id)
        return sb

    def create_batch(self, *args, **kwargs):
        res = super().create_batch(*args, **kwargs)
        for sb in res.sandboxes:
            self.created.append(sb.id)
            self._registry.add(sb.id)
        return res


class TrackingAsyncClient(tidepool.AsyncClient):
    """An AsyncClient that records the ids of the sandboxes it creates (also in batches)."""

    def __init__(self, url: str, registry: Set[str], **kw) -> None:
        super().__init__(url, **kw)
        self.created: List[str] = []
        self._registry = registry

    def _record(self, sandbox_id: str) -> None:
        self.created.append(sandbox_id)
        self._registry.add(sandbox_id)

    async def create(self, *args, **kwargs) -> tidepool.AsyncSandbox:
        sb = await super().create(*args, **kwargs)
        self._record(sb.id)
        return sb

    async def create_batch(self, *args, **kwargs):
        res = await super().create_batch(*args, **kwargs)
        for sb in res.sandboxes:
            self._record(sb.id)
        return res


class _Tracker:
    def __init__(self) -> None:
        self.clients: List[TrackingClient] = []
        self.async_clients: List[TrackingAsyncClient] = []
        self.extra: List[str] = []

    def ids(self) -> List[str]:
        out = list(self.extra)
        for c in self.clients:
            out.extend(c.created)
        for c in self.async_clients:
            out.extend(c.created)
        return out


@pytest.fixture
def _tracker():
    return _Tracker()


@pytest.fixture
def track(_tracker, daemon):
    """Registers a sandbox id created outside the client fixture (e.g. by the CLI)."""
    def add(sandbox_id: str) -> None:
        _tracker.extra.append(sandbox_id)
        daemon.created.add(sandbox_id)
    return add


def _kill_quietly(c: tidepool.Client, ids: Iterable[str]) -> None:
    for sid in ids:
        try:
            c.kill(sid)
        except tidepool.TidepoolError:
            pass


@pytest.fixture
def make_client(daemon, _tracker):
    """Factory of extra tracked clients (all closed, their sandboxes killed, after the test)."""
    def make(**kw) -> TrackingClient:
        c = TrackingClient(daemon.url, daemon.created, **kw)
        _tracker.clients.append(c)
        return c
    yield make
    for c in _tracker.clients:
        if daemon.alive():
            _kill_quietly(c, c.created)
        c.close()


@pytest.fixture
def make_async_client(daemon, _tracker):
    """Factory of tracked AsyncClients. Use them inside the test's own event loop
    (asyncio.run) and close them there; sandboxes they leave live are killed afterwards
    with a sync client."""
    def make(**kw) -> TrackingAsyncClient:
        c = TrackingAsyncClient(daemon.url, daemon.created, **kw)
        _tracker.async_clients.append(c)
        return c
    yield make
    leftover = [sid for c in _tracker.async_clients for sid in c.created]
    if leftover and daemon.alive():
        with tidepool.Client(daemon.url, timeout=60) as c:
            _kill_quietly(c, leftover)


@pytest.fixture
def client(make_client) -> TrackingClient:
    return make_client(timeout=60)


@pytest.fixture
def sandbox(client) -> tidepool.Sandbox:
    sb = client.create(image="host", ttl=600)
    yield sb
    try:
        sb.kill()
    except tidepool.TidepoolError:
        pass


@pytest.fixture(scope="session")
def payload(build_dir):
    def path(name: str) -> str:
        p = build_dir / "payloads" / name
        if not p.exists():
            pytest.fail(f"payload {p} missing: tests/payloads/{name}.c should be built into {p.parent}")
        return str(p)
    return path


# -- the leak check after every test ----------------------------------------------


@pytest.fixture(autouse=True)
def leak_check(request, daemon, _tracker):
    pid_before = daemon.pid if daemon.alive() else None
    fds_before = fd_count(pid_before, cached_userns=False) if pid_before else -1
    log_offset = daemon.log_size()
    request.node._tidepool_log_offset = log_offset
    yield
    # Runs after the client fixtures closed their connections and killed their sandboxes.
    ids = _tracker.ids()
    problems: List[str] = []
    if not daemon.alive():
        # A test that stops the session daemon must start it again; one that failed or
        # skipped half-way must not take every later test of this worker down with it.
        problems.append(f"the test left tidepoold down (exit status {daemon.stop()})")
        daemon.start()
    if ids and daemon.alive():
        with tidepool.Client(daemon.url, timeout=30) as c:
            for sid in ids:
                try:
                    st = c.get(sid).state
                except tidepool.NotFound:
                    continue
                if st not in ("stopped", "lost"):
                    problems.append(f"{sid} still {st} after the test's cleanup")
    leaks: Dict[str, List[str]] = {}
    deadline = time.monotonic() + LEAK_POLL
    while True:
        leaks = {}
        for sid in ids:
            found = leaks_of(sid, daemon.pid if daemon.alive() else None, daemon.data_dir)
            if found:
                leaks[sid] = found
        if not leaks or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    problems += [f"{sid}: {', '.join(l)}" for sid, l in leaks.items()]
    if pid_before and daemon.alive() and daemon.pid == pid_before:
        fds_after = fd_count(pid_before, cached_userns=False)
        deadline = time.monotonic() + LEAK_POLL
        while fds_after > fds_before + FD_SLACK and time.monotonic() < deadline:
            time.sleep(0.1)
            fds_after = fd_count(pid_before, cached_userns=False)
        if fds_after > fds_before + FD_SLACK:
            problems.append(f"daemon fds grew from {fds_before} to {fds_after}: "
                            f"{fd_targets(pid_before)}")
    if problems:
        pytest.fail("leak check failed:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attaches the daemon's log lines written during a failed test to its report."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        d = item.funcargs.get("daemon") if hasattr(item, "funcargs") else None
        offset = getattr(item, "_tidepool_log_offset", 0)
        if d is not None:
            rep.sections.append(("tidepoold log (this test)", d.log_tail(80, since=offset)))
