"""The deterministic token server under verifiers' REAL train client, and the GGUF tokenizer.

No stack starts. The model is the only double (`policies.token_server`); verifiers' `TrainClient`,
its renderer (with the tokenizer built from the packaged GGUF), its turn graph and trace are the
real ones. Each exchange goes the way the proxy's train mode will: NeMo Gym's Responses request
-> `responses_to_chat` -> train client -> `chat_to_responses` -> echoed by the agent -> next turn.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from renderers.configs import DefaultRendererConfig
from verifiers.v1 import SamplingConfig, graph
from verifiers.v1.clients.train import TrainClient
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.dialects.chat import ChatDialect
from verifiers.v1.errors import ProviderError
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import Response

from verifiers_nemogym.bridge.chat import chat_to_responses, is_overlong_prompt, responses_to_chat
from verifiers_nemogym.policies.gguf_tokenizer import TokenizerBuildError, tokenizer_dir
from verifiers_nemogym.policies.local_model import packaged_model_path
from verifiers_nemogym.policies.token_server import (
    MODEL,
    REASONING,
    SYNTHETIC_LOGPROB,
    TokenServer,
    packaged_tokenizer,
)

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}
# Qwen2.5's tool-call format, parsed back by renderers' Hermes parser; its reasoning as <think>.
RENDERER = DefaultRendererConfig(tool_parser="qwen3", reasoning_parser="think")


@pytest.fixture(scope="module")
def tokenizer_folder() -> Path:
    return tokenizer_dir(packaged_model_path())


@pytest.fixture(scope="module")
def tokenizer(tokenizer_folder: Path) -> Any:
    return packaged_tokenizer()


@pytest.fixture
async def server(tokenizer: Any) -> AsyncIterator[TokenServer]:
    async with TokenServer(tokenizer) as token_server:
        yield token_server


def _client(server: TokenServer, folder: Path) -> TrainClient:
    config = TrainClientConfig(
        base_url=server.base_url,
        api_key_var="VF_NEMOGYM_TEST_NO_KEY",
        renderer=RENDERER,
        renderer_model_name=str(folder),
    )
    return TrainClient(config)


def _trace() -> Trace:
    return Trace(task=TraceTask(type="test", data={}), agent=AgentInfo(config={}))


async def _turn(
    client: TrainClient, trace: Trace, request: dict[str, Any], sampling: SamplingConfig
) -> tuple[Response, graph.PendingTurn, dict[str, Any]]:
    """One model call as verifiers' interception server makes it; returns the Responses reply."""
    body = responses_to_chat(request)
    parsed = ChatDialect().parse_request(body)
    turn = graph.prepare_turn(trace, parsed.messages, parsed.tools)
    response = await client.get_response(ChatDialect(), body, sampling, turn=turn)
    turn.commit(response)
    assert response.raw is not None
    return response, turn, chat_to_responses(response.raw, request)


def _echo(request: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """The agent's next request: its input, the reply's items, a result per call."""
    items = [*request["input"], *reply["output"]]
    items += [
        {"type": "function_call_output", "call_id": item["call_id"], "output": '{"temp": 20}'}
        for item in reply["output"]
        if item["type"] == "function_call"
    ]
    return {**request, "input": items}


def test_gguf_tokenizer_is_qwens_and_cached(tokenizer_folder: Path, tokenizer: Any) -> None:
    # Ids Qwen2.5's own tokenizer gives (llama.cpp agrees).
    assert tokenizer.encode("Hello world") == [9707, 1879]
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    assert tokenizer.convert_tokens_to_ids(special) == [151643, 151644, 151645, 151657, 151658]
    text = 'Ünïcödé 12345 \n\n  spaces\t{"a": [1, 2]}<tool_call>x</tool_call>'
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.eos_token == "<|im_end|>" and "<tool_call>" in tokenizer.chat_template
    before = os.stat(tokenizer_folder / "tokenizer.json").st_mtime_ns
    assert tokenizer_dir(packaged_model_path()) == tokenizer_folder
    assert os.stat(tokenizer_folder / "tokenizer.json").st_mtime_ns == before  # reused


async def test_train_client_records_a_two_turn_tool_exchange(
    server: TokenServer, tokenizer_folder: Path
) -> None:
    client = _client(server, tokenizer_folder)
    trace = _trace()
    request = {
        "model": MODEL,
        "input": [
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": "What is the weather in Paris?"},
        ],
        "tools": [TOOL],
    }
    try:
        first, _, reply = await _turn(client, trace, request, SamplingConfig())
        assert [i["type"] for i in reply["output"]] == ["function_call"]
        call = reply["output"][0]
        assert call["name"] == "get_weather" and call["arguments"] == '{"city": "San Francisco"}'
        assert call["call_id"] == first.message.tool_calls[0].id
        second_request = _echo(request, reply)
        second, turn, final = await _turn(client, trace, second_request, SamplingConfig())
    finally:
        await client.close()
    # Turn 2's prompt found turn 1's assistant node (same message_hash): only the tool result
    # was new. renderers' DefaultRenderer (the model's own template) never bridges, it
    # re-renders; the re-rendered prompt still extends turn 1's exact tokens (checked below).
    assert [m.role for m in turn.tail] == ["tool"]
    assert second.tokens is not None and not second.tokens.bridged
    assert final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "Done: I looked it up for you."
    # One branch: turn 1 prompt + completion, tool result, turn 2 completion.
    (branch,) = trace.branches
    calls = server.calls
    assert len(calls) == 2
    first_prompt = calls[0].body["token_ids"]
    second_prompt = calls[1].body["token_ids"]
    assert second_prompt[: len(first_prompt) + len(calls[0].completion_ids)] == (
        first_prompt + calls[0].completion_ids
    )
    # Token streams are lists in verifiers 0.4.0 and numpy arrays in 0.4.1.dev: compare as lists.
    assert list(map(int, branch.token_ids)) == second_prompt + calls[1].completion_ids
    sampled = len(calls[0].completion_ids) + len(calls[1].completion_ids)
    assert sum(branch.sampled_mask) == sampled > 10
    assert len(branch.sampled_mask) == len(branch.token_ids)
    sampled_logprobs = [
        float(lp)
        for node in branch.nodes
        if node.sampled and node.logprobs is not None
        for lp in node.logprobs
    ]
    assert sampled_logprobs == [SYNTHETIC_LOGPROB] * sampled


@pytest.mark.parametrize("reasoning", [False, True])
async def test_parallel_calls_and_reasoning_stay_one_turn(
    server: TokenServer, tokenizer_folder: Path, reasoning: bool
) -> None:
    client = _client(server, tokenizer_folder)
    trace = _trace()
    trigger = "[tokens:parallel]" + ("[tokens:reasoning]" if reasoning else "")
    request = {
        "model": MODEL,
        "input": [{"role": "user", "content": f"Two cities {trigger}"}],
        "tools": [TOOL],
    }
    try:
        first, _, reply = await _turn(client, trace, request, SamplingConfig())
        kinds = [i["type"] for i in reply["output"]]
        assert kinds[-2:] == ["function_call", "function_call"]
        if reasoning:
            # The text between </think> and the calls ("\n\n") is the message's content.
            assert kinds == ["reasoning", "message", "function_call", "function_call"]
            assert REASONING in (first.message.reasoning_content or "")
        ids = [i["call_id"] for i in reply["output"] if i["type"] == "function_call"]
        assert ids == [c.id for c in first.message.tool_calls or []]
        _, turn, _ = await _turn(client, trace, _echo(request, reply), SamplingConfig())
    finally:
        await client.close()
    # The conversion is lossless: turn 2's prompt matched turn 1's assistant node by hash.
    assert [m.role for m in turn.tail] == ["tool", "tool"]
    # Qwen2.5's template drops past reasoning when it re-renders (and DefaultRenderer never
    # bridges), so with reasoning turn 2's tokens no longer extend turn 1's: verifiers starts a
    # second branch. A renderer that bridges (or keeps reasoning) is needed for one sample.
    assert len(trace.branches) == (2 if reasoning else 1)


async def test_length_finish_becomes_incomplete(
    server: TokenServer, tokenizer_folder: Path
) -> None:
    client = _client(server, tokenizer_folder)
    request = {"model": MODEL, "input": "Say a lot [tokens:length]", "max_output_tokens": 5}
    try:
        response, _, reply = await _turn(client, _trace(), request, SamplingConfig(max_tokens=5))
    finally:
        await client.close()
    assert response.finish_reason == "length"
    assert len(server.calls[0].completion_ids) == 5
    assert reply["status"] == "incomplete"
    assert reply["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_overlong_prompt_is_a_400_the_proxy_can_tell_apart(
    tokenizer: Any, tokenizer_folder: Path
) -> None:
    async with TokenServer(tokenizer, max_model_len=40) as server:
        client = _client(server, tokenizer_folder)
        request = {"model": MODEL, "input": "word " * 100}
        try:
            with pytest.raises(ProviderError) as raised:
                await _turn(client, _trace(), request, SamplingConfig())
        finally:
            await client.close()
    assert raised.value.status_code == 400
    assert server.calls == []  # refused before it was sent
    # What verifiers' interception server answers the harness with.
    assert is_overlong_prompt(400, ChatDialect().error_body(str(raised.value)))


@pytest.mark.parametrize("fault", ["500", "429"])
async def test_faults_are_errors(server: TokenServer, tokenizer_folder: Path, fault: str) -> None:
    client = _client(server, tokenizer_folder)
    request = {"model": MODEL, "input": f"hi [fault:{fault}]"}
    try:
        with pytest.raises(ProviderError) as raised:
            await _turn(client, _trace(), request, SamplingConfig())
    finally:
        await client.close()
    assert raised.value.status_code == int(fault)
    assert f"token server fault {fault}" in str(raised.value)
    assert server.faults == [fault] and server.calls == []


async def test_a_garbage_answer_is_an_error(server: TokenServer, tokenizer_folder: Path) -> None:
    """A 200 whose body is cut-off JSON: verifiers' train client fails parsing that very body
    (not some other error of the test's client), and nothing was generated."""
    client = _client(server, tokenizer_folder)
    request = {"model": MODEL, "input": "hi [fault:garbage]"}
    try:
        with pytest.raises(json.JSONDecodeError) as raised:
            await _turn(client, _trace(), request, SamplingConfig())
    finally:
        await client.close()
    assert raised.value.doc == '{"choices": ['
    assert server.faults == ["garbage"] and server.calls == []


def _gguf_header(pairs: dict[str, str]) -> bytes:
    """A GGUF v3 header holding only string key/values (type 8)."""

    def string(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(pairs))
    for key, value in pairs.items():
        out += string(key) + struct.pack("<I", 8) + string(value)
    return out


def test_gguf_tokenizer_bad_files_name_the_file(tmp_path: Path) -> None:
    cases = {
        "not.gguf": (b"NOPE" + bytes(20), "not a GGUF file"),
        "cut.gguf": (packaged_model_path().read_bytes()[:4096], "truncated or unreadable"),
        "llama.gguf": (
            _gguf_header({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default"}),
            "tokenizer 'llama'/'default' is not supported",
        ),
    }
    for name, (data, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(TokenizerBuildError, match=message) as raised:
            tokenizer_dir(path, cache=tmp_path / "cache")
        assert str(path) in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "cache").exists()  # nothing half-built is left behind


async def test_bad_generate_body_is_a_400(server: TokenServer) -> None:
    async with aiohttp.ClientSession() as session:
        url = server.base_url.removesuffix("/v1") + "/inference/v1/generate"
        async with session.post(url, json={"model": MODEL, "token_ids": "hi"}) as reply:
            assert reply.status == 400
            assert "token_ids" in (await reply.json())["error"]["message"]
    assert server.calls == []


async def test_answers_every_call_prime_rls_orchestrator_makes(tokenizer: Any) -> None:
    """The calls prime-rl 0.8.0's orchestrator makes on an inference server (its
    `utils/client.py`: `check_health`, `maybe_check_has_model`, `update_weights` with and without
    LoRA, `unload_lora_adapter`), made the same way: httpx on the base URL without `/v1`.
    While paused, a generate call waits for `/resume`."""
    import asyncio

    import httpx

    async with TokenServer(tokenizer, model="Qwen/Qwen2.5-0.5B-Instruct") as server:
        admin = httpx.AsyncClient(base_url=server.base_url.rstrip("/").removesuffix("/v1"))
        async with admin:
            assert (await admin.get("/health")).status_code == 200
            models = (await admin.get("/v1/models")).json()["data"]
            assert any(m["id"] == "Qwen/Qwen2.5-0.5B-Instruct" for m in models)
            paused = await admin.post("/pause", params={"mode": "keep", "clear_cache": "false"})
            paused.raise_for_status()
            assert server.paused
            ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            generate = asyncio.create_task(
                admin.post("/inference/v1/generate", json={"model": "m", "token_ids": ids})
            )
            await asyncio.sleep(0.3)
            assert not generate.done()  # queued while paused, as vLLM's mode=keep does
            (
                await admin.post("/update_weights", json={"weight_dir": "/w/step_1"})
            ).raise_for_status()
            (await admin.post("/resume")).raise_for_status()
            assert (await generate).status_code == 200
            lora = {"lora_name": "r8-step1", "lora_path": "/w/lora/step_1"}
            (await admin.post("/load_lora_adapter", json=lora)).raise_for_status()
            ids_listed = [m["id"] for m in (await admin.get("/v1/models")).json()["data"]]
            assert ids_listed == ["Qwen/Qwen2.5-0.5B-Instruct", "r8-step1"]
            unload = await admin.post("/v1/unload_lora_adapter", json={"lora_name": "r8-step1"})
            assert unload.status_code == 200
            assert (await admin.post("/load_lora_adapter", json={})).status_code == 400
            # prime-rl skips NCCL broadcast set-up on a 404: nothing to set up here.
            assert (await admin.post("/init_broadcaster", json={})).status_code == 404
    assert server.admin == [
        ("/pause", {"mode": "keep", "clear_cache": "false"}),
        ("/update_weights", {"weight_dir": "/w/step_1"}),
        ("/resume", {}),
        ("/load_lora_adapter", lora),
        ("/v1/unload_lora_adapter", {"lora_name": "r8-step1"}),
    ]
