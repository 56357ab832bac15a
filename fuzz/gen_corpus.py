#!/usr/bin/python3
"""Regenerates the seed corpora in fuzz/corpus/<harness>/ (committed; small).

    /usr/bin/python3 fuzz/gen_corpus.py
"""
import gzip
import hashlib
import io
import json
import pathlib
import struct
import tarfile

HERE = pathlib.Path(__file__).resolve().parent


def write(harness, name, data: bytes):
    d = HERE / "corpus" / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# -- wire -------------------------------------------------------------------------

def field(tag, val: bytes):
    return struct.pack("<HI", tag, len(val)) + val


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def frame(typ, mid, fields=b""):
    return struct.pack("<IBBHI", 8 + len(fields), typ, 0, 0, mid) + fields


def wire():
    ready = frame(100, 0, field(25, u64(1)) + field(24, u64(1)))
    started = frame(101, 1, field(24, u64(7)))
    out = frame(102, 1, field(22, u64(1)) + field(20, b"hello\n")) + frame(102, 1, field(22, u64(2)) + field(20, b"err"))
    exit_ = frame(103, 1, field(30, u64(0)) + field(31, u64(0)) + field(32, u64(1234)) + field(33, u64(99)) +
                  field(34, u64(0)) + field(35, u64(1)) + field(36, u64(0)))
    read_ok = frame(110, 2, field(20, b"data") + field(47, u64(4)))
    entry = (field(49, b"f") + field(40, b"/f") + field(50, b"file") + field(47, u64(3)) + field(41, u64(0o644)) +
             field(51, u64(10**18)) + field(53, u64(0)) + field(54, u64(0)))
    stat_ok = frame(110, 3, entry)
    list_ok = frame(110, 4, field(48, entry) + field(48, field(49, b"l") + field(50, b"symlink") + field(52, b"/etc")))
    err = frame(111, 5, field(60, b"not_found") + field(61, u64(2)) + field(62, b"openat2 /w"))
    write("wire", "agent_session", b"\x01" + ready + started + out + exit_ + read_ok + stat_ok + list_ok + err)
    write("wire", "agent_errors", b"\x01" + ready + frame(111, 1, field(60, b"invalid_argument")) +
          frame(111, 2, field(60, b"payload_too_large")) + frame(111, 3, b"") + frame(111, 4, b"") + err)
    write("wire", "agent_garbage_after_ready", b"\x01" + ready + b"\xff\xff\xff\xff" + b"x" * 16)
    write("wire", "reader_frames", b"\x00" + ready + started + out + exit_ + list_ok)
    write("wire", "file_stat", b"\x00" + frame(12, 9, field(40, b"/dir/file")) + frame(12, 10, field(40, b"/dir/up/x")))
    write("wire", "file_list", b"\x00" + frame(13, 11, field(40, b"/")) + frame(13, 12, field(40, b"/dir")))
    write("wire", "file_read", b"\x00" + frame(11, 13, field(40, b"/big") + field(42, u64(10)) + field(43, u64(100))) +
          frame(11, 14, field(40, b"/fifo")) + frame(11, 15, field(40, b"/abs")))
    write("wire", "exec_request", b"\x00" + frame(1, 1, field(1, b"sh") + field(1, b"-c") + field(1, b"echo hi") +
                                                  field(2, b"A=B") + field(3, b"/") + field(6, u64(1000))))
    write("wire", "oversized_length", b"\x00" + struct.pack("<I", 0xFFFFFFF0) + b"\x00" * 8)


# -- http -------------------------------------------------------------------------

def req(method, target, body=b"", headers=None):
    h = {"Host": "127.0.0.1"}
    if body:
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    return head.encode() + body


def http():
    j = lambda o: json.dumps(o).encode()  # noqa: E731
    sid = "n0-0123456789ab"
    write("http", "health", req("GET", "/health") + req("GET", "/version") + req("GET", "/metrics"))
    write("http", "create", req("POST", "/v1/sandboxes", j({"image": "host", "memory_mb": 128, "cpus": 0.5,
                                                             "ttl_seconds": 60, "labels": {"a": "b"},
                                                             "env": {"K": "V"}})))
    write("http", "create_bad", req("POST", "/v1/sandboxes", b'{"memory_mb": "x", "env": {"=": 1}}'))
    write("http", "batch", req("POST", "/v1/sandboxes/batch", j({"count": 3, "tier": "container"}),
                               {"Idempotency-Key": "k1"}))
    write("http", "list", req("GET", "/v1/sandboxes?label=a%3Db&state=running&all=true"))
    write("http", "exec", req("POST", f"/v1/sandboxes/{sid}/exec",
                              j({"cmd": ["sh", "-c", "echo"], "env": {"A": "1"}, "cwd": "/tmp", "user": 1000,
                                 "timeout": 1.5, "stdin": "aGk=", "max_output_bytes": 10, "stream": True})))
    write("http", "exec_string", req("POST", f"/v1/sandboxes/{sid}/exec", j({"cmd": "echo hi", "timeout": None})))
    write("http", "files", req("GET", f"/v1/sandboxes/{sid}/files?path=/etc/hostname") +
          req("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/x&mode=0644&parents=1", b"data") +
          req("GET", f"/v1/sandboxes/{sid}/files/list?path=/") +
          req("POST", f"/v1/sandboxes/{sid}/files/mkdir?path=/a/b&parents=true"))
    write("http", "processes", req("POST", f"/v1/sandboxes/{sid}/processes", j({"cmd": "sleep 1", "stdin_open": True})) +
          req("POST", f"/v1/sandboxes/{sid}/processes/1/wait?timeout=0.1") +
          req("POST", f"/v1/sandboxes/{sid}/processes/1/signal", j({"signal": 9})))
    write("http", "tar", req("GET", f"/v1/sandboxes/{sid}/files/tar?path=/tmp") +
          req("PUT", f"/v1/sandboxes/{sid}/files/tar?path=/tmp", b"x"))
    write("http", "delete", req("DELETE", f"/v1/sandboxes/{sid}"))
    write("http", "chunked", b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"2\r\n{}\r\n0\r\n\r\n")
    write("http", "json_body_only", j({"cmd": ["a", "b"], "env": {"x": "y"}, "n": 3, "x": 0.5}))


# -- archive ----------------------------------------------------------------------

def tar_bytes(entries, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for e in entries:
            t.addfile(*e)
    return buf.getvalue()


def tfile(name, data=b"", mode=0o644, uid=0, typ=tarfile.REGTYPE, link=""):
    ti = tarfile.TarInfo(name)
    ti.type = typ
    ti.mode = mode
    ti.uid = ti.gid = uid
    ti.linkname = link
    if typ == tarfile.REGTYPE:
        ti.size = len(data)
        return (ti, io.BytesIO(data))
    return (ti,)


def archive():
    layer = tar_bytes([tfile("./", typ=tarfile.DIRTYPE, mode=0o755), tfile("bin/", typ=tarfile.DIRTYPE),
                       tfile("bin/sh", b"#!x", 0o755), tfile("etc/.wh.gone"), tfile("var/.wh..wh..opq"),
                       tfile("link", typ=tarfile.SYMTYPE, link="/etc/passwd"),
                       tfile("hard", typ=tarfile.LNKTYPE, link="bin/sh"),
                       tfile("suid", b"x", 0o4755, uid=1000)])
    write("archive", "layer_plain", b"\x00" + layer)
    write("archive", "layer_gzip", b"\x00" + gzip.compress(layer, mtime=0))
    write("archive", "layer_hostile", b"\x00" + tar_bytes([
        tfile("../escape", b"x"), tfile("/abs", b"x"), tfile("s", typ=tarfile.SYMTYPE, link=".."),
        tfile("s/through", b"x"), tfile("h", typ=tarfile.LNKTYPE, link="../../etc/passwd"),
        tfile("dev", typ=tarfile.CHRTYPE), tfile("a/.wh..wh.plnk")]))
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps({"config": {"Env": ["PATH=/bin"], "WorkingDir": "/w", "Cmd": ["sh"]},
                             "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    cfg_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": ["img:1"], "Layers": ["l1/layer.tar"]}]).encode()
    write("archive", "docker_save", b"\x01" + tar_bytes([tfile("manifest.json", manifest), tfile(cfg_name, config),
                                                        tfile("l1/layer.tar", layer)]))
    cdig = hashlib.sha256(config).hexdigest()
    ldig = hashlib.sha256(layer).hexdigest()
    man = json.dumps({"schemaVersion": 2, "config": {"digest": "sha256:" + cdig, "size": len(config)},
                      "layers": [{"digest": "sha256:" + ldig, "size": len(layer),
                                  "mediaType": "application/vnd.oci.image.layer.v1.tar"}]}).encode()
    mdig = hashlib.sha256(man).hexdigest()
    index = json.dumps({"schemaVersion": 2, "manifests": [{"digest": "sha256:" + mdig, "size": len(man),
                        "annotations": {"org.opencontainers.image.ref.name": "img:2"}}]}).encode()
    write("archive", "oci_layout", b"\x01" + tar_bytes([
        tfile("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), tfile("index.json", index),
        tfile("blobs/sha256/" + mdig, man), tfile("blobs/sha256/" + cdig, config),
        tfile("blobs/sha256/" + ldig, layer)]))
    write("archive", "plain_layer_import", b"\x01" + layer)


if __name__ == "__main__":
    wire()
    http()
    archive()
