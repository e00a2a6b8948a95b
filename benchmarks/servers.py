"""Helper servers for the benchmarks, one per process (`python -m benchmarks.servers KIND`).

Each prints one JSON line once it serves, then runs until SIGTERM. Kinds:
- `policy`: the package's ScriptedPolicy (`base_url`).
- `bare`: a bare aiohttp server answering every POST with the same prepared Responses object
  (`url`; no per-request work): the baseline of the proxy's request rate, and its upstream.
- `forwarder UPSTREAM`: the least an aiohttp proxy can do (`url`): every POST's body forwarded
  to UPSTREAM with one shared aiohttp client session, the answer returned as is. The reference
  the proxy's cost is read against (what aiohttp's two hops cost, before any routing).
- `proxy`: a NeMoGymModelProxy (`url`, `secret`, `pid`) controlled by stdin lines, each answered
  with one JSON line: `open ENDPOINT N` (N routes, answers their ids), `close ID...`, `rss`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys

from aiohttp import web

from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.net import serve_app
from verifiers_nemogym.policies.scripted import ScriptedPolicy


def _announce(**info: object) -> None:
    print(json.dumps({**info, "pid": os.getpid()}), flush=True)


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve_until_stopped(app: web.Application) -> None:
    runner, port = await serve_app(app)
    _announce(url=f"http://127.0.0.1:{port}")
    try:
        await _until_stopped()
    finally:
        await runner.cleanup()


async def policy() -> None:
    async with ScriptedPolicy(record=False) as server:
        _announce(base_url=server.base_url, port=server.port)
        await _until_stopped()


async def bare() -> None:
    from benchmarks.proxy_hop import REQUEST

    canned = json.dumps(ScriptedPolicy().reply(REQUEST)).encode()

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=canned, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/", health)
    app.router.add_post("/{tail:.*}", answer)
    await _serve_until_stopped(app)


async def forwarder(upstream: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=1024), cookie_jar=aiohttp.DummyCookieJar()
    ) as client:

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            headers = {"Content-Type": "application/json"}
            async with client.post(upstream, data=body, headers=headers) as answer:
                raw = await answer.read()
            return web.Response(body=raw, status=answer.status, content_type="application/json")

        app = web.Application()
        app.router.add_post("/{tail:.*}", forward)
        await _serve_until_stopped(app)


async def proxy() -> None:
    async with NeMoGymModelProxy() as server:
        _announce(url=server.url, secret=server.secret)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        commands = asyncio.ensure_future(_commands(server, reader))
        stopped = asyncio.ensure_future(_until_stopped())
        await asyncio.wait({commands, stopped}, return_when=asyncio.FIRST_COMPLETED)
        for task in (commands, stopped):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _commands(server: NeMoGymModelProxy, reader: asyncio.StreamReader) -> None:
    from benchmarks.common import rss_mb

    while line := (await reader.readline()).decode().split():
        verb, args = line[0], line[1:]
        if verb == "open":
            count = int(args[1])
            answer: object = [server.open_route(args[0], "bench-secret").id for _ in range(count)]
        elif verb == "close":
            answer = [await server.close_route(route_id) for route_id in args]
        elif verb == "rss":
            answer = rss_mb(os.getpid())
        else:
            answer = {"error": f"unknown command {verb!r}"}
        print(json.dumps(answer), flush=True)


def main() -> None:
    kinds = {"policy": policy, "bare": bare, "proxy": proxy, "forwarder": forwarder}
    kind, *args = sys.argv[1:] or [""]
    if kind not in kinds or len(args) != (kind == "forwarder"):
        sys.exit(f"usage: python -m benchmarks.servers {{{'|'.join(kinds)}}} [UPSTREAM]")
    asyncio.run(kinds[kind](*args))


if __name__ == "__main__":
    main()
