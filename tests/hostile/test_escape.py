"""Escape and snooping: hostile code tries to leave its sandbox, reach the host's kernel
interfaces, or talk to the agent behind the daemon's back.

Outcomes are asserted precisely where the mechanism is ours (seccomp: EPERM, ENOSYS for
clone3; the 32-bit and x32 entry points kill the caller with SIGSYS) and loosely where
the kernel decides (any refusal counts, success never does).
"""
from __future__ import annotations

import errno
import hashlib
import os
import signal
import stat
import struct

import pytest

import tidepool
from hostile_lib import probe_lines, upload_payload
from tp_testlib import wait_until

# Refused by the sandbox's seccomp filter with EPERM (src/sys/seccomp.cpp).
SECCOMP_EPERM = [
    "init_module", "finit_module", "delete_module", "reboot", "kexec_load", "settimeofday",
    "clock_settime", "add_key", "keyctl", "request_key", "mount_tmpfs", "mount_bind",
    "umount_proc", "pivot_root", "open_tree", "fsopen", "unshare_newuser", "setns", "ioperm",
    "iopl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "open_by_handle_at",
    "swapon", "acct", "syslog_read",
]
# Refused by the kernel: capabilities held only in the sandbox's user namespace do not
# count for host resources (devices, the clock, limits, priorities) and the agent is not
# ptrace-able (non-dumpable, CAP_SYS_PTRACE dropped for commands).
KERNEL_REFUSED = [
    "adjtimex", "mknod_block", "mknod_char_mem", "open_dev_mem", "raise_nofile_hard", "nice_minus_20",
    "ptrace_attach_ns_init", "process_vm_readv_init", "open_proc1_mem", "open_proc1_environ",
    "open_proc1_fd3", "open_proc1_exe_write", "open_proc1_exe_read",
    "readlink_proc1_exe", "readlink_proc1_root", "pidfd_getfd_proc1",
]


def test_privileged_syscalls_refused(hostile, payload):
    """Attempt: load/unload kernel modules, reboot, kexec, set the clock, use kernel
    keyrings, mount/umount/pivot_root and the new mount API, create user namespaces
    (unshare, clone, clone3, and through the x32 and i386 entry points), setns, raw I/O
    ports, bpf, perf, userfaultfd, io_uring, open_by_handle_at, swap, acct, the kernel log,
    device nodes, raising hard limits and priorities, ptrace/process_vm_readv/pidfd tricks
    on PID 1 (the agent) and on the command's own init.
    Expected: every one fails; the agent keeps serving."""
    p = upload_payload(hostile, payload("hostile_syscalls"))
    r = hostile.exec([p], timeout=60)
    assert r.exit_code == 0, r
    res = probe_lines(r.stdout)
    missing = [n for n in SECCOMP_EPERM + KERNEL_REFUSED + ["clone3", "clone_newuser"] if n not in res]
    assert not missing, (missing, r.stdout, r.stderr)
    for name in SECCOMP_EPERM:
        assert res[name]["rc"] == -1 and res[name]["errno"] == errno.EPERM, (name, res[name])
    for name in KERNEL_REFUSED:
        assert res[name]["rc"] == -1 and res[name]["errno"] != 0, (name, res[name])
    assert res["clone3"]["rc"] == -1 and res["clone3"]["errno"] == errno.ENOSYS
    # clone(CLONE_NEWUSER) refused: the child exits 3.
    assert os.WIFEXITED(res["clone_newuser"]["status"]) and os.WEXITSTATUS(res["clone_newuser"]["status"]) == 3
    for name in ("x32_unshare_newuser", "i386_unshare_newuser"):
        st = res[name]["status"]
        # Killed by the filter (SIGSYS), or the ABI is not built into the kernel (error/SIGSEGV).
        assert (os.WIFSIGNALED(st) and os.WTERMSIG(st) in (signal.SIGSYS, signal.SIGSEGV)) or \
            (os.WIFEXITED(st) and os.WEXITSTATUS(st) == 3), (name, st)
    # SIGKILL to PID 1 through a pidfd is accepted by the call and dropped by the kernel
    # (the init of a pid namespace ignores it from inside), so only its effect is checked.
    assert "pidfd_send_signal_proc1" in res
    # Nothing was created, the agent is alive and still PID 1.
    assert hostile.exec("ls /tmp/tp-sda /tmp/tp-mem 2>&1; echo alive").stdout.endswith("alive\n")
    assert hostile.exec("cat /proc/1/comm 2>/dev/null; echo $?").stdout.split()[-1] == "0"


def test_filesystem_ioctls(hostile, payload):
    """Attempt: FIFREEZE/FITHAW/FITRIM on the overlay root, /tmp, /dev/shm and the host's
    /usr; immutable and append-only flags (FS_IOC_SETFLAGS, FS_IOC_FSSETXATTR); FICLONE of
    a host file's blocks.
    Expected: freeze and thaw are refused (seccomp), trim and the flags are refused (they
    need capabilities in the host's user namespace), cloning is refused across file
    systems; the host's /usr file is unchanged."""
    with open("/usr/bin/env", "rb") as f:
        env_before = hashlib.sha256(f.read()).hexdigest()
    p = upload_payload(hostile, payload("hostile_ioctls"))
    r = hostile.exec([p], timeout=60)
    assert r.exit_code == 0, r
    res = probe_lines(r.stdout)
    for d in ("/", "/tmp", "/usr", "/dev/shm"):
        assert res[f"FIFREEZE:{d}"] == {"rc": -1, "errno": errno.EPERM}, (d, res)
        assert res[f"FITHAW:{d}"] == {"rc": -1, "errno": errno.EPERM}, (d, res)
        assert res[f"FITRIM:{d}"]["rc"] == -1, (d, res)
    for key, v in res.items():
        if key.startswith(("SETFLAGS_", "FSSETXATTR_")):
            assert v["rc"] == -1 and v["errno"] in (errno.EPERM, errno.EACCES, errno.EROFS, errno.ENOTTY,
                                                    errno.EOPNOTSUPP), (key, v)
        if key.startswith("FICLONE"):
            assert v["rc"] == -1, (key, v)
    assert hostile.exec("echo more >> /root/tp-ioctl && rm /root/tp-ioctl /tmp/tp-ioctl").ok
    with open("/usr/bin/env", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == env_before


def test_proc_and_sys_masked(hostile):
    """Attempt: read kernel memory and host internals through /proc (kcore, kpage*,
    timer_list, sched_debug, keys, kallsyms addresses), write sysrq-trigger and sysctls,
    and write /sys.
    Expected: masked files read empty (bound to /dev/null), kallsyms shows no addresses,
    /proc/sys and /sys are read-only or absent."""
    for f in ("kcore", "kpageflags", "kpagecount", "kpagecgroup", "timer_list", "sched_debug", "keys",
              "latency_stats", "sysrq-trigger", "kallsyms"):
        r = hostile.exec(f"test -e /proc/{f} || exit 0; head -c 4096 /proc/{f} | wc -c")
        assert r.stdout.strip() in ("0", ""), (f, r.stdout)
    # sysrq-trigger (where the kernel has it) is /dev/null: writing it reaches nothing.
    if os.path.exists("/proc/sysrq-trigger"):
        r = hostile.exec("stat -c %t:%T /proc/sysrq-trigger")
        assert r.stdout.strip() == "1:3", r.stdout
    for f in ("/proc/sys/kernel/panic", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/core_pattern",
              "/proc/sys/net/ipv4/ip_forward"):
        r = hostile.exec(f"echo 1 > {f} 2>/dev/null; echo rc=$?")
        assert "rc=0" not in r.stdout, f
    with open("/proc/sys/kernel/core_pattern") as f:
        assert "tp-" not in f.read()
    for d in ("acpi", "scsi", "firmware"):
        assert hostile.exec(f"ls -A /proc/{d} 2>/dev/null | wc -l").stdout.strip() == "0", d
    # /sys: no sysfs at all (an empty directory of the image, if any): no host devices,
    # no kernel knobs.
    r = hostile.exec("test -e /sys && stat -f -c %T /sys; ls -A /sys 2>/dev/null | wc -l")
    assert "sysfs" not in r.stdout and r.stdout.split()[-1] == "0", r.stdout
    # Escaping the OOM killer needs CAP_SYS_RESOURCE in the host's user namespace.
    r = hostile.exec("echo -1000 > /proc/self/oom_score_adj 2>/dev/null; echo rc=$?; cat /proc/self/oom_score_adj")
    assert r.stdout.split()[0] != "rc=0" and r.stdout.split()[1] != "-1000", r.stdout


def test_dev_access(hostile):
    """Attempt: find block devices, /dev/mem, /dev/kmsg, host ttys; make device nodes.
    Expected: /dev holds only the harmless character devices (null, zero, full, random,
    urandom, tty, the sandbox's own pts), no block device anywhere, mknod refused, and
    /dev/tty is no host terminal (ENXIO without a controlling terminal)."""
    r = hostile.exec("find / -xdev -type b 2>/dev/null | head; find /dev -type b 2>/dev/null | head")
    assert r.stdout.strip() == "", r.stdout
    names = set(hostile.exec("ls -A /dev").stdout.split())
    assert names <= {"null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd",
                     "stdin", "stdout", "stderr", "mqueue", "console"}, names
    for dev in ("mem", "kmem", "port", "kmsg", "sda", "vda", "nvme0n1", "fuse", "kvm", "loop0", "net/tun"):
        assert f"{dev}" not in names
    r = hostile.exec("mknod /root/sda b 8 0 2>&1; echo rc=$?; mknod /root/null2 c 1 3 2>&1; echo rc=$?")
    assert r.stdout.count("rc=0") == 0, r.stdout
    r = hostile.exec(["python3", "-c", "import os\ntry:\n os.open('/dev/tty', os.O_RDWR)\n print('opened')\n"
                      "except OSError as e:\n print(e.errno)"])
    assert r.stdout.strip() == str(errno.ENXIO), r.stdout
    # The bound host device nodes cannot be changed (their owner, host root, is unmapped).
    r = hostile.exec("chmod 777 /dev/null 2>&1; echo rc=$?; chown 0 /dev/urandom 2>&1; echo rc=$?; "
                     "touch -d 2000-01-01 /dev/zero 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout
    assert stat.S_IMODE(os.stat("/dev/null").st_mode) == 0o666
    # The ordinary devices still work.
    assert hostile.exec("head -c 8 /dev/urandom | wc -c; echo x > /dev/null && echo ok").stdout == "8\nok\n"


def test_setuid_binary_gains_nothing(hostile, payload):
    """Attempt: a set-uid-root binary (written into the writable layer, chowned to root,
    mode 4755) run by uid 1000, directly and after dropping privileges inside.
    Expected: no_new_privs makes exec ignore the bit: euid stays 1000. (The host image's own
    set-uid binaries sit on nosuid binds as well.)"""
    p = upload_payload(hostile, payload("hostile_setuid"), name="suid")
    assert hostile.exec(f"chown 0:0 {p} && chmod 4755 {p} && stat -c %a:%u {p}").stdout == "4755:0\n"
    r = hostile.exec([p], user=1000)
    assert r.stdout.strip().startswith("ruid=1000 euid=1000 suid=1000 nnp=1"), r
    r = hostile.exec([p, "drop", "1000"])
    assert r.stdout.strip().startswith("ruid=1000 euid=1000"), r
    # The host's su and passwd do not make uid 1000 root either.
    r = hostile.exec("su -c id root </dev/null 2>&1; echo; id -u", user=1000)
    assert r.stdout.strip().splitlines()[-1] == "1000"
    assert "uid=0" not in r.stdout


def test_agent_binary_cannot_be_overwritten(hostile):
    """Attempt: overwrite or truncate the agent's program through /proc/1/exe, read it,
    or find it anywhere in the sandbox's tree.
    Expected: /proc/1/exe cannot be opened or resolved (the agent is non-dumpable), the
    program is not in the sandbox's file tree (it was exec'd from a daemon fd), and the
    agent keeps serving."""
    r = hostile.exec("echo x > /proc/1/exe 2>/dev/null; echo rc=$?; : > /proc/1/exe 2>/dev/null; echo rc=$?; "
                     "cat /proc/1/exe > /tmp/a 2>/dev/null; echo rc=$?; readlink /proc/1/exe; echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout
    r = hostile.exec("find / -xdev -name 'tp-agent*' 2>/dev/null | head -3")
    assert r.stdout.strip() == "", r.stdout
    assert hostile.exec("echo alive").stdout == "alive\n"


def _frame(msg_type: int, fields: bytes, ident: int = 1) -> bytes:
    return struct.pack("<IBBHI", 12 + len(fields), msg_type, 0, 0, ident) + fields


def _u64_field(tag: int, value: int) -> bytes:
    return struct.pack("<HI", tag, 8) + struct.pack("<Q", value)


def test_forged_agent_frames(hostile):
    """Attempt: talk to the agent behind the daemon's back: find its control socket
    (/proc/1/fd, any unix socket in the sandbox), and write well-formed protocol frames
    (a fake "exit 0" result, a fake "ready") to every fd the command inherited.
    Expected: /proc/1/fd is closed to commands; the command has only stdin/stdout/stderr
    pipes, there is no unix socket to connect to; forged frames arrive as plain output
    bytes, and the real exit status is reported."""
    # The agent's fd numbers may be listed (/proc/<pid>/fd is a directory of the
    # sandbox's root user); what they are and opening them is refused.
    r = hostile.exec("for f in /proc/1/fd/*; do readlink $f && echo LEAK; cat $f </dev/null >/dev/null 2>&1 "
                     "&& echo LEAK; done 2>/dev/null; echo done")
    assert "LEAK" not in r.stdout and "socket" not in r.stdout, r.stdout
    fds = hostile.exec("ls /proc/self/fd").stdout.split()
    assert set(fds) <= {"0", "1", "2", "3"}, fds  # 3: ls's own directory fd
    # Unix sockets visible in this sandbox's network namespace: none of them (if any) answer.
    r = hostile.exec(["python3", "-c",
                      "import socket\n"
                      "n=0\n"
                      "for line in open('/proc/net/unix').read().splitlines()[1:]:\n"
                      "    f=line.split()\n"
                      "    if len(f)<8: continue\n"
                      "    p=f[7]; a=('\\0'+p[1:]) if p.startswith('@') else p\n"
                      "    for t in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):\n"
                      "        s=socket.socket(socket.AF_UNIX,t)\n"
                      "        try: s.connect(a); n+=1; print('connected',p)\n"
                      "        except OSError: pass\n"
                      "        s.close()\n"
                      "print('connected', n)\n"])
    assert r.stdout.strip().endswith("connected 0"), r.stdout
    fake_exit = _frame(103, _u64_field(30, 0) + _u64_field(31, 0))
    fake_ready = _frame(100, _u64_field(25, 1) + _u64_field(24, 1), ident=0)
    blob = fake_exit + fake_ready
    script = ("import os,sys\nb=bytes.fromhex(sys.argv[1])\n"
              "for fd in range(0,256):\n"
              "    try: os.write(fd,b)\n"
              "    except OSError: pass\n"
              "sys.exit(7)\n")
    r = hostile.exec(["python3", "-c", script, blob.hex()], stdin=b"")
    assert r.exit_code == 7, r
    assert r.stdout_bytes == blob and r.stderr_bytes == blob, r
    assert hostile.exec("echo alive").stdout == "alive\n"


def test_other_commands_visible_pid1_refused(hostile):
    """Attempt: ptrace, signal and attach to a command started by another call (a
    background process), and to PID 1.
    Expected: all commands of a sandbox share one pid namespace, as on any machine (one
    trust domain: one episode, see SECURITY.md), so the other command is addressable by
    its real pid (signal 0 succeeds); PID 1, the agent, is non-dumpable and cannot be
    ptraced, and the background command is not disturbed by the probe."""
    bg = hostile.start(["sleep", "300"])
    try:
        outer = wait_until(lambda: hostile.exec("pgrep -x sleep").stdout.split(), 10, 0.1,
                           "background sleep visible to pgrep")
        pid = int(outer[0])
        script = ("import ctypes,os,signal,sys\n"
                  "libc=ctypes.CDLL(None,use_errno=True)\n"
                  f"pid={pid}\n"
                  "try:\n os.kill(pid,0); print('kill 0 0')\nexcept OSError as e: print('kill -1',e.errno)\n"
                  "r=libc.ptrace(16,1,0,0); print('ptrace1',r,ctypes.get_errno())\n"
                  "print('comm', open(f'/proc/{pid}/comm').read().strip())\n")
        r = hostile.exec(["python3", "-c", script])
        res = {l.split()[0]: l.split()[1:] for l in r.stdout.splitlines()}
        assert res["kill"] == ["0", "0"], r.stdout
        assert res["comm"] == ["sleep"], r.stdout
        assert res["ptrace1"] == ["-1", str(errno.EPERM)], r.stdout
        assert bg.poll() is None, "the background command was disturbed"
    finally:
        bg.kill()
    bg.wait(timeout=30)


def test_file_api_cannot_leave_the_root(hostile):
    """Attempt: make the trainer's file API (which the agent serves as root of the
    sandbox) read host files: `..` paths, symlinks planted by the sandbox pointing at host
    paths, /proc/self/root and /proc/1/{root,cwd,fd} magic links, hard links to host files.
    Expected: paths resolve inside the sandbox root (RESOLVE_IN_ROOT, no magic links), so
    the answer is the sandbox's own file or an error, never the host's; hard links to the
    host's files cannot be made (read-only binds are other mounts: EXDEV)."""
    with open("/etc/passwd", "rb") as f:
        host_passwd = f.read()
    own_passwd = hostile.files.read("/etc/passwd")
    assert own_passwd != host_passwd
    hostile.exec("mkdir -p /work && ln -sf /../../../../etc/passwd /work/abs && "
                 "ln -sf ../../../../../../etc/passwd /work/rel && ln -sf /proc/1/root/etc/passwd /work/magic && "
                 "ln -sf /proc/self/root/etc/passwd /work/self", check=True)
    for path in ("/../../../etc/passwd", "/work/../../../../etc/passwd", "/work/abs", "/work/rel", "/work/magic",
                 "/work/self", "/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd", "/proc/1/cwd/etc/passwd"):
        try:
            data = hostile.files.read(path)
        except tidepool.TidepoolError:
            continue
        assert data != host_passwd and data == own_passwd, path
    for path in ("/proc/1/fd/3", "/proc/self/fd/3", "/proc/1/exe", "/proc/1/mem"):
        try:
            data = hostile.files.read(path)
        except tidepool.TidepoolError:
            continue
        assert len(data) < 1 << 20, path
    # Writes through planted symlinks stay inside too.
    hostile.exec("ln -sf /proc/1/root/tmp /work/out", check=True)
    try:
        hostile.files.write("/work/out/tp-planted", b"x")
    except tidepool.TidepoolError:
        pass
    assert not os.path.exists("/tmp/tp-planted")
    # Hard links to host files: refused across mounts.
    r = hostile.exec("ln /usr/bin/env /root/env-link 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout, r.stdout
    assert hostile.exec("ln /proc/1/exe /root/agent 2>&1; echo rc=$?").stdout.strip().endswith("rc=1")
    # A hard link to a lower-layer file copies it up: writing it leaves the image alone.
    st = hostile.exec("ln /etc/hostname /root/h 2>/dev/null || ln /etc/passwd /root/h; echo evil >> /root/h; echo ok")
    assert st.stdout.endswith("ok\n")
    assert hostile.files.read("/etc/passwd") in (own_passwd, own_passwd + b"evil\n")


def test_other_sandbox_files(hostile, bystander):
    """Attempt: find the bystander's files from the hostile sandbox (by path, by searching
    the whole tree, through /proc/*/root), and through the file API of the hostile sandbox.
    Expected: nothing of the bystander is visible."""
    r = hostile.exec(f"cat {bystander.path} 2>/dev/null; grep -rls {bystander.secret} / --exclude-dir=proc "
                     f"--exclude-dir=sys --exclude-dir=usr 2>/dev/null | head -3; ls /proc/*/root/tmp/by 2>/dev/null; true", timeout=120)
    assert bystander.secret not in r.stdout and "note" not in r.stdout, r.stdout
    assert not hostile.files.exists(bystander.path)
    with pytest.raises(tidepool.TidepoolError):
        hostile.files.read("/tmp/by/note")


def test_kill_everything(hostile):
    """Attempt: kill PID 1 and every process the command can signal (kill -9 1, kill -9 -1),
    and kill the agent through its /proc entry.
    Expected: PID 1 (the agent) ignores signals it does not handle and cannot be killed
    from inside its own pid namespace; kill -1 reaches only the sandbox's own processes;
    the sandbox runs the next command."""
    r = hostile.exec("kill -9 1; kill -9 -1; echo survived-or-not")
    assert r.signal == 9 or "survived" in r.stdout, r
    r = hostile.exec(["python3", "-c",
                      "import os,signal\n"
                      "for p in os.listdir('/proc'):\n"
                      "    if p.isdigit() and int(p)!=os.getpid():\n"
                      "        try: os.kill(int(p),signal.SIGKILL)\n"
                      "        except OSError: pass\n"
                      "print('done')\n"])
    assert r.stdout == "done\n", r
    assert hostile.exec("echo alive").stdout == "alive\n"
    assert hostile.refresh().state == "running"
