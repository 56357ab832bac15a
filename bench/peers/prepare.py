#!/usr/bin/python3
"""Builds what every tool of `make bench` runs on: one small root file system.

    prepare.py WORK

WORK/rootfs        static busybox with sh, true and sleep links; /proc, /dev, /sys, /tmp,
                   /etc mount points. Shared read-only by bwrap, crun, runc and (through
                   the image import) Tidepool.
WORK/bundle-true   OCI bundle (from `crun spec`) whose process is /bin/true,
WORK/bundle-sleep  and one whose process is `/bin/sleep 3600` (idle memory); crun and runc
                   share both. Namespaces: pid, net, ipc, uts, mount, cgroup, user (root
                   mapped to 100000, like Tidepool); memory 256 MiB, 1 CPU and 1024 pids
                   limits, like Tidepool's create request; read-only root; crun's default
                   masked paths and three capabilities; no seccomp profile.
WORK/busybox.tar   `docker save`-style archive of the root (tag bench-busybox:latest) for
                   `tidepool image import`.

Standard library only; needs root (the bundle's root must be owned by root) and crun.
"""
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

BUSYBOX = "/bin/busybox"
LINKS = ("sh", "true", "sleep")
UID_BASE = 100000


def make_rootfs(root: str) -> None:
    for d in ("bin", "proc", "dev", "sys", "tmp", "etc"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    shutil.copy2(BUSYBOX, os.path.join(root, "bin/busybox"))
    for name in LINKS:
        link = os.path.join(root, "bin", name)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    with open(os.path.join(root, "etc/passwd"), "w") as f:
        f.write("root:x:0:0:root:/:/bin/sh\n")
    with open(os.path.join(root, "etc/group"), "w") as f:
        f.write("root:x:0:\n")
    for dirpath, _, _ in os.walk(root):
        if not dirpath.endswith("/tmp"):
            os.chmod(dirpath, 0o755)


def make_bundle(bundle: str, root: str, args: list) -> None:
    os.makedirs(bundle, exist_ok=True)
    cfg_path = os.path.join(bundle, "config.json")
    if os.path.exists(cfg_path):
        os.unlink(cfg_path)
    subprocess.run(["crun", "spec"], cwd=bundle, check=True)
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["root"] = {"path": os.path.abspath(root), "readonly": True}
    cfg["process"]["args"] = args
    cfg["process"]["terminal"] = False
    cfg["process"]["env"] = ["PATH=/bin"]
    lin = cfg["linux"]
    have = {n["type"] for n in lin["namespaces"]}
    for ns in ("pid", "network", "ipc", "uts", "mount", "cgroup", "user"):
        if ns not in have:
            lin["namespaces"].append({"type": ns})
    lin["uidMappings"] = [{"containerID": 0, "hostID": UID_BASE, "size": 65536}]
    lin["gidMappings"] = [{"containerID": 0, "hostID": UID_BASE, "size": 65536}]
    lin["resources"] = {
        "memory": {"limit": 256 << 20},
        "cpu": {"quota": 100000, "period": 100000},
        "pids": {"limit": 1024},
    }
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    ti.mode = 0o644
    ti.mtime = 0
    tar.addfile(ti, io.BytesIO(data))


def make_docker_archive(root: str, out: str) -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                full = os.path.join(dirpath, name)
                arc = os.path.relpath(full, root)
                ti = t.gettarinfo(full, arc)
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = "root"
                ti.mtime = 0
                if ti.isreg():
                    with open(full, "rb") as f:
                        t.addfile(ti, f)
                else:
                    t.addfile(ti)
    blob = layer.getvalue()
    diff_id = hashlib.sha256(blob).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + diff_id]},
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{
        "Config": config_name,
        "RepoTags": ["bench-busybox:latest"],
        "Layers": [diff_id + "/layer.tar"],
    }]).encode()
    with tarfile.open(out, "w") as t:
        add_bytes(t, diff_id + "/layer.tar", blob)
        add_bytes(t, config_name, config)
        add_bytes(t, "manifest.json", manifest)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    work = sys.argv[1]
    root = os.path.join(work, "rootfs")
    make_rootfs(root)
    make_bundle(os.path.join(work, "bundle-true"), root, ["/bin/true"])
    make_bundle(os.path.join(work, "bundle-sleep"), root, ["/bin/sleep", "3600"])
    make_docker_archive(root, os.path.join(work, "busybox.tar"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
