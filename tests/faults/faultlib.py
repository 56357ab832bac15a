"""Host-wide inspection for the fault suite: everything a daemon (identified by its data
directory) may leave behind, not only what belongs to known sandbox ids, because a crash
can strike between creating a sandbox's resources and recording its id."""
from __future__ import annotations

import ctypes
import glob
import os
import socket
import sqlite3
import struct
import time
from typing import Dict, Iterable, List, Optional, Set

from tp_testlib import _cgroup_roots, _comm, cgroup_parent_of, pids_in_cgroups_matching

import tidepool


def cgroup_parent_name(data_dir: str) -> str:
    """The daemon's parent cgroup (tp_testlib.cgroup_parent_of)."""
    return cgroup_parent_of(data_dir)


def sandbox_cgroups(data_dir: str) -> List[str]:
    """Cgroup directories below the daemon's parent, in every hierarchy."""
    parent = cgroup_parent_name(data_dir)
    found: List[str] = []
    for root in _cgroup_roots():
        for p in glob.glob(f"{root}/{parent}/*") + glob.glob(f"{root}/*/{parent}/*"):
            if os.path.isdir(p):
                found.append(p)
    return sorted(set(found))


def cgroup_processes(data_dir: str) -> List[str]:
    """Host processes whose cgroup lies below the daemon's parent (agents, commands)."""
    return [f"{p} ({_comm(p)})" for p in pids_in_cgroups_matching(f"/{cgroup_parent_name(data_dir)}/")]


def data_dir_mounts(data_dir: str, exclude: Iterable[str] = ()) -> List[str]:
    """Mounts below the data directory (in our namespace), except `exclude` mount points."""
    d = os.path.realpath(data_dir)
    skip = {os.path.realpath(e) for e in exclude}
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if (mp == d or mp.startswith(d + "/")) and mp not in skip:
                out.append(line.strip())
    return out


# A namespace's inode number is reused once it is freed (a sandbox started meanwhile, by
# this test or the other test worker, may get it), its cookie (SO_NETNS_COOKIE) never:
# netns_of remembers the cookie of each namespace it saw, and netns_holders counts a
# process only when its namespace has that cookie.
_COOKIES: Dict[str, int] = {}
_CLONE_NEWNET = 0x40000000
_SO_NETNS_COOKIE = 71
_libc = ctypes.CDLL(None, use_errno=True)


def _netns_cookie(pid: int) -> Optional[int]:
    """The cookie of `pid`'s network namespace, read by a child that enters it."""
    try:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            if _libc.setns(fd, _CLONE_NEWNET) == 0:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                os.write(w, s.getsockopt(socket.SOL_SOCKET, _SO_NETNS_COOKIE, 8))
        finally:
            os._exit(0)
    os.close(w)
    os.close(fd)
    data = os.read(r, 8)
    os.close(r)
    os.waitpid(child, 0)
    return struct.unpack("=Q", data)[0] if len(data) == 8 else None


def netns_of(pids: Iterable[int]) -> Set[str]:
    out = set()
    for p in pids:
        try:
            ns = os.readlink(f"/proc/{p}/ns/net")
        except OSError:
            continue
        if ns not in out and ns not in _COOKIES:
            cookie = _netns_cookie(p)
            if cookie is not None:
                _COOKIES[ns] = cookie
        out.add(ns)
    return out


def netns_holders(namespaces: Set[str]) -> List[str]:
    """Processes (any thread group) or nsfs mounts still holding one of `namespaces`."""
    if not namespaces:
        return []
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            ns = os.readlink(f"/proc/{d}/ns/net")
        except OSError:
            continue
        if ns not in namespaces:
            continue
        if ns in _COOKIES and _netns_cookie(int(d)) not in (None, _COOKIES[ns]):
            continue  # a newer namespace that got the same inode number
        out.append(f"process {d} ({_comm(d)})")
    inodes = {n.split("[")[1].rstrip("]") for n in namespaces}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if " - nsfs " in line and any(f"net:[{i}]" in line for i in inodes):
                out.append(f"mount {line.strip()}")
    return out


def host_leaks(data_dir: str, netns: Set[str] = frozenset(), exclude_mounts: Iterable[str] = ()) -> List[str]:
    leaks = [f"cgroup {p}" for p in sandbox_cgroups(data_dir)]
    leaks += [f"process {p}" for p in cgroup_processes(data_dir)]
    leaks += [f"mount {m}" for m in data_dir_mounts(data_dir, exclude_mounts)]
    leaks += [f"netns {h}" for h in netns_holders(set(netns))]
    return leaks


def wait_no_host_leaks(data_dir: str, netns: Set[str] = frozenset(), timeout: float = 20.0,
                       exclude_mounts: Iterable[str] = ()) -> None:
    deadline = time.monotonic() + timeout
    while True:
        leaks = host_leaks(data_dir, netns, exclude_mounts)
        if not leaks:
            return
        if time.monotonic() > deadline:
            raise AssertionError("left on the host: " + "; ".join(leaks[:20]))
        time.sleep(0.2)


def store_rows(data_dir: str) -> Dict[str, Dict[str, str]]:
    """Rows of state.db (read-only; WAL lets us read while the daemon writes)."""
    db = sqlite3.connect(f"file:{os.path.join(data_dir, 'state.db')}?mode=ro", uri=True, timeout=10)
    try:
        (ok,) = db.execute("PRAGMA integrity_check").fetchone()
        assert ok == "ok", f"state.db integrity_check: {ok}"
        rows = db.execute("SELECT id, state, end_reason, ended_at_ms FROM sandboxes").fetchall()
    finally:
        db.close()
    return {r[0]: {"state": r[1], "end_reason": r[2] or "", "ended_at_ms": r[3] or 0} for r in rows}


def no_retry_client(url: str, timeout: float = 60) -> tidepool.Client:
    """A client that never retries: a retry after a crash would run the call again on the
    restarted daemon (idempotency keys live in the daemon's memory)."""
    return tidepool.Client(url, timeout=timeout, retry=tidepool.RetryPolicy(max_attempts=1))
