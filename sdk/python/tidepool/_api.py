"""Request builders and answer parsers for every route (internal).

Pure functions, no I/O: the sync client (``client.py``) and the asyncio client send
the same :class:`~tidepool._http.Request` values and parse answers with the same code.
Route shapes follow ``api/openapi.yaml``.
"""
from __future__ import annotations

import base64
import datetime as _dt
import math
import urllib.parse
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._http import DEFAULT, Request, json_request

Seconds = Union[int, float, _dt.timedelta]
Command = Union[str, Sequence[str]]

SANDBOXES = "/v1/sandboxes"


def _quote_id(sandbox_id: str) -> str:
    if not sandbox_id:
        raise ValueError("sandbox id must not be empty")
    return urllib.parse.quote(sandbox_id, safe="")


def sandbox_path(sandbox_id: str, suffix: str = "") -> str:
    """``/v1/sandboxes/{id}{suffix}`` with the id escaped."""
    return f"{SANDBOXES}/{_quote_id(sandbox_id)}{suffix}"


def seconds(value: Optional[Seconds], name: str) -> Optional[float]:
    """Accepts seconds as int, float or timedelta; None passes through."""
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be seconds (int, float or timedelta), not {type(value).__name__}")
    return float(value)


def whole_seconds(value: Optional[Seconds], name: str) -> Optional[int]:
    """Like :func:`seconds` but rounded up to an integer (the contract's TTL fields are integers)."""
    s = seconds(value, name)
    if s is None:
        return None
    # Values <= 0 are passed through so the server can reject them with a clear error.
    return int(math.ceil(s)) if s > 0 else int(s)


def _boolstr(b: bool) -> str:
    return "true" if b else "false"


def _shape_fields(body: Dict[str, Any], memory_mb: Optional[int], cpus: Optional[float], disk_mb: Optional[int],
                  pids: Optional[int], ttl: Optional[Seconds], idle_timeout: Optional[Seconds],
                  labels: Optional[Mapping[str, str]], env: Optional[Mapping[str, str]],
                  priority: Optional[str]) -> Dict[str, Any]:
    """Adds the sandbox shape fields a sandbox and a template share (None: left out)."""
    if memory_mb is not None:
        body["memory_mb"] = int(memory_mb)
    if cpus is not None:
        body["cpus"] = float(cpus)
    if disk_mb is not None:
        body["disk_mb"] = int(disk_mb)
    if pids is not None:
        body["pids"] = int(pids)
    ttl_s = whole_seconds(ttl, "ttl")
    if ttl_s is not None:
        body["ttl_seconds"] = ttl_s
    idle_s = whole_seconds(idle_timeout, "idle_timeout")
    if idle_s is not None:
        body["idle_timeout_seconds"] = idle_s
    if labels:
        body["labels"] = {str(k): str(v) for k, v in labels.items()}
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if priority is not None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
        body["priority"] = priority
    return body


#: The values of a sandbox's (or template's) ``priority``.
PRIORITIES = ("normal", "best-effort")


def _name(value: Optional[str], what: str) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    return value


def create_body(
    *,
    image: Optional[str],
    tier: Optional[str],
    memory_mb: Optional[int],
    cpus: Optional[float],
    ttl: Optional[Seconds],
    idle_timeout: Optional[Seconds],
    labels: Optional[Mapping[str, str]],
    env: Optional[Mapping[str, str]],
    disk_mb: Optional[int],
    pids: Optional[int],
    template: Optional[str] = None,
    job: Optional[str] = None,
    step: Optional[str] = None,
    priority: Optional[str] = None,
) -> Dict[str, Any]:
    """The ``CreateSandbox`` JSON object. Fields left as None take the server's defaults,
    or with ``template`` the template's (image and tier are then sent only when given)."""
    body: Dict[str, Any] = {}
    if image is not None or template is None:
        body["image"] = image or "host"
    if tier is not None or template is None:
        body["tier"] = tier or "container"
    _shape_fields(body, memory_mb, cpus, disk_mb, pids, ttl, idle_timeout, labels, env, priority)
    if _name(template, "template") is not None:
        body["template"] = template
    if _name(job, "job") is not None:
        body["job"] = job
    if _name(step, "step") is not None:
        if job is None:
            raise ValueError("step needs a job")
        body["step"] = step
    return body


def create(timeout: Any = DEFAULT, **fields: Any) -> Request:
    """POST /v1/sandboxes (``fields`` as for :func:`create_body`)."""
    return json_request("POST", SANDBOXES, create_body(**fields), timeout=timeout)


def create_batch(count: int, timeout: Any = DEFAULT, gang: bool = False, stream: bool = False,
                 **fields: Any) -> Request:
    """POST /v1/sandboxes/batch: ``count`` sandboxes described alike; ``gang``: all or
    nothing; ``stream``: an NDJSON answer, one line per item as it is ready."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError("count must be an int")
    body = create_body(**fields)
    body["count"] = count
    if gang:
        body["gang"] = True
    if stream:
        body["stream"] = True
    req = json_request("POST", SANDBOXES + "/batch", body, timeout=timeout)
    if stream:
        req.headers["Accept"] = "application/x-ndjson, application/json"
    return req


def pause(sandbox_id: str) -> Request:
    """POST /v1/sandboxes/{id}/pause."""
    return Request("POST", sandbox_path(sandbox_id, "/pause"))


def resume(sandbox_id: str) -> Request:
    """POST /v1/sandboxes/{id}/resume."""
    return Request("POST", sandbox_path(sandbox_id, "/resume"))


# -- templates, pools and jobs -----------------------------------------------------

TEMPLATES = "/v1/templates"
JOBS = "/v1/jobs"


def _segment(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    return urllib.parse.quote(value, safe="")


def template_body(
    name: str,
    *,
    image: Optional[str] = None,
    tier: Optional[str] = None,
    memory_mb: Optional[int] = None,
    cpus: Optional[float] = None,
    pids: Optional[int] = None,
    disk_mb: Optional[int] = None,
    ttl: Optional[Seconds] = None,
    idle_timeout: Optional[Seconds] = None,
    env: Optional[Mapping[str, str]] = None,
    labels: Optional[Mapping[str, str]] = None,
    priority: Optional[str] = None,
    pool_min: Optional[int] = None,
    pool_max: Optional[int] = None,
    version: Optional[int] = None,
) -> Dict[str, Any]:
    """The ``TemplateSpec`` JSON object (plus ``version`` for a compare-and-set replace)."""
    _segment(name, "template name")
    body: Dict[str, Any] = {"name": name}
    if image is not None:
        body["image"] = image
    if tier is not None:
        body["tier"] = tier
    _shape_fields(body, memory_mb, cpus, disk_mb, pids, ttl, idle_timeout, labels, env, priority)
    for key, value in (("pool_min", pool_min), ("pool_max", pool_max), ("version", version)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{key} must be an int")
            body[key] = value
    return body


def template_create(name: str, **fields: Any) -> Request:
    """POST /v1/templates (409 when the name exists)."""
    body = template_body(name, **fields)
    if "version" in body:
        raise ValueError("version is for put_template (a compare-and-set replace)")
    return json_request("POST", TEMPLATES, body)


def template_put(name: str, **fields: Any) -> Request:
    """PUT /v1/templates/{name}: create or replace (with ``version``: only that version)."""
    return json_request("PUT", f"{TEMPLATES}/{_segment(name, 'template name')}", template_body(name, **fields))


def template_get(name: str) -> Request:
    """GET /v1/templates/{name}."""
    return Request("GET", f"{TEMPLATES}/{_segment(name, 'template name')}")


def template_list() -> Request:
    """GET /v1/templates."""
    return Request("GET", TEMPLATES)


def template_delete(name: str) -> Request:
    """DELETE /v1/templates/{name}."""
    return Request("DELETE", f"{TEMPLATES}/{_segment(name, 'template name')}")


def pools() -> Request:
    """GET /v1/pools."""
    return Request("GET", "/v1/pools")


def job_body(name: Optional[str] = None, lease: Optional[Seconds] = None, grace: Optional[Seconds] = None,
             max_sandboxes: Optional[int] = None, max_memory_mb: Optional[int] = None,
             max_cpus: Optional[float] = None, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The ``JobSpec`` JSON object (quota fields left as None: no limit)."""
    body: Dict[str, Any] = {}
    if name is not None:
        body["name"] = str(name)
    lease_s = whole_seconds(lease, "lease")
    if lease_s is not None:
        body["lease_seconds"] = lease_s
    grace_s = whole_seconds(grace, "grace")
    if grace_s is not None:
        body["grace_seconds"] = grace_s
    quota: Dict[str, Any] = {}
    if max_sandboxes is not None:
        quota["sandboxes"] = int(max_sandboxes)
    if max_memory_mb is not None:
        quota["memory_mb"] = int(max_memory_mb)
    if max_cpus is not None:
        quota["cpus"] = float(max_cpus)
    if quota:
        body["quota"] = quota
    if labels:
        body["labels"] = {str(k): str(v) for k, v in labels.items()}
    return body


def job_create(**spec: Any) -> Request:
    """POST /v1/jobs (``spec`` as the keywords of :func:`job_body`)."""
    return json_request("POST", JOBS, job_body(**spec))


def job_get(job_id: str) -> Request:
    """GET /v1/jobs/{id}."""
    return Request("GET", f"{JOBS}/{_segment(job_id, 'job id')}")


def job_list(all_: bool = False) -> Request:
    """GET /v1/jobs[?all=true]."""
    return Request("GET", JOBS, query=[("all", "true")] if all_ else [])


def job_heartbeat(job_id: str, timeout: Any = DEFAULT) -> Request:
    """POST /v1/jobs/{id}/heartbeat. Renewing changes nothing twice: it may be retried
    without a key (and gets none, so the daemon records nothing)."""
    return Request("POST", f"{JOBS}/{_segment(job_id, 'job id')}/heartbeat", stateless=True, timeout=timeout)


def job_end(job_id: str) -> Request:
    """DELETE /v1/jobs/{id}."""
    return Request("DELETE", f"{JOBS}/{_segment(job_id, 'job id')}")


def job_end_step(job_id: str, step: str) -> Request:
    """DELETE /v1/jobs/{id}/steps/{step}."""
    return Request("DELETE", f"{JOBS}/{_segment(job_id, 'job id')}/steps/{_segment(step, 'step')}")


def metrics() -> Request:
    """GET /metrics as Prometheus text."""
    req = Request("GET", "/metrics")
    req.headers["Accept"] = "text/plain"
    return req


def get(sandbox_id: str) -> Request:
    """GET /v1/sandboxes/{id}."""
    return Request("GET", sandbox_path(sandbox_id))


def delete(sandbox_id: str) -> Request:
    """DELETE /v1/sandboxes/{id}."""
    return Request("DELETE", sandbox_path(sandbox_id))


def list_(labels: Optional[Mapping[str, str]], state: Optional[str], all_: bool) -> Request:
    """GET /v1/sandboxes with repeated ``label=k=v`` filters."""
    query: List[Tuple[str, str]] = []
    for k, v in (labels or {}).items():
        query.append(("label", f"{k}={v}"))
    if state:
        query.append(("state", state))
    if all_:
        query.append(("all", "true"))
    return Request("GET", SANDBOXES, query=query)


def exec_body(
    cmd: Command,
    *,
    timeout: Optional[Seconds],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    user: Optional[int],
    stdin: Optional[Union[bytes, str]],
    max_output_bytes: Optional[int],
) -> Dict[str, Any]:
    """The ``ExecRequest`` JSON object (without ``stream``)."""
    if isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (run by /bin/sh -c) or a sequence of str (argv)")
    if isinstance(cmd, str):
        cmd_json: Any = cmd
    else:
        cmd_json = [str(a) for a in cmd]
        if not cmd_json:
            raise ValueError("cmd must not be empty")
    body: Dict[str, Any] = {"cmd": cmd_json}
    t = seconds(timeout, "timeout")
    if t is not None:
        body["timeout"] = t
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = int(user)
    if stdin is not None:
        body["stdin"] = base64.b64encode(to_bytes(stdin, "stdin")).decode("ascii")
    if max_output_bytes is not None:
        body["max_output_bytes"] = int(max_output_bytes)
    return body


def to_bytes(data: Union[bytes, bytearray, memoryview, str], name: str = "data") -> bytes:
    """bytes as they are, str encoded as UTF-8; anything else is a TypeError."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{name} must be bytes or str, not {type(data).__name__}")


def command_read_timeout(timeout: Optional[Seconds], client_timeout: Optional[float]) -> Optional[float]:
    """Read timeout of a call that waits for a command: its timeout plus the client's
    timeout as slack, or unlimited when the command has none (it may run for hours)."""
    t = seconds(timeout, "timeout")
    if t is not None and t > 0:
        return t + (client_timeout if client_timeout is not None else 60.0)
    return None


def exec_(sandbox_id: str, cmd: Command, *, stream: bool, client_timeout: Optional[float], **opts: Any) -> Request:
    """POST /v1/sandboxes/{id}/exec (``opts`` as the keywords of :func:`exec_body`)."""
    body = exec_body(cmd, **opts)
    if stream:
        body["stream"] = True
    req = json_request("POST", sandbox_path(sandbox_id, "/exec"), body,
                       timeout=command_read_timeout(opts["timeout"], client_timeout))
    if stream:
        req.headers["Accept"] = "application/x-ndjson, application/json"
    return req


def process_start(sandbox_id: str, cmd: Command, *, stdin_open: bool, **opts: Any) -> Request:
    """POST /v1/sandboxes/{id}/processes: start a background process (``opts`` as for :func:`exec_body`)."""
    body = exec_body(cmd, **opts)
    if stdin_open:
        body["stdin_open"] = True
    return json_request("POST", sandbox_path(sandbox_id, "/processes"), body)


def _pid_path(sandbox_id: str, pid: int, suffix: str = "") -> str:
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise TypeError("pid must be an int")
    return sandbox_path(sandbox_id, f"/processes/{pid}{suffix}")


def process_list(sandbox_id: str) -> Request:
    """GET /v1/sandboxes/{id}/processes."""
    return Request("GET", sandbox_path(sandbox_id, "/processes"))


def process_get(sandbox_id: str, pid: int) -> Request:
    """GET /v1/sandboxes/{id}/processes/{pid}."""
    return Request("GET", _pid_path(sandbox_id, pid))


def process_wait(sandbox_id: str, pid: int, timeout: Optional[Seconds], client_timeout: Optional[float]) -> Request:
    """POST /v1/sandboxes/{id}/processes/{pid}/wait[?timeout=s]."""
    query: List[Tuple[str, str]] = []
    t = seconds(timeout, "timeout")
    if t is not None:
        query.append(("timeout", repr(float(t))))
    return Request("POST", _pid_path(sandbox_id, pid, "/wait"), query=query,
                   timeout=command_read_timeout(timeout, client_timeout))


def process_stdin(sandbox_id: str, pid: int, data: Union[bytes, bytearray, memoryview, str], eof: bool) -> Request:
    """POST /v1/sandboxes/{id}/processes/{pid}/stdin[?eof=true] with the raw bytes."""
    query: List[Tuple[str, str]] = [("eof", "true")] if eof else []
    return Request("POST", _pid_path(sandbox_id, pid, "/stdin"), query=query,
                   body=to_bytes(data), content_type="application/octet-stream")


def process_signal(sandbox_id: str, pid: int, signal: int) -> Request:
    """POST /v1/sandboxes/{id}/processes/{pid}/signal."""
    return json_request("POST", _pid_path(sandbox_id, pid, "/signal"), {"signal": int(signal)})


def tar_put(sandbox_id: str, path: str, archive: bytes, timeout: Any = DEFAULT) -> Request:
    """PUT /v1/sandboxes/{id}/files/tar?path=...: unpack ``archive`` under ``path``."""
    return Request("PUT", sandbox_path(sandbox_id, "/files/tar"), query=_path_query(path),
                   body=archive, content_type="application/x-tar", timeout=timeout)


def tar_get(sandbox_id: str, path: str, timeout: Any = DEFAULT) -> Request:
    """GET /v1/sandboxes/{id}/files/tar?path=...: the tree under ``path`` as one tar."""
    req = Request("GET", sandbox_path(sandbox_id, "/files/tar"), query=_path_query(path), timeout=timeout)
    req.headers["Accept"] = "application/x-tar, application/json"
    return req


def _path_query(path: str) -> List[Tuple[str, Union[str, bytes]]]:
    if not isinstance(path, str) or not path:
        raise ValueError("path must be a non-empty string")
    # As os.fsencode does: a name listed with bytes that are not UTF-8 (FileEntry.path,
    # surrogate-escaped) goes back as those bytes, percent-encoded.
    return [("path", path.encode("utf-8", "surrogateescape"))]


def file_write(sandbox_id: str, path: str, data: Union[bytes, bytearray, memoryview, str], mode: Optional[int]) -> Request:
    """PUT /v1/sandboxes/{id}/files?path=...&mode=<octal>."""
    body = to_bytes(data)
    query = _path_query(path)
    if mode is not None:
        query.append(("mode", format(int(mode), "o")))
    return Request("PUT", sandbox_path(sandbox_id, "/files"), query=query, body=body,
                   content_type="application/octet-stream")


def file_read(sandbox_id: str, path: str) -> Request:
    """GET /v1/sandboxes/{id}/files?path=..."""
    req = Request("GET", sandbox_path(sandbox_id, "/files"), query=_path_query(path))
    req.headers["Accept"] = "application/octet-stream, application/json"
    return req


def file_list(sandbox_id: str, path: str) -> Request:
    """GET /v1/sandboxes/{id}/files/list?path=..."""
    return Request("GET", sandbox_path(sandbox_id, "/files/list"), query=_path_query(path))


def file_stat(sandbox_id: str, path: str) -> Request:
    """GET /v1/sandboxes/{id}/files/stat?path=..."""
    return Request("GET", sandbox_path(sandbox_id, "/files/stat"), query=_path_query(path))


def file_remove(sandbox_id: str, path: str, recursive: bool) -> Request:
    """DELETE /v1/sandboxes/{id}/files?path=...&recursive=..."""
    query = _path_query(path)
    if recursive:
        query.append(("recursive", "true"))
    return Request("DELETE", sandbox_path(sandbox_id, "/files"), query=query)


def file_mkdir(sandbox_id: str, path: str, parents: bool) -> Request:
    """POST /v1/sandboxes/{id}/files/mkdir?path=...&parents=..."""
    query = _path_query(path)
    if parents:
        query.append(("parents", "true"))
    return Request("POST", sandbox_path(sandbox_id, "/files/mkdir"), query=query)


# -- the trajectory log ------------------------------------------------------------


def log_(sandbox_id: str, after: int = 0, limit: Optional[int] = None, output: bool = False,
         follow: bool = False) -> Request:
    """GET /v1/sandboxes/{id}/log: the sandbox's history after the cursor ``after`` (a seq);
    with ``follow`` an NDJSON stream that lasts until the sandbox ends."""
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise ValueError("after must be an int >= 0")
    query: List[Tuple[str, str]] = [("after", str(after))]
    if limit is not None:
        query.append(("limit", str(int(limit))))
    if output:
        query.append(("output", "true"))
    if follow:
        query.append(("follow", "true"))
    req = Request("GET", sandbox_path(sandbox_id, "/log"), query=query, timeout=None if follow else DEFAULT)
    if follow:
        req.headers["Accept"] = "application/x-ndjson, application/json"
    return req


def log_result(sandbox_id: str, key: str) -> Request:
    """GET /v1/sandboxes/{id}/log/result?key=K: the recorded answer of a keyed call (the
    daemon waits while that call is still being answered)."""
    if not isinstance(key, str) or not key:
        raise ValueError("key must be a non-empty string")
    req = Request("GET", sandbox_path(sandbox_id, "/log/result"), query=[("key", key)], timeout=None)
    req.headers["Accept"] = "application/json, application/x-ndjson"
    return req


def replay(sandbox_id: str, to_step: Optional[int] = None, to_key: Optional[str] = None,
           branch: bool = False, keep: bool = False,
           rekey: Optional[Tuple[str, str]] = None) -> Request:
    """POST /v1/sandboxes/{id}/replay: its log re-run into a fresh sandbox (a long call:
    no read timeout)."""
    body: Dict[str, Any] = {}
    if to_step is not None:
        if isinstance(to_step, bool) or not isinstance(to_step, int) or to_step < 1:
            raise ValueError("to_step must be an int >= 1")
        body["to_step"] = to_step
    if to_key is not None:
        body["to_key"] = to_key
    if branch:
        body["branch"] = True
    if keep:
        body["keep"] = True
    if rekey is not None:
        body["rekey"] = {"from": rekey[0], "to": rekey[1]}
    return json_request("POST", sandbox_path(sandbox_id, "/replay"), body, timeout=None)
# -- the function tier ------------------------------------------------------------

FUNCTIONS = "/v1/functions"

_RUN_FIELDS = ("language", "source", "stdin", "timeout", "memory_mb", "files", "args", "env",
               "fetch_files", "compile_timeout", "max_output_bytes", "pids")
_CASE_FIELDS = ("stdin", "args", "files", "env")


def _files_json(files: Optional[Mapping[str, Union[bytes, str]]]) -> Dict[str, str]:
    return {str(k): base64.b64encode(to_bytes(v, f"files[{k!r}]")).decode("ascii") for k, v in (files or {}).items()}


def _stdin_fields(stdin: Optional[Union[bytes, str]], body: Dict[str, Any]) -> None:
    if stdin is None:
        return
    if isinstance(stdin, str):
        body["stdin"] = stdin
    else:
        body["stdin_b64"] = base64.b64encode(to_bytes(stdin, "stdin")).decode("ascii")


def run_code_body(
    language: Optional[str] = None,
    source: Optional[str] = None,
    *,
    stdin: Optional[Union[bytes, str]] = None,
    timeout: Optional[Seconds] = None,
    memory_mb: Optional[int] = None,
    files: Optional[Mapping[str, Union[bytes, str]]] = None,
    args: Optional[Sequence[str]] = None,
    env: Optional[Mapping[str, str]] = None,
    fetch_files: Optional[Sequence[str]] = None,
    compile_timeout: Optional[Seconds] = None,
    max_output_bytes: Optional[int] = None,
    pids: Optional[int] = None,
) -> Dict[str, Any]:
    """The ``FunctionRun`` JSON object. Fields left as None take the daemon's defaults."""
    body: Dict[str, Any] = {}
    if language is not None:
        body["language"] = str(language)
    if source is not None:
        if not isinstance(source, str):
            raise TypeError("source must be a str (the program's text)")
        body["source"] = source
    _stdin_fields(stdin, body)
    for name, value in (("timeout", timeout), ("compile_timeout", compile_timeout)):
        s = seconds(value, name)
        if s is not None:
            body[name] = s
    if memory_mb is not None:
        body["memory_mb"] = int(memory_mb)
    if max_output_bytes is not None:
        body["max_output_bytes"] = int(max_output_bytes)
    if pids is not None:
        body["pids"] = int(pids)
    if files:
        body["files"] = _files_json(files)
    if args:
        if isinstance(args, (str, bytes)):
            raise TypeError("args must be a sequence of str")
        body["args"] = [str(a) for a in args]
    if env:
        body["env"] = {str(k): str(v) for k, v in env.items()}
    if fetch_files:
        body["fetch_files"] = [str(f) for f in fetch_files]
    return body


def _run_read_timeout(body: Mapping[str, Any], client_timeout: Optional[float]) -> Optional[float]:
    # The run's own limits (the daemon's default is 10 s each) plus the client's timeout as
    # slack for queueing and transfer.
    limit = float(body.get("timeout") or 10.0) + float(body.get("compile_timeout") or 10.0)
    return limit + (client_timeout if client_timeout is not None else 60.0)


def run_code(client_timeout: Optional[float], **fields: Any) -> Request:
    """POST /v1/functions/run (``fields`` as the keywords of :func:`run_code_body`)."""
    body = run_code_body(**fields)
    return json_request("POST", FUNCTIONS + "/run", body, timeout=_run_read_timeout(body, client_timeout),
                        stateless=True)


def run_code_batch(runs: Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]) -> Request:
    """POST /v1/functions/batch. Each run is a mapping of :func:`run_code_body` keywords,
    over ``defaults``. Runs that share their language and source and differ only in
    stdin, args, files or env go as one program with cases (the daemon compiles it once
    either way; this also sends the source once)."""
    if isinstance(runs, Mapping) or isinstance(runs, (str, bytes)):
        raise TypeError("runs must be a sequence of mappings")
    runs = list(runs)
    if not runs:
        raise ValueError("runs must not be empty")
    for r in runs:
        if not isinstance(r, Mapping):
            raise TypeError("each run must be a mapping of run_code keywords")
        unknown = set(r) - set(_RUN_FIELDS)
        if unknown:
            raise TypeError(f"unknown run field(s): {', '.join(sorted(unknown))}")
    unknown = set(defaults) - set(_RUN_FIELDS)
    if unknown:
        raise TypeError(f"unknown field(s): {', '.join(sorted(unknown))}")
    if all(set(r) <= set(_CASE_FIELDS) for r in runs) and "language" in defaults and "source" in defaults:
        body = run_code_body(**defaults)
        cases = []
        for r in runs:
            case = run_code_body(**r)
            cases.append({k: v for k, v in case.items() if k in ("stdin", "stdin_b64", "args", "files", "env")})
        body["cases"] = cases
    else:
        body = {"runs": [run_code_body(**{**defaults, **r}) for r in runs]}
    # A batch takes as long as it takes: no read timeout.
    return json_request("POST", FUNCTIONS + "/batch", body, timeout=None, stateless=True)


def fn_languages() -> Request:
    """GET /v1/functions/languages."""
    return Request("GET", FUNCTIONS + "/languages")


def fn_status() -> Request:
    """GET /v1/functions."""
    return Request("GET", FUNCTIONS)
