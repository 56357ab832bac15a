"""Bytes that are not UTF-8 where the API echoes names: a file name made inside a sandbox
and a request path. Every answer must stay parseable JSON (invalid bytes become U+FFFD; a
listing also carries the bytes in base64), so that one hostile file name cannot break a
trainer's listing."""
import json
import os
import socket



def test_listing_a_directory_with_a_non_utf8_file_name(sandbox):
    script = "mkdir -p /tmp/bad && printf x > \"/tmp/bad/$(printf 'a\\377b')\" && ls /tmp/bad | wc -l"
    r = sandbox.exec(["sh", "-c", script])
    assert r.exit_code == 0 and r.stdout.strip() == "1", r
    entries = sandbox.files.list("/tmp/bad")
    # The SDK names it as os.fsdecode would (its bytes come along in name_b64).
    assert [e.name for e in entries] == [os.fsdecode(b"a\xffb")]


def test_error_echoing_a_non_utf8_path_is_json(daemon):
    host, port = daemon.url.split("//", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), head
    obj = json.loads(body.decode("utf-8"))
    assert obj["code"] == "not_found" and "\ufffd" in obj["message"]
