"""NeMo Gym's LLM-judge environments on real stacks, graded by the scripted judge.

The chain is real (verifiers -> harness -> NeMo Gym's agent -> resources server's `/verify` ->
NeMo Gym's judge model server -> our judge relay -> the judge); the policy and the judge are the
package's scripted model servers. A verdict string selects NeMo Gym's verdict: simpleqa reads the
first letter (`A` correct, `B` incorrect), equivalence_llm_judge finds `[[A=B]]` / `[[A!=B]]`, so
one reply grades both the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import verifiers.v1 as vf
from helpers.evals import error_text, model_context, train_context
from helpers.processes import gone, run_tag
from helpers.stacks import SURVEYED_ON_040

import nemo_gym_env
from verifiers_nemogym.judge.relay import JUDGE_RETRY
from verifiers_nemogym.nemo.release import parse_version
from verifiers_nemogym.nemo.supervisor import (
    MARKER_ENV_VAR,
    argv_of,
    cwd_of,
    environ_of,
    pids,
    processes_with_env,
)
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.judge import ScriptedJudge
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer
from verifiers_nemogym.stack_access import PrivateStack, SharedStack

EQUAL, NOT_EQUAL = "A [[A=B]]", "B [[A!=B]]"
JUDGE_ENVS = ["equivalence_llm_judge", "simpleqa"]
ROWS_PER_ENV = 3
SUMMARY = re.compile(r"judge on this stack: (\d+) calls, (\d+) failed, (\d+) retried, ")


def _judge(judge: ScriptedJudge, key_var: str = "", api: str = "chat") -> dict[str, Any]:
    return {"base_url": judge.base_url, "model": "scripted-judge", "api_key_var": key_var,
            "api": api}  # fmt: skip


def _tasks(env: Any) -> list[vf.Task]:
    """The first ROWS_PER_ENV rows of each environment."""
    seen: dict[str, int] = {}
    chosen = []
    for task in env.taskset:
        agent = task.data.agent
        if seen.get(agent, 0) < ROWS_PER_ENV:
            seen[agent] = seen.get(agent, 0) + 1
            chosen.append(task)
    return chosen


def _question(task: vf.Task) -> str:
    items = task.data.row["responses_create_params"]["input"]
    text = items if isinstance(items, str) else items[-1]["content"]
    return str(text)


@SURVEYED_ON_040  # 0.4.0 in CI: its judges graded in test_judge_conformance.py and below
async def test_judge_environments_grade_with_the_named_judge_on_both_releases(
    policy: ScriptedPolicy, any_nemo_venv: NeMoGymVenv, caplog: pytest.LogCaptureFixture
) -> None:
    """Both of NeMo Gym's judge surfaces (equivalence_llm_judge posts Responses, simpleqa Chat
    Completions) mixed with a judge-free environment on one stack: the verdict decides the
    reward, the judge saw each row's question, the trace names the judge. Then the judge fails:
    every judged rollout is an error naming the judge, never the score the release gives it
    (0.4.0: a 500 from `/verify`; simpleqa on 0.5.0+ a 200 with `reward: 0.0` and
    `_ng_failure_class: judge_failed`, on 0.7.0 also `mask_sample: true`, each named)."""
    async with ScriptedJudge(verdict=EQUAL) as judge:
        env = nemo_gym_env.load_environment(
            nemo_env=",".join([*JUDGE_ENVS, "example_single_tool_call"]),
            shared_stack=False,
            nemo_gym_version=any_nemo_venv.nemo_gym_version,
            python=str(any_nemo_venv.python),
            allow_python_below_floor=any_nemo_venv.below_floor,
            judge=_judge(judge),
        )
        tasks = _tasks(env)
        ctx = model_context(policy)
        caplog.set_level(logging.INFO, logger="verifiers_nemogym.env")
        async with env.serving():
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            assert isinstance(env.stack, PrivateStack)
            graded = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
            calls_equal = len(judge.calls)
            judge.verdict = NOT_EQUAL
            failed = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
            calls_graded = len(judge.calls)
            judge.fail_status = 503  # every grading call fails from here
            broken = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
        assert await gone(marker) == []
    judged = [t.data.agent.split("_simple_agent")[0] in JUDGE_ENVS for t in tasks]
    assert judged.count(True) == 2 * ROWS_PER_ENV
    for task, is_judged, first, second in zip(tasks, judged, graded, failed, strict=True):
        assert first.ok and second.ok, error_text(first) + error_text(second)
        assert first.traces[0].reward == 1.0
        assert second.traces[0].reward == (0.0 if is_judged else 1.0), task.data.agent
        assert first.traces[0].info["nemo_gym_judge"] == {
            "base_url": judge.base_url, "model": "scripted-judge", "api": "chat"
        }  # fmt: skip
    # Every judged row's question reached the judge; the judge-free rows never called it.
    prompts = " ".join(c.prompt for c in judge.calls)
    for task, is_judged in zip(tasks, judged, strict=True):
        assert (_question(task)[:60] in prompts) == is_judged, _question(task)[:60]
    assert calls_equal >= 2 * ROWS_PER_ENV and judge.chat_calls == len(judge.calls)
    version = any_nemo_venv.nemo_gym_version
    for task, is_judged, episode in zip(tasks, judged, broken, strict=True):
        text = error_text(episode)
        assert episode.traces[0].info["nemo_gym_runtime"]["nemo_gym"] == version
        if not is_judged:
            assert episode.ok and episode.traces[0].reward == 1.0, text
            continue
        assert not episode.ok and episode.traces[0].rewards.get("nemo_gym") is None, text
        assert "the judge scripted-judge at" in text and "failed: 503" in text, text
        if task.data.agent == "simpleqa_simple_agent" and parse_version(version) >= parse_version(
            "0.5"
        ):
            # The release's own signal is named too, not only the judge rule's finding.
            assert "_ng_failure_class: judge_failed" in text, text
            if parse_version(version) >= parse_version("0.7"):
                assert "NeMo Gym masked the sample (judge_failed)" in text, text
    assert len(judge.calls) == calls_graded  # a refused call is not recorded as graded
    # The run's record of the judge's spend (its calls carry no rollout to charge them to):
    # every call the judge graded, and the failed ones (each judged rollout's at least once),
    # each failed one after all its retries and no graded one retried.
    found = [m for r in caplog.records if (m := SUMMARY.match(r.getMessage()))]
    assert len(found) == 1, caplog.text[-2000:]
    calls, failures, retries = map(int, found[0].groups())
    assert failures >= 2 * ROWS_PER_ENV and calls == calls_graded + failures, found[0].group(0)
    assert retries == failures * JUDGE_RETRY.retries, found[0].group(0)


async def test_the_judge_key_reaches_no_process_config_log_or_trace(
    policy: ScriptedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared stack (the default: a host process owns the relay) with a keyed judge on the
    Responses API: the key is in no other process's command line or environment, not in the
    config NeMo Gym serves, not in a log or a trace; the judge got it on every call."""
    key = "judge-" + secrets.token_urlsafe(24)
    tag, _ = run_tag()
    monkeypatch.setenv("VF_NEMOGYM_TEST_JUDGE_KEY", key)
    monkeypatch.setenv(*tag.split("=", 1))  # the host and the stack inherit it
    async with ScriptedJudge(verdict=EQUAL, key=key) as judge:
        env = nemo_gym_env.load_environment(
            nemo_env="equivalence_llm_judge",
            judge=_judge(judge, "VF_NEMOGYM_TEST_JUDGE_KEY", api="responses"),
            stack_idle_grace=0,
        )
        tasks = _tasks(env)
        async with env.serving():
            assert isinstance(env.stack, SharedStack)
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
            status = await _status(env)
            status_log = Path(str(status["log"]))
            async with aiohttp.ClientSession() as http:
                url = f"{env.stack.lease.head_url}/global_config_dict_yaml"
                async with http.get(url) as response:
                    served = await response.text()
            leaked = [
                pid for pid in pids() if pid != os.getpid()
                and (key in "\0".join(argv_of(pid)) or key.encode() in b"\0".join(environ_of(pid)))
            ]  # fmt: skip
            under_stack = processes_with_env(tag)
            # Every file in the folders the stack's processes run in (NeMo Gym's logs and the
            # generated configs), read while they exist.
            folders = {cwd_of(pid) for pid in under_stack} - {None, Path("/")}
            files = {f: f.read_bytes() for d in folders for f in d.rglob("*") if _small_file(f)}
        assert await gone(tag) == []
    assert len(under_stack) >= 4  # the host and NeMo Gym's servers were looked at
    assert leaked == []
    assert "judge_api_key" in served and key not in served
    assert all(e.ok and e.traces[0].reward == 1.0 for e in eps), [error_text(e) for e in eps]
    assert key not in json.dumps([e.model_dump(mode="json") for e in eps])
    assert any(f.name == "ng_run.log" for f in files) and any(f.suffix == ".yaml" for f in files)
    assert [f for f, data in files.items() if key.encode() in data] == []
    assert key not in status_log.read_text(errors="replace")
    assert judge.calls and judge.chat_calls == 0  # the Responses path, with the key
    # `stack status --json` shows who judges and what it cost (no key).
    assert status["judge"] == {"base_url": judge.base_url, "model": "scripted-judge",
                               "api": "responses"}  # fmt: skip
    assert str(status["judge_stats"]).startswith(f"{len(judge.calls)} calls, 0 failed")


async def _status(env: Any) -> dict[str, Any]:
    from verifiers_nemogym.shared.protocol import request

    return await request(env.stack.lease.directory, {"op": "status"})


def _small_file(path: Path) -> bool:
    return (
        path.is_file()
        and not path.is_symlink()
        and path.stat().st_size < 50_000_000
        and (".venv" not in path.parts)
    )


async def test_a_judge_refusing_the_key_fails_every_rollout_naming_the_judge(
    policy: ScriptedPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VF_NEMOGYM_TEST_JUDGE_KEY", "wrong-key-0123456789")
    async with ScriptedJudge(key="right-key-0123456789") as judge:
        env = nemo_gym_env.load_environment(
            nemo_env="simpleqa",
            shared_stack=False,
            judge=_judge(judge, "VF_NEMOGYM_TEST_JUDGE_KEY"),
        )
        tasks = _tasks(env)
        async with env.serving():
            assert env.stack is None  # stopped at once: the judge was checked first
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
    for episode in eps:
        assert not episode.ok
        assert "the NeMo Gym stack did not start: the judge scripted-judge at" in error_text(
            episode
        )
        assert "refused the key in $VF_NEMOGYM_TEST_JUDGE_KEY (401" in error_text(episode)
    assert judge.calls == [] and policy.calls == []


@pytest.mark.survey  # CI: a failing judge on 0.7.0 (above)
async def test_a_judge_that_goes_down_makes_rollouts_errors_naming_it(
    policy: ScriptedPolicy,
) -> None:
    """equivalence_llm_judge's `/verify` fails when its judge does; over_refusal_detection
    (0.4.0) scores a failed judge call 0.5 ("unclear") instead: both are errors, never
    rewards."""
    async with ScriptedJudge(verdict=EQUAL) as judge:
        env = nemo_gym_env.load_environment(
            nemo_env="equivalence_llm_judge,over_refusal_detection", shared_stack=False,
            judge=_judge(judge),
        )  # fmt: skip
        tasks = _tasks(env)
        assert len({t.data.agent for t in tasks}) == 2
        async with env.serving():
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            judge.fail_status = 503
            began = time.monotonic()
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
            took = time.monotonic() - began
        assert await gone(marker) == []
    assert took < 60  # bounded: the relay's retries, not NeMo Gym's endless ones
    for episode in eps:
        assert not episode.ok and episode.traces[0].rewards.get("nemo_gym") is None
        text = error_text(episode)
        assert "the judge scripted-judge at" in text and "failed: 503" in text, text


# CI runs it on the verifiers pre-release (prime-rl runs verifiers' dev versions); on the
# locked verifiers tests/survey.sh does (tests/run.sh says which CI tests show it there)
@pytest.mark.verifiers_dev
async def test_train_mode_never_records_a_judge_call() -> None:
    """Token ids on the policy's calls only: the judge's calls (made while NeMo Gym verifies)
    leave no node in the trace and no token in a sample."""
    async with (
        TokenServer(packaged_tokenizer()) as policy,
        ScriptedJudge(verdict=EQUAL) as judge,
    ):
        env = nemo_gym_env.load_environment(
            nemo_env="equivalence_llm_judge", shared_stack=False, judge=_judge(judge)
        )
        tasks = _tasks(env)
        async with env.serving():
            eps = await asyncio.gather(
                *(env.run_episode(t, train_context(policy.base_url)) for t in tasks)
            )
    assert len(judge.calls) >= len(tasks)
    judge_prompt = judge.calls[0].prompt[:80]
    for episode in eps:
        assert episode.ok, error_text(episode)
        (trace,) = episode.traces
        assert trace.reward == trace.info["nemo_gym"]["reward"]
        # simple_agent without tools: one policy call per rollout, and only that one.
        assert len(trace.calls) == 1
        assert all(len(node.token_ids) > 0 for node in trace.nodes)
        assert judge_prompt not in json.dumps(trace.model_dump(mode="json"))
