"""Limits: memory (OOM kill reported), pids (fork bomb contained), cpu quota."""
import re

from tp_testlib import health_ok, upload_payload


def test_memory_hog_is_killed_and_reported(client, payload, daemon):
    with client.create(memory_mb=64, ttl=600) as sb:
        hog = upload_payload(sb, payload("memhog"))
        r = sb.exec([hog, "512"], timeout=60)
        assert not r.ok
        assert r.oom_killed or r.signal == 9, r
        assert "got 512 MiB" not in r.stdout
        # Within the limit it works, and the sandbox survived the OOM kill.
        r = sb.exec([hog, "16"], timeout=60)
        assert r.exit_code == 0 and "got 16 MiB" in r.stdout
    assert health_ok(daemon.url)


def test_fork_bomb_stops_at_pids_limit(client, payload, daemon):
    with client.create(pids=64, ttl=600) as sb:
        assert sb.info.pids == 64
        bomb = upload_payload(sb, payload("forkbomb"))
        r = sb.exec([bomb], timeout=3)
        assert r.timed_out
        m = re.search(r"forks=(\d+) errno=(\d+)", r.stdout)
        assert m, r.stdout
        forks, err = int(m.group(1)), int(m.group(2))
        assert err != 0 and forks < 64
        # Everything the bomb made was killed with it: the sandbox runs commands again.
        assert sb.exec("echo alive").stdout == "alive\n"
        n = int(sb.exec("ls -d /proc/[0-9]* | wc -l").stdout)
        assert n < 10
        # A real, recursive shell fork bomb, stopped by the timeout.
        r = sb.exec("b() { b | b & }; b; sleep 100", timeout=3)
        assert r.timed_out or not r.ok
        assert sb.exec("echo alive").stdout == "alive\n"
    assert health_ok(daemon.url)
    # Other sandboxes are unaffected.
    with client.create(ttl=600) as other:
        assert other.exec("echo ok").stdout == "ok\n"


def test_cpu_quota_holds(client, payload):
    with client.create(cpus=0.5, ttl=600) as sb:
        spin = upload_payload(sb, payload("cpuspin"))
        r = sb.exec([spin, "2"], timeout=60)
        assert r.exit_code == 0, r
        m = re.search(r"wall=([\d.]+) cpu=([\d.]+)", r.stdout)
        wall, cpu = float(m.group(1)), float(m.group(2))
        # About half the wall time; loose bound, and the loop did run.
        assert cpu < 0.8 * wall, r.stdout
        assert cpu > 0.05 * wall, r.stdout


def test_limits_are_reported(client):
    with client.create(memory_mb=128, cpus=0.25, pids=100, disk_mb=64, ttl=300) as sb:
        info = client.get(sb.id).info
        assert (info.memory_mb, info.cpus, info.pids, info.disk_mb, info.ttl_seconds) == (128, 0.25, 100, 64, 300)
        assert info.expires_at is not None and info.created_at is not None


def test_no_core_dumps_and_open_files_limit(sandbox):
    assert sandbox.exec("ulimit -c").stdout.strip() == "0"
    n = sandbox.exec("ulimit -n").stdout.strip()
    assert n == "unlimited" or int(n) > 0
