"""Resource exhaustion: hostile code tries to use up what the sandbox is given (and more).

Every case asserts that the limit holds inside the hostile sandbox, that the sandbox is
usable again afterwards (where it survives), and, through the autouse `healthy` fixture,
that the daemon and the module's bystander sandbox never noticed.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re

import tidepool
from hostile_lib import rss_kb, upload_payload
from tp_testlib import wait_until


def _ps(sb) -> list:
    """Commands of every process in the sandbox but the agent and the probe itself."""
    r = sb.exec("for p in /proc/[0-9]*; do [ ${p#/proc/} = 1 ] || cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done")
    return [l.strip() for l in r.stdout.splitlines() if l.strip() and "/proc/[0-9]" not in l and "cat " not in l
            and "tr " not in l]


def test_fork_bomb(client, payload, bystander):
    """Attempt: a fork bomb (the static `forkbomb` payload, then a recursive shell one).
    Expected: forks stop at the sandbox's pids limit (EAGAIN), the per-call timeout kills the
    whole tree, the sandbox runs commands again, the bystander can still fork."""
    with client.create(pids=64, ttl=600) as sb:
        bomb = upload_payload(sb, payload("forkbomb"))
        r = sb.exec([bomb], timeout=3)
        m = re.search(r"forks=(\d+) errno=(\d+)", r.stdout)
        assert m and int(m.group(2)) == errno.EAGAIN and int(m.group(1)) < 64, r
        assert bystander.sb.exec("for i in 1 2 3 4 5 6 7 8; do (true) & done; wait; echo ok").stdout == "ok\n"
        r = sb.exec(":(){ :|:& };:; sleep 30", timeout=3)
        assert r.timed_out or not r.ok
        assert sb.exec("echo alive").stdout == "alive\n"
        assert len(_ps(sb)) <= 1, _ps(sb)


def test_memory_bomb(client, payload):
    """Attempt: allocate and touch 8x the sandbox's memory.
    Expected: the kernel's OOM killer (sandbox cgroup) kills the command, the result says
    oom_killed, the sandbox survives and host memory is untouched (the bystander runs)."""
    with client.create(memory_mb=64, ttl=600) as sb:
        hog = upload_payload(sb, payload("memhog"))
        r = sb.exec([hog, "512"], timeout=60)
        assert not r.ok and (r.oom_killed or r.signal == 9), r
        assert sb.exec("echo alive").stdout == "alive\n"


def test_disk_fill_writable_layer(client):
    """Attempt: fill the writable layer (the overlay's upper dir) with one endless file.
    Expected: ENOSPC at the sandbox's disk_mb (it is a per-sandbox tmpfs, not the host's
    disk); after deleting the file the sandbox writes again; host disk usage unchanged."""
    with client.create(disk_mb=64, memory_mb=256, ttl=600) as sb:
        host_free = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
        r = sb.exec("dd if=/dev/zero of=/root/fill bs=1M 2>&1; echo rc=$?", timeout=60)
        assert "No space left on device" in r.stdout and "rc=0" not in r.stdout, r.stdout
        size = int(sb.exec("stat -c %s /root/fill").stdout)
        assert 32 << 20 <= size <= 64 << 20, size
        # The host's disk did not absorb it.
        assert os.statvfs("/").f_bavail * os.statvfs("/").f_frsize > host_free - (32 << 20)
        # Small writes also fail while full; the file API reports it too.
        assert sb.exec("echo x > /root/more").exit_code != 0
        sb.exec("rm -f /root/fill", check=True)
        assert sb.exec("echo x > /root/more && cat /root/more").stdout == "x\n"
        sb.files.write("/root/api", b"y" * 4096)
        assert sb.files.read("/root/api") == b"y" * 4096


def test_disk_fill_tmp(client):
    """Attempt: fill /tmp, then /dev/shm, until writes fail.
    Expected: ENOSPC at the sandbox's disk_mb, which they share with the writable layer
    (directories of its tmpfs): while one is full nothing can be written in the others
    either; the sandbox is usable after deleting."""
    with client.create(disk_mb=64, memory_mb=512, ttl=600) as sb:
        for d in ("/tmp", "/dev/shm"):
            r = sb.exec(f"dd if=/dev/zero of={d}/fill bs=1M 2>&1; echo rc=$?", timeout=60)
            assert "No space left on device" in r.stdout and "rc=0" not in r.stdout, (d, r.stdout)
            size = int(sb.exec(f"stat -c %s {d}/fill").stdout)
            assert 32 << 20 <= size <= 64 << 20, (d, size)
            for other in ("/tmp", "/dev/shm", "/root"):
                assert sb.exec(f"head -c 65536 /dev/zero > {other}/more").exit_code != 0, (d, other)
            sb.exec(f"rm -f {d}/fill /tmp/more /dev/shm/more /root/more", check=True)
            assert sb.exec(f"echo ok > {d}/after && cat {d}/after").stdout == "ok\n"


def test_unbounded_output(client, daemon):
    """Attempt: `yes` forever on stdout and stderr (operators saw tens of GB of logs).
    Expected: output is cut at the per-call cap (stdout_truncated), the call ends at its
    timeout, the daemon's memory does not grow with the output; the default cap (16 MiB)
    also holds for a 64 MiB burst."""
    with client.create(ttl=600) as sb:
        rss0 = rss_kb(daemon.pid)
        r = sb.exec("yes & yes >&2 & wait", timeout=3, max_output_bytes=1 << 20)
        assert r.timed_out and r.stdout_truncated and r.stderr_truncated, r
        assert len(r.stdout_bytes) <= 1 << 20 and len(r.stderr_bytes) <= 1 << 20
        assert r.stdout_bytes.startswith(b"y\ny\n")
        r = sb.exec("head -c 64M /dev/zero", timeout=60)
        assert r.stdout_truncated and len(r.stdout_bytes) <= 16 << 20, r
        # Streaming: the consumer stops reading early; the command is cut at its timeout.
        got = 0
        for chunk in sb.exec_stream("yes", timeout=2, max_output_bytes=4 << 20):
            got += len(getattr(chunk, "data", b"") or b"")
        assert got <= 4 << 20
        rss1 = rss_kb(daemon.pid)
        assert rss1 - rss0 < 200 * 1024, (rss0, rss1)
        assert sb.exec("echo alive").stdout == "alive\n"


def test_open_files(hostile, payload):
    """Attempt: open files until the kernel refuses.
    Expected: EMFILE at the sandbox's RLIMIT_NOFILE (set by the daemon, not raisable from
    inside: raising the hard limit needs CAP_SYS_RESOURCE in the host's user namespace)."""
    p = upload_payload(hostile, payload("hostile_exhaust"))
    limit = int(hostile.exec("ulimit -Hn").stdout)
    assert limit <= 1 << 20
    r = hostile.exec([p, "fds"], timeout=30)
    m = re.search(r"fds=(\d+) errno=(\d+)", r.stdout)
    assert m and int(m.group(2)) == errno.EMFILE and int(m.group(1)) < limit, r
    r = hostile.exec(f"ulimit -Hn {limit * 4} 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout


def test_threads(client, payload):
    """Attempt: create threads until it fails (threads count against the pids limit).
    Expected: EAGAIN below pids; the sandbox and host keep working."""
    with client.create(pids=128, ttl=600) as sb:
        p = upload_payload(sb, payload("hostile_exhaust"))
        r = sb.exec([p, "threads"], timeout=30)
        m = re.search(r"threads=(\d+) errno=(\d+)", r.stdout)
        assert m and int(m.group(2)) == errno.EAGAIN and int(m.group(1)) < 128, r
        assert sb.exec("echo alive").stdout == "alive\n"


def _host_inotify_ok() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0o2000000)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_inotify_exhaustion(hostile, payload, bystander):
    """Attempt: take every inotify instance and watch the kernel will give, and hold them.
    Expected: the sandbox stops at its own quota (the daemon sets per-sandbox limits in the
    sandbox's user namespace); meanwhile host root and the bystander still get instances
    and watches (the budget of the host uid that owns the namespace is not drained)."""
    p = upload_payload(hostile, payload("hostile_exhaust"))
    proc = hostile.start([p, "inotify", "20"], timeout=60)
    wait_until(lambda: hostile.files.exists("/tmp/tp-inotify.holding") or proc.poll() is not None, 30, 0.2,
               "probe holding")
    try:
        assert proc.poll() is None, "the probe ended before holding"
        assert _host_inotify_ok(), "host root can no longer create inotify instances"
        r = bystander.sb.exec(["python3", "-c",
                               "import ctypes,os; l=ctypes.CDLL(None,use_errno=True); "
                               "fd=l.inotify_init1(0); os.makedirs('/tmp/w',exist_ok=True); "
                               "print(fd>=0, l.inotify_add_watch(fd,b'/tmp/w',2)>=0)"])
        assert r.stdout == "True True\n", r
    finally:
        try:
            proc.kill()
        except tidepool.TidepoolError:
            pass
    res = proc.wait(timeout=30)
    inst = re.search(r"instances=(\d+) errno=(\d+)", res.stdout)
    watches = re.search(r"watches=(\d+) errno=(\d+)", res.stdout)
    assert inst and int(inst.group(2)) == errno.EMFILE, res
    assert watches and int(watches.group(2)) == errno.ENOSPC, res


def test_children_outlive_command(hostile):
    """Attempt: leave sleeping children behind (background jobs, nohup, ignoring SIGHUP/TERM).
    Expected: when the command's exec returns, every process it started is gone."""
    r = hostile.exec("trap '' HUP TERM; sleep 1000 & nohup sleep 1001 >/dev/null 2>&1 & "
                     "(sleep 1002 &) ; echo started")
    assert r.stdout == "started\n"
    assert not [c for c in _ps(hostile) if "sleep" in c], _ps(hostile)


def test_escape_process_group(hostile):
    """Attempt: leave the command's process group and session (setsid, double fork,
    daemonize) so that a group kill misses the survivors.
    Expected: they are gone when the exec returns (the command runs in its own pid
    namespace, which the kernel empties when its init exits), also after a timeout."""
    r = hostile.exec("setsid sleep 1000 & setsid -f sleep 1001; "
                     "( ( setsid sh -c 'trap \"\" HUP TERM; exec sleep 1002' & ) & ); "
                     "python3 -c 'import os\nif os.fork()==0:\n os.setsid()\n if os.fork()==0:\n  os.execvp(\"sleep\",[\"sleep\",\"1003\"])' ;"
                     " echo started")
    assert "started" in r.stdout, r
    assert not [c for c in _ps(hostile) if "sleep" in c], _ps(hostile)
    r = hostile.exec("setsid -f sleep 1004; sleep 100", timeout=1)
    assert r.timed_out
    wait_until(lambda: not [c for c in _ps(hostile) if "sleep" in c], 5, 0.1, "escaped sleepers gone")
