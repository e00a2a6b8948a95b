"""ReplayJudge: which recorded judge output answers a judge call, over HTTP, on NeMo Gym's own
recordings (the runtime's `example_rollouts.jsonl` files), on both of NeMo Gym's judge surfaces
(a Responses call, and the Chat Completions call `inference_provider` turns it into)."""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import pytest
from helpers.evals import recordings_of

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.policies.replay import Recording, load_recordings
from verifiers_nemogym.policies.replay_judge import (
    NO_JUDGEMENT,
    JudgeIndex,
    ReplayJudge,
    judge_entries,
)

# Each way a recording keeps the judge's output: whole requests (judge_evaluations, aalcr's
# judge_responses_create_params, inverse_if's rubric prompts), text only (simpleqa), and the two
# side-swapped calls of arena_judge.
ENVS = ("equivalence_llm_judge", "text_to_sql", "math_with_judge", "aalcr", "inverse_if",
        "simpleqa", "arena_judge")  # fmt: skip


@pytest.fixture(scope="module")
def recordings(catalog: Catalog) -> list[Recording]:
    return recordings_of(catalog, ENVS)


def _recorded_calls(rec: Recording) -> list[tuple[list[dict[str, Any]], str]]:
    """The judge requests `rec` recorded whole (input messages) and the recorded reply text."""
    row = rec.row
    pairs = [
        (e["responses_create_params"], e["response"]) for e in row.get("judge_evaluations") or []
    ]
    if "judge_responses_create_params" in row:
        pairs.append((row["judge_responses_create_params"], row["judge_response"]))
    calls = []
    for params, response in pairs:
        text = "".join(
            part["text"] for item in response["output"] if item.get("type") == "message"
            for part in item["content"]
        )  # fmt: skip
        calls.append((params["input"], text))
    for item in row.get("rubric_evaluations") or []:
        calls.append(([{"role": "user", "content": item["judge_prompt"]}], item["judge_response"]))
    return calls


def _as_chat(messages: list[dict[str, Any]]) -> list[dict[str, str]]:
    """What inference_provider sends for a Responses input: role and plain-string content."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "".join(p["text"] for p in content)
        out.append({"role": m.get("role", "user"), "content": content})
    return out


async def _ask(session: aiohttp.ClientSession, judge: ReplayJudge, messages: list[Any]) -> Any:
    """The judge's text for `messages`, asked once as Responses and once as Chat Completions
    (both must agree), or the 404 body."""
    async with session.post(f"{judge.base_url}/responses", json={"input": messages}) as r:
        responses = await r.json()
        status = r.status
    async with session.post(
        f"{judge.base_url}/chat/completions", json={"messages": _as_chat(messages)}
    ) as r:
        chat = await r.json()
        assert r.status == status
    if status != 200:
        assert chat == responses
        return responses
    text = responses["output"][0]["content"][0]["text"]
    assert chat["choices"][0]["message"]["content"] == text
    return text


async def test_every_recorded_judge_request_gets_its_recorded_reply_on_both_apis(
    recordings: list[Recording],
) -> None:
    index = JudgeIndex(recordings)
    calls = [(rec.id, c) for rec in recordings for c in _recorded_calls(rec)]
    # text_to_sql and math_with_judge ask twice with the answers swapped: near-identical prompts
    # with different replies, told apart by the whole prompt.
    assert len(calls) >= 25 and len({reply for _, (_, reply) in calls}) >= 15
    async with ReplayJudge(index=index) as judge, aiohttp.ClientSession() as session:
        for rid, (messages, reply) in calls:
            assert await _ask(session, judge, copy.deepcopy(messages)) == reply, rid
        assert judge.misses == []
    # The entry used is the call's own recording, or one that recorded the same prompt (aalcr
    # recorded one question's judge call several times, with the same reply).
    prompts = {
        rid: [m for m, _ in c] for rid, c in ((r.id, _recorded_calls(r)) for r in recordings)
    }
    for (rid, (messages, _)), used in zip(
        [c for c in calls for _ in (0, 1)], judge.used, strict=True
    ):
        assert used == rid or messages in prompts[used], (rid, used)
    assert sum(u == rid for (rid, _), u in zip(calls, judge.used[::2], strict=True)) >= 30


async def test_text_only_recordings_answer_by_question_then_by_the_judged_answer(
    recordings: list[Recording],
) -> None:
    """simpleqa keeps only the judge's text: a prompt holding the row's question (in NeMo Gym's
    own template words) gets it; a second rollout of the same question with another answer is
    told apart by the answer in the prompt."""
    simpleqa = [r for r in recordings if r.id.startswith("simpleqa:")]
    twin = copy.deepcopy(simpleqa[0].row)
    twin.update(extracted_answer="Frank Rosenblatt himself", judge_output="B")
    index = JudgeIndex([*recordings, Recording.from_row(twin, "twin:1")])
    async with ReplayJudge(index=index) as judge, aiohttp.ClientSession() as session:
        for rec in simpleqa:
            row = rec.row
            prompt = (f"Question: {row['question']}\nGold target: {row['expected_answer']}\n"
                      f"Predicted answer: {row['extracted_answer']}\nGrade:")  # fmt: skip
            assert (
                await _ask(session, judge, [{"role": "user", "content": prompt}])
                == (row["judge_output"])
            ), rec.id
        prompt = f"Question: {twin['question']}\nPredicted answer: {twin['extracted_answer']}"
        assert await _ask(session, judge, [{"role": "user", "content": prompt}]) == "B"
        assert judge.used[-2:] == ["twin:1", "twin:1"]


async def test_arena_judge_side_swapped_calls_get_their_own_recorded_judgement(
    recordings: list[Recording],
) -> None:
    arena = [r for r in recordings if r.id.startswith("arena_judge:")]
    async with ReplayJudge(index=JudgeIndex(recordings)) as judge, aiohttp.ClientSession() as s:
        for rec in arena:
            row = rec.row
            answer = [i for i in row["response"]["output"] if i.get("role") == "assistant"][-1]
            candidate = "".join(p["text"] for p in answer["content"]).strip()
            baseline = row["baseline_answer"].strip()

            def prompt(first: str, second: str, row: dict[str, Any] = row) -> list[Any]:
                system = {"role": "system", "content": "Please act as an impartial judge."}
                user = (f"<|User Prompt|>\n{row['question']}\n\n<|The Start of Assistant A's "
                        f"Answer|>\n{first}\n<|The End of Assistant A's Answer|>\n\n<|The Start "
                        f"of Assistant B's Answer|>\n{second}\n<|The End|>")  # fmt: skip
                return [system, {"role": "user", "content": user}]

            assert await _ask(s, judge, prompt(candidate, baseline)) == row["judgement_gen_base"]
            assert await _ask(s, judge, prompt(baseline, candidate)) == row["judgement_base_gen"]
            assert row["judgement_gen_base"] != row["judgement_base_gen"]


async def test_a_call_no_recording_answers_gets_404_and_is_kept(
    recordings: list[Recording],
) -> None:
    async with ReplayJudge(index=JudgeIndex(recordings)) as judge, aiohttp.ClientSession() as s:
        body = await _ask(s, judge, [{"role": "user", "content": "Is the sky green? [[A=B]]"}])
        assert body["error"]["code"] == NO_JUDGEMENT
        assert "Is the sky green?" in body["error"]["message"]
        assert judge.misses == ["Is the sky green? [[A=B]]"] * 2 and judge.used == []


def test_recordings_without_judge_output_give_no_entries(catalog: Catalog) -> None:
    """ugphysics_judge's recordings never called their judge (judge_evaluations is null) and
    example_single_tool_call has none: nothing to replay, so a call to them would be a miss."""
    for name in ("ugphysics_judge", "example_single_tool_call"):
        recs = load_recordings(catalog.env(name).example_rollouts, name)
        assert recs and [e for r in recs for e in judge_entries(r)] == []
