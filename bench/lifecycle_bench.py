#!/usr/bin/python3
"""Bursts, density and pause/resume against a running tidepoold (issue 13's rows of make bench).

  burst    a template with a warm pool of --pool sandboxes (filled first); then one
           server-side batch of --burst sandboxes of it (streamed): the time until every
           one is ready, the creation rate over it, how many came from the pool. Then all
           are deleted (not timed).
  density  --density idle sandboxes alive at once (batches of 500; the first refusal
           stops it and is reported with its message): kernel memory (slab, stacks,
           page tables, per-cpu) plus the agents' PSS per sandbox, the daemon's
           descriptors and RSS per sandbox, and the limits the host sets (open files,
           pid_max, uid ranges).
  pause    a sandbox holding --pause-mb MB in a process: the time of POST .../pause and
           of POST .../resume (each round trip, at the client), --pause-rounds times.

Prints one JSON object (the last line). Standard library only; no thresholds: report.py
compares against the floor's rate from the same run.
"""
import argparse
import base64
import concurrent.futures
import http.client
import json
import os
import statistics
import sys
import time
import uuid

from benchlib import meminfo_kb, slab_kb


class Api:
    def __init__(self, url):
        host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        self.addr = (host, int(port))

    def call(self, method, path, body=None, timeout=600, raw=False):
        c = http.client.HTTPConnection(*self.addr, timeout=timeout)
        try:
            c.request(method, path, body=json.dumps(body) if body is not None else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            if raw:
                return r.status, data
            return r.status, (json.loads(data) if data and data[:1] in b"{[" else data)
        finally:
            c.close()


def log(msg):
    print(f"[lifecycle {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def delete_all(api, ids, workers=8):
    """Deletes every id, retrying each a few times: a bench must never leave sandboxes."""
    def one(i):
        for attempt in range(5):
            try:
                st, _ = api.call("DELETE", f"/v1/sandboxes/{i}")
                if st < 500:
                    return
            except OSError:
                pass
            time.sleep(0.5 * (attempt + 1))
        log(f"could not delete {i}")
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, ids))


def batch(api, count, **fields):
    """One streamed batch: (ids, errors, seconds until its last item, from_pool)."""
    t0 = time.monotonic()
    st, data = api.call("POST", "/v1/sandboxes/batch", {"count": count, "stream": True, **fields}, raw=True)
    took = time.monotonic() - t0
    if st != 200:
        raise RuntimeError(f"batch: HTTP {st} {data[:300]!r}")
    ids, errors, pooled = [], [], 0
    for line in data.decode().splitlines():
        item = json.loads(line)
        if "sandbox" in item:
            ids.append(item["sandbox"]["id"])
            pooled += bool(item.get("from_pool"))
        elif "error" in item and "index" in item:
            errors.append(item["error"]["message"])
    return ids, errors, took, pooled


def burst(api, n, pool, image):
    name = "bench-burst-" + uuid.uuid4().hex[:6]
    st, t = api.call("POST", "/v1/templates", {"name": name, "image": image, "memory_mb": 64,
                                               "pool_min": pool, "pool_max": pool})
    if st != 201:
        raise RuntimeError(f"template: HTTP {st} {t}")
    try:
        t0 = time.monotonic()
        while True:
            _, t = api.call("GET", f"/v1/templates/{name}")
            if t["pool"]["ready"] >= pool:
                break
            if time.monotonic() - t0 > 300:
                raise RuntimeError(f"pool of {pool} not filled in 300 s ({t['pool']['ready']} ready)")
            time.sleep(0.1)
        fill_s = time.monotonic() - t0
        ids, errors, took, pooled = batch(api, n, template=name)
        log(f"burst: {len(ids)} of {n} in {took:.2f}s ({pooled} from the pool, {len(errors)} failed)")
        delete_all(api, ids)
        return {"n": n, "pool": pool, "ready": len(ids), "failed": len(errors), "from_pool": pooled,
                "seconds": took, "rate": len(ids) / took if took > 0 else 0.0, "pool_fill_seconds": fill_s,
                "errors": errors[:3]}
    finally:
        api.call("DELETE", f"/v1/templates/{name}")


def kernel_kb():
    m = meminfo_kb()
    return sum(m.get(k, 0) for k in ("Slab", "KernelStack", "PageTables", "Percpu"))


def agents_pss_kb():
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if open(f"/proc/{d}/comm").read().strip() != "tp-agent":
                continue
            for line in open(f"/proc/{d}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            pass
    return total


def proc_status_kb(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def limits(pid):
    out = {}
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            out["open_files"] = int(line.split()[3]) if line.split()[3].isdigit() else line.split()[3]
        if line.startswith("Max processes"):
            out["processes"] = line.split()[2]
    out["pid_max"] = int(open("/proc/sys/kernel/pid_max").read())
    out["threads_max"] = int(open("/proc/sys/kernel/threads-max").read())
    try:
        out["keys_maxkeys"] = int(open("/proc/sys/kernel/keys/maxkeys").read())
    except OSError:
        pass
    return out


def density(api, n, daemon_pid, image, chunk=500):
    ids, errors = [], []
    fds0 = len(os.listdir(f"/proc/{daemon_pid}/fd"))
    # Stop short of the daemon's open-file limit (each idle sandbox holds one descriptor,
    # and up to 256 cached user namespaces are shared): past it the daemon refuses
    # connections, the deletes included.
    lim = limits(daemon_pid).get("open_files")
    capped_by = None
    if isinstance(lim, int) and lim - fds0 - 1500 < n:
        n, capped_by = max(0, lim - fds0 - 1500), f"the daemon's open-file limit ({lim})"
    rss0 = proc_status_kb(daemon_pid, "VmRSS")
    # One alive first so that the cgroup parents and the agent's shared pages exist.
    _, probe = api.call("POST", "/v1/sandboxes", {"image": image, "memory_mb": 16})
    probe_id = probe.get("id") if isinstance(probe, dict) else None
    time.sleep(1)
    # kmalloc-1k: the per-memory-cgroup shrinker maps (benchlib.slab_kb), reported apart.
    k0, a0, s0 = kernel_kb(), agents_pss_kb(), slab_kb("kmalloc-1k")
    t0 = time.monotonic()
    try:
        while len(ids) < n and not errors:
            got, errs, _, _ = batch(api, min(chunk, n - len(ids)), image=image, memory_mb=16, ttl_seconds=7200)
            ids += got
            errors += errs
            log(f"density: {len(ids)} alive" + (f"; refused: {errs[0]}" if errs else ""))
        create_s = time.monotonic() - t0
        time.sleep(2)
        k1, a1, s1 = kernel_kb(), agents_pss_kb(), slab_kb("kmalloc-1k")
        fds1 = len(os.listdir(f"/proc/{daemon_pid}/fd"))
        rss1 = proc_status_kb(daemon_pid, "VmRSS")
        alive = max(1, len(ids))
        out = {"asked": n, "capped_by": capped_by, "alive": len(ids), "create_seconds": create_s,
               "kernel_kb_per_sandbox": (k1 - k0) / alive, "agent_pss_kb_per_sandbox": (a1 - a0) / alive,
               "kmalloc_1k_kb_per_sandbox": (s1 - s0) / alive,
               "daemon_fds_per_sandbox": (fds1 - fds0) / alive, "daemon_rss_kb_per_sandbox": (rss1 - rss0) / alive,
               "daemon_fds": fds1, "limits": limits(daemon_pid), "first_refusal": errors[0] if errors else None}
        out["total_kb_per_sandbox"] = out["kernel_kb_per_sandbox"] + out["agent_pss_kb_per_sandbox"]
        return out
    finally:
        delete_all(api, ids + ([probe_id] if probe_id else []))


def pause(api, mb, rounds, image):
    _, sb = api.call("POST", "/v1/sandboxes", {"image": image, "memory_mb": mb + 256})
    sid = sb["id"]
    try:
        # mb MB in the sandbox's /tmp (a tmpfs charged to its memory cgroup), held while a
        # process sleeps; dd as busybox has it too.
        script = f"dd if=/dev/zero of=/tmp/fill bs=1048576 count={mb} 2>/dev/null; sleep 100000"
        st, _ = api.call("POST", f"/v1/sandboxes/{sid}/processes", {"cmd": ["sh", "-c", script]})
        if st >= 300:
            raise RuntimeError(f"process: HTTP {st}")
        t0 = time.monotonic()
        while True:
            st, r = api.call("POST", f"/v1/sandboxes/{sid}/exec",
                             {"cmd": ["sh", "-c", "wc -c < /tmp/fill 2>/dev/null || echo 0"]})
            size = int(base64.b64decode(r["stdout"]).decode().strip() or 0)
            if size >= mb << 20:
                break
            if time.monotonic() - t0 > 60:
                raise RuntimeError(f"the sandbox did not fill {mb} MB")
            time.sleep(0.1)
        p_ms, r_ms = [], []
        for _ in range(rounds):
            t = time.monotonic()
            st, r = api.call("POST", f"/v1/sandboxes/{sid}/pause")
            p_ms.append((time.monotonic() - t) * 1000)
            if st != 200 or r["state"] != "paused":
                raise RuntimeError(f"pause: HTTP {st} {r}")
            t = time.monotonic()
            st, r = api.call("POST", f"/v1/sandboxes/{sid}/resume")
            r_ms.append((time.monotonic() - t) * 1000)
            if st != 200 or r["state"] != "running":
                raise RuntimeError(f"resume: HTTP {st} {r}")
        return {"mb": mb, "rounds": rounds, "pause_p50_ms": statistics.median(p_ms), "pause_max_ms": max(p_ms),
                "resume_p50_ms": statistics.median(r_ms), "resume_max_ms": max(r_ms)}
    finally:
        api.call("DELETE", f"/v1/sandboxes/{sid}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--daemon-pid", type=int, required=True)
    ap.add_argument("--image", default="host")
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--pool", type=int, default=100)
    ap.add_argument("--density", type=int, default=10000)
    ap.add_argument("--pause-mb", type=int, default=100)
    ap.add_argument("--pause-rounds", type=int, default=5)
    a = ap.parse_args()
    api = Api(a.url)
    out = {}
    for name, fn in (("pause", lambda: pause(api, a.pause_mb, a.pause_rounds, a.image)),
                     ("burst", lambda: burst(api, a.burst, a.pool, a.image)),
                     ("density", lambda: density(api, a.density, a.daemon_pid, a.image))):
        try:
            out[name] = fn()
        except Exception as e:  # a failed phase is reported, the others still run
            out[name] = {"error": str(e)[-400:]}
        log(f"{name}: {json.dumps(out[name])[:300]}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
