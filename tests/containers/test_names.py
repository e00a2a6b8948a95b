"""The stack's refusing name server (containers/names.py) over a real UDP socket on loopback.

That a container's lookups fail at once through it (docker's embedded DNS forwarding to it) is
tested on a real daemon in tests/stack/containers/test_containers.py."""

from __future__ import annotations

import asyncio
import socket
import struct

from verifiers_nemogym.containers.names import REFUSED, RefusingNameServer, refusal


def query(name: str, ident: int = 0x1234, flags: int = 0x0100, questions: int = 1) -> bytes:
    """A DNS query for `name` (type A, class IN), recursion desired, with an EDNS record after
    the question (as glibc sends it)."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    opt = b"\0" + struct.pack("!HHIH", 41, 1232, 0, 0)
    return struct.pack("!HHHHHH", ident, flags, questions, 0, 0, 1) + qname + b"\0\1\0\1" + opt


def test_a_query_is_refused_with_its_id_and_question_and_no_record() -> None:
    q = query("deb.debian.org")
    answer = refusal(q)
    assert answer is not None
    ident, flags, qd, an, ns, ar = struct.unpack("!HHHHHH", answer[:12])
    assert ident == 0x1234 and (qd, an, ns, ar) == (1, 0, 0, 0)
    assert flags & 0x8000 and flags & 0x0100 and flags & 0x000F == REFUSED
    question = q[12 : 12 + len(b"\3deb\6debian\3org\0") + 4]
    assert answer[12:] == question  # the question only: the EDNS record is not echoed
    assert len(answer) <= len(q)


def test_what_is_not_a_one_question_query_gets_no_answer() -> None:
    q = query("example.org")
    assert refusal(q[:11]) is None  # shorter than a header
    assert refusal(q[:20]) is None  # a name cut short
    assert refusal(bytes([q[0], q[1], q[2] | 0x80]) + q[3:]) is None  # an answer, not a query
    assert refusal(query("example.org", questions=2)) is None
    pointer = q[:12] + b"\xc0\x0c" + b"\0\1\0\1"
    assert refusal(pointer) is None
    assert refusal(b"\0" * 5000) is None


async def test_the_server_answers_on_its_socket_and_stops() -> None:
    server = RefusingNameServer("127.0.0.1", port=0)
    await server.start()
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.setblocking(False)
        await loop.sock_connect(client, ("127.0.0.1", server.port))
        await loop.sock_sendall(client, b"junk")  # dropped, the server goes on
        await loop.sock_sendall(client, query("deb.debian.org", ident=7))
        answer = await asyncio.wait_for(loop.sock_recv(client, 512), 5)
    assert struct.unpack("!H", answer[:2])[0] == 7 and answer[3] & 0x0F == REFUSED
    assert server.answered == 1
    await server.stop()
    await server.stop()  # idempotent
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind(("127.0.0.1", server.port))  # the port is free again
