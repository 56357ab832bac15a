"""Files: write, read, list, stat, remove, mkdir, nested paths, large files, names that
are not UTF-8."""
import base64
import json
import os

import pytest

import tidepool
from tp_testlib import http_raw


def test_write_read_binary_and_text(sandbox):
    data = bytes(range(256)) * 3
    e = sandbox.files.write("/work/all.bin", data)
    assert e.type == "file" and e.size == len(data)
    assert sandbox.files.read("/work/all.bin") == data
    sandbox.files.write("/work/t.txt", "héllo\n")
    assert sandbox.files.read("/work/t.txt") == "héllo\n".encode()
    # Visible to commands, and the other way round.
    assert sandbox.exec("cat /work/t.txt").stdout == "héllo\n"
    sandbox.exec("printf 'from exec' > /work/e.txt")
    assert sandbox.files.read("/work/e.txt") == b"from exec"
    # Overwrite replaces the content.
    sandbox.files.write("/work/t.txt", b"x")
    assert sandbox.files.read("/work/t.txt") == b"x"
    # Empty file.
    sandbox.files.write("/work/empty", b"")
    assert sandbox.files.read("/work/empty") == b""


def test_tmp_and_nested_paths(sandbox):
    sandbox.files.write("/a/b/c/d/deep.txt", b"deep")
    assert sandbox.files.read("/a/b/c/d/deep.txt") == b"deep"
    assert sandbox.files.stat("/a/b/c").is_dir
    sandbox.files.write("/tmp/in-tmp.txt", b"tmp")
    assert sandbox.exec("cat /tmp/in-tmp.txt").stdout == "tmp"


def test_mode_and_executable(sandbox):
    sandbox.files.write("/work/run.sh", "#!/bin/sh\necho ran $1\n", mode=0o755)
    st = sandbox.files.stat("/work/run.sh")
    assert st.mode & 0o777 == 0o755
    assert sandbox.exec(["/work/run.sh", "x"]).stdout == "ran x\n"
    sandbox.files.write("/work/plain", b"p")
    assert sandbox.files.stat("/work/plain").mode & 0o777 == 0o644


def test_list_and_stat(sandbox):
    sandbox.files.write("/d/f1", b"1")
    sandbox.files.write("/d/f2", b"22")
    sandbox.files.mkdir("/d/sub")
    sandbox.exec("ln -s f1 /d/link")
    entries = {e.name: e for e in sandbox.files.list("/d")}
    assert set(entries) == {"f1", "f2", "sub", "link"}
    assert entries["f2"].type == "file" and entries["f2"].size == 2
    assert entries["sub"].type == "dir"
    assert entries["link"].type == "symlink"
    st = sandbox.files.stat("/d/link")
    assert st.type == "symlink" and st.link_target == "f1"
    st = sandbox.files.stat("/d/f1")
    assert st.path == "/d/f1" and st.name == "f1" and st.uid == 0 and st.mtime > 0
    with pytest.raises(tidepool.NotFound):
        sandbox.files.stat("/d/nope")
    with pytest.raises(tidepool.NotFound):
        sandbox.files.list("/d/nope")
    with pytest.raises(tidepool.NotFound):
        sandbox.files.read("/d/nope")


def test_names_that_are_not_utf8_can_be_listed_and_addressed_again(sandbox, daemon):
    """A sandbox makes a file whose name holds the byte 0xff (not UTF-8) and a symlink to
    it. The listing shows U+FFFD in `name`/`path` (JSON is UTF-8) and the bytes in
    `name_b64`/`path_b64`; the SDK turns them into surrogate-escaped str (as os.fsdecode),
    which read, stat, write and remove address again. (Before: the U+FFFD name could not
    be addressed: 404.)"""
    r = sandbox.exec("mkdir -p /u && printf 'raw bytes' > \"$(printf '/u/bad\\377name')\""
                     " && ln -s \"$(printf 'bad\\377name')\" /u/link")
    assert r.ok, r
    entries = {e.name: e for e in sandbox.files.list("/u")}
    bad = os.fsdecode(b"bad\xffname")
    assert set(entries) == {bad, "link"}, entries
    assert entries[bad].path == os.fsdecode(b"/u/bad\xffname")
    assert sandbox.files.read(entries[bad].path) == b"raw bytes"
    assert sandbox.files.stat(entries[bad].path).size == 9
    assert sandbox.files.stat("/u/link").link_target == bad
    sandbox.files.write(entries[bad].path, b"changed")
    assert sandbox.exec("cat /u/bad*").stdout == "changed"
    # On the wire: U+FFFD for people, the bytes for programs.
    status, _, body = http_raw(daemon.url, "GET", f"/v1/sandboxes/{sandbox.id}/files/list?path=/u")
    assert status == 200
    raw = {e["path"]: e for e in json.loads(body)["entries"]}
    e = raw["/u/bad\ufffdname"]
    assert base64.b64decode(e["path_b64"]) == b"/u/bad\xffname"
    assert base64.b64decode(e["name_b64"]) == b"bad\xffname"
    assert "path_b64" not in raw["/u/link"]
    sandbox.files.remove(entries[bad].path)
    assert {e.name for e in sandbox.files.list("/u")} == {"link"}


def test_remove(sandbox):
    sandbox.files.write("/r/a/b/file", b"x")
    sandbox.files.write("/r/top", b"x")
    sandbox.files.remove("/r/top")
    assert not sandbox.files.exists("/r/top")
    with pytest.raises(tidepool.TidepoolError) as ei:
        sandbox.files.remove("/r/a")  # not empty
    assert isinstance(ei.value, (tidepool.Conflict, tidepool.InvalidArgument))
    assert sandbox.files.exists("/r/a/b/file")
    sandbox.files.remove("/r/a", recursive=True)
    assert not sandbox.files.exists("/r/a")
    with pytest.raises(tidepool.NotFound):
        sandbox.files.remove("/r/a")


def test_mkdir(sandbox):
    e = sandbox.files.mkdir("/m")
    assert e.is_dir
    with pytest.raises(tidepool.NotFound):
        sandbox.files.mkdir("/m/x/y")
    sandbox.files.mkdir("/m/x/y", parents=True)
    assert sandbox.files.stat("/m/x/y").is_dir
    with pytest.raises(tidepool.Conflict):
        sandbox.files.mkdir("/m")
    sandbox.files.mkdir("/m", parents=True)  # like mkdir -p: existing is fine


def test_large_file(sandbox):
    data = os.urandom(5 * 1024 * 1024)
    e = sandbox.files.write("/big/five.bin", data)
    assert e.size == len(data)
    assert sandbox.files.stat("/big/five.bin").size == len(data)
    assert sandbox.files.read("/big/five.bin") == data
    import hashlib
    assert sandbox.exec("sha256sum /big/five.bin").stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_read_directory_is_an_error(sandbox):
    with pytest.raises(tidepool.TidepoolError) as ei:
        sandbox.files.read("/etc")
    assert isinstance(ei.value, (tidepool.InvalidArgument, tidepool.Conflict))


def test_readonly_host_image_paths(sandbox):
    # The host image's system directories are read-only views.
    with pytest.raises(tidepool.TidepoolError):
        sandbox.files.write("/usr/bin/tidepool-should-not-exist", b"x")
    assert not os.path.exists("/usr/bin/tidepool-should-not-exist")
    r = sandbox.exec("touch /usr/bin/x 2>&1; echo $?")
    assert r.stdout.strip().splitlines()[-1] != "0"
