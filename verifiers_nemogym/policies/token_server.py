"""A deterministic token-in/token-out model server: vLLM's `POST /inference/v1/generate`, scripted.

The training counterpart of `policies.scripted`: it decodes the prompt's token ids with an
injected tokenizer (`packaged_tokenizer()`: the one built from the packaged GGUF), decides what to
say as the scripted policy does, and encodes the answer in the model's own tool-call format
(Qwen2.5/Hermes `<tool_call>`). Token ids are real; **logprobs are synthetic**
(`SYNTHETIC_LOGPROB` for every token).

Triggers in the prompt's first user message: `[tokens:parallel]` (two calls in one turn),
`[tokens:reasoning]` (a `<think>` block first), `[tokens:length]` (`max_tokens` filler,
`finish_reason: "length"`), and `policies.scripted`'s `[fault:STATUS]`, `[fault:garbage]` and
`[fault:MODExN]`; answered faults are kept in `faults`. With `max_model_len` set, `GET /v1/models`
reports it and a longer prompt gets vLLM's 400.

It also answers the control calls prime-rl's orchestrator makes, each kept in `admin`
(docs/training.md). Run alone: `nemo-gym-env serve tokens --port 8000`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from verifiers_nemogym.net import AppServer
from verifiers_nemogym.policies.scripted import ANSWER, fault_mode, tool_arguments
from verifiers_nemogym.policies.server import vllm_error, vllm_overlong

SYNTHETIC_LOGPROB = -0.5
"""The logprob reported for every generated token: synthetic, not a model's probability."""
REASONING = "I should use the tools I was given."
FILLER = " more"
MODEL = "token-server"

_TRIGGER = re.compile(r"\[(tokens|fault):(\w+)\]")
_TOOLS = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)


@dataclass
class GenerateCall:
    """One `/inference/v1/generate` call as the server saw it."""

    body: dict[str, Any]
    prompt: str
    """The prompt token ids, decoded (special tokens kept)."""
    completion_ids: list[int]


def packaged_tokenizer() -> Any:
    """The packaged model's tokenizer, built from its GGUF once (cached), loaded offline."""
    from renderers.base import load_tokenizer

    from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
    from verifiers_nemogym.policies.local_model import packaged_model_path

    return load_tokenizer(str(tokenizer_dir(packaged_model_path())))


def prompt_tools(prompt: str) -> list[dict[str, Any]]:
    """The function tools a ChatML/Qwen prompt declares (one JSON object per line in <tools>)."""
    found = _TOOLS.search(prompt)
    tools = []
    for line in found.group(1).splitlines() if found else []:
        with contextlib.suppress(json.JSONDecodeError):
            tool = json.loads(line)
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                tools.append(function)
    return tools


def first_user_text(prompt: str) -> str:
    """The first user turn's text in a ChatML prompt ("" if none)."""
    for role, text in _TURN.findall(prompt):
        if role == "user" and not text.startswith("<tool_response>"):
            return text
    return ""


@dataclass
class TokenServer(AppServer):
    """Serve on `host:port` (0 = a free port); `base_url` ends in `/v1` like vLLM's. `async
    with`, or `start()`/`stop()`."""

    tokenizer: Any
    host: str = "127.0.0.1"
    port: int = 0
    model: str = MODEL
    max_model_len: int | None = None
    """Reported by `GET /v1/models`; longer prompts get a 400. `None`: no limit."""
    default_max_tokens: int = 16
    """Filler length for `[tokens:length]` when the request sets no `max_tokens`."""
    calls: list[GenerateCall] = field(default_factory=list)
    """Calls answered normally."""
    faults: list[str] = field(default_factory=list)
    """The trigger (e.g. `503x2`) of every call answered with a fault, in order."""
    admin: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every control call (`/pause`, `/resume`, `/update_weights`, LoRA loads), in order, with
    its query parameters and JSON body merged."""
    adapters: dict[str, str] = field(default_factory=dict)
    """Loaded LoRA adapters: name -> path (listed by `/v1/models`)."""
    _faulted: collections.Counter[str] = field(default_factory=collections.Counter)
    _ids: itertools.count = field(default_factory=itertools.count)
    _running: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1024**3)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        for path in ("/pause", "/resume", "/update_weights", "/load_lora_adapter",
                     "/v1/unload_lora_adapter"):  # fmt: skip
            app.router.add_post(path, self._control)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _models(self, request: web.Request) -> web.Response:
        card: dict[str, Any] = {"id": self.model, "object": "model"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        loras = [{"id": name, "object": "model", "root": path, "parent": self.model}
                 for name, path in self.adapters.items()]  # fmt: skip
        return web.json_response({"object": "list", "data": [card, *loras]})

    async def _control(self, request: web.Request) -> web.Response:
        body: Any = {}
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return vllm_error(400, f"{request.path}: the body is not JSON")
        if not isinstance(body, dict):
            return vllm_error(400, f"{request.path}: the body must be a JSON object")
        path = request.path
        if path == "/load_lora_adapter":
            name, where = body.get("lora_name"), body.get("lora_path")
            if not isinstance(name, str) or not isinstance(where, str):
                return vllm_error(400, "load_lora_adapter: lora_name and lora_path are required")
            self.adapters[name] = where
        elif path == "/v1/unload_lora_adapter":
            if self.adapters.pop(str(body.get("lora_name")), None) is None:
                return vllm_error(404, f"no LoRA adapter {body.get('lora_name')!r} is loaded")
        elif path == "/pause":
            self._running.clear()
        elif path == "/resume":
            self._running.set()
        self.admin.append((path, {**request.query, **body}))
        return web.json_response({})

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._running.wait()  # paused: queued until /resume
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            return vllm_error(400, "token_ids: must be a list of integers")
        if self.max_model_len is not None and len(ids) > self.max_model_len:
            return vllm_overlong(self.max_model_len, len(ids))
        prompt = self.tokenizer.decode(ids, skip_special_tokens=False)
        found = [(m.group(1), m.group(2)) for m in _TRIGGER.finditer(first_user_text(prompt))]
        triggers = {name for kind, name in found if kind == "tokens"}
        for trigger in (name for kind, name in found if kind == "fault"):
            mode = fault_mode(trigger, self._faulted)
            if mode is not None and mode.isdigit() and 400 <= int(mode) <= 599:
                self.faults.append(trigger)
                return vllm_error(int(mode), f"token server fault {mode}")
            if mode == "garbage":
                self.faults.append(trigger)
                return web.Response(body=b'{"choices": [', content_type="application/json")
        params = body.get("sampling_params") or {}
        completion, finish = self.completion(prompt, triggers, params)
        self.calls.append(GenerateCall(body, prompt, completion))
        logprobs = [{"token": f"token_id:{i}", "logprob": SYNTHETIC_LOGPROB} for i in completion]
        return web.json_response(
            {
                "request_id": f"gen-{next(self._ids)}",
                "prompt_token_ids": ids,
                "choices": [
                    {
                        "index": 0,
                        "token_ids": completion,
                        "logprobs": {"content": logprobs},
                        "finish_reason": finish,
                    }
                ],
            }
        )

    def completion(
        self, prompt: str, triggers: set[str], params: dict[str, Any]
    ) -> tuple[list[int], str]:
        """The completion token ids and finish reason for a decoded prompt (deterministic)."""
        encode = self._encode
        if "length" in triggers:
            limit = params.get("max_tokens") or self.default_max_tokens
            ids: list[int] = []
            while len(ids) < limit:
                ids += encode(FILLER)
            return ids[:limit], "length"
        text = f"<think>\n{REASONING}\n</think>\n\n" if "reasoning" in triggers else ""
        tools = prompt_tools(prompt)
        if tools and "<tool_response>" not in prompt:
            calls = 2 if "parallel" in triggers else 1
            call = json.dumps({"name": tools[0]["name"], "arguments": tool_arguments(tools[0])})
            text += "\n".join(f"<tool_call>\n{call}\n</tool_call>" for _ in range(calls))
        else:
            text += ANSWER
        stops = params.get("stop_token_ids") or [self.tokenizer.eos_token_id]
        return [*encode(text), stops[0]], "stop"

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))
