"""A rollout that survives its trainer: run it, kill it (Ctrl-C) mid-way, run it again
with the same trajectory id. The second run fast-forwards through the steps the first
one finished (their recorded results come back; nothing runs twice) and continues live.
Then it replays the rollout into a fresh sandbox and branches it at step 2.

Run against a daemon started with `make run`:

    PYTHONPATH=sdk/python /usr/bin/python3 examples/trajectory.py demo-1
"""
import sys
import time

import tidepool

tid = sys.argv[1] if len(sys.argv) > 1 else "demo-1"
client = tidepool.Client()
traj = tidepool.Trajectory.create(client, tid, image="host", ttl=600)   # same sandbox on a rerun
print("sandbox", traj.sandbox.id)
for i in range(1, 6):
    t0 = time.monotonic()
    r = traj.exec(f"sleep 1; echo step {i} >> /tmp/steps; wc -l < /tmp/steps")
    print(f"step {i}: {r.stdout.strip()} lines ({time.monotonic() - t0:.2f} s)")  # instant when recorded

for e in traj.log():
    print(e.seq, e.key, e.result.get("exit_code"))
report = traj.replay()
print("replay matched:", report.matched, report.first_divergence)
branch = traj.branch(2)
print("branch", branch.sandbox.id, branch.exec("cat /tmp/steps").stdout)  # steps 1 and 2 only
branch.sandbox.kill()
