"""Delete while creating: two threads create sandboxes while six threads list the ones in
state=creating and delete them. Whatever wins, every sandbox ends in one consistent state,
stored and answered alike, and nothing of any of them is left on the host.

The documented outcome (src/node/service.h): a sandbox deleted while it was being created
answers its create with 409 "deleted while creating" and is stored stopped with
end_reason=deleted; a create that answered 201 running was not deleted before it ran."""
import json
import threading
import uuid

from tp_testlib import http_raw, leaks_of, wait_until

CREATORS = 2
PER_CREATOR = 150
DELETERS = 6


def test_delete_during_create_ends_consistent(daemon, track):
    tag = uuid.uuid4().hex[:8]
    created = {}        # id -> record answered by a 201
    refused = []        # (status, body) of creates that did not answer 201
    deleted = {}        # id -> record answered by DELETE
    errors = []
    done = threading.Event()
    lock = threading.Lock()

    def creator():
        body = json.dumps({"image": "host", "ttl_seconds": 600, "labels": {"race": tag}}).encode()
        for _ in range(PER_CREATOR):
            status, _, out = http_raw(daemon.url, "POST", "/v1/sandboxes", body,
                                      {"Content-Type": "application/json"}, timeout=120)
            with lock:
                if status == 201:
                    rec = json.loads(out)
                    created[rec["id"]] = rec
                else:
                    refused.append((status, out.decode(errors="replace")))

    def deleter():
        while not done.is_set():
            status, _, out = http_raw(daemon.url, "GET", f"/v1/sandboxes?state=creating&label=race={tag}")
            if status != 200:
                with lock:
                    errors.append(("list", status, out))
                continue
            for rec in json.loads(out)["sandboxes"]:
                assert rec["state"] == "creating", rec
                s, _, o = http_raw(daemon.url, "DELETE", f"/v1/sandboxes/{rec['id']}", timeout=120)
                with lock:
                    if s == 200:
                        deleted[rec["id"]] = json.loads(o)
                    else:
                        errors.append(("delete", s, o))

    creators = [threading.Thread(target=creator) for _ in range(CREATORS)]
    deleters = [threading.Thread(target=deleter) for _ in range(DELETERS)]
    for t in creators + deleters:
        t.start()
    for t in creators:
        t.join()
    done.set()
    for t in deleters:
        t.join()

    assert errors == []
    # Every refused create is a delete that won, never anything else.
    for status, body in refused:
        assert status == 409 and "deleted while creating" in body, (status, body)
    # A DELETE always answers the final record.
    for sid, rec in deleted.items():
        assert rec["state"] == "stopped" and rec["end_reason"] == "deleted", rec
    # The deleters did win some races (else this test tests nothing).
    assert deleted, "no create was deleted while creating"
    assert len(created) + len(refused) == CREATORS * PER_CREATOR

    status, _, out = http_raw(daemon.url, "GET", f"/v1/sandboxes?all=1&label=race={tag}")
    assert status == 200
    records = {r["id"]: r for r in json.loads(out)["sandboxes"]}
    for sid in records:
        track(sid)
    assert set(created) | set(deleted) <= set(records)
    assert len(records) == CREATORS * PER_CREATOR
    for sid, rec in records.items():
        assert rec["state"] in ("running", "stopped"), rec
        if rec["state"] == "running":
            assert not rec.get("end_reason"), rec  # never running with an end reason
            assert sid in created and sid not in deleted, rec
        else:
            assert rec["end_reason"] == "deleted", rec
            assert sid in deleted, rec  # stopped only where a delete won
    # Every 201-running sandbox is either still running or was deleted afterwards
    # (a delete that came after its create had answered).
    for sid in created:
        assert records[sid]["state"] == "running" or sid in deleted, records[sid]
    refused_ids = set(records) - set(created)
    assert refused_ids <= set(deleted)
    assert len(refused_ids) == len(refused)

    # Clean up the survivors; then nothing of any of them remains.
    for sid, rec in records.items():
        if rec["state"] == "running":
            s, _, o = http_raw(daemon.url, "DELETE", f"/v1/sandboxes/{sid}", timeout=120)
            assert s == 200 and json.loads(o)["end_reason"] == "deleted", o
    status, _, out = http_raw(daemon.url, "GET", f"/v1/sandboxes?label=race={tag}")
    assert json.loads(out)["sandboxes"] == []
    for sid in records:
        wait_until(lambda: not leaks_of(sid, daemon.pid, daemon.data_dir), timeout=30, interval=0.2,
                   what=f"{sid} to be cleaned up")
