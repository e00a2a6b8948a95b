"""Responses <-> Chat Completions for train mode, as pure functions.

The proxy's train route sends verifiers a `responses_to_chat` request and turns the reply back with
`chat_to_responses` (or `overlong_response` where `is_overlong_prompt` holds). The round trip
keeps exactly what verifiers' `message_hash` reads, so a rollout stays one training branch; what it
keeps, and where it differs from NeMo Gym's own converter: docs/training.md, "The chat conversion".
"""

from __future__ import annotations

import json
import re
from typing import Any

from verifiers_nemogym.bridge.responses import complete_response
from verifiers_nemogym.errors import NeMoGymError

JSON = dict[str, Any]

# Fields NeMo Gym's training model server puts on output items, echoed back by its agents.
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")

# Request fields that mean the same in both APIs and pass through unchanged. Not `metadata`:
# it carries the proxy's route and secret, which must reach no model call and no trace.
_PASSTHROUGH = (
    "model",
    "temperature",
    "top_p",
    "user",
    "seed",
    "service_tier",
    "top_logprobs",
    "stop",
    "frequency_penalty",
    "presence_penalty",
)

# The two wordings of "prompt too long": verifiers' train client (renderers' pre-flight check,
# relayed as a 400) and vLLM's own engine error.
_OVERLONG = re.compile(
    r"exceeds maximum context length|maximum context length is|context_length_exceeded",
    re.IGNORECASE,
)


class ChatConversionError(NeMoGymError, ValueError):
    """A Responses request or chat reply that has no faithful counterpart in the other API."""


def _text_of(parts: Any, where: str) -> str:
    """The text of a content value (a string or a list of text-bearing parts)."""
    if parts is None:
        return ""
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise ChatConversionError(f"{where}: content must be a string or a list of parts")
    texts = []
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise ChatConversionError(f"{where}.content[{i}]: a part must be an object")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            texts.append(part.get("text") or "")
        elif kind == "refusal":
            texts.append(part.get("refusal") or "")
        else:
            raise ChatConversionError(f"{where}.content[{i}]: unsupported part type {kind!r}")
    return "".join(texts)


def _chat_parts(content: Any, where: str) -> str | list[JSON]:
    """User/system/tool content: a string stays a string, Responses parts become chat parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise ChatConversionError(f"{where}: content must be a string or a list of parts")
    parts: list[JSON] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text") or ""})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise ChatConversionError(f"{where}.content[{i}]: input_image needs image_url")
            parts.append(
                {
                    "type": "image_url",
                    "image_url": {"url": url, "detail": part.get("detail", "auto")},
                }
            )
        else:
            raise ChatConversionError(f"{where}.content[{i}]: unsupported part type {kind!r}")
    return parts


class _Turn:
    """One assistant turn being folded from consecutive assistant-side items."""

    def __init__(self) -> None:
        self.content: str | None = None
        self.reasoning: list[str] | None = None
        self.tool_calls: list[JSON] = []

    def message(self) -> JSON:
        content = self.content
        if content is None and not self.tool_calls:
            content = ""  # strict chat servers reject a null content without tool calls
        message: JSON = {"role": "assistant", "content": content}
        if self.reasoning is not None:
            message["reasoning_content"] = "\n".join(r for r in self.reasoning if r)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def _is_assistant_side(item: JSON) -> bool:
    kind = item.get("type")
    return kind in ("reasoning", "function_call") or (
        kind in (None, "message") and item.get("role") == "assistant"
    )


def chat_messages(request: JSON) -> list[JSON]:
    """The chat `messages` for a Responses request's `instructions` and `input`."""
    messages: list[JSON] = []
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions not in (None, "", []):
        raise ChatConversionError("request.instructions: only a string is supported")
    items = request.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list):
        raise ChatConversionError("request.input: must be a string or a list of items")
    turn: _Turn | None = None
    for index, item in enumerate(items):
        where = f"request.input[{index}]"
        if not isinstance(item, dict):
            raise ChatConversionError(f"{where}: an item must be an object")
        kind = item.get("type") or ("message" if item.get("role") else None)
        if _is_assistant_side(item):
            turn = turn or _Turn()
            if kind == "reasoning":
                texts = [s.get("text") or "" for s in item.get("summary") or []]
                texts += [c.get("text") or "" for c in item.get("content") or []]
                turn.reasoning = (turn.reasoning or []) + texts
            elif kind == "function_call":
                turn.tool_calls.append(_tool_call(item, where))
            else:
                text = _text_of(item.get("content"), where)
                turn.content = (turn.content or "") + text
            continue
        if turn is not None:
            messages.append(turn.message())
            turn = None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer"):
                raise ChatConversionError(f"{where}: unsupported message role {role!r}")
            # verifiers' chat parser would read `developer` as a user message.
            messages.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _chat_parts(item.get("content"), where),
                }
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ChatConversionError(f"{where}: function_call_output without call_id")
            output = item.get("output")
            content = output if isinstance(output, (str, list)) else json.dumps(output)
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _chat_parts(content, where)}
            )
        else:
            raise ChatConversionError(f"{where}: unsupported item type {kind!r}")
    if turn is not None:
        messages.append(turn.message())
    return messages


def _tool_call(item: JSON, where: str) -> JSON:
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not isinstance(name, str):
        raise ChatConversionError(f"{where}: function_call needs a call_id and a name")
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        # Only non-string arguments are serialised; a string goes as sent (ids, hashes).
        arguments = json.dumps(arguments if arguments is not None else {})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_tools(tools: Any) -> list[JSON] | None:
    """Responses function tools -> chat tools (`None` when there are none)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatConversionError("request.tools: must be a list")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ChatConversionError(
                f"request.tools[{i}]: only function tools have a chat form, got {kind!r}"
            )
        if not isinstance(tool.get("name"), str):
            raise ChatConversionError(f"request.tools[{i}]: a function tool needs a name")
        function = {"name": tool["name"]}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        converted.append({"type": "function", "function": function})
    return converted or None


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        raise ChatConversionError("request.tool_choice: allowed_tools has no chat form")
    return choice


def responses_to_chat(request: JSON) -> JSON:
    """A Chat Completions request body equivalent to the Responses request body `request`.

    Never modifies `request`; its `metadata` is not carried over. Raises `ChatConversionError`
    (naming the field) for what has no faithful chat form: non-function tools,
    `previous_response_id`, streaming, unknown items.
    """
    if not isinstance(request, dict):
        raise ChatConversionError("request: must be a JSON object")
    if request.get("previous_response_id"):
        raise ChatConversionError(
            "request.previous_response_id: stored responses have no chat form"
        )
    if request.get("stream"):
        raise ChatConversionError("request.stream: streaming is not supported in train mode")
    body: JSON = {"messages": chat_messages(request)}
    for key in _PASSTHROUGH:
        if request.get(key) is not None:
            body[key] = request[key]
    if request.get("top_logprobs") is not None:
        body["logprobs"] = True
    if request.get("max_output_tokens") is not None:
        body["max_tokens"] = request["max_output_tokens"]
    tools = chat_tools(request.get("tools"))
    if tools:
        body["tools"] = tools
        # Chat servers reject these two without tools; with none they mean nothing.
        if request.get("tool_choice") is not None:
            body["tool_choice"] = _tool_choice(request["tool_choice"])
        if request.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = request["parallel_tool_calls"]
    reasoning = request.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        body["reasoning_effort"] = reasoning["effort"]
    text_format = (request.get("text") or {}).get("format")
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        schema = {k: v for k, v in text_format.items() if k != "type"}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(text_format, dict) and text_format.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    return body


def _reasoning_of(message: JSON) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str):
            return value
    return None


def _usage(usage: Any) -> JSON | None:
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def output_items(message: JSON) -> list[JSON]:
    """Responses output items for one chat assistant message.

    An optional `reasoning` item (when `reasoning_content` is not `None`), a `message` item when
    there is text or nothing else at all, then one `function_call` per tool call with `call_id`
    (and `id`) = the tool call's id and the arguments string as it came. Token fields the message
    carries (NeMo Gym's training shape) go onto the last item, as NeMo Gym's `vllm_model` does.
    """
    items: list[JSON] = []
    reasoning = _reasoning_of(message)
    if reasoning is not None:
        items.append(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
                "status": "completed",
            }
        )
    content = message.get("content")
    text = _text_of(content, "reply.choices[0].message")
    calls = message.get("tool_calls") or []
    if text or not (items or calls):
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for i, call in enumerate(calls):
        where = f"reply.choices[0].message.tool_calls[{i}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise ChatConversionError(f"{where}: needs an id and a function")
        arguments = function.get("arguments")
        items.append(
            {
                "type": "function_call",
                "id": call["id"],
                "call_id": call["id"],
                "name": function.get("name"),
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                "status": "completed",
            }
        )
    if all(key in message for key in TOKEN_FIELDS):
        items[-1].update({key: message[key] for key in TOKEN_FIELDS})
    return items


def chat_to_responses(reply: JSON, request: JSON) -> JSON:
    """The Responses object NeMo Gym accepts for the chat completion `reply` to `request`.

    `request` is the agent's Responses request (its `tools`, `tool_choice`... are echoed).
    `finish_reason: "length"` gives `status: "incomplete"` with `incomplete_details:
    {"reason": "max_output_tokens"}` (NeMo Gym's agents stop there and verify). Raises
    `ChatConversionError` for a reply without a first choice or message (e.g. an error body).
    """
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatConversionError("reply.choices: a chat completion needs at least one choice")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ChatConversionError("reply.choices[0].message: missing")
    response: JSON = {"object": "response", "output": output_items(message)}
    if isinstance(reply.get("id"), str) and reply["id"]:
        response["id"] = reply["id"]
    if isinstance(reply.get("created"), int) and reply["created"] > 0:
        response["created_at"] = reply["created"]
    if reply.get("model"):
        response["model"] = reply["model"]
    finish = choices[0].get("finish_reason")
    if finish in ("length", "content_filter"):
        response["status"] = "incomplete"
        reason = "max_output_tokens" if finish == "length" else "content_filter"
        response["incomplete_details"] = {"reason": reason}
    else:
        response["status"] = "completed"
        response["incomplete_details"] = None
    # Request echoes NeMo Gym reads; never `metadata` (the proxy's route and secret).
    for key in ("temperature", "top_p", "max_output_tokens"):
        if request.get(key) is not None:
            response[key] = request[key]
    usage = _usage(reply.get("usage"))
    if usage is not None:
        response["usage"] = usage
    return complete_response(response, request)


OVERLONG_REPLY: JSON = {
    "choices": [{"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}]
}
"""What NeMo Gym's `vllm_model` makes of a prompt refused as too long: an empty completion
stopped by its length."""


def overlong_response(request: JSON) -> JSON:
    """The Responses reply to a prompt refused as too long (`OVERLONG_REPLY` converted): its
    agents then stop (`incomplete`) and the rollout is still verified."""
    return chat_to_responses(OVERLONG_REPLY, request)


def is_overlong_prompt(status: int, body: Any) -> bool:
    """Whether an error reply (`status`, parsed JSON `body` or text) says the prompt was too long.

    verifiers' train client relays its renderer's pre-flight check as a 400 "Prompt length (N)
    exceeds maximum context length (M)."; vLLM answers a 400 "... maximum context length is N
    tokens ...". Other 400s (e.g. verifiers' "rollout stopped: ...") are not this.
    """
    if status != 400:
        return False
    if isinstance(body, dict):
        error = body.get("error")
        text = error.get("message") if isinstance(error, dict) else error
        if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
            return True
        body = text if isinstance(text, str) else body.get("message")
    return isinstance(body, str) and _OVERLONG.search(body) is not None
