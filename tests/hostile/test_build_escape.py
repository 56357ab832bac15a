"""Image builds run a spec's commands contained (POST /v1/images/build).

One real mmdebstrap build (slow: a minute or more) whose `run` steps try to write a host
file by every route at hand (/proc/1/root, /proc/self/root/.., an absolute symlink, a
chroot escape, mknod, mount, open_by_handle_at, a new user namespace) and report what
they are: their capabilities, seccomp mode, uid/gid maps and network interfaces. The
host file must not exist afterwards, root of the build must not be host root, the
refused calls must be refused, and nothing of the build may remain in the store's tmp.

The probes use perl-base (in every Debian root) with raw x86_64 syscall numbers.

The regression of issue 11's finding 1, by its original route, as another uid: a spec
whose `files` copy a static program (build_escape_probe.c, compiled here) into the image
and whose `run` step executes it; the program tries to write a host file, read a
root-only host file and use host capabilities. Sent as uid nobody over the unix socket
and over TCP (this module's daemon also listens on loopback without keys, the opt-in
the finding used, and has an --import-root for admin keys). A build either is refused,
with a 403 {code, message}, because the caller could not read the program itself (a
0600 root file over the socket; over TCP without an admin key, or outside the import
roots), or it runs isolated: while the program runs, the host sees it as a non-root uid
in a user namespace of its own, under seccomp and no_new_privs, in a root of its own;
no host file is written, the secret stays unread, every call that needs a host
capability is refused.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid

import pytest

from tp_testlib import BUILD, Daemon, http_raw, leaks_after_stop, new_key, wait_until

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


# -- issue 11, finding 1: a static program copied in by `files`, run by `run` ---------

NOBODY = 65534
PROBE_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_escape_probe.c")
# What a build needs at most (mmdebstrap downloads the essential set): generous.
BUILD_TIMEOUT = 1800

# One request as another uid, in a subprocess: over the unix socket or loopback TCP.
_CLIENT = r"""
import http.client, json, socket, sys
kind, where, method, target, body, key = sys.argv[1:7]
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(where)
c = (Unix("localhost", timeout=float(sys.argv[7])) if kind == "unix"
     else http.client.HTTPConnection("127.0.0.1", int(where), timeout=float(sys.argv[7])))
headers = {"Content-Type": "application/json"}
if key:
    headers["Authorization"] = "Bearer " + key
try:
    c.request(method, target, body=body.encode() or None, headers=headers)
    r = c.getresponse()
    print(json.dumps({"status": r.status, "body": r.read().decode("utf-8", "replace")}))
except OSError as e:
    print(json.dumps({"status": 0, "body": repr(e)}))
"""


def _drop_to(uid: int):
    def fn():
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    return fn


def request_as(daemon, transport: str, method: str, path: str, body=None, key: str = "",
               uid: int = NOBODY, timeout: float = 120):
    """(status, JSON body or text) of one request made by a process of uid `uid`, over the
    daemon's unix socket ("unix") or its loopback TCP port ("tcp")."""
    where = daemon.socket if transport == "unix" else str(daemon.port)
    out = subprocess.run(
        ["/usr/bin/python3", "-c", _CLIENT, transport, where, method, path,
         json.dumps(body) if body is not None else "", key, str(timeout)],
        preexec_fn=_drop_to(uid), capture_output=True, text=True, timeout=timeout + 60, cwd="/")
    assert out.returncode == 0, out.stderr
    ans = json.loads(out.stdout)
    try:
        return ans["status"], json.loads(ans["body"])
    except ValueError:
        return ans["status"], ans["body"]


@pytest.fixture(scope="module")
def daemon():
    """This module's own daemon (the bystander, the leak checks and every case use it):
    loopback TCP without keys, as the finding had it, keys for the admin cases, one
    import root, and a socket that uid nobody may reach (as a member of group tidepool
    would)."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    d = Daemon(BUILD, insecure_tcp=True)
    d.import_root = os.path.join(d.tmp, "imports")
    os.makedirs(d.import_root)
    d.extra_args = d.extra_args + ["--import-root", d.import_root]
    try:
        d.start()
        os.chown(d.socket, 0, NOBODY)
    except BaseException:
        d.stop(signal.SIGKILL)
        d.cleanup()
        raise
    yield d
    rc = d.stop()
    leaks = leaks_after_stop(d)
    d.cleanup()
    assert rc in (0, -signal.SIGTERM), f"tidepoold exited with {rc} on SIGTERM:\n{d.log_tail()}"
    assert not leaks, f"left behind after the daemon stopped: {leaks}"


@pytest.fixture(scope="module")
def admin_key(daemon):
    return new_key(daemon, "admin", "escape-admin")


@pytest.fixture(scope="module")
def user_key(daemon):
    return new_key(daemon, "user", "escape-user")


@pytest.fixture(scope="module")
def probe_bin(tmp_path_factory):
    """The probe, compiled static, in a directory every uid may read."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.fail("no C compiler: the build escape probe is compiled by the test (gcc, libc6-dev)")
    d = tempfile.mkdtemp(prefix="tp-escape-probe-")
    os.chmod(d, 0o755)
    exe = os.path.join(d, "tp-escape-probe")
    r = subprocess.run([cc, "-static", "-O1", "-o", exe, PROBE_SRC], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    os.chmod(exe, 0o755)
    yield exe
    shutil.rmtree(d, ignore_errors=True)


class Host:
    """What the probe aims at: a host path that must stay absent and a root-only secret."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex[:12]
        self.target = f"/tmp/tp-build-escape-{self.token}"
        self.dir = tempfile.mkdtemp(prefix="tp-escape-secret-")  # 0700, root
        self.secret = os.path.join(self.dir, "secret")
        self.content = f"host-secret-{uuid.uuid4().hex}"
        with open(self.secret, "w") as f:
            f.write(self.content + "\n")
        os.chmod(self.secret, 0o600)

    def run_step(self, dst_dir: str = "/opt") -> str:
        return f"{dst_dir}/tp-escape-probe {self.target} {self.secret} {self.token}"

    def cleanup(self) -> None:
        if os.path.lexists(self.target):
            os.unlink(self.target)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def host():
    h = Host()
    assert not os.path.lexists(h.target)
    yield h
    h.cleanup()


def _spec(name: str, src: str, host: Host) -> dict:
    return {"name": name, "version": "1", "suite": "bookworm", "variant": "essential",
            "files": [{"src": src, "dst": "/opt"}], "run": [host.run_step()]}


def _assert_not_built(daemon, name: str, host: Host) -> None:
    assert not os.path.lexists(host.target), "a host file was written"
    st, _, _ = http_raw(daemon.url, "GET", f"/v1/images/{name}:1")
    assert st == 404, f"image {name} exists after a refused build"
    assert os.listdir(os.path.join(daemon.data_dir, "images", "tmp")) == [], "the build left files"


def _refused(status, body, *needles: str) -> None:
    assert status == 403, (status, body)
    assert isinstance(body, dict) and body.get("code") == "permission_denied", body
    assert isinstance(body.get("message"), str) and body["message"], body
    for n in needles:
        assert n in body["message"], (n, body)


def test_build_files_the_caller_cannot_read_are_refused_over_the_unix_socket(daemon, host, probe_bin):
    """As uid nobody over the unix socket: a root-only (0600) file, and a readable program in
    a directory nobody cannot enter, are refused before anything runs."""
    name = f"escape-{host.token}"
    st, body = request_as(daemon, "unix", "POST", "/v1/images/build", _spec(name, host.secret, host))
    _refused(st, body, host.secret)
    _assert_not_built(daemon, name, host)

    hidden = os.path.join(host.dir, "tp-escape-probe")  # host.dir is 0700 root
    shutil.copy2(probe_bin, hidden)
    os.chmod(hidden, 0o755)
    st, body = request_as(daemon, "unix", "POST", "/v1/images/build", _spec(name, hidden, host))
    _refused(st, body, hidden)
    _assert_not_built(daemon, name, host)

    # Root over the same socket may read it: refused only for what the caller cannot read.
    st, who = request_as(daemon, "unix", "GET", "/v1/whoami", uid=0)
    assert st == 200 and who["uid"] == 0 and who["host_paths"] == "as_caller", who


def test_build_files_over_tcp_need_an_admin_key_and_an_import_root(daemon, host, probe_bin, admin_key, user_key):
    """As uid nobody over loopback TCP (the finding's route): a spec naming a host file is
    refused without a key, with a user key, and with an admin key outside the import roots
    (a symlink inside the root that leads out included)."""
    name = f"escape-{host.token}"
    spec = _spec(name, probe_bin, host)
    st, body = request_as(daemon, "tcp", "POST", "/v1/images/build", spec)
    _refused(st, body, probe_bin, "unix socket", "admin")
    _assert_not_built(daemon, name, host)

    st, body = request_as(daemon, "tcp", "POST", "/v1/images/build", spec, key=user_key)
    _refused(st, body, probe_bin, "admin")
    _assert_not_built(daemon, name, host)

    st, body = request_as(daemon, "tcp", "POST", "/v1/images/build", spec, key=admin_key)
    _refused(st, body, probe_bin, "import root")
    _assert_not_built(daemon, name, host)

    link = os.path.join(daemon.import_root, f"link-{host.token}")
    os.symlink(os.path.dirname(probe_bin), link)
    try:
        st, body = request_as(daemon, "tcp", "POST", "/v1/images/build",
                              _spec(name, os.path.join(link, "tp-escape-probe"), host), key=admin_key)
        _refused(st, body, "import root")
        _assert_not_built(daemon, name, host)
    finally:
        os.unlink(link)


def _probe_pid(host: Host):
    """Host pid of the running probe (argv[0] is the copy in the image, argv[3] the token)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if len(argv) >= 4 and argv[0].endswith(b"/tp-escape-probe") and argv[3] == host.token.encode():
            return int(d)
    return None


def _status_fields(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.split()
    return out


def _build_runs_isolated(daemon, host: Host, send) -> None:
    """Runs `send()` (the build request, returning (status, body)) in a thread; while the
    probe runs, inspects it from the host; then checks the answer and the probe's report."""
    answer = {}

    def run():
        try:
            answer["r"] = send()
        except BaseException as e:  # noqa: BLE001 - reported below
            answer["r"] = e

    t = threading.Thread(target=run)
    t.start()
    pid = None
    seen = {}
    try:
        pid = wait_until(lambda: _probe_pid(host) or ("r" in answer and -1), timeout=BUILD_TIMEOUT, interval=0.1,
                         what="the build's run step to start the probe")
        assert pid != -1, f"the build ended without running the probe: {answer['r']!r}"
        root = f"/proc/{pid}/root"
        wait_until(lambda: os.path.exists(f"{root}/tmp/tp-escape-ready-{host.token}") or not os.path.exists(root),
                   timeout=300, interval=0.05, what="the probe to finish its attempts")
        # The probe as the host sees it, while it runs.
        seen["status"] = _status_fields(pid)
        seen["userns"] = os.readlink(f"/proc/{pid}/ns/user")
        seen["mntns"] = os.readlink(f"/proc/{pid}/ns/mnt")
        rs, hs = os.stat(f"{root}/"), os.stat("/")
        seen["root"] = (rs.st_dev, rs.st_ino) != (hs.st_dev, hs.st_ino)
        seen["secret_visible"] = os.path.lexists(f"{root}{host.secret}")
        with open(f"{root}/etc/tp-escape-report") as f:
            seen["report"] = f.read()
    finally:
        if pid and pid != -1:
            try:
                with open(f"/proc/{pid}/root/tmp/tp-escape-go-{host.token}", "w"):
                    pass
            except OSError:
                pass
        t.join(BUILD_TIMEOUT)
    assert not t.is_alive(), "the build request did not end"
    status, body = answer["r"] if isinstance(answer["r"], tuple) else (None, answer["r"])

    # Nothing reached the host.
    assert not os.path.lexists(host.target), "the probe wrote a host file"
    assert os.listdir(os.path.join(daemon.data_dir, "images", "tmp")) == [], "the build left files"

    st = seen["status"]
    uids, gids = [int(x) for x in st["Uid"]], [int(x) for x in st["Gid"]]
    assert 0 not in uids and 0 not in gids, f"the probe runs as host root: Uid {uids} Gid {gids}"
    assert seen["userns"] != os.readlink("/proc/self/ns/user"), "the probe runs in the host's user namespace"
    assert seen["mntns"] != os.readlink("/proc/self/ns/mnt")
    assert st["NoNewPrivs"] == ["1"] and st["Seccomp"] == ["2"], st
    assert seen["root"], "the probe's root is the host's"
    assert not seen["secret_visible"], "the host's files are in the probe's root"

    report = seen["report"]
    lines = report.splitlines()
    assert "done" in lines, report
    uid_map = [l.split()[1:] for l in lines if l.startswith("uid_map ")]
    assert uid_map and all(m[1] != "0" for m in uid_map), report  # root inside is not host root
    assert not [l for l in lines if l.startswith("seen ")], f"the probe saw the host's files:\n{report}"
    assert not [l for l in lines if l.startswith("read_") and " ok" in l], f"the probe read a host file:\n{report}"
    assert host.content not in report
    for route in ("proc1_root", "proc_self_root_up", "proc1_cwd_up", "chroot"):
        assert any(l.startswith(f"read_{route} fail") for l in lines), (route, report)
    probes = {l.split()[0]: l for l in lines if " rc=" in l}
    for name in ("settimeofday", "swapoff", "mknod_block", "open_by_handle_at", "unshare_user"):
        assert name in probes, (name, report)
        assert probes[name].split()[1:] == ["rc=-1", f"errno={EPERM}"], probes[name]

    # Run isolated, the build itself succeeded: the image holds the probe and its report.
    assert status == 201, (status, body)
    assert isinstance(body, dict) and body["layers"] and not body["cached"], body


def _delete_image(daemon, name: str) -> None:
    st, _, _ = http_raw(daemon.url, "DELETE", f"/v1/images/{name}:1")
    assert st in (200, 404), st


@pytest.mark.slow
def test_build_as_another_uid_over_the_unix_socket_runs_isolated(daemon, host, probe_bin):
    """Issue 11 finding 1 as reported: uid nobody, the unix socket, a program nobody can
    read copied in by `files` and executed by `run`."""
    if not shutil.which("mmdebstrap"):
        pytest.fail("mmdebstrap missing: scripts/install-deps.sh installs it")
    name = f"escape-{host.token}"
    try:
        _build_runs_isolated(daemon, host, lambda: request_as(
            daemon, "unix", "POST", "/v1/images/build", _spec(name, probe_bin, host), timeout=BUILD_TIMEOUT))
    finally:
        _delete_image(daemon, name)


@pytest.mark.slow
def test_build_with_an_admin_key_over_tcp_runs_isolated(daemon, host, probe_bin, admin_key):
    """The same over TCP, sent by uid nobody with an admin key: the program lies under the
    import root, so the daemon reads it (as root), and the build still runs it isolated."""
    if not shutil.which("mmdebstrap"):
        pytest.fail("mmdebstrap missing: scripts/install-deps.sh installs it")
    name = f"escape-{host.token}"
    src_dir = os.path.join(daemon.import_root, host.token)
    os.makedirs(src_dir)
    src = os.path.join(src_dir, "tp-escape-probe")
    shutil.copy2(probe_bin, src)
    os.chmod(src, 0o700)  # root's own: only the import root makes it readable to the daemon
    try:
        _build_runs_isolated(daemon, host, lambda: request_as(
            daemon, "tcp", "POST", "/v1/images/build", _spec(name, src, host), key=admin_key,
            timeout=BUILD_TIMEOUT))
    finally:
        _delete_image(daemon, name)
        shutil.rmtree(src_dir, ignore_errors=True)
