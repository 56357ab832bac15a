"""Unpacking a directory download (tidepool/_tar.py): the archive comes from whatever
`tar` runs inside the sandbox, so every case here is a hostile archive built by hand.
Each must be refused with UnsafeArchive, write nothing, and leave a victim file next to
the target untouched; well-formed archives (GNU tar's own) still unpack."""
import asyncio
import io
import os
import shutil
import stat
import subprocess
import tarfile

import pytest

import tidepool
from tidepool import _tar

SECRET = b"the trainer's precious file\n"


def tar_of(*entries) -> bytes:
    """entries: (name, kind, linkname_or_data[, mode]); kind is a tarfile type."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            name, kind, extra = e[:3]
            ti = tarfile.TarInfo(name)
            ti.type = kind
            ti.mode = e[3] if len(e) > 3 else (0o755 if kind == tarfile.DIRTYPE else 0o644)
            if kind == tarfile.REGTYPE:
                ti.size = len(extra)
                tf.addfile(ti, io.BytesIO(extra))
            else:
                ti.linkname = extra
                tf.addfile(ti)
    return buf.getvalue()


D, F, S, H = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE

# The reproduced attack of the issue: `s/t -> .` makes s/t/t/t/ be s/, so the link
# s/t/t/t/u -> ../../victim reads as inside by its written name but lands beside the
# target; the hard link h then names the victim's file and the regular entry h writes it.
ISSUE_ATTACK = tar_of(("s", D, ""), ("s/t", S, "."), ("s/t/t/t/u", S, "../../victim"),
                      ("h", H, "s/t/t/t/u/target.txt"), ("h", F, b"overwritten by the sandbox\n"))


@pytest.fixture
def victim(tmp_path):
    """tmp/victim/target.txt, the file the archives aim at; tmp/dl is the target."""
    d = tmp_path / "victim"
    d.mkdir()
    (d / "target.txt").write_bytes(SECRET)
    return d / "target.txt"


def untouched(victim) -> None:
    assert victim.read_bytes() == SECRET
    assert victim.stat().st_nlink == 1, "a hard link to the victim was made"
    assert sorted(os.listdir(victim.parent)) == ["target.txt"]
    assert sorted(os.listdir(victim.parent.parent)) in (["victim"], ["dl", "victim"])


HOSTILE = {
    "issue-attack": ISSUE_ATTACK,
    "symlink-absolute": tar_of(("etc", S, "/etc")),
    "symlink-up": tar_of(("up", S, "..")),
    "symlink-up-through-dir": tar_of(("a", D, ""), ("a/up", S, "../../victim")),
    # Inside by its written name and when made; b, added later, changes what a means.
    "symlink-meaning-changed-later": tar_of(("x/y", D, ""), ("a", S, "x/y/b/../../victim"),
                                            ("x/y/b", S, "../..")),
    "symlink-through-symlink-chain": tar_of(("s", D, ""), ("s/t", S, "."), ("s/u", S, "t/t/t/../../victim")),
    "symlink-loop": tar_of(("a", S, "b"), ("b", S, "a")),
    "file-through-archive-symlink": tar_of(("s", D, ""), ("s/t", S, "."), ("s/t/f", F, b"x")),
    "file-through-escaping-symlink": tar_of(("v", S, "../victim"), ("v/target.txt", F, b"x")),
    "dir-through-symlink": tar_of(("v", S, "../victim"), ("v/sub", D, "")),
    "hardlink-textually-out": tar_of(("h", H, "../victim/target.txt"), ("h", F, b"x")),
    "hardlink-absolute": tar_of(("h", H, "/etc/passwd")),
    "hardlink-through-symlink": tar_of(("f", F, b"1"), ("l", S, "."), ("h", H, "l/f")),
    "hardlink-to-symlink": tar_of(("l", S, "x"), ("h", H, "l")),
    "hardlink-to-directory": tar_of(("d", D, ""), ("h", H, "d")),
    "hardlink-to-nothing": tar_of(("h", H, "missing")),
    "file-replaces-symlink": tar_of(("a", S, "b"), ("a", F, b"x")),
    "symlink-replaces-symlink": tar_of(("a", S, "b"), ("a", S, "c")),
    "file-replaces-directory": tar_of(("d", D, ""), ("d", F, b"x")),
    "dir-replaces-symlink": tar_of(("d", S, "."), ("d", D, "")),
    "dotdot-name": tar_of(("../victim/target.txt", F, b"x")),
    "dotdot-inside-name": tar_of(("a", D, ""), ("a/../../victim/target.txt", F, b"x")),
    "absolute-name": tar_of(("/abs", F, b"x")),
    "fifo": tar_of(("p", tarfile.FIFOTYPE, "")),
    "char-device": tar_of(("c", tarfile.CHRTYPE, "")),
    "block-device": tar_of(("b", tarfile.BLKTYPE, "")),
    "garbage": b"\x01" * 3000,
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_archive_is_refused_and_writes_nothing(tmp_path, victim, case):
    dl = tmp_path / "dl"
    with pytest.raises(tidepool.UnsafeArchive) as ei:
        _tar.unpack_into(HOSTILE[case], str(dl))
    assert isinstance(ei.value, tidepool.InvalidArgument)
    assert ei.value.code == "unsafe_archive" and "refused the sandbox's archive" in ei.value.message
    untouched(victim)
    assert not os.path.lexists(dl), f"{case}: the target was created: {os.listdir(dl)}"


def test_issue_attack_message_names_the_symlink(tmp_path, victim):
    with pytest.raises(tidepool.UnsafeArchive, match="passes through the symlink 's/t'"):
        _tar.unpack_into(ISSUE_ATTACK, str(tmp_path / "dl"))
    untouched(victim)


def test_existing_symlink_in_the_target_is_not_written_through(tmp_path, victim):
    dl = tmp_path / "dl"
    dl.mkdir()
    os.symlink("../victim", dl / "pre")
    for arc in (tar_of(("pre/target.txt", F, b"x")), tar_of(("pre", F, b"x")),
                tar_of(("l", S, "pre"))):
        with pytest.raises(tidepool.UnsafeArchive):
            _tar.unpack_into(arc, str(dl))
        untouched(victim)
        assert os.listdir(dl) == ["pre"] and os.readlink(dl / "pre") == "../victim"


def test_existing_hard_link_in_the_target_is_replaced_not_written(tmp_path, victim):
    dl = tmp_path / "dl"
    dl.mkdir()
    os.link(victim, dl / "hl")
    assert _tar.unpack_into(tar_of(("hl", F, b"new")), str(dl)) == ["hl"]
    assert (dl / "hl").read_bytes() == b"new"
    assert victim.read_bytes() == SECRET


def test_existing_file_in_the_target_is_no_hard_link_source(tmp_path, victim):
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "mine").write_bytes(b"mine")
    with pytest.raises(tidepool.UnsafeArchive, match="extracted earlier"):
        _tar.unpack_into(tar_of(("h", H, "mine")), str(dl))
    assert os.listdir(dl) == ["mine"]


def test_well_formed_archive_keeps_links_and_drops_setuid(tmp_path):
    dl = tmp_path / "dl"
    arc = tar_of(("bin", D, "", 0o555), ("bin/tool", F, b"#!/bin/sh\n", 0o4755),
                 ("lib", D, ""), ("lib/real.so", F, b"ELF"), ("lib/alias.so", S, "real.so"),
                 ("bin/lib", S, "../lib"), ("s", D, ""), ("s/t", S, "."), ("s/deep", S, "t/t/t/../lib"),
                 ("copy", H, "lib/real.so"), ("dup", F, b"first"), ("dup", F, b"second"),
                 ("dangling", S, "not/yet/there"))
    names = _tar.unpack_into(arc, str(dl))
    assert names[:3] == ["bin", "bin/tool", "lib"] and names.count("dup") == 2
    tool = (dl / "bin" / "tool").stat()
    assert stat.S_IMODE(tool.st_mode) == 0o755, "set-uid dropped"
    assert stat.S_IMODE((dl / "bin").stat().st_mode) == 0o755, "owner keeps write access"
    assert (dl / "bin" / "lib" / "alias.so").read_bytes() == b"ELF"
    assert os.readlink(dl / "s" / "deep") == "t/t/t/../lib"
    assert (dl / "copy").stat().st_ino == (dl / "lib" / "real.so").stat().st_ino
    assert (dl / "dup").read_bytes() == b"second"
    assert os.readlink(dl / "dangling") == "not/yet/there"


@pytest.mark.skipif(not shutil.which("tar"), reason="needs GNU tar")
def test_gnu_tar_archive_of_a_tree_round_trips(tmp_path):
    """What the daemon's real `tar -c -f - -C DIR .` makes: "./" names, hard links and symlinks."""
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "pkg" / "sub" / "m.py").write_text("x = 1\n")
    os.link(src / "pkg" / "sub" / "m.py", src / "pkg" / "hard.py")
    os.symlink("sub/m.py", src / "pkg" / "soft.py")
    os.symlink("../pkg", src / "pkg" / "sub" / "up")
    arc = subprocess.run(["tar", "-c", "-f", "-", "-C", str(src), "."], check=True, capture_output=True).stdout
    dl = tmp_path / "dl"
    names = _tar.unpack_into(arc, str(dl))
    assert set(names) >= {"pkg", "pkg/sub", "pkg/sub/m.py", "pkg/hard.py", "pkg/soft.py", "pkg/sub/up"}
    assert (dl / "pkg" / "hard.py").stat().st_ino == (dl / "pkg" / "sub" / "m.py").stat().st_ino
    assert (dl / "pkg" / "soft.py").read_text() == "x = 1\n"
    assert os.readlink(dl / "pkg" / "sub" / "up") == "../pkg"


def test_download_dir_refuses_the_issue_attack(fake, tmp_path, victim):
    c = tidepool.Client(fake.url, timeout=10)
    try:
        sb = c.create()
        fake.tar_raw = ISSUE_ATTACK
        with pytest.raises(tidepool.UnsafeArchive):
            sb.files.download_dir("/work", str(tmp_path / "dl"))
    finally:
        c.close()
    untouched(victim)
    assert not os.path.lexists(tmp_path / "dl")


def test_async_download_dir_refuses_the_issue_attack(fake, tmp_path, victim):
    async def main():
        async with tidepool.AsyncClient(fake.url, timeout=10) as c:
            sb = await c.create()
            fake.tar_raw = ISSUE_ATTACK
            with pytest.raises(tidepool.UnsafeArchive):
                await sb.files.download_dir("/work", str(tmp_path / "dl"))

    asyncio.run(main())
    untouched(victim)
    assert not os.path.lexists(tmp_path / "dl")


def test_writer_never_follows_a_symlink_on_disk(tmp_path, victim):
    """The second line of defence: should the disk differ from what was checked (a path
    swapped for a symlink), writing still goes through O_NOFOLLOW directory fds."""
    dl = tmp_path / "dl"
    dl.mkdir()
    os.symlink("../victim", dl / "v")
    w = _tar._Writer(str(dl))
    try:
        with pytest.raises(tidepool.UnsafeArchive, match="not a directory on disk"):
            w.regular(("v", "target.txt"), io.BytesIO(b"x"), 0o644, 0)
        with pytest.raises(tidepool.UnsafeArchive, match="not a regular file on disk"):
            w.regular(("v",), io.BytesIO(b"x"), 0o644, 0)
        with pytest.raises(tidepool.UnsafeArchive, match="not a directory on disk"):
            w.hardlink(("h",), ("v", "target.txt"))
        (dl / "plain").write_bytes(b"not ours")
        with pytest.raises(tidepool.UnsafeArchive, match="not a file written by this unpack"):
            w.hardlink(("h",), ("plain",))
    finally:
        w.close()
    untouched(victim)
    assert sorted(os.listdir(dl)) == ["plain", "v"]
