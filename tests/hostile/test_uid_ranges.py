"""Per-sandbox host uid ranges (issue 12): the kernel's per-user limits are per sandbox.

Many kernel limits are kept per host uid: pipe buffer pages (fs.pipe-user-pages-soft),
fanotify groups (fs.fanotify.max_user_groups, charged to a user namespace's owner),
inotify instances, keys, POSIX mqueue bytes, epoll watches, processes. When every sandbox
mapped root to the same host uid, one sandbox could use them up for all the others. Each
sandbox now maps root to the first id of a 65536-id range of its own, and image files
(stored once, shifted to the store's ids) reach it through idmapped mounts.

Each case asserts what a sandbox must see and what its neighbour must keep seeing; the
autouse `healthy` fixture checks the daemon and the module's bystander after each.
"""
from __future__ import annotations

import errno
import os
import sys

import pytest

from tp_testlib import sandbox_root_on_host, wait_until

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
from test_images import busybox_layer, docker_save, import_archive  # noqa: E402

RANGE = 65536
STORE_IDS = range(100000, 100000 + RANGE)  # image files on disk
BUILD_IDS = range(200000, 200000 + RANGE)  # image builds
F_GETPIPE_SZ = 1032


def _check_own_range(root: int) -> None:
    assert root not in STORE_IDS and root not in BUILD_IDS and root != 0, root


def test_each_sandbox_has_its_own_host_uid_range(client, bystander):
    """Two sandboxes (and the bystander) run as different host uids, 65536 apart at least,
    seen from the host in /proc/<pid>/status; each one's map says the same."""
    with client.create(ttl=600) as a, client.create(ttl=600) as b:
        roots = {sb.id: sandbox_root_on_host(sb.id) for sb in (a, b, bystander.sb)}
        assert len(set(roots.values())) == 3, roots
        ordered = sorted(roots.values())
        assert all(hi - lo >= RANGE for lo, hi in zip(ordered, ordered[1:])), roots
        for sb in (a, b):
            _check_own_range(roots[sb.id])
            assert sb.exec("cat /proc/self/uid_map").stdout.split() == ["0", str(roots[sb.id]), str(RANGE)]
            assert sb.exec("cat /proc/self/gid_map").stdout.split() == ["0", str(roots[sb.id]), str(RANGE)]
            # A command as another user inside is that user's id in the sandbox's range.
            r = sb.exec("cat /proc/self/status", user=1000)
            uid_line = next(l for l in r.stdout.splitlines() if l.startswith("Uid:"))
            assert uid_line.split()[1:] == ["1000"] * 4


def test_image_files_are_root_owned_and_writable_in_every_sandbox(daemon, client):
    """Layers are shared by all sandboxes: through the idmapped mounts, a busybox image's
    files are owned by 0 (and 1000) inside each of two sandboxes of different ranges; each
    writes to its own root (copy-up included) and the shared layer is untouched; the
    `host` image's skeleton likewise."""
    st, img = import_archive(daemon, docker_save([busybox_layer()], tag="uidbb:1"), "uidbb", "1")
    assert st == 201, img
    sbs = [client.create(image="uidbb:1", ttl=600) for _ in range(2)]
    try:
        roots = [sandbox_root_on_host(sb.id) for sb in sbs]
        assert roots[0] != roots[1], roots
        for sb in sbs:
            r = sb.exec("stat -c '%u %g' /bin/busybox /home/user/owned /etc/greeting; id -u", timeout=30)
            assert r.stdout.splitlines() == ["0 0", "1000 1000", "0 0", "0"], r
            r = sb.exec(f"echo {sb.id} > /etc/greeting && cat /etc/greeting && stat -c '%u %g' /etc/greeting"
                        " && echo new > /newfile && stat -c %u /newfile && busybox chown 1000:1000 /newfile"
                        " && stat -c %u /newfile", timeout=30)
            assert r.stdout.splitlines() == [sb.id, "0 0", "0", "1000"], r
        # Each sandbox wrote its own upper layer.
        assert sbs[0].exec("cat /etc/greeting").stdout == f"{sbs[0].id}\n"
        assert sbs[1].exec("cat /etc/greeting").stdout == f"{sbs[1].id}\n"
    finally:
        for sb in sbs:
            sb.kill()
    with client.create(ttl=600) as h:  # the host image's skeleton
        r = h.exec("stat -c '%u %g' /etc/passwd /root; echo x > /etc/mine && stat -c %u /etc/mine")
        assert r.stdout.splitlines() == ["0 0", "0 0", "0"], r


_HOLD = r"""
import ctypes, os, resource, sys, time
what, n = sys.argv[1], int(sys.argv[2])
held, err = [], 0
if what == "pipes":
    # Spread over processes: each may hold RLIMIT_NOFILE descriptors only.
    per = (resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 64) // 2
    ready_r, ready_w = os.pipe()
    while len(held) < n:
        k = min(per, n - len(held))
        if os.fork() == 0:
            mine = [os.pipe() for _ in range(k)]
            os.write(ready_w, b"x")
            time.sleep(300)
            os._exit(0)
        os.read(ready_r, 1)
        held += [None] * k
else:
    libc = ctypes.CDLL(None, use_errno=True)
    FAN_CLASS_NOTIF, FAN_REPORT_FID = 0, 0x200
    while len(held) < n:
        fd = libc.fanotify_init(FAN_CLASS_NOTIF | FAN_REPORT_FID, os.O_RDONLY)
        if fd < 0:
            err = ctypes.get_errno()
            break
        held.append(fd)
with open("/tmp/held.tmp", "w") as f:
    f.write(f"{len(held)} {err}\n")
os.rename("/tmp/held.tmp", "/tmp/held")
time.sleep(300)
"""

_PIPE_SIZE = "import fcntl, os; r, w = os.pipe(); print(fcntl.fcntl(w, 1032))"

_FANOTIFY_ONCE = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.fanotify_init(0x200, os.O_RDONLY)
print(0 if fd >= 0 else ctypes.get_errno())
"""


def _hold(sb, what: str, n: int):
    """Starts a background process in `sb` that takes and keeps `n` pipes or fanotify
    groups; answers (count taken, errno that stopped it) once it holds them."""
    sb.files.write("/tmp/hold.py", _HOLD.encode())
    proc = sb.start(["python3", "/tmp/hold.py", what, str(n)], timeout=600)
    wait_until(lambda: sb.exec("test -e /tmp/held").exit_code == 0, timeout=120, interval=0.2,
               what=f"{what} held")
    count, err = sb.exec("cat /tmp/held").stdout.split()
    return proc, int(count), int(err)


def test_pipes_of_one_sandbox_do_not_shrink_a_neighbours_pipes(client, bystander):
    """Attempt: open more pipes (default size, 16 pages each) than the per-user soft limit
    allows (fs.pipe-user-pages-soft, 16384 pages by default), which makes the kernel give
    that user's new pipes 2 pages only.
    Expected: the hog's own new pipes shrink (the limit is its own), the bystander's and a
    fresh sandbox's new pipes still get 64 KiB."""
    with open("/proc/sys/fs/pipe-user-pages-soft") as f:
        soft = int(f.read())
    if soft == 0:
        pytest.skip("fs.pipe-user-pages-soft is 0 (no per-user pipe limit on this host)")
    n = soft // 16 + 476  # 1,500 with the default limit
    if n > 20000:
        pytest.skip(f"fs.pipe-user-pages-soft {soft} needs more pipes than this test holds")
    assert bystander.sb.exec(["python3", "-c", _PIPE_SIZE]).stdout == "65536\n"
    with client.create(ttl=600) as hog:
        proc, count, _ = _hold(hog, "pipes", n)
        assert count == n
        # Past the soft limit: the hog's own new pipes are small.
        assert int(hog.exec(["python3", "-c", _PIPE_SIZE]).stdout) < 65536
        assert bystander.sb.exec(["python3", "-c", _PIPE_SIZE]).stdout == "65536\n"
        with client.create(ttl=600) as fresh:
            assert fresh.exec(["python3", "-c", _PIPE_SIZE]).stdout == "65536\n"
        proc.kill()


def test_fanotify_groups_of_one_sandbox_leave_a_neighbours(client, bystander):
    """Attempt: take every fanotify group the kernel allows one user (128 by default,
    charged to the owner of the sandbox's user namespace), until EMFILE.
    Expected: the bystander can still make one. If fanotify_init is denied to sandboxes
    altogether (seccomp), both get EPERM."""
    with client.create(ttl=600) as hog:
        proc, count, err = _hold(hog, "fanotify", 4096)
        by = int(bystander.sb.exec(["python3", "-c", _FANOTIFY_ONCE]).stdout)
        if count == 0 and err == errno.EPERM:
            assert by == errno.EPERM, by  # denied to every sandbox
        else:
            assert err == errno.EMFILE and count >= 1, (count, err)
            assert by == 0, f"bystander's fanotify_init failed: {os.strerror(by)}"
        proc.kill()
