"""ResponsesServer: what every Responses model double of the package shares.

Contract: an aiohttp server on `host:port` (0 = a free port; `base_url` ends in `/v1`) that
answers NeMo Gym's readiness poll (`GET /`), lists one model (`GET /v1/models`: `model_id`)
and answers `POST /v1/responses` with `respond(body)`; with `record`, every call (its body and
verifiers' `X-Session-ID`) is kept in `calls` first. Subclasses decide the answer only.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.net import AppServer


@dataclass
class Call:
    """One model call as the server saw it."""

    session_id: str | None
    body: dict[str, Any]
    retry_count: str | None = None
    """The OpenAI SDK's `x-stainless-retry-count` header, if the caller sent one (a retry)."""
    at: float = field(default_factory=time.time, compare=False)
    """When the server recorded it (wall clock, seconds): the benchmarks' phase timings."""

    @property
    def prompt(self) -> str:
        """The first user message's text: which task the call belongs to."""
        return first_user_text(self.body)


def first_user_text(body: dict[str, Any]) -> str:
    """The text of the first user message of a Responses request body, or of a Chat
    Completions one (`messages`) ("" if none)."""
    items = body.get("input", body.get("messages"))
    if isinstance(items, str):
        return items
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return " ".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


@dataclass
class ResponsesServer(AppServer):
    """See the module contract."""

    host: str = "127.0.0.1"
    port: int = 0
    calls: list[Call] = field(default_factory=list)
    record: bool = True
    """Keep every call in `calls` (turn off for long benchmarks)."""
    _ids: itertools.count = field(default_factory=itertools.count)
    model_id: ClassVar[str] = "model"
    """The one model `GET /v1/models` lists."""

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_get("/", wire.health)  # NeMo Gym's readiness poll, if used directly
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        models = [{"id": self.model_id, "object": "model"}]
        return web.json_response({"object": "list", "data": models})

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.record:
            retry = request.headers.get("x-stainless-retry-count")
            self.calls.append(Call(request.headers.get("X-Session-ID"), body, retry))
        return await self.respond(body)

    async def respond(self, body: dict[str, Any]) -> web.Response:
        """The answer to one Responses request body."""
        raise NotImplementedError


def vllm_error(status: int, message: str) -> web.Response:
    """An error answer in vLLM's shape (`{"error": {...}, "object": "error"}`), what the train
    path's model servers (the token server, the generate adapter) answer like vLLM does."""
    kind = "BadRequestError" if status == 400 else "server_error"
    return web.json_response(
        {"error": {"message": message, "type": kind}, "object": "error"}, status=status
    )


def vllm_overlong(max_model_len: int, requested: int) -> web.Response:
    """vLLM's 400 for a prompt over the context, in its wording, so callers' overlong-prompt
    detection (`bridge.chat.is_overlong_prompt`) sees what it would see from vLLM."""
    return vllm_error(
        400,
        f"This model's maximum context length is {max_model_len} tokens. "
        f"However, you requested {requested} tokens in the messages.",
    )
