"""Helpers of the hostile suite (import them from here, not from conftest)."""
from __future__ import annotations

from tp_testlib import rss_kb, upload_payload

__all__ = ["upload_payload", "probe_lines", "rss_kb"]


def probe_lines(stdout: str) -> dict:
    """Parses `<name> rc=R errno=E` / `<name> status=S` lines of the probe payloads."""
    out = {}
    for line in stdout.splitlines():
        name, _, rest = line.partition(" ")
        fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
        out[name] = {k: int(v) for k, v in fields.items()}
    return out
