#!/usr/bin/python3
"""Interleaved side-by-side benchmark of Tidepool and its peers; writes one JSON file.

Run by bench/run.sh, which prepares the root file system (bench/peers/prepare.py),
starts a private tidepoold and runs this inside a private mount namespace where crun
1.8.1 accepts this host's hybrid cgroup layout (see run.sh). Standard library only.

Phases, each interleaved round-robin with the order rotated every round so that machine
noise (other builds on a 2-core host) hits every tool alike:
  latency    create + run `true` + destroy. Whole processes timed by hyperfine (-N, no
             shell): `tidepool run`, bwrap, crun, runc, busybox `true`. In-process: the
             HTTP client of bench/api_bench and the kernel floor loop of bench/raw_floor,
             each timing itself.
  throughput completed sandboxes/s at concurrency 1, 2, 8, 32 for a fixed time: process
             tools from that many threads each spawning the tool in a loop; api_bench
             from that many client threads; raw_floor from that many threads.
  idle       N sandboxes alive per tool (capped in time), memory from /proc/meminfo
             kernel counters and the PSS of the tool's processes.
  daemon     Tidepool alone (bench/daemon_bench): exec of busybox `true` in a running
             sandbox against spawning the same binary on the host, interleaved; the
             daemon's RSS before and after keyed execs that each print 4 MiB.
             (The restart with sandboxes alive is measured by run.sh: it restarts the daemon.)
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import meminfo_kb, slab_kb

DEVNULL = subprocess.DEVNULL
KERNEL_KEYS = ("Slab", "KernelStack", "PageTables", "Percpu")
USER_KEYS = ("AnonPages", "Shmem")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- tools -------------------------------------------------------------------------


class Ctx:
    def __init__(self, a):
        self.a = a
        self.url = a.url
        self.image = a.image
        self.prefix = a.prefix
        self.rootfs = os.path.join(a.work, "rootfs")
        self.bundle_true = os.path.join(a.work, "bundle-true")
        self.bundle_sleep = os.path.join(a.work, "bundle-sleep")
        self.tp = os.path.join(a.bin, "tidepool")
        self.api_bench = os.path.join(a.bin, "api_bench")
        self.raw_floor = os.path.join(a.bin, "raw_floor")
        self.daemon_bench = os.path.join(a.bin, "daemon_bench")
        self.env = dict(os.environ, TIDEPOOL_URL=a.url)
        self.pids_file = os.path.join(a.work, "pids")
        self.seq = 0
        self.lock = threading.Lock()

    def uid(self) -> str:
        with self.lock:
            self.seq += 1
            return f"{self.prefix}-{self.seq}"

    def bwrap(self, *cmd: str) -> list:
        return ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", self.rootfs, "/",
                "--proc", "/proc", "--dev", "/dev", *cmd]

    def process_cmd(self, tool: str, cid: str) -> list:
        """The whole-process command line of `tool` for one create + true + destroy."""
        if tool == "tidepool-cli":
            return [self.tp, "run", "--image", self.image, "--", "true"]
        if tool == "tidepool-pool-cli":
            # The shape of POOL_TEMPLATES' CLI template: served by its warm pool.
            return [self.tp, "run", "--image", self.image, "--memory", "320M", "--", "true"]
        if tool == "bwrap":
            return self.bwrap("/bin/true")
        if tool == "crun":
            return ["crun", "run", "--bundle", self.bundle_true, cid]
        if tool == "runc":
            return ["runc", "run", "--bundle", self.bundle_true, cid]
        if tool == "busybox-true":
            return [os.path.join(self.rootfs, "bin/busybox"), "true"]
        raise ValueError(tool)

    def record_pid(self, pid: int) -> None:
        with self.lock, open(self.pids_file, "a") as f:
            f.write(f"{pid}\n")


PROCESS_TOOLS = ("tidepool-cli", "tidepool-pool-cli", "bwrap", "crun", "runc", "busybox-true")
INPROC_TOOLS = ("tidepool-api", "tidepool-pool-api", "floor")
# Warm-pool rows (issue 13): sandboxes handed out by a template's pool, which is filled
# before each latency round (refills then run while the round runs, as they would). Not
# in the throughput phase: a pool is for bursts, which bench/lifecycle_bench.py measures.
POOL_TOOLS = {"tidepool-pool-cli": "bench-pool-cli", "tidepool-pool-api": "bench-pool-api"}
POOL_MEMORY_MB = {"bench-pool-cli": 320, "bench-pool-api": 288}


def api(ctx, method: str, path: str, body=None) -> tuple:
    host, port = ctx.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        c.request(method, path, body=json.dumps(body) if body is not None else None,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, (json.loads(data) if data else None)
    finally:
        c.close()


def make_pools(ctx, size: int) -> None:
    for name, mem in POOL_MEMORY_MB.items():
        st, body = api(ctx, "PUT", f"/v1/templates/{name}",
                       {"image": ctx.image, "memory_mb": mem, "pool_min": size, "pool_max": size})
        if st >= 300:
            raise RuntimeError(f"template {name}: HTTP {st} {body}")


def fill_pool(ctx, name: str, cap_s: float = 120) -> None:
    """Waits until the template's pool holds its target (refills, one at a time)."""
    end = time.monotonic() + cap_s
    while time.monotonic() < end:
        st, body = api(ctx, "GET", f"/v1/templates/{name}")
        p = (body or {}).get("pool") or {}
        if st == 200 and p.get("ready", 0) >= p.get("target", 1) and p.get("creating", 0) == 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"pool {name} did not fill within {cap_s:.0f}s")


def drop_pools(ctx) -> None:
    for name in POOL_MEMORY_MB:
        api(ctx, "DELETE", f"/v1/templates/{name}")


def run_json(cmd: list, env=None, timeout=900) -> dict:
    p = subprocess.run(cmd, stdin=DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=timeout)
    line = next((l for l in reversed(p.stdout.splitlines()) if l.startswith("{")), None)
    if line is None:
        raise RuntimeError(f"{os.path.basename(cmd[0])} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    out = json.loads(line)
    out["_rc"] = p.returncode
    out["_stderr"] = p.stderr.strip()[-400:]
    return out


def hyperfine(ctx: Ctx, cmd: list, runs: int, warmup: int) -> tuple:
    """Returns (times in ms, error or None)."""
    with tempfile.NamedTemporaryFile(suffix=".json", dir=ctx.a.work) as out:
        p = subprocess.run(["hyperfine", "-N", "--style", "none", "--runs", str(runs), "--warmup", str(warmup),
                            "--export-json", out.name, " ".join(cmd)],
                           stdin=DEVNULL, stdout=DEVNULL, stderr=subprocess.PIPE, text=True, env=ctx.env)
        if p.returncode != 0:
            return [], p.stderr.strip()[-400:]
        with open(out.name) as f:
            res = json.load(f)["results"][0]
        return [t * 1000.0 for t in res["times"]], None


def latency_round(ctx: Ctx, tool: str, runs: int) -> tuple:
    if tool in POOL_TOOLS:
        fill_pool(ctx, POOL_TOOLS[tool])
    if tool == "tidepool-pool-api":
        # Acquire from the pool + first exec (the target's measure; the delete is after).
        o = run_json([ctx.api_bench, "--url", ctx.url, "--template", POOL_TOOLS[tool], "--iterations", str(runs),
                      "--warmup", "0", "--rate-seconds", "0", "--idle", "0", "--json", "--samples"])
        err = None if o.get("failures", 0) == 0 else f"{o['failures']} failures: {o['_stderr']}"
        return o.get("create_exec_samples_ms", []), err
    if tool in PROCESS_TOOLS:
        return hyperfine(ctx, ctx.process_cmd(tool, f"{ctx.prefix}-lat-{tool}"), runs, 1)
    if tool == "tidepool-api":
        o = run_json([ctx.api_bench, "--url", ctx.url, "--image", ctx.image, "--iterations", str(runs),
                      "--warmup", "1", "--rate-seconds", "0", "--idle", "0", "--json", "--samples"])
        err = None if o.get("failures", 0) == 0 else f"{o['failures']} failures: {o['_stderr']}"
        return o.get("total_samples_ms", []), err
    if tool == "floor":
        o = run_json([ctx.raw_floor, "--no-backend", "--iterations", str(runs), "--rounds", "1", "--rates", "none",
                      "--json", "--samples"])
        f = o["floor"]["failures"]
        return o.get("floor_samples_ms", []), (f"{f} failures: {o['_stderr']}" if f else None)
    raise ValueError(tool)


# ---- throughput --------------------------------------------------------------------


def process_rate(ctx: Ctx, tool: str, conc: int, seconds: float) -> dict:
    done = [0] * conc
    failed = [0] * conc
    last_err = [""]
    end = time.monotonic() + seconds
    t0 = time.monotonic()

    def worker(w: int) -> None:
        while time.monotonic() < end:
            p = subprocess.run(ctx.process_cmd(tool, ctx.uid()), stdin=DEVNULL, stdout=DEVNULL,
                               stderr=subprocess.PIPE, env=ctx.env)
            if p.returncode == 0:
                done[w] += 1
            else:
                failed[w] += 1
                last_err[0] = p.stderr.decode(errors="replace").strip()[-300:]

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - t0
    return {"rate": sum(done) / elapsed, "done": sum(done), "failed": sum(failed), "seconds": elapsed,
            "error": last_err[0] or None}


def rate_round(ctx: Ctx, tool: str, conc: int, seconds: float) -> dict:
    if tool in PROCESS_TOOLS:
        return process_rate(ctx, tool, conc, seconds)
    if tool == "tidepool-api":
        o = run_json([ctx.api_bench, "--url", ctx.url, "--image", ctx.image, "--iterations", "0", "--warmup", "0",
                      "--rate-seconds", str(max(1, round(seconds))), "--concurrency", str(conc), "--idle", "0",
                      "--json"])
        return {"rate": o["rates"].get(str(conc), 0.0), "error": o["_stderr"] or None}
    if tool == "floor":
        o = run_json([ctx.raw_floor, "--no-backend", "--iterations", "0", "--rounds", "1", "--rates", str(conc),
                      "--rate-seconds", str(seconds), "--json"])
        return {"rate": o["floor_rates"].get(str(conc), 0.0), "error": None if o["_rc"] == 0 else o["_stderr"]}
    raise ValueError(tool)


# ---- idle memory -------------------------------------------------------------------


def counters() -> dict:
    """Median of three readings of the kernel and user counters, in kB."""
    reads = []
    for i in range(3):
        if i:
            time.sleep(0.3)
        m = meminfo_kb()
        reads.append((sum(m.get(k, 0) for k in KERNEL_KEYS), sum(m.get(k, 0) for k in USER_KEYS)))
    return {"kernel": statistics.median(r[0] for r in reads), "user": statistics.median(r[1] for r in reads)}


def children_map() -> dict:
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(roots: list, include_roots=True) -> set:
    kids = children_map()
    out, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.add(p)
        todo.extend(kids.get(p, []))
    if not include_roots:
        out -= set(roots)
    return out


def pss_kb(pids) -> int:
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


class TidepoolIdle:
    name = "tidepool"

    def __init__(self, ctx: Ctx):
        self.ctx = ctx
        host, port = ctx.url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        self.addr = (host, int(port))
        self.local = threading.local()
        self.body = json.dumps({"image": ctx.image, "memory_mb": 256, "cpus": 1, "ttl_seconds": 3600})

    def _req(self, method: str, path: str, body=None) -> tuple:
        c = getattr(self.local, "conn", None)
        if c is None:
            c = self.local.conn = http.client.HTTPConnection(*self.addr, timeout=120)
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            r = c.getresponse()
            return r.status, r.read()
        except (OSError, http.client.HTTPException):
            self.local.conn = None
            c.close()
            raise

    def start(self):
        st, body = self._req("POST", "/v1/sandboxes", self.body)
        if st >= 300:
            raise RuntimeError(f"create: HTTP {st} {body[:200]!r}")
        return json.loads(body)["id"]

    def stop(self, h) -> None:
        self._req("DELETE", f"/v1/sandboxes/{h}")

    def pids(self, handles) -> set:
        return descendants([self.ctx.a.daemon_pid], include_roots=False)

    def overhead_pids(self) -> list:
        return [self.ctx.a.daemon_pid]


class CliIdle:
    """crun or runc: `run -d` detached containers running `sleep`."""

    def __init__(self, ctx: Ctx, rt: str):
        self.ctx, self.rt, self.name = ctx, rt, rt

    def start(self):
        cid = self.ctx.uid()
        # The detached container inherits stdio: a pipe would never reach EOF, so errors go
        # to a file.
        errlog = os.path.join(self.ctx.a.work, f"{self.rt}-run.err")
        with open(errlog, "w") as err:
            # runc gives every container a new session keyring owned by its mapped root
            # (uid 100000), whose key quota (kernel.keys.maxkeys, 200) stops it at 200
            # containers; crun does not. --no-new-keyring lifts runc's limit.
            extra = ["--no-new-keyring"] if self.rt == "runc" else []
            p = subprocess.run([self.rt, "run", "-d", *extra, "--bundle", self.ctx.bundle_sleep, cid], stdin=DEVNULL,
                               stdout=DEVNULL, stderr=err, timeout=60)
        if p.returncode != 0:
            subprocess.run([self.rt, "delete", "-f", cid], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL)
            with open(errlog) as f:
                raise RuntimeError(f"{self.rt} run -d: {f.read().strip()[-300:]}")
        return cid

    def stop(self, h) -> None:
        subprocess.run([self.rt, "delete", "-f", h], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, timeout=60)

    def pids(self, handles) -> set:
        out = subprocess.run([self.rt, "list", "-f", "json"], stdout=subprocess.PIPE, stderr=DEVNULL, text=True)
        mine = set(handles)
        roots = [c["pid"] for c in (json.loads(out.stdout or "[]") or []) if c.get("id") in mine and c.get("pid")]
        return descendants(roots)

    def overhead_pids(self) -> list:
        return []


class SpawnIdle:
    """bwrap sandboxes or bare busybox sleeps as background processes."""

    def __init__(self, ctx: Ctx, name: str):
        self.ctx, self.name = ctx, name

    def start(self):
        if self.name == "bwrap":
            cmd = self.ctx.bwrap("/bin/sleep", "3600")
        else:
            cmd = [os.path.join(self.ctx.rootfs, "bin/busybox"), "sleep", "3600"]
        p = subprocess.Popen(cmd, stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL, start_new_session=True)
        self.ctx.record_pid(p.pid)
        return p

    def stop(self, p) -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

    def pids(self, handles) -> set:
        return descendants([p.pid for p in handles])

    def overhead_pids(self) -> list:
        return []


def idle_run(tool, n: int, cap_s: float) -> dict:
    log(f"idle: {tool.name}: starting up to {n} (cap {cap_s:.0f}s)")
    over = tool.overhead_pids()
    before = counters()
    maps0 = slab_kb("kmalloc-1k")
    over0 = pss_kb(over)
    handles, err = [], None
    t0 = time.monotonic()
    try:
        while len(handles) < n and time.monotonic() - t0 < cap_s:
            handles.append(tool.start())
    except Exception as e:  # a failed start ends the phase for this tool; what is alive is measured
        err = str(e)[-300:]
    create_s = time.monotonic() - t0
    res = {"requested": n, "alive": len(handles), "capped": len(handles) < n and err is None, "error": err,
           "start_ms_each": 1000.0 * create_s / max(1, len(handles))}
    try:
        if handles:
            time.sleep(2)
            alive = counters()
            maps1 = slab_kb("kmalloc-1k")
            procs = tool.pids(handles)
            k = len(handles)
            res.update({
                "kernel_kb": (alive["kernel"] - before["kernel"]) / k,
                "meminfo_user_kb": (alive["user"] - before["user"]) / k,
                # Part of kernel_kb: the per-memory-cgroup shrinker maps (benchlib.slab_kb).
                "kmalloc_1k_kb": (maps1 - maps0) / k,
                "pss_kb": pss_kb(procs) / k,
                "overhead_pss_kb": (pss_kb(over) - over0) / k if over else 0.0,
                "processes": len(procs),
            })
            res["total_kb"] = res["kernel_kb"] + res["pss_kb"] + res["overhead_pss_kb"]
            res["meminfo_total_kb"] = res["kernel_kb"] + res["meminfo_user_kb"]
    finally:
        t1 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda h: _quiet(tool.stop, h), handles))
        res["stop_ms_each"] = 1000.0 * (time.monotonic() - t1) / max(1, len(handles))
    if handles:
        time.sleep(2)
        after = counters()
        res["kernel_drift_kb"] = (after["kernel"] - before["kernel"]) / len(handles)
    log(f"idle: {tool.name}: {res}")
    return res


def _quiet(fn, h):
    try:
        fn(h)
    except Exception as e:  # teardown goes on; run.sh's trap sweeps what is left
        log(f"stop failed: {e}")


# ---- daemon: exec path and memory ---------------------------------------------------


def daemon_phase(ctx: Ctx, rounds: int, runs: int, rss_execs: int) -> dict:
    """The exec path and the daemon's RSS under keyed execs (bench/daemon_bench)."""
    out = {}
    # The same static busybox in the sandbox (the image's /bin/busybox; the host image binds
    # the host's, which prepare.py copied into the root) and on the host.
    common = ["--url", ctx.url, "--image", ctx.image]
    host_true = os.path.join(ctx.rootfs, "bin/busybox") + " true"
    for key, cmd in (("exec_path", [ctx.daemon_bench, "exec", *common, "--cmd", "/bin/busybox true",
                                    "--host-cmd", host_true, "--rounds", str(rounds), "--runs", str(runs)]),
                     ("daemon_rss", [ctx.daemon_bench, "rss", *common, "--count", str(rss_execs),
                                     "--daemon-pid", str(ctx.a.daemon_pid)])):
        try:
            o = run_json(cmd)
            if o["_rc"] != 0 and not o.get("error"):
                o["error"] = o["_stderr"] or f"exit {o['_rc']}"
        except Exception as e:
            o = {"error": str(e)[-400:]}
        out[key] = o
        log(f"daemon: {key}: {o}")
    return out


# ---- driver ------------------------------------------------------------------------


def machine() -> dict:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def first_line(cmd):
        try:
            return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  timeout=10).stdout.splitlines()[0].strip()
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    return {
        "nproc": os.cpu_count(),
        "model": model,
        "kernel": platform.release(),
        "mem_total_mib": meminfo_kb()["MemTotal"] // 1024,
        "loadavg_start": open("/proc/loadavg").read().split()[:3],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "versions": {
            "crun": first_line(["crun", "--version"]),
            "runc": first_line(["runc", "--version"]),
            "bwrap": first_line(["bwrap", "--version"]),
            "hyperfine": first_line(["hyperfine", "--version"]),
            "busybox": first_line(["busybox"]),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--image", default="host")
    ap.add_argument("--image-note", default="")
    ap.add_argument("--prefix", required=True, help="container-id prefix (run.sh's trap sweeps it)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=20, help="runs per tool per latency round")
    ap.add_argument("--concurrency", default="1,2,8,32")
    ap.add_argument("--rate-seconds", type=float, default=4)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--idle-cap", type=float, default=120, help="seconds to start a tool's idle sandboxes")
    ap.add_argument("--idle-tools", default="busybox-sleep,tidepool,bwrap,crun,runc")
    ap.add_argument("--exec-rounds", type=int, default=10, help="daemon phase: interleaved exec rounds")
    ap.add_argument("--exec-runs", type=int, default=50, help="daemon phase: execs per side per round")
    ap.add_argument("--rss-execs", type=int, default=100, help="daemon phase: keyed execs of 4 MiB output")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ctx = Ctx(a)
    tools = list(INPROC_TOOLS) + list(PROCESS_TOOLS)
    res = {"machine": machine(), "image": a.image, "image_note": a.image_note,
           "config": {"rounds": a.rounds, "runs": a.runs, "concurrency": a.concurrency,
                      "rate_seconds": a.rate_seconds, "idle": a.idle, "idle_cap_s": a.idle_cap},
           "latency": {t: {"samples": [], "errors": []} for t in tools},
           "throughput": {t: {} for t in tools}, "idle": {}}
    res["config"].update({"exec_rounds": a.exec_rounds, "exec_runs": a.exec_runs, "rss_execs": a.rss_execs})
    t_start = time.monotonic()

    # Latency: round-robin, rotated.
    broken = set()
    try:
        make_pools(ctx, a.runs + 2)
    except Exception as e:
        log(f"warm pools: {e}")
        broken.update(POOL_TOOLS)
    for r in range(a.rounds):
        order = tools[r % len(tools):] + tools[:r % len(tools)]
        for tool in order:
            if tool in broken:
                continue
            try:
                samples, err = latency_round(ctx, tool, a.runs)
            except Exception as e:
                samples, err = [], str(e)[-400:]
            res["latency"][tool]["samples"].extend(samples)
            if err:
                res["latency"][tool]["errors"].append(err)
                log(f"latency: {tool}: {err}")
                if not samples:
                    broken.add(tool)  # it fails outright: do not spend the remaining rounds on it
        log(f"latency round {r + 1}/{a.rounds} done, load {open('/proc/loadavg').read().split()[0]}")

    # Throughput: every concurrency level, tools rotated.
    concs = [int(c) for c in a.concurrency.split(",") if c]
    for i, c in enumerate(concs):
        order = tools[i % len(tools):] + tools[:i % len(tools)]
        for tool in order:
            if tool in broken or tool in POOL_TOOLS:
                continue
            try:
                out = rate_round(ctx, tool, c, a.rate_seconds)
            except Exception as e:
                out = {"rate": 0.0, "error": str(e)[-400:]}
            res["throughput"][tool][str(c)] = out
            log(f"throughput c={c} {tool}: {out['rate']:.1f}/s" + (f" ({out['error']})" if out.get("error") else ""))

    drop_pools(ctx)  # their sandboxes must not count as idle ones below

    # The daemon alone: exec path, RSS under keyed execs.
    res.update(daemon_phase(ctx, a.exec_rounds, a.exec_runs, a.rss_execs))

    # Idle memory, one tool after the other (each tears down before the next starts).
    makers = {"busybox-sleep": lambda: SpawnIdle(ctx, "busybox-sleep"), "tidepool": lambda: TidepoolIdle(ctx),
              "bwrap": lambda: SpawnIdle(ctx, "bwrap"), "crun": lambda: CliIdle(ctx, "crun"),
              "runc": lambda: CliIdle(ctx, "runc")}
    if a.idle > 0:
        for name in [t for t in a.idle_tools.split(",") if t]:
            try:
                res["idle"][name] = idle_run(makers[name](), a.idle, a.idle_cap)
            except Exception as e:
                res["idle"][name] = {"error": str(e)[-400:], "alive": 0}

    res["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    res["wall_seconds"] = time.monotonic() - t_start
    with open(a.out, "w") as f:
        json.dump(res, f)
    log(f"wrote {a.out} after {res['wall_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
