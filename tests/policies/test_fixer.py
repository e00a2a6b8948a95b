"""FixerPolicy: finds a container task's key in what OpenCode sends and answers its dialect: one
`bash` tool call (the right or the deliberately wrong command), then a final message once the
tool result is in the messages; a short text for calls with no task (the title call). Streamed
and not, parsed by the real `openai` SDK; every call is in its log, with its rollout id and
session."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.fixer import (
    FINAL_REPLY,
    REWARD_WRITER,
    SIDE_REPLY,
    WRITTEN_REWARD,
    FixerPolicy,
    FixTask,
    load_fix_tasks,
)

TASKS = [
    FixTask("tinycalc bug report: calc.add(a, b) must return the sum", "sed fix-a", "sed bad-a",
            "tinycalc"),
    FixTask("wordstats task: mean_length divides by one word too few", "sed fix-b", "sed bad-b",
            "wordstats"),
]  # fmt: skip
WRONG_TASK = 1
# OpenCode's bash tool, as its requests offer it (trimmed), and one more tool.
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Executes a bash command",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "number"},
                    "description": {"type": "string"},
                },
                "required": ["command", "description"],
            },
        },
    },
    {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
]


@pytest.fixture
async def policy() -> AsyncIterator[FixerPolicy]:
    async with FixerPolicy(tasks=TASKS, wrong=frozenset({WRONG_TASK})) as p:
        yield p


def client(policy: FixerPolicy, session: str, prefix: str = "") -> openai.AsyncOpenAI:
    base = f"{policy.url}{prefix}/v1"
    headers = {"x-session-id": session}
    return openai.AsyncOpenAI(base_url=base, api_key="dummy_key", default_headers=headers)


def prompt(task: int) -> list[Any]:
    """Task `task`'s key as OpenCode sends it: its system prompt, the key re-wrapped and cased."""
    key = TASKS[task].key.replace(": ", ":\n  ").upper()
    return [
        {"role": "system", "content": "You are opencode, an interactive CLI tool."},
        {"role": "user", "content": f"<pr_description>\n{key}\n</pr_description>"},
    ]


async def turn(
    c: openai.AsyncOpenAI, messages: list[Any], stream: bool, tools: Any = TOOLS
) -> tuple[str | None, list[dict[str, str]], str]:
    """One call as OpenCode makes it; (text, tool calls [{id, name, arguments}], finish)."""
    chat = c.chat.completions
    if not stream:
        done = await chat.create(model="policy", messages=messages, tools=tools, max_tokens=99)
        choice = done.choices[0]
        calls = [
            {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
            for t in choice.message.tool_calls or []
            if t.type == "function"
        ]
        return choice.message.content, calls, choice.finish_reason
    events = await chat.create(
        model="policy", messages=messages, tools=tools, stream=True,
        stream_options={"include_usage": True}, tool_choice="auto",
    )  # fmt: skip
    text, finish, usage = "", "", None
    calls: dict[int, dict[str, str]] = {}
    async for event in events:
        usage = event.usage or usage
        for choice in event.choices:
            text += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert usage is not None and usage.completion_tokens > 0
    return text or None, list(calls.values()), finish


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_call_then_final_message(policy: FixerPolicy, stream: bool) -> None:
    c = client(policy, "ses_a", "/ng-rollout/task-0.abc")
    messages = prompt(0)
    text, calls, finish = await turn(c, messages, stream)
    assert finish == "tool_calls" and not text
    assert len(calls) == 1 and calls[0]["name"] == "bash" and calls[0]["id"]
    arguments = json.loads(calls[0]["arguments"])
    assert arguments["command"] == "sed fix-a" and arguments["description"]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function",
             "function": {"name": "bash", "arguments": calls[0]["arguments"]}}]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": ""},
    ]  # fmt: skip
    text, calls, finish = await turn(c, messages, stream)
    assert (text, calls, finish) == (FINAL_REPLY, [], "stop")
    assert [
        (x.step, x.task, x.wrong, x.rollout_id, x.session_id, x.stream) for x in policy.log
    ] == [
        ("fix", 0, False, "task-0.abc", "ses_a", stream),
        ("final", 0, False, "task-0.abc", "ses_a", stream),
    ]
    assert policy.log[0].command == "sed fix-a"
    assert policy.log[0].path == "/ng-rollout/task-0.abc/v1/chat/completions"
    assert policy.log[0].headers["authorization"] == "Bearer <redacted>"


@pytest.mark.parametrize("stream", [False, True])
async def test_wrong_task_runs_its_useless_edit(policy: FixerPolicy, stream: bool) -> None:
    _, calls, _ = await turn(client(policy, "ses_b"), prompt(WRONG_TASK), stream)
    assert json.loads(calls[0]["arguments"])["command"] == "sed bad-b"
    [call] = policy.log
    assert (call.task, call.wrong, call.step, call.rollout_id) == (WRONG_TASK, True, "fix", None)


async def test_writer_task_leaves_a_reward_writer_after_its_useless_edit() -> None:
    """A `writer` task: its useless edit, then the background loop rewriting the reward file."""
    async with FixerPolicy(tasks=TASKS, writer=frozenset({WRONG_TASK})) as writer:
        _, calls, _ = await turn(client(writer, "ses_w"), prompt(WRONG_TASK), False)
    command = json.loads(calls[0]["arguments"])["command"]
    assert command == f"sed bad-b; {REWARD_WRITER}"
    assert f"echo {WRITTEN_REWARD} > /logs/verifier/reward.txt" in command
    [call] = writer.log
    assert (call.task, call.wrong, call.writer, call.step) == (WRONG_TASK, True, True, "fix")
    with pytest.raises(ConfigError, match=r"writer tasks \[7\] are not in the table"):
        FixerPolicy(tasks=TASKS, writer=frozenset({7}))


@pytest.mark.parametrize("stream", [False, True])
async def test_calls_without_a_task_or_bash_get_a_short_text(
    policy: FixerPolicy, stream: bool
) -> None:
    c = client(policy, "ses_c")
    title = [{"role": "user", "content": "Generate a title for this conversation: hello"}]
    assert await turn(c, title, stream) == (SIDE_REPLY, [], "stop")
    # OpenCode's title call quotes the task but offers no tools.
    chat = c.chat.completions
    if stream:
        events = await chat.create(model="m", messages=prompt(0), stream=True)
        text = "".join([e.choices[0].delta.content or "" async for e in events if e.choices])
    else:
        text = (await chat.create(model="m", messages=prompt(0))).choices[0].message.content or ""
    assert text == SIDE_REPLY
    assert [(x.step, x.task) for x in policy.log] == [("side", None), ("side", 0)]


async def test_rollouts_are_not_cross_routed(policy: FixerPolicy) -> None:
    """Interleaved calls of two rollouts each get their own task's command, and the log ties
    every call to its rollout, session and task."""
    one, two = client(policy, "ses_1", "/ng-rollout/r1"), client(policy, "ses_2", "/ng-rollout/r2")
    _, first, _ = await turn(one, prompt(0), True)
    _, second, _ = await turn(two, prompt(1), False)
    assert json.loads(first[0]["arguments"])["command"] == "sed fix-a"
    assert json.loads(second[0]["arguments"])["command"] == "sed bad-b"
    assert {(x.rollout_id, x.session_id, x.task) for x in policy.log} == {
        ("r1", "ses_1", 0),
        ("r2", "ses_2", 1),
    }


async def test_unknown_paths_and_bad_bodies_are_recorded(policy: FixerPolicy) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{policy.url}/v1/responses", json={}) as r:
            assert r.status == 404
        async with http.post(f"{policy.base_url}/chat/completions", data=b"[1]") as r:
            assert r.status == 400
        async with http.get(f"{policy.url}/ng-rollout/x/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "fixer"
        async with http.get(f"{policy.url}/") as r:
            assert r.status == 200
    assert [(x.path, x.step) for x in policy.log] == [
        ("/v1/responses", "unknown"),
        ("/v1/chat/completions", "unknown"),
    ]


def test_task_table_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"key": "k", "fix": "f", "wrong": "w", "name": "n"}) + "\n\n")
    assert load_fix_tasks(path) == [FixTask("k", "f", "w", "n")]
    path.write_text(json.dumps({"key": "k", "fix": "f"}) + "\n")
    with pytest.raises(ConfigError, match=r"tasks.jsonl:1: .*`wrong`"):
        load_fix_tasks(path)
    with pytest.raises(ConfigError, match="not in the table"):
        FixerPolicy(tasks=TASKS, wrong=frozenset({5}))
