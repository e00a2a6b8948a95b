"""FixerPolicy: a scripted Chat Completions model that fixes container tasks the way a coding
agent would, in OpenCode's dialect: one `bash` tool call, then a final message.

For the container environments (swebench_pro, terminal_bench_2_1, the SWE family) run with
OpenCode inside the task's container: OpenCode builds the model calls itself, wrapping the row's
prompt in its own system prompt, so this server finds the task in the request instead. It
searches all the request's text (whitespace collapsed, case folded: `answer_key.request_text`)
for the `key` of a task of its table (`FixTask`: the task's problem statement or a marker in
it); the longest key found wins. Then, by the conversation so far:
- no `tool` message yet, and a `bash` tool offered: one `bash` tool call (arguments
  `{"command": ..., "description": ...}`, as OpenCode's `bash` tool takes them) running the
  task's `fix` command, or its `wrong` command (a real but useless edit) for the tasks chosen
  `wrong`, or for the tasks chosen `writer` the `wrong` command followed by `REWARD_WRITER` (a
  process left running in the background that keeps writing `WRITTEN_REWARD` to
  terminal_bench_2_1's reward file); finish_reason `tool_calls`;
- a `tool` message present (the command's result came back): a final plain assistant message,
  finish_reason `stop`, which ends OpenCode's loop;
- no known task, or no `bash` tool offered (OpenCode's title and summary calls): a short text.

Wire: `POST /v1/chat/completions`, also under any path prefix (`/ng-rollout/<rollout id>/v1/...`
as NeMo Gym's agents call it with rollout correlation on, or a proxy's prefix); any `model` is
accepted and echoed back. With `stream`, `chat.completion.chunk` events (the tool call as
`tool_calls` deltas: id, type and name first, then the arguments in pieces), a usage chunk when
`stream_options.include_usage`, then `data: [DONE]`. Also `GET /` (readiness) and
`GET /v1/models`. Any other path is recorded and answered 404; a body that is not a JSON object
is recorded and answered 400.

With `record` (the default) every call is kept in `calls` as a `FixerCall` (path, rollout id
from an `/ng-rollout/<id>/` path, the `X-Session-ID` header (any case), task, right or wrong,
step) before it is answered, so a test can prove which task and rollout every call belonged to.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeGuard

from aiohttp import web

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.answer_key import (
    KeyedPolicy,
    RecordedCall,
    jsonl_objects,
    pieces,
    random_id,
    recorded_call,
    request_text,
    sse,
)

Step = Literal["fix", "final", "side", "unknown"]
"""What a call was answered with: the `bash` tool call, the final message, a side call's short
text, or an error (unknown path, bad body)."""

SIDE_REPLY = "Fix the failing task"
"""The reply to a call with no known task or no `bash` tool (OpenCode's title call)."""
FINAL_REPLY = "I ran the command; the change is in place."
"""The final message once the tool result has come back."""
TOOL_NAME = "bash"

_ROLLOUT = re.compile(r"/ng-rollout/([^/]+)/")

WRITTEN_REWARD = "1000000"
"""What `REWARD_WRITER` writes: a reward no honest rollout earns (NeMo Gym's grader: 0 or 1)."""
REWARD_WRITER = (
    "nohup sh -c 'while :; do echo "
    + WRITTEN_REWARD
    + " > /logs/verifier/reward.txt; sleep .05; done' >/dev/null 2>&1 &"
)
"""A background loop the model leaves in its container, rewriting the reward file that
terminal_bench_2_1 (NeMo Gym 0.7.0) reads after running the tests in that same container."""


@dataclass(frozen=True)
class FixTask:
    """One task the fixer knows."""

    key: str
    """Text that identifies the task in a request: its problem statement, or a marker in it."""
    fix: str
    """Shell command (run by OpenCode's `bash` tool in the task's container) that fixes it."""
    wrong: str
    """Shell command making a real but useless edit (for the tasks chosen `wrong`)."""
    name: str = ""
    """A label for logs and call records."""


def load_fix_tasks(path: Path) -> list[FixTask]:
    """The tasks of a JSONL file (each line an object with string `key`, `fix`, `wrong` and
    optional `name`; blank lines skipped), in file order. ConfigError naming the file and line
    of anything else, or of a file without tasks."""
    tasks = []
    for number, row in jsonl_objects(path, "the fixer's tasks"):
        key, fix, wrong, name = (row.get(k) for k in ("key", "fix", "wrong", "name"))
        name = "" if name is None else name
        if not (_text(key) and _text(fix) and _text(wrong) and isinstance(name, str)):
            raise ConfigError(f"{path}:{number}: a fixer task needs strings `key`, `fix`, `wrong`")
        tasks.append(FixTask(key, fix, wrong, name))
    if not tasks:
        raise ConfigError(f"{path}: no tasks")
    return tasks


def _text(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and bool(value.strip())


@dataclass
class FixerCall(RecordedCall):
    """One call as the fixer saw it (`session_id`: the `X-Session-ID` header)."""

    rollout_id: str | None = None
    """NeMo Gym's rollout id, from an `/ng-rollout/<id>/...` path (None: a plain path)."""
    stream: bool = False
    task: int | None = None
    """Index in the table of the task the request carried (None: no known task)."""
    wrong: bool = False
    """Whether the task's `wrong` command was (or would have been) chosen."""
    writer: bool = False
    """Whether `REWARD_WRITER` was (or would have been) added to it."""
    step: Step = "unknown"
    command: str | None = None
    """The command of the `bash` tool call answered (step `fix`)."""


@dataclass
class FixerPolicy(KeyedPolicy):
    """Serve on `host:port` (0 = a free port); `base_url` ends in `/v1`. `async with`, or
    `start()`/`stop()`. See the module contract.

    `tasks`: the table (e.g. `load_fix_tasks(path)`); `wrong`: indices into `tasks` of those
    answered with their `wrong` command (ConfigError if one is not a task, or a task's key is
    blank); `writer`: indices of tasks answered with their `wrong` command and `REWARD_WRITER`
    (ConfigError if one is not a task). `calls` (typed: `log`) holds `FixerCall`s."""

    tasks: list[FixTask] = field(default_factory=list)
    writer: frozenset[int] = frozenset()
    model_id: ClassVar[str] = "fixer"
    answer_paths: ClassVar[tuple[str, ...]] = (
        "/v1/chat/completions",
        "/{prefix:.+}/v1/chat/completions",
    )
    models_paths: ClassVar[tuple[str, ...]] = ("/v1/models", "/{prefix:.+}/v1/models")
    key_names: ClassVar[tuple[str, str]] = ("tasks", "the table")

    def __post_init__(self) -> None:
        super().__post_init__()
        empty = [i for i, t in enumerate(self.tasks) if not t.key.strip()]
        if empty:
            raise ConfigError(f"fixer tasks {empty} have an empty key")
        if bad := sorted(i for i in self.writer if not 0 <= i < len(self.tasks)):
            raise ConfigError(f"writer tasks {bad} are not in the table (0..{len(self.tasks) - 1})")

    def keys(self) -> list[str]:
        return [t.key for t in self.tasks]

    def _call(self, request: web.Request, body: dict[str, Any], **fields: Any) -> FixerCall:
        rollout = _ROLLOUT.match(request.path)
        rollout_id = rollout.group(1) if rollout else None
        return recorded_call(FixerCall, request, body, rollout_id=rollout_id, **fields)

    @property
    def log(self) -> list[FixerCall]:
        """`calls`, typed: every call so far, in arrival order (empty without `record`)."""
        return [c for c in self.calls if isinstance(c, FixerCall)]

    def match(self, body: dict[str, Any]) -> int | None:
        """Index of the task whose key (the longest found) is in `body`'s text, or None."""
        return self._keys.find(request_text(body))

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if isinstance(body, web.Response):
            return body
        stream = body.get("stream") is True
        task = self.match(body)
        writer = task is not None and task in self.writer
        wrong = task is not None and (task in self.wrong or writer)
        step = _step(body, task)
        command = None
        if step == "fix" and task is not None:
            command = self.tasks[task].wrong if wrong else self.tasks[task].fix
            command = f"{command}; {REWARD_WRITER}" if writer else command
        self._record(self._call(request, body, stream=stream, task=task, wrong=wrong,
                                writer=writer, step=step, command=command))  # fmt: skip
        model = body["model"] if isinstance(body.get("model"), str) else self.model_id
        prompt_tokens = max(1, len(request_text(body)) // 4)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if command is not None:
            label = self.tasks[task].name if task is not None else ""
            arguments = json.dumps(
                {
                    "command": command,
                    "description": f"Apply the change{f' ({label})' if label else ''}",
                }
            )
            answer = _Answer(model, None, random_id("call"), arguments, prompt_tokens)
        else:
            answer = _Answer(model, FINAL_REPLY if step == "final" else SIDE_REPLY, None, "",
                             prompt_tokens)  # fmt: skip
        if not stream:
            return web.json_response(answer.completion())
        return await sse(request, ((None, c) for c in answer.chunks(include_usage)))


def _step(body: dict[str, Any], task: int | None) -> Step:
    """What to answer: `final` once a tool result is in the messages, `fix` for a known task
    with the `bash` tool offered, else `side`."""
    if task is None or not _offers_bash(body):
        return "side"
    messages = body.get("messages") or []
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
        return "final"
    return "fix"


def _offers_bash(body: dict[str, Any]) -> bool:
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == TOOL_NAME:
            return True
    return False


@dataclass(frozen=True)
class _Answer:
    """One answer: a text (`text`), or a `bash` tool call (`call_id`, `arguments`)."""

    model: str
    text: str | None
    call_id: str | None
    arguments: str
    prompt_tokens: int

    @property
    def finish(self) -> str:
        return "tool_calls" if self.call_id else "stop"

    def usage(self) -> dict[str, int]:
        out = max(1, len(self.text or self.arguments) // 4)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": out,
            "total_tokens": self.prompt_tokens + out,
        }

    def _tool_call(self) -> dict[str, Any]:
        function = {"name": TOOL_NAME, "arguments": self.arguments}
        return {"id": self.call_id, "type": "function", "function": function}

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.call_id:
            message["tool_calls"] = [self._tool_call()]
        return {
            "id": random_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": self.finish, "logprobs": None}
            ],
            "usage": self.usage(),
        }

    def chunks(self, include_usage: bool) -> Iterator[Any]:
        head = {"id": random_id("chatcmpl"), "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.model}  # fmt: skip

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**head, "choices": [choice]}

        if self.call_id:
            yield chunk({"role": "assistant", "content": None})
            first = {**self._tool_call(), "index": 0, "function": {"name": TOOL_NAME,
                                                                   "arguments": ""}}  # fmt: skip
            yield chunk({"tool_calls": [first]})
            for piece in pieces(self.arguments):
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        else:
            yield chunk({"role": "assistant", "content": ""})
            for piece in pieces(self.text or ""):
                yield chunk({"content": piece})
        yield chunk({}, self.finish)
        if include_usage:
            yield {**head, "choices": [], "usage": self.usage()}
        yield "[DONE]"
