"""Test doubles for NeMo Gym tests: a scripted Responses-API policy served on loopback.

Contract: `ScriptedPolicy` answers `GET /` with 200 and `POST /v1/responses` with replies that
validate as an openai 2.7.2 `Response` (what NeMo Gym's agents require): a `get_weather`
function call first, then a final assistant message once the tool output is in the input.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from aiohttp import web


def _response(output: list[dict[str, Any]], number: int) -> dict[str, Any]:
    return {
        "id": f"resp_{number}",
        "object": "response",
        "created_at": time.time(),
        "model": "scripted-policy",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }


class ScriptedPolicy:
    """Two-turn tool-calling policy; decides by the request (not a counter) so that
    concurrent rollouts each get the same script."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.host = "127.0.0.1"
        self.port = 0

    async def _root(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        number = next(self._ids)
        items = body.get("input") or []
        answered = any(
            isinstance(item, dict) and item.get("type") == "function_call_output" for item in items
        )
        if answered:
            output = [
                {
                    "type": "message",
                    "id": f"msg_{number}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Sunny in SF.", "annotations": []}],
                }
            ]
        else:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{number}",
                    "call_id": f"call_{number}",
                    "name": "get_weather",
                    "arguments": json.dumps({"city": "SF"}),
                    "status": "completed",
                }
            ]
        return web.json_response(_response(output, number))

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/", self._root)
        app.router.add_post("/v1/responses", self._responses)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
