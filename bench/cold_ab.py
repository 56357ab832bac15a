#!/usr/bin/python3
"""A/B rounds of the cold path: two builds of Tidepool against the raw kernel floor.

    cold_ab.py --a BIN_A --b BIN_B [--rounds 6] [--runs 100] [--rate-seconds 4]
               [--idle 1000] [--image busybox|host] [--daemon-args "FLAGS"]
               [--a-args "FLAGS"] [--b-args "FLAGS"]

Starts one private tidepoold per build (each its own data dir, port and cgroup parent),
imports the same busybox root into both (bench/peers/prepare.py), then runs rounds in
which the order of floor, A and B is rotated: latency of create + `true` + destroy
(api_bench against each daemon, raw_floor for the floor), then the sustained rate at 1
and 2 clients for --rate-seconds each. Then idle memory per sandbox with --idle alive,
measured as `make bench` does (bench/peers.py: kernel counters, PSS of the daemon's
descendants, the daemon's own PSS growth), A and B alternating twice. Prints medians over
the rounds and the median per-round ratios to the floor; --json writes them too.
make bench stays the reference; this is for comparing a change with its base on a
shared machine, where only side-by-side figures mean anything. --daemon-args passes
flags to both daemons (e.g. "--trajectory-log off", to see the cold path without the
durable log's syncs); --a-args and --b-args to one daemon only (the same build as A
and B with and without a flag). Needs root.
"""
import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "peers"))
import peers  # noqa: E402  (counters, descendants, pss_kb, run_json: the same as make bench)
import prepare  # noqa: E402


def log(msg: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _more_fds() -> None:
    # Room for 1,000 sandboxes' descriptors (bench/run.sh does the same).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else max(soft, min(65536, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard) if hard != resource.RLIM_INFINITY else hard))


class Daemon:
    def __init__(self, name: str, bin_dir: str, work: str, extra: list = ()):
        self.name, self.bin = name, bin_dir
        self.data = os.path.join(work, f"data-{name}")
        with socket.socket() as s:  # a free port
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, f"daemon-{name}.log"), "w")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "tidepoold"), "--listen", f"127.0.0.1:{self.port}", "--insecure-tcp",
             "--socket", "", "--stop-sandboxes-on-exit", "--data-dir", self.data, "--log-level", "warn",
             "--max-connections", "4000", "--max-connections-per-client", "4000", *extra],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, preexec_fn=_more_fds)
        for _ in range(300):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"daemon {name} did not start (see {self.log.name})")

    def import_image(self, tar: str) -> str:
        req = urllib.request.Request(self.url + "/v1/images/import?name=bench-busybox&kind=docker",
                                     data=open(tar, "rb").read(), method="POST",
                                     headers={"Content-Type": "application/x-tar"})
        urllib.request.urlopen(req, timeout=120).read()
        return "bench-busybox"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def api(d: Daemon, image: str, extra: list) -> dict:
    return peers.run_json([os.path.join(d.bin, "api_bench"), "--url", d.url, "--image", image, *extra, "--json"])


def floor(bin_dir: str, extra: list) -> dict:
    return peers.run_json([os.path.join(bin_dir, "raw_floor"), "--no-backend", "--rounds", "1", *extra, "--json"])


def idle_once(d: Daemon, image: str, n: int) -> dict:
    """peers.idle_run for one daemon, as make bench measures it."""
    ctx = argparse.Namespace(url=d.url, image=image, a=argparse.Namespace(daemon_pid=d.proc.pid))
    tool = peers.TidepoolIdle(ctx)
    return peers.idle_run(tool, n, 300.0)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="bin dir of build A (tidepoold, tp-agent, api_bench, raw_floor)")
    ap.add_argument("--b", required=True, help="bin dir of build B")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=100, help="create+exec+destroy cycles per latency round")
    ap.add_argument("--rate-seconds", type=int, default=4)
    ap.add_argument("--idle", type=int, default=1000, help="sandboxes alive for idle memory (0 skips)")
    ap.add_argument("--idle-reps", type=int, default=2)
    ap.add_argument("--image", choices=("busybox", "host"), default="busybox")
    ap.add_argument("--daemon-args", default="", help="extra tidepoold flags for both daemons")
    ap.add_argument("--a-args", default="", help="extra tidepoold flags for daemon A only")
    ap.add_argument("--b-args", default="", help="extra tidepoold flags for daemon B only")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("cold_ab: needs root", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="tp-ab-")
    os.chmod(work, 0o711)
    daemons = []
    try:
        root = os.path.join(work, "rootfs")
        prepare.make_rootfs(root)
        tar = os.path.join(work, "busybox.tar")
        prepare.make_docker_archive(root, tar)
        extra = a.daemon_args.split()
        daemons = [Daemon("A", a.a, work, extra + a.a_args.split()),
                   Daemon("B", a.b, work, extra + a.b_args.split())]
        images = {}
        for d in daemons:
            images[d.name] = d.import_image(tar) if a.image == "busybox" else "host"
        tools = ["floor", "A", "B"]
        by = {d.name: d for d in daemons}
        lat = {t: [] for t in tools}
        rates = {(t, c): [] for t in tools for c in (1, 2)}
        for r in range(a.rounds):
            order = tools[r % 3:] + tools[:r % 3]
            for t in order:
                if t == "floor":
                    o = floor(a.b, ["--iterations", str(a.runs), "--rates", "none"])
                    lat[t].append(o["floor"]["p50_ms"])
                else:
                    o = api(by[t], images[t], ["--iterations", str(a.runs), "--warmup", "3", "--rate-seconds", "0",
                                               "--idle", "0"])
                    lat[t].append(o["total_p50_ms"])
                log(f"round {r} latency {t}: p50 {lat[t][-1]:.2f} ms")
            for c in (1, 2):
                for t in order:
                    if t == "floor":
                        o = floor(a.b, ["--iterations", "0", "--rates", str(c), "--rate-seconds", str(a.rate_seconds)])
                        v = o["floor_rates"].get(str(c), 0.0)
                    else:
                        o = api(by[t], images[t], ["--iterations", "0", "--warmup", "0", "--rate-seconds",
                                                   str(a.rate_seconds), "--concurrency", str(c), "--idle", "0"])
                        v = o["rates"].get(str(c), 0.0)
                    rates[(t, c)].append(v)
                    log(f"round {r} rate c={c} {t}: {v:.1f}/s")
        res = {"rounds": a.rounds, "runs": a.runs, "rate_seconds": a.rate_seconds, "image": a.image,
               "daemon_args": extra, "a_args": a.a_args.split(), "b_args": a.b_args.split(),
               "a": a.a, "b": a.b, "latency_p50_ms": lat, "rates": {f"{t}/c{c}": v for (t, c), v in rates.items()}}
        summary = {}
        for t in ("A", "B"):
            s = {"p50_ms": med(lat[t]),
                 "p50_over_floor": med([x / f for x, f in zip(lat[t], lat["floor"]) if f])}
            for c in (1, 2):
                s[f"rate_c{c}"] = med(rates[(t, c)])
                s[f"rate_c{c}_over_floor"] = med([x / f for x, f in zip(rates[(t, c)], rates[("floor", c)]) if f])
            summary[t] = s
        summary["floor"] = {"p50_ms": med(lat["floor"]), "rate_c1": med(rates[("floor", 1)]),
                            "rate_c2": med(rates[("floor", 2)])}
        if a.idle > 0:
            idle = {"A": [], "B": []}
            for rep in range(a.idle_reps):
                for d in (daemons if rep % 2 == 0 else daemons[::-1]):
                    o = idle_once(d, images[d.name], a.idle)
                    idle[d.name].append(o)
                    log(f"idle {d.name}: total {o.get('total_kb', float('nan')):.0f} kB "
                        f"(kernel {o.get('kernel_kb', float('nan')):.0f}, PSS {o.get('pss_kb', float('nan')):.0f}, "
                        f"daemon {o.get('overhead_pss_kb', float('nan')):.0f}), {o['alive']} alive")
            res["idle"] = idle
            for t in ("A", "B"):
                summary[t]["idle_total_kb"] = med([o.get("total_kb") for o in idle[t]])
                summary[t]["idle_kernel_kb"] = med([o.get("kernel_kb") for o in idle[t]])
                summary[t]["idle_pss_kb"] = med([o.get("pss_kb") for o in idle[t]])
        res["summary"] = summary
        print(json.dumps(summary, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        return 0
    finally:
        for d in daemons:
            d.stop()
        if subprocess.run(["grep", "-q", work, "/proc/self/mountinfo"]).returncode == 0:
            log(f"mounts left under {work}; not removing it")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
