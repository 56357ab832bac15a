#!/usr/bin/env python3
"""A GRPO-style rollout loop for SWE-like repair tasks, on Tidepool's asyncio client.

Shape of one training step, as an RL trainer runs it:

1. For every task, sample N rollouts (a "group"); create all sandboxes with ONE batch call.
2. Each rollout is a multi-turn episode: the repository is uploaded (one tar request),
   then the agent acts: it reads files, writes edits, runs commands.
3. The reward comes from running the task's tests inside the sandbox.
4. Every sandbox is destroyed (``async with batch``), also on Ctrl-C or an error.
5. Rewards are turned into group-relative advantages (reward - group mean) / group std.

The "policy" here is a stand-in that picks one of a few candidate patches at random, so
rewards vary within a group the way a real model's do. Every step carries an
idempotency key (run/task/sample/step): a trainer that is preempted and replays its
steps gets the recorded results instead of running anything twice.

Run against `make run`:

    PYTHONPATH=sdk/python /usr/bin/python3 examples/rollout_swe.py --samples 4
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

import tidepool  # noqa: E402

# -- tasks ---------------------------------------------------------------------------

TEST_RUNNER = '''\
import importlib, sys, traceback
sys.path.insert(0, "/repo")
tests = importlib.import_module("test_{mod}")
names = sorted(n for n in dir(tests) if n.startswith("test_"))
passed = 0
for n in names:
    try:
        getattr(tests, n)()
        passed += 1
    except Exception:
        traceback.print_exc()
print(f"PASSED {{passed}}/{{len(names)}}")
'''


@dataclass
class Task:
    """A small repository with a bug, its tests, and candidate patches of varying quality."""

    name: str
    module: str
    source: str
    tests: str
    patches: List[Tuple[str, str]]  # (description, new source); the policy picks one


TASKS: List[Task] = [
    Task(
        name="off-by-one",
        module="ranges",
        source="def inclusive_range(a, b):\n    return list(range(a, b))\n",
        tests=(
            "from ranges import inclusive_range\n"
            "def test_simple():\n    assert inclusive_range(1, 3) == [1, 2, 3]\n"
            "def test_single():\n    assert inclusive_range(5, 5) == [5]\n"
            "def test_empty():\n    assert inclusive_range(3, 1) == []\n"
        ),
        patches=[
            ("fix upper bound", "def inclusive_range(a, b):\n    return list(range(a, b + 1))\n"),
            ("wrong fix", "def inclusive_range(a, b):\n    return list(range(a - 1, b))\n"),
            ("no-op", "def inclusive_range(a, b):\n    return list(range(a, b))\n"),
        ],
    ),
    Task(
        name="parse-kv",
        module="kv",
        source=(
            "def parse(text):\n    out = {}\n    for line in text.splitlines():\n"
            "        k, v = line.split('=')\n        out[k] = v\n    return out\n"
        ),
        tests=(
            "from kv import parse\n"
            "def test_basic():\n    assert parse('a=1\\nb=2') == {'a': '1', 'b': '2'}\n"
            "def test_blank_lines():\n    assert parse('a=1\\n\\nb=2\\n') == {'a': '1', 'b': '2'}\n"
            "def test_equals_in_value():\n    assert parse('url=x=y') == {'url': 'x=y'}\n"
            "def test_spaces():\n    assert parse(' a = 1 ') == {'a': '1'}\n"
        ),
        patches=[
            ("full fix", "def parse(text):\n    out = {}\n    for line in text.splitlines():\n"
                         "        if not line.strip():\n            continue\n"
                         "        k, v = line.split('=', 1)\n        out[k.strip()] = v.strip()\n    return out\n"),
            ("partial fix", "def parse(text):\n    out = {}\n    for line in text.splitlines():\n"
                            "        if not line:\n            continue\n"
                            "        k, v = line.split('=', 1)\n        out[k] = v\n    return out\n"),
            ("syntax error", "def parse(text)\n    return {}\n"),
        ],
    ),
    Task(
        name="median",
        module="stats",
        source="def median(xs):\n    xs = sorted(xs)\n    return xs[len(xs) // 2]\n",
        tests=(
            "from stats import median\n"
            "def test_odd():\n    assert median([3, 1, 2]) == 2\n"
            "def test_even():\n    assert median([4, 1, 3, 2]) == 2.5\n"
            "def test_skewed():\n    assert median([1, 2, 100]) == 2\n"
        ),
        patches=[
            ("fix even case", "def median(xs):\n    xs = sorted(xs)\n    n = len(xs)\n"
                              "    if n % 2:\n        return xs[n // 2]\n"
                              "    return (xs[n // 2 - 1] + xs[n // 2]) / 2\n"),
            ("wrong average", "def median(xs):\n    return sum(xs) / len(xs)\n"),
        ],
    ),
]


# -- rollouts ------------------------------------------------------------------------


@dataclass
class Rollout:
    """One episode's record: what it did and what it earned."""

    task: str
    sample: int
    sandbox: str = ""
    patch: str = ""
    reward: float = 0.0
    steps: int = 0
    seconds: float = 0.0
    error: Optional[str] = None
    advantage: float = 0.0
    log: List[str] = field(default_factory=list)


class Progress:
    """A one-line progress bar drawn with \\r and ANSI codes (plain lines when not a tty)."""

    def __init__(self, total: int, stream=sys.stderr) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.steps = 0
        self.failed = 0
        self.t0 = time.monotonic()
        self.stream = stream
        self.tty = stream.isatty()
        self._last_bucket = -1

    def update(self, done: int = 0, steps: int = 0, failed: int = 0) -> None:
        self.done += done
        self.steps += steps
        self.failed += failed
        self.draw()

    def draw(self, final: bool = False) -> None:
        width = 30
        frac = self.done / self.total
        filled = int(frac * width)
        elapsed = time.monotonic() - self.t0
        rate = self.steps / elapsed if elapsed > 0 else 0.0
        text = (f"rollouts {self.done:>4}/{self.total:<4} [{'#' * filled}{'.' * (width - filled)}] "
                f"{frac * 100:5.1f}%  steps {self.steps:>5} ({rate:6.1f}/s)  failed {self.failed}  "
                f"{elapsed:6.1f}s")
        if self.tty:
            color = "\x1b[32m" if self.failed == 0 else "\x1b[33m"
            self.stream.write(f"\r\x1b[2K{color}{text}\x1b[0m" + ("\n" if final else ""))
            self.stream.flush()
        else:
            # Not a terminal (a log file): one line per 10% of progress.
            bucket = self.done * 10 // self.total
            if bucket != self._last_bucket:
                self._last_bucket = bucket
                self.stream.write(text + "\n")
                self.stream.flush()


def make_repo(task: Task, root: str) -> str:
    """Writes the task's repository into a local directory (uploaded as one tar)."""
    d = os.path.join(root, task.name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{task.module}.py"), "w") as f:
        f.write(task.source)
    with open(os.path.join(d, f"test_{task.module}.py"), "w") as f:
        f.write(task.tests)
    with open(os.path.join(d, "run_tests.py"), "w") as f:
        f.write(TEST_RUNNER.format(mod=task.module))
    return d


async def run_episode(sb: tidepool.AsyncSandbox, task: Task, repo_dir: str, ro: Rollout,
                      run_id: str, rng: random.Random, progress: Progress) -> None:
    """One multi-turn episode: setup, agent actions, reward."""
    t0 = time.monotonic()
    step = 0

    def key() -> str:
        return f"{run_id}/{task.name}/{ro.sample}/{step}"

    async def act(cmd: str) -> tidepool.ExecResult:
        nonlocal step
        r = await sb.exec(cmd, cwd="/repo", timeout=30, idempotency_key=key())
        step += 1
        progress.update(steps=1)
        ro.log.append(f"$ {cmd} -> {r.exit_code}")
        return r

    try:
        # Setup: the whole repository in one request.
        await sb.files.upload_dir(repo_dir, "/repo")
        step += 1
        progress.update(steps=1)
        # The agent looks around, then edits.
        await act("ls -la && wc -l *.py")
        source = await sb.files.read_text(f"/repo/{task.module}.py")
        step += 1
        progress.update(steps=1)
        ro.log.append(f"read {task.module}.py ({len(source)} bytes)")
        desc, patch = rng.choice(task.patches)
        ro.patch = desc
        await sb.files.write(f"/repo/{task.module}.py", patch, idempotency_key=key())
        step += 1
        progress.update(steps=1)
        await act(f"python3 -c 'import {task.module}' 2>&1 | tail -1")
        # Reward: the tests' pass rate, measured inside the sandbox.
        r = await act("python3 run_tests.py")
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        if last.startswith("PASSED "):
            passed, total = last.split()[1].split("/")
            ro.reward = int(passed) / max(1, int(total))
        ro.steps = step
    except tidepool.TidepoolError as e:
        ro.error = f"{type(e).__name__}: {e.message}"
        ro.steps = step
    finally:
        ro.seconds = time.monotonic() - t0
        progress.update(done=1, failed=1 if ro.error else 0)


def advantages(rollouts: List[Rollout]) -> None:
    """GRPO: each rollout's advantage relative to its task group."""
    groups: Dict[str, List[Rollout]] = {}
    for ro in rollouts:
        groups.setdefault(ro.task, []).append(ro)
    for group in groups.values():
        rewards = [r.reward for r in group]
        mean = statistics.fmean(rewards)
        std = statistics.pstdev(rewards) or 1.0
        for r in group:
            r.advantage = (r.reward - mean) / std


def print_table(rollouts: List[Rollout], wall: float, create_s: float) -> None:
    """The summary: one row per rollout, then per task."""
    print()
    header = f"{'task':<12} {'#':>2} {'sandbox':<16} {'patch':<16} {'reward':>6} {'adv':>6} {'steps':>5} {'time':>7}  note"
    print(header)
    print("-" * len(header))
    for ro in sorted(rollouts, key=lambda r: (r.task, r.sample)):
        note = ro.error or ""
        print(f"{ro.task:<12} {ro.sample:>2} {ro.sandbox:<16} {ro.patch[:16]:<16} {ro.reward:>6.2f} "
              f"{ro.advantage:>+6.2f} {ro.steps:>5} {ro.seconds:>6.2f}s  {note}")
    print()
    print(f"{'task':<12} {'samples':>7} {'mean reward':>11} {'best':>5} {'solved':>6}")
    for name in sorted({r.task for r in rollouts}):
        g = [r for r in rollouts if r.task == name]
        print(f"{name:<12} {len(g):>7} {statistics.fmean(r.reward for r in g):>11.2f} "
              f"{max(r.reward for r in g):>5.2f} {sum(r.reward == 1.0 for r in g):>6}")
    steps = sum(r.steps for r in rollouts)
    print(f"\n{len(rollouts)} rollouts, {steps} steps in {wall:.2f}s "
          f"(batch create {create_s:.2f}s, {steps / wall if wall else 0:.1f} steps/s)")


async def train_step(client: tidepool.AsyncClient, tasks: List[Task], samples: int, seed: int,
                     memory_mb: int) -> List[Rollout]:
    """Creates one batch for every (task, sample), runs all episodes concurrently, cleans up."""
    run_id = uuid.uuid4().hex[:8]
    rng = random.Random(seed)
    plan = [(t, s) for t in tasks for s in range(samples)]
    tmp = tempfile.mkdtemp(prefix="tidepool-rollout-")
    try:
        repos = {t.name: make_repo(t, tmp) for t in tasks}
        t0 = time.monotonic()
        batch = await client.create_batch(len(plan), image="host", memory_mb=memory_mb, cpus=0.5,
                                          ttl=600, labels={"example": "rollout_swe", "run": run_id})
        create_s = time.monotonic() - t0
        rollouts = [Rollout(task=t.name, sample=s) for t, s in plan]
        for err in batch.errors:  # items that did not start still get a row (reward 0)
            rollouts[err.index].error = f"create failed: {err.code}: {err.message}"
        progress = Progress(len(plan))
        progress.update(done=len(batch.errors), failed=len(batch.errors))
        async with batch:  # every sandbox is killed on exit, also on cancellation
            ok_indexes = [i for i in range(len(plan)) if rollouts[i].error is None]
            jobs = []
            for sb, i in zip(batch.sandboxes, ok_indexes):
                task, _ = plan[i]
                rollouts[i].sandbox = sb.id
                jobs.append(run_episode(sb, task, repos[task.name], rollouts[i], run_id,
                                        random.Random(rng.random()), progress))
            await asyncio.gather(*jobs)
        progress.draw(final=True)
        advantages(rollouts)
        print_table(rollouts, time.monotonic() - t0, create_s)
        return rollouts
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="daemon URL (default $TIDEPOOL_URL or http://127.0.0.1:7070)")
    ap.add_argument("--samples", type=int, default=4, help="rollouts per task (GRPO group size)")
    ap.add_argument("--tasks", type=int, default=len(TASKS), help=f"how many tasks (1..{len(TASKS)})")
    ap.add_argument("--memory-mb", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tasks = TASKS[:max(1, min(args.tasks, len(TASKS)))]

    async def run() -> List[Rollout]:
        async with tidepool.AsyncClient(args.url) as client:
            return await train_step(client, tasks, args.samples, args.seed, args.memory_mb)

    try:
        rollouts = asyncio.run(run())
    except KeyboardInterrupt:
        print("\ninterrupted; sandboxes were cleaned up", file=sys.stderr)
        return 130
    except tidepool.TidepoolError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    return 0 if all(r.error is None for r in rollouts) else 2


if __name__ == "__main__":
    sys.exit(main())
