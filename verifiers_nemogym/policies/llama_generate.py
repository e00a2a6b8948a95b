"""vLLM's token-in/token-out `POST /inference/v1/generate` in front of a llama.cpp server.

`GenerateAdapter` translates verifiers' train-client calls into llama.cpp's native
`POST /completion` (a token-id prompt, `return_tokens`, `n_probs: 1`), so the local CPU model
records real token ids and logprobs, answered in vLLM's shape; `GET /v1/models` reports
`max_model_len`, and a longer prompt gets vLLM's 400 wording. llama.cpp's truncating samplers are
off unless the request sets them, so the logprobs are those of the distribution sampled from
(docs/training.md, "Real-model tier"); `stop_token_ids` other than end-of-generation are not
applied (llama.cpp has no such option).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import aiohttp
from aiohttp import web

from verifiers_nemogym.net import AppServer
from verifiers_nemogym.policies.server import vllm_error, vllm_overlong

DEFAULT_MAX_TOKENS = 1024
"""Generated tokens at most when the request sets no `max_tokens` (llama.cpp's -1 would run to
the end of the context, which a small model looping on a tool call can do)."""


class GenerateAdapter(AppServer):
    """`/inference/v1/generate` -> llama.cpp `/completion` (module docstring). `async with`, or
    `start()`/`stop()`."""

    def __init__(
        self,
        upstream: str,
        model: str,
        max_model_len: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 3600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/").removesuffix("/v1")
        """The llama.cpp server's address (its `/v1` suffix, if given, is dropped)."""
        self.model = model
        self.max_model_len = max_model_len
        self.host = host
        self.port = port
        self.timeout = timeout
        self.calls = 0
        """Generate calls answered with tokens."""
        self._ids = itertools.count()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/v1/models", self._models)
        return app

    def _client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.timeout)

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def _generate(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return vllm_error(400, "body is not JSON")
        ids = body.get("token_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            return vllm_error(400, "token_ids: must be a non-empty list of integers")
        if len(ids) > self.max_model_len:
            return vllm_overlong(self.max_model_len, len(ids))
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            return vllm_error(400, "sampling_params: must be an object")
        completion = completion_request(ids, params, self.max_model_len)
        assert self._session is not None, "GenerateAdapter used before start()"
        try:
            async with self._session.post(f"{self.upstream}/completion", json=completion) as up:
                status, payload = up.status, await up.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            return vllm_error(502, f"llama.cpp server at {self.upstream} failed: {e!r}")
        if status != 200:
            return vllm_error(status, f"llama.cpp answered {status}: {_message(payload)}")
        try:
            choice = generate_choice(payload)
        except ValueError as e:
            return vllm_error(502, f"llama.cpp answer unusable: {e}")
        self.calls += 1
        return web.json_response(
            {
                "request_id": f"gen-{next(self._ids)}",
                "prompt_token_ids": ids,
                "choices": [choice],
            }
        )


def completion_request(ids: list[int], params: dict[str, Any], max_model_len: int) -> dict:
    """llama.cpp's `/completion` body for a prompt of token `ids` and vLLM `params`."""
    top_k = params.get("top_k")
    top_p = params.get("top_p")
    max_tokens = params.get("max_tokens") or DEFAULT_MAX_TOKENS
    body: dict[str, Any] = {
        "prompt": ids,
        "n_predict": max(1, min(max_tokens, max_model_len - len(ids))),
        "temperature": 1.0 if params.get("temperature") is None else params["temperature"],
        # Off unless asked for: llama.cpp's defaults would truncate the distribution.
        "top_k": top_k if isinstance(top_k, int) and top_k > 0 else 0,
        "top_p": top_p if top_p is not None else 1.0,
        "min_p": params.get("min_p") or 0.0,
        "n_probs": 1,
        "return_tokens": True,
        "cache_prompt": True,
        "stream": False,
    }
    if params.get("seed") is not None:
        body["seed"] = params["seed"]
    return body


def generate_choice(payload: Any) -> dict[str, Any]:
    """vLLM's `choices[0]` for llama.cpp's `/completion` answer; `ValueError` if it has no
    per-token ids and finite logprobs."""
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]
    if not isinstance(payload, dict):
        raise ValueError("not a completion object")
    probs = payload.get("completion_probabilities")
    if not isinstance(probs, list):
        raise ValueError("no completion_probabilities (was n_probs sent?)")
    tokens = [p.get("id") for p in probs if isinstance(p, dict)]
    logprobs = [p.get("logprob") for p in probs if isinstance(p, dict)]
    if tokens != payload.get("tokens"):
        raise ValueError("token ids and their probabilities disagree")
    finite: list[float] = []
    for lp in logprobs:
        if not isinstance(lp, int | float) or not math.isfinite(lp):
            raise ValueError("a logprob is missing or not finite")
        finite.append(float(lp))
    return {
        "index": 0,
        "token_ids": tokens,
        "logprobs": {
            "content": [
                {"token": f"token_id:{t}", "logprob": lp}
                for t, lp in zip(tokens, finite, strict=True)
            ]
        },
        "finish_reason": "length" if payload.get("stop_type") == "limit" else "stop",
    }


def _message(payload: Any) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))[:2000]
        return str(error or payload)[:2000]
    return str(payload)[:2000]
