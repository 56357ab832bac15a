"""Packing a local directory into one tar archive and unpacking one safely (internal).

``upload_dir`` / ``download_dir`` move a whole tree in a single request; these helpers
build and read that request's body. No network I/O here, so both clients share them.

Unpacking trusts nothing in the archive (it comes from inside a sandbox): absolute
names, ``..`` components, links pointing outside the target, and device or fifo entries
are refused, and set-uid bits are dropped.
"""
from __future__ import annotations

import io
import os
import posixpath
import stat
import tarfile
from typing import List

from .errors import InvalidArgument

__all__ = ["pack_dir", "unpack_into"]


def pack_dir(local_dir: str) -> bytes:
    """The tree under ``local_dir`` as an uncompressed tar, names relative to it.

    Regular files, directories and symlinks are included (symlinks as links, not
    followed); other file types are skipped. Owners are not recorded.
    """
    root = os.fspath(local_dir)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root}: not a directory")
    buf = io.BytesIO()

    def clean(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        return ti

    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, root)
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = name if rel_dir == "." else posixpath.join(rel_dir.replace(os.sep, "/"), name)
                st = os.lstat(full)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue
                ti = clean(tf.gettarinfo(full, arcname=arc))
                if ti.isreg():
                    with open(full, "rb") as f:
                        tf.addfile(ti, f)
                else:
                    tf.addfile(ti)
            # Symlinked directories are recorded as links above and not descended into.
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return buf.getvalue()


def _safe_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    norm = posixpath.normpath(name) if name else ""
    if norm in ("", "."):
        return ""
    if posixpath.isabs(name) or norm.startswith("../") or norm == "..":
        raise InvalidArgument("invalid_argument", f"archive entry {name!r} points outside the target", None)
    return norm


def unpack_into(archive: bytes, local_dir: str) -> List[str]:
    """Unpacks ``archive`` under ``local_dir`` (created if missing); returns the names.

    Raises:
        InvalidArgument: an entry would land outside ``local_dir`` or is not a file,
            directory or symlink.
    """
    root = os.path.abspath(os.fspath(local_dir))
    os.makedirs(root, exist_ok=True)
    names: List[str] = []
    try:
        tf = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*")
    except tarfile.TarError as e:
        raise InvalidArgument("invalid_argument", f"the daemon's archive is unreadable: {e}", None) from None
    with tf:
        members = []
        for m in tf.getmembers():
            rel = _safe_name(m.name)
            if not rel:
                continue
            if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
                raise InvalidArgument("invalid_argument", f"archive entry {m.name!r} is a special file", None)
            if m.issym() or m.islnk():
                target = m.linkname
                base = posixpath.dirname(rel) if m.issym() else ""
                joined = posixpath.normpath(posixpath.join(base, target))
                if posixpath.isabs(target) or joined == ".." or joined.startswith("../"):
                    raise InvalidArgument("invalid_argument",
                                          f"archive link {m.name!r} -> {target!r} points outside the target", None)
            m.name = rel
            members.append(m)
            names.append(rel)
        for m in members:
            dest = os.path.join(root, *m.name.split("/"))
            # Never write through a symlink that an earlier entry placed on the path.
            parent = os.path.dirname(dest)
            real_parent = os.path.realpath(parent) if os.path.exists(parent) else parent
            if not (real_parent == root or real_parent.startswith(root + os.sep)):
                raise InvalidArgument("invalid_argument", f"archive entry {m.name!r} escapes through a link", None)
            if m.isdir():
                os.makedirs(dest, exist_ok=True)
                os.chmod(dest, (m.mode & 0o777) | 0o700)
            elif m.issym():
                os.makedirs(parent, exist_ok=True)
                if os.path.lexists(dest):
                    os.unlink(dest)
                os.symlink(m.linkname, dest)
            elif m.islnk():
                os.makedirs(parent, exist_ok=True)
                src = os.path.join(root, *_safe_name(m.linkname).split("/"))
                if os.path.lexists(dest):
                    os.unlink(dest)
                os.link(src, dest)
            else:
                os.makedirs(parent, exist_ok=True)
                if os.path.islink(dest):
                    os.unlink(dest)
                f = tf.extractfile(m)
                with open(dest, "wb") as out:
                    if f is not None:
                        while True:
                            block = f.read(1 << 20)
                            if not block:
                                break
                            out.write(block)
                os.chmod(dest, m.mode & 0o777)
                try:
                    os.utime(dest, (m.mtime, m.mtime))
                except OSError:
                    pass
    return names
