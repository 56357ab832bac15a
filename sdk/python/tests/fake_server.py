"""An in-memory fake of the Tidepool daemon for SDK unit tests (standard library only).

It serves the routes of api/openapi.yaml over real HTTP/1.1 keep-alive connections, from
a thread, so the SDK's transport is exercised for real. Commands are not run: a test sets
``exec_handler`` to decide what a command "prints". Every request is recorded.
"""
from __future__ import annotations

import base64
import datetime as dt
import io
import json
import tarfile
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")


class Recorded:
    """One request as the fake saw it."""

    def __init__(self, method: str, path: str, query: Dict[str, List[str]], headers: Dict[str, str], body: bytes):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


# An exec handler gets (sandbox id, request JSON) and returns either a dict (the
# ExecResult JSON with raw bytes for stdout/stderr, encoded by the fake) or, for streaming,
# a list of events: ("stdout"|"stderr", bytes), ("wait", threading.Event), ("exit", dict),
# ("error", code, message), ("raw", bytes).
ExecHandler = Callable[[str, Dict[str, Any]], Any]


def default_exec(sandbox_id: str, req: Dict[str, Any]) -> Any:
    cmd = req["cmd"]
    text = cmd if isinstance(cmd, str) else " ".join(cmd)
    if req.get("stream"):
        return [("stdout", text.encode()), ("exit", {"exit_code": 0, "duration": 0.01})]
    return {"exit_code": 0, "stdout": text.encode(), "stderr": b"", "duration": 0.01}


class FakeDaemon:
    """The fake daemon. Use as a context manager; ``url`` is its base URL."""

    def __init__(self) -> None:
        self.sandboxes: Dict[str, Dict[str, Any]] = {}
        self.files: Dict[Tuple[str, str], Tuple[bytes, int]] = {}
        self.dirs: Dict[str, set] = {}
        self.requests: List[Recorded] = []
        self.exec_handler: ExecHandler = default_exec
        self.inject: List[Tuple[int, bytes]] = []   # (status, body) answers for the next requests
        self.delay: float = 0.0                      # seconds to sleep before answering
        self.drop: int = 0                           # handle, then hang up without answering, N times
        self.idem: Dict[str, Tuple[str, str, int, bytes, Optional[str]]] = {}
        self.executions = 0                          # commands actually "run" (exec + processes)
        self.processes: Dict[Tuple[str, int], Dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.batch_fail: set = set()                 # batch item indexes that fail
        self.templates: Dict[str, Dict[str, Any]] = {}
        self.pool_ready: Dict[str, int] = {}         # template -> sandboxes its pool hands out
        self.jobs: Dict[str, Dict[str, Any]] = {}
        self.heartbeat_fail: List[Tuple[int, str]] = []  # (status, code) answers for the next heartbeats
        self.tar_extra: Dict[str, Tuple[bytes, str]] = {}  # extra tar entries: name -> (type, linkname)
        self.tar_raw: Optional[bytes] = None         # served as-is by every directory download
        self.connections = 0                         # TCP connections accepted
        self.live_sockets: List[socket.socket] = []
        self.lock = threading.Lock()
        self._next = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1
                    fake.live_sockets.append(self.connection)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _handle(self) -> None:
                fake._dispatch(self)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that gave up (the timeout tests) closes before its answer: the
                # write fails by design, not worth a traceback on the test's output.
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> "FakeDaemon":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.drop_connections()
        self.server.server_close()

    def drop_connections(self) -> None:
        """Closes every accepted connection (as a server closing idle keep-alives does)."""
        with self.lock:
            socks, self.live_sockets = self.live_sockets, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def add_sandbox(self, **fields: Any) -> Dict[str, Any]:
        with self.lock:
            self._next += 1
            sid = fields.pop("id", f"n0-{self._next:012x}")
        sb = {"id": sid, "state": "running", "tier": "container", "image": "host", "node": "n0",
              "memory_mb": 512, "cpus": 1.0, "pids": 512, "disk_mb": 1024, "ttl_seconds": 3600,
              "idle_timeout_seconds": 0, "labels": {}, "env": {}, "created_at": now()}
        sb.update(fields)
        self.sandboxes[sid] = sb
        self.dirs[sid] = {"/"}
        return sb

    # -- HTTP ----------------------------------------------------------------------

    def _dispatch(self, h: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(h.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        rec = Recorded(h.command, url.path, query, {k.lower(): v for k, v in h.headers.items()}, body)
        with self.lock:
            self.requests.append(rec)
            injected = self.inject.pop(0) if self.inject else None
        if self.delay:
            time.sleep(self.delay)
        if injected is not None:
            self._send(h, injected[0], injected[1], "application/json")
            return
        key = rec.headers.get("idempotency-key")
        if key is not None:
            with self.lock:
                prior = self.idem.get(key)
            if prior is not None:
                if prior[:2] != (rec.method, rec.path):
                    self._send(h, 409, json.dumps({"code": "conflict", "message": "key reused"}).encode(),
                               "application/json")
                else:
                    self._send(h, prior[2], prior[3], prior[4], replayed=True)
                return
        try:
            routed = self._route(h, rec)
        except _Streamed:
            return
        status, payload = routed[0], routed[1]
        extra = routed[2] if len(routed) > 2 else {}
        if payload is None:
            body, ctype = b"", None
        elif isinstance(payload, bytes):
            body, ctype = payload, ("application/x-tar" if rec.path.endswith("/files/tar") else "application/octet-stream")
        elif isinstance(payload, str):
            body, ctype = payload.encode(), "text/plain; version=0.0.4"
        else:
            body, ctype = json.dumps(payload).encode(), "application/json"
        if key is not None and status < 500:
            with self.lock:
                self.idem[key] = (rec.method, rec.path, status, body, ctype)
        with self.lock:
            drop = self.drop > 0
            if drop:
                self.drop -= 1
        if drop:
            # The request was handled, but the answer is lost: hang up.
            h.close_connection = True
            try:
                h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._send(h, status, body, ctype, headers=extra)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: Optional[str],
              replayed: bool = False, headers: Optional[Dict[str, str]] = None) -> None:
        h.send_response(status)
        if replayed:
            h.send_header("Idempotent-Replayed", "true")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        if ctype:
            h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)
        h.wfile.flush()

    @staticmethod
    def _err(status: int, code: str, message: str) -> Tuple[int, Dict[str, str]]:
        return status, {"code": code, "message": message}

    # The function tier: a run "prints" its stdin (bytes that are not UTF-8 come back as
    # stdout_b64 too); language "fail" is a run that could not complete.
    def _fn_result(self, run: Dict[str, Any]) -> Dict[str, Any]:
        data = base64.b64decode(run["stdin_b64"]) if "stdin_b64" in run else run.get("stdin", "").encode()
        out: Dict[str, Any] = {"verdict": "ok", "exit_code": 0, "signal": 0, "stdout": data.decode("utf-8", "replace"),
                               "stderr": "", "stdout_truncated": False, "stderr_truncated": False, "wall_ms": 1.5,
                               "cpu_ms": 1.0, "memory_peak_bytes": 4096, "files": {"echo": b64(data)},
                               "missing_files": [], "compile": None, "compile_cached": False, "queue_ms": 0.1,
                               "server_ms": 2.0}
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            out["stdout_b64"] = b64(data)
        if run.get("language") == "cpp":
            out["compile"] = {"verdict": "ok", "exit_code": 0, "signal": 0, "stdout": "", "stderr": "warn",
                              "wall_ms": 100.0, "cpu_ms": 90.0, "memory_peak_bytes": 1 << 20}
        return out

    def _functions(self, rest: List[str], rec: Recorded) -> Tuple[int, Any]:
        if rest == ["languages"]:
            return 200, {"languages": [{"name": "python", "aliases": ["py"]}]}
        if rest == []:
            return 200, {"pools": [], "queued": 0, "in_flight": 0}
        req = rec.json()
        with self.lock:
            self.executions += 1
        if rest == ["run"]:
            if req.get("language") == "fail":
                return self._err(503, "unavailable", "no worker")
            return 200, self._fn_result(req)
        if rest == ["batch"]:
            runs = req.get("runs")
            if runs is None:
                base = {k: v for k, v in req.items() if k != "cases"}
                runs = [{**base, **c} for c in req["cases"]]
            results = []
            for r in runs:
                if r.get("language") == "fail":
                    results.append({"error": {"code": "unavailable", "message": "no worker"}})
                else:
                    results.append(self._fn_result(r))
            return 200, {"results": results}
        return self._err(404, "not_found", "no route")

    def _route(self, h: BaseHTTPRequestHandler, rec: Recorded) -> Tuple[int, Any]:
        parts = [urllib.parse.unquote(p) for p in rec.path.split("/") if p]
        m = rec.method
        if parts == ["health"]:
            return 200, {"status": "ok"}
        if parts == ["version"]:
            return 200, {"version": "0.0.0-fake", "api": "v1", "tiers": ["container"]}
        if parts == ["metrics"]:
            return 200, "tidepool_exec_total 0\n"
        if parts[:2] == ["v1", "functions"]:
            return self._functions(parts[2:], rec)
        if parts[:2] == ["v1", "templates"]:
            return self._templates(parts[2:], m, rec)
        if parts == ["v1", "pools"]:
            return 200, {"pools": [self._pool(n) for n in sorted(self.templates)]}
        if parts[:2] == ["v1", "jobs"]:
            return self._jobs(parts[2:], m, rec)
        if parts[:2] != ["v1", "sandboxes"]:
            return self._err(404, "not_found", f"no route {rec.path}")
        if len(parts) == 2:
            if m == "POST":
                try:
                    req = rec.json()
                except ValueError:
                    return self._err(400, "invalid_argument", "malformed JSON")
                if req.get("image", "host") != "host":
                    return self._err(400, "invalid_argument", f"unknown image {req['image']}")
                if req.get("memory_mb", 512) < 16:
                    return self._err(400, "invalid_argument", "memory_mb below 16")
                refused = self._admit(req)
                if refused is not None:
                    return refused
                pooled = self._take_pooled(req)
                return 201, self.add_sandbox(**self._fields(req)), {"Tidepool-From-Pool": "true" if pooled else "false"}
            if m == "GET":
                out = list(self.sandboxes.values())
                for lab in rec.query.get("label", []):
                    k, _, v = lab.partition("=")
                    out = [s for s in out if s["labels"].get(k) == v]
                if "state" in rec.query:
                    out = [s for s in out if s["state"] == rec.query["state"][0]]
                elif rec.query.get("all") != ["true"]:
                    out = [s for s in out if s["state"] != "stopped"]
                return 200, {"sandboxes": out}
        if parts[2:] == ["batch"] and m == "POST":
            return self._batch(h, rec.json())
        sid = parts[2]
        sb = self.sandboxes.get(sid)
        if sb is None:
            return self._err(404, "not_found", f"sandbox {sid} not found")
        rest = parts[3:]
        if not rest:
            if m == "GET":
                return 200, sb
            if m == "DELETE":
                sb.update(state="stopped", ended_at=now(), end_reason="deleted")
                return 200, sb
        if rest == ["resume"] and m == "POST":
            if sb["state"] not in ("paused", "running"):
                return self._err(409, "conflict", f"sandbox {sid} is {sb['state']}")
            sb["state"] = "running"
            return 200, sb
        if sb["state"] != "running":
            return self._err(409, "conflict", f"sandbox {sid} is {sb['state']}")
        if rest == ["pause"] and m == "POST":
            sb["state"] = "paused"
            return 200, sb
        if rest == ["exec"] and m == "POST":
            return self._exec(h, sid, rec.json())
        if rest and rest[0] == "processes":
            return self._processes(sid, rest[1:], m, rec)
        path = rec.query.get("path", [""])[0]
        if rest[:2] == ["files", "tar"]:
            if not path.startswith("/"):
                return self._err(400, "invalid_argument", "path must be absolute")
            return self._tar(sid, m, path.rstrip("/") or "/", rec)
        if rest and rest[0] == "files":
            if not path.startswith("/"):
                return self._err(400, "invalid_argument", "path must be absolute")
            return self._files(sid, rest[1:], m, path, rec)
        return self._err(404, "not_found", f"no route {rec.path}")

    def _entry(self, sid: str, path: str) -> Optional[Dict[str, Any]]:
        name = path.rstrip("/").rsplit("/", 1)[-1] or "/"
        if (sid, path) in self.files:
            data, mode = self.files[(sid, path)]
            return {"name": name, "path": path, "type": "file", "size": len(data), "mode": mode,
                    "mtime": 1700000000.5, "uid": 0, "gid": 0}
        if path in self.dirs[sid]:
            return {"name": name, "path": path, "type": "dir", "size": 4096, "mode": 0o755,
                    "mtime": 1700000000.0, "uid": 0, "gid": 0}
        return None

    def _files(self, sid: str, sub: List[str], m: str, path: str, rec: Recorded) -> Tuple[int, Any]:
        parent = path.rsplit("/", 1)[0] or "/"
        if sub == [] and m == "PUT":
            mode = int(rec.query.get("mode", ["644"])[0], 8)
            self.files[(sid, path)] = (rec.body, mode)
            p = parent
            while p not in self.dirs[sid]:
                self.dirs[sid].add(p)
                p = p.rsplit("/", 1)[0] or "/"
            return 200, self._entry(sid, path)
        if sub == [] and m == "GET":
            if (sid, path) not in self.files:
                return self._err(404, "not_found", f"{path}: no such file")
            return 200, self.files[(sid, path)][0]
        if sub == [] and m == "DELETE":
            if (sid, path) in self.files:
                del self.files[(sid, path)]
                return 204, None
            if path in self.dirs[sid]:
                children = [p for (s, p) in self.files if s == sid and p.startswith(path + "/")]
                if children and rec.query.get("recursive") != ["true"]:
                    return self._err(409, "conflict", "directory not empty")
                for c in children:
                    del self.files[(sid, c)]
                self.dirs[sid].discard(path)
                return 204, None
            return self._err(404, "not_found", f"{path}: no such file")
        if sub == ["stat"] and m == "GET":
            e = self._entry(sid, path)
            return (200, e) if e else self._err(404, "not_found", f"{path}: no such file")
        if sub == ["list"] and m == "GET":
            if path not in self.dirs[sid]:
                return self._err(404, "not_found", f"{path}: no such directory")
            prefix = path.rstrip("/") + "/"
            names = {p for (s, p) in self.files if s == sid and p.startswith(prefix) and "/" not in p[len(prefix):]}
            names |= {d for d in self.dirs[sid] if d.startswith(prefix) and d != path and "/" not in d[len(prefix):]}
            return 200, {"entries": [self._entry(sid, p) for p in sorted(names)]}
        if sub == ["mkdir"] and m == "POST":
            if parent not in self.dirs[sid] and rec.query.get("parents") != ["true"]:
                return self._err(404, "not_found", f"{parent}: no such directory")
            p = path
            while p not in self.dirs[sid]:
                self.dirs[sid].add(p)
                p = p.rsplit("/", 1)[0] or "/"
            return 201, self._entry(sid, path)
        return self._err(404, "not_found", f"no route files/{'/'.join(sub)}")

    def _tar(self, sid: str, m: str, path: str, rec: Recorded) -> Tuple[int, Any]:
        prefix = "" if path == "/" else path
        if m == "PUT":
            try:
                tf = tarfile.open(fileobj=io.BytesIO(rec.body), mode="r:")
            except tarfile.TarError as e:
                return self._err(400, "invalid_argument", f"bad tar: {e}")
            with tf:
                self.dirs[sid].add(path)
                for mem in tf.getmembers():
                    full = f"{prefix}/{mem.name}"
                    if mem.isdir():
                        self.dirs[sid].add(full)
                    elif mem.isreg():
                        self.files[(sid, full)] = (tf.extractfile(mem).read(), mem.mode)
                        self.dirs[sid].add(full.rsplit("/", 1)[0] or "/")
            return 200, {"path": path, "bytes": len(rec.body)}
        if m == "GET":
            if self.tar_raw is not None:
                return 200, self.tar_raw
            if path not in self.dirs[sid]:
                return self._err(404, "not_found", f"{path}: no such directory")
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tf:
                for d in sorted(self.dirs[sid]):
                    if d.startswith(prefix + "/") and d != path:
                        ti = tarfile.TarInfo(d[len(prefix) + 1:])
                        ti.type = tarfile.DIRTYPE
                        ti.mode = 0o755
                        tf.addfile(ti)
                for (s2, p), (data, mode) in sorted(self.files.items()):
                    if s2 == sid and p.startswith(prefix + "/"):
                        ti = tarfile.TarInfo(p[len(prefix) + 1:])
                        ti.size = len(data)
                        ti.mode = mode
                        tf.addfile(ti, io.BytesIO(data))
                for name, (kind, extra) in self.tar_extra.items():
                    ti = tarfile.TarInfo(name)
                    ti.type = kind
                    ti.linkname = extra
                    tf.addfile(ti)
            return 200, buf.getvalue()
        return self._err(404, "not_found", "no route")

    def _proc_json(self, p: Dict[str, Any], with_output: bool) -> Dict[str, Any]:
        out = {"pid": p["pid"], "cmd": p["cmd"], "state": p["state"], "started_at": p["started_at"]}
        res = p.get("result")
        if with_output:
            out["stdout"] = b64(p["stdout"])
            out["stderr"] = b64(p["stderr"])
        if res is not None:
            out["result"] = dict(res, stdout=b64(p["stdout"]), stderr=b64(p["stderr"]))
        return out

    def _processes(self, sid: str, sub: List[str], m: str, rec: Recorded) -> Tuple[int, Any]:
        if not sub:
            if m == "POST":
                req = rec.json()
                with self.lock:
                    self._next += 1
                    pid = 100 + self._next
                    self.executions += 1
                cmd = req["cmd"] if isinstance(req["cmd"], list) else ["/bin/sh", "-c", req["cmd"]]
                p = {"pid": pid, "cmd": cmd, "state": "running", "started_at": now(), "stdout": b"",
                     "stderr": b"", "stdin": b"", "result": None, "stdin_open": bool(req.get("stdin_open"))}
                if not p["stdin_open"] and "sleep" not in " ".join(cmd):
                    res = dict(self.exec_handler(sid, dict(req, stream=False)))
                    p["stdout"], p["stderr"] = res.pop("stdout", b""), res.pop("stderr", b"")
                    p["state"], p["result"] = "exited", res
                self.processes[(sid, pid)] = p
                return 201, self._proc_json(p, False)
            if m == "GET":
                return 200, {"processes": [self._proc_json(p, False) for (s2, _), p in self.processes.items()
                                           if s2 == sid]}
        try:
            pid = int(sub[0])
        except ValueError:
            return self._err(400, "invalid_argument", "pid must be an integer")
        p = self.processes.get((sid, pid))
        if p is None:
            return self._err(404, "not_found", f"no process {pid}")
        action = sub[1:]
        if not action and m == "GET":
            return 200, self._proc_json(p, False)
        if action == ["wait"] and m == "POST":
            t = float(rec.query.get("timeout", ["10"])[0])
            with self.cond:
                self.cond.wait_for(lambda: p["state"] == "exited", timeout=t)
            return 200, self._proc_json(p, True)
        if action == ["stdin"] and m == "POST":
            if not p["stdin_open"] or p["state"] != "running":
                return self._err(409, "conflict", "stdin is not open")
            p["stdin"] += rec.body
            if rec.query.get("eof") == ["true"]:
                with self.cond:
                    p["stdout"], p["state"] = p["stdin"], "exited"
                    p["result"] = {"exit_code": 0, "duration": 0.1}
                    self.cond.notify_all()
            return 204, None
        if action == ["signal"] and m == "POST":
            sig = rec.json().get("signal", 9)
            with self.cond:
                if p["state"] == "running":
                    p["state"], p["result"] = "exited", {"exit_code": -1, "signal": sig, "duration": 0.1}
                self.cond.notify_all()
            return 204, None
        return self._err(404, "not_found", "no route")

    def _exec(self, h: BaseHTTPRequestHandler, sid: str, req: Dict[str, Any]) -> Tuple[int, Any]:
        if "timeout" in req and req["timeout"] <= 0:
            return self._err(400, "invalid_argument", "timeout must be > 0")
        with self.lock:
            self.executions += 1
        out = self.exec_handler(sid, req)
        if isinstance(out, tuple):  # (status, error JSON)
            return out
        if not req.get("stream"):
            res = dict(out)
            for k in ("stdout", "stderr"):
                res[k] = b64(res.get(k, b""))
            return 200, res
        # NDJSON, chunked, flushed per event so the client sees each one as it happens.
        h.send_response(200)
        h.send_header("Content-Type", "application/x-ndjson")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(data: bytes) -> None:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        try:
            chunk(json.dumps({"type": "started", "pid": 42}).encode() + b"\n")
            for ev in out:
                kind = ev[0]
                if kind in ("stdout", "stderr"):
                    chunk(json.dumps({"type": kind, "data": b64(ev[1])}).encode() + b"\n")
                elif kind == "wait":
                    ev[1].wait(10)
                elif kind == "exit":
                    chunk(json.dumps(dict(ev[1], type="exit")).encode() + b"\n")
                elif kind == "error":
                    chunk(json.dumps({"type": "error", "code": ev[1], "message": ev[2]}).encode() + b"\n")
                elif kind == "raw":
                    chunk(ev[1])
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        raise _Streamed()


    # -- templates, pools, jobs and batches (api/openapi.yaml, issue 13) ------------

    _SHAPE = ("image", "tier", "memory_mb", "cpus", "pids", "disk_mb", "ttl_seconds", "idle_timeout_seconds",
              "labels", "env", "priority")

    def _fields(self, req: Dict[str, Any]) -> Dict[str, Any]:
        base: Dict[str, Any] = {}
        tpl = self.templates.get(req.get("template", ""))
        if tpl is not None:
            base = {k: json.loads(json.dumps(v)) for k, v in tpl.items() if k in self._SHAPE}
        base.update({k: json.loads(json.dumps(v)) for k, v in req.items() if k in self._SHAPE + ("template", "job", "step")})
        return base

    def _admit(self, req: Dict[str, Any]) -> Optional[Tuple[int, Any]]:
        """The error answer of a create that may not go ahead, else None."""
        if "template" in req and req["template"] not in self.templates:
            return self._err(404, "not_found", f"template '{req['template']}' not found")
        if "step" in req and "job" not in req:
            return self._err(400, "invalid_argument", "field 'step' needs a 'job'")
        if "job" in req:
            job = self.jobs.get(req["job"])
            if job is None or job["state"] == "ended":
                return self._err(404, "not_found", f"job {req['job']} not found")
            limit = job["quota"].get("sandboxes", 0)
            used = sum(1 for s in self.sandboxes.values() if s.get("job") == job["id"] and s["state"] != "stopped")
            if limit and used >= limit:
                return self._err(429, "resource_exhausted",
                                 f"job {job['id']}: quota sandboxes reached ({used} of {limit})")
        return None

    def _take_pooled(self, req: Dict[str, Any]) -> bool:
        name = req.get("template")
        with self.lock:
            if name and self.pool_ready.get(name, 0) > 0:
                self.pool_ready[name] -= 1
                return True
        return False

    def _pool(self, name: str) -> Dict[str, Any]:
        t = self.templates[name]
        return {"template": name, "ready": self.pool_ready.get(name, 0), "creating": 0, "target": t["pool_min"],
                "min": t["pool_min"], "max": t["pool_max"], "hits": 3, "misses": 1, "hit_rate": 0.75,
                "rate_per_second": 0.5, "cold_create_seconds": 0.2}

    def _templates(self, rest: List[str], m: str, rec: Recorded) -> Tuple[int, Any]:
        def stored(body: Dict[str, Any], version: int) -> Dict[str, Any]:
            t = {"image": "host", "tier": "container", "memory_mb": 512, "cpus": 1.0, "pids": 512, "disk_mb": 1024,
                 "ttl_seconds": 3600, "idle_timeout_seconds": 0, "env": {}, "labels": {}, "priority": "normal",
                 "pool_min": 0, "pool_max": 0, "created_at": now(), "updated_at": now()}
            t.update({k: v for k, v in body.items() if k != "version"})
            t["version"] = version
            self.templates[t["name"]] = t
            return dict(t, pool=self._pool(t["name"]))
        if not rest:
            if m == "GET":
                return 200, {"templates": [dict(t, pool=self._pool(n)) for n, t in sorted(self.templates.items())]}
            body = rec.json()
            if body["name"] in self.templates:
                return self._err(409, "conflict", f"template '{body['name']}' exists")
            return 201, stored(body, 1)
        name = rest[0]
        cur = self.templates.get(name)
        if m == "PUT":
            body = rec.json()
            want = body.get("version")
            if cur is not None and want is not None and want != cur["version"]:
                return self._err(409, "conflict", f"template '{name}' is at version {cur['version']}, not {want}")
            return (201 if cur is None else 200), stored(body, 1 if cur is None else cur["version"] + 1)
        if cur is None:
            return self._err(404, "not_found", f"template '{name}' not found")
        out = dict(cur, pool=self._pool(name))
        if m == "DELETE":
            del self.templates[name]
        return 200, out

    def _job_json(self, job: Dict[str, Any], use: bool = True) -> Dict[str, Any]:
        out = dict(job)
        if use:
            mine = [s for s in self.sandboxes.values() if s.get("job") == job["id"] and s["state"] != "stopped"]
            out["use"] = {"sandboxes": len(mine), "memory_mb": sum(s["memory_mb"] for s in mine),
                          "cpus": sum(s["cpus"] for s in mine), "paused": sum(s["state"] == "paused" for s in mine)}
        return out

    def _reclaim(self, pred: Callable[[Dict[str, Any]], bool], reason: str) -> int:
        n = 0
        for s in self.sandboxes.values():
            if s["state"] != "stopped" and pred(s):
                s.update(state="stopped", ended_at=now(), end_reason=reason)
                n += 1
        return n

    def _jobs(self, rest: List[str], m: str, rec: Recorded) -> Tuple[int, Any]:
        if not rest:
            if m == "GET":
                every = rec.query.get("all") == ["true"]
                return 200, {"jobs": [self._job_json(j) for j in self.jobs.values() if every or j["state"] != "ended"]}
            body = rec.json() if rec.body else {}
            with self.lock:
                self._next += 1
                jid = f"job-{self._next:08x}"
            job = {"id": jid, "name": body.get("name", ""), "state": "active",
                   "lease_seconds": body.get("lease_seconds", 60), "grace_seconds": body.get("grace_seconds", 600),
                   "quota": {"sandboxes": 0, "memory_mb": 0, "cpus": 0.0, **body.get("quota", {})},
                   "labels": body.get("labels", {}), "created_at": now(), "lease_expires_at": now()}
            self.jobs[jid] = job
            return 201, self._job_json(job, use=False)
        job = self.jobs.get(rest[0])
        if job is None:
            return self._err(404, "not_found", f"job {rest[0]} not found")
        if len(rest) == 1 and m == "GET":
            return 200, self._job_json(job)
        if job["state"] == "ended" and rest[1:]:
            return self._err(409, "conflict", f"job {job['id']} has ended")
        if len(rest) == 1 and m == "DELETE":
            if job["state"] != "ended":
                self._reclaim(lambda s: s.get("job") == job["id"], "job_ended")
                job.update(state="ended", ended_at=now(), end_reason="deleted")
            return 200, self._job_json(job, use=False)
        if rest[1:] == ["heartbeat"] and m == "POST":
            with self.lock:
                fail = self.heartbeat_fail.pop(0) if self.heartbeat_fail else None
            if fail is not None:
                return self._err(fail[0], fail[1], "heartbeat refused")
            job.update(state="active", lease_expires_at=now())
            with self.cond:
                self.cond.notify_all()
            return 200, self._job_json(job, use=False)
        if len(rest) == 3 and rest[1] == "steps" and m == "DELETE":
            n = self._reclaim(lambda s: s.get("job") == job["id"] and s.get("step") == rest[2], "step_ended")
            return 200, {"job": job["id"], "step": rest[2], "reclaimed": n}
        return self._err(404, "not_found", "no route")

    def _batch(self, h: BaseHTTPRequestHandler, req: Dict[str, Any]) -> Tuple[int, Any]:
        count = req.pop("count", None)
        if not isinstance(count, int) or not 1 <= count <= 1000:
            return self._err(400, "invalid_argument", "count must be within 1..1000")
        gang, stream = bool(req.pop("gang", False)), bool(req.pop("stream", False))
        refused = self._admit(req)
        if refused is not None:
            return refused
        items: List[Dict[str, Any]] = []  # {"index", "sandbox"|"error", "from_pool"}
        for i in range(count):
            if i in self.batch_fail:
                items.append({"index": i, "error": {"code": "resource_exhausted", "message": "no room"}})
            else:
                pooled = self._take_pooled(req)
                items.append({"index": i, "sandbox": self.add_sandbox(**self._fields(req)), "from_pool": pooled})
        failed = [it for it in items if "error" in it]
        released: List[str] = []
        if gang and failed:
            for it in items:
                if "sandbox" in it:
                    self.sandboxes[it["sandbox"]["id"]].update(state="stopped", end_reason="deleted")
                    released.append(it["sandbox"]["id"])
        if not stream:
            if gang and failed:
                return self._err(429, failed[0]["error"]["code"], f"gang batch: {failed[0]['error']['message']}")
            return 200, {"sandboxes": [it["sandbox"] for it in items if "sandbox" in it],
                         "errors": [dict(it["error"], index=it["index"]) for it in failed],
                         "from_pool": sum(1 for it in items if it.get("from_pool"))}
        h.send_response(200)
        h.send_header("Content-Type", "application/x-ndjson")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(obj: Dict[str, Any]) -> None:
            data = json.dumps(obj).encode() + b"\n"
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        # Completion order: pooled items first, as the daemon's pool hands them out at once.
        for it in sorted(items, key=lambda it: not it.get("from_pool")):
            chunk(it)
        if gang and failed:
            chunk({"done": True, "ok": False, "created": 0, "failed": len(failed), "released": released,
                   "error": {"code": failed[0]["error"]["code"], "message": "gang batch failed"}})
        else:
            chunk({"done": True, "ok": not failed, "created": count - len(failed),
                   "from_pool": sum(1 for it in items if it.get("from_pool")), "failed": len(failed)})
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()
        raise _Streamed()


class _Streamed(Exception):
    """The answer was already written by a streaming handler."""


#: Every error status of the contract with its code and the SDK's exception class name.
ERROR_CASES: List[Tuple[int, str, str]] = [
    (400, "invalid_argument", "InvalidArgument"),
    (401, "unauthenticated", "Unauthenticated"),
    (403, "permission_denied", "PermissionDenied"),
    (404, "not_found", "NotFound"),
    (409, "conflict", "Conflict"),
    (413, "payload_too_large", "PayloadTooLarge"),
    (429, "resource_exhausted", "QuotaExceeded"),
    (500, "internal", "SandboxError"),
    (503, "unavailable", "Unavailable"),
    (504, "deadline_exceeded", "Timeout"),
    (507, "insufficient_storage", "InsufficientStorage"),
]


def error_cases(module: Any) -> List[Tuple[int, str, Any]]:
    """:data:`ERROR_CASES` with the class names resolved in ``module`` (``tidepool``), for
    the sync and asyncio tests' parametrisation."""
    return [(status, code, getattr(module, name)) for status, code, name in ERROR_CASES]
