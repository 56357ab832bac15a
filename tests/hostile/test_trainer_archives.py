"""The trainer's own machine: what the SDK unpacks from a sandbox is hostile input.

A directory download (`GET /files/tar`, SDK `download_dir`) is the output of whatever
`tar` the sandbox runs, passed through by the daemon as it is. Sandbox code can
therefore hand the trainer any archive: by replacing `tar`, or with a genuine tar over a
tree of links it planted. Each case puts a victim file beside the download target on the
host and asserts that the SDK refuses the archive (UnsafeArchive), leaves the victim as
it was and writes nothing.
"""
from __future__ import annotations

import asyncio
import io
import os
import tarfile
import urllib.parse

import pytest

import tidepool
from test_images import api, busybox_layer, docker_save, import_archive

SECRET = b"the trainer's precious file\n"


def _tar_of(*entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, extra in entries:
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
            if kind == tarfile.REGTYPE:
                ti.size = len(extra)
                tf.addfile(ti, io.BytesIO(extra))
            else:
                ti.linkname = extra
                tf.addfile(ti)
    return buf.getvalue()


# The issue's reproduction: s/t -> . makes s/t/t/t/ be s/, so s/t/t/t/u -> ../../victim
# is inside by its written name and beside the target on disk; h hard-links the victim's
# file through it and the regular entry h then overwrites that file.
ISSUE_ATTACK = _tar_of(("s", tarfile.DIRTYPE, ""), ("s/t", tarfile.SYMTYPE, "."),
                       ("s/t/t/t/u", tarfile.SYMTYPE, "../../victim"),
                       ("h", tarfile.LNKTYPE, "s/t/t/t/u/target.txt"),
                       ("h", tarfile.REGTYPE, b"overwritten by the sandbox\n"))


@pytest.fixture
def victim(tmp_path):
    d = tmp_path / "victim"
    d.mkdir()
    (d / "target.txt").write_bytes(SECRET)
    return d / "target.txt"


def _untouched(victim, dl) -> None:
    assert victim.read_bytes() == SECRET
    assert victim.stat().st_nlink == 1
    assert os.listdir(victim.parent) == ["target.txt"]
    assert not os.path.lexists(dl), f"the target was written: {os.listdir(dl)}"


@pytest.fixture(scope="module")
def bb_ref(daemon):
    """A busybox image without tar: /bin is in the sandbox's own writable layer."""
    st, img = import_archive(daemon, docker_save([busybox_layer()], tag="tp-hostile-tar:1"),
                             "tp-hostile-tar", "1")
    assert st == 201, img
    return img["ref"]


def test_replaced_tar_serves_the_issue_attack(daemon, client, bb_ref, tmp_path, victim):
    """Attempt: sandbox code installs its own /bin/tar, which prints the issue's archive
    whatever it is asked to pack; the trainer then calls download_dir("/work", dl).
    Expected: the daemon serves the archive as it is (it cannot judge it), and the SDK
    refuses it before writing anything: the victim beside dl keeps its content and
    gains no link, dl is not created. The async client does the same."""
    dl = tmp_path / "dl"
    with client.create(image=bb_ref, ttl=600) as sb:
        sb.files.write("/tmp/evil.tar", ISSUE_ATTACK)
        r = sb.exec(["/bin/sh", "-c", "mkdir -p /work && echo '#!/bin/sh' > /bin/tar && "
                     "echo 'cat /tmp/evil.tar' >> /bin/tar && /bin/busybox chmod 755 /bin/tar && echo ok"])
        assert r.stdout == "ok\n", r
        q = urllib.parse.urlencode({"path": "/work"})
        st, body = api(daemon, "GET", f"/v1/sandboxes/{sb.id}/files/tar?{q}")
        assert (st, body) == (200, ISSUE_ATTACK), "the daemon should pass the sandbox's archive through"
        with pytest.raises(tidepool.UnsafeArchive, match="passes through the symlink 's/t'"):
            sb.files.download_dir("/work", str(dl))
        _untouched(victim, dl)

        async def via_async():
            async with tidepool.AsyncClient(daemon.url, timeout=60) as ac:
                asb = await ac.get(sb.id)
                with pytest.raises(tidepool.UnsafeArchive):
                    await asb.files.download_dir("/work", str(dl))

        asyncio.run(via_async())
        _untouched(victim, dl)


def test_genuine_tar_over_planted_links(hostile, tmp_path, victim):
    """Attempt: with the image's real GNU tar, plant symlinks whose targets read as inside
    but resolve beside the download target on the host: out/esc -> ../victim, and the
    chain out/s/t -> . with out/s/u -> t/t/t/../../victim (textually out/s/victim).
    Expected: each archive is refused (UnsafeArchive, symlink leaves the target), the
    victim is unchanged and dl is not created; a tree with inside links still downloads."""
    dl = tmp_path / "dl"
    r = hostile.exec("set -e; mkdir -p /work/a /work/b/s /work/ok/d; ln -s ../victim /work/a/esc; "
                     "ln -s . /work/b/s/t; ln -s t/t/t/../../victim /work/b/s/u; "
                     "echo hi > /work/ok/d/f; ln /work/ok/d/f /work/ok/hard; ln -s d/f /work/ok/soft; "
                     "ln -s . /work/ok/d/self; echo ok")
    assert r.stdout == "ok\n", r
    for remote, link in (("/work/a", "'esc' -> '../victim'"), ("/work/b", "'s/u' -> 't/t/t/../../victim'")):
        with pytest.raises(tidepool.UnsafeArchive, match=f"symlink {link} leaves the target"):
            hostile.files.download_dir(remote, str(dl))
        _untouched(victim, dl)
    names = hostile.files.download_dir("/work/ok", str(dl))
    assert {"d", "d/f", "hard", "soft", "d/self"} <= set(names)
    assert (dl / "soft").read_text() == "hi\n" and (dl / "d" / "self" / "f").read_text() == "hi\n"
    assert (dl / "hard").stat().st_ino == (dl / "d" / "f").stat().st_ino
    assert victim.read_bytes() == SECRET
