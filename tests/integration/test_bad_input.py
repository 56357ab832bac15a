"""Bad input: each gets a clear JSON error with the right status; the daemon keeps serving
and existing sandboxes keep working."""
import json
import os
import uuid

import pytest

import tidepool
from tp_testlib import health_ok, http_raw


@pytest.fixture
def witness(client, daemon):
    """A sandbox that must survive every bad request (checked after the test)."""
    sb = client.create(ttl=600)
    sb.files.write("/state.txt", b"kept")
    yield sb
    assert health_ok(daemon.url)
    assert sb.exec("cat /state.txt").stdout == "kept"


@pytest.fixture(autouse=True)
def still_serving(daemon):
    yield
    assert health_ok(daemon.url)


def _assert_json_error(status, ctype, body, want_status, want_code):
    assert status == want_status, (status, body)
    assert ctype.split(";")[0].strip() == "application/json", ctype
    obj = json.loads(body)
    assert obj["code"] == want_code and isinstance(obj["message"], str) and obj["message"]


def test_unknown_image(client, witness):
    # The daemon answers 404 not_found (the image does not exist); 400 would also be fair.
    with pytest.raises((tidepool.InvalidArgument, tidepool.NotFound)) as ei:
        client.create(image="no-such-image-" + uuid.uuid4().hex[:6])
    assert ei.value.status in (400, 404) and ei.value.message


@pytest.mark.parametrize("kwargs", [
    {"memory_mb": 8}, {"memory_mb": 0}, {"memory_mb": -1},
    {"cpus": 0.01}, {"cpus": 0}, {"pids": 1}, {"disk_mb": 0},
    {"ttl": 0}, {"ttl": -5}, {"tier": "no-such-tier"},
])
def test_limits_below_minimum(client, witness, kwargs):
    with pytest.raises(tidepool.InvalidArgument) as ei:
        client.create(**kwargs)
    assert ei.value.status == 400 and ei.value.code == "invalid_argument"


def test_malformed_json(daemon, witness):
    for body in (b"{not json", b"", b"[1,2,3]", b'{"memory_mb": "lots"}', b"\xff\xfe"):
        status, ctype, resp = http_raw(daemon.url, "POST", "/v1/sandboxes", body,
                                       {"Content-Type": "application/json"})
        _assert_json_error(status, ctype, resp, 400, "invalid_argument")
    status, ctype, resp = http_raw(daemon.url, "POST", f"/v1/sandboxes/{witness.id}/exec", b'{"cmd": ',
                                   {"Content-Type": "application/json"})
    _assert_json_error(status, ctype, resp, 400, "invalid_argument")
    status, ctype, resp = http_raw(daemon.url, "POST", f"/v1/sandboxes/{witness.id}/exec", b'{"cmd": 42}',
                                   {"Content-Type": "application/json"})
    _assert_json_error(status, ctype, resp, 400, "invalid_argument")


def test_unknown_route_and_id_are_json_404(daemon):
    status, ctype, resp = http_raw(daemon.url, "GET", "/v1/sandboxes/n0-000000000000")
    _assert_json_error(status, ctype, resp, 404, "not_found")
    status, ctype, resp = http_raw(daemon.url, "GET", "/v1/no-such-route")
    assert status == 404 and json.loads(resp)["code"] == "not_found"


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_exec_bad_timeout(witness, timeout):
    with pytest.raises(tidepool.InvalidArgument) as ei:
        witness.exec("true", timeout=timeout)
    assert ei.value.status == 400


def test_exec_empty_command(witness, daemon):
    status, ctype, resp = http_raw(daemon.url, "POST", f"/v1/sandboxes/{witness.id}/exec", b'{"cmd": []}',
                                   {"Content-Type": "application/json"})
    _assert_json_error(status, ctype, resp, 400, "invalid_argument")


def test_relative_and_dotdot_paths(witness):
    with open("/etc/shadow", "rb") as f:
        host_shadow = f.read()
    with pytest.raises(tidepool.InvalidArgument):
        witness.files.read("etc/passwd")
    for p in ("/../../etc/shadow", "/tmp/../../../../etc/shadow", "/../../../../../../etc/shadow"):
        try:
            data = witness.files.read(p)
        except (tidepool.NotFound, tidepool.InvalidArgument, tidepool.PermissionDenied):
            continue
        assert data != host_shadow


def test_symlinks_cannot_leave_the_sandbox(witness):
    with open("/etc/shadow", "rb") as f:
        host_shadow = f.read()
    marker = f"/tmp/tidepool-escape-{uuid.uuid4().hex}"
    host_dir = f"/tmp/tidepool-escape-dir-{uuid.uuid4().hex}"
    os.makedirs(host_dir)
    try:
        witness.exec(f"ln -s /etc/shadow /work-link-shadow; ln -s {marker} /work-link-out; "
                     f"ln -s {host_dir} /work-link-dir; ln -s /proc/1/root/etc/shadow /work-link-proc; "
                     f"ln -s ../../../../../../etc/shadow /work-link-rel", check=True)
        for link in ("/work-link-shadow", "/work-link-proc", "/work-link-rel"):
            try:
                data = witness.files.read(link)
            except (tidepool.NotFound, tidepool.InvalidArgument, tidepool.PermissionDenied):
                continue
            assert data != host_shadow, link
        for target in ("/work-link-out", "/work-link-dir/planted"):
            try:
                witness.files.write(target, b"escaped")
            except (tidepool.NotFound, tidepool.InvalidArgument, tidepool.PermissionDenied, tidepool.Conflict):
                pass
        assert not os.path.exists(marker)
        assert os.listdir(host_dir) == []
        try:
            entries = [e.name for e in witness.files.list("/work-link-dir")]
            assert entries == []
        except (tidepool.NotFound, tidepool.InvalidArgument, tidepool.PermissionDenied):
            pass
        try:
            witness.files.remove("/work-link-dir", recursive=True)
        except tidepool.TidepoolError:
            pass
        assert os.path.isdir(host_dir)
        for p in ("/../../../../etc/tidepool-escape", f"/../../../..{marker}"):
            try:
                witness.files.write(p, b"x")
            except (tidepool.InvalidArgument, tidepool.PermissionDenied, tidepool.NotFound):
                pass
        assert not os.path.exists("/etc/tidepool-escape") and not os.path.exists(marker)
    finally:
        if os.path.exists(marker):
            os.unlink(marker)
        if os.path.exists("/etc/tidepool-escape"):
            os.unlink("/etc/tidepool-escape")
        for fn in os.listdir(host_dir):
            os.unlink(os.path.join(host_dir, fn))
        os.rmdir(host_dir)


def test_upload_larger_than_disk(client, witness):
    with client.create(disk_mb=8, ttl=600) as sb:
        with pytest.raises((tidepool.PayloadTooLarge, tidepool.InsufficientStorage)) as ei:
            sb.files.write("/work/too-big.bin", os.urandom(16 * 1024 * 1024))
        assert ei.value.status in (413, 507)
        # Each upload below the limit passes the size check, but together they do not fit.
        sb.files.write("/work/half.bin", os.urandom(5 * 1024 * 1024))
        with pytest.raises((tidepool.InsufficientStorage, tidepool.PayloadTooLarge)) as ei:
            sb.files.write("/work/other-half.bin", os.urandom(5 * 1024 * 1024))
        assert ei.value.status in (413, 507)
        # Commands hit the same limit (ENOSPC), not the host's disk.
        r = sb.exec("head -c 20000000 /dev/zero > /work/fill.bin")
        assert r.exit_code != 0
        sb.exec("rm -f /work/fill.bin /work/other-half.bin", check=True)
        # The sandbox is still usable, and a small file fits.
        sb.files.write("/work/small.bin", b"x" * 1024)
        assert sb.files.read("/work/small.bin") == b"x" * 1024
        assert sb.exec("echo ok").stdout == "ok\n"


def test_missing_path_query(daemon, witness):
    status, ctype, resp = http_raw(daemon.url, "GET", f"/v1/sandboxes/{witness.id}/files")
    _assert_json_error(status, ctype, resp, 400, "invalid_argument")


@pytest.mark.parametrize("method,route,param", [
    ("GET", "/v1/sandboxes?all=maybe", "all"),
    ("GET", "/v1/jobs?all=maybe", "all"),
    ("DELETE", "/v1/sandboxes/{id}/files?path=/state.txt&recursive=maybe", "recursive"),
    ("POST", "/v1/sandboxes/{id}/files/mkdir?path=/d&parents=maybe", "parents"),
    ("POST", "/v1/sandboxes/{id}/processes/1/stdin?eof=maybe", "eof"),
    ("DELETE", "/v1/sandboxes/{id}?wait=maybe", "wait"),
])
def test_a_boolean_query_parameter_that_is_neither_true_nor_false(daemon, witness, method, route, param):
    """Every boolean query parameter reads true/1/yes and false/0/no; anything else is a
    400 naming it, and nothing is done (the witness's file and the sandbox stay)."""
    status, ctype, resp = http_raw(daemon.url, method, route.format(id=witness.id))
    _assert_json_error(status, ctype, resp, 400, "invalid_argument")
    assert param in json.loads(resp)["message"], resp
    assert not witness.files.exists("/d")
