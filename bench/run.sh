#!/bin/sh
# make bench: Tidepool side by side with crun, runc, bwrap, the raw kernel floor and a
# bare busybox `true`, interleaved, on one busybox root file system; then the daemon alone
# (bench/daemon_bench): exec in a running sandbox against a host spawn of the same binary,
# its RSS under keyed 4 MiB execs, and a restart with 500 sandboxes alive (50 when quick);
# then bench/hostile_bench.py: /health with 10,000 idle connections held open, and what a
# uid range per sandbox adds to a create; then bench/microvm_bench.py: the microvm tier;
# then bench/trajlog_bench: exec latency with the trajectory log on vs off, fast-forward of
# a recorded step, log bytes per step, and the sustained exec rate at 2 and 8 clients (two
# more daemons of this build); then bench/fn_bench: `print(1)` through the
# function tier against a fresh sandbox per call and a bare host python3 (1, 2, 8
# clients), and a C++ solution against 100 test cases in one batch call; then
# bench/lifecycle_bench.py: a burst of 1,000 with a warm pool of 100, 10,000 idle
# sandboxes alive at once, pause and resume of a sandbox holding 100 MB.
#
#   make bench                      20-30 min on 2 cores: 20 latency rounds x 30 runs per tool,
#                                   5 s per tool and concurrency, 1,000 idle sandboxes per tool
#   BENCH_QUICK=1 make bench        ~5 min smoke run (3 x 5 runs, 1.5 s, 100 idle)
#   BENCH_UPDATE_README=1 ...       also rewrite README.md's "## Benchmarks" table
#   BUILD=build-x / TP_BIN=DIR      binaries to measure (default build/bin)
#   BENCH_RESTART_N=N               sandboxes alive across the restart (default 500)
#   BENCH_RESTART_SIGNAL=SIG        how the old daemon is stopped (default KILL)
#
# Writes bench/results/latest.md, latest.json and PNG charts. Everything it creates
# (daemon, sandboxes, containers, cgroups, processes, the temp dir) is removed on exit,
# also on failure or Ctrl-C.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${TP_BIN:-$ROOT/${BUILD:-build}/bin}
PY=/usr/bin/python3
OUT=$ROOT/bench/results
UNIFIED=/sys/fs/cgroup/unified/cgroup.controllers

if [ "${BENCH_QUICK:-0}" = 1 ]; then
  ARGS="--rounds 3 --runs 5 --rate-seconds 1.5 --idle 100 --idle-cap 20 --exec-rounds 2 --exec-runs 20 --rss-execs 10"
  RESTART_N=${BENCH_RESTART_N:-50}
  HOSTILE_IDLE=1000 HOSTILE_ROUNDS=2 HOSTILE_RUNS=5
  TRAJ_ARGS="--rounds 3 --runs 20 --steps 50 --ff 50 --rate-seconds 1"
  FN_ARGS="--rounds 1 --seconds 1 --sandbox-seconds 1"
  LIFE_BURST=200 LIFE_POOL=20 LIFE_DENSITY=1000
else
  ARGS="--rounds 20 --runs 30 --rate-seconds 5 --idle 1000 --idle-cap 100 --exec-rounds 10 --exec-runs 50 --rss-execs 100"
  RESTART_N=${BENCH_RESTART_N:-500}
  HOSTILE_IDLE=10000 HOSTILE_ROUNDS=10 HOSTILE_RUNS=20
  TRAJ_ARGS="--rounds 10 --runs 50 --steps 200 --ff 200 --rate-seconds 5"
  FN_ARGS="--rounds 2 --seconds 5 --sandbox-seconds 4"
  LIFE_BURST=1000 LIFE_POOL=100 LIFE_DENSITY=10000
fi
# How the daemon is stopped for the restart measurement: KILL, as a crash or an upgrade
# that gives the old daemon no chance to tidy up (TERM ends every sandbox by design).
RESTART_SIGNAL=${BENCH_RESTART_SIGNAL:-KILL}

[ "$(id -u)" = 0 ] || { echo "bench: needs root (namespaces, cgroups, peers' containers)" >&2; exit 1; }
sh "$ROOT/scripts/install-bench-deps.sh"
for b in tidepoold tidepool tp-agent api_bench raw_floor daemon_bench trajlog_bench fn_bench; do
  [ -x "$BIN/$b" ] || { echo "bench: $BIN/$b missing (make build)" >&2; exit 1; }
done

WORK=$(mktemp -d /tmp/tp-bench-XXXXXX)
chmod 0711 "$WORK"  # the sandboxes' mapped root must traverse it to reach the root fs
PREFIX=tpb$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
DPID=""
CG_BEFORE="$WORK/cgroups.before"
DEVNULL_BEFORE=$(stat -c %u:%g:%a /dev/null)
ls -d /sys/fs/cgroup/*/*/ 2>/dev/null | sort >"$CG_BEFORE" || true

# Runs "$@" in a private mount namespace where crun 1.8.1 accepts this host's cgroup
# layout: on hybrid hosts (v1 controllers plus a v2 mount listing some), crun refuses to
# start unless the v2 mount lists none, so an empty file is bound over its list there.
# Nothing outside that namespace sees it.
# In there /dev/null is a private node as well: crun 1.8.1 fchown()s its stdio to the
# container's root (host uid 100000 here), and with the host's /dev/null as stdio that
# left the host's /dev/null owned by 100000 and writable by every sandbox of that range.
in_peer_ns() {
  unshare -m --propagation private sh -c '
    if mountpoint -q /sys/fs/cgroup/memory && [ -n "$(cat "$1" 2>/dev/null)" ]; then
      mount --bind "$2" "$1"
    fi
    mkdir -p "$3" && mount -t tmpfs -o size=16k,mode=0755 tmpfs "$3" &&
      mknod -m 0666 "$3/null" c 1 3 && mount --bind "$3/null" /dev/null || exit 1
    shift 3
    exec "$@" </dev/null' sh "$UNIFIED" "$WORK/empty" "$WORK/devns" "$@"
}

cleanup() {
  rc=$?
  set +e
  trap - EXIT INT TERM HUP
  # Background sandboxes we spawned (bwrap, busybox sleep), by recorded pid, and only
  # while that pid still runs something from our temp dir (a pid may have been reused).
  if [ -f "$WORK/pids" ]; then
    while read -r p; do
      if grep -qa "$WORK" "/proc/$p/cmdline" 2>/dev/null; then
        kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
      fi
    done <"$WORK/pids"
  fi
  # crun and runc containers named with this run's prefix.
  in_peer_ns sh -c '
    for rt in crun runc; do
      for id in $($rt list -q 2>/dev/null | grep "^$1-"); do $rt delete -f "$id" >/dev/null 2>&1; done
    done' sh "$PREFIX" 2>/dev/null
  # The daemon removes its sandboxes when it stops.
  if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then
    kill -TERM "$DPID"
    # --stop-sandboxes-on-exit: a daemon with thousands alive takes minutes to end them all,
    # and a KILL would leave them running.
    i=0
    while kill -0 "$DPID" 2>/dev/null && [ $i -lt 6000 ]; do sleep 0.1; i=$((i + 1)); done
    kill -KILL "$DPID" 2>/dev/null
    wait "$DPID" 2>/dev/null
  fi
  # Cgroups this run created and left (rmdir only removes empty ones), deepest first.
  ls -d /sys/fs/cgroup/*/*/ /sys/fs/cgroup/*/*/*/ 2>/dev/null | sort >"$WORK/cgroups.after"
  comm -13 "$CG_BEFORE" "$WORK/cgroups.after" | grep -E "/(tidepool-[0-9a-f]+(-microvm)?|tp-floor-[0-9a-f]+|tp-bench-[0-9a-f]+|$PREFIX-[^/]+)/" |
    sort -r | while read -r d; do rmdir "$d" 2>/dev/null; done
  # The host's /dev/null as it was at the start (see in_peer_ns): restored, loudly, if a
  # peer changed it anyway.
  if [ "$(stat -c %u:%g:%a /dev/null)" != "$DEVNULL_BEFORE" ]; then
    echo "bench: a peer changed the host's /dev/null to $(stat -c %u:%g:%a /dev/null); restoring $DEVNULL_BEFORE" >&2
    chown "${DEVNULL_BEFORE%:*}" /dev/null && chmod "${DEVNULL_BEFORE##*:}" /dev/null
    [ "$rc" = 0 ] && rc=1
  fi
  if grep -q " $WORK" /proc/self/mountinfo; then
    echo "bench: mounts left under $WORK; not removing it" >&2
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

: >"$WORK/empty"
echo "bench: building the busybox root file system and OCI bundles in $WORK"
"$PY" "$ROOT/bench/peers/prepare.py" "$WORK"

# A private daemon on a free port, with uid ranges for the 10,000 sandboxes of the density
# row (the default 4,096 would stop it), room for sandboxes' descriptors and for the
# idle connections bench/hostile_bench.py holds from this one client (by default one
# client may hold half the daemon's connections, and the rest make room). Started
# again on the same data directory for the restart measurement (below).
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
start_daemon() {
  (ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$BIN/tidepoold" --listen "127.0.0.1:$PORT" --insecure-tcp --socket "" --stop-sandboxes-on-exit \
    --data-dir "$WORK/data" --log-level warn --uid-ranges 16384 \
    --max-connections $((HOSTILE_IDLE + 2000)) --max-connections-per-client $((HOSTILE_IDLE + 2000))) >>"$WORK/daemon.log" 2>&1 &
  DPID=$!
}
wait_daemon() {
  "$PY" - "$URL" <<'EOF' || { echo "bench: tidepoold did not start:" >&2; cat "$WORK/daemon.log" >&2; exit 1; }
import sys, time, urllib.request
for _ in range(200):
    try:
        urllib.request.urlopen(sys.argv[1] + "/health", timeout=1).read()
        sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(1)
EOF
}
start_daemon
export TIDEPOOL_URL="$URL"
wait_daemon

# The same root for Tidepool: `tidepool image import` if the CLI has it, else the API's
# import route; if neither works, the built-in `host` image (said in the table).
IMAGE=host
NOTE="Tidepool ran from its built-in host image (read-only binds of the host's /usr, /bin, ...): image import was not available"
# (`tidepool image import --help` alone is no test: without the subcommand, CLI11 prints
# the top-level help and exits 0.)
if "$BIN/tidepool" --help 2>/dev/null | grep -q '^ *image ' &&
  "$BIN/tidepool" image --help 2>/dev/null | grep -q '^ *import '; then
  if "$BIN/tidepool" image import --name bench-busybox "$WORK/busybox.tar" >"$WORK/import.log" 2>&1; then
    IMAGE=bench-busybox
    NOTE="Tidepool ran from the same busybox root, imported with \`tidepool image import\`"
  fi
fi
if [ "$IMAGE" = host ]; then
  if "$PY" - "$URL" "$WORK/busybox.tar" >>"$WORK/import.log" 2>&1 <<'EOF'
import sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/v1/images/import?name=bench-busybox&kind=docker",
                             data=open(sys.argv[2], "rb").read(), method="POST",
                             headers={"Content-Type": "application/x-tar"})
print(urllib.request.urlopen(req, timeout=120).read().decode())
EOF
  then
    IMAGE=bench-busybox
    NOTE="Tidepool ran from the same busybox root, imported through the API (POST /v1/images/import): the CLI has no \`image import\` yet"
  fi
fi
if [ "$IMAGE" != host ] && ! "$BIN/tidepool" run --image "$IMAGE" -- true >>"$WORK/import.log" 2>&1; then
  IMAGE=host
  NOTE="Tidepool ran from its built-in host image: a sandbox of the imported busybox image failed ($(tail -1 "$WORK/import.log"))"
fi
echo "bench: tidepool image: $IMAGE"

mkdir -p "$OUT"
# shellcheck disable=SC2086
in_peer_ns "$PY" "$ROOT/bench/peers.py" --work "$WORK" --bin "$BIN" --url "$URL" --daemon-pid "$DPID" \
  --image "$IMAGE" --image-note "$NOTE" --prefix "$PREFIX" --out "$WORK/results.json" $ARGS

# The function tier (bench/fn_bench): print(1) through it, through a fresh container-tier
# sandbox per call and as a bare host python3, at 1, 2 and 8 clients; a C++ solution
# against 100 test cases in one batch call. Outside the peers' mount namespace, as the
# daemon's own sandboxes need the host's mounts.
echo "bench: function tier"
# shellcheck disable=SC2086
"$BIN/fn_bench" --url "$URL" --json $FN_ARGS >"$WORK/fn.json" 2>"$WORK/fn.log" || true
"$PY" - "$WORK/results.json" "$WORK/fn.json" "$WORK/fn.log" <<'EOF'
import json, sys
path, out, log = sys.argv[1:]
try:
    lines = [l for l in open(out).read().splitlines() if l.startswith("{")]
    f = json.loads(lines[-1])
except (OSError, ValueError, IndexError):
    f = {"error": open(log).read().strip()[-400:] or "fn_bench failed"}
res = json.load(open(path))
res["function"] = f
json.dump(res, open(path, "w"))
print("bench: function tier: " + json.dumps(f)[:400], file=sys.stderr)
EOF

# Restart with RESTART_N sandboxes alive: each answers an exec, the daemon is stopped with
# RESTART_SIGNAL and started again on the same data directory; the time is from that start
# until every sandbox answered an exec again (daemon_bench restart-wait; a sandbox the new
# daemon reports stopped or lost counts as not surviving). Outside the peers' mount
# namespace: the daemon's sandboxes must see the host's mounts.
echo "bench: restart with $RESTART_N sandboxes alive (SIG$RESTART_SIGNAL)"
: >"$WORK/restart-wait.json"
if "$BIN/daemon_bench" restart-prepare --url "$URL" --image "$IMAGE" --count "$RESTART_N" \
  --ids "$WORK/restart.ids" >"$WORK/restart-prepare.json" 2>"$WORK/restart.log"; then
  kill -s "$RESTART_SIGNAL" "$DPID"
  wait "$DPID" 2>/dev/null || true
  T0=$(date +%s%N)
  start_daemon
  "$BIN/daemon_bench" restart-wait --url "$URL" --ids "$WORK/restart.ids" --t0-ns "$T0" \
    >"$WORK/restart-wait.json" 2>>"$WORK/restart.log" || true
  wait_daemon
fi
"$PY" - "$WORK/results.json" "$WORK/restart-prepare.json" "$WORK/restart-wait.json" "$WORK/restart.log" \
  "$RESTART_N" "$RESTART_SIGNAL" <<'EOF'
import json, sys
path, prep, wait, log, n, sig = sys.argv[1:]
def last_json(p):
    try:
        lines = [l for l in open(p).read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None
def tail(p):
    try:
        return open(p).read().strip()[-400:]
    except OSError:
        return ""
r = {"requested": int(n), "signal": sig, "prepare": last_json(prep), "wait": last_json(wait)}
if r["wait"] is None:
    r["error"] = tail(log) or "restart-prepare failed"
res = json.load(open(path))
res["restart"] = r
json.dump(res, open(path, "w"))
print(f"bench: restart: {r}", file=sys.stderr)
EOF
# Merges the last JSON line of file $2 into results.json as key $1 ({"error": ...} with the
# tail of log $3 when there is none).
merge_last_json() {
  "$PY" - "$WORK/results.json" "$1" "$2" "$3" <<'EOF'
import json, sys
path, key, out, log = sys.argv[1:]
try:
    lines = [l for l in open(out).read().splitlines() if l.startswith("{")]
    h = json.loads(lines[-1])
except (OSError, ValueError, IndexError):
    h = {"error": open(log).read().strip()[-400:] or f"{key}: no result"}
res = json.load(open(path))
res[key] = h
json.dump(res, open(path, "w"))
print(f"bench: {key}: {h}", file=sys.stderr)
EOF
}
# What the defences against hostile code and clients cost (bench/hostile_bench.py): /health
# with many idle connections held against the restarted daemon, and a uid range per sandbox
# (two more daemons of this build, shared range against per-sandbox ranges).
echo "bench: hostile clients and per-sandbox uid ranges"
(ulimit -n $((HOSTILE_IDLE + 4096)) 2>/dev/null || true
  "$PY" "$ROOT/bench/hostile_bench.py" --url "$URL" --bin "$BIN" --idle-conns "$HOSTILE_IDLE" \
    --rounds "$HOSTILE_ROUNDS" --runs "$HOSTILE_RUNS") >"$WORK/hostile.json" 2>"$WORK/hostile.log" || true
merge_last_json hostile "$WORK/hostile.json" "$WORK/hostile.log"
# The microvm tier (bench/microvm_bench.py): cold boot and clone to first exec, exec round
# trip, idle PSS per cloned VM, creation rate at 1 and 2 clients; two daemons of its own.
echo "bench: microvm tier"
if [ "${BENCH_QUICK:-0}" = 1 ]; then
  VM_ARGS="--cold 2 --clones 5 --execs 20 --idle 4 --idle-seconds 2 --rate-seconds 4"
else
  VM_ARGS="--cold 5 --clones 20 --execs 50 --idle 10 --idle-seconds 5 --rate-seconds 10"
fi
# shellcheck disable=SC2086
"$PY" "$ROOT/bench/microvm_bench.py" --bin "$BIN" $VM_ARGS >"$WORK/microvm.json" 2>"$WORK/microvm.log" || true
merge_last_json microvm "$WORK/microvm.json" "$WORK/microvm.log"
# What the trajectory log costs (bench/trajlog_bench.cpp): two more daemons of this build,
# --trajectory-log on and off, interleaved.
echo "bench: trajectory log on vs off"
# shellcheck disable=SC2086
"$BIN/trajlog_bench" --bin "$BIN" $TRAJ_ARGS >"$WORK/trajlog.json" 2>"$WORK/trajlog.log" || true
merge_last_json trajectory "$WORK/trajlog.json" "$WORK/trajlog.log"
# Bursts, density and pause/resume (bench/lifecycle_bench.py, issue 13) against this run's
# daemon: a burst of LIFE_BURST with a warm pool of LIFE_POOL, LIFE_DENSITY idle
# sandboxes alive at once, pause and resume of a sandbox holding 100 MB.
echo "bench: bursts, density, pause and resume"
"$PY" "$ROOT/bench/lifecycle_bench.py" --url "$URL" --daemon-pid "$DPID" --image "$IMAGE" --burst "$LIFE_BURST" \
  --pool "$LIFE_POOL" --density "$LIFE_DENSITY" >"$WORK/lifecycle.json" 2>"$WORK/lifecycle.log" || true
merge_last_json lifecycle "$WORK/lifecycle.json" "$WORK/lifecycle.log"
cp "$WORK/results.json" "$OUT/latest.json"
README_ARG=""
[ "${BENCH_UPDATE_README:-0}" = 1 ] && README_ARG="--readme $ROOT/README.md"
# shellcheck disable=SC2086
"$PY" "$ROOT/bench/report.py" "$OUT/latest.json" --out "$OUT" $README_ARG
echo "bench: wrote $OUT/latest.md"
