"""Host-wide kernel resources: one sandbox must not take from the host or from its neighbours
what the kernel counts for the whole machine (issue: hostile code, round two).

Each case measures the attacker's share against its cap (never the host's exhaustion) and
checks the bystander: the host itself (this test process, root) or the module's bystander
sandbox. SECURITY.md lists every host-wide resource and how it is bounded.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import pathlib
import socket
import time

import pytest

import tidepool
from tp_testlib import processes_of, wait_until

libc = ctypes.CDLL(None, use_errno=True)
SYS_IO_SETUP, SYS_IO_DESTROY, SYS_FANOTIFY_INIT = 206, 207, 300
FAN_CLASS_NOTIF, FAN_REPORT_FID = 0, 0x200
NETLINK_ROUTE, NETLINK_NETFILTER = 0, 12


def py(sb, code: str, timeout: float = 60):
    """Runs python3 code in the sandbox; returns the JSON object it prints last."""
    r = sb.exec(["python3", "-c", code], timeout=timeout)
    assert r.exit_code == 0, r
    return json.loads(r.stdout.strip().splitlines()[-1])


def host_io_setup_works() -> bool:
    ctx = ctypes.c_ulong(0)
    if libc.syscall(SYS_IO_SETUP, 1, ctypes.byref(ctx)) != 0:
        return False
    libc.syscall(SYS_IO_DESTROY, ctx)
    return True


def aio_nr() -> int:
    return int(pathlib.Path("/proc/sys/fs/aio-nr").read_text())


def test_aio_contexts_are_refused(hostile):
    """Attempt: io_setup(1000) in a loop (fs.aio-nr is host-wide: 65,000 of 65,536 taken
    that way once; the test stops after 5). Expected: ENOSYS at once, aio-nr untouched,
    host root's io_setup works."""
    before = aio_nr()
    out = py(hostile, """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
got, err = 0, 0
for _ in range(5):  # 5,000 events at most: far below the host's aio-max-nr
    ctx = ctypes.c_ulong(0)
    if libc.syscall(206, 1000, ctypes.byref(ctx)) != 0:
        err = ctypes.get_errno(); break
    got += 1
print(json.dumps({"got": got, "errno": err}))
""")
    assert out == {"got": 0, "errno": errno.ENOSYS}, out
    assert aio_nr() <= before
    assert host_io_setup_works()


def test_vsock_and_unneeded_families_are_refused(hostile):
    """Attempt: bind and listen on a vsock port (host-wide: the host and other sandboxes
    then got EADDRINUSE), and open other families a sandbox has no use for.
    Expected: EAFNOSUPPORT for each, also with the family's high bits set; unix, inet,
    inet6 and netlink-route sockets still work."""
    out = py(hostile, """
import ctypes, json, socket
libc = ctypes.CDLL(None, use_errno=True)
res = {}
for name, fam in [("vsock", 40), ("alg", 38), ("key", 15), ("tipc", 30), ("rds", 21), ("bluetooth", 31)]:
    for hi in (0, 1 << 32):
        fd = libc.syscall(41, ctypes.c_long(fam | hi), 1, 0)
        res[f"{name}/{hi}"] = 0 if fd >= 0 else ctypes.get_errno()
for name, fam, typ in [("unix", socket.AF_UNIX, socket.SOCK_STREAM), ("inet", socket.AF_INET, socket.SOCK_STREAM),
                       ("inet6", socket.AF_INET6, socket.SOCK_DGRAM)]:
    socket.socket(fam, typ).close(); res[name] = 0
print(json.dumps(res))
""")
    assert {k: v for k, v in out.items() if "/" in k} == {k: errno.EAFNOSUPPORT for k in out if "/" in k}, out
    assert out["unix"] == out["inet"] == out["inet6"] == 0
    # The host keeps its vsock ports (when the host has vsock at all): a port binds and
    # listens on the host while the sandbox above is alive.
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError:
        return
    with s:
        s.bind((socket.VMADDR_CID_ANY, 40000 + os.getpid() % 20000))
        s.listen(1)


def test_netfilter_netlink_is_refused(hostile):
    """Attempt: reach nf_tables over raw netlink (NETLINK_NETFILTER), the interface behind
    recent container escapes. Expected: EPROTONOSUPPORT; the routing family still works
    (ip, getaddrinfo) and so does `ip link`."""
    out = py(hostile, """
import json, socket
res = {}
for name, proto in [("netfilter", 12), ("xfrm", 6), ("audit", 9), ("generic", 16), ("uevent", 15), ("route", 0), ("diag", 4)]:
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto).close(); res[name] = 0
    except OSError as e:
        res[name] = e.errno
print(json.dumps(res))
""")
    for name in ("netfilter", "xfrm", "audit", "generic", "uevent"):
        assert out[name] == errno.EPROTONOSUPPORT, out
    assert out["route"] == 0 and out["diag"] == 0, out
    r = hostile.exec("ip -o link show lo")
    assert r.exit_code == 0 and "lo" in r.stdout, r


def test_fanotify_is_refused_and_the_host_keeps_its_groups(hostile):
    """Attempt: fanotify_init until EMFILE (groups are counted per host uid, which every
    sandbox's root shared: 128 groups taken from all). Expected: EPERM at the first call;
    the host's own fanotify_init still works."""
    out = py(hostile, """
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
got, err = 0, 0
for _ in range(16):  # well below the 128 groups of a host uid
    if libc.syscall(300, 0x200, 0) < 0:
        err = ctypes.get_errno(); break
    got += 1
print(json.dumps({"got": got, "errno": err}))
""")
    assert out == {"got": 0, "errno": errno.EPERM}, out
    fd = libc.syscall(SYS_FANOTIFY_INIT, FAN_CLASS_NOTIF | FAN_REPORT_FID, os.O_RDONLY)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    os.close(fd)


def test_pseudo_terminals_are_capped_per_sandbox(hostile, bystander):
    """Attempt: open /dev/ptmx until it fails and hold them (kernel.pty.max is host-wide:
    the bystander's openpty() failed with ENOSPC). Expected: the attacker stops at its own
    cap (64) while the bystander still gets a terminal."""
    before = int(pathlib.Path("/proc/sys/kernel/pty/nr").read_text())
    grab = hostile.start(["python3", "-c", """
import os, time
fds, err = [], 0
try:
    while len(fds) < 200:  # past the cap (64), far below the host's kernel.pty.max
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    err = e.errno
open("/tmp/ptys", "w").write(f"{len(fds)} {err}")
time.sleep(120)
"""])
    wait_until(lambda: hostile.exec("cat /tmp/ptys 2>/dev/null").stdout, timeout=30, what="the pty grab")
    got, err = map(int, hostile.exec("cat /tmp/ptys").stdout.split())
    assert got <= 64 and err == errno.ENOSPC, (got, err)
    assert int(pathlib.Path("/proc/sys/kernel/pty/nr").read_text()) - before <= 64
    r = bystander.sb.exec("python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'")
    assert r.exit_code == 0 and r.stdout.startswith("/dev/pts/"), r
    grab.kill()


def _file_nr() -> int:
    return int(pathlib.Path("/proc/sys/fs/file-nr").read_text().split()[0])


def test_open_files_stop_at_the_sandboxes_share(client, bystander):
    """Attempt: hold as many open files as possible, in as many processes as the pids limit
    allows (one sandbox held 1,000,000 files, 41% of the host's fs.file-max, that way; the
    kernel does not charge open files to memory cgroups). Expected: the sandbox's total
    stays within its share, pids x RLIMIT_NOFILE (64 x 1024 here), and the host's count of
    open files grew by no more than that; the bystander and the host still open files."""
    pids = 64
    before = _file_nr()
    with client.create(pids=pids, memory_mb=1024, ttl=600) as sb:
        limit = int(sb.exec("ulimit -Hn").stdout)
        assert limit <= 1024, f"RLIMIT_NOFILE {limit}: the share would be pids x {limit}"
        grab = sb.start(["python3", "-c", """
import os, resource, time
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
r, w = os.pipe()
total = procs = 0
kids = []
while procs < 1000:
    try:
        pid = os.fork()
    except OSError:
        break  # the pids limit
    kids.append(pid)
    if pid == 0:
        n = 0
        try:
            while n < 1 << 20:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError:
            pass
        os.write(w, b"%d\\n" % n)
        time.sleep(300)
        os._exit(0)
    procs += 1
    total += int(os.read(r, 32))
# The peak is counted (and the host's count sampled by the test meanwhile); a few
# children go so that the test's own execs can start within the pids limit.
open("/tmp/files.tmp", "w").write(f"{total} {procs}")
time.sleep(2)
for pid in kids[:4]:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
os.rename("/tmp/files.tmp", "/tmp/files")
time.sleep(300)
"""])
        # At its peak the sandbox cannot start another command (the pids limit): the
        # host's count is sampled meanwhile, then the result read once room was made.
        grown = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            grown = max(grown, _file_nr() - before)
            try:
                r = sb.exec("cat /tmp/files 2>/dev/null")
                if r.ok and r.stdout:
                    break
            except tidepool.TidepoolError:
                pass  # no process to spare for the command yet
            time.sleep(0.2)
        total, procs = map(int, sb.exec("cat /tmp/files").stdout.split())
        # The bystander and the host (this process) still open files meanwhile.
        r = bystander.sb.exec("python3 -c 'import os; print(len([os.open(\"/dev/null\", 0) "
                              "for _ in range(500)]))'")
        assert r.exit_code == 0 and r.stdout == "500\n", r
        with open("/dev/null") as f:
            assert f.readable()
        grab.kill()
    assert procs > 8 and total > procs * 900, (total, procs)  # it did try
    assert total <= pids * limit, (total, procs)
    # The host-wide counter also moves with whatever else runs: only bound it from above.
    assert grown <= pids * limit + 20000, grown


def _has_cap_sys_resource() -> bool:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) & (1 << 24))
    return False


def _agent_host_pid(sandbox_id: str) -> int:
    for pid in processes_of(sandbox_id):
        try:
            if pathlib.Path(f"/proc/{pid}/comm").read_text().strip() == "tp-agent":
                return pid
        except OSError:
            continue
    raise AssertionError(f"no tp-agent among the processes of {sandbox_id}")


def test_agent_cannot_be_made_the_oom_victim(client, payload):
    """Attempt: `echo 1000 > /proc/1/oom_score_adj` (the agent), then exhaust memory: the
    agent was killed, the exec answered 503 and the sandbox ended failed. Expected: the
    write does not reach the agent (-999, set by the daemon), the memory hog is the one
    killed, its exec answers with the kill, the sandbox keeps running."""
    from hostile_lib import upload_payload
    with client.create(memory_mb=64, ttl=600) as sb:
        agent = _agent_host_pid(sb.id)
        # -999 where the daemon may lower a score (CAP_SYS_RESOURCE), else the default 0.
        expected = "-999" if _has_cap_sys_resource() else "0"
        assert pathlib.Path(f"/proc/{agent}/oom_score_adj").read_text().strip() == expected
        sb.exec("echo 1000 > /proc/1/oom_score_adj; echo 15 > /proc/1/oom_adj; "
                "echo 1000 > /proc/1/task/1/oom_score_adj; true")
        assert pathlib.Path(f"/proc/{agent}/oom_score_adj").read_text().strip() == expected
        # Commands start above the agent: they are what the OOM killer picks.
        assert sb.exec("cat /proc/self/oom_score_adj").stdout == "500\n"
        hog = upload_payload(sb, payload("memhog"))
        r = sb.exec([hog, "512"], timeout=60)
        assert not r.ok and (r.oom_killed or r.signal == 9), r
        assert sb.refresh().state == "running"
        assert sb.exec("echo alive").stdout == "alive\n"
        assert _agent_host_pid(sb.id) == agent


def _tcp_mem_pages() -> int:
    for line in pathlib.Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            f = line.split()
            return int(f[f.index("mem") + 1])
    return 0


def test_tcp_buffers_count_against_the_sandbox(client):
    """Attempt: loopback TCP pairs that are written to and never read (the host's TCP
    memory went past its tcp_mem maximum while the 64 MiB sandbox was charged 7 MiB).
    Expected: the sandbox's unread buffers stop near its memory limit (within 1.5x: the
    charge lags the buffers a little); the test itself stops at 3x that limit, far below
    the host's tcp_mem."""
    limit_mb = 64
    with client.create(memory_mb=limit_mb, ttl=600) as sb:
        _tcp_flood(sb, limit_mb)


def _tcp_flood(hostile, limit_mb: int) -> None:
    before = _tcp_mem_pages()
    flood = hostile.start(["python3", "-c", f"""
import socket, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(512)
pairs, sent, chunk = [], 0, b"x" * 65536
cap = 3 * {limit_mb} << 20
for _ in range(250):
    c = socket.create_connection(ls.getsockname()); s, _ = ls.accept()
    c.setblocking(False); pairs.append((c, s))
    while sent < cap:
        try:
            sent += c.send(chunk)
        except (BlockingIOError, OSError):
            break
    if sent >= cap:
        break
open("/tmp/sent", "w").write(str(sent))
time.sleep(120)
"""])
    wait_until(lambda: hostile.exec("cat /tmp/sent 2>/dev/null").stdout, timeout=60, what="the senders")
    grown_mb = (_tcp_mem_pages() - before) * 4096 / (1 << 20)
    sent_mb = int(hostile.exec("cat /tmp/sent").stdout) / (1 << 20)
    flood.kill()
    # What the sandbox could leave in unread buffers is its share: the host-wide
    # counter (grown_mb) also moves with whatever else runs on the host.
    assert sent_mb <= limit_mb * 1.5, f"sandbox left {sent_mb:.0f} MiB unread (host TCP memory +{grown_mb:.0f} MiB)"


def test_udp_buffers_count_against_the_sandbox(client):
    """Attempt: loopback UDP sockets sent to and never read, 480 KB each, up to 3x the
    sandbox's memory limit in all (udp_mem is host-wide; without a bound a 64 MiB sandbox
    queued 175 MiB that way). Expected: what the sandbox's sockets hold unread (their
    receive queues, read from its own /proc/net/udp) stays near its memory limit (within
    1.5x): cgroup v2 charges socket memory to memory.max; on v1 the limit set on the
    cgroup's TCP buffers (memory.kmem.tcp.limit_in_bytes) charges every protocol's."""
    limit_mb = 64
    with client.create(memory_mb=limit_mb, ttl=600) as sb:
        flood = sb.start(["python3", "-c", f"""
import socket, time
socks, payload, tried = [], b"x" * 60000, 0
while tried < 3 * {limit_mb} << 20:
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(("127.0.0.1", 0))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(8):
        try:
            s.sendto(payload, r.getsockname())
        except OSError:
            pass
        tried += len(payload)
    socks += [r, s]
open("/tmp/udp", "w").write(str(len(socks)))
time.sleep(120)
"""])
        wait_until(lambda: sb.exec("cat /tmp/udp 2>/dev/null").stdout, timeout=120,
                   what="the UDP senders")
        queued = 0
        for line in sb.exec("cat /proc/net/udp").stdout.splitlines()[1:]:
            tx_rx = line.split()[4]  # tx_queue:rx_queue, hex
            queued += int(tx_rx.split(":")[1], 16)
        flood.kill()
    queued_mb = queued / (1 << 20)
    assert queued_mb > 8, f"the flood queued only {queued_mb:.1f} MiB: it did not run"
    assert queued_mb <= limit_mb * 1.5, f"sandbox left {queued_mb:.0f} MiB unread in UDP queues"
