#!/usr/bin/python3
"""Turns bench/peers.py's JSON into bench/results/latest.md and PNG charts.

    report.py RESULTS.json --out DIR [--readme README.md]

--readme rewrites the part of README.md between the bench markers (adding a
"## Benchmarks" section at the end the first time); nothing else in it changes.
Charts need python3-matplotlib (Agg backend); without it only the markdown is written.
"""
import argparse
import json
import os
import sys

README_BEGIN = "<!-- bench:begin (written by bench/report.py from a `make bench` run) -->"
README_END = "<!-- bench:end -->"

# tool -> (label, how it is run, what it sets up)
TOOLS = {
    "tidepool-cli": ("**Tidepool** `tidepool run --image {image} -- true`", "whole process",
                     "CLI -> HTTP -> daemon: user, mount, pid, uts, ipc, net, cgroup namespaces; cgroups "
                     "(memory, cpu, pids); overlay root with a tmpfs upper; /proc; seccomp; dropped capabilities; "
                     "no_new_privs; tp-agent as PID 1 runs `true` in a cgroup of its own; destroy"),
    "bwrap": ("bwrap `--unshare-all --ro-bind ROOT / --proc --dev`", "whole process",
              "user, mount, pid, uts, ipc, net, cgroup namespaces; read-only bind of the root (no overlay, no "
              "writable layer); /proc; /dev; no cgroups or limits; no seccomp"),
    "crun": ("crun `run`", "whole process",
             "OCI bundle: pid, net, ipc, uts, mount, cgroup, user namespaces (root -> 100000); cgroups v1 with "
             "memory, cpu, pids limits; read-only root (no overlay); /proc, /dev, /sys, masked paths; 3 "
             "capabilities; no seccomp"),
    "runc": ("runc `run`", "whole process", "the same OCI bundle as crun"),
    "busybox-true": ("busybox `true` (no sandbox)", "whole process", "nothing: the process floor"),
    "tidepool-api": ("**Tidepool** API client (`api_bench`)", "in process",
                     "the same sandbox as the CLI row; HTTP create, exec `true`, delete from one persistent "
                     "connection"),
    "floor": ("raw kernel floor (`raw_floor`)", "in process",
              "clone(CLONE_VM) with user, mount, pid, uts, ipc, net namespaces; uid maps; cgroups v1 memory+cpu+pids "
              "(mkdir, limits, attach, rmdir); lo up; overlay over a 2-layer lower; /proc; pivot_root; exec "
              "static busybox `true`; reap"),
}
ORDER = ["tidepool-cli", "bwrap", "crun", "runc", "busybox-true", "tidepool-api", "floor"]
# Warm-pool rows (latency only): a template's pool hands the sandbox out.
POOL = {"tidepool-pool-cli": ("**Tidepool** `tidepool run` served from a warm pool", "whole process"),
        "tidepool-pool-api": ("**Tidepool** API: pool acquire + first exec of `true` (no delete)", "in process")}
IDLE_LABEL = {"tidepool": "Tidepool (API create, agent idle)", "bwrap": "bwrap running `sleep`",
              "crun": "crun `run -d`, `sleep`", "runc": "runc `run -d --no-new-keyring`, `sleep`",
              "busybox-sleep": "busybox `sleep` (no sandbox)"}


def pct(v, p):
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def fmt(x, nd=1):
    return "–" if x is None else f"{x:.{nd}f}"


def ratio(a, b):
    return None if not a or not b else a / b


def stats(res):
    out = {}
    for t in ORDER + list(POOL):
        s = res["latency"].get(t, {}).get("samples", [])
        out[t] = {"n": len(s), "p50": pct(s, 50), "p99": pct(s, 99), "errors": res["latency"].get(t, {}).get("errors", [])}
    return out


def machine_line(res):
    m = res["machine"]
    v = m["versions"]
    return (f"{m['nproc']} × {m['model']}, kernel {m['kernel']}, {m['mem_total_mib'] / 1024:.0f} GiB RAM; "
            f"load average {' '.join(m['loadavg_start'])} at the start, {' '.join(m.get('loadavg_end', ['?']))} at "
            f"the end (the benchmark's own load included); {m['date']}. Tools: {v['crun']}, {v['runc']}, {v['bwrap']}, "
            f"{v['hyperfine']}, {v['busybox'].split(' multi-call')[0]}.")


def tables(res, for_readme=False):
    st = stats(res)
    cfg = res["config"]
    img = res.get("image", "host")
    floor = st["floor"]["p50"]
    L = []
    L.append(f"**Create + run `true` + destroy, cold** ({cfg['rounds']} interleaved rounds × {cfg['runs']} runs "
             f"per tool, order rotated each round; whole processes timed by hyperfine `-N`, in-process rows time "
             f"themselves). Ratios are p50 ÷ p50: against Tidepool's CLI for whole-process rows, against Tidepool's "
             f"API client for in-process rows (>1: slower than Tidepool), and against the in-process kernel floor.")
    L.append("")
    L.append("| tool | run as | runs | p50 ms | p99 ms | ÷ Tidepool | ÷ floor |")
    L.append("|---|---|---:|---:|---:|---:|---:|")
    for t in ORDER:
        s = st[t]
        ref = st["tidepool-cli"]["p50"] if TOOLS[t][1] == "whole process" else st["tidepool-api"]["p50"]
        label = TOOLS[t][0].format(image=img)
        note = " (failed: see latest.json)" if s["errors"] and not s["n"] else ""
        L.append(f"| {label}{note} | {TOOLS[t][1]} | {s['n']} | {fmt(s['p50'], 2)} | {fmt(s['p99'], 2)} | "
                 f"{fmt(ratio(s['p50'], ref), 2)} | {fmt(ratio(s['p50'], floor), 2)} |")
    for t, (label, how) in POOL.items():
        s = st[t]
        if not s["n"]:
            L.append(f"| {label} | {how} | 0 | not measured: {_err({'error': (s['errors'] or [''])[-1]})} | | | |")
            continue
        ref = st["tidepool-cli"]["p50"] if how == "whole process" else st["tidepool-api"]["p50"]
        L.append(f"| {label} | {how} | {s['n']} | {fmt(s['p50'], 2)} | {fmt(s['p99'], 2)} | "
                 f"{fmt(ratio(s['p50'], ref), 2)} | {fmt(ratio(s['p50'], floor), 2)} |")
    fn1 = ((res.get("function") or {}).get("print1") or {})
    f1, h1 = (fn1.get("function") or {}).get("1"), (fn1.get("host_python") or {}).get("1")
    if f1 and h1:
        L.append(f"| function tier `print(1)` ÷ a bare host `python3 -c 'print(1)'` (1 client; below) | in "
                 f"process | {f1['calls']} | {fmt(f1['p50_ms'], 2)} | {fmt(f1['p99_ms'], 2)} | "
                 f"{fmt(ratio(f1['p50_ms'], h1['p50_ms']), 2)} of python3 | |")
    else:
        L.append("| function tier vs bare interpreter | – | – | not measured | | | |")
    L.append("")
    L.append(f"Tidepool's image: `{img}`. {res.get('image_note', '')}.")
    L.append("")

    # Targets.
    cli, api = st["tidepool-cli"]["p50"], st["tidepool-api"]["p50"]
    crun, runc, bwrap = st["crun"]["p50"], st["runc"]["p50"], st["bwrap"]["p50"]

    def row(name, val, ok_if, unit="×"):
        if val is None:
            return f"| {name} | – | not measured |"
        return f"| {name} | {val:.2f}{unit} | {'**met**' if ok_if(val) else '**missed**'} |"

    L.append("**Targets** (issue 5; p50 against p50, same run):")
    L.append("")
    L.append("| target | measured | |")
    L.append("|---|---:|---|")
    L.append(row("CLI ≥ 3× faster than crun (crun ÷ Tidepool CLI)", ratio(crun, cli), lambda v: v >= 3))
    L.append(row("CLI ≥ 6× faster than runc", ratio(runc, cli), lambda v: v >= 6))
    L.append(row("CLI faster than bwrap", ratio(bwrap, cli), lambda v: v > 1))
    L.append(row("in-process client ≥ 3× faster than crun (crun ÷ Tidepool API)", ratio(crun, api), lambda v: v >= 3))
    L.append(row("in-process client ≥ 6× faster than runc", ratio(runc, api), lambda v: v >= 6))
    L.append(row("in-process client faster than bwrap", ratio(bwrap, api), lambda v: v > 1))
    L.append(row("within 3× of the raw kernel floor (Tidepool API ÷ floor)", ratio(api, floor), lambda v: v <= 3))
    L.append("")
    pcli, papi = st["tidepool-pool-cli"]["p50"], st["tidepool-pool-api"]["p50"]
    L.append("**Warm-pool targets** (issue 13; p50 against p50, same run):")
    L.append("")
    L.append("| target | measured | |")
    L.append("|---|---:|---|")
    L.append(row("`tidepool run` from a pool faster than bwrap (bwrap ÷ pooled CLI)", ratio(bwrap, pcli),
                 lambda v: v > 1))
    L.append(row("`tidepool run` from a pool ≥ 3× faster than crun (crun ÷ pooled CLI)", ratio(crun, pcli),
                 lambda v: v >= 3))
    L.append(row("pool acquire + first exec ≤ 0.6× the raw kernel floor (÷ floor)", ratio(papi, floor),
                 lambda v: v <= 0.6))
    L.append("")
    # Issue 2's targets from the same run: sustained rate against the floor's, idle memory.
    tp_rates, fl_rates = res["throughput"].get("tidepool-api", {}), res["throughput"].get("floor", {})
    L.append("**Targets** (issue 2, same run; sustained = Tidepool API client ÷ floor at the same concurrency):")
    L.append("")
    L.append("| target | measured | |")
    L.append("|---|---:|---|")
    L.append(row("p50 within 3× of the raw kernel floor", ratio(api, floor), lambda v: v <= 3))
    for c in ("1", "2"):
        a, f = tp_rates.get(c, {}).get("rate"), fl_rates.get(c, {}).get("rate")
        L.append(row(f"sustained ≥ 0.5× the floor's, {c} client{'s' if c != '1' else ''}", ratio(a, f),
                     lambda v: v >= 0.5))
    tp_idle = res.get("idle", {}).get("tidepool", {})
    tot = tp_idle.get("total_kb")
    L.append(row("idle memory < 1 MiB per sandbox (total kB ÷ 1024)", None if tot is None else tot / 1024,
                 lambda v: v < 1, unit=" MiB"))
    L.append("")
    maps = tp_idle.get("kmalloc_1k_kb")
    if tot is not None and maps is not None:
        L.append(f"Of that total, {maps:.0f} kB per sandbox is kmalloc-1k: mostly the kernel's per-memory-cgroup "
                 f"shrinker maps, sized by the most superblocks this host has had mounted at once since it booted "
                 f"(in this run or before it); without them, {(tot - maps) / 1024:.2f} MiB.")
        L.append("")

    L += daemon_rows(res)
    L += hostile_rows(res, tot)
    L += microvm_rows(res)
    L += trajectory_rows(res)
    L += function_rows(res)
    L += lifecycle_rows(res)

    # Throughput.
    concs = [c for c in cfg["concurrency"].split(",") if c]
    L.append(f"**Sustained sandboxes per second** (create + `true` + destroy, {cfg['rate_seconds']:g} s per tool and "
             f"concurrency, tools rotated; whole-process tools from that many threads each spawning the tool in a "
             f"loop, Tidepool's API client from that many client threads, the floor from that many threads):")
    L.append("")
    L.append("| tool | " + " | ".join(f"c={c}" for c in concs) + " |")
    L.append("|---|" + "---:|" * len(concs))
    for t in ORDER:
        tp = res["throughput"].get(t, {})
        cells = []
        for c in concs:
            r = tp.get(c)
            cells.append("–" if r is None else (fmt(r["rate"], 0) + ("*" if r.get("failed") else "")))
        L.append(f"| {TOOLS[t][0].format(image=img)} | " + " | ".join(cells) + " |")
    L.append("")
    if any(r.get("failed") for t in ORDER for r in res["throughput"].get(t, {}).values()):
        L.append("\\* some runs failed at this concurrency (see latest.json); only completed ones count.")
        L.append("")

    # Idle memory.
    idle = res.get("idle", {})
    if idle:
        L.append(f"**Idle memory per sandbox** ({cfg['idle']} requested per tool, started one after the other with a "
                 f"{cfg['idle_cap_s']:g} s cap, measured 2 s after the last start). kernel = Δ(Slab + KernelStack + "
                 f"PageTables + Percpu) from /proc/meminfo; PSS = the sandboxes' processes' proportional set size; "
                 f"daemon = Δ PSS of tidepoold; total = their sum. meminfo user = Δ(AnonPages + Shmem), shown for "
                 f"reference only: other processes on this shared machine move it by hundreds of MB.")
        L.append("")
        L.append("| tool | alive | kernel kB | of it kmalloc-1k kB | PSS kB | daemon kB | **total kB** | meminfo user kB "
                 "| start ms each |")
        L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in ["tidepool", "bwrap", "crun", "runc", "busybox-sleep"]:
            r = idle.get(name)
            if r is None:
                continue
            alive = f"{r.get('alive', 0)}" + (" (time cap)" if r.get("capped") else "") + \
                (" (failed)" if r.get("error") else "")
            L.append(f"| {IDLE_LABEL[name]} | {alive} | {fmt(r.get('kernel_kb'), 0)} | {fmt(r.get('kmalloc_1k_kb'), 0)} | "
                     f"{fmt(r.get('pss_kb'), 0)} | "
                     f"{fmt(r.get('overhead_pss_kb'), 0)} | **{fmt(r.get('total_kb'), 0)}** | "
                     f"{fmt(r.get('meminfo_user_kb'), 0)} | {fmt(r.get('start_ms_each'), 1)} |")
        L.append("| raw kernel floor | – | | | | | n/a (the floor loop holds no idle sandboxes) | | |")
        L.append("")
    L.append(f"Machine: {machine_line(res)} Whole run: {res.get('wall_seconds', 0) / 60:.1f} min.")
    L.append("")
    return L


def verdict(ok):
    return "**met**" if ok else "**missed**"


def daemon_rows(res):
    """The daemon alone (bench/daemon_bench, same run): exec path, RSS, restart."""
    ex, rss, rs = res.get("exec_path"), res.get("daemon_rss"), res.get("restart")
    if ex is None and rss is None and rs is None:
        return []  # a run from before these measurements
    cfg = res["config"]
    L = ["**The daemon alone** (same run; bench/daemon_bench):", "",
         "| measurement | measured | target | |", "|---|---|---:|---|"]

    if ex and ex.get("sandbox_p50_ms") and ex.get("host_p50_ms"):
        r = ex["sandbox_p50_ms"] / ex["host_p50_ms"]
        err = f" ({ex['failures']} failed)" if ex.get("failures") else ""
        L.append(f"| exec of busybox `true` in a running sandbox (HTTP, one connection; {ex.get('runs', 0)} execs in "
                 f"{cfg.get('exec_rounds', '?')} rounds interleaved with the host's) ÷ spawn + exec + reap of the same "
                 f"binary on the host (posix_spawn) | p50 {ex['sandbox_p50_ms']:.2f} ms ÷ {ex['host_p50_ms']:.2f} ms = "
                 f"**{r:.2f}×**; p99 {ex['sandbox_p99_ms']:.2f} ms vs {ex['host_p99_ms']:.2f} ms{err} | ≤ 1.5× at p50 | "
                 f"{verdict(r <= 1.5)} |")
    else:
        L.append(f"| exec path ÷ host spawn | not measured: {_err(ex)} | ≤ 1.5× at p50 | |")
    if rss and rss.get("rss_before_mib") is not None and rss.get("rss_after_mib", -1) >= 0:
        extra = "".join([f"; {rss['failures']} failed" if rss.get("failures") else "",
                         f"; {rss['short_output']} answers short" if rss.get("short_output") else ""])
        L.append(f"| daemon RSS after {rss['execs']} execs that each print {rss['bytes_each'] / 1048576:g} MiB, each with "
                 f"its own Idempotency-Key | {rss['rss_before_mib']:.1f} MiB before, **{rss['rss_after_mib']:.1f} MiB** "
                 f"after{extra} | – | |")
    else:
        L.append(f"| daemon RSS after keyed 4 MiB execs | not measured: {_err(rss)} | – | |")
    if rs is not None:
        n = rs.get("requested", 0)
        w = rs.get("wait") or {}
        what = f"daemon restart (SIG{rs.get('signal', 'KILL')}) with {n} sandboxes alive: from starting the new daemon " \
               f"until every one answered an exec"
        if w.get("seconds") is not None:
            first = w.get("first_answer_seconds")
            detail = f" (the first answered after {first:.2f} s)" if first is not None else ""
            L.append(f"| {what} | **{w['seconds']:.2f} s**{detail} | < 2 s | {verdict(w['seconds'] < 2)} |")
        elif w:
            L.append(f"| {what} | n/a: sandboxes did not survive the restart ({w.get('answered', 0)} of "
                     f"{w.get('sandboxes', n)} answered) | < 2 s | |")
        else:
            L.append(f"| {what} | not measured: {_err(rs)} | < 2 s | |")
    L.append("")
    return L


def hostile_rows(res, idle_total_kb):
    """Issue 12's targets (same run; bench/hostile_bench.py): per-sandbox uid ranges,
    /health under idle connections, idle memory."""
    h = res.get("hostile")
    if h is None:
        return []  # a run from before these measurements
    L = ["**Hostile code and clients, round two** (same run; bench/hostile_bench.py):", "",
         "| measurement | measured | target | |", "|---|---|---:|---|"]

    uid = h.get("uid_ranges") or {}
    for im in ("host", "bb3:1"):
        u = uid.get(im) or {}
        a, b = u.get("shared"), u.get("per_sandbox")
        what = (f"cold create of `{im}` with a uid range per sandbox (idmapped layers) ÷ one shared range, "
                f"two daemons of this build interleaved, same seccomp filter")
        if a and b:
            r = b["p50_ms"] / a["p50_ms"]
            L.append(f"| {what} | p50 {b['p50_ms']:.2f} ms ÷ {a['p50_ms']:.2f} ms = **{(r - 1) * 100:+.1f}%** "
                     f"(p90 {b['p90_ms']:.2f} vs {a['p90_ms']:.2f} ms; {b['n']} creates each) | ≤ +5% | "
                     f"{verdict(r <= 1.05)} |")
        else:
            L.append(f"| {what} | not measured: {_err(uid if 'error' in uid else h)} | ≤ +5% | |")
    hi = h.get("health_idle") or {}
    want = hi.get("idle_opened") or 10000
    what = f"`GET /health` on fresh connections while {want} idle connections are held open"
    if hi.get("p99_ms") is not None:
        held = hi.get("idle_held_during", 0)
        note = (f"{hi['requests']} requests; {hi['idle_opened']} opened, {held} still open at the end "
                f"(the daemon closed {hi['idle_opened'] - held})")
        ok = held >= want
        L.append(f"| {what} ({note}) | p50 {hi['p50_ms']:.1f} ms, **p99 {hi['p99_ms']:.1f} ms**, "
                 f"max {hi['max_ms']:.1f} ms | p99 < 100 ms | "
                 f"{verdict(hi['p99_ms'] < 100) if ok else f'not met as stated: only {held} held'} |")
    else:
        L.append(f"| {what} | not measured: {_err(hi or h)} | p99 < 100 ms | |")
    if idle_total_kb is not None:
        L.append(f"| idle memory per sandbox with 1,000 alive (the idle table's total) | **{idle_total_kb / 1024:.2f} MiB** "
                 f"| < 0.7 MiB | {verdict(idle_total_kb / 1024 < 0.7)} |")
    L.append("")
    return L


def microvm_rows(res):
    """Issue 16's targets (same run; bench/microvm_bench.py): the microvm tier."""
    v = res.get("microvm")
    if v is None:
        return []  # a run from before the tier
    L = ["**The microvm tier** (same run; bench/microvm_bench.py: two daemons of this build, one with "
         "templates, one with `--microvm-templates off`; sequential creates, then 1 and 2 clients):", ""]
    if "error" in v:
        return L + [f"not measured: {_err(v)}", ""]

    def verdict(ok):
        return "**met**" if ok else "**missed**"

    def s(x):
        return "n/a" if x is None else f"{x:.3f} s"
    accel = "KVM" if v.get("host", {}).get("kvm") else "TCG (no usable /dev/kvm)"
    L += [f"Accelerator: {accel}; load average {v.get('host', {}).get('loadavg', 0):.1f} at the start.", "",
          "| measurement | p50 | p90 | target | |", "|---|---:|---:|---:|---|"]
    cl, co, ct, ex = v["clone"], v["cold"], v["container"], v["exec"]
    L.append(f"| clone of a ready template → first exec answered ({cl['n']} creates) | **{s(cl['p50'])}** | "
             f"{s(cl['p90'])} | p50 ≤ 0.5 s | {verdict(cl['p50'] <= 0.5)} |")
    L.append(f"| cold boot → first exec answered ({co['n']} creates, templates off) | {s(co['p50'])} | "
             f"{s(co['p90'])} | fallback | |")
    L.append(f"| the template's own boot and save (first create of the key) | {s(v.get('template_first_create'))} "
             f"| | once per image and shape | |")
    L.append(f"| container tier → first exec, same loop (the peer) | {s(ct['p50'])} | {s(ct['p90'])} | | |")
    L.append(f"| exec round trip (`true`) in a clone ({ex['n']} execs) | {s(ex['p50'])} | {s(ex['p90'])} | | |")
    ps, rs = v["pss_mib"], v["rss_mib"]
    L.append(f"| idle host memory per cloned VM: PSS of its QEMU ({ps['n']} clones alive; RSS p50 "
             f"{rs['p50']:.1f} MiB) | **{ps['p50']:.1f} MiB** | {ps['p90']:.1f} MiB | ≤ 64 MiB | "
             f"{verdict(ps['p50'] <= 64)} |")
    L.append(f"| creation rate (create, first exec, delete), 1 / 2 clients | {v['rate_1']:.2f}/s | "
             f"{v['rate_2']:.2f}/s | | |")
    L += ["", "On a KVM host (expected, not measured here): the guest runs at native speed instead of "
          "through TCG's translator, so a cold boot of this generic cloud kernel takes about 0.2–0.5 s "
          "and a clone's restore tens of milliseconds (Firecracker publishes < 125 ms to start a microVM "
          "and < 5 MiB of overhead per VM); each QEMU loses the ~32–64 MiB translation cache that TCG "
          "fills, and `-cpu host` with kvmclock replaces the PIT and TSC arguments TCG needs. "
          "Snapshots are tied to the accelerator and CPU model, so templates are per host kind.", ""]
    return L


def trajectory_rows(res):
    """Issue 14's targets (same run; bench/trajlog_bench.cpp): two daemons of this build,
    --trajectory-log on and off."""
    t = res.get("trajectory")
    if t is None:
        return []  # a run from before these measurements
    L = ["**Trajectory log** (same run; bench/trajlog_bench: two more daemons of this build, "
         "`--trajectory-log on` and `off`, interleaved):", "",
         "| measurement | measured | target | |", "|---|---|---:|---|"]

    on, off = t.get("exec_on") or {}, t.get("exec_off") or {}
    what = ("exec of `/bin/true` without a key in a running sandbox (one connection each): the log on "
            "records every call durably before answering, off records none")
    if on.get("p50_ms") and off.get("p50_ms"):
        added = (on["p50_ms"] / off["p50_ms"] - 1) * 100
        L.append(f"| {what} | p50 {on['p50_ms']:.2f} ms on vs {off['p50_ms']:.2f} ms off = **{added:+.1f}%** "
                 f"(p99 {on['p99_ms']:.2f} vs {off['p99_ms']:.2f} ms; {on['n']} execs each) | < +10% at p50 | "
                 f"{verdict(added < 10)} |")
    else:
        L.append(f"| {what} | not measured: {_err(t)} | < +10% at p50 | |")
    ko, kf = t.get("keyed_on") or {}, t.get("keyed_off") or {}
    if ko.get("p50_ms") and kf.get("p50_ms"):
        L.append(f"| the same with an Idempotency-Key, as the SDK sends on every call (recorded by both) | "
                 f"p50 {ko['p50_ms']:.2f} ms on, "
                 f"{kf['p50_ms']:.2f} ms off | – | |")
    fs, fc = t.get("ff_server") or {}, t.get("ff_client") or {}
    what = "fast-forward: a recorded keyed step sent again, answered from the log (Server-Timing)"
    if fs.get("n"):
        L.append(f"| {what} | **p50 {fs['p50_ms']:.3f} ms** at the server (p99 {fs['p99_ms']:.3f} ms; client round "
                 f"trip p50 {fc.get('p50_ms', 0):.3f} ms; {fs['n']} steps) | < 0.5 ms p50 | "
                 f"{verdict(fs['p50_ms'] < 0.5)} |")
    else:
        L.append(f"| {what} | not measured: {_err(t)} | < 0.5 ms p50 | |")
    b = t.get("bytes") or {}
    if b.get("per_step"):
        L.append(f"| log bytes per step (`echo step N`, keyed; records and side files) | **{b['per_step']:.0f} B** "
                 f"({b['log_bytes']} B for {b['steps']} steps, {b['records']} records with the created event) | – | |")
    ro, rf = t.get("rate_on") or {}, t.get("rate_off") or {}
    for c in ("2", "8"):
        a, f = ro.get(c), rf.get(c)
        what = f"sustained execs per second, {c} clients (each its own connection and sandbox)"
        if a and f:
            L.append(f"| {what} | **{a['per_second']:.0f}/s** log on, {f['per_second']:.0f}/s off "
                     f"({a['per_second'] / f['per_second']:.2f}×) | – | |")
        else:
            L.append(f"| {what} | not measured: {_err(t)} | – | |")
    L.append("")
    return L


def function_rows(res):
    """Issue 15's targets (same run; bench/fn_bench): the function tier against a fresh
    sandbox per call and a bare host python3, and a C++ batch."""
    f = res.get("function")
    if f is None:
        return []  # a run from before the function tier
    L = ["**The function tier** (same run; bench/fn_bench: `print(1)` in python, rows interleaved round by "
         "round; latency at the client, and at the server from the answer's `server_ms`):", ""]
    p1 = f.get("print1") or {}
    if not p1:
        return L + [f"not measured: {_err(f)}", ""]
    label = {"function": "function tier (`POST /v1/functions/run`)",
             "sandbox": "fresh container sandbox per call (create, exec `python3 -c`, delete)",
             "host_python": "bare `python3 -c 'print(1)'` on the host (posix_spawn + wait)"}
    L += ["| path | clients | calls | p50 ms | p99 ms | server p50 ms | server p99 ms | calls/s |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in ("function", "sandbox", "host_python"):
        for n, r in sorted((p1.get(name) or {}).items(), key=lambda kv: int(kv[0])):
            err = f" ({r['failed']} failed)" if r.get("failed") else ""
            L.append(f"| {label[name]}{err} | {n} | {r['calls']} | {fmt(r['p50_ms'], 2)} | {fmt(r['p99_ms'], 2)} | "
                     f"{fmt(r.get('server_p50_ms'), 2)} | {fmt(r.get('server_p99_ms'), 2)} | "
                     f"{fmt(r['per_second'], 0)} |")
    L.append("")
    for k, what in (("batch_cold", "a new program: compiled in the call"), ("batch_warm", "the same program again: cached")):
        b = f.get(k) or {}
        if b.get("cases"):
            L.append(f"C++ A+B against 100 test cases in one `POST /v1/functions/batch` ({what}): "
                     f"**{b['wall_ms']:.0f} ms** for the call ({b['correct']}/{b['cases']} correct; compile "
                     f"{b['compile_ms']:.0f} ms; per case p50 {b['case_p50_ms']:.2f} ms, p99 {b['case_p99_ms']:.2f} ms; "
                     f"{b['cases_per_second']:.0f} cases/s).")
        else:
            L.append(f"C++ batch ({what}): not measured: {_err(b)}")
        L.append("")

    def verdict(ok):
        return "**met**" if ok else "**missed**"

    fn = p1.get("function") or {}
    host = p1.get("host_python") or {}
    L += ["| target (issue 15) | measured | |", "|---|---:|---|"]
    one = fn.get("1") or {}
    if one.get("server_p50_ms") is not None:
        L.append(f"| function-tier python p50 at the server < 5 ms (1 client) | {one['server_p50_ms']:.2f} ms | "
                 f"{verdict(one['server_p50_ms'] < 5)} |")
    h1 = host.get("1") or {}
    if one.get("p50_ms") and h1.get("p50_ms"):
        L.append(f"| faster than a bare host `python3` in the same run (p50 at the client, 1 client) | "
                 f"{one['p50_ms']:.2f} ms vs {h1['p50_ms']:.2f} ms | {verdict(one['p50_ms'] < h1['p50_ms'])} |")
    eight = fn.get("8") or {}
    if eight.get("per_second") is not None:
        L.append(f"| ≥ 300 calls/s at 8 clients | {eight['per_second']:.0f} calls/s | "
                 f"{verdict(eight['per_second'] >= 300)} |")
    L.append("")
    return L


def lifecycle_rows(res):
    """Issue 13's burst, density and pause rows (same run; bench/lifecycle_bench.py)."""
    v = res.get("lifecycle")
    if v is None:
        return []  # a run from before warm pools
    L = ["**Bursts, density, pause and resume** (same run; bench/lifecycle_bench.py against the run's daemon):", ""]
    if "error" in v and len(v) == 1:
        return L + [f"not measured: {_err(v)}", ""]

    def verdict(ok):
        return "**met**" if ok else "**missed**"
    floor2 = ((res.get("throughput") or {}).get("floor") or {}).get("2", {}).get("rate")
    L += ["| measurement | measured | target | |", "|---|---:|---:|---|"]
    b = v.get("burst") or {}
    if "error" in b:
        L.append(f"| burst | not measured: {_err(b)} | | |")
    elif b:
        L.append(f"| burst of {b['n']} with a pool of {b['pool']}: all ready after | {b['seconds']:.2f} s "
                 f"({b['from_pool']} from the pool, {b['failed']} failed) | | |")
        if floor2:
            r = b["rate"] / floor2
            L.append(f"| creation rate during the burst ÷ the floor's at 2 clients | {b['rate']:.0f}/s ÷ "
                     f"{floor2:.0f}/s = {r:.2f}× | ≥ 0.5× | {verdict(r >= 0.5)} |")
        L.append(f"| the pool's fill before it ({b['pool']} sandboxes, refills one at a time) | "
                 f"{b['pool_fill_seconds']:.1f} s | | |")
    d = v.get("density") or {}
    if "error" in d:
        L.append(f"| density | not measured: {_err(d)} | | |")
    elif d:
        lim = d.get("limits") or {}
        stop = f"; stopped by: {d['first_refusal'][:120]}" if d.get("first_refusal") else ""
        if d.get("capped_by"):
            stop += f"; asked for no more than {d['capped_by']} allows"
        L.append(f"| idle sandboxes alive at once (asked {d['asked']}){stop} | {d['alive']} | 10,000 | "
                 f"{verdict(d['alive'] >= 10000)} |")
        maps = d.get("kmalloc_1k_kb_per_sandbox")
        maps = (f"; of the kernel's, {maps:.0f} kB in kmalloc-1k, mostly the per-memory-cgroup shrinker maps that "
                f"grow with every superblock on the host" if maps is not None else "")
        L.append(f"| idle memory per sandbox at that count (kernel {d['kernel_kb_per_sandbox']:.0f} + agent PSS "
                 f"{d['agent_pss_kb_per_sandbox']:.0f} kB{maps}) | {d['total_kb_per_sandbox'] / 1024:.2f} MiB | "
                 f"≤ 0.67 MiB | {verdict(d['total_kb_per_sandbox'] / 1024 <= 0.67)} |")
        L.append(f"| daemon descriptors / RSS per idle sandbox | {d['daemon_fds_per_sandbox']:.2f} fds, "
                 f"{d['daemon_rss_kb_per_sandbox']:.1f} kB | | |")
        L.append(f"| host limits met: open files {lim.get('open_files')}, pid_max {lim.get('pid_max')}, "
                 f"threads-max {lim.get('threads_max')}, kernel keys per user {lim.get('keys_maxkeys')} | | | |")
    p = v.get("pause") or {}
    if "error" in p:
        L.append(f"| pause / resume | not measured: {_err(p)} | | |")
    elif p:
        L.append(f"| pause of a sandbox holding {p['mb']} MB (p50 of {p['rounds']}, at the client) | "
                 f"{p['pause_p50_ms']:.1f} ms (max {p['pause_max_ms']:.1f}) | reported | |")
        L.append(f"| resume of it | {p['resume_p50_ms']:.1f} ms (max {p['resume_max_ms']:.1f}) | reported | |")
    L.append("")
    return L


def _err(o):
    if not o:
        return "no result"
    e = o.get("error") or o.get("_stderr") or "no result"
    return e.strip().splitlines()[-1].replace("|", "/")[:200] if e.strip() else "no result"


def setup_table():
    L = ["**What each tool sets up** (all on the same static-busybox root built by the bench unless noted above):", "",
         "| tool | isolation and resources |", "|---|---|"]
    for t in ORDER:
        L.append(f"| {TOOLS[t][0].format(image='IMAGE')} | {TOOLS[t][2]} |")
    L.append("")
    return L


def write_md(res, out):
    L = ["# Tidepool benchmarks: latest run", "",
         "Produced by `make bench` (bench/run.sh → bench/peers.py → bench/report.py); raw numbers in latest.json.",
         ""]
    L += tables(res)
    L += setup_table()
    L += ["![latency distributions](latency.png)", "", "![throughput by concurrency](throughput.png)", "",
          "![idle memory per sandbox](memory.png)", ""]
    errs = [(t, e) for t in ORDER for e in res["latency"].get(t, {}).get("errors", [])]
    if errs:
        L.append("Errors during the run:")
        L.append("")
        for t, e in errs[:20]:
            L.append(f"- {t}: `{e.splitlines()[-1] if e else ''}`")
        L.append("")
    with open(os.path.join(out, "latest.md"), "w") as f:
        f.write("\n".join(L))


def write_readme(res, path):
    body = ["Reproduce with one command (root, Debian 12; installs crun, runc, bubblewrap, hyperfine and",
            "matplotlib from Debian's archive, builds a static-busybox root shared by every tool, starts a",
            "private `tidepoold`, and cleans up everything it made):", "",
            "    make bench                  # 20-30 min on 2 cores",
            "    BENCH_QUICK=1 make bench    # ~5 min smoke run", "",
            "It writes `bench/results/latest.md` (tables), `latest.json` (every sample) and PNG charts",
            "(`latency.png`, `throughput.png`, `memory.png`). All tools run interleaved, round-robin with the",
            "order rotated, so that machine noise hits everyone alike. Latest run on this machine:", ""]
    body += tables(res, for_readme=True)
    body += ["What each tool sets up, the charts and the errors: `bench/results/latest.md`.", ""]
    block = README_BEGIN + "\n" + "\n".join(body) + README_END + "\n"
    text = open(path).read()
    if README_BEGIN in text and README_END in text:
        a = text.index(README_BEGIN)
        b = text.index(README_END) + len(README_END)
        if text[b:b + 1] == "\n":
            b += 1
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n## Benchmarks\n\n" + block
    with open(path, "w") as f:
        f.write(text)


def charts(res, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib missing; no charts", file=sys.stderr)
        return
    img = res.get("image", "host")
    names = {t: TOOLS[t][0].format(image=img).replace("**", "").replace("`", "") for t in ORDER}
    short = {"tidepool-cli": "Tidepool CLI", "bwrap": "bwrap", "crun": "crun", "runc": "runc",
             "busybox-true": "busybox true", "tidepool-api": "Tidepool API client", "floor": "kernel floor"}
    colors = {"tidepool-cli": "#1f77b4", "tidepool-api": "#17becf", "bwrap": "#2ca02c", "crun": "#ff7f0e",
              "runc": "#d62728", "busybox-true": "#7f7f7f", "floor": "#9467bd"}
    m = res["machine"]
    sub = (f"{m['nproc']} vCPU {m['model'][:40]}, kernel {m['kernel']}, load {m['loadavg_start'][0]}–"
           f"{m.get('loadavg_end', ['?'])[0]}")

    # Latency distributions.
    tools = [t for t in ORDER if res["latency"].get(t, {}).get("samples")]
    if tools:
        fig, ax = plt.subplots(figsize=(9, 0.6 * len(tools) + 1.8))
        data = [res["latency"][t]["samples"] for t in tools]
        bp = ax.boxplot(data, vert=False, whis=(1, 99), showfliers=True, patch_artist=True,
                        flierprops={"markersize": 2, "alpha": 0.4}, medianprops={"color": "black"})
        for patch, t in zip(bp["boxes"], tools):
            patch.set_facecolor(colors[t])
            patch.set_alpha(0.6)
        ax.set_yticks(range(1, len(tools) + 1))
        ax.set_yticklabels([f"{short[t]} ({TOOLS[t][1]}, n={len(res['latency'][t]['samples'])})" for t in tools])
        ax.set_xscale("log")
        ax.set_xlabel("create + run true + destroy, ms (log scale; box = quartiles, whiskers = p1–p99)")
        for i, t in enumerate(tools, 1):
            s = res["latency"][t]["samples"]
            ax.annotate(f"p50 {pct(s, 50):.1f} ms, p99 {pct(s, 99):.1f}", (max(s), i), xytext=(6, 0),
                        textcoords="offset points", va="center", fontsize=7)
        ax.set_xlim(right=max(max(d) for d in data) * 4)
        ax.invert_yaxis()
        ax.set_title(f"Cold sandbox latency, interleaved rounds\n{sub}", fontsize=9)
        ax.grid(axis="x", which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "latency.png"), dpi=110)
        plt.close(fig)

    # Throughput by concurrency.
    concs = [c for c in res["config"]["concurrency"].split(",") if c]
    fig, ax = plt.subplots(figsize=(8, 5))
    for t in ORDER:
        tp = res["throughput"].get(t, {})
        xs = [int(c) for c in concs if c in tp]
        ys = [tp[c]["rate"] for c in concs if c in tp]
        if xs:
            ax.plot(xs, ys, marker="o", label=f"{short[t]} ({TOOLS[t][1]})", color=colors[t])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([int(c) for c in concs])
    ax.set_xticklabels(concs)
    ax.set_xlabel("concurrency (client threads / parallel processes)")
    ax.set_ylabel("sandboxes per second (create + true + destroy)")
    ax.set_title(f"Sustained rate, {res['config']['rate_seconds']:g} s per point\n{sub}", fontsize=9)
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    plt.close(fig)

    # Idle memory.
    idle = {k: v for k, v in res.get("idle", {}).items() if v.get("total_kb") is not None}
    if idle:
        order = [n for n in ["tidepool", "bwrap", "crun", "runc", "busybox-sleep"] if n in idle]
        fig, ax = plt.subplots(figsize=(8, 4))
        left = [0.0] * len(order)
        for key, label, col in (("kernel_kb", "kernel (slab, stacks, page tables, percpu)", "#9467bd"),
                                ("pss_kb", "processes' PSS", "#1f77b4"), ("overhead_pss_kb", "daemon PSS", "#17becf")):
            vals = [max(0.0, idle[n].get(key) or 0.0) for n in order]
            ax.barh(range(len(order)), vals, left=left, label=label, color=col, alpha=0.8)
            left = [a + b for a, b in zip(left, vals)]
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels([f"{IDLE_LABEL[n].replace('`', '')} (n={idle[n]['alive']})" for n in order], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("kB per idle sandbox")
        ax.set_title(f"Idle memory per sandbox\n{sub}", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "memory.png"), dpi=110)
        plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--readme")
    a = ap.parse_args()
    with open(a.results) as f:
        res = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    write_md(res, a.out)
    charts(res, a.out)
    if a.readme:
        write_readme(res, a.readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
