"""A full file system under the data directory (a tmpfs mounted as the data dir of a
private daemon, then filled): calls that need the disk fail with clean JSON errors
(5xx with {code, message}), the daemon keeps serving what does not need the disk,
state.db is never corrupt, and everything works again once space returns."""
import io
import json
import os
import subprocess
import tarfile
import time

import pytest

import tidepool
from faultlib import no_retry_client, store_rows, wait_no_host_leaks
from tp_testlib import BUILD, Daemon, http_raw, wait_until

# The image store keeps 512 MiB free while unpacking; leave room above that.
TMPFS_SIZE = "700m"


def _layer_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        data = b"hello from a layer\n"
        ti = tarfile.TarInfo("hello.txt")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _fill(path: str) -> None:
    """Writes until ENOSPC (big chunks first, then small ones for the last pages)."""
    with open(path, "ab", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    f.write(block)
                except OSError as e:
                    if e.errno != 28:
                        raise
                    break


def _json_error(status, ctype, body):
    assert ctype.startswith("application/json"), (status, ctype, body[:200])
    obj = json.loads(body)
    assert obj.get("code") and obj.get("message"), obj
    return obj


@pytest.fixture
def small_daemon():
    d = Daemon(BUILD)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0711", "tidepool-fault",
                    d.data_dir], check=True)
    try:
        d.start()
        yield d
    finally:
        rc = d.stop()
        log = d.log_tail()
        try:
            wait_no_host_leaks(d.data_dir, exclude_mounts=[d.data_dir])
        finally:
            subprocess.run(["umount", "-l", d.data_dir], check=False)
            d.cleanup()
        # 0 or SIGTERM; an ASan build exits 23 here when LeakSanitizer found a leak.
        assert rc in (0, -15, None), f"tidepoold exited with {rc}:\n{log}"


def test_full_data_dir_gives_clean_errors_and_recovers(small_daemon):
    d = small_daemon
    filler = os.path.join(d.data_dir, "filler")
    c = no_retry_client(d.url)
    created = []
    try:
        sb = c.create(ttl=600)
        created.append(sb.id)
        assert sb.exec("echo before").stdout == "before\n"
        victim = c.create(ttl=600)
        created.append(victim.id)

        _fill(filler)
        # Creating needs the store (and the sandbox's working directory): it either works
        # or fails cleanly.
        for _ in range(3):
            st, ct, body = http_raw(d.url, "POST", "/v1/sandboxes", body=b'{"ttl_seconds": 600}',
                                    headers={"Content-Type": "application/json"}, timeout=120)
            if st == 201:
                sid = json.loads(body)["id"]
                created.append(sid)
                assert c.get(sid).exec("echo ok").stdout == "ok\n"
            else:
                assert st in (500, 503, 507), (st, body)
                _json_error(st, ct, body)
        # An image import needs space: a clean 507 (or 500), never a crash.
        st, ct, body = http_raw(d.url, "POST", "/v1/images/import?name=full&version=1&kind=layer",
                                body=_layer_tar(), headers={"Content-Type": "application/x-tar"}, timeout=120)
        assert st in (500, 507), (st, body)
        _json_error(st, ct, body)
        # Ending a sandbox while full: a clean answer, and never reported running afterwards.
        st, ct, body = http_raw(d.url, "DELETE", f"/v1/sandboxes/{victim.id}", timeout=60)
        if st != 200:
            assert st in (500, 507), (st, body)
            _json_error(st, ct, body)
        # What does not need the data disk keeps working.
        assert sb.exec("echo during").stdout == "during\n"
        sb.files.write("/tmp/x", b"x" * 1000)
        assert sb.files.read("/tmp/x") == b"x" * 1000
        assert c.health()["status"] == "ok"
        st, ct, body = http_raw(d.url, "GET", "/v1/sandboxes?all=true")
        assert st == 200, body
        assert d.alive()
        store_rows(d.data_dir)  # integrity_check while full

        assert c.get(victim.id).state != "running", c.get(victim.id).info

        # Space returns: everything works again.
        os.unlink(filler)
        assert c.get(victim.id).state in ("stopped", "lost"), c.get(victim.id).info
        sb2 = c.create(ttl=600)
        created.append(sb2.id)
        assert sb2.exec("echo after").stdout == "after\n"
        st, ct, body = http_raw(d.url, "POST", "/v1/images/import?name=full&version=1&kind=layer",
                                body=_layer_tar(), headers={"Content-Type": "application/x-tar"}, timeout=120)
        assert st == 201, (st, body)
        with c.create(image="full:1", ttl=60) as sb3:
            created.append(sb3.id)
            assert sb3.files.read("/hello.txt") == b"hello from a layer\n"
        for sid in created:
            c.kill(sid)
        # An end that could not be stored while full is stored once space returned (the
        # daemon retries every tick).
        def all_stopped():
            rows = store_rows(d.data_dir)
            return all(rows.get(sid, {}).get("state") == "stopped" for sid in created) and rows
        rows = wait_until(all_stopped, timeout=10, interval=0.1, what="every end to be stored")
        for sid in created:
            assert rows[sid]["state"] == "stopped", f"{sid}: {rows.get(sid)}\n{d.log_tail(40)}"
        # And the store survives a crash right after the episode.
        d.restart(kill9=True)
        rows = store_rows(d.data_dir)
        assert not [r for r in rows.values() if r["state"] in ("creating", "running")], rows
        assert sb.id in rows
    finally:
        if os.path.exists(filler):
            os.unlink(filler)
        for sid in created:
            try:
                c.kill(sid)
            except tidepool.TidepoolError:
                pass
        c.close()


def test_full_data_dir_at_startup(small_daemon):
    """A daemon restarted on a full disk comes up (or refuses with a message) without
    damaging state.db, and serves once space returns; the previous run's sandbox is
    adopted or recorded as ended, never left without a record."""
    d = small_daemon
    filler = os.path.join(d.data_dir, "filler")
    c = no_retry_client(d.url)
    sb = c.create(ttl=600)
    try:
        d.stop(9)
        _fill(filler)
        d.proc = None
        try:
            d.start()
            started = True
        except BaseException:  # pytest.fail from start(): it exited; the log says why
            started = False
        rows = store_rows(d.data_dir)  # not corrupt, whether it started or not
        if started:
            # It adopted the previous run's sandbox (live restore), or recorded it as
            # ended where it could not (sqlite found room).
            assert rows[sb.id]["state"] in ("running", "stopped"), rows[sb.id]
        else:
            # It refused to serve with records it could not correct, and said why.
            assert "recover" in d.log_tail(20), d.log_tail(20)
        os.unlink(filler)
        if not started or not d.alive():
            d.start()
        rows = store_rows(d.data_dir)
        assert rows[sb.id]["state"] in ("running", "stopped"), rows[sb.id]
        if rows[sb.id]["state"] == "running":
            assert c.get(sb.id).exec("echo adopted").stdout == "adopted\n"
        with c.create(ttl=60) as sb2:
            assert sb2.exec("echo ok").stdout == "ok\n"
    finally:
        if os.path.exists(filler):
            os.unlink(filler)
        try:
            c.kill(sb.id)
        finally:
            c.close()
