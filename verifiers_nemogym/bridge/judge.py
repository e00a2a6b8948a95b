"""The judge relay: the one door NeMo Gym's judge calls go through to the judge a user named.

Contract: `JudgeRelay(judge, key)` is a loopback aiohttp server with a random per-stack bearer
`token`. It answers NeMo Gym's readiness poll (`GET /`), lists the judge's model
(`GET /v1/models`) and forwards `POST /v1/responses` and `POST /v1/chat/completions` to the
judge's `base_url` with the real key, which therefore never enters NeMo Gym's config, command
lines or environment (NeMo Gym's judge block holds the relay's address and token instead).

- A call without the token is 401 before its body is read.
- Transient judge failures (connection errors, 408/409/429 honouring `Retry-After`, 5xx, a 200
  whose body is not JSON) are retried `ATTEMPTS` times in all with backoff; a judge that still
  fails, or any other 4xx, is answered with 424 and the judge's (redacted) message: a status
  NeMo Gym's client does not retry (it retries 429 and 5xx without end), so the rollout whose
  `/verify` asked becomes an error within a bounded time.
- `stats` counts calls, failures and tokens (NeMo Gym's judge calls carry no rollout, so these
  are per stack); `status` (`JudgeStatus`) keeps recent failures with their prompts, charged to
  the rollout whose question a failed prompt quotes; `preflight()` checks at start that the
  judge answers and takes the key.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from verifiers_nemogym.bridge import redact, wire
from verifiers_nemogym.bridge.responses import message_text
from verifiers_nemogym.errors import StackError
from verifiers_nemogym.net import LOOPBACK, AppServer

logger = logging.getLogger(__name__)

ATTEMPTS = 3
"""Tries per judge call (the first and two retries, as the OpenAI client does by default)."""
_BACKOFF = (1.0, 4.0)
_RETRY_AFTER_CAP = 30.0
_TRANSIENT = frozenset({408, 409, 429})
_MESSAGE_LIMIT = 500
PROMPT_KEPT = 256 * 1024
"""Characters of a failed judge call's prompt kept to charge the failure to its rollout."""
_FAILURES_KEPT = 256
_QUESTION_HEAD = 200
_MARK_MIN = 30
_MARKS = 5
_QUESTIONS_KEPT = 4096


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


@dataclass(frozen=True)
class Judge:
    """A judge endpoint without its key: what NeMo Gym's judge calls reach, and what a trace
    records as the judge that graded it. `key_var` names the environment variable holding the
    key ("" for a judge that needs none, e.g. the local model)."""

    base_url: str
    model: str
    api: Literal["chat", "responses"] = "chat"
    key_var: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra headers on every judge call; treated like the key (some providers put keys in
    headers): never in `public()` or `to_dict()`."""
    enable_optional: bool = False
    """Also turn on the judges NeMo Gym ships switched off (math_with_judge, polymath)."""
    timeout: float = 600.0
    """Seconds one judge call may take upstream."""

    def describe(self) -> str:
        return f"{self.model} at {self.base_url} ({self.api})"

    def public(self) -> dict[str, Any]:
        """What traces, logs and the shared stack's spec may hold (no key)."""
        return {"base_url": self.base_url, "model": self.model, "api": self.api}

    def identity(self, key: str | None) -> dict[str, Any]:
        """What makes two judges the same judge for a shared stack: the endpoint, a digest of
        the key (never the key), and which judges it turns on."""
        digest = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "none"
        headers = json.dumps(self.headers, sort_keys=True).encode()
        return {
            **self.public(),
            "headers_sha256": hashlib.sha256(headers).hexdigest()[:16],
            "key_sha256": digest,
            "enable_optional": self.enable_optional,
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field but `headers` (`from_dict` takes them back separately)."""
        return {
            "base_url": self.base_url, "model": self.model, "api": self.api,
            "key_var": self.key_var, "enable_optional": self.enable_optional,
            "timeout": self.timeout,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any], headers: dict[str, str] | None = None) -> Judge:
        return cls(**data, headers=dict(headers or {}))


def normal(text: str) -> str:
    """`text` with whitespace runs collapsed: how a question is looked for in a judge prompt
    (templates re-wrap and indent what they quote)."""
    return " ".join(text.split())


def question_of(params: dict[str, Any]) -> str:
    """The last user message's text of a row's `responses_create_params`: what a judge prompt
    quotes of the rollout it grades ("" if none)."""
    items = params.get("input")
    if isinstance(items, str):
        return items
    users = [i for i in items or [] if isinstance(i, dict) and i.get("role") == "user"]
    return message_text(users[-1].get("content")) if users else ""


@dataclass
class JudgeStatus:
    """The judge as the rollouts of a stack see it: who it is (`judge`), its recent failures
    (seconds since the epoch, message, the failed call's prompt) and the questions of recent
    rollouts, so that a failure is charged to the rollout whose question its prompt quotes.

    NeMo Gym's judge calls carry nothing else that ties them to a rollout. A failure whose
    prompt quotes no recent rollout's question cannot be charged to one: every rollout verified
    while it happened fails with it (an error, never the score NeMo Gym gave instead)."""

    judge: dict[str, Any]
    failures: collections.deque[tuple[float, str, str]] = field(
        default_factory=lambda: collections.deque(maxlen=_FAILURES_KEPT)
    )
    questions: dict[tuple[str, ...], None] = field(default_factory=dict)
    """Recent rollouts' questions (`marks`), oldest first (at most `_QUESTIONS_KEPT`)."""

    def failed(self, message: str, at: float | None = None, prompt: str = "") -> None:
        at = time.time() if at is None else at
        self.failures.append((at, message, normal(prompt)[:PROMPT_KEPT]))

    def running(self, question: str) -> tuple[str, ...]:
        """Note a rollout's question (before its `/run`); returns the marks it is known by."""
        found = marks(question)
        self.questions.pop(found, None)
        self.questions[found] = None
        while len(self.questions) > _QUESTIONS_KEPT:
            self.questions.pop(next(iter(self.questions)))
        return found

    def failure_for(self, since: float, question: tuple[str, ...]) -> str | None:
        """The message of a judge failure at or after `since` that is the rollout's with
        `question` (its `running` marks): the failed prompt quotes it, or quotes no recent
        rollout's question. None if there is none."""
        for at, message, prompt in reversed(self.failures):
            if at < since:
                break
            if _quotes(prompt, question):
                return message
            if not any(_quotes(prompt, q) for q in self.questions):
                return message
        return None


def marks(question: str) -> tuple[str, ...]:
    """What a judge prompt quotes of a question: its longest lines (whitespace collapsed, cut
    to `_QUESTION_HEAD`), at least `_MARK_MIN` characters each (an environment's instructions
    around the question are rarely quoted with it), else the whole question."""
    lines = sorted({normal(line)[:_QUESTION_HEAD] for line in question.splitlines()}, key=len)
    long = [line for line in lines if len(line) >= _MARK_MIN][-_MARKS:]
    whole = normal(question)[:_QUESTION_HEAD]
    return tuple(long) if long else ((whole,) if whole else ())


def _quotes(prompt: str, question: tuple[str, ...]) -> bool:
    return any(mark in prompt for mark in question)


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
    """See the module contract. `on_failure(message, prompt)` is told of every call that
    failed (`prompt`: the call's `prompt_text`)."""

    def __init__(
        self,
        judge: Judge,
        key: str | None,
        *,
        on_failure: Callable[[str, str], None] | None = None,
        backoff: tuple[float, float] = _BACKOFF,
    ) -> None:
        self.judge = judge
        self.host = LOOPBACK
        self.port = 0
        self.token = secrets.token_urlsafe(32)
        self.stats = JudgeStats()
        self.status = JudgeStatus(judge.public())
        self._key = key
        self._on_failure = on_failure
        self._backoff = backoff
        self._session: aiohttp.ClientSession | None = None

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=wire.MAX_BODY_BYTES)
        app.router.add_get("/", wire.health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/responses", self._forward)
        app.router.add_post("/v1/chat/completions", self._forward)
        return app

    def _secrets(self) -> list[str]:
        return [self.token, *([self._key] if self._key else []), *self.judge.headers.values()]

    async def start(self) -> None:
        for secret in self._secrets():
            redact.protect(secret)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.judge.timeout, sock_connect=30)
        )
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
            for secret in self._secrets():
                redact.forget(secret)

    def _headers(self) -> dict[str, str]:
        headers = {**self.judge.headers, "Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
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
        return hmac.compare_digest(claimed.encode("utf-8", "surrogateescape"), self.token.encode())

    async def _models(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return wire.json_error(401, "judge relay: missing or wrong token", "unauthorized")
        return web.json_response(
            {"object": "list", "data": [{"id": self.judge.model, "object": "model"}]}
        )

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if not self._authorised(request):
            return wire.json_error(401, "judge relay: missing or wrong token", "unauthorized")
        body = await request.read()
        path = request.path[len("/v1") :]
        self.stats.calls += 1
        problem = ""
        for attempt in range(ATTEMPTS):
            if attempt:
                self.stats.retries += 1
            status, payload, wait = await self._call(path, body)
            if status == 200:
                self._count_tokens(payload)
                return web.Response(body=payload, content_type="application/json")
            problem = _problem(status, payload)
            if wait is None or attempt == ATTEMPTS - 1:
                break
            await asyncio.sleep(wait if wait > 0 else self._pause(attempt))
        message = f"the judge {self.judge.describe()} failed: {problem}"
        try:
            prompt = prompt_text(json.loads(body))[:PROMPT_KEPT]
        except (ValueError, AttributeError):
            prompt = ""
        self.stats.failures += 1
        self.status.failed(message, prompt=prompt)
        logger.warning("%s", message)
        if self._on_failure is not None:
            self._on_failure(message, prompt)
        return wire.json_error(424, message, "judge_failed")

    async def _call(self, path: str, body: bytes) -> tuple[int, bytes, float | None]:
        """One try: (status, body, None if not worth retrying else the pause Retry-After asks
        for, 0 for the default backoff). Status 0 is a transport failure; 200 means a JSON
        answer."""
        assert self._session is not None
        try:
            async with self._session.post(
                self._upstream(path), data=body, headers=self._headers()
            ) as response:
                payload = await response.read()
                status = response.status
                asked = wire.retry_after(response.headers)
        except (aiohttp.ClientError, TimeoutError) as e:
            return 0, (str(e) or type(e).__name__).encode(), 0.0
        if status == 200:
            try:
                json.loads(payload)
            except ValueError:
                return -1, payload, 0.0
            return 200, payload, None
        if status in _TRANSIENT or status >= 500:
            # The wait the answer asks for, capped; 0 (the default backoff) if it asks none.
            return status, payload, min(_RETRY_AFTER_CAP, max(0.0, asked)) if asked else 0.0
        return status, payload, None

    def _pause(self, attempt: int) -> float:
        low, high = self._backoff
        return min(high, low * 2**attempt) * (0.5 + random.random() / 2)

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
