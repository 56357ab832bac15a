"""Isolation: processes, network, the daemon's port, other sandboxes, users, mounts, host secrets."""
import errno
import os
import uuid

from tp_testlib import processes_of, host_uid_of


def test_only_sandbox_processes_visible(sandbox, daemon):
    r = sandbox.exec("for p in /proc/[0-9]*; do echo ${p#/proc/} $(cat $p/comm 2>/dev/null); done")
    procs = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines() if " " in line)
    assert "1" in procs  # the agent is PID 1
    assert len(procs) < 10, procs
    assert "tidepoold" not in procs.values()
    assert "systemd" not in procs.values() and "init" not in procs.values()
    assert str(daemon.pid) not in procs or procs[str(daemon.pid)] != "tidepoold"


def test_network_is_loopback_only(sandbox):
    lines = sandbox.exec("cat /proc/net/dev").stdout.strip().splitlines()[2:]
    ifaces = sorted(l.split(":")[0].strip() for l in lines)
    assert ifaces == ["lo"]
    # Loopback is up inside.
    r = sandbox.exec(["python3", "-c",
                      "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
                      "c=socket.create_connection(s.getsockname()); print('ok')"])
    assert r.stdout == "ok\n", r.stderr


def test_daemon_port_unreachable(sandbox, daemon):
    host_ips = ["127.0.0.1"]
    try:
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.255.255.255", 1))
        host_ips.append(s.getsockname()[0])
        s.close()
    except OSError:
        pass
    for ip in host_ips:
        r = sandbox.exec(["python3", "-c",
                          "import socket,sys\n"
                          "try:\n"
                          f"    socket.create_connection(('{ip}', {daemon.port}), timeout=3)\n"
                          "    print('connected')\n"
                          "except OSError as e:\n"
                          "    print('refused', e.errno)\n"])
        assert r.stdout.startswith("refused"), (ip, r.stdout, r.stderr)


def test_other_sandboxes_files_invisible(client):
    secret = uuid.uuid4().hex
    with client.create(ttl=600) as a, client.create(ttl=600) as b:
        a.files.write(f"/work/{secret}", b"secret")
        a.files.write(f"/tmp/{secret}", b"secret")
        assert b.exec(f"test -e /work/{secret} || test -e /tmp/{secret}").exit_code != 0
        r = b.exec(f"grep -rl {secret} /work /tmp /root /home 2>/dev/null; true")
        assert secret not in r.stdout
        assert not b.files.exists(f"/work/{secret}")


def test_root_inside_is_not_host_root(sandbox):
    uid_map = sandbox.exec("cat /proc/self/uid_map").stdout.split()
    assert uid_map[0] == "0" and uid_map[1] != "0", uid_map
    gid_map = sandbox.exec("cat /proc/self/gid_map").stdout.split()
    assert gid_map[0] == "0" and gid_map[1] != "0", gid_map
    assert sandbox.exec("id -u").stdout.strip() == "0"
    # Seen from the host, every process of the sandbox runs as a non-root uid.
    pids = processes_of(sandbox.id)
    assert pids, "no host process found in the sandbox's cgroup"
    for p in pids:
        assert host_uid_of(p) != 0, f"pid {p} runs as host root"
    # Host-root-only operations fail even for root inside.
    r = sandbox.exec("cat /proc/1/environ >/dev/null 2>&1; echo > /proc/sysrq-trigger 2>/dev/null; echo $?")
    assert r.stdout.strip() != "0"
    assert sandbox.exec("echo 1 > /proc/sys/kernel/hostname").exit_code != 0


def test_mount_is_refused(sandbox):
    r = sandbox.exec(["python3", "-c",
                      "import ctypes, os\n"
                      "libc = ctypes.CDLL(None, use_errno=True)\n"
                      "r = libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)\n"
                      "print(r, ctypes.get_errno())\n"])
    rc, err = r.stdout.split()
    assert rc == "-1" and int(err) == errno.EPERM, r.stdout
    r = sandbox.exec("mount -t tmpfs none /mnt 2>&1; echo rc=$?")
    assert "rc=0" not in r.stdout


def test_host_secrets_not_visible(sandbox):
    r = sandbox.exec("cat /etc/shadow 2>/dev/null")
    with open("/etc/shadow", "rb") as f:
        host_shadow = f.read()
    assert r.exit_code != 0 or r.stdout_bytes != host_shadow
    assert b"root:" not in r.stdout_bytes or r.stdout_bytes != host_shadow
    inside_root = set(sandbox.exec("ls -A /root 2>/dev/null").stdout.split())
    host_root = set(os.listdir("/root"))
    assert not (inside_root & host_root - {".bashrc", ".profile"}), inside_root & host_root
    if os.path.isdir("/home"):
        inside_home = set(sandbox.exec("ls -A /home 2>/dev/null").stdout.split())
        assert not inside_home & set(os.listdir("/home"))
    assert sandbox.exec("ls /etc/ssh/ssh_host_*key 2>/dev/null").stdout == ""


def test_proc_masked(sandbox):
    assert sandbox.exec("head -c 16 /proc/kcore 2>/dev/null | wc -c").stdout.strip() == "0"
    for p in ("/proc/kpageflags", "/proc/sysrq-trigger", "/proc/timer_list", "/proc/keys"):
        r = sandbox.exec(f"head -c 16 {p} 2>/dev/null | wc -c")
        assert r.stdout.strip() == "0", p
    r = sandbox.exec("touch /proc/sys/kernel/x 2>&1; echo 1 > /proc/sys/vm/drop_caches 2>&1; echo $?")
    assert r.stdout.strip().splitlines()[-1] != "0"


def test_user_namespace_limits_are_the_sandboxs_own(sandbox):
    # Written at setup through the sandbox's own /proc, then read-only like the rest of /proc/sys.
    want = {"max_user_namespaces": "0", "max_inotify_instances": "32", "max_inotify_watches": "16384"}
    for name, value in want.items():
        path = f"/proc/sys/user/{name}"
        if not os.path.exists(path):  # older host kernels lack the inotify ones: skipped there too
            continue
        assert sandbox.exec(f"cat {path}").stdout.strip() == value, name
    r = sandbox.exec("echo 5 > /proc/sys/user/max_user_namespaces 2>/dev/null; echo $?")
    assert r.stdout.strip() != "0"
    assert sandbox.exec("cat /proc/sys/user/max_user_namespaces").stdout.strip() == "0"


def test_hostname_is_sandbox_id(sandbox):
    assert sandbox.exec("cat /proc/sys/kernel/hostname").stdout.strip() == sandbox.id
    assert sandbox.exec("hostname").stdout.strip() == sandbox.id


def test_agent_binary_not_writable(sandbox):
    # Root inside can neither overwrite nor truncate the program of PID 1 (the agent).
    r = sandbox.exec("echo x > /proc/1/exe 2>/dev/null; echo $?")
    assert r.stdout.strip() != "0"
    r = sandbox.exec("cat /proc/1/exe > /tmp/agent.copy 2>/dev/null; echo $?")
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_no_new_privileges(sandbox):
    r = sandbox.exec("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status")
    fields = dict(l.split(":\t") for l in r.stdout.strip().splitlines())
    assert fields.get("NoNewPrivs", "").strip() == "1"
    assert fields.get("Seccomp", "").strip() == "2"
