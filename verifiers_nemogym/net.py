"""Loopback ports and servers: the one way the package binds its own HTTP servers.

`free_port()` is for ports another program must be told before it binds them (NeMo Gym's head
server). Our own aiohttp servers (model proxy, scripted and replay policies, the benchmarks'
reference servers) bind through `serve_app`, which binds port 0 itself when asked for a free
port, so no other process can take the port between choosing and binding it.
"""

from __future__ import annotations

import socket

from aiohttp import web

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on `host` right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


async def serve_app(
    app: web.Application, host: str = LOOPBACK, port: int = 0, *, shutdown_timeout: float = 60.0
) -> tuple[web.AppRunner, int]:
    """Serve `app` on `host:port` (0 = a free port) until the returned runner's `cleanup()`.

    Returns the runner and the bound port. No access log (one line per request costs CPU and
    drowns progress) and no signal handlers (the owner decides what Ctrl-C does). The backlog
    is deep enough for hundreds of rollouts connecting at once. `shutdown_timeout` bounds how
    long `cleanup()` waits for handlers still running (e.g. a deliberately hung answer).
    Raises OSError if the port cannot be bound (nothing is left running then).
    """
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, backlog=4096).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, int(runner.addresses[0][1])
