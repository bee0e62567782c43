"""Threat: code in a sandbox reaching any network, or the host's local sockets.

Covered elsewhere (test_sandbox.py, moving here from tests/integration): DNS, TCP to an IPv4
address, host loopback TCP services, only ``lo`` present. Here: UDP, IPv6, raw
and packet sockets, and the host's abstract unix sockets (the containerd-shim
escape of CVE-2020-15257 went through one).
"""

from __future__ import annotations

import secrets
import socket

import httpx
import pytest

from tests.security.conftest import UNREACHABLE, run_json

pytestmark = pytest.mark.integration


def test_udp_datagram_to_an_ip_is_never_sent(http: httpx.Client, session_id: str) -> None:
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed anywhere, even from a broken sandbox
    code = (
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "print(json.dumps([outcome(lambda: s.sendto(b'x' * 512, ('192.0.2.1', 53))),\n"
        "                  outcome(lambda: s.connect(('192.0.2.1', 53)))]))\n"
    )
    sent, connected = run_json(http, session_id, code)
    assert sent in UNREACHABLE, sent
    assert connected in UNREACHABLE, connected


def test_ipv6_has_no_route_and_no_address(http: httpx.Client, session_id: str) -> None:
    code = (
        "def tcp6():\n"
        "    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n"
        "    s.settimeout(3)\n"
        "    s.connect(('2001:db8::1', 80))\n"
        "def udp6():\n"
        "    socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b'x', ('2001:db8::1', 53))\n"
        "try:\n"
        "    devices = sorted({line.split()[-1] for line in open('/proc/net/if_inet6')})\n"
        "except OSError:\n"
        "    devices = []\n"
        "print(json.dumps({'tcp': outcome(tcp6), 'udp': outcome(udp6), 'devices': devices}))\n"
    )
    result = run_json(http, session_id, code)
    # no route (gVisor), or no IPv6 source address at all (runc: IPv6 is off in the
    # container's namespace), or no IPv6 support: all mean nothing left the sandbox
    no_ipv6 = UNREACHABLE | {"EADDRNOTAVAIL", "EAFNOSUPPORT"}
    assert result["tcp"] in no_ipv6, result
    assert result["udp"] in no_ipv6, result
    assert set(result["devices"]) <= {"lo"}, result


RAW_SOCKETS = {
    "packet": "socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)",  # ETH_P_ALL: every frame
    "icmp": "socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP",
    "ip-raw": "socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW",
}


@pytest.mark.parametrize("kind", list(RAW_SOCKETS))
def test_raw_and_packet_sockets_are_refused(http: httpx.Client, session_id: str, kind: str) -> None:
    # CAP_NET_RAW is dropped: no crafting packets, no sniffing
    code = f"print(json.dumps(outcome(lambda: socket.socket({RAW_SOCKETS[kind]}).close())))\n"
    assert run_json(http, session_id, code) == "EPERM"


def test_host_abstract_unix_socket_is_unreachable(http: httpx.Client, session_id: str) -> None:
    name = f"kgw-sec-{secrets.token_hex(6)}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen()
    listener.setblocking(False)
    code = (
        "def connect():\n"
        "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        "    s.settimeout(3)\n"
        f"    s.connect('\\0{name}')\n"
        "visible = any('@" + name + "' in line for line in open('/proc/net/unix'))\n"
        "print(json.dumps({'connect': outcome(connect), 'visible': visible}))\n"
    )
    try:
        result = run_json(http, session_id, code)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing is waiting in the backlog
    finally:
        listener.close()
    assert result == {"connect": "ECONNREFUSED", "visible": False}
