"""What the sync and asyncio handles share, apart from I/O (internal).

:class:`Client`/:class:`AsyncClient`, :class:`Sandbox`/:class:`AsyncSandbox`,
:class:`Files`/:class:`AsyncFiles` and the two process handles derive from these
bases: configuration, descriptions, equality and the state kept between calls live
here once; the subclasses only send the requests of :mod:`tidepool._api` and parse the
answers with :mod:`tidepool.models`, blocking or with ``await``.

Thread rules: as for the concrete classes (no locking here).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Generic, List, Mapping, Optional, TypeVar

from . import _api
from ._http import Request
from .errors import TidepoolError
from .models import BatchError, BatchItem, BatchStreamParser, JobInfo, ProcessInfo, SandboxInfo
from .version import __version__

#: Where the client looks for the daemon when neither ``url`` nor ``TIDEPOOL_URL`` is given.
DEFAULT_URL = "http://127.0.0.1:7070"

USER_AGENT = f"tidepool-python/{__version__}"

#: The client type of a handle (Client or AsyncClient), so that ``sandbox.client`` is typed.
C = TypeVar("C", bound="ClientBase")


class ClientBase:
    """Configuration of a client: base URL and timeouts."""

    url: str
    timeout: Optional[float]

    def _configure(self, url: Optional[str], api_key: Optional[str], timeout: Optional[float]) -> Optional[str]:
        """Sets ``url`` and ``timeout``; returns the API key to send (None: none)."""
        self.url = (url or os.environ.get("TIDEPOOL_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout
        return api_key if api_key is not None else os.environ.get("TIDEPOOL_API_KEY") or None

    def _create_timeout(self) -> Optional[float]:
        # Creating includes building the root and starting the agent: allow for a slow host.
        return None if self.timeout is None else max(self.timeout, 120.0)

    def _create_request(self, count: Optional[int], fields: Mapping[str, Any], gang: bool = False,
                        stream: bool = False) -> Request:
        """The create (``count`` None) or batch-create request for the ``create`` arguments."""
        if count is None:
            return _api.create(timeout=self._create_timeout(), **fields)
        return _api.create_batch(count, timeout=self._create_timeout(), gang=gang, stream=stream, **fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"


def create_fields(image: Optional[str], tier: Optional[str], memory_mb: Optional[int], cpus: Optional[float],
                  ttl: Optional[_api.Seconds], idle_timeout: Optional[_api.Seconds],
                  labels: Optional[Mapping[str, str]], env: Optional[Mapping[str, str]],
                  disk_mb: Optional[int], pids: Optional[int], template: Optional[str] = None,
                  job: Optional[str] = None, step: Optional[str] = None,
                  priority: Optional[str] = None) -> Mapping[str, Any]:
    """The sandbox description arguments of ``create``/``create_batch`` as keywords of
    :func:`tidepool._api.create_body` (positional, so a caller passes them in one line)."""
    return dict(image=image, tier=tier, memory_mb=memory_mb, cpus=cpus, ttl=ttl,
                idle_timeout=idle_timeout, labels=labels, env=env, disk_mb=disk_mb, pids=pids,
                template=template, job=job, step=step, priority=priority)


def from_pool_header(headers: Mapping[str, str]) -> Optional[bool]:
    """The ``Tidepool-From-Pool`` answer header of a create (None when absent)."""
    value = headers.get("tidepool-from-pool")
    return None if value is None else value.strip().lower() == "true"


class FilesBase:
    """Holds the sandbox of a ``files`` accessor."""

    def __init__(self, sandbox: Any) -> None:
        self._sb = sandbox

    def _tar_put(self, remote_dir: str, archive: bytes) -> Request:
        return _api.tar_put(self._sb.id, remote_dir, archive, timeout=self._sb._client._create_timeout())

    def _tar_get(self, remote_dir: str) -> Request:
        return _api.tar_get(self._sb.id, remote_dir, timeout=self._sb._client._create_timeout())


class SandboxBase(Generic[C]):
    """Description, identity and command requests of a sandbox handle."""

    #: The files accessor class of the concrete handle.
    _files_class: Any = FilesBase
    #: Handles compare equal only within one family (sync or asyncio).
    _family: str = ""

    def __init__(self, client: C, info: SandboxInfo) -> None:
        self._client = client
        self.info: SandboxInfo = info
        self.files = self._files_class(self)

    @property
    def id(self) -> str:
        """The sandbox id (also its hostname), e.g. ``"n0-3fa9c21b7e04"``."""
        return self.info.id

    @property
    def state(self) -> str:
        """State at the last answer: creating, running, paused, stopping, stopped or lost."""
        return self.info.state

    @property
    def client(self) -> C:
        """The client this handle talks through."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        # Other description fields (labels, memory_mb, end_reason, ...) read through to info.
        if name.startswith("_") or name in ("info", "files"):
            raise AttributeError(name)
        try:
            return getattr(self.info, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!s} has no attribute {name!r}") from None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, state={self.state!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SandboxBase) and other._family == self._family and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def _killed(self, info: Optional[SandboxInfo]) -> None:
        """Records the answer of a kill (None: the daemon no longer knew the sandbox)."""
        if info is not None:
            self.info = info
        elif self.info.live:
            self.info.state = "stopped"

    def _exec_request(self, cmd: _api.Command, opts: Mapping[str, Any], stream: bool) -> Request:
        return _api.exec_(self.id, cmd, stream=stream, client_timeout=self._client.timeout, **opts)


def run_fields(language: str, source: str, stdin: Any, timeout: Any, memory_mb: Optional[int],
               files: Any, args: Any, env: Any, fetch_files: Any, compile_timeout: Any,
               max_output_bytes: Optional[int]) -> Mapping[str, Any]:
    """The ``run_code`` arguments as keywords of :func:`tidepool._api.run_code_body`."""
    return dict(language=language, source=source, stdin=stdin, timeout=timeout, memory_mb=memory_mb,
                files=files, args=args, env=env, fetch_files=fetch_files, compile_timeout=compile_timeout,
                max_output_bytes=max_output_bytes)


def command_opts(timeout: Optional[_api.Seconds], env: Optional[Mapping[str, str]], cwd: Optional[str],
                 user: Optional[int], stdin: Any, max_output_bytes: Optional[int]) -> Mapping[str, Any]:
    """The command arguments shared by ``exec``, ``exec_stream`` and ``start`` as keywords."""
    return dict(timeout=timeout, env=env, cwd=cwd, user=user, stdin=stdin, max_output_bytes=max_output_bytes)


class ProcessHandleBase:
    """Identity and requests of a background process handle."""

    def __init__(self, sandbox: Any, pid: int, info: Optional[ProcessInfo] = None) -> None:
        self.sandbox = sandbox
        self.pid: int = pid
        self.info: Optional[ProcessInfo] = info

    def __repr__(self) -> str:
        state = self.info.state if self.info else "?"
        return f"{type(self).__name__}(sandbox={self.sandbox.id!r}, pid={self.pid}, state={state!r})"

    def _get(self) -> Request:
        return _api.process_get(self.sandbox.id, self.pid)

    def _wait(self, timeout: Optional[_api.Seconds]) -> Request:
        return _api.process_wait(self.sandbox.id, self.pid, timeout, self.sandbox._client.timeout)

    def _signal(self, signal: int) -> Request:
        return _api.process_signal(self.sandbox.id, self.pid, signal)

    def _stdin(self, data: Any, eof: bool) -> Request:
        return _api.process_stdin(self.sandbox.id, self.pid, data, eof)



class TrajectoryBase:
    """Step numbering of a trajectory (internal; see :class:`tidepool.Trajectory`).

    Step n of trajectory ``id`` carries the Idempotency-Key ``f"{id}/{n}"``: a trainer
    that restarts and re-runs its rollout code with the same id sends the same keys in
    the same order, gets the recorded results of the steps that finished (nothing runs
    again) and continues live at the first one that did not.
    """

    #: Keys are at most 200 characters: room for "/<step>".
    MAX_ID = 150

    def __init__(self, sandbox: Any, id: str, start: int = 0) -> None:
        if not isinstance(id, str) or not id or len(id) > self.MAX_ID or any(c.isspace() for c in id):
            raise ValueError(f"trajectory id must be 1-{self.MAX_ID} characters without whitespace")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError("start must be an int >= 0")
        self.sandbox = sandbox
        self.id = id
        #: The number of the last step issued (the next one is ``step + 1``).
        self.step = start
        #: For a branch: the report of the replay that made it.
        self.report: Any = None

    @property
    def prefix(self) -> str:
        """What every key of this trajectory starts with."""
        return f"{self.id}/"

    def key(self, step: int) -> str:
        """The Idempotency-Key of step ``step``."""
        return f"{self.id}/{step}"

    def _next_key(self) -> str:
        self.step += 1
        return self.key(self.step)

    def _replay_request(self, to_step: Optional[int], keep: bool) -> Request:
        return _api.replay(self.sandbox.id, to_key=None if to_step is None else self.key(to_step), keep=keep)

    def _branch_request(self, k: int, new_id: str) -> Request:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError("k must be a step number >= 1")
        return _api.replay(self.sandbox.id, to_key=self.key(k), branch=True, rekey=(self.prefix, f"{new_id}/"))

    def _branch_id(self, k: int, new_id: Optional[str]) -> str:
        if new_id is not None:
            return new_id
        import uuid
        return f"{self.id}~{k}-{uuid.uuid4().hex[:8]}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox={self.sandbox.id!r}, id={self.id!r}, step={self.step})"


class BatchStreamBase(Generic[C]):
    """What a streamed batch has delivered so far (internal; see :class:`tidepool.BatchStream`).

    Attributes:
        items: every :class:`BatchItem` in the order they arrived.
        sandboxes: the handles of the items that are ready.
        errors: one :class:`BatchError` per item that failed.
        summary: the daemon's final line (``created``, ``from_pool``, ``failed``, ...),
            None until the stream ended.
    """

    def __init__(self, client: C, req: Request) -> None:
        self._client = client
        self._req = req
        self._parser: BatchStreamParser[Any] = BatchStreamParser(client._sandbox)  # type: ignore[attr-defined]
        self._started = False
        self.items: List[BatchItem[Any]] = []
        self.sandboxes: List[Any] = []
        self.errors: List[BatchError] = []

    def _begin(self) -> None:
        if self._started:
            raise RuntimeError("a batch stream can be iterated once")
        self._started = True

    def _take(self, line: bytes) -> Optional[Any]:
        """Records one line; returns the sandbox it made ready, if any."""
        item = self._parser.feed(line)
        if item is None:
            return None
        self.items.append(item)
        if item.sandbox is None:
            e = item.error
            code = e.code if isinstance(e, TidepoolError) else "internal"
            message = e.message if isinstance(e, TidepoolError) else str(e)
            self.errors.append(BatchError(item.index, code, message))
            return None
        self.sandboxes.append(item.sandbox)
        return item.sandbox

    def _end(self) -> None:
        if self._parser.done is None:
            raise self._parser.missing_done()

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        """The daemon's final line (``created``, ``from_pool``, ``failed``), None before the end."""
        return self._parser.done

    @property
    def from_pool(self) -> int:
        """How many items came from a warm pool (so far)."""
        return sum(1 for i in self.items if i.sandbox is not None and i.from_pool)

    @property
    def ok(self) -> bool:
        """True when the stream ended and every item is ready."""
        return self._parser.done is not None and not self.errors and bool(self._parser.done.get("ok", True))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ready={len(self.sandboxes)}, failed={len(self.errors)})"


class JobBase(Generic[C]):
    """State of a job handle (internal; see :class:`tidepool.Job`).

    A handle is made by ``client.job(...)``; the job itself is created when it is started
    (entering the ``with`` block), and ended when it is left.
    """

    #: Without ``heartbeat_interval``, heartbeats go every lease * this.
    HEARTBEAT_FRACTION = 1.0 / 3.0

    def __init__(self, client: C, spec: Mapping[str, Any], heartbeat_interval: Optional[float]) -> None:
        if heartbeat_interval is not None and not heartbeat_interval > 0:
            raise ValueError("heartbeat_interval must be > 0 seconds")
        _api.job_body(**spec)  # bad arguments fail here, before anything is sent
        self._client = client
        self._spec = dict(spec)
        self._interval_arg = heartbeat_interval
        #: The last description received (None before the job was created).
        self.info: Optional[JobInfo] = None
        #: How many background heartbeats succeeded.
        self.heartbeats = 0
        #: The last background heartbeat's error (it keeps trying unless the job ended).
        self.heartbeat_error: Optional[Exception] = None
        self._ended = False

    @property
    def client(self) -> C:
        """The client this handle talks through."""
        return self._client

    @property
    def id(self) -> str:
        """The job id; raises RuntimeError before the job was created."""
        if self.info is None:
            raise RuntimeError("the job was not created yet (use it in a with block, or call start())")
        return self.info.id

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between background heartbeats: the argument, else the lease's fraction."""
        if self._interval_arg is not None:
            return self._interval_arg
        lease = (self.info.lease_seconds if self.info else None) or 60
        return max(lease * self.HEARTBEAT_FRACTION, 0.1)

    def _create_request(self) -> Request:
        if self.info is not None:
            raise RuntimeError(f"job {self.info.id} was already created")
        return _api.job_create(**self._spec)

    def _placed(self, step: Optional[str], kwargs: Dict[str, Any]) -> Dict[str, Any]:
        if "job" in kwargs:
            raise TypeError("job is this job's own id")
        kwargs["job"] = self.id
        if step is not None:
            kwargs["step"] = step
        return kwargs

    def _beat_failed(self, e: TidepoolError) -> bool:
        """Records a heartbeat failure; True when heartbeating should stop (the job is gone)."""
        self.heartbeat_error = e
        return e.status in (404, 409)

    def __repr__(self) -> str:
        state = self.info.state if self.info else "not created"
        ident = self.info.id if self.info else None
        return f"{type(self).__name__}(id={ident!r}, state={state!r})"


class StepBase:
    """One step of a job (internal; see :class:`tidepool.Step`)."""

    def __init__(self, job: Any, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError("step name must be a non-empty string")
        self.job = job
        self.name = name
        #: How many sandboxes ending the step removed (None until it ended).
        self.reclaimed: Optional[int] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(job={self.job.info.id if self.job.info else None!r}, name={self.name!r})"
