"""AnswerKeyPolicy: a model server that answers math rows from their answer key, in the three
dialects a coding-agent CLI speaks, streaming or not.

For the harness environments (opencode_math, codex_math, claude_code_math, ...): the CLI builds
the model calls itself, wrapping the row's question in its own prompts, so no row metadata rides
along. This server finds the question in the request instead: it searches all the request's text
(messages, system, instructions, input) for a question of its answer key (rows of NeMo Gym JSONL
files: `question` + `expected_answer`, or Reasoning Gym's `answer`), compared with whitespace
collapsed and case folded; the longest question found wins. It answers
`\\boxed{<expected answer>}` (the answer's outer `\\(..\\)` or `$..$` delimiters dropped), or,
for the rows chosen `wrong`, `\\boxed{<a number that is not the answer>}`. A call with no known
question (a CLI's side calls: titles, summaries) gets a short plain-text reply. It never calls a
tool, so a CLI's loop ends after the answer.

Dialects (any `model` accepted and echoed back):
- `POST /v1/chat/completions`: Chat Completions; with `stream`, `chat.completion.chunk` events,
  a usage chunk when `stream_options.include_usage`, then `data: [DONE]`.
- `POST /v1/responses`: OpenAI Responses; with `stream`, `response.created` ...
  `response.output_text.delta` ... `response.completed`.
- `POST /v1/messages` (also `?beta=true`): Anthropic Messages; with `stream`, `message_start`,
  `content_block_start`, `content_block_delta` (text_delta), `content_block_stop`,
  `message_delta` (end_turn, usage), `message_stop`.
Also NeMo Gym's readiness poll (`GET /`) and `GET /v1/models`. Any other path is recorded and
answered 404, so a test sees a call the server does not know; a body that is not a JSON object
is recorded and answered 400.

With `record` (the default), every call is kept in `calls` as an `AnswerCall` (path, dialect,
stream flag, verifiers' `X-Session-ID`, the matched row, right or wrong, non-secret headers)
before it is answered: a test proves from it which row each call belonged to.

The dialects' wire formats are written here, not taken from the package's bridge: this double
is what the bridge is tested against, so it shares no code with it. What it shares with
`policies.fixer` (routes, recording, the 404 and 400 answers, the check of `wrong`) is
`KeyedPolicy`, its base, with `recorded_call`, `sse`, `pieces` and `random_id`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from aiohttp import web

from verifiers_nemogym.bridge import wire
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.server import Call, ResponsesServer

Dialect = Literal["chat", "responses", "messages", "unknown"]

SIDE_REPLY = "OK."
"""The reply to a call that carries no known question (a CLI's title or summary call)."""

WRONG = "-7919"
"""The deliberately wrong answer (`WRONG_ALTERNATIVE` if a row's answer happens to be this)."""
WRONG_ALTERNATIVE = "7919"

_SECRET_HEADERS = frozenset(
    {"authorization", "x-api-key", "api-key", "cookie", "proxy-authorization"}
)
_SPACE = re.compile(r"\s+")
_DIALECTS: dict[str, Dialect] = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


@dataclass(frozen=True)
class AnswerRow:
    """One row of the answer key."""

    question: str
    expected_answer: str


def jsonl_objects(path: Path, what: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """`(line number, object)` of each non-blank line of the JSONL file `path` (a line that is
    JSON but not an object gives `{}`, for the caller's own check); ConfigError naming the file
    (and line) if it cannot be read or a line is not JSON. `what`: the file's role, for errors."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{number}: not JSON ({e.msg})") from None
        yield number, row if isinstance(row, dict) else {}


def load_answer_key(path: Path) -> list[AnswerRow]:
    """The rows of a NeMo Gym JSONL file (each line an object with string `question` and
    `expected_answer`, or `answer` as the `*_reasoning_gym` environments' rows have it; blank
    lines skipped), in file order. Raises ConfigError naming the file
    and line of anything else, or of a file without rows."""
    rows = []
    for number, row in jsonl_objects(path, "the answer key"):
        question = row.get("question")
        answer = row.get("expected_answer", row.get("answer"))
        if not isinstance(question, str) or not question.strip() or not isinstance(answer, str):
            raise ConfigError(
                f"{path}:{number}: an answer-key row needs string `question` and "
                "`expected_answer` (or `answer`)"
            )
        rows.append(AnswerRow(question, answer))
    if not rows:
        raise ConfigError(f"{path}: no rows")
    return rows


def _normal(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value (a request's text, wherever the dialect keeps it)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


class LongestKey:
    """Which of several keys (questions, task statements) a request quotes: compared with
    whitespace collapsed and case folded (`request_text`), the longest key found wins, so a key
    that contains another (a tagged copy of a row) is told apart from it."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = sorted(((_normal(k), i) for i, k in enumerate(keys)), key=lambda k: -len(k[0]))

    def find(self, text: str) -> int | None:
        """The index of the longest key in `text` (already `request_text`'s form), or None."""
        return next((i for key, i in self._keys if key in text), None)


def request_text(body: dict[str, Any]) -> str:
    """All text of a request body, whitespace-collapsed and case-folded: messages, system,
    instructions and input of any dialect (tool definitions included, which is harmless)."""
    return _normal(" ".join(_strings({k: v for k, v in body.items() if k != "model"})))


def boxed(answer: str) -> str:
    """`\\boxed{answer}` with the answer's outer `\\(..\\)` / `$..$` delimiters dropped (inside
    `\\boxed{}` they would not parse as math)."""
    answer = answer.strip()
    if answer.startswith("\\(") and answer.endswith("\\)"):
        answer = answer[2:-2].strip()
    if len(answer) > 1 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return f"\\boxed{{{answer}}}"


@dataclass
class RecordedCall(Call):
    """One call as a `KeyedPolicy` saw it (`body`, `session_id` as in `Call`)."""

    path: str = ""
    """The request path (query string included, e.g. `/v1/messages?beta=true`)."""
    headers: dict[str, str] = field(default_factory=dict)
    """The request's headers, names lower-cased; credentials replaced by `<redacted>` (an
    `Authorization` scheme kept: `Bearer <redacted>`)."""


RecordedCallT = TypeVar("RecordedCallT", bound=RecordedCall)


def recorded_call(
    kind: type[RecordedCallT], request: web.Request, body: dict[str, Any], **fields: Any
) -> RecordedCallT:
    """`request` (its body `body`) recorded as a `kind`: its `X-Session-ID` (any case),
    `x-stainless-retry-count`, path and headers, then `fields`."""
    headers = {name.lower(): _shown(name.lower(), value) for name, value in request.headers.items()}
    return kind(
        session_id=request.headers.get("X-Session-ID"),  # case-insensitive lookup
        body=body,
        retry_count=request.headers.get("x-stainless-retry-count"),
        path=request.path_qs,
        headers=headers,
        **fields,
    )


@dataclass
class KeyedPolicy(ResponsesServer):
    """The base of the doubles that answer by which of their keys a request quotes
    (`AnswerKeyPolicy`'s questions, `policies.fixer`'s tasks; `keys()`, `LongestKey` finds
    them). Routes: `GET /`, `GET` each of `models_paths`, `POST` each of `answer_paths` (to
    `_answer`); any other path is recorded and answered 404, and `_json_body` records a body that
    is not a JSON object and answers 400. With `record`, `_record` keeps each call in `calls`
    (a `RecordedCall` of the subclass's kind, made by `_call`) before it is answered.

    `wrong`: indices of the keys answered wrong (ConfigError at construction if one is not a
    key, naming the keys as `key_names`, e.g. "rows" of "the answer key")."""

    wrong: frozenset[int] = frozenset()
    answer_paths: ClassVar[tuple[str, ...]] = ()
    models_paths: ClassVar[tuple[str, ...]] = ("/v1/models",)
    key_names: ClassVar[tuple[str, str]] = ("keys", "the table")
    # Calls held by a slow answer must not hold up shutdown.
    shutdown_timeout: ClassVar[float] = 1.0

    def __post_init__(self) -> None:
        keys = self.keys()
        bad = sorted(i for i in self.wrong if not 0 <= i < len(keys))
        if bad:
            what, where = self.key_names
            raise ConfigError(f"wrong {what} {bad} are not in {where} ({what} 0..{len(keys) - 1})")
        self._keys = LongestKey(keys)

    def keys(self) -> list[str]:
        """The texts a request is searched for, in index order."""
        raise NotImplementedError

    def _call(self, request: web.Request, body: dict[str, Any], **fields: Any) -> RecordedCall:
        """`request` as this server's kind of `RecordedCall`, with `fields`."""
        raise NotImplementedError

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_get("/", wire.health)
        for path in self.models_paths:
            app.router.add_get(path, self._models)
        for path in self.answer_paths:
            app.router.add_post(path, self._answer)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    def _record(self, call: RecordedCall) -> None:
        if self.record:
            self.calls.append(call)

    async def _unknown(self, request: web.Request) -> web.Response:
        self._record(self._call(request, {}))
        return web.json_response(
            {"error": {"message": f"no route {request.method} {request.path}"}}, status=404
        )

    async def _json_body(
        self, request: web.Request, **fields: Any
    ) -> dict[str, Any] | web.Response:
        """`request`'s body if it is a JSON object; else the 400 answer, the call recorded
        (an empty body, `fields`)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        if isinstance(body, dict):
            return body
        self._record(self._call(request, {}, **fields))
        return web.json_response({"error": {"message": "body is not a JSON object"}}, status=400)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError


@dataclass
class AnswerCall(RecordedCall):
    """One call as the answer-key server saw it."""

    dialect: Dialect = "unknown"
    stream: bool = False
    row: int | None = None
    """Index in the answer key of the question the request carried (None: no known question)."""
    wrong: bool = False
    """Whether it was answered deliberately wrong."""
    reply: str = ""
    """The text answered."""


@dataclass
class AnswerKeyPolicy(KeyedPolicy):
    """Serve on `host:port` (0 = a free port); `base_url` ends in `/v1`. `async with`, or
    `start()`/`stop()`. See the module contract.

    `rows`: the answer key (e.g. `load_answer_key(path)`), fixed at construction; `wrong`:
    indices into `rows` of the rows to answer wrong (ConfigError if one is not a row).
    `calls` (typed: `log`) holds `AnswerCall`s."""

    rows: list[AnswerRow] = field(default_factory=list)
    delay: float = 0.0
    """Seconds every answer waits after the call is recorded (a model that hangs, for tests
    of deadlines and interruptions)."""
    model_id: ClassVar[str] = "answer-key"
    answer_paths: ClassVar[tuple[str, ...]] = tuple(_DIALECTS)
    key_names: ClassVar[tuple[str, str]] = ("rows", "the answer key")

    def keys(self) -> list[str]:
        return [r.question for r in self.rows]

    def _call(self, request: web.Request, body: dict[str, Any], **fields: Any) -> AnswerCall:
        return recorded_call(AnswerCall, request, body, **fields)

    @property
    def log(self) -> list[AnswerCall]:
        """`calls`, typed: every call so far, in arrival order (empty without `record`)."""
        return [c for c in self.calls if isinstance(c, AnswerCall)]

    def match(self, body: dict[str, Any]) -> int | None:
        """Index of the longest answer-key question found in `body`'s text, or None."""
        return self._match(request_text(body))

    def _match(self, text: str) -> int | None:
        # opencode quotes the user's prompt inside its own with `"` escaped as `\"` (seen on
        # Reasoning Gym's questions, which quote what the inhabitants say).
        for candidate in (text, text.replace('\\"', '"')):
            found = self._keys.find(candidate)
            if found is not None:
                return found
        return None

    def answer(self, row: int | None) -> str:
        """The text answered for answer-key row `row` (None: a side call)."""
        if row is None:
            return SIDE_REPLY
        expected = self.rows[row].expected_answer
        if row not in self.wrong:
            return boxed(expected)
        return boxed(WRONG_ALTERNATIVE if boxed(expected) == boxed(WRONG) else WRONG)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        dialect = _DIALECTS[request.path]
        body = await self._json_body(request, dialect=dialect)
        if isinstance(body, web.Response):
            return body
        stream = body.get("stream") is True
        text_in = request_text(body)
        row = self._match(text_in)
        text = self.answer(row)
        wrong = row is not None and row in self.wrong
        self._record(self._call(request, body, dialect=dialect, stream=stream, row=row,
                                wrong=wrong, reply=text))  # fmt: skip
        if self.delay:
            await asyncio.sleep(self.delay)
        model = body["model"] if isinstance(body.get("model"), str) else self.model_id
        usage = _Usage(max(1, len(text_in) // 4), max(1, len(text) // 4))
        if dialect == "chat":
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            if not stream:
                return web.json_response(_chat(model, text, usage))
            return await sse(request, _chat_events(model, text, usage, include_usage))
        if dialect == "responses":
            if not stream:
                return web.json_response(_response(model, text, usage, body))
            return await sse(request, _responses_events(model, text, usage, body))
        if not stream:
            return web.json_response(_message(model, text, usage))
        return await sse(request, _messages_events(model, text, usage))


def _shown(name: str, value: str) -> str:
    """A header's value as recorded: a credential's replaced (an auth scheme word kept)."""
    if name not in _SECRET_HEADERS:
        return value
    scheme, _, rest = value.partition(" ")
    return f"{scheme} <redacted>" if rest and scheme.isalpha() else "<redacted>"


@dataclass(frozen=True)
class _Usage:
    """Rough token counts (about four characters a token): CLIs want numbers, not accuracy."""

    input: int
    output: int


def random_id(prefix: str) -> str:
    """`<prefix>_` and 24 random hex digits (an id of a completion, response, call...)."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


async def sse(request: web.Request, events: Iterable[tuple[str | None, Any]]) -> web.StreamResponse:
    """Write `events` as Server-Sent Events: `event: NAME` (when named) and `data: JSON` (or a
    literal string such as `[DONE]`), each followed by a blank line."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data)
        frame = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
        await response.write(frame.encode())
    await response.write_eof()
    return response


# Chat Completions


def _chat(model: str, text: str, usage: _Usage) -> dict[str, Any]:
    return {
        "id": random_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": _chat_usage(usage),
    }


def _chat_usage(usage: _Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input,
        "completion_tokens": usage.output,
        "total_tokens": usage.input + usage.output,
    }


def _chat_events(
    model: str, text: str, usage: _Usage, include_usage: bool
) -> Iterator[tuple[str | None, Any]]:
    head = {
        "id": random_id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**head, "choices": [choice]}

    yield None, chunk({"role": "assistant", "content": ""}, None)
    for piece in pieces(text):
        yield None, chunk({"content": piece}, None)
    yield None, chunk({}, "stop")
    if include_usage:
        yield None, {**head, "choices": [], "usage": _chat_usage(usage)}
    yield None, "[DONE]"


def pieces(text: str) -> list[str]:
    """`text` in a few deltas, as a streaming model sends it (at least one)."""
    size = max(1, -(-len(text) // 3))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# Responses


def _response_usage(usage: _Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.input,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.input + usage.output,
    }


def _response(
    model: str,
    text: str,
    usage: _Usage,
    request: dict[str, Any],
    *,
    response_id: str | None = None,
    item_id: str | None = None,
    done: bool = True,
) -> dict[str, Any]:
    """A Responses object: `done`, completed with the message; else in progress, no output."""
    message = {
        "type": "message",
        "id": item_id or random_id("msg"),
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return {
        "id": response_id or random_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if done else "in_progress",
        "model": model,
        "output": [message] if done else [],
        "usage": _response_usage(usage) if done else None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "metadata": request.get("metadata") or {},
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": request.get("temperature"),
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p"),
    }


def _responses_events(
    model: str, text: str, usage: _Usage, request: dict[str, Any]
) -> Iterator[tuple[str | None, Any]]:
    response_id, item_id = random_id("resp"), random_id("msg")
    started = _response(model, text, usage, request, response_id=response_id, done=False)
    final = _response(model, text, usage, request, response_id=response_id, item_id=item_id)
    message = final["output"][0]
    part = {"type": "output_text", "text": "", "annotations": []}
    at = {"item_id": item_id, "output_index": 0, "content_index": 0}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
        (
            "response.output_item.added",
            {"output_index": 0, "item": {**message, "status": "in_progress", "content": []}},
        ),
        ("response.content_part.added", {**at, "part": part}),
        *(("response.output_text.delta", {**at, "delta": p}) for p in pieces(text)),
        ("response.output_text.done", {**at, "text": text}),
        ("response.content_part.done", {**at, "part": {**part, "text": text}}),
        ("response.output_item.done", {"output_index": 0, "item": message}),
        ("response.completed", {"response": final}),
    ]
    for number, (name, data) in enumerate(events):
        yield name, {"type": name, "sequence_number": number, **data}


# Anthropic Messages


def _message(model: str, text: str, usage: _Usage) -> dict[str, Any]:
    return {
        "id": random_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": usage.input, "output_tokens": usage.output},
    }


def _messages_events(model: str, text: str, usage: _Usage) -> Iterator[tuple[str | None, Any]]:
    started = {
        **_message(model, text, usage),
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": usage.input, "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": started}
    block = {"type": "content_block_start", "index": 0}
    yield "content_block_start", {**block, "content_block": {"type": "text", "text": ""}}
    for piece in pieces(text):
        delta = {"type": "content_block_delta", "index": 0}
        yield "content_block_delta", {**delta, "delta": {"type": "text_delta", "text": piece}}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": usage.output},
        },
    )
    yield "message_stop", {"type": "message_stop"}
