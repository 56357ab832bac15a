"""One process world per sandbox: every command shares the sandbox's pid namespace.

`$$`, /proc/<pid>, ps, pgrep and pkill behave as on any Linux machine, across execs
too; a command's whole process tree is still tracked (by a cgroup per command under
the sandbox's cgroup) and killed on timeout, SIGKILL, or when its main process exits.
"""
import os
import re

import tidepool
from tp_testlib import cgroup_dirs_of, wait_until


def command_cgroups(sandbox_id):
    """Per-command cgroup directories (c<N>) under the sandbox's cgroups on the host."""
    found = []
    for d in cgroup_dirs_of(sandbox_id):
        for name in os.listdir(d):
            if re.fullmatch(r"c\d+", name) and os.path.isdir(os.path.join(d, name)):
                found.append(os.path.join(d, name))
    return found


def cgroup_procs(d):
    with open(os.path.join(d, "cgroup.procs")) as f:
        return f.read().split()


def test_dollar_dollar_is_the_shell(sandbox):
    r = sandbox.exec("echo $$; cat /proc/$$/status")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    pid = int(lines[0])
    assert pid > 1
    status = dict(l.split(":\t", 1) for l in lines[1:] if ":\t" in l)
    assert status["Name"] == "sh"
    assert int(status["Pid"]) == pid


def test_background_process_is_found_and_stopped_by_later_execs(sandbox):
    h = sandbox.start(["sleep", "1000"])
    try:
        # (The processes API's pid is the daemon's handle of the command, not its pid.)
        found = wait_until(lambda: sandbox.exec("pgrep -x sleep").stdout.split(), 10, what="pgrep finds it")
        assert len(found) == 1, found
        pid = int(found[0])
        assert sandbox.exec(f"kill -0 {pid} && cat /proc/{pid}/comm").stdout == "sleep\n"
        assert sandbox.exec(f"ps -o ppid= -p {pid}").stdout.strip() == "1"
        stop = sandbox.exec("pkill -x sleep")
        assert stop.exit_code == 0, stop.stderr
        res = h.wait(timeout=30)
        assert res.signal == 15
        assert sandbox.exec("pgrep -x sleep").exit_code == 1
    finally:
        try:
            h.kill()
        except tidepool.TidepoolError:
            pass


def test_a_started_process_is_answered_with_its_pid_once_it_runs(sandbox):
    h = sandbox.start(["sleep", "1000"])
    try:
        pid = h.info.os_pid
        assert pid and pid > 1, h.info
        # No waiting: the answer came once the process ran, so the next request finds it.
        assert sandbox.exec(f"cat /proc/{pid}/comm").stdout == "sleep\n"
        assert [(p.pid, p.os_pid) for p in sandbox.processes()] == [(h.pid, pid)]
        assert sandbox.exec(f"kill {pid}").exit_code == 0
        assert h.wait(timeout=30).signal == 15
    finally:
        try:
            h.kill()
        except tidepool.TidepoolError:
            pass
    # A command that cannot run is answered ended, with no pid.
    gone = sandbox.start(["/no/such/command"])
    assert gone.info.state == "exited", gone.info
    assert gone.info.os_pid is None
    assert gone.info.result is not None and gone.info.result.exit_code != 0, gone.info


def test_double_forked_daemon_dies_with_its_exec(sandbox):
    # The daemon's parent exits at once: it is reparented to PID 1 and in its own session.
    r = sandbox.exec("(setsid sleep 1000 </dev/null >/dev/null 2>&1 &); "
                     "for i in $(seq 100); do pgrep -x sleep && exit 0; sleep 0.05; done; exit 1")
    assert r.exit_code == 0, r.stderr
    daemon = int(r.stdout.split()[0])
    after = sandbox.exec(f"pgrep -x sleep; test -e /proc/{daemon}")
    assert after.stdout == "" and after.exit_code == 1


def test_timeout_kills_the_whole_tree(sandbox):
    r = sandbox.exec("sleep 1000 & (setsid sleep 1000 </dev/null >/dev/null 2>&1 &); "
                     "nohup sleep 1000 >/dev/null 2>&1 & echo started; sleep 1000", timeout=2)
    assert r.timed_out and r.signal == 9
    assert r.stdout == "started\n"
    assert sandbox.exec("pgrep -x sleep").exit_code == 1


def test_ps_shows_the_agent_as_pid_1_and_real_pids(sandbox):
    r = sandbox.exec("echo $$; ps -eo pid=,ppid=,comm=")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    shell = int(lines[0])
    rows = [l.split(None, 2) for l in lines[1:]]
    procs = {int(p): (int(pp), c) for p, pp, c in rows}
    assert 1 in procs and procs[1][0] == 0
    assert procs[shell][1] == "sh" and procs[shell][0] == 1
    ps = [p for p, (pp, c) in procs.items() if c == "ps"]
    assert len(ps) == 1 and procs[ps[0]][0] == shell


def test_commands_cannot_reach_cgroupfs(sandbox):
    # Not among the command's fds (the agent's fd is CLOEXEC), no /sys, no mount.
    fds = sandbox.exec("ls -l /proc/self/fd/")
    assert fds.exit_code == 0 and "cgroup" not in fds.stdout, fds.stdout
    assert sandbox.exec("ls /sys/fs/cgroup").exit_code != 0
    assert sandbox.exec("mkdir -p /tmp/cg && mount -t cgroup2 none /tmp/cg").exit_code != 0
    assert sandbox.exec("mount -t cgroup -o freezer none /tmp/cg").exit_code != 0
    # The agent's /proc/1/fd is closed to commands (the agent is not dumpable).
    assert sandbox.exec("ls -l /proc/1/fd/").exit_code != 0
    # The command sees its own cgroup relative to the sandbox's (cgroup namespace).
    own = sandbox.exec("cat /proc/self/cgroup")
    assert "tidepool" not in own.stdout and re.search(r":/c\d+$", own.stdout, re.M), own.stdout


def test_no_command_cgroup_keeps_a_process(client):
    sb = client.create(image="host", ttl=600)
    assert sb.exec("true").exit_code == 0
    assert sb.exec("sleep 1000 & sleep 1000", timeout=1).timed_out
    try:
        sb.exec(["/no/such/program"])
    except tidepool.TidepoolError:
        pass
    h = sb.start(["sleep", "1000"])
    # A start is answered once its process runs (api/openapi.yaml), in its own cgroup.
    busy = [d for d in command_cgroups(sb.id) if cgroup_procs(d)]
    assert len(busy) == 1, "the running background command has a cgroup of its own"
    h.kill()
    h.wait(timeout=30)
    # An ended command's cgroup is emptied; the agent keeps a few empty ones for
    # the next commands.
    wait_until(lambda: not any(cgroup_procs(d) for d in command_cgroups(sb.id)), 10,
               what="command cgroups emptied")
    assert len(command_cgroups(sb.id)) <= 4
    assert cgroup_dirs_of(sb.id)
    # A sandbox deleted with a command still running leaves no cgroup either.
    sb.start(["sleep", "1000"])
    client.kill(sb.id)
    wait_until(lambda: not cgroup_dirs_of(sb.id), 10, what="sandbox cgroup removed")
