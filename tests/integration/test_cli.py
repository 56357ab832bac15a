"""The `tidepool` CLI (build/bin/tidepool), end to end.

Two daemons:
- `daemon` (conftest.py): the real tidepoold. The issue's user flow runs against it.
- `fake`: a small in-test HTTP server speaking the same contract (api/openapi.yaml),
  running commands as host processes. It records every request, so the tests can check
  what the CLI sent (create fields, cleanup after Ctrl-C) and exercise edge cases
  independently of the real daemon.

While developing without a daemon: pytest --noconftest tests/integration/test_cli.py -k fake
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import selectors
import signal
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional

import pytest

from tp_testlib import free_port, wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("TIDEPOOL_BUILD") or REPO / "build").resolve()
CLI = str(BUILD / "bin" / "tidepool")

ERROR_LINE = re.compile(r"^tidepool: [^\n]+\n$")


def cli(url: str, *args: str, input: Optional[bytes] = None, timeout: float = 60,
        check: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["TIDEPOOL_URL"] = url
    p = subprocess.run([CLI, *args], input=input, capture_output=True, env=env, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"tidepool {' '.join(args)} -> {p.returncode}: {p.stderr!r}")
    return p


def assert_one_error_line(p: subprocess.CompletedProcess, contains: str = "", rc: int = 1):
    err = p.stderr.decode()
    assert p.returncode == rc, (p.returncode, err)
    assert ERROR_LINE.match(err), f"expected exactly one 'tidepool: ...' line, got {err!r}"
    assert contains in err, err


# -- a fake tidepoold ----------------------------------------------------------------


class FakeSandbox:
    def __init__(self, sid: str, spec: dict) -> None:
        self.id = sid
        self.spec = spec
        self.root = tempfile.mkdtemp(prefix="tp-cli-fake-")
        self.state = "running"
        self.created = time.time()
        self.procs: List[subprocess.Popen] = []

    def to_json(self) -> dict:
        ttl = self.spec.get("ttl_seconds", 3600)
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        out = {
            "id": self.id, "state": self.state, "tier": "container",
            "image": self.spec.get("image", "host"), "node": "fake",
            "memory_mb": self.spec.get("memory_mb", 512), "cpus": self.spec.get("cpus", 1),
            "pids": self.spec.get("pids", 512), "disk_mb": self.spec.get("disk_mb", 1024),
            "ttl_seconds": ttl, "idle_timeout_seconds": self.spec.get("idle_timeout_seconds", 0),
            "labels": self.spec.get("labels", {}), "env": self.spec.get("env", {}),
            "created_at": time.strftime(fmt, time.gmtime(self.created)),
            "expires_at": time.strftime(fmt, time.gmtime(self.created + ttl)),
        }
        if self.state == "stopped":
            out["end_reason"] = "deleted"
        return out

    def host_path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def destroy(self) -> None:
        self.state = "stopped"
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        subprocess.run(["rm", "-rf", self.root], check=False)


class FakeDaemon:
    def __init__(self) -> None:
        self.sandboxes: Dict[str, FakeSandbox] = {}
        self.requests: List[tuple] = []   # (method, path, query dict, json body or None)
        self.exec_started = threading.Event()
        # An exec with "remove": true: the sandbox is removed after the exit event and a
        # "removed" event says so (the real daemon's contract). False: the request is
        # served as if the field were unknown to this daemon (no such event). A dict:
        # the "removed" event says the removal failed with this error.
        self.honor_remove: object = True
        self.fail_delete = False  # DELETE of a sandbox answers 500
        self.lock = threading.Lock()
        self.counter = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def live(self) -> List[str]:
        with self.lock:
            return [s.id for s in self.sandboxes.values() if s.state == "running"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        for s in list(self.sandboxes.values()):
            s.destroy()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, obj) -> None:
                self._send(status, json.dumps(obj).encode())

            def _error(self, status: int, code: str, message: str) -> None:
                self._json(status, {"code": code, "message": message})

            def _route(self, method: str) -> None:
                u = urllib.parse.urlsplit(self.path)
                q = urllib.parse.parse_qs(u.query)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = None
                if self.headers.get("Content-Type", "").startswith("application/json"):
                    try:
                        body = json.loads(raw)
                    except ValueError:
                        return self._error(400, "invalid_argument", "malformed JSON")
                fake.requests.append((method, u.path, q, body))
                parts = [p for p in u.path.split("/") if p]
                if u.path == "/version" and method == "GET":
                    return self._json(200, {"version": "9.9.9-fake", "api": "v1", "tiers": ["container"]})
                if parts[:2] != ["v1", "sandboxes"]:
                    return self._error(404, "not_found", f"no route {u.path}")
                if len(parts) == 2 and method == "POST":
                    if body.get("memory_mb", 512) < 16:
                        return self._error(400, "invalid_argument", "memory_mb must be at least 16")
                    with fake.lock:
                        fake.counter += 1
                        sid = f"fake-{fake.counter:06x}"
                        fake.sandboxes[sid] = FakeSandbox(sid, body)
                    return self._json(201, fake.sandboxes[sid].to_json())
                if len(parts) == 2 and method == "GET":
                    out = []
                    for s in fake.sandboxes.values():
                        if s.state != "running" and q.get("all") != ["true"]:
                            continue
                        labels = s.spec.get("labels", {})
                        if all(labels.get(k) == v for k, _, v in (x.partition("=") for x in q.get("label", []))):
                            out.append(s.to_json())
                    return self._json(200, {"sandboxes": out})
                sb = fake.sandboxes.get(parts[2]) if len(parts) >= 3 else None
                if sb is None or (sb.state != "running" and method != "GET"):
                    return self._error(404, "not_found", f"sandbox {parts[2] if len(parts) > 2 else ''} not found")
                if len(parts) == 3 and method == "GET":
                    return self._json(200, sb.to_json())
                if len(parts) == 3 and method == "DELETE":
                    if fake.fail_delete:
                        return self._error(500, "internal", "delete refused")
                    sb.destroy()
                    return self._json(200, sb.to_json())
                if parts[3:] == ["exec"] and method == "POST":
                    return self._exec(sb, body)
                if parts[3:] == ["files"]:
                    path = q.get("path", [""])[0]
                    if not path.startswith("/"):
                        return self._error(400, "invalid_argument", "path must be absolute")
                    hp = sb.host_path(path)
                    if method == "PUT":
                        os.makedirs(os.path.dirname(hp), exist_ok=True)
                        with open(hp, "wb") as f:
                            f.write(raw)
                        os.chmod(hp, int(q.get("mode", ["644"])[0], 8))
                        return self._json(200, {"name": os.path.basename(hp), "path": path, "type": "file",
                                                "size": len(raw)})
                    if method == "GET":
                        try:
                            with open(hp, "rb") as f:
                                data = f.read()
                        except FileNotFoundError:
                            return self._error(404, "not_found", f"{path}: no such file")
                        return self._send(200, data, "application/octet-stream")
                return self._error(404, "not_found", f"no route {method} {u.path}")

            def _chunk(self, obj: dict) -> None:
                data = (json.dumps(obj) + "\n").encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _exec(self, sb: FakeSandbox, req: dict) -> None:
                cmd = req.get("cmd")
                if isinstance(cmd, str):
                    cmd = ["/bin/sh", "-c", cmd]
                if "timeout" in req and req["timeout"] <= 0:
                    return self._error(400, "invalid_argument", "timeout must be > 0")
                env = dict(os.environ)
                env.update(sb.spec.get("env", {}))
                env.update(req.get("env", {}))
                stdin = base64.b64decode(req.get("stdin", ""))
                try:
                    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=env,
                                         cwd=sb.host_path(req.get("cwd", "/")), start_new_session=True)
                except OSError as e:
                    return self._error(400, "invalid_argument", f"cannot run {cmd[0]}: {e.strerror}")
                sb.procs.append(p)
                p.stdin.write(stdin)
                p.stdin.close()
                if not req.get("stream"):
                    out, err = p.communicate(timeout=req.get("timeout"))
                    return self._json(200, {"exit_code": p.returncode, "stdout": base64.b64encode(out).decode(),
                                            "stderr": base64.b64encode(err).decode()})
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._chunk({"type": "started", "pid": p.pid})
                fake.exec_started.set()
                sel = selectors.DefaultSelector()
                sel.register(p.stdout, selectors.EVENT_READ, "stdout")
                sel.register(p.stderr, selectors.EVENT_READ, "stderr")
                deadline = time.monotonic() + req["timeout"] if "timeout" in req else None
                timed_out = False
                try:
                    while sel.get_map():
                        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                        events = sel.select(wait)
                        if not events and deadline is not None and time.monotonic() >= deadline:
                            timed_out = True
                            os.killpg(p.pid, signal.SIGKILL)
                            deadline = None
                            continue
                        for key, _ in events:
                            data = os.read(key.fileobj.fileno(), 65536)
                            if not data:
                                sel.unregister(key.fileobj)
                                continue
                            self._chunk({"type": key.data, "data": base64.b64encode(data).decode()})
                    p.wait()
                    rc = p.returncode
                    end = {"type": "exit", "exit_code": rc if rc >= 0 else -1, "timed_out": timed_out}
                    if rc < 0:
                        end["signal"] = -rc
                    self._chunk(end)
                    if req.get("remove") and fake.honor_remove:
                        if isinstance(fake.honor_remove, dict):
                            self._chunk({"type": "removed", **fake.honor_remove})
                        else:
                            sb.destroy()
                            self._chunk({"type": "removed", "sandbox": sb.to_json()})
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    # The client went away: end the command, as a daemon should.
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                    self.close_connection = True
                finally:
                    p.stdout.close()
                    p.stderr.close()

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_PUT(self):
                self._route("PUT")

            def do_DELETE(self):
                self._route("DELETE")

        return Handler


@pytest.fixture
def fake():
    f = FakeDaemon()
    yield f
    f.close()


# -- the user flow of the issue, against both daemons ----------------------------------


def user_flow(url: str, tmp_path: pathlib.Path, track=None) -> None:
    p = cli(url, "run", "--image", "host", "--", "sh", "-c", "echo hello; exit 3")
    assert p.returncode == 3, p.stderr
    assert p.stdout == b"hello\n"

    p = cli(url, "create", "--image", "host", "--memory", "512M", "--cpus", "1", "--ttl", "10m",
            check=True)
    sid = p.stdout.decode().strip()
    assert p.stdout.decode() == sid + "\n" and sid and " " not in sid
    if track is not None:
        track(sid)

    p = cli(url, "exec", sid, "--", "python3", "-c", "print(6*7)")
    assert (p.returncode, p.stdout) == (0, b"42\n"), p.stderr

    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"tide notes\n\x00\xff binary too\n")
    cli(url, "cp", str(notes), f"{sid}:/tmp/notes.txt", check=True)
    p = cli(url, "cp", f"{sid}:/tmp/notes.txt", "-", check=True)
    assert p.stdout == notes.read_bytes()

    p = cli(url, "ls", check=True)
    lines = p.stdout.decode().splitlines()
    assert lines[0].split()[:5] == ["ID", "STATE", "IMAGE", "CPUS", "MEMORY"]
    row = [ln for ln in lines if ln.startswith(sid + " ")]
    assert row, p.stdout
    assert row[0].split()[1:5] == ["running", "host", "1", "512M"]

    p = cli(url, "rm", sid, check=True)
    assert p.stdout.decode() == sid + "\n"

    p = cli(url, "exec", sid, "--", "true")
    assert_one_error_line(p)
    assert p.stdout == b""


def test_fake_user_flow(fake, tmp_path):
    user_flow(fake.url, tmp_path)
    creates = [r[3] for r in fake.requests if r[0] == "POST" and r[1] == "/v1/sandboxes"]
    # run sent only what was asked; create converted units for the API.
    assert creates[0] == {"image": "host"}
    assert creates[1] == {"image": "host", "memory_mb": 512, "cpus": 1.0, "ttl_seconds": 600}
    # run removed its sandbox.
    assert fake.live() == []
    err = cli(fake.url, "exec", "fake-000002", "--", "true").stderr.decode()
    assert err == "tidepool: not_found: sandbox fake-000002 not found\n"


def test_real_user_flow(daemon, track, tmp_path):
    before = set(live_ids(daemon.url))
    user_flow(daemon.url, tmp_path, track)
    # `run`'s sandbox (whose id the CLI does not print) is gone too.
    assert set(live_ids(daemon.url)) <= before


def live_ids(url: str) -> List[str]:
    p = cli(url, "ls", "--json", check=True)
    return [s["id"] for s in json.loads(p.stdout)]


# -- exit codes, streams, interruption ---------------------------------------------------


def exit_code_cases(url: str) -> None:
    p = cli(url, "run", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (p.returncode, p.stdout, p.stderr) == (7, b"out\n", b"err\n")
    p = cli(url, "run", "--", "sh", "-c", "kill -9 $$")
    assert p.returncode == 128 + 9, p.stderr
    p = cli(url, "run", "--timeout", "1s", "--", "sh", "-c", "sleep 30")
    assert p.returncode == 124, p.stderr
    assert b"timed out" in p.stderr
    p = cli(url, "run", "--env", "GREETING=hi there", "--", "sh", "-c", 'printf "%s" "$GREETING"')
    assert (p.returncode, p.stdout) == (0, b"hi there"), p.stderr
    p = cli(url, "run", "-i", "--", "cat", input=b"from stdin\x00\x01")
    assert (p.returncode, p.stdout) == (0, b"from stdin\x00\x01"), p.stderr


def test_fake_exit_codes_and_streams(fake):
    exit_code_cases(fake.url)
    assert fake.live() == []


def test_real_exit_codes_and_streams(daemon):
    before = set(live_ids(daemon.url))
    exit_code_cases(daemon.url)
    # run answers once a sandbox's stop is stored (DELETE ?wait=false); the teardown follows.
    wait_until(lambda: set(live_ids(daemon.url)) <= before, timeout=30, what="run's sandboxes to end")


def output_streams_live(url: str) -> None:
    """The first line is printed while the command is still running."""
    env = dict(os.environ, TIDEPOOL_URL=url)
    proc = subprocess.Popen([CLI, "run", "--", "sh", "-c", "echo first; sleep 20; echo second"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"first\n"
        assert proc.poll() is None   # still running: the output was not held back
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert out == b"" and err == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fake_streams_live_and_ctrl_c_removes_sandbox(fake):
    output_streams_live(fake.url)
    assert fake.live() == []
    assert [r for r in fake.requests if r[0] == "DELETE"], "run did not remove its sandbox"


def test_real_streams_live_and_ctrl_c_removes_sandbox(daemon):
    before = set(live_ids(daemon.url))
    output_streams_live(daemon.url)
    wait_until(lambda: set(live_ids(daemon.url)) <= before, timeout=30, what="run's sandbox to end")


def test_fake_run_asks_the_daemon_to_remove_its_sandbox(fake):
    """`run` asks for the removal with its exec; the daemon's "removed" event ends it, and
    no DELETE follows. A daemon that did not say it removed the sandbox, or says that the
    removal failed, gets a DELETE; a DELETE that fails too is a one-line error and exit 1."""
    p = cli(fake.url, "run", "--", "sh", "-c", "echo hi")
    assert (p.returncode, p.stdout, p.stderr) == (0, b"hi\n", b"")
    execs = [r for r in fake.requests if r[0] == "POST" and r[1].endswith("/exec")]
    assert execs and execs[-1][3].get("remove") is True and execs[-1][3].get("stream") is True
    assert not [r for r in fake.requests if r[0] == "DELETE"] and fake.live() == []

    fake.honor_remove = False
    p = cli(fake.url, "run", "--", "sh", "-c", "exit 4")
    assert p.returncode == 4, p.stderr
    assert len([r for r in fake.requests if r[0] == "DELETE"]) == 1 and fake.live() == []

    fake.honor_remove = {"code": "internal", "message": "umount failed"}
    p = cli(fake.url, "run", "--", "true")
    assert (p.returncode, p.stderr) == (0, b"")
    assert len([r for r in fake.requests if r[0] == "DELETE"]) == 2 and fake.live() == []
    fake.fail_delete = True
    p = cli(fake.url, "run", "--", "true")
    assert_one_error_line(p, "could not remove sandbox")
    assert "delete refused" in p.stderr.decode()
    fake.fail_delete = False


def test_fake_sigterm_during_run_removes_sandbox(fake):
    env = dict(os.environ, TIDEPOOL_URL=fake.url)
    proc = subprocess.Popen([CLI, "run", "--", "sleep", "30"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        assert fake.exec_started.wait(20)
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM
        assert fake.live() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- files --------------------------------------------------------------------------------


def test_fake_cp_binary_round_trip(fake, tmp_path):
    sid = cli(fake.url, "create", check=True).stdout.decode().strip()
    data = bytes(range(256)) * 4096 + os.urandom(300_000)   # ~1.3 MB, every byte value
    src = tmp_path / "blob.bin"
    src.write_bytes(data)
    src.chmod(0o751)
    cli(fake.url, "cp", str(src), f"{sid}:/data/", check=True)   # into a directory: keeps the name
    assert ("PUT", f"/v1/sandboxes/{sid}/files") in [(r[0], r[1]) for r in fake.requests]
    put = [r for r in fake.requests if r[0] == "PUT"][-1]
    assert put[2] == {"path": ["/data/blob.bin"], "mode": ["751"]}
    p = cli(fake.url, "cp", f"{sid}:/data/blob.bin", "-", check=True)
    assert p.stdout == data
    dst = tmp_path / "back.bin"
    cli(fake.url, "cp", f"{sid}:/data/blob.bin", str(dst), check=True)
    assert dst.read_bytes() == data
    outdir = tmp_path / "dir"
    outdir.mkdir()
    cli(fake.url, "cp", f"{sid}:/data/blob.bin", str(outdir), check=True)
    assert (outdir / "blob.bin").read_bytes() == data
    # stdin as the source
    cli(fake.url, "cp", "-", f"{sid}:/x", input=b"\x00abc", check=True)
    assert cli(fake.url, "cp", f"{sid}:/x", "-", check=True).stdout == b"\x00abc"
    # a missing remote file: one error line, no partial local file left behind
    p = cli(fake.url, "cp", f"{sid}:/nope", str(tmp_path / "nope"))
    assert_one_error_line(p, "not_found")
    assert sorted(os.listdir(tmp_path)) == ["back.bin", "blob.bin", "dir"]


def test_real_cp_download_of_planted_links_writes_one_plain_file(daemon, track, tmp_path):
    """cp unpacks no archive: a download is the bytes of one sandbox file, resolved inside
    the sandbox, written to a temporary file beside the named target and renamed. Sandbox
    code plants links aimed at host files (absolute, relative, through an s/t -> . chain,
    dangling at a host-only file) and a set-uid file; each copy must be one plain 0644
    file holding the sandbox's own bytes, and the host files keep theirs."""
    secret = b"the trainer's precious file\n"
    victim = tmp_path / "victim" / "target.txt"
    host_only = tmp_path / "victim" / "host-only.txt"
    victim.parent.mkdir()
    victim.write_bytes(secret)
    host_only.write_bytes(secret)
    sid = cli(daemon.url, "create", "--image", "host", "--ttl", "10m", check=True).stdout.decode().strip()
    track(sid)
    up = "../" * 12
    plant = (f"set -e; mkdir -p {victim.parent} /work/s; echo sandbox-own > {victim}; "
             f"ln -s {victim} /work/abs; ln -s {up}{str(victim)[1:]} /work/rel; ln -s . /work/s/t; "
             f"ln -s t/t/t/{up}{str(victim)[1:]} /work/s/chain; ln -s {host_only} /work/dangle; "
             "echo x > /work/suid; chmod 4755 /work/suid; echo ok")
    p = cli(daemon.url, "exec", sid, "--", "sh", "-c", plant)
    assert p.stdout == b"ok\n", p.stderr
    dl = tmp_path / "dl"
    dl.mkdir()
    for remote in ("/work/abs", "/work/rel", "/work/s/chain"):
        cli(daemon.url, "cp", f"{sid}:{remote}", str(dl), check=True)
    cli(daemon.url, "cp", f"{sid}:/work/suid", str(dl / "suid"), check=True)
    assert_one_error_line(cli(daemon.url, "cp", f"{sid}:/work/dangle", str(dl)), "not_found")
    assert sorted(os.listdir(dl)) == ["abs", "chain", "rel", "suid"]
    for name in ("abs", "rel", "chain"):
        st = os.lstat(dl / name)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644, name
        assert (dl / name).read_bytes() == b"sandbox-own\n", name
    assert stat.S_IMODE(os.stat(dl / "suid").st_mode) == 0o644
    assert victim.read_bytes() == secret and host_only.read_bytes() == secret
    assert sorted(os.listdir(victim.parent)) == ["host-only.txt", "target.txt"]
    cli(daemon.url, "rm", sid, check=True)


def test_fake_cp_usage_errors(fake, tmp_path):
    assert_one_error_line(cli(fake.url, "cp", "a", "b"), "ID:/path", rc=2)
    assert_one_error_line(cli(fake.url, "cp", "x:/a", "y:/b"), "two sandboxes", rc=2)
    assert_one_error_line(cli(fake.url, "cp", "a", "x:rel"), "absolute", rc=2)
    assert_one_error_line(cli(fake.url, "cp", str(tmp_path / "missing"), "x:/a"), "No such file")


# -- ls, rm, version ---------------------------------------------------------------------


def test_fake_ls_labels_and_json(fake):
    a = cli(fake.url, "create", "--label", "team=rl", "--label", "run=7", check=True).stdout.decode().strip()
    b = cli(fake.url, "create", "--label", "team=eval", check=True).stdout.decode().strip()
    p = cli(fake.url, "ls", "--label", "team=rl", check=True)
    out = p.stdout.decode()
    assert a in out and b not in out
    assert "run=7,team=rl" in out
    gets = [r for r in fake.requests if r[0] == "GET" and r[1] == "/v1/sandboxes"]
    assert gets[-1][2] == {"label": ["team=rl"]}
    js = json.loads(cli(fake.url, "ls", "--json", check=True).stdout)
    assert sorted(s["id"] for s in js) == sorted([a, b])
    cli(fake.url, "rm", a, check=True)
    assert a not in cli(fake.url, "ls", check=True).stdout.decode()
    assert a in cli(fake.url, "ls", "--all", check=True).stdout.decode()


def test_fake_rm_reports_each(fake):
    a = cli(fake.url, "create", check=True).stdout.decode().strip()
    p = cli(fake.url, "rm", a, "fake-nothere")
    assert p.stdout.decode() == a + "\n"
    assert_one_error_line(p, "not_found: sandbox fake-nothere not found")


def test_fake_version(fake):
    p = cli(fake.url, "version", check=True)
    lines = p.stdout.decode().splitlines()
    assert lines[0].startswith("tidepool ")
    assert lines[1].startswith("tidepoold 9.9.9-fake")


COMMANDS = ("create", "run", "exec", "cp", "ls", "rm", "version", "image", "log", "replay", "fn",
            "templates", "pools", "jobs", "pause", "resume", "top")


def test_help_lists_every_command_and_each_command_has_its_own():
    """Only the command named on the line is built (a faster start); the top-level help,
    and a line whose first word is a root option's value, still see every command."""
    top = cli("http://127.0.0.1:1", "--help")
    assert top.returncode == 0
    listed = set(re.findall(r"^  (\w+)\s", top.stdout.decode(), re.M))
    assert set(COMMANDS) <= listed, set(COMMANDS) - listed
    for c in COMMANDS:
        h = cli("http://127.0.0.1:1", c, "--help")
        assert h.returncode == 0 and f"tidepool {c}" in h.stdout.decode(), (c, h.stdout[:200])
    # "--url run": run is the URL here, not the command; ls is the command (and finds
    # no daemon there).
    p = cli("http://127.0.0.1:1", "--url", "run", "ls")
    assert_one_error_line(p, "cannot reach tidepoold at http://run", rc=1)
    assert_one_error_line(cli("http://127.0.0.1:1", "--api-key", "ls", "frobnicate"), rc=2)


def test_fake_url_flag_overrides_environment(fake):
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert cli(nowhere, "--url", fake.url, "ls").returncode == 0
    assert cli(nowhere, "--url=" + fake.url, "ls").returncode == 0
    assert cli(nowhere, "ls", "--url", fake.url).returncode == 0
    assert_one_error_line(cli(fake.url, "ls", "--url", nowhere), "cannot reach tidepoold at " + nowhere)


# -- errors --------------------------------------------------------------------------------


def test_fake_unreachable_daemon():
    url = f"http://127.0.0.1:{free_port()}"
    for args in (["ls"], ["exec", "x", "--", "true"], ["run", "--", "true"], ["create"], ["rm", "a", "b"]):
        p = cli(url, *args)
        assert_one_error_line(p, f"cannot reach tidepoold at {url}: connection refused")
    p = cli(url, "version")
    assert p.returncode == 0 and p.stdout.decode().startswith("tidepool ")
    assert ERROR_LINE.match(p.stderr.decode())


def test_real_unreachable_daemon(daemon):
    # The running daemon must not be what answers; a free port never does.
    test_fake_unreachable_daemon()


def test_fake_usage_errors(fake):
    assert_one_error_line(cli(fake.url, "create", "--memory", "12X"), "--memory", rc=2)
    assert_one_error_line(cli(fake.url, "create", "--ttl", "-5m"), "--ttl", rc=2)
    assert_one_error_line(cli(fake.url, "create", "--label", "novalue"), "--label", rc=2)
    assert_one_error_line(cli(fake.url, "exec", "x"), "command", rc=2)
    assert_one_error_line(cli(fake.url, "run", "--timeout", "0", "--", "true"), "--timeout", rc=2)
    assert_one_error_line(cli(fake.url), rc=2)
    assert_one_error_line(cli(fake.url, "frobnicate"), rc=2)
    assert_one_error_line(cli("https://x", "ls"), "https", rc=2)
    assert fake.requests == []   # nothing reached the daemon
    # The daemon's own validation comes back as its code and message.
    assert_one_error_line(cli(fake.url, "create", "--memory", "1M"), "invalid_argument: memory_mb must be at least 16")


def test_real_daemon_errors(daemon):
    assert_one_error_line(cli(daemon.url, "exec", "n0-000000000000", "--", "true"), "not_found")
    assert_one_error_line(cli(daemon.url, "create", "--memory", "1M"), "invalid_argument")
    assert_one_error_line(cli(daemon.url, "create", "--image", "no-such-image-xyz"))
