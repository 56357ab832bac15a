"""Live restore, the host side that exists for every sandbox: the agent's listening socket
<run dir>/<id>.sock (the run dir is /run/tidepool/<name> when /run is a tmpfs, else
<data_dir>/containers/run), the init it serves recorded in the socket's xattr, reachable by
root only (not by the sandbox's host uid), gone with the sandbox. Adoption itself (release, a new backend,
adopt, a new agent session) is tested below the daemon in
tests/unit/runtime/container_backend_test.cpp and tests/unit/agent/agent_session_test.cpp."""
import os
import stat
import subprocess
import sys

from tp_testlib import leaks_of, run_dir_of, sandbox_root_on_host, wait_until


def socket_of(daemon, sid):
    return os.path.join(run_dir_of(daemon.data_dir), sid + ".sock")


def test_run_dir_holds_the_agent_socket_and_state(client, daemon):
    sb = client.create(ttl=600)
    d = socket_of(daemon, sb.id)
    top = os.stat(os.path.dirname(d))
    assert stat.S_IMODE(top.st_mode) == 0o700 and top.st_uid == 0
    assert stat.S_ISSOCK(os.stat(d).st_mode)
    text = os.getxattr(d, "trusted.tidepool.init").decode()
    fields = dict(line.split() for line in text.splitlines() if line.strip())
    pid = int(fields["pid"])
    with open(f"/proc/{pid}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    assert fields["starttime"] == start
    assert sb.exec("echo ok").stdout == "ok\n"
    sb.kill()
    wait_until(lambda: not os.path.exists(d), timeout=15, interval=0.2, what="run dir removed")
    assert not leaks_of(sb.id, daemon.pid, daemon.data_dir)


def test_sandbox_uid_cannot_reach_the_agent_socket(client, daemon):
    sb = client.create(ttl=600)
    path = socket_of(daemon, sb.id)
    # The sandbox's root is an unprivileged host uid (its own range's first id); from the
    # host it still cannot connect.
    root = sandbox_root_on_host(sb.id)
    assert root != 0
    probe = (
        "import os, socket, sys\n"
        f"os.setgid({root}); os.setuid({root})\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect({path!r})\n"
        "except PermissionError:\n"
        "    sys.exit(3)\n"
        "sys.exit(0)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3, (r.returncode, r.stderr)
    # Inside the sandbox the host path does not exist.
    assert sb.exec(f"test -e {path}").exit_code != 0
    assert sb.exec("echo still served").stdout == "still served\n"
