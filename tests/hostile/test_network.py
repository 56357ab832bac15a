"""Network: hostile code tries to reach the daemon, the host's loopback services, other
sandboxes and the outside. A sandbox's network namespace has its own loopback and
nothing else, so every attempt fails at once (no route, or nobody listening on the
sandbox's own loopback). No packet is sent anywhere real: the outside is only probed by
connect() calls that fail before leaving the namespace.
"""
from __future__ import annotations

import socket
import threading

from tp_testlib import wait_until

_CONNECT = ("import socket,sys,time\n"
            "host,port=sys.argv[1],int(sys.argv[2])\n"
            "t=time.monotonic()\n"
            "try:\n"
            "    s=socket.create_connection((host,port),timeout=5); print('connected')\n"
            "except OSError as e:\n"
            "    print('error',e.errno,round(time.monotonic()-t,3))\n")


def _connect(sb, host: str, port: int) -> str:
    return sb.exec(["python3", "-c", _CONNECT, host, str(port)], timeout=30).stdout.strip()


def _host_addresses() -> list:
    """The host's own IPv4 addresses (loopback plus the one holding the default route)."""
    out = ["127.0.0.1"]
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("10.255.255.255", 1))  # UDP connect: picks a source address, sends nothing
        out.append(s.getsockname()[0])
        s.close()
    except OSError:
        pass
    return out


def test_daemon_api_unreachable(hostile, daemon):
    """Attempt: connect to tidepoold's API port on every host address.
    Expected: refused (the sandbox's own loopback has no listener) or no route; never
    connected."""
    for ip in _host_addresses():
        r = _connect(hostile, ip, daemon.port)
        assert r.startswith("error"), (ip, r)


def test_host_loopback_service_unreachable(hostile):
    """Attempt: reach a TCP service listening on the host's 127.0.0.1 (started by the test).
    Expected: ECONNREFUSED inside (127.0.0.1 is the sandbox's own loopback); the host
    listener never sees a connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    port = srv.getsockname()[1]
    accepted = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                accepted.append(c)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        for ip in _host_addresses():
            r = _connect(hostile, ip, port)
            assert r.startswith("error"), (ip, r)
        # Also over UDP and IPv6 loopback.
        r = hostile.exec(["python3", "-c",
                          "import socket\n"
                          f"s=socket.socket(socket.AF_INET6); s.settimeout(3)\n"
                          f"print(s.connect_ex(('::1',{port})))\n"])
        assert r.stdout.strip() != "0", r
    finally:
        stop.set()
        t.join(2)
        srv.close()
    assert not accepted, "the host listener accepted a connection from the sandbox"


def test_other_sandbox_unreachable(hostile, bystander):
    """Attempt: reach a TCP listener and an abstract unix socket that the bystander opened
    on its own loopback / in its own network namespace.
    Expected: not reachable (each sandbox has its own loopback and its own abstract socket
    namespace)."""
    listener = bystander.sb.start(["python3", "-c",
                                   "import socket,time\n"
                                   "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                                   "s.bind(('127.0.0.1',18080)); s.listen()\n"
                                   "u=socket.socket(socket.AF_UNIX); u.bind('\\0tp-bystander'); u.listen()\n"
                                   "open('/tmp/listening','w').close()\n"
                                   "time.sleep(60)\n"])
    try:
        wait_until(lambda: bystander.sb.files.exists("/tmp/listening"), 10, 0.1, "bystander listening")
        assert _connect(bystander.sb, "127.0.0.1", 18080) == "connected"
        r = _connect(hostile, "127.0.0.1", 18080)
        assert r.startswith("error"), r
        r = hostile.exec(["python3", "-c",
                          "import socket\n"
                          "u=socket.socket(socket.AF_UNIX)\n"
                          "print(u.connect_ex('\\0tp-bystander'))\n"])
        assert r.stdout.strip() != "0", r
    finally:
        listener.kill()
        listener.wait(timeout=30)
        bystander.sb.exec("rm -f /tmp/listening")


def test_outside_unreachable_fast(hostile):
    """Attempt: connect to addresses outside the host (a private 10/8 address, a public
    one, IPv6) and send UDP.
    Expected: ENETUNREACH at once (well under a second: no route, nothing leaves)."""
    for ip in ("10.0.0.1", "192.0.2.1", "8.8.8.8", "2001:db8::1"):
        r = _connect(hostile, ip, 80)
        parts = r.split()
        assert parts[0] == "error" and int(parts[1]) in (101, 99), (ip, r)  # ENETUNREACH / EADDRNOTAVAIL
        assert float(parts[2]) < 1.0, (ip, r)
    r = hostile.exec(["python3", "-c",
                      "import socket\n"
                      "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                      "try:\n    s.sendto(b'x',('10.0.0.1',53)); print('sent')\n"
                      "except OSError as e:\n    print('error',e.errno)\n"])
    assert r.stdout.strip() == "error 101", r


def test_raw_sockets_see_only_loopback(hostile):
    """Attempt: open raw sockets (AF_PACKET, SOCK_RAW ICMP) to sniff or forge traffic.
    Expected: they may be allowed (CAP_NET_RAW over the sandbox's own network namespace),
    but the only interface is the sandbox's loopback: nothing of the host or other
    sandboxes can be seen or sent to."""
    r = hostile.exec(["python3", "-c",
                      "import socket\n"
                      "print(sorted(n for _,n in socket.if_nameindex()))\n"
                      "for fam,typ,proto in ((socket.AF_PACKET,socket.SOCK_RAW,0x0300),"
                      "(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)):\n"
                      "    try:\n        s=socket.socket(fam,typ,proto); print('open'); s.close()\n"
                      "    except OSError as e:\n        print('error',e.errno)\n"])
    lines = r.stdout.splitlines()
    assert lines[0] == "['lo']", r.stdout
    # Whatever a packet socket captures is the sandbox's own loopback traffic.
    r = hostile.exec(["python3", "-c",
                      "import socket\n"
                      "try:\n"
                      "    s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW,socket.htons(3)); s.settimeout(1)\n"
                      "except OSError as e:\n    print('refused'); raise SystemExit\n"
                      "names=set()\n"
                      "try:\n"
                      "    for _ in range(50):\n"
                      "        d,a=s.recvfrom(65535); names.add(a[0])\n"
                      "except OSError: pass\n"
                      "print(sorted(names) or ['none'])\n"])
    assert r.stdout.strip() in ("refused", "['none']", "['lo']"), r.stdout
