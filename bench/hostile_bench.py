"""What the defences against hostile code and hostile clients cost (bench/run.sh runs it
after the daemon measurements; JSON on the last line of stdout, progress on stderr):

  uid        a uid range per sandbox: two daemons of one build side by side, one with
             --uid-ranges 0 (every sandbox in one shared range, layers used as they are)
             and one with the default (an idmap user namespace and an idmapped clone of
             each layer for every create); interleaved rounds of create + delete of the
             built-in `host` image (one layer) and of a 3-layer busybox image; create
             latency p50/p90 per daemon. Both run the same seccomp filter.
  health     /health latency (p50, p99, on fresh connections) against the daemon at --url
             while --idle-conns idle TCP connections are held open against it.

    /usr/bin/python3 bench/hostile_bench.py --url URL [--rounds N --runs N --idle-conns N]
"""
import argparse
import json
import os
import pathlib
import resource
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk" / "python"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
import tidepool  # noqa: E402
from test_images import busybox_layer, docker_save, import_archive, layer_tar  # noqa: E402


def log(msg):
    print(f"[hostile_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Daemon:
    """A daemon on a free loopback port with its own data directory."""

    def __init__(self, binary, args):
        self.tmp = tempfile.mkdtemp(prefix="tp-hostilebench-")
        os.chmod(self.tmp, 0o711)  # sandboxes' mapped roots traverse it
        self.p = subprocess.Popen([binary, "--listen", "127.0.0.1:0", "--insecure-tcp", "--socket", "",
                                   "--data-dir", os.path.join(self.tmp, "data"), "--stop-sandboxes-on-exit",
                                   "--log-level", "warn"] + args,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = ""
        while "ready on" not in line:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("tidepoold did not start")
        self.url = line.split("ready on ")[1].split()[0]
        self.c = tidepool.Client(self.url, timeout=60)

    def close(self):
        self.c.close()
        self.p.terminate()
        self.p.wait()
        subprocess.run(["rm", "-rf", self.tmp], check=False)


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))]


def uid_ab(binary, rounds, runs):
    ds = {}
    try:
        ds = {"shared": Daemon(binary, ["--uid-ranges", "0"]), "per_sandbox": Daemon(binary, [])}
        top1 = layer_tar([dict(name="etc", type=tarfile.DIRTYPE, mode=0o755), dict(name="etc/a", data=b"a")])
        top2 = layer_tar([dict(name="etc", type=tarfile.DIRTYPE, mode=0o755), dict(name="etc/b", data=b"b")])
        for d in ds.values():
            st, img = import_archive(d, docker_save([busybox_layer(), top1, top2], tag="bb3:1"), "bb3", "1")
            if st != 201:
                raise RuntimeError(f"import: {st} {img}")
        res = {(k, im): [] for k in ds for im in ("host", "bb3:1")}
        for r in range(rounds):
            for im in ("host", "bb3:1"):
                order = list(ds.items()) if r % 2 == 0 else list(reversed(list(ds.items())))
                for k, d in order:
                    for _ in range(runs):
                        t = time.perf_counter()
                        sb = d.c.create(image=im, ttl=60)
                        res[(k, im)].append((time.perf_counter() - t) * 1000)
                        sb.kill()
            log(f"uid: round {r + 1}/{rounds}")
        out = {}
        for (k, im), v in res.items():
            out.setdefault(im, {})[k] = {"n": len(v), "p50_ms": statistics.median(v), "p90_ms": pct(v, 0.9)}
        return out
    except Exception as e:  # reported in the table, not fatal to the run
        return {"error": repr(e)}
    finally:
        for d in ds.values():
            d.close()


def health_under_idle(url, n_idle, n_req):
    host, port = url.split("//", 1)[1].split(":")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n_idle + 1024)), hard))
    held = []

    def closed_count():
        # Idle connections the daemon has closed (its idle timeout, or room made for
        # new ones): a closed socket reads EOF at once.
        closed = 0
        for s in held:
            s.setblocking(False)  # (a socket with a timeout waits for it, then raises)
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        return closed

    try:
        for _ in range(n_idle):
            s = socket.create_connection((host, int(port)), timeout=10)
            held.append(s)
        time.sleep(1.0)  # the daemon accepts them all
        closed_before = closed_count()
        lat = []
        for _ in range(n_req):
            t = time.perf_counter()
            urllib.request.urlopen(url + "/health", timeout=10).read()
            lat.append((time.perf_counter() - t) * 1000)
        closed_after = closed_count()
        # Held open while /health was asked: at least those the daemon had not closed by
        # the end (it closes only the longest idle, and none reopen).
        return {"idle_opened": len(held), "idle_held_during": len(held) - closed_after,
                "idle_closed_before": closed_before, "requests": n_req,
                "p50_ms": statistics.median(lat), "p99_ms": pct(lat, 0.99), "max_ms": max(lat)}
    except Exception as e:
        return {"idle_opened": len(held), "error": repr(e)}
    finally:
        for s in held:
            s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--bin", default=str(REPO / os.environ.get("BUILD", "build") / "bin"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--idle-conns", type=int, default=10000)
    ap.add_argument("--health-requests", type=int, default=300)
    a = ap.parse_args()
    log(f"health with {a.idle_conns} idle connections")
    health = health_under_idle(a.url, a.idle_conns, a.health_requests)
    log(f"health: {health}")
    log(f"uid ranges: {a.rounds} rounds x {a.runs} creates per daemon and image")
    uid = uid_ab(os.path.join(a.bin, "tidepoold"), a.rounds, a.runs)
    log(f"uid: {uid}")
    print(json.dumps({"health_idle": health, "uid_ranges": uid}))


if __name__ == "__main__":
    main()
