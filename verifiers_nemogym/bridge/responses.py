"""Responses API objects as NeMo Gym's agents accept them.

`complete_response` fills the fields NeMo Gym's `NeMoGymResponse` requires but OpenAI's schema
(and so many providers and verifiers' interception) leaves optional; `incomplete_response` builds
the reply that makes a NeMo Gym agent stop its loop and still verify.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

JSON = dict[str, Any]


def _zero_usage() -> JSON:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


def _complete_usage(usage: JSON) -> JSON:
    usage.setdefault("input_tokens", 0)
    usage.setdefault("output_tokens", 0)
    usage.setdefault("total_tokens", usage["input_tokens"] + usage["output_tokens"])
    # NeMo Gym's simple_agent writes into these details when it sums usage over turns.
    if not isinstance(usage.get("input_tokens_details"), dict):
        usage["input_tokens_details"] = {}
    usage["input_tokens_details"].setdefault("cached_tokens", 0)
    # Newer openai releases (verifiers' side) require this one too; older ones ignore it.
    usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
    if not isinstance(usage.get("output_tokens_details"), dict):
        usage["output_tokens_details"] = {}
    usage["output_tokens_details"].setdefault("reasoning_tokens", 0)
    return usage


def _complete_item(item: JSON, index: int, response_id: str) -> JSON:
    kind = item.get("type")
    if kind == "message":
        item.setdefault("id", f"msg_{response_id}_{index}")
        item.setdefault("role", "assistant")
        item.setdefault("status", "completed")
        content = item.get("content")
        if isinstance(content, str):
            item["content"] = content = [{"type": "output_text", "text": content}]
        for part in content or []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                part.setdefault("annotations", [])
    elif kind == "reasoning":
        item.setdefault("id", f"rs_{response_id}_{index}")
        item.setdefault("summary", [])
    elif kind == "function_call":
        item.setdefault("call_id", item.get("id") or f"call_{response_id}_{index}")
        if not isinstance(item.get("arguments"), str):
            # Some providers return parsed arguments; NeMo Gym expects the JSON string.
            item["arguments"] = json.dumps(item.get("arguments") or {})
    return item


def complete_response(reply: JSON, request: JSON) -> JSON:
    """Return `reply` (modified in place) with every field NeMo Gym requires present.

    Missing request-echo fields (`tools`, `tool_choice`, `parallel_tool_calls`) are taken from
    `request`, the body the agent sent; fields already present are never changed.
    """
    if "id" not in reply:  # not setdefault: a uuid per call costs the proxy measurably
        reply["id"] = f"resp_{uuid.uuid4().hex}"
    reply.setdefault("object", "response")
    if not isinstance(reply.get("created_at"), int | float):
        reply["created_at"] = int(time.time())
    if not reply.get("model"):
        reply["model"] = request.get("model") or "unknown"
    reply.setdefault("status", "completed")
    for key, default in (("tools", []), ("tool_choice", "auto"), ("parallel_tool_calls", True)):
        if reply.get(key) is None:
            reply[key] = request.get(key, default)
    output = reply.get("output")
    reply["output"] = [
        _complete_item(item, i, reply["id"])
        for i, item in enumerate(output if isinstance(output, list) else [])
        if isinstance(item, dict)
    ]
    if isinstance(reply.get("usage"), dict):
        _complete_usage(reply["usage"])
    else:
        reply.pop("usage", None)
    return reply


def incomplete_response(request: JSON, reason: str) -> JSON:
    """A valid, empty `incomplete` response: NeMo Gym agents end their loop on it and verify.

    `reason` (e.g. verifiers' stop condition) is kept in the response metadata for debugging.
    """
    return complete_response(
        {
            "status": "incomplete",
            # OpenAI allows only these two reasons; a turn or token limit is the closer one.
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [],
            "usage": _zero_usage(),
            "metadata": {"vf_stop": reason[:512]},
        },
        request,
    )


def message_text(content: Any) -> str:
    """Message content as one string: text parts joined, other parts as canonical JSON."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return json.dumps(content, sort_keys=True)
    parts = []
    for part in content:
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif isinstance(part, dict):
            rest = {k: v for k, v in part.items() if k not in ("annotations", "logprobs")}
            parts.append(json.dumps(rest, sort_keys=True))
        else:
            parts.append(str(part))
    return "\n".join(parts)


def response_events(response: JSON) -> bytes:
    """A complete Responses object as the server-sent events a streaming Responses client reads
    (`response.created`, each output item added and done, text as one delta, then
    `response.completed`): what a streamed call gets when its answer exists whole first."""
    events: list[tuple[str, JSON]] = []
    opening = {**response, "status": "in_progress", "output": []}
    events.append(("response.created", {"response": opening}))
    events.append(("response.in_progress", {"response": opening}))
    for index, item in enumerate(response.get("output") or []):
        base = {"output_index": index, "item_id": item.get("id")}
        if item.get("type") == "message":
            events.append(
                (
                    "response.output_item.added",
                    {
                        "output_index": index,
                        "item": {**item, "status": "in_progress", "content": []},
                    },
                )
            )
            for part_index, part in enumerate(item.get("content") or []):
                where = {**base, "content_index": part_index}
                events.append(
                    (
                        "response.content_part.added",
                        {**where, "part": {**part, "text": ""} if "text" in part else part},
                    )
                )
                if part.get("type") == "output_text":
                    events.append(("response.output_text.delta", {**where, "delta": part["text"]}))
                    events.append(("response.output_text.done", {**where, "text": part["text"]}))
                events.append(("response.content_part.done", {**where, "part": part}))
        else:
            events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    final = "response.completed" if response.get("status") == "completed" else (
        "response.incomplete")  # fmt: skip
    events.append((final, {"response": response}))
    return b"".join(_event(name, n, data) for n, (name, data) in enumerate(events))


def _event(name: str, number: int, data: JSON) -> bytes:
    payload = json.dumps({"type": name, "sequence_number": number, **data})
    return f"event: {name}\ndata: {payload}\n\n".encode()
