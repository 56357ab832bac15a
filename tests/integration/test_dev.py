"""The sandbox's /dev: one read-only bind of a root-owned directory the daemon prepares
(device nodes cannot be made in a user namespace), plus the sandbox's own pts and shm.
On a data dir whose file system is nodev the daemon falls back to binding the host's nodes."""
import os
import signal
import subprocess

import pytest

import tidepool
from tp_testlib import BUILD, Daemon, leaks_of, wait_until

NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
CHECK = ("import os, stat\n"
         "for n in sorted(os.listdir('/dev')):\n"
         "    st = os.lstat('/dev/' + n)\n"
         "    if stat.S_ISCHR(st.st_mode):\n"
         "        print(n, os.major(st.st_rdev), os.minor(st.st_rdev), oct(st.st_mode & 0o777))\n")


def _nodes(sb):
    out = {}
    for line in sb.exec(["python3", "-c", CHECK]).stdout.splitlines():
        n, ma, mi, mode = line.split()
        out[n] = (int(ma), int(mi), mode)
    return out


def _devices_work(sb):
    r = sb.exec("echo x > /dev/null && head -c 5 /dev/zero | wc -c && head -c 7 /dev/urandom | wc -c; "
                "echo y > /dev/full; echo full=$?; echo s > /dev/shm/f && cat /dev/shm/f; "
                "python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'")
    assert r.stdout.split() == ["5", "7", "full=1", "s", "/dev/pts/0"], r


def test_dev_nodes_and_links(sandbox):
    assert _nodes(sandbox) == {n: (ma, mi, "0o666") for n, (ma, mi) in NODES.items()}
    _devices_work(sandbox)
    links = sandbox.exec("for l in ptmx fd stdin stdout stderr; do echo $l $(readlink /dev/$l); done").stdout
    assert links.split("\n")[:5] == ["ptmx pts/ptmx", "fd /proc/self/fd", "stdin /proc/self/fd/0",
                                    "stdout /proc/self/fd/1", "stderr /proc/self/fd/2"]


def test_dev_is_read_only_and_shared_dir_untouched(sandbox, daemon):
    r = sandbox.exec("touch /dev/new 2>&1; echo rc=$?; rm -f /dev/zero 2>&1; echo rc=$?; "
                     "ln -s x /dev/l 2>&1; echo rc=$?; chmod 600 /dev/null 2>&1; echo rc=$?")
    assert r.stdout.count("rc=1") == 4, r.stdout
    assert "Read-only file system" in r.stdout, r.stdout
    prepared = os.path.join(daemon.data_dir, "containers", "dev")
    st = os.stat(os.path.join(prepared, "null"))
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o666)
    assert sorted(os.listdir(prepared)) == sorted(list(NODES) + ["pts", "shm", "ptmx", "fd", "stdin",
                                                                 "stdout", "stderr"])


def test_masked_proc_dirs_are_empty_and_read_only(sandbox):
    if not os.path.isdir("/proc/acpi"):
        pytest.skip("this kernel has no /proc/acpi")
    r = sandbox.exec("ls -A /proc/acpi | wc -l; touch /proc/acpi/x 2>&1; echo rc=$?")
    assert r.stdout.splitlines()[0] == "0" and "rc=1" in r.stdout, r.stdout


def test_nodev_data_dir_binds_the_host_nodes():
    """A data dir on a nodev file system cannot hold working nodes: each sandbox's /dev is
    then a tmpfs with the host's nodes bound one by one, and works the same."""
    d = Daemon(BUILD)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m,mode=0711,nodev", "tidepool-nodev", d.data_dir],
                   check=True)
    created = []
    try:
        d.start()
        assert not os.path.exists(os.path.join(d.data_dir, "containers", "dev"))
        c = tidepool.Client(d.url)
        with c.create(ttl=120) as sb:
            created.append(sb.id)
            assert _nodes(sb) == {n: (ma, mi, "0o666") for n, (ma, mi) in NODES.items()}
            _devices_work(sb)
            assert sb.exec("touch /dev/new && echo ok").stdout == "ok\n"  # its own tmpfs
    finally:
        rc = d.stop()
        try:
            wait_until(lambda: not any(leaks_of(s, None, d.data_dir) for s in created), 10,
                       what="no leftovers of the sandboxes")
        finally:
            subprocess.run(["umount", "-l", d.data_dir], check=False)
            d.cleanup()
    assert rc in (0, -signal.SIGTERM), rc
