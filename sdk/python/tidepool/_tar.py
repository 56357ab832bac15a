"""Packing a local directory into one tar archive and unpacking one safely (internal).

``upload_dir`` / ``download_dir`` move a whole tree in a single request; these helpers
build and read that request's body. No network I/O here, so both clients share them.

Unpacking trusts nothing in the archive: it is made by whatever ``tar`` the sandbox
runs, so it can hold any sequence of entries (see :func:`unpack_into` for the rules).
"""
from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile
from typing import Dict, List, Optional, Set, Tuple

from .errors import UnsafeArchive

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


_Parts = Tuple[str, ...]

# What a path is (or will be) in the target while the archive is checked.
_DIR = "directory"
_FILE = "file"                  # a regular file this archive writes
_OLD_FILE = "existing file"     # a regular file that was there before
_SYMLINK = "symlink"
_OTHER = "special file"

# Symlink hops allowed while resolving one link target (the kernel's limit).
_MAX_HOPS = 40

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _refuse(message: str) -> UnsafeArchive:
    return UnsafeArchive("unsafe_archive", f"refused the sandbox's archive: {message}", None)


def _show(parts: _Parts) -> str:
    return "/".join(parts) or "."


def _split(name: str, what: str) -> _Parts:
    """Components of an archive name; absolute names and ``..`` are refused outright."""
    if name.startswith("/"):
        raise _refuse(f"{what} {name!r} is an absolute path")
    parts = tuple(c for c in name.split("/") if c not in ("", "."))
    if ".." in parts:
        raise _refuse(f"{what} {name!r} has a '..' component")
    return parts


class _Plan:
    """The target as it will be once every entry is applied, checked before anything is
    written. A path not touched by the archive is what is on disk under the root."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.kinds: Dict[_Parts, str] = {}
        self.links: Dict[_Parts, str] = {}
        self.symlinks: List[_Parts] = []

    def kind(self, p: _Parts) -> Optional[str]:
        if p in self.kinds:
            return self.kinds[p]
        # Only called once every parent of p is known to be a real directory (or
        # missing), so this lstat never passes through a symlink below the root.
        try:
            st = os.lstat(os.path.join(self.root, *p))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(st.st_mode):
            return _DIR
        if stat.S_ISLNK(st.st_mode):
            return _SYMLINK
        if stat.S_ISREG(st.st_mode):
            return _OLD_FILE
        return _OTHER

    def _link_of(self, p: _Parts) -> str:
        if p in self.links:
            return self.links[p]
        return os.readlink(os.path.join(self.root, *p))

    def _parents(self, parts: _Parts, name: str, create: bool) -> None:
        """Every parent of ``parts`` must be a directory reached without a symlink."""
        for i in range(1, len(parts)):
            pre = parts[:i]
            k = self.kind(pre)
            if k is None and create:
                self.kinds[pre] = _DIR
            elif k == _SYMLINK:
                raise _refuse(f"{name!r} passes through the symlink {_show(pre)!r}")
            elif k != _DIR:
                raise _refuse(f"{name!r} lies under {_show(pre)!r}, which is "
                              f"{'missing' if k is None else 'a ' + k}")

    def add(self, m: tarfile.TarInfo) -> Optional[_Parts]:
        parts = _split(m.name, "entry")
        if not parts:
            return None  # the root itself: never replaced, its mode is left alone
        if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
            raise _refuse(f"entry {m.name!r} is a device, fifo or unknown type")
        self._parents(parts, m.name, create=True)
        cur = self.kind(parts)
        if cur in (_SYMLINK, _OTHER) or (cur == _DIR and not m.isdir()):
            # Replacing what could be traversed or followed later is how a tree escapes.
            raise _refuse(f"entry {m.name!r} would replace the {cur} {_show(parts)!r}")
        self.links.pop(parts, None)
        if m.isdir():
            self.kinds[parts] = _DIR
        elif m.islnk():
            target = _split(m.linkname, f"hard link {m.name!r} ->")
            self._parents(target, m.linkname, create=False)
            if not target or self.kind(target) != _FILE:
                raise _refuse(f"hard link {m.name!r} -> {m.linkname!r} does not name a regular file "
                              "extracted earlier from this archive")
            self.kinds[parts] = _FILE
        elif m.issym():
            if not m.linkname or m.linkname.startswith("/"):
                raise _refuse(f"symlink {m.name!r} -> {m.linkname!r}: "
                              f"{'an absolute target' if m.linkname else 'an empty target'}")
            self.kinds[parts] = _SYMLINK
            self.links[parts] = m.linkname
            self.symlinks.append(parts)
        else:
            self.kinds[parts] = _FILE
        return parts

    def resolve(self, base: _Parts, target: str) -> Optional[_Parts]:
        """Where ``target`` (a relative link in directory ``base``) lands in the final
        tree, following symlinks as the kernel would; None when it leaves the root, is
        absolute somewhere along the way, or loops. Missing components are taken
        textually."""
        parts = list(base)
        todo = list(reversed(target.split("/")))
        hops = 0
        while todo:
            c = todo.pop()
            if c in ("", "."):
                continue
            if c == "..":
                if not parts:
                    return None
                parts.pop()
                continue
            p = tuple(parts) + (c,)
            if self.kind(p) == _SYMLINK:
                hops += 1
                link = self._link_of(p)
                if hops > _MAX_HOPS or link.startswith("/"):
                    return None
                todo.extend(reversed(link.split("/")))
                continue
            parts.append(c)
        return tuple(parts)

    def check_symlinks(self) -> None:
        # Checked on the final tree: a link's meaning depends on links made after it.
        for p in self.symlinks:
            if self.kinds.get(p) == _SYMLINK and self.resolve(p[:-1], self.links[p]) is None:
                raise _refuse(f"symlink {_show(p)!r} -> {self.links[p]!r} leaves the target "
                              "(or loops) once resolved")


class _Writer:
    """Applies checked entries through directory fds, never following a symlink."""

    def __init__(self, root: str) -> None:
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.cached: Optional[Tuple[_Parts, int]] = None
        self.ours: Set[Tuple[int, int]] = set()  # (dev, inode) of the files written here

    def close(self) -> None:
        if self.cached is not None:
            os.close(self.cached[1])
            self.cached = None
        os.close(self.root_fd)

    def open_dir(self, parts: _Parts, create: bool) -> int:
        """A new fd of the directory ``parts`` (created when missing and ``create``)."""
        fd = os.dup(self.root_fd)
        try:
            for c in parts:
                try:
                    nfd = os.open(c, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(c, 0o777, dir_fd=fd)
                    nfd = os.open(c, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse(f"{_show(parts)!r} is not a directory on disk") from None
            raise
        return fd

    def parent(self, parts: _Parts) -> int:
        """The fd of the directory holding ``parts`` (kept for the next entry)."""
        want = parts[:-1]
        if self.cached is not None and self.cached[0] == want:
            return self.cached[1]
        fd = self.open_dir(want, create=True)
        if self.cached is not None:
            os.close(self.cached[1])
        self.cached = (want, fd)
        return fd

    def _clear(self, dfd: int, name: str, parts: _Parts, keep_dir: bool = False) -> Optional[os.stat_result]:
        """Makes room for a new entry: an old regular file goes; a directory stays only
        when ``keep_dir``; anything else is refused."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(st.st_mode) and keep_dir:
            return st
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(f"{_show(parts)!r} is not a regular file on disk")
        os.unlink(name, dir_fd=dfd)
        return None

    def directory(self, parts: _Parts, mode: int) -> None:
        dfd = self.parent(parts)
        if self._clear(dfd, parts[-1], parts, keep_dir=True) is None:
            os.mkdir(parts[-1], 0o700, dir_fd=dfd)
        fd = self.open_dir(parts, create=False)
        try:
            os.fchmod(fd, (mode & 0o777) | 0o700)  # the owner can always add the rest
        finally:
            os.close(fd)

    def regular(self, parts: _Parts, src: Optional[io.BufferedIOBase], mode: int, mtime: float) -> None:
        dfd = self.parent(parts)
        self._clear(dfd, parts[-1], parts)
        # O_EXCL after the unlink: never writes into an existing inode (hard link or not).
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        try:
            while src is not None:
                block = src.read(1 << 20)
                if not block:
                    break
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
            os.fchmod(fd, mode & 0o777)  # no set-uid, set-gid or sticky bits
            try:
                os.utime(fd, (mtime, mtime))
            except OSError:
                pass
            st = os.fstat(fd)
            self.ours.add((st.st_dev, st.st_ino))
        finally:
            os.close(fd)

    def symlink(self, parts: _Parts, target: str) -> None:
        dfd = self.parent(parts)
        self._clear(dfd, parts[-1], parts)
        os.symlink(target, parts[-1], dir_fd=dfd)

    def hardlink(self, parts: _Parts, target: _Parts) -> None:
        sfd = self.open_dir(target[:-1], create=False)
        try:
            src = os.stat(target[-1], dir_fd=sfd, follow_symlinks=False)
            if not stat.S_ISREG(src.st_mode) or (src.st_dev, src.st_ino) not in self.ours:
                raise _refuse(f"hard link target {_show(target)!r} is not a file written by this unpack")
            dfd = self.parent(parts)
            try:
                dst = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
                if (dst.st_dev, dst.st_ino) == (src.st_dev, src.st_ino):
                    return  # already that file
            except FileNotFoundError:
                pass
            self._clear(dfd, parts[-1], parts)
            os.link(target[-1], parts[-1], src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(sfd)


def unpack_into(archive: bytes, local_dir: str) -> List[str]:
    """Unpacks ``archive`` under ``local_dir`` (created if missing); returns the names.

    The archive is hostile input. It is checked whole against a model of the final tree
    before anything is written, and a violation writes nothing:

    - names are relative, without ``..``; no entry's path may pass through a symlink
      (one from the archive or one already in ``local_dir``);
    - only directories, regular files, symlinks and hard links; no devices or fifos;
    - a symlink must be relative and, resolved on the final tree (following the other
      symlinks as the kernel would), stay inside ``local_dir``;
    - a hard link must name a regular file extracted earlier from the same archive;
    - an entry may replace a regular file, never a directory, symlink or special file.

    Writing then goes through directory fds opened with ``O_NOFOLLOW``, files are created
    fresh (``O_EXCL``, never written through an existing inode), set-uid, set-gid and
    sticky bits are dropped and owners are not restored.

    Raises:
        UnsafeArchive: the archive is unreadable or breaks one of the rules above.
    """
    if not (os.open in os.supports_dir_fd and os.link in os.supports_dir_fd):
        raise UnsafeArchive("unsafe_archive", "this platform cannot unpack archives safely", None)
    root = os.path.abspath(os.fspath(local_dir))
    try:
        tf = tarfile.open(fileobj=io.BytesIO(archive), mode="r:*")
        members = tf.getmembers()
    except (tarfile.TarError, EOFError) as e:
        raise _refuse(f"unreadable ({e})") from None
    with tf:
        plan = _Plan(root)
        todo: List[Tuple[_Parts, tarfile.TarInfo]] = []
        for m in members:
            parts = plan.add(m)
            if parts is not None:
                todo.append((parts, m))
        plan.check_symlinks()
        os.makedirs(root, exist_ok=True)
        w = _Writer(root)
        try:
            for parts, m in todo:
                if m.isdir():
                    w.directory(parts, m.mode)
                elif m.issym():
                    w.symlink(parts, m.linkname)
                elif m.islnk():
                    w.hardlink(parts, _split(m.linkname, "hard link target"))
                else:
                    try:
                        w.regular(parts, tf.extractfile(m), m.mode, m.mtime)
                    except (tarfile.TarError, EOFError) as e:
                        raise _refuse(f"entry {m.name!r} is unreadable ({e})") from None
        finally:
            w.close()
    return ["/".join(parts) for parts, _ in todo]
