"""Tampering: hostile code overwrites system binaries and files of its image (operators
saw agents replace /bin/bash). The damage must stay in that sandbox's private writable
layer: no other sandbox, later sandbox, image layer or host file changes.
"""
from __future__ import annotations

import hashlib
import os
import tarfile

import pytest

from test_images import busybox_layer, diff_id, docker_save, import_archive, layer_tar


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_host_image_system_binaries(client, bystander):
    """Attempt: on the `host` image, overwrite, truncate, delete and replace /bin/sh,
    /usr/bin/env and python3 (the host's /usr, bound read-only), and rewrite /etc/passwd
    (the image's own skeleton, in the overlay).
    Expected: /usr writes fail with EROFS; the /etc change lands in this sandbox's upper
    layer only: the host files, the image's lower layer, the bystander and a new sandbox
    are unchanged."""
    sh = os.path.realpath("/bin/sh")
    sums = {p: _sha(p) for p in (sh, "/usr/bin/env")}
    with client.create(ttl=600) as a:
        r = a.exec("echo evil > /bin/sh; echo rc=$?; : > /usr/bin/env; echo rc=$?; rm -f /usr/bin/env; echo rc=$?; "
                   "cp /bin/true /usr/bin/python3; echo rc=$?; mv /usr/bin/env /usr/bin/env2; echo rc=$?; "
                   "touch /usr/tp-evil; echo rc=$?")
        assert "rc=0" not in r.stdout, r.stdout
        assert "Read-only file system" in r.stderr, r.stderr
        a.exec("echo 'evil::0:0::/:/bin/sh' >> /etc/passwd", check=True)
        assert b"evil::0:0" in a.files.read("/etc/passwd")
        with client.create(ttl=600) as b:
            assert b"evil" not in b.files.read("/etc/passwd")
            assert b.exec("sh -c 'echo ok'").stdout == "ok\n"
        assert b"evil" not in bystander.sb.files.read("/etc/passwd")
    for p, s in sums.items():
        assert _sha(p) == s, p
    assert not os.path.exists("/usr/tp-evil")


@pytest.fixture(scope="module")
def bb_image(daemon, payload):
    """A busybox image with a set-uid-root probe (hostile_setuid at /bin/suid-probe, mode
    4755, owner 0) and a user 1000."""
    with open(payload("hostile_setuid"), "rb") as f:
        probe = f.read()
    base = busybox_layer()
    extra = layer_tar([dict(name="bin", type=tarfile.DIRTYPE, mode=0o755),
                       dict(name="bin/suid-probe", data=probe, mode=0o4755, uid=0, gid=0),
                       dict(name="work", type=tarfile.DIRTYPE, mode=0o777)])
    st, img = import_archive(daemon, docker_save([base, extra], tag="tp-hostile-bb:1"), "tp-hostile-bb", "1")
    assert st == 201, img
    roots = [os.path.join(daemon.data_dir, "images", "layers", "sha256", diff_id(l)[7:], "root") for l in (base, extra)]
    return img["ref"], roots


def test_imported_image_binaries(client, bb_image):
    """Attempt: in a sandbox of an imported image, overwrite /bin/busybox through the /bin/sh
    symlink, delete /bin, and plant a set-uid copy of the shell.
    Expected: the writes succeed but only in this sandbox's upper layer: the shared layer
    files on the host keep their content, a second sandbox of the same image (running
    alongside) and a third created afterwards run the original shell."""
    ref, roots = bb_image
    busybox = os.path.join(roots[0], "bin", "busybox")
    before = _sha(busybox)
    with client.create(image=ref, ttl=600) as a, client.create(image=ref, ttl=600) as b:
        # A copy of the shell does the writing, so that busybox is not busy (ETXTBSY).
        with open(busybox, "rb") as f:
            a.files.write("/tmp/busybox", f.read(), mode=0o755)
        r = a.exec(["/tmp/busybox", "sh", "-c", "echo '#!/tmp/busybox sh' > /bin/sh && echo 'echo pwned' >> /bin/sh && echo done"])
        assert r.stdout == "done\n", r
        # Sandbox a broke its own shell (busybox was overwritten through the symlink)...
        assert a.exec(["/bin/sh", "-c", "echo hi"]).stdout == "pwned\n"
        assert a.files.read("/bin/busybox").startswith(b"#!/tmp/busybox sh")
        # ...but its agent still serves files, and nobody else is affected.
        assert a.files.read("/etc/greeting") == b"hello from the base\n"
        assert b.exec(["/bin/sh", "-c", "echo ok"]).stdout == "ok\n"
        assert _sha(busybox) == before
        a.exec(["/tmp/busybox", "rm", "-rf", "/bin"])
        assert b.exec(["/bin/busybox", "ls", "/bin/busybox"]).ok
    with client.create(image=ref, ttl=600) as c:
        assert c.exec(["/bin/sh", "-c", "echo ok; cat /etc/greeting"]).stdout == "ok\nhello from the base\n"
    assert _sha(busybox) == before


def test_image_setuid_binary(client, bb_image):
    """Attempt: run a set-uid-root binary shipped in the image as uid 1000.
    Expected: no_new_privs: it runs with euid 1000; the layer keeps its set-uid bit on
    the host but that gives nothing."""
    ref, roots = bb_image
    assert os.stat(os.path.join(roots[1], "bin", "suid-probe")).st_mode & 0o4000
    with client.create(image=ref, ttl=600) as sb:
        r = sb.exec(["/bin/suid-probe"], user=1000)
        assert r.stdout.startswith("ruid=1000 euid=1000 suid=1000 nnp=1"), r
        r = sb.exec(["/bin/suid-probe"])
        assert r.stdout.startswith("ruid=0 euid=0"), r
