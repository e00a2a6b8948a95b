"""The stack's name server: it refuses every query at once, so a container's lookups fail fast.

A stack's containers have no route off the machine (docs/containers.md). Docker's embedded DNS
(127.0.0.11 in every container of a user-defined network) passes a name it does not know to the
container's upstream servers; on an internal network the upstream is out of reach and docker
20.10's resolver then answers nothing, so each lookup waits out the client's timeouts (glibc: 5 s
times 2 attempts; terminal_bench_2_1's `apt-get update` at the start of every rollout took ~47 s,
measured). With this server on the network's gateway as the containers' upstream
(`docker run --dns <gateway>`), each lookup ends in milliseconds with REFUSED, as it would on a
machine with no network. It resolves nothing and answers only queries (one question, no more than
the query's own size), to the stack's containers, which the firewall lets reach its port.
"""

from __future__ import annotations

import asyncio
import struct
from typing import cast

PORT = 53
"""Docker's `--dns` takes an address only: the upstream is always port 53."""
REFUSED = 5
_HEADER = struct.Struct("!HHHHHH")
_MAX_QUERY = 4096


def refusal(query: bytes) -> bytes | None:
    """The REFUSED answer to DNS `query` (its id, opcode, RD bit and one question echoed; no
    records), or None for anything but a well-formed query with one question."""
    if not 12 < len(query) <= _MAX_QUERY:
        return None
    ident, flags, questions, _, _, _ = _HEADER.unpack_from(query)
    if flags & 0x8000 or questions != 1:  # an answer, or not exactly one question
        return None
    end = 12
    while end < len(query) and query[end] != 0:
        if query[end] & 0xC0:  # a compression pointer: never in a query's one name
            return None
        end += query[end] + 1
    end += 1 + 4  # the root label, QTYPE, QCLASS
    if end > len(query):
        return None
    answer_flags = 0x8000 | (flags & 0x7900) | 0x0080 | REFUSED  # QR, opcode, RD; RA; rcode
    return _HEADER.pack(ident, answer_flags, 1, 0, 0, 0) + query[12:end]


class _Refuser(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.DatagramTransport | None = None
        self.answered = 0
        self.closed = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's UDP transport is no subclass of asyncio's: typed, not checked.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()

    def datagram_received(self, data: bytes, addr: tuple[str | bytes, int]) -> None:
        answer = refusal(data)
        if answer is not None and self.transport is not None:
            self.answered += 1
            self.transport.sendto(answer, addr)


class RefusingNameServer:
    """See the module contract: `start()` binds UDP `host:port`, `stop()` closes it."""

    def __init__(self, host: str, port: int = PORT) -> None:
        self.host = host
        self.port = port
        self._protocol = _Refuser()
        self._transport: asyncio.DatagramTransport | None = None

    @property
    def answered(self) -> int:
        """Queries answered so far."""
        return self._protocol.answered

    async def start(self) -> None:
        """Bind; OSError if it cannot (port 53 needs root, which the firewall needs too)."""
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self._protocol, local_addr=(self.host, self.port)
        )
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])

    async def stop(self) -> None:
        """Close the socket (its port free when this returns); idempotent."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            await asyncio.wait_for(self._protocol.closed.wait(), 10)
