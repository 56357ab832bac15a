"""asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox`, :class:`AsyncFiles`,
:class:`AsyncProcessHandle`. The same methods as the sync client, as coroutines.

Example::

    import asyncio, tidepool

    async def main():
        async with tidepool.AsyncClient() as client:
            async with await client.create(ttl=600) as sb:
                r = await sb.exec("echo hi")
                print(r.stdout)
            batch = await client.create_batch(8, ttl=600)
            async with batch:                       # kills all 8 at the end
                results = await asyncio.gather(*(sb.exec("uname -n") for sb in batch))

    asyncio.run(main())

Cancellation: a call whose task is cancelled closes its connection, which makes the
daemon stop the command it was running. ``async with sandbox`` kills the sandbox on exit
even when the body was cancelled: the kill is shielded and completes before the
cancellation propagates.

Thread rules: share a client freely between the tasks of one event loop (one connection
pool of ``max_connections``); do not use it from several threads. Reusing it from a later
event loop (another ``asyncio.run``) works: it then starts a fresh pool.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Tuple, Union

from . import _api, _tar
from ._aio import AsyncTransport
from ._base import (USER_AGENT, BatchStreamBase, ClientBase, FilesBase, JobBase, ProcessHandleBase, SandboxBase,
                    StepBase, TrajectoryBase, command_opts, create_fields, from_pool_header, run_fields)
from ._http import Request, default_url, prepare
from ._retry import DEFAULT_RETRY, RetryPolicy
from .errors import NotFound, TidepoolError
from .models import BatchResult, ExecResult, FileEntry, LogEntry, OutputChunk, ProcessInfo, ReplayReport, SandboxInfo
from .models import StreamParser, _finish, checked, chunks_of, parse_answer, parse_batch, parse_entries
from .models import parse_exec_json, parse_log, parse_processes, parse_replay, parse_sandboxes, run_shielded
from .models import wait_result
from .models import RunResult, parse_run_batch
from .models import JobInfo, Pool, Template, parse_jobs, parse_pools, parse_templates

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncProcessHandle", "AsyncTrajectory", "AsyncBatchStream",
           "AsyncJob", "AsyncStep"]

Data = Union[bytes, bytearray, memoryview, str]


class AsyncClient(ClientBase):
    """asyncio connection pool to a Tidepool daemon; every method is a coroutine.

    Args:
        url: ``http://HOST:PORT`` or ``unix:/PATH`` (the daemon's unix socket); default
            ``$TIDEPOOL_URL``, else the unix socket (``$TIDEPOOL_SOCKET`` or
            ``/run/tidepool/tidepool.sock``) when it exists, else ``http://127.0.0.1:7070``.
        api_key: sent as ``Authorization: Bearer`` over TCP (which needs one unless the
            daemon runs with ``--insecure-tcp``); default ``$TIDEPOOL_API_KEY`` when set.
            The unix socket needs none: the daemon knows the caller by its uid.
        timeout: seconds for connecting and for each answer of ordinary calls (``None``
            waits forever); command calls wait for the command's timeout plus this much.
        retry: how transient failures are retried (see :class:`RetryPolicy`).
        max_connections: most requests in flight at once; more calls wait for a slot.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        retry: Optional[RetryPolicy] = None,
        max_connections: int = 256,
    ) -> None:
        key = self._configure(url or default_url(), api_key, timeout)
        self._transport = AsyncTransport(self.url, key, timeout, USER_AGENT, retry or DEFAULT_RETRY, max_connections)

    # -- plumbing ----------------------------------------------------------------

    async def _call(self, req: Request, idempotency_key: Optional[str] = None) -> Any:
        return (await self._transport.request(prepare(req, idempotency_key))).json()

    async def close(self) -> None:
        """Closes the client's connections. Sandboxes stay alive; kill them first if needed."""
        await self._transport.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- daemon ------------------------------------------------------------------

    async def health(self) -> Dict[str, Any]:
        """GET /health: ``{"status": "ok"}`` when the daemon serves."""
        return await self._call(Request("GET", "/health"))

    async def version(self) -> Dict[str, Any]:
        """GET /version: daemon version, API version and the tiers it offers."""
        return await self._call(Request("GET", "/version"))

    async def metrics(self) -> str:
        """GET /metrics: the Prometheus text exposition."""
        return (await self._transport.request(_api.metrics())).body.decode("utf-8", errors="replace")

    # -- the function tier -------------------------------------------------------

    async def run_code(
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
        """Runs a program once in the function tier (arguments as :meth:`tidepool.Client.run_code`)."""
        fields = run_fields(language, source, stdin, timeout, memory_mb, files, args, env, fetch_files,
                            compile_timeout, max_output_bytes)
        return RunResult.from_json(await self._call(_api.run_code(self.timeout, **fields), idempotency_key))

    async def run_code_batch(
        self, runs: List[Mapping[str, Any]], idempotency_key: Optional[str] = None, **defaults: Any
    ) -> List[Union[RunResult, Exception]]:
        """Runs many programs, or one against many inputs (as :meth:`tidepool.Client.run_code_batch`)."""
        return parse_run_batch(await self._call(_api.run_code_batch(runs, defaults), idempotency_key))

    async def fn_languages(self) -> List[Dict[str, Any]]:
        """The languages the function tier serves (name, aliases, SandboxFusion names, ...)."""
        return list((await self._call(_api.fn_languages())).get("languages") or [])

    async def fn_status(self) -> Dict[str, Any]:
        """The function tier's workers, queue, rate and verdict counts."""
        return await self._call(_api.fn_status())

    # -- sandboxes ---------------------------------------------------------------

    async def create(
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
    ) -> "AsyncSandbox":
        """Creates a sandbox and returns it once it runs (arguments as :meth:`tidepool.Client.create`).

        If the call is cancelled after the daemon created the sandbox, the sandbox is
        killed before the cancellation propagates, so nothing is left running unseen.
        """
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        resp = await self._create_call(self._create_request(None, fields), idempotency_key)
        info = SandboxInfo.from_json(resp.json())
        info.from_pool = from_pool_header(resp.headers)
        return AsyncSandbox(self, info)

    async def _create_call(self, req: Request, idempotency_key: Optional[str]) -> Any:
        """Sends a create request and returns the whole answer; if cancelled meanwhile,
        finds out what was created (by repeating the request with the same idempotency
        key, which only replays the recorded answer) and kills it before the cancellation
        propagates."""
        prepare(req, idempotency_key)
        try:
            return await self._transport.request(req)
        except asyncio.CancelledError:
            task = asyncio.ensure_future(self._undo_create(req))
            await _finish(task)
            raise

    async def _undo_create(self, req: Request) -> None:
        try:
            obj = await self._call(req)
        except TidepoolError:
            return  # nothing was created, or it cannot be learned: the TTL reclaims it
        ids = [s.get("id") for s in obj.get("sandboxes") or []] if "sandboxes" in obj else [obj.get("id")]
        await asyncio.gather(*(self.kill(i) for i in ids if i), return_exceptions=True)

    async def create_batch(
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
    ) -> "BatchResult[AsyncSandbox]":
        """Creates ``count`` sandboxes alike in one request; see :meth:`tidepool.Client.create_batch`.

        ``async with`` the result kills them all at the end.
        """
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        resp = await self._create_call(self._create_request(count, fields, gang), idempotency_key)
        return parse_batch(resp.json(), self._sandbox)

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
    ) -> "AsyncBatchStream":
        """Yields each sandbox of a batch as soon as it is ready (``async for``); see
        :meth:`tidepool.Client.create_batch_stream`. Not a coroutine: nothing is sent until
        the iteration starts. ``async with`` it kills every sandbox yielded at the end."""
        fields = create_fields(image, tier, memory_mb, cpus, ttl, idle_timeout, labels, env, disk_mb, pids,
                               template, job, step, priority)
        return AsyncBatchStream(self, prepare(self._create_request(count, fields, gang, stream=True), idempotency_key))

    # -- templates, pools and jobs -------------------------------------------------

    async def create_template(self, name: str, **fields: Any) -> Template:
        """Creates a template; see :meth:`tidepool.Client.create_template`."""
        return Template.from_json(await self._call(_api.template_create(name, **fields)))

    async def put_template(self, name: str, version: Optional[int] = None, **fields: Any) -> Template:
        """Creates or replaces a template; see :meth:`tidepool.Client.put_template`."""
        return Template.from_json(await self._call(_api.template_put(name, version=version, **fields)))

    async def get_template(self, name: str) -> Template:
        """The template ``name`` with its pool (raises :class:`NotFound`)."""
        return Template.from_json(await self._call(_api.template_get(name)))

    async def list_templates(self) -> List[Template]:
        """Every template, with its pool."""
        return parse_templates(await self._call(_api.template_list()))

    async def delete_template(self, name: str) -> Template:
        """Removes a template and drains its pool (raises :class:`NotFound`)."""
        return Template.from_json(await self._call(_api.template_delete(name)))

    async def pools(self) -> List[Pool]:
        """Every warm pool."""
        return parse_pools(await self._call(_api.pools()))

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
    ) -> "AsyncJob":
        """A job handle for ``async with``: entering creates the job and starts a task that
        renews its lease; leaving cancels the task and ends the job. Arguments as
        :meth:`tidepool.Client.job`."""
        return AsyncJob(self, dict(name=name, lease=lease, grace=grace, max_sandboxes=max_sandboxes,
                                   max_memory_mb=max_memory_mb, max_cpus=max_cpus, labels=labels),
                        heartbeat_interval)

    async def get_job(self, job_id: str) -> JobInfo:
        """The job ``job_id`` with what its sandboxes hold (raises :class:`NotFound`)."""
        return JobInfo.from_json(await self._call(_api.job_get(job_id)))

    async def list_jobs(self, all: bool = False) -> List[JobInfo]:
        """The live jobs (with ``all=True`` the ended ones too)."""
        return parse_jobs(await self._call(_api.job_list(all)))

    async def end_job(self, job_id: str) -> JobInfo:
        """Ends a job by id, removing its sandboxes (raises :class:`NotFound`)."""
        return JobInfo.from_json(await self._call(_api.job_end(job_id)))

    def _sandbox(self, info: SandboxInfo) -> "AsyncSandbox":
        return AsyncSandbox(self, info)

    async def get(self, sandbox_id: str) -> "AsyncSandbox":
        """Returns the sandbox with this id; see :meth:`tidepool.Client.get` (raises NotFound)."""
        return AsyncSandbox(self, SandboxInfo.from_json(await self._call(_api.get(sandbox_id))))

    async def list(
        self,
        labels: Optional[Mapping[str, str]] = None,
        state: Optional[str] = None,
        all: bool = False,
    ) -> List["AsyncSandbox"]:
        """Lists sandboxes (filters as :meth:`tidepool.Client.list`)."""
        return parse_sandboxes(await self._call(_api.list_(labels, state, all)), self._sandbox)

    async def kill(self, sandbox_id: str) -> Optional[SandboxInfo]:
        """Destroys a sandbox by id; returns its final description, None if it was unknown."""
        try:
            return SandboxInfo.from_json(await self._call(_api.delete(sandbox_id)))
        except NotFound:
            return None


class AsyncFiles(FilesBase):
    """File operations inside one sandbox (``sandbox.files``), as coroutines."""

    async def write(self, path: str, data: Data, mode: Optional[int] = None,
                    idempotency_key: Optional[str] = None) -> FileEntry:
        """Writes ``data`` (bytes, or str as UTF-8) to ``path``, creating parents; see :meth:`tidepool.Files.write`."""
        req = _api.file_write(self._sb.id, path, data, mode)
        return FileEntry.from_json(await self._sb._client._call(req, idempotency_key))

    async def read(self, path: str) -> bytes:
        """Returns the content of the file at ``path``; see :meth:`tidepool.Files.read` (raises NotFound)."""
        return (await self._sb._client._transport.request(_api.file_read(self._sb.id, path))).body

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """Returns the content of ``path`` decoded as text (invalid bytes replaced)."""
        return (await self.read(path)).decode(encoding, errors="replace")

    async def list(self, path: str) -> List[FileEntry]:
        """Lists the directory at ``path``."""
        return parse_entries(await self._sb._client._call(_api.file_list(self._sb.id, path)))

    async def stat(self, path: str) -> FileEntry:
        """Describes ``path`` without following a final symlink; see :meth:`tidepool.Files.stat`."""
        return FileEntry.from_json(await self._sb._client._call(_api.file_stat(self._sb.id, path)))

    async def exists(self, path: str) -> bool:
        """True when ``path`` exists (a dangling symlink counts)."""
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def remove(self, path: str, recursive: bool = False, idempotency_key: Optional[str] = None) -> None:
        """Removes a file, or with ``recursive=True`` a whole directory tree."""
        req = prepare(_api.file_remove(self._sb.id, path, recursive), idempotency_key)
        await self._sb._client._transport.request(req)

    async def mkdir(self, path: str, parents: bool = False, idempotency_key: Optional[str] = None) -> FileEntry:
        """Creates a directory; with ``parents=True`` also missing parents."""
        req = _api.file_mkdir(self._sb.id, path, parents)
        return FileEntry.from_json(await self._sb._client._call(req, idempotency_key))

    async def upload_dir(self, local_dir: str, remote_dir: str, idempotency_key: Optional[str] = None) -> int:
        """Copies the tree under ``local_dir`` to ``remote_dir`` in one request (one tar);
        returns the archive's size. See :meth:`tidepool.Files.upload_dir`."""
        loop = asyncio.get_running_loop()
        archive = await loop.run_in_executor(None, _tar.pack_dir, local_dir)
        await self._sb._client._call(self._tar_put(remote_dir, archive), idempotency_key)
        return len(archive)

    async def download_dir(self, remote_dir: str, local_dir: str) -> List[str]:
        """Copies the tree under ``remote_dir`` into ``local_dir`` in one request; returns
        the relative names written. The archive is checked as hostile input, as in
        :meth:`tidepool.Files.download_dir` (:class:`UnsafeArchive` when refused)."""
        archive = (await self._sb._client._transport.request(self._tar_get(remote_dir))).body
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _tar.unpack_into, archive, local_dir)


class AsyncSandbox(SandboxBase["AsyncClient"]):
    """Handle of one sandbox for the asyncio client.

    ``async with sandbox:`` kills it on exit, also when the body raises or is cancelled.

    Attributes:
        info: the last description received from the daemon (see :meth:`refresh`).
        files: file operations, see :class:`AsyncFiles`.
    """

    _files_class = AsyncFiles
    _family = "asyncio"
    files: AsyncFiles

    async def refresh(self) -> "AsyncSandbox":
        """Fetches the current description from the daemon; returns self."""
        self.info = SandboxInfo.from_json(await self._client._call(_api.get(self.id)))
        return self

    async def kill(self) -> None:
        """Destroys the sandbox; killing one that is already gone is not an error."""
        self._killed(await self._client.kill(self.id))

    async def pause(self) -> "AsyncSandbox":
        """Freezes the sandbox's processes; see :meth:`tidepool.Sandbox.pause`."""
        self.info = SandboxInfo.from_json(await self._client._call(_api.pause(self.id)))
        return self

    async def resume(self) -> "AsyncSandbox":
        """Thaws a paused sandbox; see :meth:`tidepool.Sandbox.resume`."""
        self.info = SandboxInfo.from_json(await self._client._call(_api.resume(self.id)))
        return self

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Shielded: a cancellation of the body (or of this cleanup) must not leave the
        # sandbox running. The kill completes, then the cancellation propagates.
        try:
            await run_shielded(self.kill())
        except TidepoolError:
            if exc_type is None:
                raise

    # -- commands ----------------------------------------------------------------

    async def exec(
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
    ) -> Any:
        """Runs a command and returns its :class:`ExecResult`; with ``background=True`` returns
        an :class:`AsyncProcessHandle` at once. Arguments as :meth:`tidepool.Sandbox.exec`.

        Cancelling the awaiting task closes the connection, and the daemon kills the command.
        """
        opts = command_opts(timeout, env, cwd, user, stdin, max_output_bytes)
        if background:
            return await self.start(cmd, **opts, idempotency_key=idempotency_key)
        req = self._exec_request(cmd, opts, stream=False)
        return checked(ExecResult.from_json(await self._client._call(req, idempotency_key)), check)

    async def exec_stream(
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
    ) -> AsyncIterator[Union[OutputChunk, ExecResult]]:
        """Runs a command and yields :class:`OutputChunk` values as output is produced, then
        one :class:`ExecResult`; use ``async for``. See :meth:`tidepool.Sandbox.exec_stream`.

        Leaving the loop early (or ``aclose()``) drops the connection; the daemon then
        stops the command.
        """
        req = self._exec_request(cmd, command_opts(timeout, env, cwd, user, stdin, max_output_bytes), stream=True)
        stream = await self._client._transport.stream_lines(prepare(req, idempotency_key))
        result: Optional[ExecResult] = None
        try:
            if stream.content_type == "application/json":
                result = parse_exec_json(await stream.read_rest())
                for chunk in chunks_of(result):
                    yield chunk
            else:
                parser = StreamParser()
                async for line in stream:
                    item = parser.feed(line)
                    if item is None:
                        continue
                    if isinstance(item, ExecResult):
                        result = item
                        async for _ in stream:  # drain so the connection is reused
                            pass
                        break
                    yield item
                if result is None:
                    raise parser.missing_exit()
        finally:
            stream.close()
        yield checked(result, check)

    # -- the trajectory log --------------------------------------------------------

    async def log(self, after: int = 0, limit: Optional[int] = None, output: bool = False) -> List[LogEntry]:
        """The sandbox's history after the cursor ``after``; see :meth:`tidepool.Sandbox.log`."""
        return parse_log(await self._client._call(_api.log_(self.id, after, limit, output)))

    async def follow_log(self, after: int = 0, output: bool = False) -> AsyncIterator[LogEntry]:
        """Yields log entries as they are written until the sandbox ends (``async for``);
        resume with ``after=<last seq seen>``. See :meth:`tidepool.Sandbox.follow_log`."""
        stream = await self._client._transport.stream_lines(_api.log_(self.id, after, None, output, follow=True))
        try:
            async for line in stream:
                line = line.strip()
                if line:
                    yield LogEntry.from_json(json.loads(line.decode("utf-8")))
        finally:
            stream.close()

    async def step_result(self, key: str) -> Any:
        """The recorded answer of the call keyed ``key``; see :meth:`tidepool.Sandbox.step_result`."""
        resp = await self._client._transport.request(_api.log_result(self.id, key))
        return parse_answer(resp.headers.get("content-type", ""), resp.body)

    async def replay(self, to_step: Optional[int] = None, *, to_key: Optional[str] = None, branch: bool = False,
                     keep: bool = False, rekey: Optional[Tuple[str, str]] = None,
                     idempotency_key: Optional[str] = None) -> "ReplayReport[AsyncSandbox]":
        """Replays this sandbox's log into a fresh sandbox; see :meth:`tidepool.Sandbox.replay`."""
        req = _api.replay(self.id, to_step, to_key, branch, keep, rekey)
        return parse_replay(await self._client._call(req, idempotency_key), self._client._sandbox)

    # -- background processes ------------------------------------------------------

    async def start(
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
    ) -> "AsyncProcessHandle":
        """Starts a background command; returns its :class:`AsyncProcessHandle` once it runs.
        See :meth:`tidepool.Sandbox.start`."""
        opts = command_opts(timeout, env, cwd, user, stdin, max_output_bytes)
        req = _api.process_start(self.id, cmd, stdin_open=stdin_open, **opts)
        info = ProcessInfo.from_json(await self._client._call(req, idempotency_key))
        return AsyncProcessHandle(self, info.pid, info)

    async def processes(self) -> List[ProcessInfo]:
        """The sandbox's background processes."""
        return parse_processes(await self._client._call(_api.process_list(self.id)))

    def process(self, pid: int) -> "AsyncProcessHandle":
        """A handle for the background process ``pid``."""
        return AsyncProcessHandle(self, pid)


class AsyncProcessHandle(ProcessHandleBase):
    """A background command of an :class:`AsyncSandbox`; see :class:`tidepool.ProcessHandle`.

    Attributes:
        sandbox: the sandbox it runs in.
        pid: its handle inside the sandbox.
        info: the last description received.
    """

    sandbox: AsyncSandbox

    async def refresh(self) -> ProcessInfo:
        """Fetches the process's current state (and result once it exited)."""
        self.info = ProcessInfo.from_json(await self.sandbox._client._call(self._get()))
        return self.info

    async def poll(self) -> Optional[ExecResult]:
        """The result if the process exited, else None (does not wait)."""
        return (await self.refresh()).result

    async def wait(self, timeout: Optional[_api.Seconds] = None, check: bool = False,
                   idempotency_key: Optional[str] = None) -> ExecResult:
        """Waits until the process exits; returns its result with all its output.

        Raises:
            Timeout: it still runs after ``timeout`` seconds.
        """
        info = ProcessInfo.from_json(await self.sandbox._client._call(self._wait(timeout), idempotency_key))
        return wait_result(self, info, timeout, check)

    async def kill(self, signal: int = 9, idempotency_key: Optional[str] = None) -> None:
        """Sends ``signal`` to every process of the command (9 kills its whole tree)."""
        await self.sandbox._client._call(self._signal(signal), idempotency_key)

    async def send_stdin(self, data: Union[bytes, str], eof: bool = False,
                         idempotency_key: Optional[str] = None) -> None:
        """Writes ``data`` to the process's standard input; ``eof=True`` closes it afterwards."""
        await self.sandbox._client._call(self._stdin(data, eof), idempotency_key)

    async def close_stdin(self) -> None:
        """Closes the process's standard input."""
        await self.send_stdin(b"", eof=True)


class AsyncTrajectory(TrajectoryBase):
    """The asyncio form of :class:`tidepool.Trajectory`: the same step numbering, every
    call a coroutine. ``tidepool.Trajectory(async_sandbox, id)`` returns one.

    Steps are numbered in the order the calls are made: issue them one after another
    (``await`` each), not concurrently, so that a restarted trainer numbers them alike.
    """

    sandbox: AsyncSandbox

    @classmethod
    async def create(cls, client: AsyncClient, id: str, **create_args: Any) -> "AsyncTrajectory":
        """A new sandbox for trajectory ``id`` (keyed ``f"{id}/sandbox"``) and its trajectory."""
        return cls(await client.create(**create_args, idempotency_key=f"{id}/sandbox"), id)

    async def exec(self, cmd: _api.Command, **kwargs: Any) -> ExecResult:
        """:meth:`AsyncSandbox.exec` as the next step."""
        return await self.sandbox.exec(cmd, idempotency_key=self._next_key(), **kwargs)

    def exec_stream(self, cmd: _api.Command, **kwargs: Any) -> AsyncIterator[Union[OutputChunk, ExecResult]]:
        """:meth:`AsyncSandbox.exec_stream` as the next step (``async for``)."""
        return self.sandbox.exec_stream(cmd, idempotency_key=self._next_key(), **kwargs)

    async def start(self, cmd: _api.Command, **kwargs: Any) -> "AsyncProcessHandle":
        """:meth:`AsyncSandbox.start` as the next step."""
        return await self.sandbox.start(cmd, idempotency_key=self._next_key(), **kwargs)

    async def wait(self, proc: "AsyncProcessHandle", timeout: Optional[_api.Seconds] = None,
                   check: bool = False) -> ExecResult:
        """:meth:`AsyncProcessHandle.wait` as the next step."""
        return await proc.wait(timeout, check, idempotency_key=self._next_key())

    async def kill(self, proc: "AsyncProcessHandle", signal: int = 9) -> None:
        """:meth:`AsyncProcessHandle.kill` as the next step."""
        await proc.kill(signal, idempotency_key=self._next_key())

    async def send_stdin(self, proc: "AsyncProcessHandle", data: Union[bytes, str], eof: bool = False) -> None:
        """:meth:`AsyncProcessHandle.send_stdin` as the next step."""
        await proc.send_stdin(data, eof, idempotency_key=self._next_key())

    async def write(self, path: str, data: Data, mode: Optional[int] = None) -> FileEntry:
        """:meth:`AsyncFiles.write` as the next step."""
        return await self.sandbox.files.write(path, data, mode, idempotency_key=self._next_key())

    async def remove(self, path: str, recursive: bool = False) -> None:
        """:meth:`AsyncFiles.remove` as the next step."""
        await self.sandbox.files.remove(path, recursive, idempotency_key=self._next_key())

    async def mkdir(self, path: str, parents: bool = False) -> FileEntry:
        """:meth:`AsyncFiles.mkdir` as the next step."""
        return await self.sandbox.files.mkdir(path, parents, idempotency_key=self._next_key())

    async def upload_dir(self, local_dir: str, remote_dir: str) -> int:
        """:meth:`AsyncFiles.upload_dir` as the next step."""
        return await self.sandbox.files.upload_dir(local_dir, remote_dir, idempotency_key=self._next_key())

    async def log(self) -> List[LogEntry]:
        """This trajectory's steps in the sandbox's log."""
        out: List[LogEntry] = []
        after = 0
        while True:
            part = await self.sandbox.log(after=after, limit=10000)
            if not part:
                return out
            out.extend(e for e in part if e.key and e.key.startswith(self.prefix))
            after = part[-1].seq

    async def result(self, step: int) -> Any:
        """The recorded result of step ``step``."""
        return await self.sandbox.step_result(self.key(step))

    async def replay(self, to_step: Optional[int] = None, keep: bool = False) -> "ReplayReport[AsyncSandbox]":
        """See :meth:`tidepool.Trajectory.replay`."""
        client = self.sandbox.client
        return parse_replay(await client._call(self._replay_request(to_step, keep)), client._sandbox)

    async def branch(self, k: int, id: Optional[str] = None) -> "AsyncTrajectory":
        """See :meth:`tidepool.Trajectory.branch`."""
        new_id = self._branch_id(k, id)
        client = self.sandbox.client
        report = parse_replay(await client._call(self._branch_request(k, new_id), f"{new_id}/branch"), client._sandbox)
        if report.sandbox is None:
            raise TidepoolError("internal", f"branch of {self.sandbox.id} at step {k} returned no sandbox", None)
        t = AsyncTrajectory(report.sandbox, new_id, start=k)
        t.report = report
        return t


class AsyncBatchStream(BatchStreamBase["AsyncClient"]):
    """The sandboxes of :meth:`AsyncClient.create_batch_stream` as they become ready
    (``async for``); see :class:`tidepool.BatchStream`."""

    async def __aiter__(self) -> AsyncIterator["AsyncSandbox"]:
        self._begin()
        stream = await self._client._transport.stream_lines(self._req)
        try:
            if stream.content_type == "application/json":
                result = parse_batch(json.loads((await stream.read_rest()).decode("utf-8") or "{}"),
                                     self._client._sandbox)
                self.sandboxes.extend(result.sandboxes)
                self.errors.extend(result.errors)
                self._parser.done = {"done": True, "ok": result.ok, "created": len(result.sandboxes)}
                for sb in result.sandboxes:
                    yield sb
                return
            async for line in stream:
                sb = self._take(line)
                if sb is not None:
                    yield sb
        finally:
            stream.close()
        self._end()

    async def kill_all(self) -> None:
        """Kills every sandbox yielded so far, concurrently; errors are ignored."""
        await asyncio.gather(*(sb.kill() for sb in self.sandboxes), return_exceptions=True)

    async def __aenter__(self) -> "AsyncBatchStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await run_shielded(self.kill_all())


class AsyncJob(JobBase["AsyncClient"]):
    """A job handle for the asyncio client (:meth:`AsyncClient.job`); heartbeats run in a
    task of the loop that entered it. See :class:`tidepool.Job`."""

    def __init__(self, client: "AsyncClient", spec: Mapping[str, Any], heartbeat_interval: Optional[float]) -> None:
        super().__init__(client, spec, heartbeat_interval)
        self._task: Optional["asyncio.Task[None]"] = None

    async def start(self) -> "AsyncJob":
        """Creates the job and starts the heartbeat task (what ``async with`` does)."""
        self.info = JobInfo.from_json(await self._client._call(self._create_request()))
        self._task = asyncio.ensure_future(self._beat())
        return self

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                self.info = JobInfo.from_json(await self._client._call(_api.job_heartbeat(self.id)))
            except TidepoolError as e:
                if self._beat_failed(e):
                    return
                continue
            self.heartbeats += 1

    @property
    def heartbeating(self) -> bool:
        """True while the heartbeat task runs."""
        return self._task is not None and not self._task.done()

    async def stop_heartbeat(self) -> None:
        """Cancels the heartbeat task and waits for it to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    async def heartbeat(self) -> JobInfo:
        """Renews the lease now."""
        self.info = JobInfo.from_json(await self._client._call(_api.job_heartbeat(self.id)))
        return self.info

    async def refresh(self) -> JobInfo:
        """Fetches the job's state and what its sandboxes hold."""
        self.info = JobInfo.from_json(await self._client._call(_api.job_get(self.id)))
        return self.info

    async def create(self, step: Optional[str] = None, **kwargs: Any) -> "AsyncSandbox":
        """:meth:`AsyncClient.create` within this job (and ``step``)."""
        return await self._client.create(**self._placed(step, kwargs))

    async def create_batch(self, count: int, step: Optional[str] = None, **kwargs: Any) -> "BatchResult[AsyncSandbox]":
        """:meth:`AsyncClient.create_batch` within this job (and ``step``)."""
        return await self._client.create_batch(count, **self._placed(step, kwargs))

    def create_batch_stream(self, count: int, step: Optional[str] = None, **kwargs: Any) -> AsyncBatchStream:
        """:meth:`AsyncClient.create_batch_stream` within this job (and ``step``)."""
        return self._client.create_batch_stream(count, **self._placed(step, kwargs))

    def step(self, name: str) -> "AsyncStep":
        """A step of this job for ``async with``: its exit removes the step's sandboxes."""
        return AsyncStep(self, name)

    async def end_step(self, name: str) -> int:
        """Removes every sandbox of step ``name``; returns how many."""
        return int((await self._client._call(_api.job_end_step(self.id, name))).get("reclaimed") or 0)

    async def end(self) -> Optional[JobInfo]:
        """Stops heartbeating and ends the job (again: not an error)."""
        await self.stop_heartbeat()
        if self.info is None or self._ended:
            return self.info
        try:
            self.info = JobInfo.from_json(await self._client._call(_api.job_end(self.id)))
        except NotFound:
            pass
        self._ended = True
        return self.info

    async def __aenter__(self) -> "AsyncJob":
        return await self.start() if self.info is None else self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Shielded: a cancelled body must still end the job (and so its sandboxes).
        try:
            await run_shielded(self.end())
        except TidepoolError:
            if exc_type is None:
                raise


class AsyncStep(StepBase):
    """A step of an :class:`AsyncJob`; ``async with`` it removes its sandboxes at the end."""

    job: AsyncJob

    async def create(self, **kwargs: Any) -> "AsyncSandbox":
        """:meth:`AsyncClient.create` within this step."""
        return await self.job.create(self.name, **kwargs)

    async def create_batch(self, count: int, **kwargs: Any) -> "BatchResult[AsyncSandbox]":
        """:meth:`AsyncClient.create_batch` within this step."""
        return await self.job.create_batch(count, self.name, **kwargs)

    def create_batch_stream(self, count: int, **kwargs: Any) -> AsyncBatchStream:
        """:meth:`AsyncClient.create_batch_stream` within this step."""
        return self.job.create_batch_stream(count, self.name, **kwargs)

    async def end(self) -> int:
        """Removes the step's sandboxes; returns how many."""
        self.reclaimed = await self.job.end_step(self.name)
        return self.reclaimed

    async def __aenter__(self) -> "AsyncStep":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await run_shielded(self.end())
        except TidepoolError:
            if exc_type is None:
                raise
