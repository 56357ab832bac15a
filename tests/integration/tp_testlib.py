"""Helpers of the integration suite (imported by conftest.py and the tests).

Kept out of conftest.py so that `from tp_testlib import ...` is unambiguous when pytest
collects several test directories that each have a conftest.py.
"""
from __future__ import annotations

import glob
import http.client
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Set, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "sdk" / "python"))

import tidepool  # noqa: E402

BUILD = pathlib.Path(os.environ.get("TIDEPOOL_BUILD") or REPO / "build").resolve()
START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
LEAK_POLL = 10.0
FD_SLACK = 2


def reuse_integration_fixtures(namespace: Dict[str, object], module_name: str) -> None:
    """Loads tests/integration/conftest.py as `module_name` and copies its fixtures and hooks
    into `namespace` (another suite's conftest globals). pytest imports every directory's
    conftest.py as "conftest", hence a name of its own; the fixtures are then scoped to the
    calling directory, which gets its own session daemon."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(module_name, pathlib.Path(__file__).parent / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    namespace.update({k: v for k, v in vars(mod).items() if not k.startswith("__")})


# -- helpers usable from tests ----------------------------------------------------


def wait_until(pred, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Polls pred() until it returns a truthy value; returns it, or fails after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def free_port() -> int:
    """A free port below the kernel's ephemeral range. A daemon restarted on its port
    must find it free again: a port of that range (what bind to port 0 hands out) may
    meanwhile be the local end of any process's outgoing connection."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral_lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_lo = 32768
    lo = 10000 if ephemeral_lo > 12000 else 1024
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(lo, ephemeral_lo)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {lo}..{ephemeral_lo - 1}")


def http_raw(url: str, method: str, path: str, body: Optional[bytes] = None,
             headers: Optional[Dict[str, str]] = None, timeout: float = 30):
    """One raw HTTP request (no SDK); returns (status, content-type, body bytes)."""
    u = url.split("//", 1)[1]
    host, port = u.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type") or "", r.read()
    finally:
        conn.close()


def api_call(daemon, method: str, path: str, body=None, key: Optional[str] = None, timeout: float = 60):
    """One raw request to a test daemon, JSON body (dict or list) or bytes, with an
    Idempotency-Key when given; returns (status, headers dict with lower-case names, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    try:
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def health_ok(url: str) -> bool:
    try:
        status, _, body = http_raw(url, "GET", "/health", timeout=2)
        return status == 200 and json.loads(body).get("status") == "ok"
    except (OSError, http.client.HTTPException, ValueError):
        return False


# -- host inspection for the leak check -------------------------------------------


def _cgroup_roots() -> List[str]:
    """Mount points of every cgroup hierarchy (v1 controllers and v2)."""
    roots = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fstype = post.split()[0] if post else ""
            if fstype in ("cgroup", "cgroup2"):
                roots.append(pre.split()[4])
    return sorted(set(roots))


def cgroup_dirs_of(sandbox_id: str) -> List[str]:
    """Host cgroup directories named after the sandbox (v1: <ctrl>/tidepool*/<id>, v2: <root>/tidepool*/<id>;
    the parent is "tidepool" for the default data dir, "tidepool-<hash>" for others)."""
    found = []
    for root in _cgroup_roots():
        for pattern in (f"{root}/tidepool*/{sandbox_id}*", f"{root}/*/tidepool*/{sandbox_id}*",
                        f"{root}/tidepool*/*/{sandbox_id}*"):
            found.extend(p for p in glob.glob(pattern) if os.path.isdir(p))
    return sorted(set(found))


def pids_in_cgroups_matching(text: str) -> List[int]:
    """Host pids whose /proc/<pid>/cgroup contains `text`."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cgroup") as f:
                if text in f.read():
                    pids.append(int(d))
        except OSError:
            pass
    return pids


def processes_of(sandbox_id: str) -> List[int]:
    """Host pids whose cgroup path names the sandbox."""
    return pids_in_cgroups_matching(sandbox_id)


def status_kb(pid: int) -> Dict[str, int]:
    """The KiB fields of a host process's /proc/<pid>/status (VmRSS, VmHWM, ...)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if v.strip().endswith("kB"):
                out[k] = int(v.split()[0])
    return out


def rss_kb(pid: int) -> int:
    """Resident memory of a host process in KiB (-1 if unknown)."""
    return status_kb(pid).get("VmRSS", -1)


def mounts_of(sandbox_id: str, pids: Iterable[int] = ()) -> List[str]:
    """Mount lines naming the sandbox, in our mount namespace and the daemon's."""
    out = []
    for src in ["/proc/self/mountinfo"] + [f"/proc/{p}/mountinfo" for p in pids]:
        try:
            with open(src) as f:
                out.extend(f"{src}: {line.strip()}" for line in f if sandbox_id in line)
        except OSError:
            pass
    return out


def cgroup_parent_of(data_dir: str) -> str:
    """The daemon's parent cgroup name: "tidepool-<FNV-1a of the canonical data dir>" (daemon.cpp)."""
    d = os.path.realpath(data_dir)
    if d == "/var/lib/tidepool":
        return "tidepool"
    h = 2166136261
    for c in d.encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return f"tidepool-{h:08x}"


def run_dir_of(data_dir: str) -> str:
    """Where a daemon (without --run-dir) keeps its agents' sockets: /run/tidepool/<parent
    cgroup name> when /run is a tmpfs, else <data_dir>/containers/run."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if pre.split()[4] == "/run" and post.split()[0] == "tmpfs":
                return f"/run/tidepool/{cgroup_parent_of(data_dir)}"
    return os.path.join(data_dir, "containers", "run")


def data_paths_of(sandbox_id: str, data_dir: Optional[str]) -> List[str]:
    """Per-sandbox working paths under <data_dir>/containers (roots, uppers, sockets) and
    in the daemon's run dir, and <data_dir>/microvm/run (a VM's sockets, console and state)."""
    if not data_dir:
        return []
    found = []
    run = run_dir_of(data_dir)
    if os.path.isdir(run) and not run.startswith(os.path.join(data_dir, "")):
        found.extend(os.path.join(run, n) for n in os.listdir(run) if sandbox_id in n)
    for top in (os.path.join(data_dir, "containers"), os.path.join(data_dir, "microvm", "run")):
        for dirpath, dirnames, filenames in os.walk(top):
            if dirpath[len(top):].count(os.sep) >= 3:
                dirnames[:] = []
            found.extend(os.path.join(dirpath, n) for n in dirnames + filenames if sandbox_id in n)
    return found


def leaks_of(sandbox_id: str, daemon_pid: Optional[int], data_dir: Optional[str] = None) -> List[str]:
    """Everything of a sandbox still on the host: cgroup dirs, processes, mounts, data paths."""
    leaks = [f"cgroup dir {d}" for d in cgroup_dirs_of(sandbox_id)]
    leaks += [f"path {p}" for p in data_paths_of(sandbox_id, data_dir)]
    leaks += [f"process {p} ({_comm(p)})" for p in processes_of(sandbox_id)]
    leaks += [f"mount {m}" for m in mounts_of(sandbox_id, [daemon_pid] if daemon_pid else [])]
    return leaks


def leaks_after_stop(d: "Daemon") -> Dict[str, List[str]]:
    """What is left of the sandboxes a stopped daemon made, polled for up to LEAK_POLL
    seconds (the kernel finishes some teardown after the processes are gone)."""
    deadline = time.monotonic() + LEAK_POLL
    while True:
        leaks = {sid: l for sid in sorted(d.created) if (l := leaks_of(sid, None, d.data_dir))}
        if not leaks or time.monotonic() > deadline:
            return leaks
        time.sleep(0.2)


def keys_cmd(d: "Daemon", *args: str) -> subprocess.CompletedProcess:
    """`tidepoold keys ...` against the daemon's data dir."""
    return subprocess.run([str(d.binary), "keys", *args, "--data-dir", d.data_dir],
                          capture_output=True, text=True, timeout=30)


def new_key(d: "Daemon", scope: str, name: str = "") -> str:
    """A new API key of `scope` (admin or user) for the daemon."""
    r = keys_cmd(d, "create", "--scope", scope, "--name", name or scope)
    assert r.returncode == 0, r.stderr
    key = r.stdout.strip()
    assert key.startswith("tpk_"), r.stdout
    return key


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def fd_count(pid: int, cached_userns: bool = True) -> int:
    """Open fds of a process. With cached_userns=False, a daemon's user-namespace fds are
    left out: the container backend keeps the idmap namespaces of recently used uid ranges
    (at most 256, one fd each) for later sandboxes of the same range, a bounded cache; and
    so are the microvm tier's template memories (one memfd per image and shape in use,
    kept for the daemon's run: every later sandbox of that shape is a clone of it)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return -1
    if cached_userns:
        return len(fds)
    n = 0
    for fd in fds:
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
            if t.startswith("user:") or t.startswith("/memfd:tp-template"):
                continue
        except OSError:
            continue
        n += 1
    return n


def host_uid_of(pid: int) -> int:
    """Real uid of a host process, as the host sees it."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


def host_ids_of(pid: int) -> Tuple[List[int], List[int]]:
    """Host uids and gids (real, effective, saved, filesystem) of a process."""
    uids, gids = [], []
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Uid:"):
                uids = [int(x) for x in line.split()[1:]]
            elif line.startswith("Gid:"):
                gids = [int(x) for x in line.split()[1:]]
    return uids, gids


def sandbox_root_on_host(sandbox_id: str) -> int:
    """The host uid that is root inside the sandbox: that of its init (the agent), whose
    uids and gids, all four of each, are that one id."""
    pids = processes_of(sandbox_id)
    assert pids, f"no process of sandbox {sandbox_id}"
    init = min(pids, key=lambda p: int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[19]))
    uids, gids = host_ids_of(init)
    assert len(set(uids)) == 1 and uids == gids, (sandbox_id, init, uids, gids)
    return uids[0]


# -- the daemon -------------------------------------------------------------------


class Daemon:
    """A tidepoold child process on a private port and data directory."""

    def __init__(self, build: pathlib.Path, insecure_tcp: bool = True,
                 extra_args: Optional[List[str]] = None, keep_sandboxes: bool = False) -> None:
        self.binary = build / "bin" / "tidepoold"
        # Suites talk TCP without keys (--insecure-tcp); test_auth.py starts daemons
        # that require keys. Every daemon has its own unix socket.
        self.insecure_tcp = insecure_tcp
        # A clean stop leaves sandboxes running for the next daemon (live restore);
        # test daemons stop them unless a test is about that hand-over.
        self.keep_sandboxes = keep_sandboxes
        # TIDEPOOL_DAEMON_ARGS: flags for every test daemon (e.g. "--uid-ranges 0" runs a
        # suite with the one shared uid range of daemons before per-sandbox ranges).
        self.extra_args = os.environ.get("TIDEPOOL_DAEMON_ARGS", "").split() + list(extra_args or [])
        self.tmp = tempfile.mkdtemp(prefix="tidepool-it-")
        # Sandboxes run as an unprivileged host uid that must be able to traverse the data dir.
        os.chmod(self.tmp, 0o711)
        self.data_dir = os.path.join(self.tmp, "data")
        os.makedirs(self.data_dir)
        self.log_path = os.path.join(self.tmp, "tidepoold.log")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket = os.path.join(self.tmp, "tp.sock")
        self.proc: Optional[subprocess.Popen] = None
        self.created: Set[str] = set()    # every sandbox id any test created, for the final check

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def env(self) -> Dict[str, str]:
        """The environment for CLI subprocesses: ours plus TIDEPOOL_URL."""
        e = dict(os.environ)
        e["TIDEPOOL_URL"] = self.url
        return e

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 60, since: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                lines = f.read().decode("utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except OSError:
            return 0

    def start(self) -> None:
        if not self.binary.exists():
            pytest.fail(f"{self.binary} does not exist: build first (make build), or set TIDEPOOL_BUILD")
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                [str(self.binary), "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir,
                 "--log-level", "info", "--socket", self.socket]
                + (["--insecure-tcp"] if self.insecure_tcp else [])
                + ([] if self.keep_sandboxes else ["--stop-sandboxes-on-exit"]) + self.extra_args,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, close_fds=True)
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"tidepoold exited with {self.proc.returncode} before answering /health:\n"
                            f"{self.log_tail()}")
            if health_ok(self.url):
                return
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"tidepoold did not answer /health within {START_TIMEOUT}s:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        """Stops the daemon (sig, then SIGKILL after a timeout); returns its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        return rc

    def restart(self, kill9: bool = True) -> None:
        """Stops the daemon (SIGKILL by default, as a crash) and starts it again on the same
        data directory and port."""
        self.stop(signal.SIGKILL if kill9 else signal.SIGTERM)
        self.start()

    def cleanup(self) -> None:
        # A daemon that ended with SIGKILL could not remove its (empty) parent cgroups;
        # they belong to this throwaway data dir, so the harness removes them.
        name = cgroup_parent_of(self.data_dir)
        run = run_dir_of(self.data_dir)
        if not run.startswith(os.path.join(self.data_dir, "")):
            try:
                os.rmdir(run)  # a run dir in /run: fails (and shows in leak checks) if not empty
            except OSError:
                pass
        for parent in glob.glob(f"/sys/fs/cgroup/*/{name}") + glob.glob(f"/sys/fs/cgroup/{name}"):
            try:
                os.rmdir(parent)  # fails (and is left for the leak check) if not empty
            except OSError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def upload_payload(sb: tidepool.Sandbox, payload_path: str, name: Optional[str] = None) -> str:
    """Copies a host payload into the sandbox as an executable; returns its sandbox path."""
    dest = f"/payloads/{name or os.path.basename(payload_path)}"
    with open(payload_path, "rb") as f:
        sb.files.write(dest, f.read(), mode=0o755)
    return dest



def fd_targets(pid: int) -> str:
    kinds: Dict[str, int] = {}
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            k = t.split(":")[0] if ":" in t and not t.startswith("/") else t
            kinds[k] = kinds.get(k, 0) + 1
    except OSError:
        return "?"
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:12])
