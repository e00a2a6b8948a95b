"""A scripted OpenAI Responses model server: calls the request's first tool once, then answers.

For smoke tests, CI and benchmarks, where a real model would only add noise: instant,
deterministic, loopback-only. It records every call (body and verifiers' `X-Session-ID`), so a
test can check which rollout each call belonged to. Run it alone with
`nemo-gym-env serve scripted --port 8000`.

Fault injection, for tests: a request whose first user message contains `[fault:MODE]` gets
MODE = an HTTP status from 400 to 599 (e.g. `401`, `429`, `500`: that status with an
OpenAI-style error body whose message is `scripted fault <status>`), `garbage` (200 with a body
that is not JSON), `hang` (no answer for `hang_seconds`) or `huge` (a normal answer whose text
is `huge_bytes` long).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge.responses import complete_response
from verifiers_nemogym.net import AppServer

ANSWER = "Done: I looked it up for you."
_FAULT = re.compile(r"\[fault:(\w+)\]")


@dataclass
class Call:
    """One model call as the policy saw it."""

    session_id: str | None
    body: dict[str, Any]

    @property
    def prompt(self) -> str:
        """The first user message's text: which task the call belongs to."""
        return first_user_text(self.body)


def first_user_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


def _argument(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if "enum" in schema:
        return schema["enum"][0]
    by_type: dict[Any, Any] = {"integer": 1, "number": 1.0, "boolean": True, "array": []}
    return {**by_type, "object": {}}.get(kind, "San Francisco")


def tool_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Plausible arguments for `tool`: a value of the right type for each required field."""
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    return {name: _argument(props.get(name, {})) for name in params.get("required", props)}


def _answered(items: Any) -> bool:
    return isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
    )


@dataclass
class ScriptedPolicy(AppServer):
    """Serve on `host:port` (0 = a free port); `base_url` ends in `/v1`. `async with`, or
    `start()`/`stop()`."""

    host: str = "127.0.0.1"
    port: int = 0
    calls: list[Call] = field(default_factory=list)
    record: bool = True
    """Keep every call in `calls` (turn off for long benchmarks)."""
    hang_seconds: float = 600.0
    """How long a `[fault:hang]` request waits before it is answered."""
    huge_bytes: int = 50 * 1024 * 1024
    """Length of a `[fault:huge]` answer's text."""
    _ids: itertools.count = field(default_factory=itertools.count)
    # Hung `[fault:hang]` handlers must not hold up shutdown.
    shutdown_timeout: ClassVar[float] = 1.0

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_get("/", self._health)  # NeMo Gym's readiness poll, if used directly
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
        )

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.record:
            self.calls.append(Call(request.headers.get("X-Session-ID"), body))
        fault = _FAULT.search(first_user_text(body))
        mode = fault.group(1) if fault else None
        if mode is not None and mode.isdigit() and 400 <= int(mode) <= 599:
            error = {"message": f"scripted fault {mode}", "type": "scripted_fault"}
            return web.json_response({"error": error}, status=int(mode))
        if mode == "garbage":
            return web.Response(
                body=b'{"id": "resp_1", "output": [', content_type="application/json"
            )
        if mode == "hang":
            await asyncio.sleep(self.hang_seconds)
        reply = self.reply(body)
        if mode == "huge":
            reply["output"] = [_message(reply["id"], "x" * self.huge_bytes)]
        return web.json_response(reply)

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        """The scripted answer to a Responses request body."""
        n = next(self._ids)
        tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
        if tools and not _answered(body.get("input")):
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": tools[0]["name"],
                "arguments": json.dumps(tool_arguments(tools[0])),
                "status": "completed",
            }
        else:
            item = _message(f"msg_{n}", ANSWER)
        reply = {
            "id": f"resp_{n}",
            "model": body.get("model") or "scripted",
            "output": [item],
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
        return complete_response(reply, body)


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
