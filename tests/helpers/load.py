"""Load without a credential: many callers, from another process, streaming large bodies or
request heads at listeners that must refuse them in bounded memory.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

_UNAUTHENTICATED_LOAD = r"""
import asyncio, json, sys
import aiohttp

mode, urls, callers, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
piece = b"x" * 65536

async def body():
    yield b'{"input": "'
    for _ in range(size // len(piece)):
        yield piece
    yield b'", "metadata": {"vf_nemogym_secret": "not-the-secret"}}'

async def call(http, url):
    try:
        async with http.post(url, data=body()) as r:
            await r.read()
            return r.status
    except aiohttp.ClientError as e:
        return repr(e)

async def head(url):
    # A request head of `size` bytes in 4 KB header lines, never finished: sent, then held
    # until the server hangs up (its answer, if any, is returned).
    host, port = url.split("/")[2].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = [f"X-Pad-{i}: {'y' * 4000}\r\n".encode() for i in range(size // 4016)]
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n" + b"".join(lines))
    try:
        await writer.drain()
        answer = await reader.read(12)
        return answer.decode() or "closed"
    except ConnectionResetError:  # closed with bytes of ours unread: also a hang-up
        return "closed"
    except OSError as e:
        return repr(e)
    finally:
        writer.close()

async def main():
    if mode == "head":
        calls = [head(u) for u in urls for _ in range(callers)]
        print(json.dumps(await asyncio.gather(*calls)))
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        calls = [call(http, u) for u in urls for _ in range(callers)]
        print(json.dumps(await asyncio.gather(*calls)))

asyncio.run(main())
"""


async def unauthenticated_load(
    urls: list[str], callers: int, size: int, *, heads: bool = False, timeout: float = 900
) -> list[Any]:
    """From another process, `callers` concurrent callers without a credential to each of
    `urls` at once; each answer's status (or the client error's text), in `urls` order.

    Each caller streams a JSON body of about `size` bytes made as it is sent, with a wrong
    secret where NeMo Gym puts `metadata` (its end); `heads=True`: each sends a request head of
    about `size` bytes in 4 KB header lines and never finishes it, and reports the first bytes
    of the answer ("closed" when the server hangs up without one).
    """
    mode = "head" if heads else "body"
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _UNAUTHENTICATED_LOAD, mode, json.dumps(urls), str(callers),
        str(size), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(load.communicate(), timeout)
    finally:
        if load.returncode is None:
            load.kill()
            await load.wait()
    return list(json.loads(out))
