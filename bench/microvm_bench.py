"""The microvm tier's figures (bench/run.sh runs it last; JSON on the last line of stdout,
progress on stderr). Two daemons of one build on private data dirs: one with templates
(every sandbox a copy-on-write clone of a booted template), one with --microvm-templates
off (every sandbox a cold boot). In one run:

  cold       create to first exec answered, cold boot (templates off), sequential
  clone      create to first exec answered, clone of a ready template, sequential (the
             template's own boot, on the first create, is reported apart)
  container  the same loop on the container tier of the same daemon (the peer in this run)
  exec       round trip of `true` in one running clone
  pss        idle host memory per cloned VM: PSS (and RSS) of each QEMU, N clones alive
             and idle for a few seconds
  rate       creates per second (create, first exec, delete) with 1 and 2 clients

Targets on a host without KVM (TCG): clone to first exec p50 <= 0.5 s, idle PSS per cloned
VM <= 64 MiB. Run it alone for figures of its own:

    /usr/bin/python3 bench/microvm_bench.py [--bin build/bin] [--cold 5 --clones 20 ...]
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk" / "python"))
import tidepool  # noqa: E402


def log(msg):
    print(f"[microvm_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(v, p):
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(v):
    return {"n": len(v), "p50": pct(v, 50), "p90": pct(v, 90), "p99": pct(v, 99),
            "mean": statistics.mean(v) if v else None}


class Daemon:
    def __init__(self, bin_dir, extra):
        self.tmp = tempfile.mkdtemp(prefix="tp-vmbench-")
        os.chmod(self.tmp, 0o711)
        self.data = os.path.join(self.tmp, "data")
        os.makedirs(self.data)
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(self.tmp, "daemon.log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "tidepoold"), "--listen", f"127.0.0.1:{self.port}", "--insecure-tcp",
             "--data-dir", self.data, "--socket", os.path.join(self.tmp, "tp.sock"),
             "--stop-sandboxes-on-exit", "--log-level", "warn"] + extra,
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError("tidepoold did not start: " + open(self.log.name).read()[-1000:])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def create_first_exec(c, tier):
    t0 = time.perf_counter()
    sb = c.create(tier=tier, ttl=600)
    r = sb.exec("true")
    dt = time.perf_counter() - t0
    assert r.ok, r
    return sb, dt


def qemu_of(sandbox_id):
    """Host pids of the QEMU whose cgroup names the sandbox."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if sandbox_id in open(f"/proc/{d}/cgroup").read() and \
                    open(f"/proc/{d}/comm").read().startswith("qemu"):
                out.append(int(d))
        except OSError:
            pass
    return out


def mem_kb(pid):
    pss = rss = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith("Rss:"):
                rss = int(line.split()[1])
    return pss, rss


def rate(c, tier, clients, seconds):
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def work(i):
        while time.monotonic() < stop:
            sb, _ = create_first_exec(c, tier)
            sb.kill()
            counts[i] += 1

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        list(ex.map(work, range(clients)))
    return sum(counts) / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(REPO / "build" / "bin"))
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--clones", type=int, default=20)
    ap.add_argument("--execs", type=int, default=50)
    ap.add_argument("--idle", type=int, default=10, help="clones alive for the PSS figure")
    ap.add_argument("--idle-seconds", type=float, default=5)
    ap.add_argument("--rate-seconds", type=float, default=10)
    a = ap.parse_args()
    res = {"host": {"kvm": os.access("/dev/kvm", os.R_OK | os.W_OK) and
                    (os.stat("/dev/kvm").st_mode & 0o006) == 0o006 if os.path.exists("/dev/kvm") else False,
                    "cpus": os.cpu_count(), "loadavg": os.getloadavg()[0]}}
    warm = Daemon(a.bin, [])
    cold = Daemon(a.bin, ["--microvm-templates", "off"])
    try:
        c = tidepool.Client(warm.url, timeout=300)
        if "microvm" not in c.version().get("tiers", []):
            raise SystemExit("microvm_bench: the daemon has no microvm tier (scripts/microvm-assets.sh)")
        cc = tidepool.Client(cold.url, timeout=300)

        log(f"cold boots x{a.cold}")
        cold_t = []
        for _ in range(a.cold):
            sb, dt = create_first_exec(cc, "microvm")
            cold_t.append(dt)
            sb.kill()
        res["cold"] = summary(cold_t)

        log("template (first create), then clones")
        sb, dt = create_first_exec(c, "microvm")
        res["template_first_create"] = dt
        sb.kill()
        clone_t, cont_t = [], []
        for _ in range(a.clones):
            sb, dt = create_first_exec(c, "microvm")
            clone_t.append(dt)
            sb.kill()
            sb, dt = create_first_exec(c, "container")
            cont_t.append(dt)
            sb.kill()
        res["clone"] = summary(clone_t)
        res["container"] = summary(cont_t)

        log(f"exec round trips x{a.execs}")
        with c.create(tier="microvm", ttl=600) as sb:
            sb.exec("true")
            ex_t = []
            for _ in range(a.execs):
                t0 = time.perf_counter()
                sb.exec("true")
                ex_t.append(time.perf_counter() - t0)
        res["exec"] = summary(ex_t)

        log(f"idle PSS of {a.idle} clones")
        sbs = [c.create(tier="microvm", ttl=600) for _ in range(a.idle)]
        for s in sbs:
            s.exec("true")
        time.sleep(a.idle_seconds)
        pss, rss = [], []
        for s in sbs:
            for p in qemu_of(s.id):
                ps, rs = mem_kb(p)
                pss.append(ps / 1024)
                rss.append(rs / 1024)
        for s in sbs:
            s.kill()
        res["pss_mib"] = summary(pss)
        res["rss_mib"] = summary(rss)

        for n in (1, 2):
            log(f"creation rate, {n} client(s), {a.rate_seconds}s")
            res[f"rate_{n}"] = rate(c, "microvm", n, a.rate_seconds)
        res["targets"] = {"clone_p50_s": 0.5, "pss_mib": 64}
        res["ok"] = {"clone_p50": res["clone"]["p50"] <= 0.5, "pss": res["pss_mib"]["p50"] <= 64}
    finally:
        warm.stop()
        cold.stop()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
