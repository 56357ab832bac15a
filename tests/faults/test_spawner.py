"""The spawner (src/spawn/spawner.h): one `tp-agent --spawner` per daemon starts every
container sandbox's init. It may die or be killed at any time; the daemon may die under
it. Whatever happens:

  - sandboxes it started keep running: they are the daemon's children, not its own;
  - a killed spawner is replaced at the next create, which works;
  - `kill -9` of the daemon ends the spawner (EOF on its socket) but no sandbox, and
    the restarted daemon adopts them and starts a spawner of its own;
  - a sandbox's init holds no descriptor of the spawner's or the daemon's beyond the
    agent's own (0..6 and what the agent opens itself).
"""
import os
import signal

from tp_testlib import processes_of, wait_until


def children(pid: int, comm: str) -> list:
    """Live (not zombie) children of `pid` named `comm`."""
    found = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            text = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        state, ppid = text[text.rindex(")") + 2:].split()[:2]
        if int(ppid) == pid and state != "Z" and text[text.index("(") + 1:text.rindex(")")] == comm:
            found.append(int(d))
    return found


def spawner_of(daemon) -> int:
    wait_until(lambda: children(daemon.pid, "tp-spawner"), timeout=10, what="the daemon's spawner")
    found = children(daemon.pid, "tp-spawner")
    assert len(found) == 1, found
    return found[0]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def init_of(sb_id: str) -> int:
    pids = processes_of(sb_id)
    assert pids, sb_id
    return min(pids, key=lambda p: int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[19]))


def test_a_killed_spawner_is_replaced_and_its_sandboxes_live_on(daemon, client):
    before = client.create(ttl=300)
    assert before.exec("echo up").stdout == "up\n"
    old = spawner_of(daemon)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: not alive(old), timeout=10, what="the spawner to die")
    # Its sandbox is the daemon's child and did not notice.
    assert before.exec("echo still").stdout == "still\n"
    before.kill()  # (the next one reuses its uid range: no new cached idmap, no fd growth)
    after = client.create(ttl=300)
    assert after.exec("echo new").stdout == "new\n"
    new = spawner_of(daemon)
    assert new != old
    after.kill()


def test_kill9_of_the_daemon_ends_the_spawner_and_no_sandbox(daemon, client):
    sb = client.create(ttl=300)
    sb.files.write("/root/kept.txt", b"kept")
    init = init_of(sb.id)
    spawner = spawner_of(daemon)
    daemon.stop(signal.SIGKILL)
    # EOF on its socket: the spawner exits; the sandbox's init does not.
    wait_until(lambda: not alive(spawner), timeout=10, what="the spawner to exit after the daemon")
    assert alive(init)
    daemon.start()
    got = client.get(sb.id)
    assert got.state == "running"
    assert got.files.read("/root/kept.txt") == b"kept"
    assert got.exec("echo adopted").stdout == "adopted\n"
    assert init_of(sb.id) == init
    assert spawner_of(daemon) != spawner
    # The new daemon's spawner makes sandboxes too.
    other = client.create(ttl=300)
    assert other.exec("true").exit_code == 0
    got.kill()
    other.kill()


def test_the_sandbox_init_holds_only_the_agents_descriptors(daemon, client):
    sb = client.create(ttl=300)
    init = init_of(sb.id)
    spawner = spawner_of(daemon)
    spawner_socket = os.readlink(f"/proc/{spawner}/fd/3")
    fds = {int(fd): os.readlink(f"/proc/{init}/fd/{fd}") for fd in os.listdir(f"/proc/{init}/fd")}
    # 0..2 /dev/null, 3 the control stream, 4 the delegated cgroup, 5 the listening socket,
    # 6 its own oom_score_adj.
    assert all(fds[i] == "/dev/null" for i in (0, 1, 2)), fds
    assert fds[3].startswith("socket:") and fds[5].startswith("socket:"), fds
    assert "/freezer/" in fds[4] or fds[4].startswith("/sys/fs/cgroup"), fds
    assert fds[6] == f"/proc/{init}/oom_score_adj", fds
    for fd, target in fds.items():
        if fd > 5:
            # The agent's own: its signalfd, its root, command cgroups.
            assert target.startswith("anon_inode:") or target.startswith("/"), (fd, target)
        assert target != spawner_socket, (fd, target)
        assert not target.startswith("pipe:"), (fd, target)  # no error or sync pipe left
        if target.startswith("socket:") and fd not in (3, 5):
            raise AssertionError(f"extra socket {fd} -> {target} in the sandbox's init")
    # Between requests the spawner holds its stdio and its socket, nothing else.
    assert sorted(int(fd) for fd in os.listdir(f"/proc/{spawner}/fd")) == [0, 1, 2, 3]
    sb.kill()


def test_spawner_runs_unprivileged_sandboxes_only(daemon, client):
    """The sandbox's init is in a new user namespace owned by the sandbox's root, never host
    root, and the spawner itself stays outside every sandbox cgroup."""
    sb = client.create(ttl=300)
    init = init_of(sb.id)
    spawner = spawner_of(daemon)
    assert os.readlink(f"/proc/{init}/ns/user") != os.readlink("/proc/self/ns/user")
    with open(f"/proc/{init}/status") as f:
        uids = next(line for line in f if line.startswith("Uid:")).split()[1:]
    assert len(set(uids)) == 1 and uids[0] != "0", uids
    with open(f"/proc/{spawner}/cgroup") as f:
        assert sb.id not in f.read()
    assert spawner not in processes_of(sb.id)
    sb.kill()
