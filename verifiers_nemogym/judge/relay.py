"""The judge relay: the one door NeMo Gym's judge calls go through to the judge a user named.

`JudgeRelay(judge)` is a loopback server with a per-stack bearer `token` that forwards NeMo Gym's
judge calls with the judge's key, which so never enters NeMo Gym's config, command lines or
environment; it retries as `JUDGE_RETRY` says and answers a lasting failure 424, which NeMo Gym
does not retry, so the rollout becomes an error in bounded time. Failed calls become
`JudgeFailure`s (docs/judges.md).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from verifiers_nemogym.bridge import redact, wire
from verifiers_nemogym.bridge.responses import message_text
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import PROMPT_KEPT, JudgeFailure, JudgeStatus
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.net import LOOPBACK, AppServer, forward
from verifiers_nemogym.retry import RetryPolicy

logger = logging.getLogger(__name__)

JUDGE_RETRY = RetryPolicy(
    max_retry_after=30.0, clamp_retry_after=True, transient=frozenset({408, 409, 429})
)
"""The OpenAI SDK's curve, with two differences. A 409 is retried (a judge endpoint's conflict
is a provider hiccup; only the model proxy's upstream, verifiers' interception, answers 409 for
a finished rollout). A `Retry-After` over 30 s is waited for 30 s, then tried anyway: the
rollout has already run and waits on its `/verify`, and giving up would make it an error."""
_MESSAGE_LIMIT = 500
NO_TOKEN = "judge relay: missing or wrong token"


def prompt_text(body: dict[str, Any]) -> str:
    """A judge call's prompt as one string: the texts of its messages (Responses `instructions`
    and `input`, or Chat Completions `messages`), joined by newlines. The same for a Responses
    call and the Chat Completions call NeMo Gym's `inference_provider` converts it into."""
    texts: list[str] = []
    if isinstance(body.get("instructions"), str):
        texts.append(body["instructions"])
    items = body.get("input", body.get("messages"))
    if isinstance(items, str):
        texts.append(items)
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and "content" in item:
            texts.append(message_text(item["content"]))
    return "\n".join(texts)


@dataclass
class JudgeStats:
    calls: int = 0
    failures: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def summary(self) -> str:
        return (
            f"{self.calls} calls, {self.failures} failed, {self.retries} retried, "
            f"{self.prompt_tokens} prompt + {self.completion_tokens} completion tokens"
        )


class JudgeRelay(AppServer):
    """Answers `GET /` (readiness) and the judge's model list, and forwards `POST /v1/responses`
    and `/v1/chat/completions`; a call without `token` is 401 before its body is read. `stats`
    counts calls, failures and tokens; each failed call is kept in `status` and handed to
    `on_failure`; `preflight()` checks at start that the judge answers and takes the key."""

    def __init__(
        self,
        judge: Judge,
        *,
        on_failure: Callable[[JudgeFailure], None] | None = None,
        retry: RetryPolicy = JUDGE_RETRY,
    ) -> None:
        self.judge = judge
        self.host = LOOPBACK
        self.port = 0
        self.token = secrets.token_urlsafe(32)
        self.stats = JudgeStats()
        self.status = JudgeStatus(judge.public())
        self._on_failure = on_failure
        self._retry = retry
        self._bodies = wire.BodyReader()

    def _gate(self) -> wire.ConnectionGate:
        return self._bodies.gate

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES)
        app.router.add_get("/", wire.health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/responses", self._forward)
        app.router.add_post("/v1/chat/completions", self._forward)
        return app

    def _secrets(self) -> list[str]:
        return [self.token, *self.judge.secret_values()]

    def _client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.judge.timeout, sock_connect=30)

    async def start(self) -> None:
        for secret in self._secrets():
            redact.protect(secret)
        await super().start()

    async def stop(self) -> None:
        started = self._session is not None  # what `start()` protected, once
        await super().stop()
        for secret in self._secrets() if started else []:
            redact.forget(secret)

    def _headers(self) -> dict[str, str]:
        headers = {**self.judge.headers, "Content-Type": "application/json"}
        if self.judge.key:
            headers["Authorization"] = f"Bearer {self.judge.key}"
        return headers

    def _upstream(self, path: str) -> str:
        return self.judge.base_url.rstrip("/") + path

    async def preflight(self) -> None:
        """Check that the judge answers and accepts the key (`GET <base_url>/models`); a
        refused key or an unreachable judge is a StackError naming the judge. An endpoint
        without a model list (404) passes: the first judge call will tell."""
        assert self._session is not None, "start() first"
        url = self._upstream("/models")
        try:
            async with self._session.get(
                url, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                body = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as e:
            why = redact.cut(str(e) or type(e).__name__, _MESSAGE_LIMIT)
            raise StackError(f"the judge {self.judge.describe()} does not answer: {why}") from None
        if status in (401, 403):
            how = f"the key in ${self.judge.key_var}" if self.judge.key_var else "no key"
            raise StackError(
                f"the judge {self.judge.describe()} refused {how} ({status}: {_message(body)})"
            )

    def _authorised(self, request: web.Request) -> bool:
        auth = request.headers.get("Authorization", "")
        claimed = auth[7:] if auth.startswith("Bearer ") else ""
        return self._is_token(claimed.encode("utf-8", "surrogateescape"))

    def _is_token(self, claimed: bytes) -> bool:
        return hmac.compare_digest(claimed, self.token.encode())

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return wire.json_error(401, NO_TOKEN, "unauthorized")
        return web.json_response(
            {"object": "list", "data": [{"id": self.judge.model, "object": "model"}]}
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        # The token is a header: a call without it is refused before its body is read.
        read = await self._bodies.read(
            request, self._is_token, in_body=False, unauthorized=NO_TOKEN
        )
        if read.refusal is not None:
            return read.refusal
        body = read.raw
        path = request.path[len("/v1") :]
        self.stats.calls += 1
        attempt = 0
        while True:
            status, payload, asked = await self._call(path, body)
            if status == 200:
                self._count_tokens(payload)
                return web.Response(body=payload, content_type="application/json")
            # Status 0 (no answer) and -1 (not JSON) are transient too.
            transient = status <= 0 or self._retry.is_transient(status)
            wait = self._retry.delay(attempt, asked) if transient else None
            if wait is None:
                break
            self.stats.retries += 1
            attempt += 1
            await asyncio.sleep(wait)
        message = f"the judge {self.judge.describe()} failed: {_problem(status, payload)}"
        try:
            prompt = prompt_text(json.loads(body))[:PROMPT_KEPT]
        except (ValueError, AttributeError):
            prompt = ""
        failure = JudgeFailure.now(message, prompt)
        self.stats.failures += 1
        self.status.failed(failure)
        logger.warning("%s", message)
        if self._on_failure is not None:
            self._on_failure(failure)
        return wire.json_error(424, message, "judge_failed")

    async def _call(self, path: str, body: bytes) -> tuple[int, bytes, float | None]:
        """One try: (status, body, the wait the answer's `Retry-After` asks for, if any).
        Status 0 is a transport failure, -1 a 200 whose body is not JSON."""
        assert self._session is not None
        try:
            answer = await forward(self._session, self._upstream(path), body, self._headers())
        except (aiohttp.ClientError, TimeoutError) as e:
            return 0, (str(e) or type(e).__name__).encode(), None
        if answer.status == 200:
            try:
                json.loads(answer.body)
            except ValueError:
                return -1, answer.body, None
        return answer.status, answer.body, wire.retry_after(answer.headers)

    def _count_tokens(self, payload: bytes) -> None:
        try:
            usage = json.loads(payload).get("usage") or {}
        except (ValueError, AttributeError):
            return
        if not isinstance(usage, dict):
            return
        prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
        completion = usage.get("completion_tokens", usage.get("output_tokens", 0))
        self.stats.prompt_tokens += prompt if isinstance(prompt, int) else 0
        self.stats.completion_tokens += completion if isinstance(completion, int) else 0


def _message(payload: bytes) -> str:
    """The error message of an OpenAI-style error body, else the body's start (redacted)."""
    try:
        text = wire.error_message(json.loads(payload))
    except ValueError:
        text = ""
    text = text or payload[: _MESSAGE_LIMIT * 4].decode("utf-8", "replace")
    return redact.cut(text.strip(), _MESSAGE_LIMIT) or "(no message)"


def _problem(status: int, payload: bytes) -> str:
    if status == 0:
        return f"no answer ({_message(payload)})"
    if status == -1:
        return "an answer that is not JSON"
    return f"{status}: {_message(payload)}"
