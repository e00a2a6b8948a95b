"""Train mode's Anthropic Messages <-> Chat Completions conversion (bridge/anthropic.py), checked
against the `anthropic` SDK's own types for what goes back to a Messages client."""

from __future__ import annotations

import json
import re

import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

from verifiers_nemogym.bridge.anthropic import chat_to_message, message_events, messages_to_chat
from verifiers_nemogym.bridge.chat import ChatConversionError

TOOLS = [
    {
        "name": "Bash",
        "description": "Run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
# What claude_code sends on its second turn: a cached system prompt, tools, a tool round trip.
REQUEST = {
    "model": "policy",
    "max_tokens": 4096,
    "temperature": 0.5,
    "stream": True,
    "system": [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": TOOLS,
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    "metadata": {"user_id": "u"},
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "compute it", "signature": ""},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "Bash",
                    "input": {"command": "echo 42"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "42"}],
                },
                {"type": "text", "text": "Answer now.", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ],
}


def test_a_claude_code_request_becomes_the_same_chat_request() -> None:
    body = messages_to_chat(REQUEST)
    assert body["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\nBe brief."},
        {"role": "user", "content": "What is 6*7?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "compute it",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command": "echo 42"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
        {"role": "user", "content": "Answer now."},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "parameters": TOOLS[0]["input_schema"],
                "description": "Run a command",
            },
        }
    ]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is False
    assert (body["max_tokens"], body["temperature"], body["model"]) == (4096, 0.5, "policy")
    assert "stream" not in body and "metadata" not in body
    assert REQUEST["messages"][1]["content"][2]["input"] == {"command": "echo 42"}  # unchanged


@pytest.mark.parametrize(
    ("block", "where"),
    [
        ({"type": "image", "source": {"type": "base64", "data": "x"}}, "messages[0].content[0]"),
        ({"type": "document", "source": {}}, "messages[0].content[0]"),
    ],
)
def test_what_has_no_chat_form_is_refused_naming_it(block: dict, where: str) -> None:
    with pytest.raises(ChatConversionError, match=re.escape(f"request.{where}")):
        messages_to_chat({"messages": [{"role": "user", "content": [block]}]})
    signed = {"type": "thinking", "thinking": "t", "signature": "sig"}
    with pytest.raises(ChatConversionError, match="thinking"):
        messages_to_chat({"messages": [{"role": "assistant", "content": [signed]}]})
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    with pytest.raises(ChatConversionError, match=r"request\.tools\[0\]"):
        messages_to_chat({"messages": [], "tools": [server_tool]})


def test_a_chat_reply_becomes_a_message_and_its_events_the_sdk_reads() -> None:
    reply = {
        "id": "chatcmpl-1",
        "model": "policy",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Checking.",
                    "reasoning_content": "think",
                    "tool_calls": [
                        {"id": "call_9", "type": "function",
                         "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
    }  # fmt: skip
    message = chat_to_message(reply, REQUEST)
    parsed = Message.model_validate(message)  # the SDK's own type
    assert [b.type for b in parsed.content] == ["thinking", "text", "tool_use"]
    assert parsed.content[2].input == {"command": "ls"} and parsed.content[2].id == "call_9"
    assert (parsed.stop_reason, parsed.usage.input_tokens, parsed.usage.output_tokens) == (
        "tool_use",
        11,
        7,
    )
    events = [
        json.loads(line[6:])
        for line in message_events(message).decode().splitlines()
        if line.startswith("data: ")
    ]
    adapter = pydantic.TypeAdapter(RawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event)
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas[1] == {"type": "text_delta", "text": "Checking."}
    assert json.loads(deltas[2]["partial_json"]) == {"command": "ls"}
    stop = {"choices": [{"message": {"content": "done"}, "finish_reason": "length"}]}
    assert chat_to_message(stop, REQUEST)["stop_reason"] == "max_tokens"
    with pytest.raises(ChatConversionError, match="arguments: not a JSON object"):
        bad = {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "[1]"}}]}}]}
        chat_to_message(bad, REQUEST)
