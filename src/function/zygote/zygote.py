# Tidepool function-tier zygote (docs/function-tier.md).
#
# Runs as root of a function worker sandbox (a container-tier sandbox created by
# src/function/zygote_worker.cpp), started by tp-agent as `python3 -c <this file>`.
# It speaks the frame protocol of src/function/zygote_codec.h on its stdin and
# stdout (the agent relays both to the daemon).
#
# What it promises:
# - It never runs call code and never reads call data. The source, stdin and files of a
#   call are moved by the kernel (splice) from stdin into a sealed memfd that only the
#   call's child maps; the call's stdout, stderr and fetched files are spliced from the
#   child's pipes to stdout. The zygote itself reads only frame headers and the call's
#   limits (the "meta" JSON). So no later child can find an earlier call's data in the
#   memory it inherits.
# - Each call runs in a child cloned ahead of time ("warm", by the forker: a copy of the
#   zygote made once its modules are loaded) with its own pid, mount, ipc and uts
#   namespaces and its slot's network namespace (checked after every call to hold
#   nothing of it, else replaced): pid 1 of its own pid namespace (so killing it kills
#   everything the call started), a read-only view of the sandbox's root, fresh tmpfs on
#   /tmp (the call's scratch, size-limited) and /dev/shm, its own /proc and devpts, no
#   network interface up, a memory and a pids cgroup of its own, a uid of its own with no
#   capabilities, no_new_privs and the container tier's seccomp filter. A child serves
#   one call and is thrown away.
# - The zygote is single-threaded; everything below runs on its event loop.
#
# Python 3.11 has no os.unshare and no clone with namespace flags: ctypes calls libc
# (PyDLL: the GIL is held across the call, as os.fork holds it around fork()).
import ctypes
import fcntl
import gc
import json
import os
import platform
import select
import signal
import socket
import struct
import sys
import termios
import time

_libc = ctypes.PyDLL(None, use_errno=True)
_api = ctypes.pythonapi

CLONE_NEWNS = 0x00020000
CLONE_PARENT = 0x00008000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2
F_SETPIPE_SZ = 1031
F_ADD_SEALS = 1033
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE = 1, 2, 4, 8

_ARCH = platform.machine()
if _ARCH == "x86_64":
    SYS_CLONE, SYS_MOUNT_SETATTR = 56, 442
elif _ARCH in ("aarch64", "arm64"):
    SYS_CLONE, SYS_MOUNT_SETATTR = 220, 442
else:
    raise SystemExit(f"zygote: unsupported architecture {_ARCH}")

# Frames (zygote_codec.h). In: u32 type, u32 call, u64 payload_len, u32 meta_len.
IN_HDR = struct.Struct("<IIQI")
IN_INIT, IN_CALL, IN_KILL, IN_QUIT = 1, 2, 3, 4
# Out: u32 type, u32 call, u64 len.
OUT_HDR = struct.Struct("<IIQ")
OUT_READY, OUT_STDOUT, OUT_STDERR, OUT_FILES, OUT_EXIT, OUT_FAILED, OUT_LOG = 1, 2, 3, 4, 5, 6, 7
# Records of the files stream a child writes on fd 3: u8 kind, u32 name_len, u64 len.
REC_HDR = struct.Struct("<BIQ")
REC_FILE, REC_MISSING, REC_STATUS, REC_ERROR = 1, 2, 3, 4

CHUNK = 1 << 16


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _check(rc, what):
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


def unshare(flags):
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(src, target, fstype, flags, data):
    _check(_libc.mount(src.encode() if src else None, target.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                       data.encode() if data else None),
           f"mount({src}, {target}, {fstype}, {data})")


def umount(target, flags=0):
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount2({target})")


def mount_setattr_recursive(path, attr_set):
    a = MountAttr(attr_set, 0, 0, 0)
    _check(_libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(-100), path.encode(),
                         ctypes.c_uint(AT_RECURSIVE), ctypes.byref(a), ctypes.c_size_t(32)),
           f"mount_setattr({path}, AT_RECURSIVE)")


def setns(fd, nstype):
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({fd}, {nstype:#x})")


# What of a network namespace a call could change without privilege, and so leave for
# the next call of its slot: its sockets of any family (sockstat's "sockets: used" counts
# every socket of the namespace, also those in flight in a unix socket's queue: an
# abstract name lives as long as its socket; "tw" counts TCP's TIME_WAIT) and the
# counters of its IP stack (snmp, snmp6, netstat: a send without a route moves them).
# The fields of sockstat that count for the whole host (orphans, allocated, memory) are
# left out. Routes, addresses, devices (its loopback stays down), firewall rules and
# sysctls need CAP_NET_ADMIN there, which no call has.
_NET_FILES = ("/proc/self/net/sockstat", "/proc/self/net/snmp", "/proc/self/net/snmp6",
              "/proc/self/net/netstat")
_NET_GLOBAL = (b"orphan", b"alloc", b"mem")


def net_fingerprint():
    """The state of the current network namespace that _NET_FILES shows, as bytes: the
    same before and after a call that left nothing in it."""
    parts = []
    for path in _NET_FILES:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # e.g. a kernel without IPv6
            parts.append(b"-")
            continue
        try:
            data = os.read(fd, 1 << 16)
            while True:
                more = os.read(fd, 1 << 16)
                if not more:
                    break
                data += more
        finally:
            os.close(fd)
        if path.endswith("/sockstat"):
            words = data.split()
            data = b" ".join(w for i, w in enumerate(words)
                             if w not in _NET_GLOBAL and (i == 0 or words[i - 1] not in _NET_GLOBAL))
        parts.append(data)
    return b"\0".join(parts)


def prctl(op, arg):
    _check(_libc.prctl(ctypes.c_int(op), ctypes.c_ulong(arg), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0)), f"prctl({op})")


def clone_isolated(flags):
    """fork() into new namespaces: the raw clone syscall (no CLONE_VM, no stack), with the
    interpreter's fork hooks around it exactly as os.fork() runs them. Returns 0 in the
    child, the child's pid in the parent."""
    _api.PyOS_BeforeFork()
    pid = _libc.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong(flags | signal.SIGCHLD),
                        None, None, None, None)
    if pid == 0:
        _api.PyOS_AfterFork_Child()
        return 0
    err = ctypes.get_errno()
    _api.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(err, f"clone({flags:#x}): {os.strerror(err)}")
    return pid


def write_file(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode() if isinstance(data, str) else data)
    finally:
        os.close(fd)


def read_file(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 1 << 16)
        while True:
            more = os.read(fd, 1 << 16)
            if not more:
                return data.decode()
            data += more
    finally:
        os.close(fd)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        b = os.read(fd, n - len(buf))
        if not b:
            return None
        buf += b
    return bytes(buf)


def splice_exact(src, dst, n):
    while n > 0:
        moved = os.splice(src, dst, n)
        if moved == 0:
            raise EOFError("splice: end of input")
        n -= moved


def move_fds(mapping):
    """dup2s each source onto its target fd ({target: source}) without clobbering a source
    that is still to be moved; the targets are inheritable."""
    tmp = {t: fcntl.fcntl(src, fcntl.F_DUPFD_CLOEXEC, 100) for t, src in mapping.items()}
    for t, fd in tmp.items():
        os.dup2(fd, t)
    for fd in tmp.values():
        os.close(fd)


def fionread(fd):
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    return struct.unpack("i", buf)[0]


# ---------------------------------------------------------------------------------------
# The child: everything below up to the Zygote class runs in a cloned child only.


def _child_setup(cfg, slot, flavor, cg_dirs):
    """Isolates a freshly cloned child (pid 1 of its namespaces) before any call arrives.
    Runs as the sandbox's root; ends as the slot's uid without capabilities, under seccomp."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for d in cg_dirs:  # first: everything this child ever starts is born in its cgroups
        write_file(d + "/" + cfg["_join"], "0")
    setns(5, CLONE_NEWNET)  # its slot's network namespace (Zygote.spawn)
    os.close(5)
    try:
        write_file("/proc/self/oom_score_adj", "1000")  # a call, not the zygote, is the OOM victim
    except OSError:
        pass
    uid = cfg["uid_base"] + slot
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    # Read-only everywhere, then fresh writable places of its own on top. (Not nodev:
    # /dev is the sandbox's read-only bind of a few harmless nodes, null among them.)
    mount_setattr_recursive("/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)
    umount(cfg["private_dir"], MNT_DETACH)  # the zygote's cgroup mounts
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={cfg['scratch_bytes']},nr_inodes={cfg['scratch_inodes']},mode=0755,uid={uid},gid={uid}")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={cfg['shm_bytes']},mode=1777")
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
          "newinstance,ptmxmode=0666,mode=0620,gid=5,max=16")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    socket.sethostname("sandbox")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # every capability is gone from here on
    prctl(PR_SET_DUMPABLE, 0)  # what the call runs cannot trace or read pid 1
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prog = cfg["_seccomp"]
    fprog = SockFprog(len(prog) // 8, ctypes.cast(ctypes.c_char_p(prog), ctypes.c_void_p))
    _check(_libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                       ctypes.byref(fprog), ctypes.c_ulong(0), ctypes.c_ulong(0)), "seccomp")
    os.chdir("/tmp")
    return uid


def _record(kind, name, data):
    n = name.encode()
    write_all(3, REC_HDR.pack(kind, len(n), len(data)) + n)
    if data:
        write_all(3, data)


def _report_error(message):
    try:
        _record(REC_ERROR, "", message.encode("utf-8", "replace"))
    except OSError:
        pass


def _safe_path(p):
    """A request's file path as a path under /tmp, or None when it leaves it."""
    if p.startswith("/tmp/"):
        p = p[5:]
    if not p or p.startswith("/") or "\0" in p:
        return None
    parts = [x for x in p.split("/") if x not in ("", ".")]
    if not parts or any(x == ".." for x in parts):
        return None
    return "/tmp/" + "/".join(parts)


def _write_files(req, memfd, off):
    for f in req.get("files", []):
        path = _safe_path(f["path"])
        size = f["size"]
        if path is None:
            raise ValueError(f"file path {f['path']!r} is outside the scratch directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     f.get("mode", 0o644))
        try:
            o, left = off, size
            while left > 0:
                n = os.sendfile(fd, memfd, o, left)
                if n == 0:
                    raise EOFError("request ended inside a file")
                o += n
                left -= n
            os.fchmod(fd, f.get("mode", 0o644))
        finally:
            os.close(fd)
        off += size
    return off


def _set_limits(req):
    import resource
    cpu = req.get("cpu_seconds")
    if cpu:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = req.get("nofile", 1024)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    stack = req.get("stack_bytes")
    if stack:
        soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
        if hard == resource.RLIM_INFINITY or stack <= hard:
            resource.setrlimit(resource.RLIMIT_STACK, (stack, hard))


def _status_of(wstatus):
    if os.WIFSIGNALED(wstatus):
        return {"exit_code": None, "signal": os.WTERMSIG(wstatus)}
    return {"exit_code": os.WEXITSTATUS(wstatus), "signal": 0}


def _fetch(req):
    """Records the files `req` names ({"fetch": [...], "fetch_bytes": N}) on fd 3."""
    limit = req.get("fetch_bytes", 64 << 20)
    for name in req.get("fetch", []):
        path = _safe_path(name)
        try:
            if path is None:
                raise FileNotFoundError(name)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                import stat as _st
                st = os.fstat(fd)
                if not _st.S_ISREG(st.st_mode) or st.st_size > limit:
                    raise FileNotFoundError(name)
                data = bytearray()
                while True:
                    b = os.read(fd, 1 << 20)
                    if not b:
                        break
                    data += b
                    if len(data) > limit:
                        raise FileNotFoundError(name)
            finally:
                os.close(fd)
            limit -= len(data)
            _record(REC_FILE, name, bytes(data))
        except OSError:
            _record(REC_MISSING, name, b"")


def _run_python(req, memfd, stdin_off):
    """Runs the call's program in this process (forked from the preloaded interpreter) the
    way `python3 FILE ARGS...` would: __main__, sys.argv, sys.path[0], tracebacks, exit codes.
    What runs after the program (its status report) uses only functions bound before it
    ran, so a program that changes os, json or struct cannot break it."""
    import builtins
    import io
    import resource
    import types
    script = req["argv"][1]
    sys.argv = list(req["argv"][1:])
    sys.path[0] = os.path.dirname(script)
    os.lseek(memfd, stdin_off, os.SEEK_SET)
    os.dup2(memfd, 0)
    os.close(memfd)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding="utf-8", errors="strict")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                                   encoding="utf-8", errors="strict")
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                   encoding="utf-8", errors="backslashreplace",
                                                   line_buffering=True)
    # fd 3 (the call's files stream) moves out of the way; this process reports its own
    # end on it (a program can only speak for its own call there).
    report = fcntl.fcntl(3, fcntl.F_DUPFD_CLOEXEC, 200)
    os.close(3)
    write, exit_, getrusage, pack = os.write, os._exit, resource.getrusage, REC_HDR.pack
    self_, children = resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN

    def cpu_us():
        a, b = getrusage(self_), getrusage(children)
        return int((a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime) * 1e6)

    cpu0 = cpu_us()

    def end(code, signo):
        body = ('{"exit_code": %s, "signal": %d, "cpu_us": %d}'
                % ("null" if signo else str(code), signo, cpu_us() - cpu0)).encode()
        try:
            write(report, pack(REC_STATUS, 0, len(body)) + body)
        except OSError:
            pass
        exit_(code)

    # The program is pid 1 of its namespace, where a signal it sends itself (kill(getpid(),
    # SIGTERM), raise_signal, alarm) would be ignored instead of ending it: these handlers
    # end it as the default action would, and say so. (It may install its own, as
    # anywhere; a self-sent SIGKILL or SIGSTOP stays ignored, abort() ends in SIGSEGV.)
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
              signal.SIGALRM, signal.SIGXCPU, signal.SIGVTALRM, signal.SIGPROF):
        signal.signal(s, lambda signo, frame: end(128 + signo, signo))
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    main.__cached__ = None
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(script, "rb") as f:
            src = f.read()
        exec(compile(src, script, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: B902 - what the interpreter itself does
        tb = e.__traceback__  # the first frame is this function's: not the program's
        e = e.with_traceback(tb.tb_next if tb is not None else None)
        sys.excepthook(type(e), e, e.__traceback__)
        code = 1
    end(_finish_python(code), 0)


def _exit_code(e):
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        print(c, file=sys.stderr)
    except Exception:  # noqa: BLE001
        pass
    return 1


def _finish_python(code):
    """What the interpreter does at exit: wait for threads, atexit, flush stdio."""
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:  # noqa: BLE001
        pass
    try:
        import atexit
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:  # noqa: BLE001
            code = code or 120
    return code


def _supervise(pid, req):
    """pid 1 of a call whose program runs as its child (exec languages, prestarted
    runtimes): reaps every process that ends up as its child, as an init does, until the
    program ended; then reports the program's status and fetches the files asked for."""
    while True:
        try:
            got, wstatus, ru = os.wait4(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(0)
        if got == pid:
            break
    st = _status_of(wstatus)
    st["cpu_us"] = int((ru.ru_utime + ru.ru_stime) * 1e6)
    _record(REC_STATUS, "", json.dumps(st).encode())
    _fetch(req)
    os._exit(0)


def _spawn(req, env, memfd, stdin_off):
    """Starts the program as pid 2 (vfork-style: no copy of this interpreter's page
    tables), stdin from the call's memfd, default signal dispositions, no other fd."""
    os.lseek(memfd, stdin_off, os.SEEK_SET)
    os.environ["PATH"] = env.get("PATH", "/usr/bin:/bin")  # posix_spawnp searches ours
    everything = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
    try:
        return os.posix_spawnp(req["argv"][0], req["argv"], env,
                               file_actions=[(os.POSIX_SPAWN_DUP2, memfd, 0), (os.POSIX_SPAWN_CLOSE, 3)],
                               setsigdef=everything, setsigmask=[])
    except OSError as e:
        _report_error(f"execve {req['argv'][0]}: {e.strerror}")
        _record(REC_STATUS, "", json.dumps({"exit_code": 127, "signal": 0, "cpu_us": 0}).encode())
        os._exit(0)


def _run_call(cfg, memfd, prestarted):
    hlen = struct.unpack("<I", os.pread(memfd, 4, 0))[0]
    req = json.loads(os.pread(memfd, hlen, 4))
    stdin_off = _write_files(req, memfd, 4 + hlen)
    env = req.get("env", {})
    _set_limits(req)
    os.chdir(req.get("cwd", "/tmp"))
    if prestarted is not None:
        node_pid, code_w, stdin_w = prestarted
        if req.get("cpu_seconds"):  # it started before its limits were known
            import resource
            c = req["cpu_seconds"]
            resource.prlimit(node_pid, resource.RLIMIT_CPU, (c, c + 1))
        write_all(code_w, json.dumps({"argv": req["argv"], "env": env,
                                      "cwd": req.get("cwd", "/tmp")}).encode())
        os.close(code_w)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        try:
            left, o = os.fstat(memfd).st_size - stdin_off, stdin_off
            while left > 0:
                n = os.sendfile(stdin_w, memfd, o, left)
                o += n
                left -= n
        except OSError:
            pass  # the program stopped reading its stdin
        os.close(stdin_w)
        os.close(memfd)
        _supervise(node_pid, req)
    if req["mode"] == "python":
        if req.get("fetch"):
            # The files are fetched after the program ended, however it ended: by pid 1,
            # with the program as its child.
            pid = os.fork()
            if pid:
                os.close(memfd)
                null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
                move_fds({0: null, 1: null, 2: null})
                os.close(null)
                _supervise(pid, req)
        os.environ.clear()
        os.environ.update(env)
        _run_python(req, memfd, stdin_off)
    pid = _spawn(req, env, memfd, stdin_off)
    os.close(memfd)
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    move_fds({0: null, 1: null, 2: null})  # the call's output ends when the program's does
    os.close(null)
    _supervise(pid, req)


def _prestart(cfg, lang):
    """Starts a language runtime that cannot fork (node) before its call: it waits on a pipe
    for the call's program. Returns (pid, code_w, stdin_w)."""
    stdin_r, stdin_w = os.pipe()
    code_r, code_w = os.pipe()
    ready_r, ready_w = os.pipe()
    # Out of the way of the targets first (sources may sit on 5 or 6), then one spawn.
    hi = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in (stdin_r, code_r, ready_w)]
    env = dict(lang.get("env", {}))
    env.update({"TP_FN_CODE_FD": "5", "TP_FN_READY_FD": "6"})
    os.environ["PATH"] = env.get("PATH", "/usr/bin:/bin")
    everything = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
    pid = os.posix_spawnp(lang["prestart"][0], lang["prestart"], env,
                          file_actions=[(os.POSIX_SPAWN_DUP2, hi[0], 0), (os.POSIX_SPAWN_DUP2, hi[1], 5),
                                        (os.POSIX_SPAWN_DUP2, hi[2], 6), (os.POSIX_SPAWN_CLOSE, 3),
                                        (os.POSIX_SPAWN_CLOSE, 4)],
                          setsigdef=everything, setsigmask=[])
    for fd in hi:
        os.close(fd)
    for fd in (stdin_r, code_r, ready_w):
        os.close(fd)
    ok = os.read(ready_r, 1)
    os.close(ready_r)
    if ok != b"R":
        raise RuntimeError(f"{lang['prestart'][0]} did not start")
    return pid, code_w, stdin_w


def _wait_for_call():
    """Tells the zygote this child is ready and waits for its call's memfd (fd 4 is the
    control socket); exits quietly when the zygote is gone."""
    ctl_sock = socket.socket(fileno=4)
    # The zygote keeps the call's mount namespace alive past its exit (and lets its
    # closer process drop it), so that tearing down its mounts is not on the call's path.
    nsfd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    socket.send_fds(ctl_sock, [b"R"], [nsfd])
    os.close(nsfd)
    msg, fds_in, _, _ = socket.recv_fds(ctl_sock, 16, 1)
    if msg != b"G" or len(fds_in) != 1:
        os._exit(0)  # the zygote is gone (EOF) or confused: nothing to run
    ctl_sock.detach()
    os.close(4)
    return fds_in[0]


def child_main(cfg, slot, flavor, cg_dirs, fds):
    """A warm child: isolate, tell the zygote it is ready, serve exactly one call. It is
    pid 1 of the call's namespaces; a python program runs in it (forked from the
    preloaded interpreter), any other program as its child (pid 2), supervised."""
    out_w, err_w, files_w, ctl, net = fds
    try:
        null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        move_fds({0: null, 1: out_w, 2: err_w, 3: files_w, 4: ctl, 5: net})
        os.closerange(6, 1 << 20)  # the zygote's stdin/stdout, siblings' pipes, pidfds: all gone
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _child_setup(cfg, slot, flavor, cg_dirs)
        prestarted = None
        if flavor != "generic":
            prestarted = _prestart(cfg, cfg["languages"][flavor])
        memfd = _wait_for_call()
        _run_call(cfg, memfd, prestarted)
    except BaseException as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
        try:
            os.write(2, f"tidepool: function child: {msg}\n".encode())
        except OSError:
            pass
        _report_error(msg)
    os._exit(127)


# ---------------------------------------------------------------------------------------
# The zygote.


def start_helper(name, body):
    """Forks a helper of the zygote that runs body(socket) with nothing else open (stdin and
    stdout on /dev/null, its end of a SOCK_SEQPACKET pair on fd 3) and dies with the
    zygote. Returns (the zygote's end, pid)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
            move_fds({0: null, 1: null, 3: b.fileno()})
            os.closerange(4, 1 << 20)  # the zygote's stdin/stdout, other helpers' sockets
            body(socket.socket(fileno=3))
        except BaseException as e:  # noqa: BLE001
            try:
                os.write(2, f"tidepool: zygote {name}: {type(e).__name__}: {e}\n".encode())
            except OSError:
                pass
        finally:
            os._exit(0)
    b.close()
    return a, pid


class Child:
    __slots__ = ("pid", "slot", "flavor", "pidfd", "ctl", "out", "err", "files", "state",
                 "call", "deadline", "start", "sent", "files_sent", "limits", "timed_out",
                 "output_limit", "status", "rusage", "oom_before", "open_streams", "nsfd",
                 "delivered")

    def __init__(self):
        self.state = "warming"
        self.call = None
        self.deadline = None
        self.timed_out = False
        self.output_limit = False
        self.status = None
        self.rusage = None
        self.sent = [0, 0]
        self.files_sent = 0
        self.oom_before = 0
        self.nsfd = -1
        self.delivered = False


class Zygote:
    def __init__(self, cfg):
        self.cfg = cfg
        self.ep = select.epoll()
        self.fdmap = {}  # fd -> (child or None, kind)
        self.children = {}  # pid -> Child
        self.free_slots = list(range(cfg["max_children"]))[::-1]
        self.ready = {f: [] for f in cfg["warm"]}
        self.waiting = {f: [] for f in cfg["warm"]}  # (call_id, meta, memfd) without a child yet
        self.calls = {}  # call id -> Child
        self.failures = 0
        self.next_refill = 0.0
        self.cg = {}  # controller -> mount point
        self.closer = None
        self.closer_pid = 0
        self.forker = None
        self.forker_pid = 0
        self.slot_limits = {}  # slot -> (memory, pids) last written
        self.slot_ooms = {}  # slot -> its memory cgroup's oom_kill count after its last call
        # slot -> (fd, fingerprint) of the network namespace the slot's children use one
        # after the other (docs/function-tier.md says why that is safe): checked after
        # every call of the slot, made anew when the call left anything in it.
        self.slot_net = {}
        self.own_net = -1
        self.cg_made = set()  # slots whose cgroups exist
        self.cg_paths = {}  # (slot, file) -> path (cg_path)

    # -- output to the daemon
    def send(self, kind, call, data=b""):
        write_all(1, OUT_HDR.pack(kind, call, len(data)) + data)

    def log(self, level, message):
        self.send(OUT_LOG, 0, json.dumps({"level": level, "message": message}).encode())

    # -- cgroups
    def setup_cgroups(self):
        base = self.cfg["private_dir"]
        os.makedirs(base, exist_ok=True)
        mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=65536,mode=0700")
        v1 = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, _ = line.rstrip("\n").split(":", 2)
                for c in ctrls.split(","):
                    if c:
                        v1[c] = True
        if "memory" in v1 and "pids" in v1:
            for c in ("memory", "pids"):
                d = f"{base}/{c}"
                os.mkdir(d)
                mount("cgroup", d, "cgroup", MS_NOSUID | MS_NODEV | MS_NOEXEC, c)
                self.cg[c] = d
            self.cgroup_version = 1
            self.cfg["_join"] = "tasks"  # moves only the writer, without the threadgroup lock
        else:
            d = f"{base}/unified"
            os.mkdir(d)
            mount("cgroup2", d, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
            self.cg["unified"] = d
            self.cgroup_version = 2
            self.cfg["_join"] = "cgroup.procs"
            try:
                write_file(d + "/cgroup.subtree_control", "+memory +pids")
            except OSError as e:
                self.log("warn", f"cgroup v2: no per-call memory/pids limits ({e})")
        # Leftovers of an earlier zygote in this sandbox.
        for root in self.cg.values():
            for name in os.listdir(root):
                if name.startswith("fncall-"):
                    try:
                        os.rmdir(f"{root}/{name}")
                    except OSError:
                        pass

    def cg_dirs(self, slot):
        return [f"{root}/fncall-{slot}" for root in self.cg.values()]

    def cg_prepare(self, slot):
        if slot in self.cg_made:
            return
        self.cg_made.add(slot)
        for d in self.cg_dirs(slot):
            try:
                os.mkdir(d, 0o755)
                self.slot_limits.pop(slot, None)  # a new cgroup: no limits written yet
                self.slot_ooms.pop(slot, None)
            except FileExistsError:
                pass

    def cg_path(self, slot, file):
        """The path of a slot's cgroup file, in whichever of its hierarchies has it ("":
        none). Looked up once: a slot's cgroups live as long as the zygote."""
        p = self.cg_paths.get((slot, file))
        if p is None:
            p = next((f"{d}/{file}" for d in self.cg_dirs(slot) if os.path.exists(f"{d}/{file}")), "")
            self.cg_paths[(slot, file)] = p
        return p

    def cg_write(self, slot, file, value):
        p = self.cg_path(slot, file)
        if not p:
            return False
        write_file(p, str(value))
        return True

    def cg_read(self, slot, file):
        p = self.cg_path(slot, file)
        try:
            return read_file(p) if p else ""
        except OSError:
            return ""

    def oom_kills(self, slot):
        text = self.cg_read(slot, "memory.oom_control") or self.cg_read(slot, "memory.events")
        for line in text.splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def set_limits(self, child, meta):
        s = child.slot
        mem = meta["memory_bytes"]
        # A slot's cgroups serve one child after another: its limits are written only
        # when a call asks for others than the last one (the peak is reset every time).
        if self.slot_limits.get(s) == (mem, meta["pids"]):
            self.cg_write(s, "memory.max_usage_in_bytes", 0)
            child.oom_before = self.slot_ooms.get(s, 0)
            return
        if self.cgroup_version == 1:
            # memsw >= limit at all times: raise memsw first when growing, lower it last.
            has_sw = os.path.exists(self.cg_dirs(s)[0] + "/memory.memsw.limit_in_bytes")
            if has_sw:
                try:
                    self.cg_write(s, "memory.memsw.limit_in_bytes", -1)
                except OSError:
                    pass
            self.cg_write(s, "memory.limit_in_bytes", mem)
            if has_sw:
                self.cg_write(s, "memory.memsw.limit_in_bytes", mem)
            else:
                self.cg_write(s, "memory.swappiness", 0)
            self.cg_write(s, "memory.max_usage_in_bytes", 0)
        else:
            self.cg_write(s, "memory.max", mem)
            self.cg_write(s, "memory.swap.max", 0)
        self.cg_write(s, "pids.max", meta["pids"])
        self.slot_limits[s] = (mem, meta["pids"])
        child.oom_before = self.slot_ooms[s] = self.oom_kills(s)

    def peak(self, slot):
        v = self.cg_read(slot, "memory.max_usage_in_bytes") or self.cg_read(slot, "memory.peak")
        try:
            return int(v)
        except ValueError:
            return 0

    # -- children
    def watch(self, fd, child, kind):
        self.fdmap[fd] = (child, kind)
        self.ep.register(fd, select.EPOLLIN)

    def unwatch(self, fd):
        if fd in self.fdmap:
            del self.fdmap[fd]
            try:
                self.ep.unregister(fd)
            except OSError:
                pass

    def spawn(self, flavor):
        if not self.free_slots:
            return False
        slot = self.free_slots.pop()
        self.cg_prepare(slot)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        files_r, files_w = os.pipe2(os.O_CLOEXEC)
        ctl_p, ctl_c = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = self.fork_child(slot, flavor,
                                  (out_w, err_w, files_w, ctl_c.fileno(), self.slot_net[slot][0]))
        except OSError as e:
            for fd in (out_r, out_w, err_r, err_w, files_r, files_w):
                os.close(fd)
            ctl_p.close()
            ctl_c.close()
            self.free_slots.append(slot)
            self.log("error", f"clone of a warm child failed: {e}")
            return False
        for fd in (out_w, err_w, files_w):
            os.close(fd)
        ctl_c.close()
        c = Child()
        c.pid, c.slot, c.flavor = pid, slot, flavor
        c.pidfd = os.pidfd_open(pid)
        c.ctl, c.out, c.err, c.files = ctl_p, out_r, err_r, files_r
        c.start = time.monotonic()
        c.open_streams = 3
        self.children[pid] = c
        self.watch(c.pidfd, c, "exit")
        self.watch(ctl_p.fileno(), c, "ctl")
        self.watch(out_r, c, "out")
        self.watch(err_r, c, "err")
        self.watch(files_r, c, "files")
        return True

    def warm_count(self, flavor):
        n = len(self.ready[flavor])
        n += sum(1 for c in self.children.values() if c.flavor == flavor and c.state == "warming")
        return n

    def refill(self):
        now = time.monotonic()
        if now < self.next_refill:
            return
        for flavor, want in self.cfg["warm"].items():
            need = max(want, len(self.waiting[flavor]))
            while self.warm_count(flavor) < need and self.spawn(flavor):
                pass

    def on_ctl(self, c):
        try:
            b, fds, _, _ = socket.recv_fds(c.ctl, 1, 1)
        except OSError:
            b, fds = b"", []
        for fd in fds:
            if c.nsfd < 0:
                c.nsfd = fd
            else:
                os.close(fd)
        if b == b"R" and c.state == "warming":
            c.state = "ready"
            self.failures = 0
            self.unwatch(c.ctl.fileno())
            q = self.waiting[c.flavor]
            if q:
                call_id, meta, memfd = q.pop(0)
                self.start_call(c, call_id, meta, memfd)
            else:
                self.ready[c.flavor].append(c)
        else:
            self.unwatch(c.ctl.fileno())

    # -- calls
    def on_call(self, call_id, meta, payload_len):
        memfd = os.memfd_create("tp-call", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            splice_exact(0, memfd, payload_len)
            fcntl.fcntl(memfd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)
        except BaseException:
            os.close(memfd)
            raise
        flavor = meta.get("flavor", "generic")
        if flavor not in self.ready:
            os.close(memfd)
            self.send(OUT_FAILED, call_id, json.dumps({"message": f"unknown flavor {flavor}"}).encode())
            return
        if self.ready[flavor]:
            self.start_call(self.ready[flavor].pop(0), call_id, meta, memfd)
        else:
            self.waiting[flavor].append((call_id, meta, memfd))
        self.refill()

    def start_call(self, c, call_id, meta, memfd):
        try:
            self.set_limits(c, meta)
        except OSError as e:
            os.close(memfd)
            # A limit below what the child already uses (v1 refuses it): the program could not
            # even start within it.
            self.send(OUT_EXIT, call_id, json.dumps({
                "exit_code": None, "signal": signal.SIGKILL, "wall_us": 0, "cpu_us": 0,
                "peak_bytes": self.peak(c.slot), "oom_kills": 1, "timed_out": False,
                "output_limit": False, "note": f"limit: {e}"}).encode())
            self.kill(c)
            return
        c.state = "running"
        c.call = call_id
        c.limits = meta
        self.calls[call_id] = c
        c.start = time.monotonic()
        c.deadline = c.start + meta["timeout_ms"] / 1000.0
        try:
            socket.send_fds(c.ctl, [b"G"], [memfd])
            c.delivered = True
        except OSError as e:
            self.log("warn", f"call {call_id}: child {c.pid} is gone ({e})")
        os.close(memfd)

    def kill(self, c):
        try:
            signal.pidfd_send_signal(c.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def on_stream(self, c, fd, kind, ev):
        """Moves what the child wrote to the daemon without reading it."""
        try:
            n = fionread(fd)
        except OSError:
            n = 0
        if n > 0:
            self.forward(c, kind, fd, n)
            return
        if ev & (select.EPOLLHUP | select.EPOLLERR):  # every writer is gone
            self.unwatch(fd)
            os.close(fd)
            c.open_streams -= 1
            self.maybe_done(c)

    def emit(self, kind, call, fd, n):
        write_all(1, OUT_HDR.pack(kind, call, n))
        splice_exact(fd, 1, n)

    def forward(self, c, kind, fd, n):
        if c.call is None:
            # A warm child writing before its call is the zygote's own code failing in
            # its setup (nothing of a call is there yet): log it.
            raw = os.read(fd, min(n, 4096))
            text = raw[REC_HDR.size:] if kind == "files" else raw
            self.log("warn", f"warm child {c.pid}: {text[:2000].decode('utf-8', 'replace').strip()}")
            self.drain(fd, n - len(raw))
            return
        if kind == "files":
            if c.files_sent + n > c.limits["files_bytes"]:
                c.output_limit = True
                self.kill(c)
                self.drain(fd, n)
                return
            c.files_sent += n
            self.emit(OUT_FILES, c.call, fd, n)
            return
        i = 0 if kind == "out" else 1
        take = min(n, max(0, c.limits["output_bytes"] - c.sent[i]))
        if take:
            self.emit(OUT_STDOUT if i == 0 else OUT_STDERR, c.call, fd, take)
            c.sent[i] += take
        if n > take:
            c.output_limit = True
            self.kill(c)
            self.drain(fd, n - take)

    def drain(self, fd, n):
        while n > 0:
            moved = os.splice(fd, self.devnull, n)
            if moved == 0:
                break
            n -= moved

    def on_exit(self, c):
        try:
            _, wstatus, ru = os.wait4(c.pid, 0)
        except ChildProcessError:
            wstatus, ru = 0, None
        c.status = wstatus
        c.rusage = ru
        self.unwatch(c.pidfd)
        os.close(c.pidfd)
        c.pidfd = -1
        self.maybe_done(c)

    def maybe_done(self, c):
        if c.status is None or c.open_streams > 0:
            return
        del self.children[c.pid]
        self.unwatch(c.ctl.fileno())
        c.ctl.close()
        self.release_ns(c)
        if c.call is not None and not c.delivered:
            # Died between saying it was ready and getting its call: nothing of the call
            # ran; the daemon answers that it could not run (and may try again).
            self.calls.pop(c.call, None)
            self.send(OUT_FAILED, c.call, json.dumps({"message": "its child died before the call "
                                                      f"reached it (status {c.status})"}).encode())
        elif c.call is not None:
            self.calls.pop(c.call, None)
            st = _status_of(c.status)
            cpu = 0
            if c.rusage is not None:
                cpu = int((c.rusage.ru_utime + c.rusage.ru_stime) * 1e6)
            ooms = self.oom_kills(c.slot)
            self.slot_ooms[c.slot] = ooms  # the count the slot's next call starts from
            oom = max(0, ooms - c.oom_before)
            self.send(OUT_EXIT, c.call, json.dumps({
                "exit_code": st["exit_code"], "signal": st["signal"],
                "wall_us": int((time.monotonic() - c.start) * 1e6), "cpu_us": cpu,
                "peak_bytes": self.peak(c.slot), "oom_kills": oom, "timed_out": c.timed_out,
                "output_limit": c.output_limit}).encode())
        else:
            if c.state == "ready" and c in self.ready[c.flavor]:
                self.ready[c.flavor].remove(c)
            if c.state != "killed":
                self.failures += 1
                self.log("warn", f"warm child {c.pid} ({c.flavor}) exited before its call "
                                 f"(status {c.status})")
                # Back off when children keep dying before they are ready (a broken
                # definition): at most ~one attempt per second per flavor then.
                if self.failures > 3:
                    self.next_refill = time.monotonic() + min(5.0, 0.1 * self.failures)
                    for f, q in self.waiting.items():
                        if q and self.failures > 10:
                            for call_id, _, memfd in q:
                                os.close(memfd)
                                self.send(OUT_FAILED, call_id, json.dumps(
                                    {"message": f"the {f} workers fail to start"}).encode())
                            q.clear()
        # Once pid 1 of its pid namespace is reaped, every process the child started is
        # gone (the kernel kills and waits for them first), and nothing outside the
        # namespace can join the slot's cgroups: the slot is free again. (Checked anyway
        # when the child died before its call, which is rare.)
        if c.call is not None or self.cgroup_empty(c.slot):
            self.check_net(c.slot)
            self.free_slots.append(c.slot)
        else:
            self.log("error", f"cgroup fncall-{c.slot} not empty after its child ended; slot retired")
        self.refill()

    # -- the slots' network namespaces
    def make_net(self):
        """A new network namespace (loopback only, down) and its fingerprint: made in this
        process, which then returns to its own."""
        unshare(CLONE_NEWNET)
        try:
            fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            fp = net_fingerprint()
        finally:
            setns(self.own_net, CLONE_NEWNET)
        return fd, fp

    def setup_nets(self):
        self.own_net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        for slot in range(self.cfg["max_children"]):
            self.slot_net[slot] = self.make_net()

    def check_net(self, slot):
        """After a child of `slot` ended (every process of its call is gone): its network
        namespace serves the slot's next child only if the call left nothing there."""
        fd, fp = self.slot_net[slot]
        setns(fd, CLONE_NEWNET)
        try:
            now = net_fingerprint()
        finally:
            setns(self.own_net, CLONE_NEWNET)
        if now != fp:
            self.log("info", f"slot {slot}: its last call changed its network namespace; "
                             "the slot gets a new one")
            os.close(fd)
            self.slot_net[slot] = self.make_net()

    # -- the forker
    def start_forker(self):
        """Starts the process that clones the warm children: a copy of the zygote made once
        its modules are loaded, which does nothing else. The zygote's own work (its event
        loop writes to its heap all the time) then neither copies pages it shares with
        live children (every fork shares all of them again) nor ends up in the children's
        address space. The forker clones with CLONE_PARENT, so every child is still the
        zygote's: its pidfd, wait4 and rusage work as for a child of its own."""
        self.forker, self.forker_pid = start_helper("forker", self.forker_main)

    def forker_main(self, sock):
        """In the forker: serves clone requests ("SLOT FLAVOR" with the child's five fds, see
        child_main) until the zygote closes its end; answers the pid, or -errno."""
        flags = CLONE_PARENT | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
        while True:
            msg, fds, _, _ = socket.recv_fds(sock, 256, 5)
            if not msg:
                return
            if len(fds) != 5:
                raise RuntimeError(f"clone request with {len(fds)} descriptors")
            slot, flavor = msg.decode().split(" ", 1)
            slot = int(slot)
            try:
                pid = clone_isolated(flags)
            except OSError as e:
                pid = -(e.errno or 1)
            if pid == 0:
                child_main(self.cfg, slot, flavor, self.cg_dirs(slot), tuple(fds))
                os._exit(127)
            for fd in fds:
                os.close(fd)
            sock.send(b"%d" % pid)

    def fork_child(self, slot, flavor, fds):
        """A new warm child of this process for `slot`, cloned by the forker; its pid."""
        try:
            socket.send_fds(self.forker, [b"%d %s" % (slot, flavor.encode())], list(fds))
            answer = self.forker.recv(32)
        except OSError as e:
            raise SystemExit(f"zygote: its forker is gone ({e})")
        if not answer:
            raise SystemExit("zygote: its forker is gone")
        pid = int(answer)
        if pid < 0:
            raise OSError(-pid, f"clone: {os.strerror(-pid)}")
        return pid

    def start_closer(self):
        """A small process that closes the namespace fds the zygote hands it: the last
        reference to a call's mount namespace goes there, and so does the teardown of its
        mounts (an RCU grace period or two), in parallel with the zygote's next call."""
        def close_all(sock):
            while True:
                msg, fds, _, _ = socket.recv_fds(sock, 1, 64)
                for fd in fds:
                    os.close(fd)
                if not msg:
                    return

        self.closer, self.closer_pid = start_helper("closer", close_all)

    def release_ns(self, c):
        if c.nsfd < 0:
            return
        try:
            if self.closer is not None:
                socket.send_fds(self.closer, [b"x"], [c.nsfd])
        except OSError:
            self.closer = None  # gone: close here, at the cost of the teardown
        os.close(c.nsfd)
        c.nsfd = -1

    def cgroup_empty(self, slot):
        for d in self.cg_dirs(slot):
            try:
                if read_file(d + "/cgroup.procs").strip():
                    return False
            except OSError:
                pass
        return True

    def on_kill(self, call_id):
        c = self.calls.get(call_id)
        if c is not None:
            self.kill(c)
            return
        for q in self.waiting.values():
            for i, (cid, _, memfd) in enumerate(q):
                if cid == call_id:
                    os.close(memfd)
                    del q[i]
                    self.send(OUT_FAILED, call_id, json.dumps({"message": "cancelled"}).encode())
                    return

    def on_timeout(self, now):
        for c in list(self.calls.values()):
            if c.deadline is not None and now >= c.deadline and not c.timed_out:
                c.timed_out = True
                self.kill(c)

    def next_timeout(self):
        ds = [c.deadline for c in self.calls.values() if c.deadline is not None and not c.timed_out]
        if self.next_refill > time.monotonic():
            ds.append(self.next_refill)
        if not ds:
            return -1
        return max(0.0, min(ds) - time.monotonic())

    def read_frame(self):
        hdr = read_exact(0, IN_HDR.size)
        if hdr is None:
            return False
        kind, call_id, payload_len, meta_len = IN_HDR.unpack(hdr)
        meta = json.loads(read_exact(0, meta_len) or b"{}") if meta_len else {}
        if kind == IN_CALL:
            self.on_call(call_id, meta, payload_len)
        elif kind == IN_KILL:
            self.on_kill(call_id)
        elif kind == IN_QUIT:
            return False
        return True

    def run(self):
        self.devnull = os.open("/dev/null", os.O_WRONLY | os.O_CLOEXEC)
        self.ep.register(0, select.EPOLLIN)
        self.refill()
        self.send(OUT_READY, 0, json.dumps({"pid": os.getpid(), "cgroup": self.cgroup_version,
                                             "python": sys.version.split()[0]}).encode())
        while True:
            events = self.ep.poll(self.next_timeout())
            now = time.monotonic()
            for fd, ev in events:
                if fd == 0:
                    if not self.read_frame():
                        return
                    continue
                entry = self.fdmap.get(fd)
                if entry is None:
                    continue
                c, kind = entry
                if kind == "exit":
                    self.on_exit(c)
                elif kind == "ctl":
                    self.on_ctl(c)
                else:
                    self.on_stream(c, fd, kind, ev)
            self.on_timeout(now)
            if self.next_refill and now >= self.next_refill:
                self.next_refill = 0.0
                self.refill()

    def shutdown(self):
        if self.forker is not None:  # it clones no more; EOF ends it
            self.forker.close()
            self.forker = None
            try:
                os.waitpid(self.forker_pid, 0)
            except ChildProcessError:
                pass
        for c in list(self.children.values()):
            self.kill(c)
        for c in list(self.children.values()):
            try:
                os.wait4(c.pid, 0)
            except ChildProcessError:
                pass
        for slot in range(self.cfg["max_children"]):
            for d in self.cg_dirs(slot):
                try:
                    os.rmdir(d)
                except OSError:
                    pass


def preload(names):
    for n in names:
        try:
            __import__(n)
        except Exception:  # noqa: BLE001 - a module the host lacks is skipped
            pass


def check_no_shared_writable():
    """A writable shared mapping would be memory a child could change under the zygote."""
    bad = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            perms = parts[1]
            if "w" in perms and "s" in perms:
                bad.append(line.strip())
    if bad:
        raise SystemExit("zygote: refusing to fork with writable shared mappings: " + "; ".join(bad))


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # the daemon gone: end
    hdr = read_exact(0, IN_HDR.size)
    if hdr is None:
        return 0
    kind, _, payload_len, meta_len = IN_HDR.unpack(hdr)
    if kind != IN_INIT or payload_len:
        raise SystemExit("zygote: the first frame must be init")
    cfg = json.loads(read_exact(0, meta_len))
    import base64
    cfg["_seccomp"] = base64.b64decode(cfg["seccomp"])
    # Own mount and cgroup namespaces: the zygote's cgroup mounts stay private to it and
    # its children (who detach them).
    unshare(CLONE_NEWNS | CLONE_NEWCGROUP)
    mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    try:
        write_file("/proc/self/oom_score_adj", "-999")
    except OSError:
        pass
    z = Zygote(cfg)
    z.start_closer()  # forked while the zygote is still small
    z.setup_cgroups()
    z.setup_nets()
    preload(cfg.get("preload", []))
    gc.collect()
    gc.freeze()  # the children's collector never touches (and copies) the zygote's objects
    check_no_shared_writable()
    z.start_forker()  # last: the children are copies of the zygote as it is now
    try:
        z.run()
    finally:
        z.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
