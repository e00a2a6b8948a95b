"""AnswerKeyPolicy: finds a row's question in whatever a coding-agent CLI sends, and answers it
(right or deliberately wrong) in Chat Completions, Responses and Anthropic Messages, streaming
and not, parsed by the real `openai` and `anthropic` SDKs; every call is in its log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.answer_key import (
    SIDE_REPLY,
    AnswerKeyPolicy,
    AnswerRow,
    boxed,
    load_answer_key,
)

# Shaped like NeMo Gym 0.7.0's *_math example rows: LaTeX, answers in \( \) or bare.
ROWS = [
    AnswerRow("Determine how many 1000 digit numbers \\( A \\) have the property P.", "32"),
    AnswerRow("Let \\( x_0 = 1 \\). Determine \\( x_{2016} \\).", "\\(\\frac{1}{6}\\)"),
    AnswerRow("Find \\( |x| \\) if \\( x^2 = 2 \\).", "\\(\\sqrt{2}\\)"),
]
WRONG_ROW = 1
KEY = "sk-answer-key-test-credential"
# How a CLI wraps a row: its own system prompt, the harness's instructions, other whitespace.
WRAPPED = (
    "You are a precise math assistant with a bash tool.\nPut the final answer inside \\boxed{}."
    "\n\nSolve the following math problem.\n\n{question}\n"
)


def wrapped(row: int) -> str:
    """Row `row`'s question as a CLI sends it: inside its prompt, line breaks and case moved."""
    question = ROWS[row].question.replace(" have ", "\n  have ").replace("Determine", "DETERMINE")
    return WRAPPED.replace("{question}", question)


@pytest.fixture
async def policy() -> AsyncIterator[AnswerKeyPolicy]:
    async with AnswerKeyPolicy(rows=ROWS, wrong=frozenset({WRONG_ROW})) as p:
        yield p


def openai_client(policy: AnswerKeyPolicy, session: str) -> openai.AsyncOpenAI:
    headers = {"X-Session-ID": session}
    return openai.AsyncOpenAI(base_url=policy.base_url, api_key=KEY, default_headers=headers)


def anthropic_client(policy: AnswerKeyPolicy, session: str) -> anthropic.AsyncAnthropic:
    headers = {"X-Session-ID": session}
    return anthropic.AsyncAnthropic(base_url=policy.url, api_key=KEY, default_headers=headers)


async def ask(policy: AnswerKeyPolicy, dialect: str, stream: bool, row: int, session: str) -> str:
    """Row `row`'s question asked in `dialect` by the real SDK; the text it parsed."""
    prompt = wrapped(row)
    if dialect == "chat":
        chat = openai_client(policy, session).chat.completions
        messages: Any = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": prompt},
        ]
        if not stream:
            completion = await chat.create(model="m", messages=messages)
            assert completion.choices[0].finish_reason == "stop"
            assert completion.usage is not None and completion.usage.completion_tokens > 0
            return completion.choices[0].message.content or ""
        chunks = [
            c
            async for c in await chat.create(
                model="m", messages=messages, stream=True, stream_options={"include_usage": True}
            )
        ]
        # The usage chunk comes last, without choices; the one before it says why it stopped.
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-2].choices[0].finish_reason == "stop"
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if dialect == "responses":
        responses = openai_client(policy, session).responses
        if not stream:
            response = await responses.create(model="m", instructions="Be brief.", input=prompt)
            assert response.status == "completed" and response.usage is not None
            return response.output_text
        events = [e async for e in await responses.create(model="m", input=prompt, stream=True)]
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
        deltas = "".join(getattr(e, "delta", "") for e in events if e.type.endswith("text.delta"))
        final = events[-1].response  # type: ignore[union-attr]
        assert final.output_text == deltas and final.usage is not None
        return deltas
    messages_api = anthropic_client(policy, session).messages
    messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
    if not stream:
        message = await messages_api.create(
            model="m", max_tokens=100, system="Be brief.", messages=messages
        )
        assert message.stop_reason == "end_turn"
        return "".join(b.text for b in message.content if b.type == "text")
    async with messages_api.stream(model="m", max_tokens=100, messages=messages) as events:
        final = await events.get_final_message()
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    return "".join(b.text for b in final.content if b.type == "text")


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
async def test_each_dialect_answers_right_and_wrong_and_logs_the_call(
    policy: AnswerKeyPolicy, dialect: str, stream: bool
) -> None:
    right = await ask(policy, dialect, stream, 0, "rollout-a")
    wrong = await ask(policy, dialect, stream, WRONG_ROW, "rollout-b")
    third = await ask(policy, dialect, stream, 2, "rollout-c")
    assert right == "\\boxed{32}"
    assert third == "\\boxed{\\sqrt{2}}"  # the answer's \( \) dropped: it would not parse boxed
    assert wrong.startswith("\\boxed{") and wrong != "\\boxed{\\frac{1}{6}}"
    calls = policy.log
    assert [(c.path, c.dialect, c.stream) for c in calls] == [(PATHS[dialect], dialect, stream)] * 3
    assert [(c.session_id, c.row, c.wrong) for c in calls] == [
        ("rollout-a", 0, False),
        ("rollout-b", WRONG_ROW, True),
        ("rollout-c", 2, False),
    ]
    assert [c.reply for c in calls] == [right, wrong, third]


async def test_anthropic_beta_path_is_answered_and_logged_with_its_query(
    policy: AnswerKeyPolicy,
) -> None:
    message = await anthropic_client(policy, "s").beta.messages.create(
        model="m",
        max_tokens=10,
        messages=[{"role": "user", "content": wrapped(2)}],
        extra_query={"beta": "true"},  # the path Claude Code calls
    )
    assert [b.text for b in message.content if b.type == "text"] == ["\\boxed{\\sqrt{2}}"]
    assert policy.log[0].path == "/v1/messages?beta=true" and policy.log[0].row == 2


async def events_of(url: str, body: dict[str, Any]) -> list[tuple[str | None, str]]:
    """The raw SSE frames of a streamed answer: (event name or None, data)."""
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as reply:
        assert reply.status == 200 and reply.content_type == "text/event-stream"
        text = await reply.text()
    frames = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        frames.append((fields.get("event"), fields["data"]))
    return frames


async def test_stream_frames_are_each_dialects_event_sequence(policy: AnswerKeyPolicy) -> None:
    user = [{"role": "user", "content": wrapped(0)}]
    chat = await events_of(
        f"{policy.base_url}/chat/completions",
        {"model": "m", "messages": user, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert chat[-1] == (None, "[DONE]") and "usage" in json.loads(chat[-2][1])
    plain = await events_of(
        f"{policy.base_url}/chat/completions", {"model": "m", "messages": user, "stream": True}
    )
    assert plain[-1] == (None, "[DONE]") and "usage" not in json.loads(plain[-2][1])

    responses = await events_of(
        f"{policy.base_url}/responses", {"model": "m", "input": user, "stream": True}
    )
    names = [name for name, _ in responses]
    assert all(json.loads(data)["type"] == name for name, data in responses)
    assert [json.loads(data)["sequence_number"] for _, data in responses] == list(range(len(names)))
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]

    messages = await events_of(
        f"{policy.url}/v1/messages?beta=true",
        {"model": "m", "max_tokens": 9, "messages": user, "stream": True},
    )
    names = [name for name, _ in messages]
    deltas = names.count("content_block_delta")
    assert deltas >= 1
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    stop = json.loads(messages[-2][1])
    assert stop["delta"]["stop_reason"] == "end_turn" and stop["usage"]["output_tokens"] > 0


async def test_the_question_is_found_anywhere_and_side_calls_get_plain_text(
    policy: AnswerKeyPolicy,
) -> None:
    client = openai_client(policy, "s")
    # Only in the instructions (a CLI may put the task in its system prompt).
    found = await client.responses.create(model="m", instructions=wrapped(2), input="Go.")
    assert found.output_text == "\\boxed{\\sqrt{2}}"
    # A title call that does not quote the question.
    side = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Generate a title for this chat."}]
    )
    assert side.choices[0].message.content == SIDE_REPLY
    assert [(c.row, c.wrong, c.reply) for c in policy.log] == [
        (2, False, "\\boxed{\\sqrt{2}}"),
        (None, False, SIDE_REPLY),
    ]


def test_the_longest_question_found_wins() -> None:
    short = AnswerRow("Find x.", "1")
    long = AnswerRow("Find x. Then find y.", "2")
    policy = AnswerKeyPolicy(rows=[short, long])
    assert policy.match({"messages": [{"role": "user", "content": "find x.  then\nfind y."}]}) == 1
    assert policy.match({"input": "Please find x."}) == 0
    assert policy.match({"model": "Find x.", "input": "nothing"}) is None  # not the model name


def test_a_question_quoted_with_escaped_quotes_is_found() -> None:
    """opencode quotes the user's prompt inside its own, `"` escaped as `\\"` (Reasoning Gym's
    knights-and-knaves questions quote what the inhabitants say)."""
    row = AnswerRow('Zoey commented, "Riley is a fool". Who is a sage?', "Zoey is a fool.")
    policy = AnswerKeyPolicy(rows=[row])
    quoted = 'The user asked: "Zoey commented, \\"Riley is a fool\\". Who is a sage?"'
    assert policy.match({"messages": [{"role": "user", "content": quoted}]}) == 0


def test_wrong_answer_is_never_the_expected_one() -> None:
    rows = [AnswerRow("q0", "-7919"), AnswerRow("q1", "\\(-7919\\)"), AnswerRow("q2", "5")]
    policy = AnswerKeyPolicy(rows=rows, wrong=frozenset({0, 1, 2}))
    for row in range(3):
        assert policy.answer(row) != boxed(rows[row].expected_answer)


async def test_unknown_paths_are_logged_and_credentials_are_not(policy: AnswerKeyPolicy) -> None:
    headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "v"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{policy.url}/v1/messages/count_tokens", json={}) as reply:
            assert reply.status == 404
        async with http.get(f"{policy.url}/") as reply:  # NeMo Gym's readiness poll
            assert reply.status == 200
        async with http.get(f"{policy.base_url}/models") as reply:
            assert (await reply.json())["data"][0]["id"] == policy.model_id
        body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{policy.url}/v1/messages", json=body) as reply:
            assert reply.status == 200
    unknown, answered = policy.log
    assert (unknown.path, unknown.dialect) == ("/v1/messages/count_tokens", "unknown")
    assert answered.headers["authorization"] == "Bearer <redacted>"
    assert answered.headers["x-api-key"] == "<redacted>"
    assert answered.headers["anthropic-version"] == "v"
    assert KEY not in repr(policy.log)


async def test_a_body_that_is_not_a_json_object_is_a_400(policy: AnswerKeyPolicy) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{policy.base_url}/chat/completions", data=b"[1, 2") as reply,
    ):
        assert reply.status == 400
    assert [(c.path, c.dialect, c.row) for c in policy.log] == [
        ("/v1/chat/completions", "chat", None)
    ]


def test_answer_key_files_and_wrong_rows_are_checked(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(json.dumps({"question": r.question, "expected_answer": r.expected_answer,
                              "responses_create_params": {}}) for r in ROWS) + "\n\n"
    )  # fmt: skip
    assert load_answer_key(rows) == ROWS
    # Reasoning Gym's rows (the `*_reasoning_gym` harness environments) name it `answer`.
    gym = tmp_path / "gym.jsonl"
    gym.write_text(json.dumps({"question": "Who is a sage?", "answer": "Zoey is a fool."}) + "\n")
    assert load_answer_key(gym) == [AnswerRow("Who is a sage?", "Zoey is a fool.")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "expected_answer": "1"}) + '\n{"question": "q"}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: an answer-key row needs string"):
        load_answer_key(bad)
    bad.write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not JSON"):
        load_answer_key(bad)
    bad.write_text("\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl: no rows"):
        load_answer_key(bad)
    with pytest.raises(ConfigError, match=r"wrong rows \[3\] are not in the answer key"):
        AnswerKeyPolicy(rows=ROWS, wrong=frozenset({3}))


COMMAND = str(Path(sys.executable).with_name("nemo-gym-env"))


async def test_serve_answers_serves_the_rows_until_sigterm(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"question": r.question, "expected_answer": r.expected_answer}) + "\n"
            for r in ROWS
        )
    )
    bad = subprocess.run(
        [COMMAND, "serve", "answers", "--rows", str(rows), "--wrong", "x", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr == "nemo-gym-env: --wrong 'x': give row indices, e.g. --wrong 1,3\n"
    proc = subprocess.Popen(
        [COMMAND, "serve", "answers", "--rows", str(rows), "--wrong", "1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("answer-key policy (2 rows right, 1 wrong) on http://127.0.0.1:")
        base_url = line.rsplit(" on ", 1)[1].strip()
        client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY)
        reply = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": wrapped(0)}]
        )
        assert reply.choices[0].message.content == "\\boxed{32}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
