"""Durable idempotency (docs/trajectory-log.md): every answer of a keyed request is recorded in
the step log before it is sent; a repeat of the key is answered from the record, runs
nothing, and this holds for 5xx answers and across a daemon restart (kill -9)."""
import base64
import http.client
import json
import os
import signal
import threading
import uuid

from tp_testlib import api_call as call, processes_of, wait_until


def _agent_pid(sandbox_id):
    for p in processes_of(sandbox_id):
        try:
            with open(f"/proc/{p}/comm") as f:
                if f.read().strip() != "tp-agent":
                    continue
            with open(f"/proc/{p}/status") as s:
                nspid = [l for l in s if l.startswith("NSpid:")][0].split()
            if nspid[-1] == "1":
                return p
        except (OSError, IndexError):
            pass
    raise AssertionError(f"no tp-agent PID 1 for {sandbox_id}")


def test_a_step_sent_twice_with_one_key_runs_once(daemon, sandbox):
    key = str(uuid.uuid4())
    step = {"cmd": "echo step >> /tmp/steps; wc -l < /tmp/steps"}
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    s1, h1, b1 = call(daemon, "POST", path, step, key)
    s2, h2, b2 = call(daemon, "POST", path, step, key)
    assert (s1, s2) == (200, 200), (b1, b2)
    assert "idempotent-replayed" not in h1
    assert h2.get("idempotent-replayed") == "true"
    assert b2 == b1
    assert base64.b64decode(json.loads(b1)["stdout"]) == b"1\n"
    assert sandbox.files.read("/tmp/steps") == b"step\n"  # the side effect happened once
    # The same key with another request is refused, naming both requests.
    s3, _, b3 = call(daemon, "POST", path, {"cmd": "echo other >> /tmp/steps"}, key)
    assert s3 == 409, b3
    msg = json.loads(b3)["message"]
    assert msg.count(f"POST {path}") == 2 and msg.count("sha256:") == 2, msg
    # Without a key each call runs.
    call(daemon, "POST", path, step)
    assert sandbox.files.read("/tmp/steps") == b"step\nstep\n"
    # The record is on disk, in the sandbox's own log.
    log = os.path.join(daemon.data_dir, "sandboxes", sandbox.id, "steps.log")
    with open(log, "rb") as f:
        data = f.read()
    assert data.startswith(b"TPSTEPS\n") and key.encode() in data


def test_a_streamed_step_whose_client_leaves_completes_for_the_retry(daemon, sandbox):
    """A streamed exec with a key prints 3 MB (more than the stream's 256 KiB window) and
    its client leaves after the first event. The keyed command must go
    on (its window comes back although nothing reaches the gone client) and the retry with
    the same key gets the whole recorded stream, ending with its exit event; the step ran
    once."""
    key = str(uuid.uuid4())
    step = {"cmd": "echo run >> /tmp/runs; head -c 3000000 /dev/zero", "stream": True}
    path = f"/v1/sandboxes/{sandbox.id}/exec"
    conn = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(step).encode(),
                     headers={"Content-Type": "application/json", "Idempotency-Key": key})
        r = conn.getresponse()
        assert r.status == 200
        assert json.loads(r.readline())["type"] == "started"
    finally:
        conn.close()  # gone after the first event
    status, headers, body = call(daemon, "POST", path, step, key, timeout=120)
    assert status == 200, body[:300]
    events = [json.loads(line) for line in body.splitlines() if line.strip()]
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events[-1]
    out = sum(len(base64.b64decode(e["data"])) for e in events if e["type"] == "stdout")
    assert out == 3000000, out
    assert sandbox.files.read("/tmp/runs") == b"run\n"  # run once


def test_a_503_answer_is_recorded_and_replayed_not_run_again(daemon, client):
    sb = client.create(ttl=600)
    key = str(uuid.uuid4())
    path = f"/v1/sandboxes/{sb.id}/exec"
    step = {"cmd": "echo ran >> /tmp/once; sleep 120"}
    first = {}

    def run():
        first["answer"] = call(daemon, "POST", path, step, key)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: sb.files.exists("/tmp/once"), timeout=30, what="the step to start")
    assert sb.files.read("/tmp/once") == b"ran\n"
    os.kill(_agent_pid(sb.id), signal.SIGKILL)
    t.join(30)
    assert not t.is_alive()
    s1, h1, b1 = first["answer"]
    assert s1 == 503, b1
    # The retry (what the SDK does on a 503) gets the recorded 503: had the step run
    # again it would be refused with 409, the sandbox having ended.
    s2, h2, b2 = call(daemon, "POST", path, step, key)
    assert s2 == 503 and b2 == b1, (s2, b2)
    assert h2.get("idempotent-replayed") == "true"
    info = wait_until(lambda: (i := client.get(sb.id).info).state in ("stopped", "lost") and i,
                      timeout=15, what="the sandbox to be reported ended")
    assert info.end_reason == "failed"
    # A fresh key does run, and is refused since the sandbox ended.
    s3, _, _ = call(daemon, "POST", path, step, str(uuid.uuid4()))
    assert s3 == 409


def test_keys_survive_a_daemon_restart(daemon, client, track):
    create_key = str(uuid.uuid4())
    s1, _, b1 = call(daemon, "POST", "/v1/sandboxes", {"ttl_seconds": 600, "labels": {"t": "durable"}},
                     create_key)
    assert s1 == 201, b1
    sid = json.loads(b1)["id"]
    track(sid)
    exec_key = str(uuid.uuid4())
    big = 200_000  # above the inline limit: the answer is in a side file
    step = {"cmd": f"head -c {big} /dev/zero | tr '\\0' b; echo once >> /tmp/mark"}
    s2, _, b2 = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", step, exec_key)
    assert s2 == 200
    assert base64.b64decode(json.loads(b2)["stdout"]) == b"b" * big

    daemon.restart(kill9=True)

    # The create is not run again: the recorded 201 comes back, same sandbox id.
    s3, h3, b3 = call(daemon, "POST", "/v1/sandboxes", {"ttl_seconds": 600, "labels": {"t": "durable"}},
                      create_key)
    assert (s3, b3) == (201, b1)
    assert h3.get("idempotent-replayed") == "true"
    # The exec's answer too, read from its side file, and the step did not run again in
    # the sandbox, which the restarted daemon adopted (live restore).
    s4, h4, b4 = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", step, exec_key)
    assert (s4, b4) == (200, b2)
    assert h4.get("idempotent-replayed") == "true"
    s6, _, b6 = call(daemon, "POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "cat /tmp/mark"}, None)
    assert s6 == 200, b6
    assert base64.b64decode(json.loads(b6)["stdout"]) == b"once\n"
    # Reuse of a recorded key for another request is still a conflict after the restart.
    s5, _, _ = call(daemon, "POST", "/v1/sandboxes", {"ttl_seconds": 60}, create_key)
    assert s5 == 409
    s7, _, _ = call(daemon, "DELETE", f"/v1/sandboxes/{sid}")
    assert s7 == 200
