"""The judge relay with a real scripted judge (no NeMo Gym needed): the token is checked before
a body is read, the key is added on the way out, transient failures are retried a bounded number
of times and end as a status NeMo Gym does not retry, and the preflight names the judge."""

from __future__ import annotations

import time
from dataclasses import replace

import aiohttp
import pytest

from verifiers_nemogym.errors import StackError
from verifiers_nemogym.judge.blame import JudgeFailure, JudgeStatus, question_of
from verifiers_nemogym.judge.endpoint import Judge
from verifiers_nemogym.judge.relay import JUDGE_RETRY, JudgeRelay
from verifiers_nemogym.policies.judge import ScriptedJudge
from verifiers_nemogym.retry import RetryPolicy

KEY = "judge-key-" + "k" * 24
CHAT = {"model": "x", "messages": [{"role": "user", "content": "Is 2+2 equal to 4?"}]}


def _relay(judge: ScriptedJudge, key: str | None = KEY) -> JudgeRelay:
    endpoint = Judge(base_url=judge.base_url, model="scripted-judge", key_var="JUDGE_KEY", key=key)
    return JudgeRelay(endpoint, retry=replace(JUDGE_RETRY, base=0.01, cap=0.02))


async def _post(relay: JudgeRelay, path: str, token: str | None, body: object = CHAT) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    url = f"{relay.base_url}{path}"
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        await r.read()
        return r.status


async def test_relay_forwards_with_the_key_and_counts() -> None:
    async with ScriptedJudge(verdict="[[A=B]]", key=KEY) as judge, _relay(judge) as relay:
        await relay.preflight()
        assert await _post(relay, "/chat/completions", relay.token) == 200
        body = {"model": "x", "input": [{"role": "user", "content": "grade this"}]}
        assert await _post(relay, "/responses", relay.token, body) == 200
        assert [c.prompt for c in judge.calls] == ["Is 2+2 equal to 4?", "grade this"]
        assert judge.chat_calls == 1
        assert (relay.stats.calls, relay.stats.failures) == (2, 0)
        assert relay.stats.prompt_tokens == 200 and relay.stats.completion_tokens == 6


@pytest.mark.parametrize("token", [None, "wrong", "", "Bearer x"])
async def test_relay_refuses_a_call_without_its_token(token: str | None) -> None:
    async with ScriptedJudge(key=KEY) as judge, _relay(judge) as relay:
        assert await _post(relay, "/chat/completions", token) == 401
        assert await _post(relay, "/responses", token) == 401
        assert judge.calls == [] and relay.stats.calls == 0


async def test_transient_failures_are_retried_then_answered_with_424_naming_the_judge() -> None:
    async with ScriptedJudge(fail_status=503) as judge, _relay(judge) as relay:
        began = time.monotonic()
        assert await _post(relay, "/chat/completions", relay.token) == 424
        assert time.monotonic() - began < 5
        assert (relay.stats.calls, relay.stats.retries, relay.stats.failures) == (1, 2, 1)
        failure = relay.status.failure_for(began - 1, "")
        assert failure is not None
        assert "scripted-judge at" in failure and "503: scripted judge fault 503" in failure


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_a_judge_refusal_is_never_retried(status: int) -> None:
    async with ScriptedJudge(fail_status=status) as judge, _relay(judge) as relay:
        assert await _post(relay, "/chat/completions", relay.token) == 424
        assert relay.stats.retries == 0 and relay.stats.failures == 1


async def test_the_key_never_appears_in_a_failure_the_judge_echoes() -> None:
    async with ScriptedJudge(fail_status=500) as judge, _relay(judge) as relay:
        judge.verdict = KEY  # not reached: every call fails
        assert await _post(relay, "/chat/completions", relay.token) == 424
        (failure,) = relay.status.failures
        assert KEY not in failure.message


async def test_preflight_names_the_judge_and_the_key_variable_it_refused() -> None:
    async with ScriptedJudge(key=KEY) as judge, _relay(judge, key="another-key-0123456789") as r:
        with pytest.raises(StackError, match=r"refused the key in \$JUDGE_KEY \(401"):
            await r.preflight()
    dead = Judge(base_url="http://127.0.0.1:9/v1", model="m", key_var="")
    async with JudgeRelay(dead) as relay:
        with pytest.raises(
            StackError, match=r"the judge m at http://127\.0\.0\.1:9/v1 .* does not"
        ):
            await relay.preflight()


def test_the_judge_retries_on_the_one_curve_differing_only_where_it_says() -> None:
    # The first try and the OpenAI client's 2 retries, on the SDK's curve; the differences are
    # the ones JUDGE_RETRY's docstring gives reasons for.
    assert JUDGE_RETRY.retries == 2
    same = replace(JUDGE_RETRY, max_retry_after=120.0, clamp_retry_after=False)
    assert replace(same, transient=RetryPolicy().transient) == RetryPolicy()
    assert JUDGE_RETRY.is_transient(409) and not RetryPolicy().is_transient(409)


def test_a_judge_failure_is_charged_to_the_rollout_whose_question_its_prompt_quotes() -> None:
    status = JudgeStatus({})
    problem = "Compute the sum of  the first ten positive integers."
    row = {
        "input": [{"role": "user", "content": f"Solve this, answer in \\boxed{{}}.\n\n{problem}"}]
    }
    first = status.running(question_of(row))
    second = status.running("Name the capital\nof France.")
    began = time.time()
    # The judge prompt quotes the problem, not the instructions around it.
    prompt = "Grade this.\nQuestion: Compute the sum of the first ten positive integers.\nA: 55"
    status.failed(JudgeFailure.now("judge failed: 503", prompt))
    assert status.failure_for(began, first) == "judge failed: 503"
    assert status.failure_for(began, second) is None  # another rollout's call
    # A failed prompt that quotes no recent rollout's question cannot be charged to one: every
    # rollout verified meanwhile fails with it.
    status.failed(JudgeFailure.now("judge failed: 400", "a prompt about nothing we ran"))
    assert status.failure_for(began, second) == "judge failed: 400"
    assert status.failure_for(time.time() + 1, first) is None  # only failures since `began`
