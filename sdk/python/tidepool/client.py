"""Synchronous client: :class:`Client`, :class:`Sandbox` and :class:`Files`.

Example::

    import tidepool

    with tidepool.Client() as client:
        with client.create(image="host", memory_mb=512, ttl=600) as sb:
            sb.files.write("/tmp/x.py", "print(6*7)")
            print(sb.exec(["python3", "/tmp/x.py"]).stdout)   # 42

Thread rules: a :class:`Client` may be shared by threads (each thread keeps its own
keep-alive connections). A :class:`Sandbox` is a thin handle; calls on it from several
threads are fine, but ``refresh()`` updates its ``info`` without locking.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterator, List, Literal, Mapping, Optional, Tuple, Union, overload

import threading

from . import _api, _tar
from ._base import (
    BatchStreamBase,
    JobBase,
    StepBase,
    from_pool_header,
    run_fields,
    DEFAULT_URL,
    USER_AGENT,
    ClientBase,
    FilesBase,
    ProcessHandleBase,
    SandboxBase,
    TrajectoryBase,
    command_opts,
    create_fields,
)
from ._http import Request, SyncTransport, default_url, prepare
from ._retry import DEFAULT_RETRY, RetryPolicy
from .errors import NotFound, TidepoolError
from .models import JobInfo, Pool, RunResult, Template, parse_jobs, parse_pools, parse_run_batch, parse_templates
from .models import (  # noqa: F401 - StreamParser, parse_exec_json: kept importable from here
    BatchResult,
    ExecResult,
    FileEntry,
    LogEntry,
    OutputChunk,
    ProcessInfo,
    SandboxInfo,
    StreamParser,
    checked,
    chunks_of,
    parse_batch,
    ReplayReport,
    parse_answer,
    parse_entries,
    parse_exec_json,
    parse_log,
    parse_processes,
    parse_replay,
    parse_sandboxes,
    wait_result,
)

__all__ = ["Client", "Sandbox", "Files", "ProcessHandle", "Trajectory", "BatchStream", "Job", "Step", "DEFAULT_URL"]

Data = Union[bytes, bytearray, memoryview, str]


class Client(ClientBase):
    """Connection to a Tidepool daemon.

    Args:
        url: ``http://HOST:PORT`` or ``unix:/PATH`` (the daemon's unix socket); default
            ``$TIDEPOOL_URL``, else the unix socket (``$TIDEPOOL_SOCKET`` or
            ``/run/tidepool/tidepool.sock``) when it exists, else ``http://127.0.0.1:7070``.
        api_key: sent as ``Authorization: Bearer`` over TCP (which needs one unless the
            daemon runs with ``--insecure-tcp``); default ``$TIDEPOOL_API_KEY`` when set.
            The unix socket needs none: the daemon knows the caller by its uid.
        timeout: seconds to wait for connecting and for each answer of ordinary calls
            (``None`` waits forever). Command calls wait for the command's own timeout
            plus this much; without a command timeout they wait as long as it runs.
        retry: how transient failures (connection refused or reset, HTTP 503) are
            retried; see :class:`RetryPolicy`. State-changing calls carry an
            ``Idempotency-Key`` so that a retry never runs anything twice.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        retry: Optional[RetryPolicy] = None,
    ) -> None:
        key = self._configure(url or default_url(), api_key, timeout)
        self._transport = SyncTransport(self.url, key, timeout, USER_AGENT, retry or DEFAULT_RETRY)

    # -- plumbing ----------------------------------------------------------------

    def _call(self, req: Request, idempotency_key: Optional[str] = None) -> Any:
        return self._transport.request(prepare(req, idempotency_key)).json()

    def close(self) -> None:
        """Closes the client's connections. Sandboxes stay alive; kill them first if needed."""
        self._transport.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- daemon ------------------------------------------------------------------

    def health(self) -> Dict[str, Any]:
        """GET /health: ``{"status": "ok"}`` when the daemon serves."""
        return self._call(Request("GET", "/health"))

    def version(self) -> Dict[str, Any]:
        """GET /version: daemon version, API version and the tiers it offers."""
        return self._call(Request("GET", "/version"))

    def metrics(self) -> str:
        """GET /metrics: the Prometheus text exposition."""
        return self._transport.request(_api.metrics()).body.decode("utf-8", errors="replace")

    # -- the function tier -------------------------------------------------------

    def run_code(
        self,
        language: str,
        source: str,
        stdin: Optional[Union[bytes, str]] = None,
        timeout: Optional[_api.Seconds] = None,
        memory_mb: Optional[int] = None,
        files: Optional[Mapping[str, Union[bytes, str]]] = None,
        args: Optional[List[str]] = None,
        env: Optional[Mapping[str, str]] = None,
        fetch_files: Optional[List[str]] = None,
        compile_timeout: Optional[_api.Seconds] = None,
        max_output_bytes: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> RunResult:
        """Runs a program once in the function tier and returns its outcome.

        No sandbox of your own: the program runs in a fresh isolated child of a
        pre-started worker (its own namespaces, cgroup, scratch tmpfs, no network) and
        nothing of it remains afterwards. A failing program is a result (see
        ``verdict``), not an exception.

        Args:
            language: ``"python"``, ``"cpp"``, ``"c"``, ``"nodejs"``, ``"bash"``, ... (see
                :meth:`fn_languages`).
            source: the program's text.
            stdin: its standard input (str or bytes).
            timeout: wall-clock limit in seconds (daemon default 10).
            memory_mb: memory limit of the run (daemon default 512).
            files: more files for its directory, ``{relative path: bytes or str}``.
            args: arguments after the program.
            env: environment variables.
            fetch_files: files to return from its directory afterwards (``result.files``).
            compile_timeout: limit of the compile step of compiled languages.
            max_output_bytes: per stream; a program writing more is killed (verdict
                ``output_limit``; daemon default 16 MiB).
            idempotency_key: makes the daemon record the answer and return it again on a
                repeat of the key (by default none: a run changes nothing, and a retry
                after a broken connection simply runs it again).

        Raises:
            InvalidArgument: unknown language, a limit out of range, a file path outside
                the program's directory.
            QuotaExceeded: too many runs of this client are queued.
            Unavailable: no worker could run it.
        """
        fields = run_fields(language, source, stdin, timeout, memory_mb, files, args, env, fetch_files,
                            compile_timeout, max_output_bytes)
        return RunResult.from_json(self._call(_api.run_code(self.timeout, **fields), idempotency_key))

    def run_code_batch(
        self, runs: List[Mapping[str, Any]], idempotency_key: Optional[str] = None, **defaults: Any
    ) -> List[Union[RunResult, Exception]]:
        """Runs many programs, or one program against many inputs, in one request.

        ``runs`` is a sequence of mappings of :meth:`run_code` keywords; ``defaults``
        (the same keywords) apply to every run. With ``language`` and ``source`` in
        ``defaults`` and runs that give only ``stdin``, ``args``, ``files`` or ``env``,
        the program is sent (and compiled) once::

            results = client.run_code_batch([{"stdin": t} for t in tests], language="cpp", source=src)

        Returns the results in order; a run that could not complete is the exception
        :meth:`run_code` would have raised, as a value (check with ``isinstance``).
        """
        return parse_run_batch(self._call(_api.run_code_batch(runs, defaults), idempotency_key))

    def fn_languages(self) -> List[Dict[str, Any]]:
        """The languages the function tier serves (name, aliases, SandboxFusion names, ...)."""
        return list((self._call(_api.fn_languages())).get("languages") or [])

    def fn_status(self) -> Dict[str, Any]:
        """The function tier's workers, queue, rate and verdict counts."""
        return self._call(_api.fn_status())

    # -- sandboxes ---------------------------------------------------------------

    def create(
        self,
        image: Optional[str] = None,
        tier: Optional[str] = None,
        memory_mb: Optional[int] = None,
        cpus: Optional[float] = None,
        ttl: Optional[_api.Seconds] = None,
        idle_timeout: Optional[_api.Seconds] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        disk_mb: Optional[int] = None,
        pids: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        *,
        template: Optional[str] = None,
        job: Optional[str] = None,
        step: Optional[str] = None,
        priority: Optional[str] = None,
    ) -> "Sandbox":
        """Creates a sandbox and returns it once it runs.

        Args:
            image: image name (default ``"host"``, a read-only view of the host's system,
                or the template's).
            tier: isolation tier: ``"container"`` (the default) or ``"microvm"`` (a VM with
                its own kernel; GET /version lists the tiers a daemon offers).
            memory_mb: memory limit in MiB (no swap); server default when None.
            cpus: CPU quota in cores, e.g. ``0.5``.
            ttl: lifetime in seconds (or a ``timedelta``); the sandbox stops afterwards.
            idle_timeout: stop after this many seconds without a request; 0 disables.
            labels: free-form ``key=value`` tags, usable as list filters.
            env: environment variables for every command in the sandbox.
            disk_mb: size limit of the sandbox's writable layer in MiB.
            pids: maximum number of processes in the sandbox.
            idempotency_key: key of this call (default: a fresh uuid4); a repeat with the
                same key returns the same sandbox instead of creating another.
            template: start from this template (see :meth:`create_template`): a fresh
                sandbox of its warm pool when one is ready (``info.from_pool``), else a
                cold one; the other arguments override its fields.
            job: the job it belongs to (its quotas apply; ending the job removes it).
                :meth:`Job.create` fills this in.
            step: a tag within the job (needs ``job``); ending the step removes it.
            priority: ``"normal"`` or ``"best-effort"`` (lowest CPU weight, SCHED_IDLE).

        Raises:
            InvalidArgument: a value is below its minimum.
            NotFound: the image, template or job does not exist (or the job ended).
            Conflict: the job's lease has lapsed (heartbeat it first).
            QuotaExceeded: over the job's quota (the message names it), or the node has no room.
        """
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        resp = self._transport.request(prepare(self._create_request(None, fields), idempotency_key))
        info = SandboxInfo.from_json(resp.json())
        info.from_pool = from_pool_header(resp.headers)
        return Sandbox(self, info)

    def create_batch(
        self,
        count: int,
        image: Optional[str] = None,
        tier: Optional[str] = None,
        memory_mb: Optional[int] = None,
        cpus: Optional[float] = None,
        ttl: Optional[_api.Seconds] = None,
        idle_timeout: Optional[_api.Seconds] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        disk_mb: Optional[int] = None,
        pids: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        *,
        template: Optional[str] = None,
        job: Optional[str] = None,
        step: Optional[str] = None,
        priority: Optional[str] = None,
        gang: bool = False,
    ) -> "BatchResult[Sandbox]":
        """Creates ``count`` sandboxes alike in one request (the daemon starts them
        concurrently, from the template's warm pool first).

        Returns a :class:`BatchResult`: ``.sandboxes`` that run and, per failed item,
        ``.errors`` entries ``(index, code, message)``. A partial failure is not an
        exception. Use it as a context manager to kill them all at the end. Other
        arguments are those of :meth:`create`.

        Args:
            gang: all or nothing: if any item fails, the daemon removes those it made and
                the call raises that item's error (e.g. :class:`QuotaExceeded`).

        Raises:
            InvalidArgument: ``count`` is outside 1..1000 or a value is invalid.
        """
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        return parse_batch(self._call(self._create_request(count, fields, gang), idempotency_key), self._sandbox)

    def create_batch_stream(
        self,
        count: int,
        image: Optional[str] = None,
        tier: Optional[str] = None,
        memory_mb: Optional[int] = None,
        cpus: Optional[float] = None,
        ttl: Optional[_api.Seconds] = None,
        idle_timeout: Optional[_api.Seconds] = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        disk_mb: Optional[int] = None,
        pids: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        *,
        template: Optional[str] = None,
        job: Optional[str] = None,
        step: Optional[str] = None,
        priority: Optional[str] = None,
        gang: bool = False,
    ) -> "BatchStream":
        """Like :meth:`create_batch`, but yields each sandbox as soon as it is ready (in
        the order they become ready, pooled ones first)::

            with client.create_batch_stream(64, template="py") as batch:
                for sb in batch:            # start work on each as it arrives
                    pending.append(pool.submit(rollout, sb))

        Nothing is sent until the iteration starts. Failed items do not stop the stream:
        they are in ``batch.errors`` afterwards. With ``gang=True`` the first failure makes
        the daemon remove every sandbox of the batch (also those already yielded) and the
        iteration raises that error (its ``released`` attribute lists the removed ids).
        Leaving the ``with`` block kills every sandbox yielded.
        """
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        return BatchStream(self, prepare(self._create_request(count, fields, gang, stream=True), idempotency_key))

    # -- templates, pools and jobs -------------------------------------------------

    def create_template(self, name: str, **fields: Any) -> Template:
        """Creates a template: a named sandbox shape, with a warm pool when ``pool_max > 0``.

        Fields (all optional): ``image``, ``tier``, ``memory_mb``, ``cpus``, ``pids``,
        ``disk_mb``, ``ttl``, ``idle_timeout`` (seconds), ``env``, ``labels``,
        ``priority``, ``pool_min`` (sandboxes kept ready at least) and ``pool_max`` (at
        most; between the two the pool follows demand).

        Raises:
            Conflict: a template of this name exists (:meth:`put_template` replaces it).
            InvalidArgument: a bad name or value.
        """
        return Template.from_json(self._call(_api.template_create(name, **fields)))

    def put_template(self, name: str, version: Optional[int] = None, **fields: Any) -> Template:
        """Creates or replaces a template (fields as :meth:`create_template`). A replace
        drains its pool (the sandboxes there have the old shape). With ``version`` only that
        stored version is replaced (compare-and-set).

        Raises:
            Conflict: ``version`` is given and another version is stored.
        """
        return Template.from_json(self._call(_api.template_put(name, version=version, **fields)))

    def get_template(self, name: str) -> Template:
        """The template ``name`` with its pool (raises :class:`NotFound`)."""
        return Template.from_json(self._call(_api.template_get(name)))

    def list_templates(self) -> List[Template]:
        """Every template, with its pool."""
        return parse_templates(self._call(_api.template_list()))

    def delete_template(self, name: str) -> Template:
        """Removes a template and drains its pool; returns what it was (raises :class:`NotFound`)."""
        return Template.from_json(self._call(_api.template_delete(name)))

    def pools(self) -> List[Pool]:
        """Every warm pool: ready, creating, target, hits, misses, rates."""
        return parse_pools(self._call(_api.pools()))

    def job(
        self,
        name: Optional[str] = None,
        lease: Optional[_api.Seconds] = None,
        grace: Optional[_api.Seconds] = None,
        max_sandboxes: Optional[int] = None,
        max_memory_mb: Optional[int] = None,
        max_cpus: Optional[float] = None,
        labels: Optional[Mapping[str, str]] = None,
        heartbeat_interval: Optional[float] = None,
    ) -> "Job":
        """A job: the sandboxes of one training run, under a lease and quotas. Use it as a
        context manager::

            with client.job("run7", lease=60, max_sandboxes=64) as job:
                with job.step("12") as step:
                    sb = step.create(template="py")     # removed when the step ends
                    ...

        Entering creates the job and starts a background thread that renews its lease
        every ``heartbeat_interval`` seconds (default: a third of the lease); leaving stops
        it and ends the job, which removes every sandbox the job still has. If the trainer
        dies, the lease lapses: its sandboxes are paused, and removed after ``grace``.

        Args:
            name: a name for people.
            lease: seconds (daemon default 60).
            grace: seconds a lapsed job keeps its paused sandboxes (daemon default 600).
            max_sandboxes, max_memory_mb, max_cpus: quotas over its live sandboxes (None:
                no limit); a create over one raises :class:`QuotaExceeded` naming it.
            labels: free-form tags.
        """
        return Job(self, dict(name=name, lease=lease, grace=grace, max_sandboxes=max_sandboxes,
                              max_memory_mb=max_memory_mb, max_cpus=max_cpus, labels=labels), heartbeat_interval)

    def get_job(self, job_id: str) -> JobInfo:
        """The job ``job_id`` with what its sandboxes hold (``use``; raises :class:`NotFound`)."""
        return JobInfo.from_json(self._call(_api.job_get(job_id)))

    def list_jobs(self, all: bool = False) -> List[JobInfo]:
        """The live jobs (with ``all=True`` the ended ones too)."""
        return parse_jobs(self._call(_api.job_list(all)))

    def end_job(self, job_id: str) -> JobInfo:
        """Ends a job by id, removing its sandboxes (raises :class:`NotFound`)."""
        return JobInfo.from_json(self._call(_api.job_end(job_id)))

    def _sandbox(self, info: SandboxInfo) -> "Sandbox":
        return Sandbox(self, info)

    def get(self, sandbox_id: str) -> "Sandbox":
        """Returns the sandbox with this id (also ended ones, until the daemon forgets them).

        Raises:
            NotFound: no such sandbox.
        """
        return Sandbox(self, SandboxInfo.from_json(self._call(_api.get(sandbox_id))))

    def list(
        self,
        labels: Optional[Mapping[str, str]] = None,
        state: Optional[str] = None,
        all: bool = False,
    ) -> List["Sandbox"]:
        """Lists sandboxes.

        Args:
            labels: only sandboxes carrying every one of these labels.
            state: only sandboxes in this state (``"running"``, ``"stopped"``, ...).
            all: include ended sandboxes (by default only live ones are listed).
        """
        return parse_sandboxes(self._call(_api.list_(labels, state, all)), self._sandbox)

    def kill(self, sandbox_id: str) -> Optional[SandboxInfo]:
        """Destroys a sandbox by id; returns its final description, None if it was unknown."""
        try:
            return SandboxInfo.from_json(self._call(_api.delete(sandbox_id)))
        except NotFound:
            return None


class Files(FilesBase):
    """File operations inside one sandbox (``sandbox.files``).

    Paths are absolute paths inside the sandbox; the daemon resolves them inside the
    sandbox's root, so ``..`` and symlinks cannot reach the host.
    """

    def write(self, path: str, data: Data, mode: Optional[int] = None,
              idempotency_key: Optional[str] = None) -> FileEntry:
        """Writes ``data`` (bytes, or str encoded as UTF-8) to ``path``, creating parents.

        Args:
            mode: permission bits such as ``0o755``; the server's default is ``0o644``.
            idempotency_key: key of this write (default: a fresh uuid4 per call).

        Raises:
            PayloadTooLarge / InsufficientStorage: the data does not fit the sandbox's disk.
        """
        req = _api.file_write(self._sb.id, path, data, mode)
        return FileEntry.from_json(self._sb._client._call(req, idempotency_key))

    def read(self, path: str) -> bytes:
        """Returns the content of the file at ``path``.

        Raises:
            NotFound: no such file.
        """
        return self._sb._client._transport.request(_api.file_read(self._sb.id, path)).body

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """Returns the content of ``path`` decoded as text (invalid bytes replaced)."""
        return self.read(path).decode(encoding, errors="replace")

    def list(self, path: str) -> List[FileEntry]:
        """Lists the directory at ``path``."""
        return parse_entries(self._sb._client._call(_api.file_list(self._sb.id, path)))

    def stat(self, path: str) -> FileEntry:
        """Describes ``path`` without following a final symlink.

        Raises:
            NotFound: no such path.
        """
        return FileEntry.from_json(self._sb._client._call(_api.file_stat(self._sb.id, path)))

    def exists(self, path: str) -> bool:
        """True when ``path`` exists (a dangling symlink counts)."""
        try:
            self.stat(path)
            return True
        except NotFound:
            return False

    def remove(self, path: str, recursive: bool = False, idempotency_key: Optional[str] = None) -> None:
        """Removes a file, or with ``recursive=True`` a whole directory tree."""
        self._sb._client._transport.request(prepare(_api.file_remove(self._sb.id, path, recursive), idempotency_key))

    def mkdir(self, path: str, parents: bool = False, idempotency_key: Optional[str] = None) -> FileEntry:
        """Creates a directory; with ``parents=True`` also missing parents (and no error if it exists)."""
        return FileEntry.from_json(self._sb._client._call(_api.file_mkdir(self._sb.id, path, parents), idempotency_key))

    def upload_dir(self, local_dir: str, remote_dir: str, idempotency_key: Optional[str] = None) -> int:
        """Copies the tree under ``local_dir`` to ``remote_dir`` (created if missing) in one
        request: the tree travels as one tar archive. Returns the archive's size in bytes.

        Raises:
            NotADirectoryError: ``local_dir`` is not a directory.
            PayloadTooLarge / InsufficientStorage: the tree does not fit the sandbox's disk.
        """
        archive = _tar.pack_dir(local_dir)
        self._sb._client._call(self._tar_put(remote_dir, archive), idempotency_key)
        return len(archive)

    def download_dir(self, remote_dir: str, local_dir: str) -> List[str]:
        """Copies the tree under ``remote_dir`` into ``local_dir`` (created if missing) in one
        request; returns the relative names written.

        The archive is made inside the sandbox, so it is treated as hostile: it is checked
        whole before anything is written, and nothing ever lands outside ``local_dir``.
        Entries passing through a symlink, symlinks that resolve outside (or are absolute),
        hard links to anything but a file extracted from the same archive, entries replacing
        a directory or symlink, devices and fifos refuse the whole archive; set-uid bits
        are dropped. See ``unpack_into`` in ``tidepool/_tar.py``.

        Raises:
            NotFound: ``remote_dir`` does not exist.
            UnsafeArchive: the archive broke one of these rules; nothing was written.
        """
        return _tar.unpack_into(self._sb._client._transport.request(self._tar_get(remote_dir)).body, local_dir)


class Sandbox(SandboxBase["Client"]):
    """Handle of one sandbox, returned by :meth:`Client.create`, :meth:`Client.get` and :meth:`Client.list`.

    Used as a context manager it is killed on exit, also when the body raises.

    Attributes:
        info: the last description received from the daemon (see :meth:`refresh`).
        files: file operations, see :class:`Files`.
    """

    _files_class = Files
    _family = "sync"
    files: Files

    def refresh(self) -> "Sandbox":
        """Fetches the current description from the daemon; returns self."""
        self.info = SandboxInfo.from_json(self._client._call(_api.get(self.id)))
        return self

    def kill(self) -> None:
        """Destroys the sandbox: every process, mount and file of it goes away.

        Killing a sandbox that is already gone is not an error.
        """
        self._killed(self._client.kill(self.id))

    def pause(self) -> "Sandbox":
        """Freezes every process of the sandbox (its memory may be pushed out); any later
        request to it resumes it first. Returns self (``state`` is then ``"paused"``).

        Raises:
            Conflict: the sandbox is not running.
        """
        self.info = SandboxInfo.from_json(self._client._call(_api.pause(self.id)))
        return self

    def resume(self) -> "Sandbox":
        """Thaws a paused sandbox (a running one is left as it is); returns self."""
        self.info = SandboxInfo.from_json(self._client._call(_api.resume(self.id)))
        return self

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.kill()
        except TidepoolError:
            # Do not hide the body's exception behind a cleanup failure.
            if exc_type is None:
                raise

    # -- commands ----------------------------------------------------------------

    @overload
    def exec(self, cmd: _api.Command, timeout: Optional[_api.Seconds] = ..., env: Optional[Mapping[str, str]] = ...,
             cwd: Optional[str] = ..., user: Optional[int] = ..., stdin: Optional[Union[bytes, str]] = ...,
             check: bool = ..., max_output_bytes: Optional[int] = ..., *, background: Literal[False] = ...,
             idempotency_key: Optional[str] = ...) -> ExecResult: ...

    @overload
    def exec(self, cmd: _api.Command, timeout: Optional[_api.Seconds] = ..., env: Optional[Mapping[str, str]] = ...,
             cwd: Optional[str] = ..., user: Optional[int] = ..., stdin: Optional[Union[bytes, str]] = ...,
             check: bool = ..., max_output_bytes: Optional[int] = ..., *, background: Literal[True],
             idempotency_key: Optional[str] = ...) -> "ProcessHandle": ...

    def exec(
        self,
        cmd: _api.Command,
        timeout: Optional[_api.Seconds] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[int] = None,
        stdin: Optional[Union[bytes, str]] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        *,
        background: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> Union[ExecResult, "ProcessHandle"]:
        """Runs a command and returns its result once it ends.

        Args:
            cmd: a string (run by ``/bin/sh -c``) or an argv list.
            timeout: seconds; on expiry every process the command started is killed and
                the result has ``timed_out=True``.
            env: extra environment variables.
            cwd: working directory (default: the image's workdir, or ``/``).
            user: uid inside the sandbox (default: the image's user, or 0, which is not root on the host).
            stdin: data fed to the command's standard input.
            check: raise :class:`CommandFailed` unless the command exits with 0.
            max_output_bytes: cap per output stream (server default 16 MiB).
            background: start the command and return a :class:`ProcessHandle` at once
                instead of waiting (same as :meth:`start`).
            idempotency_key: key of this step, e.g. ``f"{trajectory}/{step}"``; a repeat
                with the same key returns the recorded result without running the
                command again, and the command runs to its end even if this client goes
                away (its result is then fetched with :meth:`step_result`). Default: a
                fresh uuid4, which still makes the SDK's own retries safe; the daemon
                then stops the command soon after its client is gone.

        Raises:
            Conflict: the sandbox is not running.
            NotFound: the sandbox does not exist.
            CommandFailed: ``check=True`` and the command failed.
        """
        opts = command_opts(timeout, env, cwd, user, stdin, max_output_bytes)
        if background:
            return self.start(cmd, **opts, idempotency_key=idempotency_key)
        req = self._exec_request(cmd, opts, stream=False)
        return checked(ExecResult.from_json(self._client._call(req, idempotency_key)), check)

    def exec_stream(
        self,
        cmd: _api.Command,
        timeout: Optional[_api.Seconds] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[int] = None,
        stdin: Optional[Union[bytes, str]] = None,
        check: bool = False,
        max_output_bytes: Optional[int] = None,
        *,
        idempotency_key: Optional[str] = None,
    ) -> Iterator[Union[OutputChunk, ExecResult]]:
        """Runs a command and yields its output as it is produced.

        Yields :class:`OutputChunk` values in production order, then exactly one
        :class:`ExecResult` (whose ``stdout_bytes``/``stderr_bytes`` hold everything the
        chunks carried). Arguments are those of :meth:`exec`. Closing the generator early
        drops the connection; the daemon then stops the command.

        Raises:
            CommandFailed: ``check=True`` and the command failed (instead of yielding the result).
            TidepoolError: the daemon reported an error mid-stream.
        """
        req = self._exec_request(cmd, command_opts(timeout, env, cwd, user, stdin, max_output_bytes), stream=True)
        stream = self._client._transport.stream_lines(prepare(req, idempotency_key))
        with stream:
            if stream.content_type == "application/json":
                # A daemon may answer a stream request all at once (e.g. a replayed key).
                result = parse_exec_json(stream.read_rest())
                yield from chunks_of(result)
            else:
                result = yield from _parse_ndjson(stream)
        yield checked(result, check)

    # -- the trajectory log --------------------------------------------------------

    def log(self, after: int = 0, limit: Optional[int] = None, output: bool = False) -> List[LogEntry]:
        """The sandbox's history: every state-changing call (with its key, result and
        caller) and lifecycle event, in order, after the cursor ``after`` (a seq).

        Args:
            limit: at most this many entries (the daemon's default is 1000).
            output: also fetch each recorded answer (``LogEntry.answer``).
        """
        return parse_log(self._client._call(_api.log_(self.id, after, limit, output)))

    def follow_log(self, after: int = 0, output: bool = False) -> Iterator[LogEntry]:
        """Yields the log's entries after ``after`` as they are written, until the sandbox
        ends. Resume after a lost connection with ``after=<last seq seen>``: nothing is
        skipped or repeated."""
        stream = self._client._transport.stream_lines(_api.log_(self.id, after, None, output, follow=True))
        with stream:
            for line in stream:
                line = line.strip()
                if line:
                    yield LogEntry.from_json(json.loads(line.decode("utf-8")))

    def step_result(self, key: str) -> Any:
        """The recorded answer of the call made with Idempotency-Key ``key`` (waiting for it
        while it runs), e.g. after the connection of that call was lost: an
        :class:`ExecResult` for a command, else the decoded JSON.

        Raises:
            NotFound: this sandbox's log has no call with that key.
        """
        resp = self._client._transport.request(_api.log_result(self.id, key))
        return parse_answer(resp.headers.get("content-type", ""), resp.body)

    def replay(self, to_step: Optional[int] = None, *, to_key: Optional[str] = None, branch: bool = False,
               keep: bool = False, rekey: Optional[Tuple[str, str]] = None,
               idempotency_key: Optional[str] = None) -> "ReplayReport[Sandbox]":
        """Re-runs this sandbox's logged steps into a fresh sandbox from the same image
        (its recorded layers), up to seq ``to_step`` (or the call keyed ``to_key``, or the
        end), checking each answer against the record. ``branch=True`` (or ``keep``) keeps
        the new sandbox running afterwards. See :class:`ReplayReport`."""
        req = _api.replay(self.id, to_step, to_key, branch, keep, rekey)
        return parse_replay(self._client._call(req, idempotency_key), self._client._sandbox)

    # -- background processes ------------------------------------------------------

    def start(
        self,
        cmd: _api.Command,
        timeout: Optional[_api.Seconds] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        user: Optional[int] = None,
        stdin: Optional[Union[bytes, str]] = None,
        max_output_bytes: Optional[int] = None,
        *,
        stdin_open: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> "ProcessHandle":
        """Starts a command in the background; returns its :class:`ProcessHandle` once it runs
        (``handle.info.os_pid`` is its pid in the sandbox), without waiting for its end.

        Output is kept by the daemon (up to ``max_output_bytes`` per stream) until the
        process is waited for. With ``stdin_open=True`` its standard input stays open for
        :meth:`ProcessHandle.send_stdin`. Other arguments are those of :meth:`exec`.
        """
        opts = command_opts(timeout, env, cwd, user, stdin, max_output_bytes)
        req = _api.process_start(self.id, cmd, stdin_open=stdin_open, **opts)
        info = ProcessInfo.from_json(self._client._call(req, idempotency_key))
        return ProcessHandle(self, info.pid, info)

    def processes(self) -> List[ProcessInfo]:
        """The sandbox's background processes (running, and exited ones not yet waited for)."""
        return parse_processes(self._client._call(_api.process_list(self.id)))

    def process(self, pid: int) -> "ProcessHandle":
        """A handle for the background process ``pid`` (e.g. one listed by :meth:`processes`)."""
        return ProcessHandle(self, pid)


class ProcessHandle(ProcessHandleBase):
    """A background command started by :meth:`Sandbox.start` or ``exec(..., background=True)``.

    Attributes:
        sandbox: the sandbox it runs in.
        pid: its handle inside the sandbox.
        info: the last description received (see :meth:`refresh`).
    """

    sandbox: Sandbox

    def refresh(self) -> ProcessInfo:
        """Fetches the process's current state (and result once it exited)."""
        self.info = ProcessInfo.from_json(self.sandbox._client._call(self._get()))
        return self.info

    def poll(self) -> Optional[ExecResult]:
        """The result if the process exited, else None (does not wait)."""
        return self.refresh().result

    def wait(self, timeout: Optional[_api.Seconds] = None, check: bool = False,
             idempotency_key: Optional[str] = None) -> ExecResult:
        """Waits until the process exits and returns its result with all its output.

        Args:
            timeout: seconds to wait at most; None waits as long as it runs.
            check: raise :class:`CommandFailed` unless it exited with 0.

        Raises:
            Timeout: it still runs after ``timeout`` seconds (it keeps running; its output
                so far is in ``self.info``).
        """
        info = ProcessInfo.from_json(self.sandbox._client._call(self._wait(timeout), idempotency_key))
        return wait_result(self, info, timeout, check)

    def kill(self, signal: int = 9, idempotency_key: Optional[str] = None) -> None:
        """Sends ``signal`` to every process of the command (9, the default, kills its whole tree)."""
        self.sandbox._client._call(self._signal(signal), idempotency_key)

    def send_stdin(self, data: Union[bytes, str], eof: bool = False, idempotency_key: Optional[str] = None) -> None:
        """Writes ``data`` to the process's standard input (it must have been started with
        ``stdin_open=True``); ``eof=True`` closes its input afterwards."""
        self.sandbox._client._call(self._stdin(data, eof), idempotency_key)

    def close_stdin(self) -> None:
        """Closes the process's standard input (it then reads end of file)."""
        self.send_stdin(b"", eof=True)


class Trajectory(TrajectoryBase):
    """The steps of one rollout in a sandbox, numbered so that a restarted trainer never
    runs a step twice.

    Every call through it carries the Idempotency-Key ``f"{id}/{n}"`` for its step n.
    A trainer that is preempted and re-runs its rollout code with the same trajectory id
    fast-forwards: the steps that finished get their recorded results back from the
    daemon's trajectory log (nothing runs again, also after a daemon restart), a step that
    was still running is waited for, and the first step never sent runs live. The code
    must issue its steps in the same order each time (as deterministic rollout code does).

    Example::

        traj = tidepool.Trajectory.create(client, "run7/rollout-3", ttl=3600)
        traj.write("/work/task.py", source)
        r = traj.exec("python3 /work/task.py")      # step 2: key "run7/rollout-3/2"

    ``tidepool.Trajectory(async_sandbox, id)`` gives an :class:`AsyncTrajectory`.

    Attributes:
        sandbox: the sandbox the steps run in.
        id: the trajectory id (the key prefix).
        step: the number of the last step issued.
    """

    sandbox: Sandbox

    def __new__(cls, sandbox: Any = None, id: str = "", start: int = 0) -> Any:
        from .aio import AsyncSandbox, AsyncTrajectory
        if cls is Trajectory and isinstance(sandbox, AsyncSandbox):
            return AsyncTrajectory(sandbox, id, start)
        return super().__new__(cls)

    @classmethod
    def create(cls, client: Client, id: str, **create_args: Any) -> "Trajectory":
        """A new sandbox for trajectory ``id`` (its create keyed ``f"{id}/sandbox"``, so a
        restarted trainer gets the same sandbox back) and its Trajectory."""
        return cls(client.create(**create_args, idempotency_key=f"{id}/sandbox"), id)

    def exec(self, cmd: _api.Command, **kwargs: Any) -> ExecResult:
        """:meth:`Sandbox.exec` as the next step."""
        return self.sandbox.exec(cmd, idempotency_key=self._next_key(), **kwargs)

    def exec_stream(self, cmd: _api.Command, **kwargs: Any) -> Iterator[Union[OutputChunk, ExecResult]]:
        """:meth:`Sandbox.exec_stream` as the next step (a fast-forwarded step yields its
        recorded output at once)."""
        return self.sandbox.exec_stream(cmd, idempotency_key=self._next_key(), **kwargs)

    def start(self, cmd: _api.Command, **kwargs: Any) -> "ProcessHandle":
        """:meth:`Sandbox.start` as the next step."""
        return self.sandbox.start(cmd, idempotency_key=self._next_key(), **kwargs)

    def wait(self, proc: "ProcessHandle", timeout: Optional[_api.Seconds] = None, check: bool = False) -> ExecResult:
        """:meth:`ProcessHandle.wait` as the next step."""
        return proc.wait(timeout, check, idempotency_key=self._next_key())

    def kill(self, proc: "ProcessHandle", signal: int = 9) -> None:
        """:meth:`ProcessHandle.kill` as the next step."""
        proc.kill(signal, idempotency_key=self._next_key())

    def send_stdin(self, proc: "ProcessHandle", data: Union[bytes, str], eof: bool = False) -> None:
        """:meth:`ProcessHandle.send_stdin` as the next step."""
        proc.send_stdin(data, eof, idempotency_key=self._next_key())

    def write(self, path: str, data: Data, mode: Optional[int] = None) -> FileEntry:
        """:meth:`Files.write` as the next step."""
        return self.sandbox.files.write(path, data, mode, idempotency_key=self._next_key())

    def remove(self, path: str, recursive: bool = False) -> None:
        """:meth:`Files.remove` as the next step."""
        self.sandbox.files.remove(path, recursive, idempotency_key=self._next_key())

    def mkdir(self, path: str, parents: bool = False) -> FileEntry:
        """:meth:`Files.mkdir` as the next step."""
        return self.sandbox.files.mkdir(path, parents, idempotency_key=self._next_key())

    def upload_dir(self, local_dir: str, remote_dir: str) -> int:
        """:meth:`Files.upload_dir` as the next step."""
        return self.sandbox.files.upload_dir(local_dir, remote_dir, idempotency_key=self._next_key())

    def log(self) -> List[LogEntry]:
        """This trajectory's steps in the sandbox's log (calls keyed with its prefix)."""
        out: List[LogEntry] = []
        after = 0
        while True:
            part = self.sandbox.log(after=after, limit=10000)
            if not part:
                return out
            out.extend(e for e in part if e.key and e.key.startswith(self.prefix))
            after = part[-1].seq

    def result(self, step: int) -> Any:
        """The recorded result of step ``step`` (see :meth:`Sandbox.step_result`)."""
        return self.sandbox.step_result(self.key(step))

    def replay(self, to_step: Optional[int] = None, keep: bool = False) -> "ReplayReport[Sandbox]":
        """Replays the sandbox's log into a fresh sandbox up to this trajectory's step
        ``to_step`` (or the end) and reports the first divergence; see :meth:`Sandbox.replay`."""
        return parse_replay(self.sandbox.client._call(self._replay_request(to_step, keep)), self.sandbox.client._sandbox)

    def branch(self, k: int, id: Optional[str] = None) -> "Trajectory":
        """A new trajectory that continues live from the state after step ``k``: a fresh
        sandbox into which steps 1..k were replayed (re-keyed as ``f"{id}/1"`` ...), so
        that its next step is k+1. ``id`` defaults to a new unique one. Branching again
        with the same ``id`` (a restarted trainer) returns the same branch."""
        new_id = self._branch_id(k, id)
        req = self._branch_request(k, new_id)
        report = parse_replay(self.sandbox.client._call(req, f"{new_id}/branch"), self.sandbox.client._sandbox)
        if report.sandbox is None:
            raise TidepoolError("internal", f"branch of {self.sandbox.id} at step {k} returned no sandbox", None)
        t = Trajectory(report.sandbox, new_id, start=k)
        t.report = report
        return t


class BatchStream(BatchStreamBase["Client"]):
    """The sandboxes of :meth:`Client.create_batch_stream`, yielded as they become ready.

    Iterate it once. Afterwards ``errors`` lists the items that failed and ``summary`` is
    the daemon's final line. As a context manager it kills every sandbox it yielded on
    exit (and closes the stream if the body left early).
    """

    def __iter__(self) -> Iterator["Sandbox"]:
        self._begin()
        stream = self._client._transport.stream_lines(self._req)
        with stream:
            if stream.content_type == "application/json":
                # Answered whole (e.g. the recorded answer of a repeated key).
                result = parse_batch(json.loads(stream.read_rest().decode("utf-8") or "{}"), self._client._sandbox)
                self.sandboxes.extend(result.sandboxes)
                self.errors.extend(result.errors)
                self._parser.done = {"done": True, "ok": result.ok, "created": len(result.sandboxes)}
                yield from result.sandboxes
                return
            for line in stream:
                sb = self._take(line)
                if sb is not None:
                    yield sb
        self._end()

    def kill_all(self) -> None:
        """Kills every sandbox yielded so far; errors are ignored."""
        for sb in self.sandboxes:
            try:
                sb.kill()
            except TidepoolError:
                pass

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill_all()


class Job(JobBase["Client"]):
    """A job handle, made by :meth:`Client.job`; see there for the lifecycle.

    Attributes:
        info: the last :class:`JobInfo` received (None before the job was created).
        heartbeats: how many background heartbeats succeeded.
        heartbeat_error: the last background heartbeat's error, if any.
    """

    def __init__(self, client: "Client", spec: Mapping[str, Any], heartbeat_interval: Optional[float]) -> None:
        super().__init__(client, spec, heartbeat_interval)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "Job":
        """Creates the job and starts heartbeating (what entering the ``with`` block does)."""
        self.info = JobInfo.from_json(self._client._call(self._create_request()))
        self._thread = threading.Thread(target=self._beat, name=f"tidepool-heartbeat-{self.info.id}", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                info = JobInfo.from_json(self._client._call(_api.job_heartbeat(self.id)))
            except TidepoolError as e:
                if self._beat_failed(e):
                    return
                continue
            if not self._stop.is_set():
                self.info = info
                self.heartbeats += 1

    @property
    def heartbeating(self) -> bool:
        """True while the background thread renews the lease."""
        return self._thread is not None and self._thread.is_alive()

    def stop_heartbeat(self) -> None:
        """Stops the background heartbeats (the lease then lapses unless renewed by hand)."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join()

    def heartbeat(self) -> JobInfo:
        """Renews the lease now (a lapsed job is active again)."""
        self.info = JobInfo.from_json(self._client._call(_api.job_heartbeat(self.id)))
        return self.info

    def refresh(self) -> JobInfo:
        """Fetches the job's state and what its sandboxes hold (``info.use``)."""
        self.info = JobInfo.from_json(self._client._call(_api.job_get(self.id)))
        return self.info

    def create(self, step: Optional[str] = None, **kwargs: Any) -> "Sandbox":
        """:meth:`Client.create` within this job (and ``step``, when given)."""
        return self._client.create(**self._placed(step, kwargs))

    def create_batch(self, count: int, step: Optional[str] = None, **kwargs: Any) -> "BatchResult[Sandbox]":
        """:meth:`Client.create_batch` within this job (and ``step``)."""
        return self._client.create_batch(count, **self._placed(step, kwargs))

    def create_batch_stream(self, count: int, step: Optional[str] = None, **kwargs: Any) -> BatchStream:
        """:meth:`Client.create_batch_stream` within this job (and ``step``)."""
        return self._client.create_batch_stream(count, **self._placed(step, kwargs))

    def step(self, name: str) -> "Step":
        """A step of this job: a context manager whose exit removes the step's sandboxes."""
        return Step(self, name)

    def end_step(self, name: str) -> int:
        """Removes every sandbox of step ``name``; returns how many."""
        return int(self._client._call(_api.job_end_step(self.id, name)).get("reclaimed") or 0)

    def end(self) -> Optional[JobInfo]:
        """Stops heartbeating and ends the job, removing its sandboxes. Ending it again (or
        a job the daemon no longer knows) is not an error; returns the final description."""
        self.stop_heartbeat()
        if self.info is None or self._ended:
            return self.info
        try:
            self.info = JobInfo.from_json(self._client._call(_api.job_end(self.id)))
        except NotFound:
            pass
        self._ended = True
        return self.info

    def __enter__(self) -> "Job":
        return self.start() if self.info is None else self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.end()
        except TidepoolError:
            if exc_type is None:
                raise


class Step(StepBase):
    """A step of a :class:`Job` (``job.step(name)``): sandboxes created through it carry
    the step's tag; leaving the ``with`` block removes them all in one call."""

    job: Job

    def create(self, **kwargs: Any) -> "Sandbox":
        """:meth:`Client.create` within this step."""
        return self.job.create(self.name, **kwargs)

    def create_batch(self, count: int, **kwargs: Any) -> "BatchResult[Sandbox]":
        """:meth:`Client.create_batch` within this step."""
        return self.job.create_batch(count, self.name, **kwargs)

    def create_batch_stream(self, count: int, **kwargs: Any) -> BatchStream:
        """:meth:`Client.create_batch_stream` within this step."""
        return self.job.create_batch_stream(count, self.name, **kwargs)

    def end(self) -> int:
        """Removes the step's sandboxes; returns how many."""
        self.reclaimed = self.job.end_step(self.name)
        return self.reclaimed

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.end()
        except TidepoolError:
            if exc_type is None:
                raise


def _parse_ndjson(lines: Iterator[bytes]) -> Iterator[OutputChunk]:
    """Turns the NDJSON exec events into chunks; returns the final ExecResult."""
    parser = StreamParser()
    for line in lines:
        item = parser.feed(line)
        if item is None:
            continue
        if isinstance(item, ExecResult):
            # Read the end of the body so the connection can be reused.
            for _ in lines:
                pass
            return item
        yield item
    raise parser.missing_exit()
