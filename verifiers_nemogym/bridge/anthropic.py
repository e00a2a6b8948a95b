"""Train mode for Anthropic Messages calls (claude_code's CLI): Messages <-> Chat Completions,
pure functions.

What has a chat form is carried exactly (system prompt, text, tool uses and results by id, tools
and tool choice, sampling fields, thinking as `reasoning_content`); what has none (images and
documents, signed or redacted thinking, server tools) raises `ChatConversionError` naming the
field, never a turn recorded without token ids; `cache_control` marks are dropped
(docs/harnesses.md).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from verifiers_nemogym.bridge.chat import ChatConversionError

JSON = dict[str, Any]

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text(block: JSON, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise ChatConversionError(f"{where}.text: must be a string")
    return text


def _joined_text(content: Any, where: str, separator: str) -> str:
    """A string, or the texts of a list of text blocks joined (no other block has a chat
    form where a system prompt or a tool result goes)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise ChatConversionError(f"{where}: must be a string or a list of text blocks")
    parts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ChatConversionError(f"{where}[{i}]: only text blocks have a chat form")
        parts.append(_text(block, f"{where}[{i}]"))
    return separator.join(parts)


def _user(message: JSON, where: str) -> list[JSON]:
    """A user message: its tool results as `tool` messages (in order), then its text."""
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise ChatConversionError(f"{where}.content: must be a string or a list of blocks")
    out: list[JSON] = []
    texts: list[str] = []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            text = _joined_text(block.get("content"), f"{at}.content", "\n")
            if block.get("is_error"):
                text = f"Error: {text}" if text else "Error"
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
        elif kind == "text":
            texts.append(_text(block, at))
        else:
            raise ChatConversionError(f"{at}: a {kind!r} block has no chat form in train mode")
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(message: JSON, where: str) -> JSON:
    content = message.get("content")
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise ChatConversionError(f"{where}.content: must be a string or a list of blocks")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[JSON] = []
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
        elif kind == "thinking" and not block.get("signature"):
            reasoning.append(str(block.get("thinking") or ""))
        else:
            # Signed or redacted thinking (a provider's own), server tools: no chat form.
            raise ChatConversionError(f"{at}: a {kind!r} block has no chat form in train mode")
    out: JSON = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _tools(tools: Any) -> list[JSON] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if (
            not isinstance(tool, dict)
            or "input_schema" not in tool
            or tool.get("type")
            not in (
                None,
                "custom",
            )
        ):
            raise ChatConversionError(f"request.tools[{i}]: only client tools have a chat form")
        function: JSON = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")


def messages_to_chat(request: JSON) -> JSON:
    """A Chat Completions request body equivalent to the Messages request body `request`
    (its `stream` is left to the caller). Raises `ChatConversionError` naming the field that has
    no faithful chat form."""
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        raise ChatConversionError("request.messages: a Messages request needs a list")
    messages: list[JSON] = []
    if request.get("system") is not None:
        system = _joined_text(request["system"], "request.system", "\n\n")
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(request["messages"]):
        where = f"request.messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            messages.extend(_user(message, where))
        elif role == "assistant":
            messages.append(_assistant(message, where))
        else:
            raise ChatConversionError(f"{where}.role: {role!r} is not user or assistant")
    body: JSON = {"messages": messages}
    for key in ("model", "max_tokens", "temperature", "top_p", "top_k"):
        if request.get(key) is not None:
            body[key] = request[key]
    if request.get("stop_sequences"):
        body["stop"] = request["stop_sequences"]
    if tools := _tools(request.get("tools")):
        body["tools"] = tools
        if request.get("tool_choice") is not None:
            body["tool_choice"] = _tool_choice(request["tool_choice"])
            if request["tool_choice"].get("disable_parallel_tool_use"):
                body["parallel_tool_calls"] = False
    return body


def chat_to_message(reply: JSON, request: JSON) -> JSON:
    """The Messages object for the chat completion `reply` to `request`: thinking (from
    `reasoning_content`), text, then one `tool_use` per tool call (its id, its arguments
    parsed). Raises `ChatConversionError` for a reply without a first choice or message, or
    with tool arguments that are not a JSON object."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatConversionError("reply.choices: a chat completion needs at least one choice")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ChatConversionError("reply.choices[0].message: missing")
    content: list[JSON] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ChatConversionError(f"reply.choices[0].message.tool_calls[{i}]: no function")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ChatConversionError(
                f"reply.choices[0].message.tool_calls[{i}].function.arguments: not a JSON object"
            )
        content.append(
            {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
             "input": arguments}
        )  # fmt: skip
    usage: JSON = reply["usage"] if isinstance(reply.get("usage"), dict) else {}
    return {
        "id": f"msg_{reply.get('id') or uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": reply.get("model") or request.get("model") or "unknown",
        "content": content,
        "stop_reason": _STOP_REASONS.get(str(choices[0].get("finish_reason")), "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        },
    }


def message_events(message: JSON) -> bytes:
    """A complete Messages object as the server-sent events a streaming Messages client reads
    (`message_start`, each block started, given whole as one delta, and stopped,
    `message_delta` with the stop reason, `message_stop`)."""
    opening = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    events: list[tuple[str, JSON]] = [("message_start", {"message": opening})]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        start: JSON
        delta: JSON
        if kind == "text":
            start, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(("content_block_start", {"index": index, "content_block": start}))
        events.append(("content_block_delta", {"index": index, "delta": delta}))
        events.append(("content_block_stop", {"index": index}))
    stop = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(("message_delta", {"delta": stop, "usage": message["usage"]}))
    events.append(("message_stop", {}))
    return b"".join(
        f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()
        for name, data in events
    )
