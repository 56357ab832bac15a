"""The microvm tier's own behaviour (src/runtime/microvm/microvm_backend.h): a guest kernel of
its own, clones of one template that share nothing they write, a guest that panics or fills
its memory, its pids limit, live restore of VMs across a kill -9 of the daemon, cold boots
when templates are off, and refusals of what the tier cannot do. Every test is marked `vm`
and skips when the daemon has no microvm tier (no assets: scripts/microvm-assets.sh)."""
import concurrent.futures
import os
import re
import time

import pytest

import tidepool
from tp_testlib import Daemon, http_raw, leaks_of, processes_of, upload_payload, wait_until

pytestmark = pytest.mark.vm


@pytest.fixture
def vm_client(client):
    if "microvm" not in client.version().get("tiers", []):
        pytest.skip("this daemon has no microvm tier")
    return client


def vm(c, **kw):
    kw.setdefault("ttl", 600)
    return c.create(tier="microvm", **kw)


def qemu_pids(sandbox_id):
    return [p for p in processes_of(sandbox_id) if open(f"/proc/{p}/comm").read().startswith("qemu")]


def test_guest_runs_its_own_kernel(vm_client):
    with vm(vm_client) as sb:
        assert sb.info.tier == "microvm"
        kernel = sb.exec("uname -r").stdout.strip()
        assert kernel and kernel != os.uname().release
        # Its PID 1 is tp-agent, its hostname the sandbox id, its clock the host's.
        assert sb.exec("hostname").stdout.strip() == sb.id
        guest_now = float(sb.exec("date +%s").stdout)
        assert abs(guest_now - time.time()) < 60
        # QEMU runs as the sandbox's own unprivileged host uid, not root.
        pids = qemu_pids(sb.id)
        assert len(pids) == 1
        with open(f"/proc/{pids[0]}/status") as f:
            uid = int(re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1))
        assert uid != 0


def test_clones_share_nothing_they_write(vm_client):
    a, b = vm(vm_client), vm(vm_client)
    try:
        a.files.write("/root/mine", b"from a\n")
        a.exec("echo a > /tmp/t && echo a > /etc/hostname-copy")
        assert not b.exec("test -e /root/mine").ok
        assert not b.exec("test -e /tmp/t || test -e /etc/hostname-copy").ok
        # Each clone has its own hostname and its own random numbers.
        ra, rb = (s.exec("head -c 16 /dev/urandom | od -An -tx1").stdout for s in (a, b))
        assert ra != rb
        assert a.exec("hostname").stdout.strip() == a.id and b.exec("hostname").stdout.strip() == b.id
        # A clone made after both starts from the template, untouched by either.
        with vm(vm_client) as c:
            assert not c.exec("test -e /root/mine || test -e /tmp/t").ok
    finally:
        a.kill()
        b.kill()


def test_two_clones_run_at_once(vm_client):
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        sbs = list(ex.map(lambda _: vm(vm_client), range(2)))
    try:
        assert len({s.id for s in sbs}) == 2
        # Both busy at the same time: each sees its own marker after both started.
        with concurrent.futures.ThreadPoolExecutor(2) as ex2:
            outs = list(ex2.map(lambda p: p[1].exec(f"echo {p[0]} > /tmp/me; sleep 1; cat /tmp/me").stdout,
                                enumerate(sbs)))
        assert outs == ["0\n", "1\n"]
        assert all(len(qemu_pids(s.id)) == 1 for s in sbs)
    finally:
        for s in sbs:
            s.kill()


def test_guest_panic_is_reported_and_cleaned_up(vm_client, daemon):
    sb = vm(vm_client)
    since = daemon.log_size()
    assert qemu_pids(sb.id)
    with pytest.raises(tidepool.TidepoolError):
        sb.exec("echo c > /proc/sysrq-trigger; sleep 30", timeout=60)
    wait_until(lambda: vm_client.get(sb.id).state == "stopped", timeout=60, what="the panicked VM to stop")
    info = vm_client.get(sb.id)
    assert info.end_reason == "failed"
    log = daemon.log_tail(200, since=since)
    assert sb.id in log and ("panic" in log.lower()), log
    wait_until(lambda: not leaks_of(sb.id, daemon.pid, daemon.data_dir), timeout=30,
               what="nothing of the VM to remain")


def test_guest_that_fills_its_memory_survives_and_reports_it(vm_client, payload):
    with vm(vm_client, memory_mb=256) as sb:
        hog = upload_payload(sb, payload("memhog"))
        r = sb.exec([hog, "1024"], timeout=120)
        assert not r.ok and (r.oom_killed or r.signal == 9), r
        assert r.oom_killed, "the guest kernel's OOM kill is reported"
        r = sb.exec([hog, "16"], timeout=60)
        assert r.exit_code == 0 and "got 16 MiB" in r.stdout
        assert len(qemu_pids(sb.id)) == 1


def test_pids_limit_holds_in_the_guest(vm_client, payload):
    with vm(vm_client, pids=64) as sb:
        bomb = upload_payload(sb, payload("forkbomb"))
        r = sb.exec([bomb], timeout=5)
        assert r.timed_out
        m = re.search(r"forks=(\d+) errno=(\d+)", r.stdout)
        assert m, r.stdout
        assert int(m.group(2)) != 0 and int(m.group(1)) < 64
        # Everything it made died with it: no user process but the agent is left.
        assert sb.exec("echo alive").stdout == "alive\n"
        left = sb.exec("for p in /proc/[0-9]*; do [ -s $p/cmdline ] && echo $p; done | wc -l").stdout
        assert int(left) <= 4, left  # the agent, and this command's sh, for, wc


def test_vm_outlives_a_kill9_of_the_daemon(vm_client, daemon):
    sb = vm(vm_client)
    sb.files.write("/root/kept", b"kept\n")
    proc = sb.exec("echo p1; while [ ! -e /root/go ]; do sleep 0.1; done; echo p2", background=True)
    qemu = qemu_pids(sb.id)
    daemon.restart(kill9=True)
    info = vm_client.get(sb.id)
    assert info.state == "running", info
    assert qemu_pids(sb.id) == qemu  # the same QEMU: adopted, not restarted
    assert sb.files.read("/root/kept") == b"kept\n"
    sb.exec("touch /root/go")
    out = proc.wait(timeout=30)
    assert out.stdout == "p1\np2\n", out
    assert sb.exec("echo after").stdout == "after\n"
    sb.kill()


def test_bad_requests_for_the_tier(vm_client, daemon):
    st, _, body = http_raw(daemon.url, "POST", "/v1/sandboxes", body=b'{"tier":"nope"}')
    assert st == 400 and b"tier" in body
    with pytest.raises(tidepool.TidepoolError) as ei:
        vm(vm_client, memory_mb=64)
    assert ei.value.status == 400 and "128" in str(ei.value)


@pytest.mark.slow
def test_cold_boot_without_templates(build_dir):
    d = Daemon(build_dir, extra_args=["--microvm-templates", "off"])
    d.start()
    try:
        c = tidepool.Client(d.url)
        if "microvm" not in c.version().get("tiers", []):
            pytest.skip("no microvm tier")
        sb = c.create(tier="microvm", ttl=120)
        assert sb.exec("echo cold").stdout == "cold\n"
        assert not os.listdir(os.path.join(d.data_dir, "microvm", "templates"))
        sid = sb.id
        sb.kill()
        assert not leaks_of(sid, d.pid, d.data_dir)
    finally:
        d.stop()
        d.cleanup()


def test_cli_creates_a_microvm(vm_client, daemon, build_dir, track):
    import subprocess
    cli = str(build_dir / "bin" / "tidepool")
    p = subprocess.run([cli, "create", "--tier", "microvm", "--ttl", "120"], capture_output=True,
                       text=True, env=daemon.env(), timeout=120)
    assert p.returncode == 0, p.stderr
    sid = p.stdout.strip()
    track(sid)
    assert vm_client.get(sid).info.tier == "microvm"
    p = subprocess.run([cli, "exec", sid, "--", "uname", "-r"], capture_output=True, text=True,
                       env=daemon.env(), timeout=120)
    assert p.returncode == 0 and p.stdout.strip() != os.uname().release, p
    p = subprocess.run([cli, "rm", sid], capture_output=True, text=True, env=daemon.env(), timeout=120)
    assert p.returncode == 0, p.stderr
    # An unknown tier: a non-zero exit with a one-line reason.
    p = subprocess.run([cli, "create", "--tier", "vmx"], capture_output=True, text=True,
                       env=daemon.env(), timeout=60)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and "tier" in p.stderr
