"""What a uid range per sandbox costs a cold create: two daemons of one build side by side,
interleaved rounds of create + delete (the create's latency is measured, p50 and p90).

  shared       --uid-ranges 0: every sandbox in one range, layers used as they are
               (the path of daemons before per-sandbox ranges)
  per-sandbox  the default: an idmap user namespace and an idmapped clone per layer
               for every create

Images: `host` (one lower layer) and a 3-layer busybox image. As root, after the build:

    /usr/bin/python3 bench/uid_ranges_ab.py [ROUNDS RUNS]      (default 10 25)
"""
import os
import pathlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "sdk" / "python"))
sys.path.insert(0, str(REPO / "tests" / "integration"))
import tidepool  # noqa: E402
from test_images import busybox_layer, docker_save, import_archive, layer_tar  # noqa: E402

BIN = str(REPO / os.environ.get("BUILD", "build") / "bin" / "tidepoold")
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 25

class D:
    """A daemon on a free loopback port and its own data directory."""

    def __init__(self, args):
        self.tmp = tempfile.mkdtemp(prefix="tp-uidbench-")
        os.chmod(self.tmp, 0o711)
        self.data_dir = os.path.join(self.tmp, "data")
        self.p = subprocess.Popen([BIN, "--listen", "127.0.0.1:0", "--insecure-tcp", "--socket", "",
                                   "--data-dir", self.data_dir, "--stop-sandboxes-on-exit",
                                   "--log-level", "warn"] + args,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = ""
        while "ready on" not in line:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("tidepoold did not start")
        self.url = line.split("ready on ")[1].split()[0]
        self.c = tidepool.Client(self.url, timeout=60)


ds = {"shared": D(["--uid-ranges", "0"]), "per-sandbox": D([])}
top1 = layer_tar([dict(name="etc", type=tarfile.DIRTYPE, mode=0o755), dict(name="etc/a", data=b"a")])
top2 = layer_tar([dict(name="etc", type=tarfile.DIRTYPE, mode=0o755), dict(name="etc/b", data=b"b")])
for d in ds.values():
    st, img = import_archive(d, docker_save([busybox_layer(), top1, top2], tag="bb3:1"), "bb3", "1")
    assert st == 201, img
res = {(k, im): [] for k in ds for im in ("host", "bb3:1")}
try:
    for r in range(ROUNDS):
        for im in ("host", "bb3:1"):
            for k, d in ds.items():
                for i in range(RUNS):
                    t = time.perf_counter(); sb = d.c.create(image=im, ttl=60); res[(k, im)].append((time.perf_counter() - t) * 1000)
                    sb.kill()
    for (k, im), v in res.items():
        v.sort()
        print(f"{im:7} {k:12} n={len(v)} p50={statistics.median(v):.2f} ms p90={v[int(len(v)*0.9)]:.2f} ms")
finally:
    for d in ds.values():
        d.p.terminate(); d.p.wait()
        subprocess.run(["rm", "-rf", d.tmp])
