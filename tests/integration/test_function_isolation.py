"""Isolation of function-tier calls (docs/function-tier.md, SECURITY.md).

Each call runs in a child of its own: no network, a read-only root with a fresh scratch
tmpfs, its own pid namespace (nothing else visible), no state surviving a call, a fork
or memory bomb contained by the call's own cgroup; a call that attacks its zygote (kill
-1, ptrace, the zygote's memory, shared memory, its control socket) changes nothing for
the worker pool or the next call. After every test the workers are back at their warm
state (fn_clean), and the workers that served the tests are the same ones (no call
could take one down).
"""
from __future__ import annotations

import concurrent.futures
import json
import time

from fn_lib import fn, fn_clean, worker_ids  # noqa: F401  (fixtures)


def py(c, src, **kw):
    r = c.run_code("python", src, **kw)
    assert r.verdict == "ok", r
    return r.stdout


def test_no_network(fn_clean):
    out = py(fn_clean, """
import socket, json, os
res = {}
for fam, addr in ((socket.AF_INET, ("1.1.1.1", 53)), (socket.AF_INET, ("127.0.0.1", 1)), (socket.AF_INET6, ("::1", 1))):
    try:
        socket.create_connection(addr, timeout=1)
        res[str(addr)] = "connected"
    except OSError as e:
        res[str(addr)] = e.errno
res["ifaces"] = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
res["routes"] = open("/proc/net/route").read().splitlines()[1:]
print(json.dumps(res))
""")
    res = json.loads(out)
    assert "connected" not in res.values(), res
    assert res["ifaces"] == ["lo"] and res["routes"] == [], res  # loopback (down) and no route


def test_no_writes_outside_scratch(fn_clean):
    out = py(fn_clean, """
import os, json
res = {}
for p in ("/etc/x", "/usr/x", "/x", "/root/x", "/dev/x", "/var/tmp/x", "/proc/sys/kernel/hostname"):
    try:
        open(p, "w").write("1")
        res[p] = "written"
    except OSError as e:
        res[p] = e.errno
open("/tmp/ok", "w").write("1")
res["tmp"] = os.listdir("/tmp")
res["cwd"] = os.getcwd()
print(json.dumps(res))
""")
    res = json.loads(out)
    assert "written" not in res.values(), res
    assert "ok" in res["tmp"] and res["cwd"] == "/tmp"


def test_scratch_is_size_limited(fn_clean):
    r = fn_clean.run_code("bash", "head -c 300M /dev/zero > big; echo rc=$?", memory_mb=1024, timeout=20)
    assert "rc=1" in r.stdout or r.verdict == "memory_limit", r
    assert "No space left" in r.stderr or r.verdict == "memory_limit"


def test_no_capabilities_no_namespaces_no_mounts(fn_clean):
    out = py(fn_clean, """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
st = {l.split(":")[0]: l.split(":")[1].strip() for l in open("/proc/self/status") if l.startswith(("Cap", "NoNewPrivs", "Seccomp"))}
res = {"uid": os.getuid(), "status": st}
for name, flag in (("user", 0x10000000), ("net", 0x40000000), ("mnt", 0x00020000)):
    res[name] = (libc.unshare(flag), ctypes.get_errno())
res["mount"] = (libc.mount(b"tmpfs", b"/mnt", b"tmpfs", 0, None), ctypes.get_errno())
print(json.dumps(res))
""")
    res = json.loads(out)
    assert res["uid"] >= 20000
    assert res["status"]["CapEff"] == "0000000000000000" and res["status"]["CapPrm"] == "0000000000000000"
    assert res["status"]["NoNewPrivs"] == "1" and res["status"]["Seccomp"] == "2"
    for k in ("user", "net", "mnt", "mount"):
        assert res[k][0] == -1, (k, res[k])


def test_sees_only_its_own_processes(fn_clean):
    """Any program sees its own processes only (bash: pid 1 supervises it as pid 2)."""
    sh = fn_clean.run_code("bash", "echo $$ $PPID; ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '")
    assert sh.ok and sh.stdout.split()[:2] == ["2", "1"], sh
    out = py(fn_clean, """
import os, json, subprocess
p = subprocess.Popen(["sleep", "10"])
pids = sorted(int(x) for x in os.listdir("/proc") if x.isdigit())
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "pids": pids, "child": p.pid}))
p.kill()
""")
    res = json.loads(out)
    # A python program is pid 1 of its own namespace (its parent, the zygote, is outside it).
    assert res["pid"] == 1 and res["ppid"] == 0, res
    assert res["pids"] == [1, res["child"]], res


def test_concurrent_calls_do_not_see_each_other(fn_clean, make_client):
    """One call leaves a file, a process and shared memory behind while another looks."""
    c = make_client(timeout=120)  # closed after the test: its threads' connections too
    holder = """
import os, time, subprocess, sys
open('/tmp/secret-holder', 'w').write('s3cret')
with open('/dev/shm/holder', 'w') as f: f.write('shm')
subprocess.Popen(['sleep', '30'])
print('ready', flush=True)
time.sleep(3)
"""
    looker = """
import os, json
print(json.dumps({
  "tmp": sorted(os.listdir('/tmp')), "shm": sorted(os.listdir('/dev/shm')),
  "procs": sorted(int(x) for x in os.listdir('/proc') if x.isdigit()),
  "secret": [p for p in ('/tmp/secret-holder', '/secret-holder', '/dev/shm/holder') if os.path.exists(p)],
}))
"""
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        h = ex.submit(c.run_code, "python", holder, timeout=10)
        time.sleep(0.8)
        seen = json.loads(py(c, looker))
        held = h.result()
    assert held.ok, held
    assert seen["tmp"] == ["main.py"] and seen["shm"] == [] and seen["secret"] == [], seen
    assert seen["procs"] == [1]  # itself alone


def test_nothing_survives_a_call(fn_clean):
    py(fn_clean, """
import json, os, sys
open('/tmp/left', 'w').write('x')
with open('/dev/shm/left', 'w') as f: f.write('x')
json.dumps = None          # a preloaded module changed
sys.modules['evil'] = 1
os.environ['LEFT'] = '1'
""")
    after = json.loads(py(fn_clean, """
import json, os, sys
print(json.dumps({"tmp": sorted(os.listdir('/tmp')), "shm": os.listdir('/dev/shm'),
                  "evil": 'evil' in sys.modules, "env": 'LEFT' in os.environ}))
"""))
    assert after == {"tmp": ["main.py"], "shm": [], "evil": False, "env": False}


def test_sysv_shared_memory_is_per_call(fn_clean):
    create = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x7071, 4096, 0o1666))   # IPC_CREAT | 0666
"""
    look = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x7071, 0, 0o666), ctypes.get_errno())
"""
    assert int(py(fn_clean, create)) >= 0
    shmid, errno = py(fn_clean, look).split()
    assert shmid == "-1" and errno == "2"  # ENOENT: the first call's segment is gone with its namespace


LEAVE_NETWORK_STATE = """
import os, socket
a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
a.bind(b"\\0tp-left")                      # an abstract name
a.listen(1)
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.bind(("0.0.0.0", 7777))
t.listen(1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", 7778))
# Sockets in flight in their own queue: alive after the call until the kernel's unix
# garbage collector finds them.
p, q = socket.socketpair()
socket.send_fds(p, [b"x"], [p.fileno(), q.fileno(), a.fileno(), t.fileno()])
for fam, addr in ((socket.AF_INET, ("10.255.0.1", 9)), (socket.AF_INET6, ("fd00::1", 9))):
    try:
        socket.socket(fam, socket.SOCK_DGRAM).sendto(b"x", addr)   # moves the IP counters
    except OSError:
        pass
print("left")
"""

LOOK_AT_NETWORK = """
import json, os, socket
res = {"ino": os.stat("/proc/self/ns/net").st_ino,
       "unix": open("/proc/net/unix").read().splitlines()[1:],
       "sockets": open("/proc/net/sockstat").read().splitlines()[0]}
snmp = open("/proc/net/snmp").read().splitlines()
res["no_routes"] = dict(zip(snmp[0].split()[1:], snmp[1].split()[1:]))["OutNoRoutes"]
res["no_routes6"] = [l.split()[1] for l in open("/proc/net/snmp6") if l.startswith("Ip6OutNoRoutes")]
binds = {}
for name, fam, kind, addr in (("abstract", socket.AF_UNIX, socket.SOCK_STREAM, b"\\0tp-left"),
                              ("tcp", socket.AF_INET, socket.SOCK_STREAM, ("0.0.0.0", 7777)),
                              ("udp", socket.AF_INET, socket.SOCK_DGRAM, ("0.0.0.0", 7778))):
    s = socket.socket(fam, kind)
    try:
        s.bind(addr)
        binds[name] = "free"
    except OSError as e:
        binds[name] = e.errno
    s.close()
res["binds"] = binds
print(json.dumps(res))
"""


def test_network_namespace_of_a_slot_shows_nothing_of_its_last_call(fn_clean, daemon):
    """A slot's children share one network namespace in turn, so it must show nothing of
    the calls before: not their sockets (abstract, listening, bound, in flight), not the
    counters they moved. A call that left something gets its slot a new namespace."""
    since = daemon.log_size()
    for _ in range(3):
        assert py(fn_clean, LEAVE_NETWORK_STATE) == "left\n"
    seen = [json.loads(py(fn_clean, LOOK_AT_NETWORK)) for _ in range(40)]
    for s in seen:
        assert s["unix"] == [] and s["sockets"] == "sockets: used 0", s
        assert s["no_routes"] == "0" and s["no_routes6"] in ([], ["0"]), s
        assert s["binds"] == {"abstract": "free", "tcp": "free", "udp": "free"}, s
    # The calls that looked changed nothing: their namespaces served again (else this test
    # would prove nothing of reuse), while the ones that left state were replaced.
    inodes = [s["ino"] for s in seen]
    assert len(set(inodes)) < len(inodes), inodes
    assert "changed its network namespace" in daemon.log_tail(400, since)


def test_hostile_call_cannot_touch_its_zygote(fn_clean):
    before = worker_ids(fn_clean)
    out = py(fn_clean, """
import ctypes, json, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
res = {}
try:
    os.kill(-1, signal.SIGKILL)   # everything it may signal: only its own namespace
except OSError as e:
    res["kill-1"] = e.errno
res["ptrace_parent"] = (libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())
res["ptrace_1"] = (libc.ptrace(16, 1, 0, 0), ctypes.get_errno())
for p in ("/proc/1/mem", "/proc/1/environ"):
    try:
        open(p, "rb").read(16); res[p] = "read"
    except OSError as e:
        res[p] = e.errno
fds = sorted(int(x) for x in os.listdir("/proc/self/fd"))
res["fds"] = fds
# Inherited descriptors: nothing of the zygote's (its stdin and stdout lead to the agent).
targets = set()
for x in fds:
    try:
        targets.add(os.readlink(f"/proc/self/fd/{x}").split(":")[0])
    except OSError:
        pass  # the listing's own descriptor, closed by now
res["fd_targets"] = sorted(targets)
print(json.dumps(res))
""")
    res = json.loads(out)
    assert res["ptrace_parent"][0] == -1 and res["ptrace_1"][0] == -1, res
    assert res["/proc/1/mem"] != "read" and res["/proc/1/environ"] != "read", res
    # stdin (its memfd), stdout, stderr, the listing, and where it reports its own end.
    assert res["fds"] == [0, 1, 2, 3, 200], res
    assert "socket" not in res["fd_targets"], res
    assert worker_ids(fn_clean) == before
    assert fn_clean.run_code("python", "print(2)").stdout == "2\n"


def test_fork_bomb_is_contained(fn_clean):
    before = worker_ids(fn_clean)
    r = fn_clean.run_code("python", """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
""", timeout=2)
    assert r.verdict == "time_limit", r
    r = fn_clean.run_code("bash", "bomb() { bomb | bomb & }; bomb; wait", timeout=2)
    assert r.verdict in ("time_limit", "ok", "runtime_error"), r
    assert worker_ids(fn_clean) == before
    assert py(fn_clean, "print(3)") == "3\n"


def test_memory_bomb_is_contained(fn_clean, make_client):
    c = make_client(timeout=120)
    before = worker_ids(fn_clean)
    bomb = "x = []\nwhile True: x.append(bytearray(1 << 24))"
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: c.run_code("python", bomb, memory_mb=256, timeout=20), range(4)))
    for r in results:
        assert r.verdict == "memory_limit", r
    assert worker_ids(fn_clean) == before
    assert py(fn_clean, "print(4)") == "4\n"


def test_kill_of_siblings_reaches_no_other_call(fn_clean, make_client):
    """Concurrent calls try to kill everything they can; a long call next to them lives."""
    c = make_client(timeout=120)
    long = "import time; time.sleep(2); print('alive')"
    killer = "import os, signal\nfor p in range(1, 5000):\n    try: os.kill(p, signal.SIGKILL)\n    except OSError: pass\nprint('done')"
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        victim = ex.submit(c.run_code, "python", long, timeout=10)
        time.sleep(0.3)
        killers = [ex.submit(c.run_code, "python", killer) for _ in range(3)]
        for k in killers:
            k.result()
        v = victim.result()
    assert v.ok and v.stdout == "alive\n", v


def test_output_limit_stops_a_flood_without_hurting_others(fn_clean):
    r = fn_clean.run_code("bash", "yes xxxxxxxxxxxxxxxx", max_output_bytes=1 << 20, timeout=20)
    assert r.verdict == "output_limit" and len(r.stdout_bytes) == 1 << 20
    assert py(fn_clean, "print(5)") == "5\n"
