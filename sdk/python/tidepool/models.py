"""Plain data returned by the SDK: sandbox descriptions, command results, file entries.

These are immutable-ish dataclasses built from the daemon's JSON (``api/openapi.yaml``).
Parsing lives here, apart from any transport, so that the synchronous and the asyncio
clients share it. Unknown fields from newer daemons are kept in ``raw`` and never break
parsing.
"""
from __future__ import annotations

import base64
import binascii
import datetime as _dt
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Generic, List, Mapping, NamedTuple, Optional, TypeVar, Union

from .errors import CommandFailed, SandboxError, Timeout, error_from_response

__all__ = ["SandboxInfo", "ExecResult", "OutputChunk", "FileEntry", "ProcessInfo", "BatchError",
           "BatchResult", "parse_entries", "LogEntry", "ReplayReport", "Divergence",
           "StepResult", "RunResult", "parse_run_batch", "Template", "Pool", "JobInfo", "BatchItem"]

S = TypeVar("S")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _b64(value: Any) -> bytes:
    if not value:
        return b""
    return base64.b64decode(value)


def _parse_time(value: Any) -> Optional[_dt.datetime]:
    """Parses an RFC 3339 timestamp; returns None for absent or unparsable values."""
    if not value or not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith("Z") or text.endswith("z"):
        text = text[:-1] + "+00:00"
    # Python < 3.11 fromisoformat accepts at most 6 fractional digits.
    if "." in text:
        head, _, rest = text.partition(".")
        digits = ""
        i = 0
        while i < len(rest) and rest[i].isdigit():
            digits += rest[i]
            i += 1
        text = head + "." + (digits[:6].ljust(6, "0")) + rest[i:]
    try:
        return _dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def _int(value: Any, default: Optional[int] = None) -> Optional[int]:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


@dataclass
class SandboxInfo:
    """What the daemon reports about one sandbox (schema ``Sandbox`` in the contract).

    Attributes mirror the JSON fields; times are timezone-aware ``datetime`` objects or
    ``None``; ``raw`` keeps the whole JSON object, including fields this SDK does not know.
    """

    id: str
    state: str
    tier: Optional[str] = None
    image: Optional[str] = None
    node: Optional[str] = None
    memory_mb: Optional[int] = None
    cpus: Optional[float] = None
    pids: Optional[int] = None
    disk_mb: Optional[int] = None
    ttl_seconds: Optional[int] = None
    idle_timeout_seconds: Optional[int] = None
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    created_at: Optional[_dt.datetime] = None
    expires_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None
    end_reason: Optional[str] = None
    priority: Optional[str] = None
    template: Optional[str] = None
    job: Optional[str] = None
    step: Optional[str] = None
    #: Whether a create handed out a warm-pool sandbox (None when the answer did not say).
    from_pool: Optional[bool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "SandboxInfo":
        """Builds a SandboxInfo from the daemon's JSON object."""
        cpus = obj.get("cpus")
        return cls(
            id=str(obj.get("id", "")),
            state=str(obj.get("state", "")),
            tier=obj.get("tier"),
            image=obj.get("image"),
            node=obj.get("node"),
            memory_mb=_int(obj.get("memory_mb")),
            cpus=float(cpus) if cpus is not None else None,
            pids=_int(obj.get("pids")),
            disk_mb=_int(obj.get("disk_mb")),
            ttl_seconds=_int(obj.get("ttl_seconds")),
            idle_timeout_seconds=_int(obj.get("idle_timeout_seconds")),
            labels=dict(obj.get("labels") or {}),
            env=dict(obj.get("env") or {}),
            created_at=_parse_time(obj.get("created_at")),
            expires_at=_parse_time(obj.get("expires_at")),
            ended_at=_parse_time(obj.get("ended_at")),
            end_reason=obj.get("end_reason") or None,
            priority=obj.get("priority") or None,
            template=obj.get("template") or None,
            job=obj.get("job") or None,
            step=obj.get("step") or None,
            raw=dict(obj),
        )

    @property
    def live(self) -> bool:
        """True while the sandbox can still run commands (creating, running or paused)."""
        return self.state in ("creating", "running", "paused")


class _TextOutput:
    """``stdout``/``stderr`` as text for results that hold ``stdout_bytes``/``stderr_bytes``."""

    stdout_bytes: bytes
    stderr_bytes: bytes

    @property
    def stdout(self) -> str:
        """Standard output decoded as UTF-8 (invalid bytes replaced)."""
        return _decode(self.stdout_bytes)

    @property
    def stderr(self) -> str:
        """Standard error decoded as UTF-8 (invalid bytes replaced)."""
        return _decode(self.stderr_bytes)


@dataclass(repr=False)
class ExecResult(_TextOutput):
    """Outcome of one command (schema ``ExecResult`` in the contract).

    A non-zero exit is a result, not an exception (unless ``check=True`` was passed).

    Attributes:
        exit_code: the exit status; -1 when the command was killed by a signal.
        signal: the signal that killed the command, or ``None``.
        stdout_bytes / stderr_bytes: raw output.
        duration: wall time in seconds, as measured inside the sandbox.
        timed_out: the per-call timeout fired and every process of the command was killed.
        oom_killed: the sandbox's memory limit killed the command.
        stdout_truncated / stderr_truncated: the stream exceeded its cap and was cut.
        max_rss_kb: peak resident memory of the command, when reported.
        pid: the command's pid inside the sandbox, when known (streaming calls).
    """

    exit_code: int
    signal: Optional[int] = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    duration: float = 0.0
    timed_out: bool = False
    oom_killed: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    max_rss_kb: Optional[int] = None
    pid: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:
        def short(b: bytes) -> str:
            return repr(b) if len(b) <= 200 else f"{b[:200]!r}...(+{len(b) - 200} bytes)"
        parts = [f"exit_code={self.exit_code}"]
        if self.signal:
            parts.append(f"signal={self.signal}")
        for flag in ("timed_out", "oom_killed", "stdout_truncated", "stderr_truncated"):
            if getattr(self, flag):
                parts.append(f"{flag}=True")
        parts.append(f"duration={self.duration:.3f}")
        if self.max_rss_kb is not None:
            parts.append(f"max_rss_kb={self.max_rss_kb}")
        parts.append(f"stdout={short(self.stdout_bytes)}")
        parts.append(f"stderr={short(self.stderr_bytes)}")
        return f"ExecResult({', '.join(parts)})"


    @property
    def truncated(self) -> bool:
        """True when either output stream was cut at its cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 on its own (no signal, no timeout)."""
        return self.exit_code == 0 and not self.signal and not self.timed_out

    @classmethod
    def from_json(
        cls,
        obj: Mapping[str, Any],
        stdout: Optional[bytes] = None,
        stderr: Optional[bytes] = None,
    ) -> "ExecResult":
        """Builds an ExecResult from the daemon's JSON.

        ``stdout``/``stderr`` override the (base64) fields of ``obj``; the streaming call
        passes the output it collected from the chunks.
        """
        signal = _int(obj.get("signal"))
        exit_code = _int(obj.get("exit_code"), -1)
        return cls(
            exit_code=exit_code if exit_code is not None else -1,
            signal=signal if signal else None,
            stdout_bytes=stdout if stdout is not None else _b64(obj.get("stdout")),
            stderr_bytes=stderr if stderr is not None else _b64(obj.get("stderr")),
            duration=float(obj.get("duration") or 0.0),
            timed_out=bool(obj.get("timed_out", False)),
            oom_killed=bool(obj.get("oom_killed", False)),
            stdout_truncated=bool(obj.get("stdout_truncated", False)),
            stderr_truncated=bool(obj.get("stderr_truncated", False)),
            max_rss_kb=_int(obj.get("max_rss_kb")),
            pid=_int(obj.get("pid")),
            raw=dict(obj),
        )


@dataclass(frozen=True)
class OutputChunk:
    """One piece of output from :meth:`Sandbox.exec_stream`, in production order.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: the raw bytes (a chunk may end in the middle of a UTF-8 sequence or a line).
    """

    stream: str
    data: bytes

    @property
    def text(self) -> str:
        """The chunk decoded as UTF-8 with invalid bytes replaced."""
        return _decode(self.data)


@dataclass
class FileEntry:
    """A file, directory or symlink inside a sandbox (schema ``FileEntry``).

    Attributes:
        name: last path component.
        path: absolute path inside the sandbox.
        type: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        size: size in bytes.
        mode: permission bits (e.g. ``0o644``).
        mtime: modification time, seconds since the epoch.
        uid / gid: owner inside the sandbox.
        link_target: target of a symlink, else ``None``.
    """

    name: str
    path: str
    type: str
    size: int = 0
    mode: int = 0
    mtime: float = 0.0
    uid: Optional[int] = None
    gid: Optional[int] = None
    link_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        """True for directories."""
        return self.type == "dir"

    @property
    def is_file(self) -> bool:
        """True for regular files."""
        return self.type == "file"

    @property
    def is_symlink(self) -> bool:
        """True for symbolic links."""
        return self.type == "symlink"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "FileEntry":
        """Builds a FileEntry from the daemon's JSON object."""
        # Names that are not UTF-8 come with their bytes in base64; they become str the
        # way os.fsdecode makes them (surrogateescape), and go back as those bytes.
        path = _fs_str(obj, "path") or ""
        name = _fs_str(obj, "name")
        if not name:
            name = path.rstrip("/").rsplit("/", 1)[-1] if path else ""
        return cls(
            name=str(name),
            path=path,
            type=str(obj.get("type") or "other"),
            size=_int(obj.get("size"), 0) or 0,
            mode=_int(obj.get("mode"), 0) or 0,
            mtime=float(obj.get("mtime") or 0.0),
            uid=_int(obj.get("uid")),
            gid=_int(obj.get("gid")),
            link_target=_fs_str(obj, "link_target") or None,
        )


def _fs_str(obj: Mapping[str, Any], key: str) -> Optional[str]:
    raw = obj.get(key + "_b64")
    if isinstance(raw, str):
        try:
            return base64.b64decode(raw, validate=True).decode("utf-8", "surrogateescape")
        except (ValueError, binascii.Error):
            pass
    value = obj.get(key)
    return None if value is None else str(value)


def parse_entries(obj: Mapping[str, Any]) -> List[FileEntry]:
    """Parses the ``{"entries": [...]}`` answer of a directory listing."""
    return [FileEntry.from_json(e) for e in obj.get("entries") or []]


@dataclass
class ProcessInfo:
    """A background process as the daemon describes it (schema ``Process``).

    Attributes:
        pid: handle of the process in its sandbox.
        os_pid: its pid inside the sandbox (as ``$$``, ``ps`` and ``/proc`` there show
            it), or ``None`` when it never ran.
        cmd: the argv it runs.
        state: ``"running"`` or ``"exited"``.
        started_at: when it started, or ``None``.
        stdout_bytes / stderr_bytes: output so far (only answers to a wait carry it).
        result: the command's result once it exited, else ``None``; its output fields
            hold everything the process printed.
    """

    pid: int
    cmd: List[str] = field(default_factory=list)
    state: str = "running"
    os_pid: Optional[int] = None
    started_at: Optional[_dt.datetime] = None
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    result: Optional[ExecResult] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def running(self) -> bool:
        """True while the process has not exited."""
        return self.state != "exited" and self.result is None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "ProcessInfo":
        """Builds a ProcessInfo from the daemon's JSON object."""
        out = _b64(obj.get("stdout"))
        err = _b64(obj.get("stderr"))
        result: Optional[ExecResult] = None
        res = obj.get("result")
        if isinstance(res, Mapping):
            # The result may carry the output itself, or leave it to the process fields.
            r_out = _b64(res.get("stdout")) or out
            r_err = _b64(res.get("stderr")) or err
            result = ExecResult.from_json(res, stdout=r_out, stderr=r_err)
            if result.pid is None:
                result.pid = _int(obj.get("pid"))
        cmd = obj.get("cmd")
        if isinstance(cmd, str):
            cmd_list = [cmd]
        else:
            cmd_list = [str(a) for a in (cmd or [])]
        return cls(
            pid=_int(obj.get("pid"), 0) or 0,
            os_pid=_int(obj.get("os_pid")),
            cmd=cmd_list,
            state=str(obj.get("state") or ("exited" if result is not None else "running")),
            started_at=_parse_time(obj.get("started_at")),
            stdout_bytes=out,
            stderr_bytes=err,
            result=result,
            raw=dict(obj),
        )


class BatchError(NamedTuple):
    """Why one item of a batch creation failed; unpacks as ``(index, code, message)``.

    Attributes:
        index: position of the item in the batch (0-based).
        code: the server's error code, e.g. ``"resource_exhausted"``.
        message: human-readable explanation.
    """

    index: int
    code: str
    message: str


def parse_batch_errors(obj: Mapping[str, Any]) -> List[BatchError]:
    """Parses the ``errors`` list of a batch answer."""
    out = []
    for e in obj.get("errors") or []:
        idx = _int(e.get("index"), -1)
        out.append(BatchError(-1 if idx is None else idx, str(e.get("code") or "internal"),
                              str(e.get("message") or "")))
    return out


@dataclass
class BatchResult(Generic[S]):
    """Outcome of ``create_batch``: the sandboxes that started, and why the others did not.

    Attributes:
        sandboxes: handles of the sandboxes that run (``Sandbox`` or ``AsyncSandbox``).
        errors: one :class:`BatchError` per item that failed.

    Iterating yields the sandboxes; ``len()`` counts them. As a context manager
    (``with`` for the sync client, ``async with`` for the asyncio one) every sandbox is
    killed on exit.
    """

    sandboxes: List[S] = field(default_factory=list)
    errors: List[BatchError] = field(default_factory=list)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.sandboxes)

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __getitem__(self, i: int) -> S:
        return self.sandboxes[i]

    @property
    def ok(self) -> bool:
        """True when every requested sandbox started."""
        return not self.errors

    def kill_all(self) -> None:
        """Kills every sandbox of the batch (sync client); errors are ignored."""
        for sb in self.sandboxes:
            try:
                sb.kill()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - best-effort cleanup
                pass

    async def akill_all(self) -> None:
        """Kills every sandbox of the batch concurrently (asyncio client); errors are ignored."""
        import asyncio

        await asyncio.gather(*(sb.kill() for sb in self.sandboxes), return_exceptions=True)  # type: ignore[attr-defined]

    def __enter__(self) -> "BatchResult[S]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill_all()

    async def __aenter__(self) -> "BatchResult[S]":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await run_shielded(self.akill_all())


async def _finish(task: Any) -> None:
    """Waits for ``task`` to end even if the waiter is cancelled again meanwhile."""
    import asyncio

    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            continue
        except Exception:  # noqa: BLE001 - the task's own error is reported by the caller
            break
    if not task.cancelled():
        task.exception()  # mark retrieved


async def run_shielded(aw: Awaitable[Any]) -> Any:
    """Runs ``aw`` to its end even when the waiter is cancelled meanwhile (cleanup that must
    complete, such as killing a sandbox); the cancellation propagates afterwards."""
    import asyncio

    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _finish(task)
        raise


# -- answers shared by the sync and asyncio clients --------------------------------


def parse_sandboxes(obj: Mapping[str, Any], make: Callable[[SandboxInfo], S]) -> List[S]:
    """The handles (built by ``make``) of a ``{"sandboxes": [...]}`` answer."""
    return [make(SandboxInfo.from_json(s)) for s in obj.get("sandboxes") or []]


def parse_batch(obj: Mapping[str, Any], make: Callable[[SandboxInfo], S]) -> "BatchResult[S]":
    """The :class:`BatchResult` of a batch-create answer, handles built by ``make``."""
    return BatchResult(parse_sandboxes(obj, make), parse_batch_errors(obj))


def parse_processes(obj: Mapping[str, Any]) -> List[ProcessInfo]:
    """Parses the ``{"processes": [...]}`` answer of a process listing."""
    return [ProcessInfo.from_json(p) for p in obj.get("processes") or []]


def checked(result: ExecResult, check: bool) -> ExecResult:
    """``result``, or :class:`CommandFailed` when ``check`` is set and the command failed."""
    if check and not result.ok:
        raise CommandFailed(result)
    return result


def wait_result(handle: Any, info: ProcessInfo, timeout: Any, check: bool) -> ExecResult:
    """Stores a wait answer in ``handle.info``; returns its result, or raises Timeout."""
    handle.info = info
    if info.result is None:
        raise Timeout("deadline_exceeded", f"process {info.pid or handle.pid} still running after {timeout}s", None)
    return checked(info.result, check)


def parse_exec_json(body: bytes) -> ExecResult:
    """An ExecResult from a plain JSON exec answer."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SandboxError("internal", f"malformed exec answer: {e}") from None
    return ExecResult.from_json(obj)


def chunks_of(result: ExecResult) -> List[OutputChunk]:
    """The output of a whole (non-streamed) result as the chunks a stream would have carried."""
    return [OutputChunk(name, data) for name, data in
            (("stdout", result.stdout_bytes), ("stderr", result.stderr_bytes)) if data]


class StreamParser:
    """Turns NDJSON exec events into chunks and the final result (shared by both clients).

    Feed lines with :meth:`feed`; it returns an :class:`OutputChunk`, an
    :class:`ExecResult` (the end), or None for events that carry nothing to yield.
    """

    def __init__(self) -> None:
        self.out: List[bytes] = []
        self.err: List[bytes] = []
        self.pid: Optional[int] = None

    def feed(self, line: bytes) -> Union[OutputChunk, ExecResult, None]:
        """Parses one line; raises the daemon's error for an ``error`` event."""
        line = line.strip()
        if not line:
            return None
        try:
            ev = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise SandboxError("internal", f"malformed stream event {line[:200]!r}: {e}") from None
        kind = ev.get("type")
        if kind in ("stdout", "stderr"):
            data = base64.b64decode(ev.get("data") or "")
            if not data:
                return None
            (self.out if kind == "stdout" else self.err).append(data)
            return OutputChunk(kind, data)
        if kind == "started":
            self.pid = ev.get("pid")
            return None
        if kind == "exit":
            if self.pid is not None and "pid" not in ev:
                ev = dict(ev, pid=self.pid)
            return ExecResult.from_json(ev, stdout=b"".join(self.out), stderr=b"".join(self.err))
        if kind == "error":
            raise error_from_response(None, ev.get("code"), str(ev.get("message", "")))
        # Unknown event types from newer daemons are ignored.
        return None

    @staticmethod
    def missing_exit() -> SandboxError:
        """The error for a stream that ended before its ``exit`` event."""
        return SandboxError("internal", "exec stream ended without an exit status")


# -- the trajectory log ------------------------------------------------------------


@dataclass
class LogEntry:
    """One record of a sandbox's trajectory log (schema ``LogEntry``).

    Attributes:
        seq: its place in the log, from 1; the cursor to resume a listing or a follow after.
        kind: ``"call"`` (an answered state-changing call) or ``"event"`` (created,
            process_exit, ended, replay, replay_finished).
        time: when the call was answered (or the event happened).
        key: the call's Idempotency-Key, None for a call without one (and for events).
        method / target: the call (target is path and query, as sent).
        status: the HTTP status it was answered with.
        result: the answer in a few fields (exit_code, signal, stdout_bytes, path, ...).
        request: method-independent facts of the request: bytes, sha256, body (JSON bodies).
        caller: who made the call (transport, uid or key_id).
        event / detail: an event's name and what it carries.
        answer: the recorded answer's bytes, when the listing asked for output.
        duration_ms: from the request's arrival to its answer.
    """

    seq: int
    kind: str
    time: Optional[_dt.datetime] = None
    key: Optional[str] = None
    method: Optional[str] = None
    target: Optional[str] = None
    status: Optional[int] = None
    result: Dict[str, Any] = field(default_factory=dict)
    request: Dict[str, Any] = field(default_factory=dict)
    caller: Dict[str, Any] = field(default_factory=dict)
    event: Optional[str] = None
    detail: Dict[str, Any] = field(default_factory=dict)
    answer: Optional[bytes] = None
    duration_ms: Optional[float] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "LogEntry":
        """Builds a LogEntry from the daemon's JSON (unknown fields stay in ``raw``)."""
        return cls(
            seq=_int(obj.get("seq"), 0) or 0,
            kind=str(obj.get("kind") or ""),
            time=_parse_time(obj.get("time")),
            key=obj.get("key"),
            method=obj.get("method"),
            target=obj.get("target"),
            status=_int(obj.get("status")),
            result=dict(obj.get("result") or {}),
            request=dict(obj.get("request") or {}),
            caller=dict(obj.get("caller") or {}),
            event=obj.get("event"),
            detail=dict(obj.get("detail") or {}),
            answer=_b64(obj["answer"]) if "answer" in obj else None,
            duration_ms=obj.get("duration_ms"),
            raw=dict(obj),
        )

    def exec_result(self) -> Optional[ExecResult]:
        """The command's result when this is an exec call listed with output, else None."""
        if self.kind != "call" or self.answer is None or not (self.target or "").split("?")[0].endswith("/exec"):
            return None
        if self.status != 200:
            return None
        return parse_answer(self.raw.get("content_type") or "", self.answer)


def parse_log(obj: Mapping[str, Any]) -> List[LogEntry]:
    return [LogEntry.from_json(e) for e in obj.get("entries") or []]


def parse_answer(content_type: str, body: bytes) -> Any:
    """A recorded answer: an :class:`ExecResult` for a command's (plain or streamed),
    else the decoded JSON (None for an empty body)."""
    ct = content_type.split(";")[0].strip().lower()
    if ct == "application/x-ndjson":
        parser = StreamParser()
        for line in body.splitlines():
            item = parser.feed(line)
            if isinstance(item, ExecResult):
                return item
        raise parser.missing_exit()
    if not body:
        return None
    try:
        obj = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SandboxError("internal", f"malformed recorded answer: {e}") from None
    if isinstance(obj, dict) and "exit_code" in obj and "stdout" in obj:
        return ExecResult.from_json(obj)
    return obj


@dataclass
class Divergence:
    """Where a replayed step's answer first differed from the recorded one."""

    seq: int
    key: Optional[str]
    call: str
    field: str
    recorded: str
    replayed: str


@dataclass
class ReplayReport(Generic[S]):
    """The outcome of :meth:`Sandbox.replay` / :meth:`Trajectory.replay`.

    Attributes:
        source: the sandbox whose log was replayed.
        sandbox: the fresh sandbox the steps ran in (a live handle when ``kept``).
        kept: it still runs (a branch, or ``keep=True``); else it was removed.
        to_step: the last seq replayed up to.
        replayed: calls re-run; skipped: seqs of calls not re-run.
        matched: every replayed answer matched the record.
        first_divergence: the first step that differed, None when all matched.
        divergences: how many steps differed.
        notes: what the daemon had to do differently (e.g. an image that changed).
    """

    source: str
    sandbox: Optional[S]
    kept: bool
    to_step: int
    replayed: int
    skipped: List[int]
    matched: bool
    divergences: int
    first_divergence: Optional[Divergence]
    notes: List[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def parse_replay(obj: Mapping[str, Any], make: Callable[[SandboxInfo], S]) -> "ReplayReport[S]":
    d = obj.get("first_divergence")
    sb = obj.get("sandbox")
    return ReplayReport(
        source=str(obj.get("source") or ""),
        sandbox=make(SandboxInfo.from_json(sb)) if isinstance(sb, dict) else None,
        kept=bool(obj.get("kept")),
        to_step=_int(obj.get("to_step"), 0) or 0,
        replayed=_int(obj.get("replayed"), 0) or 0,
        skipped=[int(s) for s in obj.get("skipped") or []],
        matched=bool(obj.get("matched")),
        divergences=_int(obj.get("divergences"), 0) or 0,
        first_divergence=Divergence(
            seq=int(d.get("seq") or 0), key=d.get("key"), call=str(d.get("call") or ""),
            field=str(d.get("field") or ""), recorded=str(d.get("recorded") or ""),
            replayed=str(d.get("replayed") or "")) if isinstance(d, dict) else None,
        notes=[str(n) for n in obj.get("notes") or []],
        raw=dict(obj),
    )
def _text_or_b64(obj: Mapping[str, Any], key: str) -> bytes:
    """Output the daemon sent as text, or as base64 in ``<key>_b64`` when it was not UTF-8."""
    b64 = obj.get(key + "_b64")
    if b64:
        return base64.b64decode(b64)
    return str(obj.get(key) or "").encode("utf-8")


@dataclass(repr=False)
class StepResult(_TextOutput):
    """One step of a function-tier run (the compile step, or the run itself).

    Attributes:
        verdict: ``"ok"``, ``"runtime_error"``, ``"time_limit"``, ``"memory_limit"``,
            ``"output_limit"`` or ``"compile_error"``.
        exit_code: the exit status, ``None`` when killed by a signal (or not run).
        signal: the signal that ended it, 0 if none.
        stdout_bytes / stderr_bytes: its output (``stdout``/``stderr``: decoded).
        wall_time / cpu_time: seconds, as measured by the zygote (CPU: user + system).
        memory_peak_bytes: the peak of its own memory cgroup.
        error: why the program could not be started (e.g. ``execve ./test: ...``), else "".
    """

    verdict: str
    exit_code: Optional[int] = None
    signal: int = 0
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time: float = 0.0
    cpu_time: float = 0.0
    memory_peak_bytes: int = 0
    error: str = ""


    @property
    def ok(self) -> bool:
        """True when the verdict is ``"ok"`` (exit status 0, no limit hit)."""
        return self.verdict == "ok"

    def __repr__(self) -> str:
        out = self.stdout_bytes if len(self.stdout_bytes) <= 100 else self.stdout_bytes[:100] + b"..."
        return (f"{type(self).__name__}(verdict={self.verdict!r}, exit_code={self.exit_code}, "
                f"wall_time={self.wall_time:.4f}, stdout={out!r})")

    @classmethod
    def _fields(cls, obj: Mapping[str, Any]) -> Dict[str, Any]:
        return dict(
            verdict=str(obj.get("verdict") or ""),
            exit_code=_int(obj.get("exit_code")),
            signal=_int(obj.get("signal"), 0) or 0,
            stdout_bytes=_text_or_b64(obj, "stdout"),
            stderr_bytes=_text_or_b64(obj, "stderr"),
            stdout_truncated=bool(obj.get("stdout_truncated", False)),
            stderr_truncated=bool(obj.get("stderr_truncated", False)),
            wall_time=float(obj.get("wall_ms") or 0.0) / 1000.0,
            cpu_time=float(obj.get("cpu_ms") or 0.0) / 1000.0,
            memory_peak_bytes=_int(obj.get("memory_peak_bytes"), 0) or 0,
            error=str(obj.get("error") or ""),
        )

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "StepResult":
        """Builds a StepResult from the daemon's JSON (schema ``FunctionStep``)."""
        return cls(**cls._fields(obj))


@dataclass(repr=False)
class RunResult(StepResult):
    """The outcome of :meth:`Client.run_code` (schema ``FunctionResult`` in the contract).

    A program that fails is a result with its ``verdict``, not an exception. The fields
    of :class:`StepResult` describe the run itself; besides them:

    Attributes:
        compile: the compile step of a compiled language (``None`` otherwise).
        compile_cached: the program was compiled by an earlier call (or one running alongside).
        files: the fetched files (``fetch_files``) by name.
        missing_files: fetched names that were not there (or not regular files).
        queue_time / server_time: seconds waiting for a worker / in the daemon in all.
    """

    compile: Optional[StepResult] = None
    compile_cached: bool = False
    files: Dict[str, bytes] = field(default_factory=dict)
    missing_files: List[str] = field(default_factory=list)
    queue_time: float = 0.0
    server_time: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "RunResult":
        """Builds a RunResult from the daemon's JSON (schema ``FunctionResult``)."""
        comp = obj.get("compile")
        return cls(
            **cls._fields(obj),
            compile=StepResult.from_json(comp) if isinstance(comp, Mapping) else None,
            compile_cached=bool(obj.get("compile_cached", False)),
            files={str(k): base64.b64decode(v) for k, v in (obj.get("files") or {}).items()},
            missing_files=[str(x) for x in obj.get("missing_files") or []],
            queue_time=float(obj.get("queue_ms") or 0.0) / 1000.0,
            server_time=float(obj.get("server_ms") or 0.0) / 1000.0,
            raw=dict(obj),
        )


def parse_run_batch(obj: Mapping[str, Any]) -> List[Union[RunResult, Exception]]:
    """The results of a batch in request order; a run that could not complete is the
    exception a single run_code would have raised (an instance, not raised)."""
    out: List[Union[RunResult, Exception]] = []
    for item in obj.get("results") or []:
        err = item.get("error") if isinstance(item, Mapping) else None
        if isinstance(err, Mapping):
            out.append(error_from_response(None, str(err.get("code") or ""), str(err.get("message") or "")))
        else:
            out.append(RunResult.from_json(item))
    return out


# -- templates, pools and jobs ------------------------------------------------------


def _float(value: Any, default: Optional[float] = None) -> Optional[float]:
    if value is None:
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


@dataclass
class Pool:
    """The warm pool of one template (schema ``Pool``).

    Attributes:
        template: the template's name.
        ready: fresh sandboxes waiting to be handed out.
        creating: sandboxes being made for it now.
        target: how many it aims to hold (between ``min`` and ``max``, following demand).
        hits, misses: creates served from it, and those it had nothing for.
        hit_rate: ``hits / (hits + misses)`` (0 before any request).
        rate_per_second: the recent request rate it follows.
        cold_create_seconds: how long a cold create takes (what the pool hides).
    """

    template: str
    ready: int = 0
    creating: int = 0
    target: int = 0
    min: int = 0
    max: int = 0
    hits: int = 0
    misses: int = 0
    hit_rate: float = 0.0
    rate_per_second: float = 0.0
    cold_create_seconds: float = 0.0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Pool":
        """Builds a Pool from the daemon's JSON object."""
        ints = {k: _int(obj.get(k), 0) or 0 for k in ("ready", "creating", "target", "min", "max", "hits", "misses")}
        return cls(template=str(obj.get("template", "")), hit_rate=_float(obj.get("hit_rate"), 0.0) or 0.0,
                   rate_per_second=_float(obj.get("rate_per_second"), 0.0) or 0.0,
                   cold_create_seconds=_float(obj.get("cold_create_seconds"), 0.0) or 0.0, raw=dict(obj), **ints)


@dataclass
class Template:
    """A named sandbox shape with an optional warm pool (schema ``Template``).

    ``client.create(template=name)`` starts from it (a fresh sandbox of its pool when one
    is ready); fields given to ``create`` override it. ``version`` counts replacements
    (``put_template(..., version=v)`` replaces only that version).
    """

    name: str
    image: Optional[str] = None
    tier: Optional[str] = None
    memory_mb: Optional[int] = None
    cpus: Optional[float] = None
    pids: Optional[int] = None
    disk_mb: Optional[int] = None
    ttl_seconds: Optional[int] = None
    idle_timeout_seconds: Optional[int] = None
    env: Dict[str, str] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    priority: Optional[str] = None
    pool_min: int = 0
    pool_max: int = 0
    version: Optional[int] = None
    created_at: Optional[_dt.datetime] = None
    updated_at: Optional[_dt.datetime] = None
    pool: Optional[Pool] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Template":
        """Builds a Template from the daemon's JSON object."""
        pool = obj.get("pool")
        return cls(
            name=str(obj.get("name", "")), image=obj.get("image"), tier=obj.get("tier"),
            memory_mb=_int(obj.get("memory_mb")), cpus=_float(obj.get("cpus")), pids=_int(obj.get("pids")),
            disk_mb=_int(obj.get("disk_mb")), ttl_seconds=_int(obj.get("ttl_seconds")),
            idle_timeout_seconds=_int(obj.get("idle_timeout_seconds")), env=dict(obj.get("env") or {}),
            labels=dict(obj.get("labels") or {}), priority=obj.get("priority") or None,
            pool_min=_int(obj.get("pool_min"), 0) or 0, pool_max=_int(obj.get("pool_max"), 0) or 0,
            version=_int(obj.get("version")), created_at=_parse_time(obj.get("created_at")),
            updated_at=_parse_time(obj.get("updated_at")),
            pool=Pool.from_json(pool) if isinstance(pool, Mapping) else None, raw=dict(obj))


@dataclass
class JobInfo:
    """What the daemon reports about a job (schema ``Job``).

    Attributes:
        id: the job id (give it to ``create(job=...)``).
        state: ``active``, ``lapsed`` (the lease ran out: its sandboxes are paused until
            a heartbeat) or ``ended``.
        quota: ``{"sandboxes", "memory_mb", "cpus"}`` limits (0: none).
        use: what its live sandboxes hold (``sandboxes``, ``memory_mb``, ``cpus``,
            ``paused``); only in answers of GET.
    """

    id: str
    state: str = ""
    name: str = ""
    lease_seconds: Optional[int] = None
    grace_seconds: Optional[int] = None
    quota: Dict[str, Any] = field(default_factory=dict)
    labels: Dict[str, str] = field(default_factory=dict)
    use: Optional[Dict[str, Any]] = None
    created_at: Optional[_dt.datetime] = None
    lease_expires_at: Optional[_dt.datetime] = None
    lapsed_at: Optional[_dt.datetime] = None
    ended_at: Optional[_dt.datetime] = None
    end_reason: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "JobInfo":
        """Builds a JobInfo from the daemon's JSON object."""
        use = obj.get("use")
        return cls(
            id=str(obj.get("id", "")), state=str(obj.get("state", "")), name=str(obj.get("name") or ""),
            lease_seconds=_int(obj.get("lease_seconds")), grace_seconds=_int(obj.get("grace_seconds")),
            quota=dict(obj.get("quota") or {}), labels=dict(obj.get("labels") or {}),
            use=dict(use) if isinstance(use, Mapping) else None, created_at=_parse_time(obj.get("created_at")),
            lease_expires_at=_parse_time(obj.get("lease_expires_at")), lapsed_at=_parse_time(obj.get("lapsed_at")),
            ended_at=_parse_time(obj.get("ended_at")), end_reason=obj.get("end_reason") or None, raw=dict(obj))


def parse_templates(obj: Mapping[str, Any]) -> List[Template]:
    """The ``{"templates": [...]}`` answer."""
    return [Template.from_json(t) for t in obj.get("templates") or []]


def parse_pools(obj: Mapping[str, Any]) -> List[Pool]:
    """The ``{"pools": [...]}`` answer."""
    return [Pool.from_json(p) for p in obj.get("pools") or []]


def parse_jobs(obj: Mapping[str, Any]) -> List[JobInfo]:
    """The ``{"jobs": [...]}`` answer."""
    return [JobInfo.from_json(j) for j in obj.get("jobs") or []]


@dataclass
class BatchItem(Generic[S]):
    """One line of a streamed batch: item ``index`` is ready (``sandbox``) or failed
    (``error``, the exception :meth:`create` would have raised, as a value)."""

    index: int
    sandbox: Optional[S] = None
    from_pool: bool = False
    error: Optional[Exception] = None


class BatchStreamParser(Generic[S]):
    """Turns the NDJSON lines of a streamed batch into :class:`BatchItem` values; the
    final ``done`` line is kept in ``done`` (a gang's failure raises its error)."""

    def __init__(self, make: Callable[[SandboxInfo], S]) -> None:
        self._make = make
        self.done: Optional[Dict[str, Any]] = None

    def feed(self, line: bytes) -> Optional["BatchItem[S]"]:
        """The item of one line; None for a blank line or the done line (then ``done``
        is set). Raises the batch's error when the done line says a gang failed."""
        line = line.strip()
        if not line:
            return None
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise SandboxError("internal", f"malformed batch stream line: {e}", None) from None
        if not isinstance(obj, dict):
            raise SandboxError("internal", "malformed batch stream line: not an object", None)
        if obj.get("done"):
            self.done = obj
            err = obj.get("error")
            if not obj.get("ok", True) and isinstance(err, Mapping) and obj.get("released") is not None:
                e = error_from_response(None, err.get("code"), str(err.get("message") or "gang batch failed"))
                e.released = [str(i) for i in obj.get("released") or []]  # type: ignore[attr-defined]
                raise e
            return None
        idx = _int(obj.get("index"), -1)
        index = -1 if idx is None else idx
        err = obj.get("error")
        if isinstance(err, Mapping):
            return BatchItem(index, error=error_from_response(None, err.get("code"), str(err.get("message") or "")))
        if "released" in obj and "sandbox" not in obj:
            return None  # made after a gang failed and deleted at once: the done line lists it
        sb = obj.get("sandbox")
        if not isinstance(sb, Mapping):
            raise SandboxError("internal", "batch stream line without sandbox or error", None)
        info = SandboxInfo.from_json(sb)
        info.from_pool = bool(obj.get("from_pool"))
        return BatchItem(index, self._make(info), info.from_pool)

    def missing_done(self) -> SandboxError:
        """The error of a stream that ended before its done line."""
        return SandboxError("internal", "batch stream ended before its summary line", None)
