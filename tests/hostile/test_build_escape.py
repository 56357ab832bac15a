"""Image builds run a spec's commands contained (POST /v1/images/build).

One real mmdebstrap build (slow: a minute or more) whose `run` steps try to write a host
file by every route at hand (/proc/1/root, /proc/self/root/.., an absolute symlink, a
chroot escape, mknod, mount, open_by_handle_at, a new user namespace) and report what
they are: their capabilities, seccomp mode, uid/gid maps and network interfaces. The
host file must not exist afterwards, root of the build must not be host root, the
refused calls must be refused, and nothing of the build may remain in the store's tmp.

The probes use perl-base (in every Debian root) with raw x86_64 syscall numbers.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import uuid

import pytest

import tidepool
from tp_testlib import http_raw

EPERM = 1


def api(daemon, method, path, body=None, timeout=120):
    st, ct, data = http_raw(daemon.url, method, path, body=body, timeout=timeout)
    return st, (json.loads(data) if data and "json" in ct else data)


def _probe(name: str, setup: str, call: str) -> str:
    """A shell line appending '<name> rc=<rc> errno=<errno>' to /etc/tp-probes. String
    arguments of perl's syscall must be variables (`setup`), not literals."""
    return (f"perl -e 'my ($a, $b, $c) = ({setup}); $r = {call}; print \"{name} rc=$r errno=\", $!+0, \"\\n\"' "
            f">> /etc/tp-probes 2>&1 || echo '{name} died' >> /etc/tp-probes")


@pytest.mark.slow
def test_build_run_steps_cannot_reach_the_host(daemon, client):
    if not shutil.which("mmdebstrap"):
        pytest.fail("mmdebstrap missing: scripts/install-deps.sh installs it")
    if platform.machine() != "x86_64":
        pytest.skip("the probes use x86_64 syscall numbers")
    target = f"/tmp/tp-build-escape-{uuid.uuid4().hex}"
    assert not os.path.exists(target)
    # Every route writes `target`; each line records whether the write went through
    # (inside the build that only ever reaches the new root's own /tmp).
    writes = " ".join(f"'{p}'" for p in (f"/proc/1/root{target}", f"/proc/self/root/../../../..{target}",
                                         f"/proc/1/cwd/../../../..{target}", f"/proc/self/cwd/../../..{target}"))
    run = [
        "{ grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status; echo uid_map $(cat /proc/self/uid_map);"
        " echo gid_map $(cat /proc/self/gid_map); echo ifaces $(tail -n +3 /proc/net/dev | cut -d: -f1);"
        " } > /etc/tp-report",
        f"for p in {writes}; do (echo pwned > \"$p\") 2>/dev/null && echo \"wrote $p\" >> /etc/tp-probes; done; true",
        f"ln -s {target} /abs-link && (echo pwned > /abs-link) 2>/dev/null; rm -f /abs-link; true",
        # The classic chroot escape: chroot into a subdirectory, climb, chroot to where we stand.
        "mkdir -p /x && perl -e 'chroot \"/x\" or die \"chroot: $!\"; chdir \"..\" for 1..64; chroot \".\" or die;"
        " open(F, \">\", $ARGV[0]) or die \"open: $!\"; print F \"pwned\\n\"; close F' " + target +
        " >> /etc/tp-probes 2>&1; rmdir /x; true",
        _probe("mknod", '"/tp-sda", 0, 0', "syscall(133, $a, 0060600, (8 << 8) | 0)"),
        _probe("mount_host_dev", '"/dev/null", "/mnt", "ext4"', "syscall(165, $a, $b, $c, 0, 0)"),
        _probe("open_by_handle_at", '"\\x08\\0\\0\\0\\x01\\0\\0\\0" . ("\\0" x 8), 0, 0', "syscall(304, -100, $a, 0)"),
        _probe("name_to_handle_at", '"/", "\\0" x 136, "\\0" x 4', "syscall(303, -100, $a, $b, $c, 0)"),
        _probe("unshare_user", "0, 0, 0", "syscall(272, 0x10000000)"),
        _probe("setns", "0, 0, 0", "syscall(308, 0, 0)"),
        f"rm -f {target} /tp-sda; true",  # whatever landed inside the new root
    ]
    spec = {"name": "escape", "version": "1", "suite": "bookworm", "variant": "essential", "run": run}
    st, img = api(daemon, "POST", "/v1/images/build", body=json.dumps(spec).encode(), timeout=1800)
    try:
        assert not os.path.exists(target), "a run step wrote a host file"
        assert os.listdir(os.path.join(daemon.data_dir, "images", "tmp")) == [], "the build left files"
        assert st == 201, img

        sb = client.create(image="escape:1", ttl=300)
        daemon.created.add(sb.id)
        try:
            report = sb.files.read("/etc/tp-report").decode()
            probes = sb.files.read("/etc/tp-probes").decode()
        finally:
            sb.kill()
        fields = {}
        for line in report.splitlines():
            key, _, value = line.partition(" ") if " " in line.split("\t")[0] else line.partition("\t")
            fields[key.rstrip(":")] = value.strip()
        # Root of the build is root of its own user namespace only: 0 -> 200000, never host 0.
        assert fields["uid_map"].split() == ["0", "200000", "65536"], report
        assert fields["gid_map"].split() == ["0", "200000", "65536"], report
        assert fields["Seccomp"].strip() == "2" and fields["NoNewPrivs"].strip() == "1", report
        assert fields["ifaces"].split() == ["lo"], report
        results = {l.split()[0]: l for l in probes.splitlines() if " rc=" in l}
        for name in ("mknod", "mount_host_dev", "open_by_handle_at", "name_to_handle_at", "unshare_user", "setns"):
            assert name in results, probes
            assert results[name].split()[1] == "rc=-1", results[name]
        for name in ("open_by_handle_at", "name_to_handle_at", "unshare_user", "setns", "mknod"):
            assert results[name].endswith(f"errno={EPERM}"), results[name]
    finally:
        if os.path.exists(target):
            os.unlink(target)
