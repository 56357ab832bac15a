"""The unix-socket transport, the default address and where API keys are sent."""
import asyncio
import http.server
import json
import os
import socketserver
import tempfile
import threading

import pytest

import tidepool
from tidepool._http import default_url


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen = []  # (path, Authorization header) of every request

    def do_GET(self):  # noqa: N802
        _Handler.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"status": "ok"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        sock, _ = super().get_request()
        return sock, ("local", 0)  # BaseHTTPRequestHandler wants a (host, port) address


@pytest.fixture
def unix_server():
    d = tempfile.mkdtemp(prefix="tp-sdk-unix-")
    path = os.path.join(d, "tp.sock")
    srv = _UnixServer(path, _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    _Handler.seen.clear()
    yield path
    srv.shutdown()
    srv.server_close()
    os.unlink(path)
    os.rmdir(d)


def test_default_url_prefers_an_existing_socket(monkeypatch, unix_server, tmp_path):
    monkeypatch.delenv("TIDEPOOL_URL", raising=False)
    monkeypatch.setenv("TIDEPOOL_SOCKET", str(tmp_path / "absent.sock"))
    assert default_url() == "http://127.0.0.1:7070"
    (tmp_path / "plain").write_text("not a socket")
    monkeypatch.setenv("TIDEPOOL_SOCKET", str(tmp_path / "plain"))
    assert default_url() == "http://127.0.0.1:7070"
    monkeypatch.setenv("TIDEPOOL_SOCKET", unix_server)
    assert default_url() == "unix:" + unix_server
    assert tidepool.Client().url == "unix:" + unix_server
    monkeypatch.setenv("TIDEPOOL_URL", "http://10.0.0.1:1")
    assert tidepool.Client().url == "http://10.0.0.1:1"  # an explicit URL wins


def test_sync_and_async_clients_over_the_socket_send_no_key(unix_server):
    with tidepool.Client("unix:" + unix_server, api_key="tpk_secret", timeout=10) as c:
        assert c.health()["status"] == "ok"
        assert c.health()["status"] == "ok"  # a kept-alive connection

    async def main():
        async with tidepool.AsyncClient("unix://" + unix_server, api_key="tpk_secret", timeout=10) as ac:
            return await ac.health()

    assert asyncio.run(main())["status"] == "ok"
    assert _Handler.seen == [("/health", None)] * 3


def test_the_key_goes_over_tcp(fake):
    with tidepool.Client(fake.url, api_key="tpk_secret", timeout=10) as c:
        c.health()
    assert [r.headers.get("authorization") for r in fake.requests] == ["Bearer tpk_secret"]


def test_bad_unix_urls_are_rejected():
    with pytest.raises(ValueError):
        tidepool.Client("unix:relative.sock")
