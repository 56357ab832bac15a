"""Tidepool Python SDK: create sandboxes, run commands, move files; sync and asyncio.

Standard library only, Python 3.9+. Quick start::

    import tidepool

    client = tidepool.Client()                 # $TIDEPOOL_URL or http://127.0.0.1:7070
    with client.create(image="host", memory_mb=512, ttl=600) as sb:
        r = sb.exec("echo hello; exit 3")
        print(r.exit_code, r.stdout)           # 3 hello

The asyncio client has the same methods as coroutines::

    async with tidepool.AsyncClient() as client:
        async with await client.create_batch(16, ttl=600) as batch:
            results = await asyncio.gather(*(sb.exec("make test") for sb in batch))

The function tier runs a program once, without a sandbox of your own::

    r = client.run_code("python", "print(int(input()) * 2)", stdin="21\n")
    print(r.verdict, r.stdout)                 # ok 42

Errors are typed exceptions, all subclasses of :class:`TidepoolError`. Transient
failures are retried (:class:`RetryPolicy`); state-changing calls carry an
``Idempotency-Key`` so a retry never runs anything twice. A :class:`Trajectory` numbers
the steps of a rollout, so that a trainer restarted mid-rollout fast-forwards through
the steps that finished and runs each step exactly once::

    traj = tidepool.Trajectory.create(client, "run7/rollout-3", ttl=3600)
    traj.exec("make test")                     # key "run7/rollout-3/1"

Templates name a sandbox shape and keep a warm pool of it; jobs hold the sandboxes of
one training run under a lease the client renews in the background::

    client.put_template("py", image="py:1", memory_mb=1024, pool_min=4, pool_max=32)
    with client.job("run7", lease=60, max_sandboxes=64) as job:
        with job.step("12") as step:
            for sb in step.create_batch_stream(16, template="py"):
                ...                            # each sandbox as soon as it is ready
"""
from ._retry import RetryPolicy
from .aio import (AsyncBatchStream, AsyncClient, AsyncFiles, AsyncJob, AsyncProcessHandle, AsyncSandbox, AsyncStep,
                  AsyncTrajectory)
from .client import DEFAULT_URL, BatchStream, Client, Files, Job, ProcessHandle, Sandbox, Step, Trajectory
from .errors import (
    CommandFailed,
    Conflict,
    InsufficientStorage,
    InvalidArgument,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    QuotaExceeded,
    SandboxError,
    TidepoolError,
    Timeout,
    Unauthenticated,
    Unavailable,
    UnsafeArchive,
)
from .models import (BatchError, BatchItem, BatchResult, Divergence, ExecResult, FileEntry, JobInfo, LogEntry,
                     OutputChunk, Pool, ProcessInfo, ReplayReport, RunResult, SandboxInfo, StepResult, Template)
from .version import __version__

__all__ = [
    "Client",
    "Sandbox",
    "Files",
    "ProcessHandle",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncProcessHandle",
    "Trajectory",
    "AsyncTrajectory",
    "RetryPolicy",
    "BatchStream",
    "AsyncBatchStream",
    "Job",
    "AsyncJob",
    "Step",
    "AsyncStep",
    "Template",
    "Pool",
    "JobInfo",
    "BatchItem",
    "SandboxInfo",
    "ExecResult",
    "OutputChunk",
    "FileEntry",
    "ProcessInfo",
    "RunResult",
    "StepResult",
    "BatchResult",
    "BatchError",
    "LogEntry",
    "ReplayReport",
    "Divergence",
    "TidepoolError",
    "InvalidArgument",
    "Unauthenticated",
    "PermissionDenied",
    "NotFound",
    "Conflict",
    "PayloadTooLarge",
    "QuotaExceeded",
    "SandboxError",
    "Unavailable",
    "Timeout",
    "InsufficientStorage",
    "UnsafeArchive",
    "CommandFailed",
    "DEFAULT_URL",
    "__version__",
]
