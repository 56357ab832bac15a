"""Helpers of the function-tier integration tests (test_function_*.py).

The function tier's workers are container sandboxes of its own (not in the sandbox list):
`fn_client` starts them once per module and registers their ids with the daemon fixture,
so the session's final check proves nothing of them remains after the daemon stopped.
`settled` is the per-test leak check of calls: once no call runs, every worker holds
exactly its warm children again (one process each, two for a prestarted runtime), in
cgroups of their own, and its long-lived processes hold as many descriptors as before the
test.
"""
from __future__ import annotations

import glob
import os
import time
from typing import Dict, List, Tuple

import pytest

from tp_testlib import LEAK_POLL, cgroup_dirs_of, pids_in_cgroups_matching

import tidepool


def worker_ids(c: tidepool.Client) -> List[str]:
    return [w["id"] for p in c.fn_status()["pools"] for w in p["workers"]]


def fncall_procs(worker_id: str) -> int:
    """Processes in the worker's per-call cgroups (memory hierarchy; v2: its one tree)."""
    n = 0
    for d in cgroup_dirs_of(worker_id):
        if "/memory/" not in d and "/unified/" not in d and not d.startswith("/sys/fs/cgroup/tidepool"):
            continue
        for f in glob.glob(f"{d}/fncall-*/cgroup.procs"):
            try:
                with open(f) as fh:
                    n += sum(1 for line in fh if line.strip())
            except OSError:
                pass
    return n


def worker_fds(worker_id: str) -> int:
    """Descriptors of the worker's long-lived processes (its agent, zygote and forker).
    Warm children are left out: each serves one call and is replaced by a new one, whose
    count depends on how far its runtime got in starting (node opens its descriptors
    over a while after it is forked, seconds under load), not on what calls left. So are
    the mount namespace handles the zygote holds, one per warm child once that child is
    ready (sent as it starts waiting for its call): how many depends on how far the warm
    children got, and the warm children themselves are counted by fncall_procs."""
    n = 0
    for pid in pids_in_cgroups_matching(worker_id):
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                if "/fncall-" in f.read():
                    continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("mnt:["):
                        continue
                except OSError:
                    continue
                n += 1
        except OSError:
            pass
    return n


def snapshot(c: tidepool.Client) -> Dict[str, Tuple[int, int]]:
    return {w: (fncall_procs(w), worker_fds(w)) for w in worker_ids(c)}


def expected_warm_procs(c: tidepool.Client) -> int:
    """Processes of one worker's warm children: one each, two for a prestarted runtime
    (its pid 1 and the runtime waiting for its program)."""
    warm = c.fn_status()["config"]["warm_per_worker"]
    return sum(n if flavor == "generic" else 2 * n for flavor, n in warm.items())


def settled(c: tidepool.Client, baseline: Dict[str, Tuple[int, int]], timeout: float = LEAK_POLL) -> None:
    """Waits until no call runs and every worker is back at its warm state: its per-call
    cgroups hold only warm children, and (a worker that was there before) its long-lived
    processes hold as many descriptors as then. Fails otherwise."""
    want = expected_warm_procs(c)
    deadline = time.monotonic() + timeout
    while True:
        st = c.fn_status()
        now = snapshot(c)
        ok = st["in_flight"] == 0 and st["queued"] == 0 and now and all(
            procs == want and (w not in baseline or fds == baseline[w][1]) for w, (procs, fds) in now.items())
        if ok:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"function workers did not settle: baseline {baseline}, now {now} "
                        f"(want {want} warm processes each), in flight {st['in_flight']}, "
                        f"queued {st['queued']}")
        time.sleep(0.1)


def warm_baseline(c: tidepool.Client) -> Dict[str, Tuple[int, int]]:
    """The workers' state with only warm children, once they are all up."""
    want = expected_warm_procs(c)
    deadline = time.monotonic() + 20
    while True:
        snap = snapshot(c)
        if snap and all(p == want for p, _ in snap.values()):
            time.sleep(0.3)  # and stays so (no child still being replaced)
            again = snapshot(c)
            if again == snap:
                return snap
        if time.monotonic() > deadline:
            pytest.fail(f"function workers never reached {want} warm processes each: {snap}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def fn(daemon):
    """A client of the daemon's function tier, its workers started (and registered for the
    session's final leak check)."""
    c = tidepool.Client(daemon.url, timeout=120)
    r = c.run_code("python", "print(1)")
    assert r.ok, r
    daemon.created.update(worker_ids(c))
    yield c
    if daemon.alive():
        daemon.created.update(worker_ids(c))
    c.close()


@pytest.fixture
def fn_clean(fn, daemon):
    """Per test: the workers are back at their warm state afterwards (nothing of a call left)."""
    base = warm_baseline(fn)
    yield fn
    if daemon.alive():
        daemon.created.update(worker_ids(fn))
        settled(fn, base)
