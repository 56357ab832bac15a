"""Helpers of the hostile suite (import them from here, not from conftest)."""
from __future__ import annotations

from tp_testlib import upload_payload

__all__ = ["upload_payload", "probe_lines", "daemon_rss_kb"]


def probe_lines(stdout: str) -> dict:
    """Parses `<name> rc=R errno=E` / `<name> status=S` lines of the probe payloads."""
    out = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(" ")
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        out[name] = {k: int(v) for k, v in fields.items()}
    return out


def daemon_rss_kb(pid: int) -> int:
    """Resident memory of a host process in KiB (-1 if unknown)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1

