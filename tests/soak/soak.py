#!/usr/bin/python3
"""Soak test: many sandboxes doing mixed exec and file traffic for a bounded time, while
the daemon's resident memory and open file descriptors are sampled.

    /usr/bin/python3 tests/soak/soak.py --sandboxes 500 --minutes 10

Without --url it starts its own tidepoold (from $TIDEPOOL_BUILD or ./build) on a private
data directory and stops it at the end. With --url it drives a running daemon; give
--pid so that the daemon can be sampled.

It passes (exit 0) when
  - no call failed (every exec exited 0 with the expected output, every file read
    returned what was written);
  - after a warm-up (the first --warmup fraction of the run), the daemon's RSS grew by at
    most --rss-slack-mb plus --rss-slack-pct of its post-warm-up baseline, comparing the
    median of the last third of the samples with the median of the first third, plus
    --per-key-bytes per keyed call (the daemon keeps each Idempotency-Key's answer for 10
    minutes, at most 100000 of them; --no-idempotency-keys removes that allowance);
  - its fd count at the end is within --fd-slack of the post-warm-up baseline, and never
    exceeded it by more than the number of workers (one connection each) plus that slack.
The sandboxes are killed at the end. A JSON summary goes to stdout (and --json FILE).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import threading
import time
from typing import Dict, List, Optional

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[0] / "integration"))

from tp_testlib import BUILD, Daemon, fd_count, rss_kb  # noqa: E402

import tidepool  # noqa: E402




class Soak:
    def __init__(self, url: str, pid: Optional[int], sandboxes: int, seconds: float, workers: int,
                 sample_every: float, log=print) -> None:
        self.url, self.pid = url, pid
        self.n, self.seconds, self.workers, self.sample_every = sandboxes, seconds, workers, sample_every
        self.log = log
        self.ops: Dict[str, int] = {}
        self.errors: List[str] = []
        self.samples: List[Dict[str, float]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ids: List[str] = []
        self.keys = True   # False: --no-idempotency-keys
        self.keyed = 0

    def create(self) -> None:
        t0 = time.monotonic()
        with tidepool.Client(self.url, timeout=300) as c:
            left = self.n
            while left > 0:
                k = min(left, 100)
                res = c.create_batch(k, ttl=max(600, int(self.seconds) + 600), memory_mb=64, pids=64,
                                     labels={"soak": "1"})
                self.ids += [sb.id for sb in res.sandboxes]
                for idx, code, msg in res.errors:
                    self.errors.append(f"create[{idx}]: {code}: {msg}")
                left -= k
        self.log(f"created {len(self.ids)} sandboxes in {time.monotonic() - t0:.1f}s")

    def kill_all(self) -> None:
        with tidepool.Client(self.url, timeout=300) as c:
            for sid in self.ids:
                try:
                    c.kill(sid)
                except tidepool.TidepoolError as e:
                    self.errors.append(f"kill {sid}: {e}")

    # Calls per op that carry an Idempotency-Key (the SDK adds one to every mutating call).
    KEYED = {"exec": 1, "exec_stdin": 1, "exec_stream": 1, "file_rw": 1, "file_list_stat": 0, "mkdir_rm": 2}

    def count(self, op: str) -> None:
        with self.lock:
            self.ops[op] = self.ops.get(op, 0) + 1
            if self.keys:
                self.keyed += self.KEYED[op]

    def fail(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)

    def one_op(self, c: tidepool.Client, rnd: random.Random, worker: int) -> None:
        sid = rnd.choice(self.ids)
        sb = c.get(sid) if rnd.random() < 0.05 else tidepool.Sandbox(c, _info(sid))
        r = rnd.random()
        tok = f"{rnd.getrandbits(48):012x}"
        if r < 0.35:
            res = sb.exec(["echo", tok])
            if res.exit_code != 0 or res.stdout != tok + "\n":
                self.fail(f"exec echo in {sid}: {res.exit_code} {res.stdout!r} {res.stderr!r}")
            self.count("exec")
        elif r < 0.5:
            res = sb.exec("cat | wc -c", stdin=tok * 100)
            if res.exit_code != 0 or res.stdout.strip() != str(len(tok) * 100):
                self.fail(f"exec stdin in {sid}: {res.exit_code} {res.stdout!r}")
            self.count("exec_stdin")
        elif r < 0.6:
            n = 0
            for item in sb.exec_stream(["sh", "-c", f"for i in 1 2 3; do echo {tok}; done"]):
                if isinstance(item, tidepool.ExecResult):
                    if item.exit_code != 0 or item.stdout != (tok + "\n") * 3:
                        self.fail(f"exec_stream in {sid}: {item.exit_code} {item.stdout!r}")
                else:
                    n += 1
            self.count("exec_stream")
        elif r < 0.85:
            path = f"/tmp/soak-w{worker}-{rnd.randrange(4)}"  # one writer per path
            data = (tok * rnd.randrange(1, 2000)).encode()
            sb.files.write(path, data)
            back = sb.files.read(path)
            if back != data:
                self.fail(f"file round trip in {sid}: {len(back)} != {len(data)} bytes")
            self.count("file_rw")
        elif r < 0.95:
            names = [e.name for e in sb.files.list("/tmp")]
            if not isinstance(names, list):
                self.fail(f"list in {sid}")
            sb.files.stat("/etc/hostname")
            self.count("file_list_stat")
        else:
            sb.files.mkdir(f"/tmp/d-{tok}", parents=True)
            sb.files.remove(f"/tmp/d-{tok}", recursive=True)
            self.count("mkdir_rm")

    def worker(self, i: int) -> None:
        rnd = random.Random(i)
        with tidepool.Client(self.url, timeout=120) as c:
            while not self.stop.is_set():
                try:
                    self.one_op(c, rnd, i)
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    self.fail(f"worker {i}: {type(e).__name__}: {e}")

    def sampler(self, t0: float) -> None:
        while True:
            if self.pid:
                self.samples.append({"t": round(time.monotonic() - t0, 1), "rss_kb": rss_kb(self.pid),
                                     "fds": fd_count(self.pid, cached_userns=False), "keyed": self.keyed})
            if self.stop.wait(self.sample_every):
                return

    def run(self) -> None:
        self.create()
        if not self.ids:
            return
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.workers)]
        samp = threading.Thread(target=self.sampler, args=(t0,), daemon=True)
        samp.start()
        for t in threads:
            t.start()
        while time.monotonic() - t0 < self.seconds:
            time.sleep(min(5.0, self.seconds))
            with self.lock:
                total = sum(self.ops.values())
            last = self.samples[-1] if self.samples else {}
            self.log(f"t={time.monotonic() - t0:.0f}s ops={total} errors={len(self.errors)} {last}")
        self.stop.set()
        for t in threads:
            t.join(120)
        samp.join()
        # A last sample once the workers' connections are closed.
        if self.pid:
            time.sleep(0.5)
            self.samples.append({"t": round(time.monotonic() - t0, 1), "rss_kb": rss_kb(self.pid),
                                 "fds": fd_count(self.pid, cached_userns=False), "keyed": self.keyed})
        self.kill_all()


def _info(sid: str):
    return tidepool.SandboxInfo.from_json({"id": sid, "state": "running"})


def verdict(s: Soak, warmup: float, rss_slack_mb: float, rss_slack_pct: float, fd_slack: int,
            per_key_bytes: int = 1536) -> List[str]:
    problems = [f"{len(s.errors)} errors, first: {s.errors[:5]}"] if s.errors else []
    post = [x for x in s.samples if x["t"] >= warmup * s.seconds]
    if s.pid and len(post) >= 6:
        third = len(post) // 3
        first = statistics.median(x["rss_kb"] for x in post[:third])
        last = statistics.median(x["rss_kb"] for x in post[-third:])
        # The daemon keeps every keyed answer for 10 minutes (at most 100000 of them:
        # src/api/idempotency.h), so memory grows with keyed calls until the first expire;
        # that bounded growth is allowed, anything beyond it is not.
        keyed = post[-1]["keyed"] - post[third // 2]["keyed"]
        allowed = rss_slack_mb * 1024 + first * rss_slack_pct / 100 + keyed * per_key_bytes / 1024
        if last - first > allowed:
            problems.append(f"RSS grew from {first:.0f} kB to {last:.0f} kB (allowed {allowed:.0f} kB, "
                            f"{keyed} keyed calls)")
        base_fds = min(x["fds"] for x in post[:third])
        peak_fds = max(x["fds"] for x in post)
        end_fds = s.samples[-1]["fds"]
        if end_fds > base_fds + fd_slack:
            problems.append(f"fds grew from {base_fds} to {end_fds}")
        if peak_fds > base_fds + s.workers + fd_slack:
            problems.append(f"fds peaked at {peak_fds} (baseline {base_fds})")
    elif s.pid:
        problems.append(f"only {len(post)} samples after warm-up: run longer or sample more often")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="daemon URL (default: start a private tidepoold)")
    ap.add_argument("--pid", type=int, help="daemon pid to sample (with --url)")
    ap.add_argument("--sandboxes", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, help="overrides --minutes")
    ap.add_argument("--workers", type=int, default=16, help="concurrent client threads")
    ap.add_argument("--sample-every", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the run excluded from the checks")
    ap.add_argument("--rss-slack-mb", type=float, default=16.0)
    ap.add_argument("--rss-slack-pct", type=float, default=10.0)
    ap.add_argument("--fd-slack", type=int, default=8)
    ap.add_argument("--per-key-bytes", type=int, default=1536,
                    help="RSS allowed per keyed call for the daemon's idempotency records")
    ap.add_argument("--no-idempotency-keys", action="store_true",
                    help="send no Idempotency-Key (the SDK sends one per mutating call): RSS must then "
                         "stay flat without the allowance")
    ap.add_argument("--json", help="also write the summary here")
    a = ap.parse_args(argv)
    seconds = a.seconds if a.seconds is not None else a.minutes * 60
    daemon = None
    url, pid = a.url, a.pid
    if not url:
        daemon = Daemon(BUILD)
        daemon.start()
        url, pid = daemon.url, daemon.pid
    log = lambda m: print(f"soak: {m}", file=sys.stderr, flush=True)  # noqa: E731
    s = Soak(url, pid, a.sandboxes, seconds, a.workers, a.sample_every, log)
    if a.no_idempotency_keys:
        import tidepool._http as sdk_http
        sdk_http.MUTATING_METHODS = frozenset()
        s.keys = False
    try:
        s.run()
    finally:
        if daemon:
            rc = daemon.stop()
            if rc not in (0, -15):
                s.errors.append(f"tidepoold exited with {rc}")
            daemon.cleanup()
    problems = verdict(s, a.warmup, a.rss_slack_mb, a.rss_slack_pct, a.fd_slack, a.per_key_bytes)
    summary = {"sandboxes": len(s.ids), "seconds": seconds, "ops": s.ops, "ops_total": sum(s.ops.values()),
               "errors": len(s.errors), "first_errors": s.errors[:10], "samples": s.samples,
               "problems": problems, "ok": not problems}
    text = json.dumps(summary, indent=1)
    print(text)
    if a.json:
        pathlib.Path(a.json).write_text(text)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
