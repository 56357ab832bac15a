"""CPython's own regression tests for processes, signals and files, in a sandbox and on the host.

Debian's libpython3.11-testsuite (installed here when missing; scripts/install-deps.sh lists
it) is visible in sandboxes of the `host` image, which bind the host's /usr. Each module runs
in a sandbox and, when some of its tests fail there, on the host as root (the same privilege
as the sandbox's root); every test that passes on the host must pass in the sandbox, except those in ALLOWED below
with the reason the sandbox differs. A module that fails on the host proves nothing and is
only reported.

The modules first run side by side, each in its own sandbox (most of their time is
sleeps and timeouts: the suite takes about as long as its slowest module). A module with
failures there runs again alone in a fresh sandbox, so that a timing-sensitive test
failing under its neighbours' load is not taken for a sandbox difference; only the
failures of that lone run count.

Slow (minutes): marked `slow`. TP_PY_SUITE="test_signal test_posix" runs only those modules.
"""
import concurrent.futures
import os
import re
import subprocess
import time

import pytest

import tidepool

# The slowest first (about 2 min, 80 s, 60 s, 30 s: mostly waiting), so that they overlap the rest.
MODULES = ("test_multiprocessing_fork test_asyncio test_signal test_subprocess test_threading "
           "test_os test_posix test_shutil test_tempfile test_pty").split()
PYTHON = "/usr/bin/python3"
TESTSUITE = "/usr/lib/python3.11/test/test_signal.py"
MODULE_TIMEOUT = 1800  # seconds for one module, in either place
PARALLEL = 3  # modules at once in the first pass

# Test ids ("module.Class.test") that may fail in a sandbox although they pass on the host.
ALLOWED = {
    # The sandbox's user namespace maps 65536 ids; these tests chown to an id outside it
    # (EINVAL in a user namespace).
    "test.test_posix.PosixTester.test_chown": "chown to an id outside the sandbox's id map: EINVAL",
    "test.test_posix.PosixTester.test_fchown": "chown to an id outside the sandbox's id map: EINVAL",
    "test.test_posix.PosixTester.test_lchown": "chown to an id outside the sandbox's id map: EINVAL",
    # The sandbox's root is an overlay (upper on tmpfs, lower on the host's file system,
    # no xino): readdir's d_ino of a directory differs from its st_ino there.
    "test.test_os.TestScandir.test_attributes": "overlayfs root: DirEntry.inode() != st_ino for a directory",
}

pytestmark = pytest.mark.slow

FAIL_LINE = re.compile(r"^(?:FAIL|ERROR): (\w+) \(([\w.]+)\)", re.M)


def failing_tests(output: str):
    """Ids of the failing or erroring test cases in regrtest -v output."""
    out = set()
    for name, where in FAIL_LINE.findall(output):
        out.add(where if where.endswith("." + name) else f"{where}.{name}")
    return out


def module_cmd(module: str, tmp: str):
    return (f"mkdir -p {tmp} && cd {tmp} && TMPDIR={tmp} exec {PYTHON} -m test -v "
            f"--timeout {MODULE_TIMEOUT} {module}")


@pytest.fixture(scope="module")
def testsuite():
    if not os.path.exists(TESTSUITE):
        r = subprocess.run(["apt-get", "install", "-y", "-q", "libpython3.11-testsuite"],
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                           capture_output=True, text=True)
        if r.returncode != 0 or not os.path.exists(TESTSUITE):
            pytest.skip(f"libpython3.11-testsuite is not installed and apt-get failed: {r.stderr[-500:]}")
    return TESTSUITE


def modules():
    only = os.environ.get("TP_PY_SUITE")
    return only.split() if only else MODULES


def run_on_host(module: str, work: str):
    t0 = time.monotonic()
    host = subprocess.run(["sh", "-c", module_cmd(module, work)],
                          capture_output=True, text=True, timeout=MODULE_TIMEOUT + 60)
    return host, time.monotonic() - t0


def run_in_sandbox(client, module: str, created=None):
    """Runs `module` in a fresh sandbox; returns (result, seconds)."""
    sb = client.create(image="host", memory_mb=4096, pids=4096, disk_mb=4096, ttl=MODULE_TIMEOUT + 600)
    if created is not None:
        created.add(sb.id)
    try:
        t1 = time.monotonic()
        r = sb.exec(module_cmd(module, "/root/pysuite"), timeout=MODULE_TIMEOUT + 60,
                    max_output_bytes=64 << 20)
        return r, time.monotonic() - t1
    finally:
        client.kill(sb.id)


@pytest.fixture(scope="module")
def first_pass(testsuite, daemon):
    """Every module at once (PARALLEL at a time), each in its own sandbox: module -> future.
    All are over (and their sandboxes gone) before the first test checks its result, so
    that the leak check after it sees none of them."""
    with tidepool.Client(daemon.url, timeout=60) as client, \
            concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {m: pool.submit(run_in_sandbox, client, m, daemon.created) for m in modules()}
        concurrent.futures.wait(futures.values())
    return futures


def passed(r, output: str) -> bool:
    return r.exit_code == 0 and not failing_tests(output) and not r.timed_out


@pytest.mark.parametrize("module", modules())
def test_module_passes_in_sandbox_as_on_host(first_pass, client, module, tmp_path):
    r, sb_s = first_pass[module].result()
    if passed(r, r.stdout + r.stderr):
        print(f"{module}: sandbox {sb_s:.0f}s (beside others), every test passed")
        return
    # Failures beside other modules: alone in a fresh sandbox they count. The host runs
    # only then, to tell a sandbox regression from a test that fails here anyway.
    r, sb_s = run_in_sandbox(client, module)
    out = r.stdout + r.stderr
    assert not r.timed_out, f"{module} timed out in the sandbox:\n{out[-3000:]}"
    sb_failed = failing_tests(out)
    if r.exit_code == 0 and not sb_failed:
        print(f"{module}: sandbox {sb_s:.0f}s alone, every test passed (failed beside others)")
        return
    host, host_s = run_on_host(module, str(tmp_path / "work"))
    host_failed = failing_tests(host.stdout + host.stderr)
    if host.returncode != 0 and not host_failed:
        pytest.skip(f"{module} fails on the host before running tests (rc {host.returncode}): "
                    f"{(host.stdout + host.stderr)[-800:]}")
    if r.exit_code != 0 and not sb_failed:
        pytest.fail(f"{module} failed in the sandbox without a failing test case (rc {r.exit_code}, "
                    f"signal {r.signal}):\n{out[-3000:]}")
    regressions = sorted(t for t in sb_failed - host_failed if t not in ALLOWED)
    print(f"{module}: host {host_s:.0f}s rc {host.returncode} failed {sorted(host_failed)}; "
          f"sandbox {sb_s:.0f}s rc {r.exit_code} failed {sorted(sb_failed)}")
    assert not regressions, (f"{module}: pass on the host, fail in the sandbox: {regressions}\n"
                             + "\n".join(l for l in out.splitlines() if l.startswith(("FAIL", "ERROR",
                                                                                   "Traceback")))[-4000:]
                             + "\n" + out[-3000:])
