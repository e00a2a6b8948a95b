"""A scripted judge: fixed verdicts on both of NeMo Gym's judge surfaces, for tests and demos.

NeMo Gym's judge environments find a label in the judge's text (`[[A=B]]`, `A`, `[[YES]]`, ...;
see docs/judges.md), so a fixed reply selects the verdict deterministically. `ScriptedJudge`
answers `POST /v1/responses` and `POST /v1/chat/completions` with `verdict` (settable while it
runs), records every call (`calls`: the body; `Call.prompt` is the first user message's text),
and can play the failures a judge has: with `key` set, a call without `Authorization: Bearer
<key>` gets 401; with `fail_status`, every call gets that status. Subclasses choose the reply
per call by overriding `verdict_for` (text, or an error answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from aiohttp import web

from verifiers_nemogym.bridge.responses import complete_response
from verifiers_nemogym.judge.relay import prompt_text
from verifiers_nemogym.policies.server import Call, ResponsesServer


@dataclass
class ScriptedJudge(ResponsesServer):
    """See the module contract."""

    verdict: str = "[[A=B]]"
    key: str | None = None
    fail_status: int | None = None
    chat_calls: int = 0
    """How many of `calls` came as Chat Completions."""
    model_id: ClassVar[str] = "scripted-judge"

    def _app(self) -> web.Application:
        app = super()._app()
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    def _refusal(self, request: web.Request) -> web.Response | None:
        if self.key is not None and request.headers.get("Authorization") != f"Bearer {self.key}":
            error = {"message": "invalid api key", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=401)
        if self.fail_status is not None:
            error = {"message": f"scripted judge fault {self.fail_status}", "type": "server_error"}
            return web.json_response({"error": error}, status=self.fail_status)
        return None

    async def _models(self, request: web.Request) -> web.Response:
        return self._refusal(request) or await super()._models(request)

    async def _responses(self, request: web.Request) -> web.Response:
        return self._refusal(request) or await super()._responses(request)

    def verdict_for(self, prompt: str) -> str | web.Response:
        """The reply to a judge call whose messages' texts, joined by newlines, are `prompt`
        (`prompt_text`): `verdict` here; a subclass may answer an error instead."""
        return self.verdict

    async def respond(self, body: dict[str, Any]) -> web.Response:
        verdict = self.verdict_for(prompt_text(body))
        if isinstance(verdict, web.Response):
            return verdict
        n = next(self._ids)
        item = {
            "type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": verdict, "annotations": []}],
        }  # fmt: skip
        reply = {
            "id": f"resp_{n}",
            "model": self.model_id,
            "output": [item],
            "usage": {"input_tokens": 100, "output_tokens": 3},
        }
        return web.json_response(complete_response(reply, body))

    async def _chat(self, request: web.Request) -> web.Response:
        if refused := self._refusal(request):
            return refused
        body = await request.json()
        if self.record:
            self.calls.append(Call(request.headers.get("X-Session-ID"), body))
        self.chat_calls += 1
        verdict = self.verdict_for(prompt_text(body))
        if isinstance(verdict, web.Response):
            return verdict
        n = next(self._ids)
        return web.json_response(
            {
                "id": f"chatcmpl-{n}",
                "object": "chat.completion",
                "created": 0,
                "model": self.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": verdict},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103},
            }
        )
