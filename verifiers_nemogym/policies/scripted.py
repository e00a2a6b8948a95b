"""A scripted OpenAI Responses model server: calls the request's first tool once, then answers.

For smoke tests, CI and benchmarks, where a real model would only add noise: instant,
deterministic, loopback-only. It records every call (body and verifiers' `X-Session-ID`), so a
test can check which rollout each call belonged to. Run it alone with
`nemo-gym-env serve scripted --port 8000`.

Fault injection, for tests: a request whose first user message contains `[fault:MODE]` gets
MODE = an HTTP status from 400 to 599 (e.g. `401`, `429`, `500`: that status with an
OpenAI-style error body whose message is `scripted fault <status>`), `garbage` (200 with a body
that is not JSON), `hang` (no answer for `hang_seconds`) or `huge` (a normal answer whose text
is `huge_bytes` long). `[fault:MODExN]` (e.g. `[fault:503x2]`) gives MODE to the first N calls
whose first user message carries that trigger and answers the later ones normally: a transient
fault. A 429 answer carries `Retry-After: <retry_after>` when `retry_after` is set.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge.responses import complete_response
from verifiers_nemogym.policies.server import ResponsesServer, first_user_text

ANSWER = "Done: I looked it up for you."
_FAULT = re.compile(r"\[fault:(\w+)\]")
_TRANSIENT = re.compile(r"(\w+?)x(\d+)")


def fault_mode(trigger: str, seen: collections.Counter[str]) -> str | None:
    """The fault a call with `[fault:<trigger>]` gets, counting it in `seen`: the trigger's MODE,
    or for `MODExN` that MODE while fewer than N such calls came before, then None."""
    transient = _TRANSIENT.fullmatch(trigger)
    if transient is None:
        return trigger
    seen[trigger] += 1
    return transient.group(1) if seen[trigger] <= int(transient.group(2)) else None


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
class ScriptedPolicy(ResponsesServer):
    """Serve on `host:port` (0 = a free port); `base_url` ends in `/v1`. `async with`, or
    `start()`/`stop()`."""

    hang_seconds: float = 600.0
    """How long a `[fault:hang]` request waits before it is answered."""
    huge_bytes: int = 50 * 1024 * 1024
    """Length of a `[fault:huge]` answer's text."""
    retry_after: str | None = None
    """`Retry-After` value of a `[fault:429]` answer (None: no such header)."""
    faulted: collections.Counter[str] = field(default_factory=collections.Counter)
    """Calls seen per `MODExN` trigger."""
    model_id: ClassVar[str] = "scripted"
    # Hung `[fault:hang]` handlers must not hold up shutdown.
    shutdown_timeout: ClassVar[float] = 1.0

    async def respond(self, body: dict[str, Any]) -> web.Response:
        fault = _FAULT.search(first_user_text(body))
        mode = fault_mode(fault.group(1), self.faulted) if fault else None
        if mode is not None and mode.isdigit() and 400 <= int(mode) <= 599:
            error = {"message": f"scripted fault {mode}", "type": "scripted_fault"}
            headers = {}
            if mode == "429" and self.retry_after is not None:
                headers["Retry-After"] = self.retry_after
            return web.json_response({"error": error}, status=int(mode), headers=headers)
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
