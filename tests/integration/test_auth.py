"""Authentication and host-path safety: API keys on TCP, peer credentials on the unix
socket, and host paths read with the caller's own rights (or under --import-root).

The daemon of this module requires keys on TCP (no --insecure-tcp) and has one import
root. "Another uid" cases run a small client as uid nobody (65534) in a subprocess.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile

import pytest

from tp_testlib import BUILD, Daemon, http_raw, keys_cmd, new_key

import tidepool  # noqa: E402

NOBODY = 65534

# A client run as another uid: one HTTP request over the unix socket, the answer as JSON.
_UNIX_CLIENT = r"""
import http.client, json, socket, sys
path, method, target, body = sys.argv[1:5]
class C(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
c = C("localhost", timeout=120)
try:
    c.request(method, target, body=body.encode() if body else None,
              headers={"Content-Type": "application/json"} if body else {})
    r = c.getresponse()
    print(json.dumps({"status": r.status, "body": r.read().decode()}))
except OSError as e:
    print(json.dumps({"status": 0, "body": str(e)}))
"""


def _drop_to(uid: int, gid: int):
    def fn():
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    return fn


def unix_request(sock: str, method: str, target: str, body=None, uid: int = NOBODY, gid: int = NOBODY):
    """(status, parsed JSON body or text) of one request over the socket as uid:gid."""
    out = subprocess.run(
        ["/usr/bin/python3", "-c", _UNIX_CLIENT, sock, method, target, json.dumps(body) if body is not None else ""],
        preexec_fn=_drop_to(uid, gid), capture_output=True, text=True, timeout=180, cwd="/")
    assert out.returncode == 0, out.stderr
    ans = json.loads(out.stdout)
    try:
        return ans["status"], json.loads(ans["body"])
    except ValueError:
        return ans["status"], ans["body"]


def tcp(d: Daemon, method: str, path: str, body=None, key=None, header="Authorization"):
    headers = {}
    if key is not None:
        headers[header] = f"Bearer {key}" if header == "Authorization" else key
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    status, _, raw = http_raw(d.url, method, path, body=data, headers=headers, timeout=120)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


@pytest.fixture(scope="module")
def daemon():
    """Overrides the session daemon for this module (the leak check then watches this one)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    d = Daemon(BUILD, insecure_tcp=False)
    d.import_root = os.path.join(d.tmp, "imports")
    os.makedirs(d.import_root)
    d.extra_args = ["--import-root", d.import_root]
    d.start()
    # Let uid nobody reach the socket (as membership of group tidepool would).
    os.chown(d.socket, 0, NOBODY)
    yield d
    rc = d.stop()
    d.cleanup()
    assert rc in (0, -signal.SIGTERM), d.log_tail()


@pytest.fixture(scope="module")
def admin_key(daemon):
    return new_key(daemon, "admin")


@pytest.fixture(scope="module")
def user_key(daemon):
    return new_key(daemon, "user")


@pytest.fixture
def host_dir():
    """A directory tree readable by root only: 0700 dir holding a 0600 file."""
    top = tempfile.mkdtemp(prefix="tp-auth-src-")
    os.chmod(top, 0o755)
    d = os.path.join(top, "private")
    os.mkdir(d, 0o700)
    with open(os.path.join(d, "key"), "w") as f:
        f.write("root-only secret\n")
    os.chmod(os.path.join(d, "key"), 0o600)
    yield d
    subprocess.run(["rm", "-rf", top], check=True)


def image_exists(d: Daemon, key: str, name: str) -> bool:
    status, _ = tcp(d, "GET", f"/v1/images/{name}", key=key)
    assert status in (200, 404)
    return status == 200


# -- TCP and keys -------------------------------------------------------------------


def test_tcp_without_a_key_is_401_except_health_and_version(daemon):
    status, body = tcp(daemon, "GET", "/v1/sandboxes")
    assert status == 401, body
    assert body["code"] == "unauthenticated"
    assert "API key" in body["message"]
    status, body = tcp(daemon, "GET", "/v1/sandboxes", key="tpk_k0000000000_" + "0" * 64)
    assert status == 401 and body["code"] == "unauthenticated", body
    assert tcp(daemon, "GET", "/health")[0] == 200
    assert tcp(daemon, "GET", "/version")[0] == 200


def test_keys_scopes_and_revocation(daemon, admin_key, user_key):
    assert tcp(daemon, "GET", "/v1/sandboxes", key=admin_key)[0] == 200
    assert tcp(daemon, "GET", "/v1/images", key=user_key)[0] == 200
    assert tcp(daemon, "GET", "/v1/images", key=user_key, header="X-API-Key")[0] == 200
    status, who = tcp(daemon, "GET", "/v1/whoami", key=user_key)
    assert status == 200 and who["transport"] == "tcp" and who["scope"] == "user", who
    assert who["host_paths"] == "refused"

    # Naming a host path needs an admin key: a user key gets 403, even inside the root.
    status, body = tcp(daemon, "POST", "/v1/images", {"name": "userdir", "parts": [], "dir": daemon.import_root},
                       key=user_key)
    assert status == 403 and body["code"] == "permission_denied", body
    assert "admin" in body["message"]
    assert not image_exists(daemon, admin_key, "userdir")

    # Created and revoked while the daemon runs: it reads the key file again.
    temp = new_key(daemon, "user", "temp")
    assert tcp(daemon, "GET", "/v1/images", key=temp)[0] == 200
    key_id = temp.split("_")[1]
    listed = keys_cmd(daemon, "list")
    assert listed.returncode == 0 and key_id in listed.stdout and temp not in listed.stdout
    r = keys_cmd(daemon, "revoke", key_id)
    assert r.returncode == 0, r.stderr
    status, body = tcp(daemon, "GET", "/v1/images", key=temp)
    assert status == 401 and body["code"] == "unauthenticated", body
    assert keys_cmd(daemon, "revoke", key_id).returncode != 0

    st = os.stat(os.path.join(daemon.data_dir, "api_keys.json"))
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == 0


def test_admin_key_reads_host_paths_under_import_roots_only(daemon, admin_key, host_dir):
    # Outside every import root: refused, even for root-readable paths.
    status, body = tcp(daemon, "POST", "/v1/images", {"name": "outside", "parts": [], "dir": host_dir},
                       key=admin_key)
    assert status == 403 and body["code"] == "permission_denied", body
    assert not image_exists(daemon, admin_key, "outside")
    # A symlink inside the root that leads out of it does not help.
    link = os.path.join(daemon.import_root, "escape")
    os.symlink(host_dir, link)
    try:
        status, body = tcp(daemon, "POST", "/v1/images", {"name": "escape", "parts": [], "dir": link},
                           key=admin_key)
        assert status == 403, body
    finally:
        os.unlink(link)
    # Inside: accepted.
    inside = os.path.join(daemon.import_root, "tree")
    os.makedirs(inside, exist_ok=True)
    with open(os.path.join(inside, "hello"), "w") as f:
        f.write("hi\n")
    status, body = tcp(daemon, "POST", "/v1/images", {"name": "inside", "parts": [], "dir": inside},
                       key=admin_key)
    assert status == 201, body
    assert body["layers"], body
    assert tcp(daemon, "DELETE", "/v1/images/inside", key=admin_key)[0] == 200


# -- the unix socket ------------------------------------------------------------------


def test_unix_socket_is_0660_and_knows_the_peer(daemon):
    st = os.stat(daemon.socket)
    assert st.st_mode & 0o777 == 0o660
    assert st.st_uid == 0
    status, who = unix_request(daemon.socket, "GET", "/v1/whoami")
    assert status == 200, who
    assert who["transport"] == "unix" and who["uid"] == NOBODY and who["gid"] == NOBODY, who
    assert who["key_id"] is None and who["host_paths"] == "as_caller"
    # Another uid outside the socket's group cannot connect at all.
    status, err = unix_request(daemon.socket, "GET", "/v1/whoami", uid=12345, gid=12345)
    assert status == 0 and "Permission denied" in err, err
    # Root over the socket: no key needed.
    status, who = unix_request(daemon.socket, "GET", "/v1/whoami", uid=0, gid=0)
    assert status == 200 and who["uid"] == 0, who


def test_a_root_only_directory_is_refused_to_another_uid(daemon, admin_key, host_dir):
    status, body = unix_request(daemon.socket, "POST", "/v1/images",
                                {"name": "grab", "parts": [], "dir": host_dir})
    assert status == 403, body
    assert body["code"] == "permission_denied" and host_dir in body["message"], body
    assert not image_exists(daemon, admin_key, "grab")

    # A readable directory holding one unreadable file is refused as well.
    os.chmod(host_dir, 0o755)
    status, body = unix_request(daemon.socket, "POST", "/v1/images",
                                {"name": "grab", "parts": [], "dir": host_dir})
    assert status == 403, body
    assert not image_exists(daemon, admin_key, "grab")

    # What nobody can read, nobody can import: the same tree made readable works.
    os.chmod(os.path.join(host_dir, "key"), 0o644)
    status, body = unix_request(daemon.socket, "POST", "/v1/images",
                                {"name": "grab", "parts": [], "dir": host_dir})
    assert status == 201, body
    assert body["source"].startswith("dir:") and body["layers"], body
    # Its content is the tree's: a sandbox of it sees the file.
    with tidepool.Client(daemon.url, api_key=admin_key) as c:
        with c.create(image="grab", ttl=120) as sb:
            daemon.created.add(sb.id)
            assert sb.files.read("/key") == b"root-only secret\n"
    assert tcp(daemon, "DELETE", "/v1/images/grab", key=admin_key)[0] == 200


def test_keys_are_not_needed_and_not_used_on_the_socket(daemon):
    status, body = unix_request(daemon.socket, "GET", "/v1/images")
    assert status == 200, body


# -- clients ----------------------------------------------------------------------------


def test_cli_uses_the_socket_or_a_key(daemon, admin_key):
    cli = str(BUILD / "bin" / "tidepool")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEPOOL_")}
    r = subprocess.run([cli, "ls"], env={**env, "TIDEPOOL_SOCKET": daemon.socket},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "--url", f"unix:{daemon.socket}", "image", "ls"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # TCP forced by --url: without a key a clear error, with one it works.
    r = subprocess.run([cli, "--url", daemon.url, "ls"], env={**env, "TIDEPOOL_SOCKET": daemon.socket},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "unauthenticated" in r.stderr and "API key" in r.stderr, r.stderr
    r = subprocess.run([cli, "--url", daemon.url, "--api-key", admin_key, "ls"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([cli, "ls"], env={**env, "TIDEPOOL_URL": daemon.url, "TIDEPOOL_API_KEY": admin_key},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_sdk_uses_the_socket_or_a_key(daemon, admin_key, monkeypatch):
    monkeypatch.delenv("TIDEPOOL_URL", raising=False)
    monkeypatch.delenv("TIDEPOOL_API_KEY", raising=False)
    monkeypatch.setenv("TIDEPOOL_SOCKET", daemon.socket)
    with tidepool.Client() as c:
        assert c.url == f"unix:{daemon.socket}"
        assert isinstance(c.list(), list)
    with tidepool.Client(daemon.url) as c:
        with pytest.raises(tidepool.Unauthenticated):
            c.list()
    with tidepool.Client(daemon.url, api_key=admin_key) as c:
        assert isinstance(c.list(), list)

    async def main():
        async with tidepool.AsyncClient() as ac:
            assert ac.url == f"unix:{daemon.socket}"
            return await ac.list()
    assert isinstance(asyncio.run(main()), list)


def test_insecure_tcp_is_for_loopback_only(tmp_path):
    r = subprocess.run([str(BUILD / "bin" / "tidepoold"), "--listen", "0.0.0.0:0", "--insecure-tcp",
                        "--socket", "", "--data-dir", str(tmp_path / "data")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "loopback" in r.stderr, r.stderr
