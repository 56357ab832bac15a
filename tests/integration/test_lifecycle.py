"""Lifecycle: create, get, list with label filters, delete, TTL and idle timeout."""
import pathlib
import threading
import uuid

import pytest

import tidepool
from tp_testlib import wait_until


def test_create_get_list_delete(client):
    tag = uuid.uuid4().hex[:8]
    a = client.create(image="host", labels={"suite": tag, "role": "a"}, ttl=600)
    b = client.create(image="host", labels={"suite": tag, "role": "b"}, ttl=600)
    assert a.state == "running" and a.id != b.id
    assert a.tier == "container" and a.image == "host"
    assert a.labels == {"suite": tag, "role": "a"}

    got = client.get(a.id)
    assert got.id == a.id and got.state == "running" and got.labels == a.labels

    assert sorted(s.id for s in client.list(labels={"suite": tag})) == sorted([a.id, b.id])
    assert [s.id for s in client.list(labels={"suite": tag, "role": "b"})] == [b.id]
    assert client.list(labels={"suite": tag, "role": "nope"}) == []
    assert {a.id, b.id} <= {s.id for s in client.list(state="running")}

    a.kill()
    assert a.state == "stopped"
    after = client.get(a.id)
    assert after.state == "stopped" and after.end_reason == "deleted"
    assert after.ended_at is not None
    # Live-only listing drops it; all=True still shows it.
    assert [s.id for s in client.list(labels={"suite": tag})] == [b.id]
    assert a.id in {s.id for s in client.list(labels={"suite": tag}, all=True)}
    b.kill()


def test_stopped_sandbox_refuses_work(client):
    sb = client.create(ttl=600)
    sb.kill()
    with pytest.raises(tidepool.Conflict) as ei:
        sb.exec("true")
    assert ei.value.status == 409 and ei.value.code == "conflict"
    with pytest.raises(tidepool.Conflict):
        next(sb.exec_stream("true"))
    with pytest.raises(tidepool.Conflict):
        sb.files.write("/x", b"x")
    with pytest.raises(tidepool.Conflict):
        sb.files.read("/etc/hostname")
    sb.kill()  # killing again is harmless


def test_unknown_id_is_not_found(client):
    for sid in ("n0-000000000000", "no-such-sandbox"):
        with pytest.raises(tidepool.NotFound) as ei:
            client.get(sid)
        assert ei.value.status == 404 and ei.value.code == "not_found"
        sb = tidepool.Sandbox(client, tidepool.SandboxInfo(id=sid, state="running"))
        with pytest.raises(tidepool.NotFound):
            sb.exec("true")
        with pytest.raises(tidepool.NotFound):
            sb.files.read("/etc/hostname")
    assert client.kill("n0-000000000000") is None  # DELETE answered 404


def test_context_manager_cleans_up_on_exception(client):
    with pytest.raises(ZeroDivisionError):
        with client.create(ttl=600) as sb:
            assert sb.exec("echo hi").stdout == "hi\n"
            1 / 0
    assert client.get(sb.id).state == "stopped"


def test_create_env_reaches_commands(client):
    with client.create(env={"GREETING": "hello world"}, ttl=600) as sb:
        r = sb.exec("printf %s \"$GREETING\"")
        assert r.stdout == "hello world"
        r = sb.exec("printf %s \"$GREETING\"", env={"GREETING": "override"})
        assert r.stdout == "override"


def test_parallel_sandboxes(client):
    """Several threads, each with its own sandbox, through one client."""
    errors = []

    def work(i):
        try:
            with client.create(ttl=600, labels={"worker": str(i)}) as sb:
                for j in range(3):
                    r = sb.exec(["sh", "-c", f"echo {i}-{j}; hostname"])
                    assert r.exit_code == 0 and r.stdout.split() == [f"{i}-{j}", sb.id]
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_daemon_threads_never_stay_in_a_sandbox_cgroup(client, daemon):
    """On cgroup v1 the creating daemon thread steps into the new sandbox's cgroups
    for the clone (so that the child is born there) and must step out again: a
    thread left inside would be killed with that sandbox, and its CPU and memory
    charged to it."""
    sbs = [client.create(ttl=600) for _ in range(4)]
    try:
        for sb in sbs:
            cg = sb.exec(["cat", "/proc/self/cgroup"]).stdout
            assert cg.strip(), "the sandbox sees its own cgroups"
        for task in pathlib.Path(f"/proc/{daemon.pid}/task").iterdir():
            own = (task / "cgroup").read_text()
            for sb in sbs:
                assert sb.id not in own, f"daemon thread {task.name} is in {sb.id}'s cgroup:\n{own}"
    finally:
        for sb in sbs:
            sb.kill()


def test_ttl_expiry(client):
    sb = client.create(ttl=2)
    assert sb.state == "running"
    assert sb.info.ttl_seconds == 2
    wait_until(lambda: client.get(sb.id).state == "stopped", timeout=30, interval=0.2,
               what="the sandbox to stop at its TTL")
    info = client.get(sb.id)
    assert info.end_reason == "ttl"
    with pytest.raises(tidepool.Conflict):
        sb.exec("true")


def test_idle_timeout(client):
    tag = uuid.uuid4().hex[:8]
    sb = client.create(ttl=600, idle_timeout=2, labels={"idle": tag})
    # Poll through the list route, which does not touch this sandbox (a GET or an exec might
    # count as activity and keep it alive).
    def state():
        found = [s for s in client.list(labels={"idle": tag}, all=True) if s.id == sb.id]
        return found[0].state if found else "gone"
    wait_until(lambda: state() == "stopped", timeout=30, interval=0.2,
               what="the idle sandbox to stop")
    assert client.get(sb.id).end_reason == "idle"


def test_activity_keeps_idle_sandbox_alive(client):
    sb = client.create(ttl=600, idle_timeout=3)
    # Work continuously for longer than the idle timeout: requests count as activity.
    import time
    end = time.monotonic() + 5
    while time.monotonic() < end:
        assert sb.exec("true").exit_code == 0
        time.sleep(0.2)
    assert client.get(sb.id).state == "running"


def test_leak_detector_sees_a_live_sandbox(client, daemon):
    """The after-test leak check is only meaningful if it finds a live sandbox's traces."""
    from tp_testlib import cgroup_dirs_of, processes_of, leaks_of
    sb = client.create(ttl=600)
    assert cgroup_dirs_of(sb.id), "no cgroup directory named after a live sandbox"
    assert processes_of(sb.id), "no host process in a live sandbox's cgroup"
    sb.kill()
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=10, what="delete to clean up")
