"""Train mode on a real NeMo Gym stack through real verifiers: token ids on every model call.

verifiers' real train client (`TrainClientConfig`, its renderer with the tokenizer built from the
packaged GGUF) drives NeMo Gym's real agents through the proxy's train routes. The model is the
only double: the deterministic token server (`policies.token_server`, real token ids, synthetic
logprobs) for train mode, and the scripted policy for the same rows in eval mode, whose turns are
the same (call the first tool once, then answer), so NeMo Gym's rewards must agree.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from helpers.evals import (
    error_text,
    model_context,
    read_episodes,
    script,
    train_context,
    vf_eval_command,
)
from helpers.processes import SHARED_STACK_GONE_S, gone, run_command, run_tag, wait_gone

import nemo_gym_env
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, processes_with_env
from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
from verifiers_nemogym.policies.local_model import packaged_model_path
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer

ENVS = ["example_single_tool_call", "example_multi_step", "example_multi_turn_gymnasium"]
# Triggers of the token server, appended to a single_tool_call row's question.
EXTRA = {
    "parallel": "[tokens:parallel]",
    "reasoning": "[tokens:reasoning]",
    "parallel+reasoning": "[tokens:parallel][tokens:reasoning]",
    "length": "[tokens:length]",
    "fault500": "[fault:500]",
    "garbage": "[fault:garbage]",
}
OVERLONG = "overlong"
RUN_TIMEOUT = 120


def _rows(path: Path, catalog: Catalog) -> list[dict[str, Any]]:
    """Every packaged row of ENVS, then variants of single_tool_call's first row; written to
    `path` as JSONL (each row names its agent)."""
    rows: list[dict[str, Any]] = []
    for name in ENVS:
        env = catalog.env(name)
        (agent,) = env.agents  # one stack runs all three: every row must name its agent
        agent_ref = {"type": "responses_api_agents", "name": agent.name}
        lines = env.dataset().read_text().splitlines()
        rows += [{"agent_ref": agent_ref, **json.loads(line)} for line in lines if line.strip()]
    base = next(r for r in rows if r["agent_ref"]["name"].startswith("example_single_tool_call"))
    question = base["responses_create_params"]["input"][-1]["content"]
    for label, trigger in [*EXTRA.items(), (OVERLONG, "")]:
        params = {**base["responses_create_params"]}
        params["input"] = [
            *params["input"][:-1],
            {"role": "user", "content": f"{question} <{label}> {trigger}"},
        ]
        rows.append({**base, "responses_create_params": params})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def _question(episode: vf.Episode) -> str:
    return episode.task.data.prompt_text


def _label(episode: vf.Episode) -> str | None:
    text = _question(episode)
    return next((label for label in [*EXTRA, OVERLONG] if f"<{label}>" in text), None)


def _check_tokens(trace: vf.Trace) -> int:
    """Every model call committed an assistant node with token ids, a mask and one logprob per
    sampled token; returns how many calls did."""
    assert trace.calls, "no model call recorded"
    for call in trace.calls:
        assert call.node is not None, f"call without a node: {call.error}"
        node = trace.nodes[call.node]
        assert node.sampled and node.message.role == "assistant"
        # Lists in verifiers 0.4.0, numpy arrays in 0.4.1.dev: only len/sum/iteration on them.
        assert len(node.token_ids) > 0 and len(node.mask) == len(node.token_ids)
        assert node.logprobs is not None and len(node.logprobs) == sum(node.mask) > 0
        assert all(lp == -0.5 for lp in node.logprobs)  # the token server's synthetic value
    return len(trace.calls)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return packaged_tokenizer()


@pytest.fixture
async def servers(tokenizer: Any) -> AsyncIterator[tuple[TokenServer, TokenServer]]:
    """The token server, and one whose context (100 tokens) no prompt here fits."""
    async with TokenServer(tokenizer) as normal, TokenServer(tokenizer, max_model_len=100) as short:
        yield normal, short


def _train_ctx(server: TokenServer) -> vf.ModelContext:
    return train_context(server.base_url)


# CI runs it on the verifiers pre-release (prime-rl runs verifiers' dev versions); on the
# locked verifiers tests/survey.sh does (tests/run.sh says which CI tests show it there)
@pytest.mark.verifiers_dev
async def test_train_mode_records_tokens_on_every_call(
    servers: tuple[TokenServer, TokenServer], tmp_path: Path, secret_watch: Any, catalog: Catalog
) -> None:
    normal, short = servers
    rows = _rows(tmp_path / "rows.jsonl", catalog)
    env = nemo_gym_env.load_environment(
        nemo_env=",".join(ENVS),
        jsonl_path=str(tmp_path / "rows.jsonl"),
        task={"run_timeout": RUN_TIMEOUT},
        stack_idle_grace=0,
    )
    tasks = list(env.taskset)
    assert len(tasks) == len(rows)
    train, train_short = _train_ctx(normal), _train_ctx(short)
    async with ScriptedPolicy() as scripted, env.serving():
        secret_watch.watch(env)
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        live = env.taskset.config.task._live
        eval_ctx = model_context(scripted)
        timings: dict[str, float] = {}

        async def timed(task: vf.Task, ctx: vf.ModelContext, key: str) -> vf.Episode:
            began = time.monotonic()
            try:
                return await env.run_episode(task, ctx)
            finally:
                timings[key] = time.monotonic() - began

        began = time.monotonic()
        trained = await asyncio.gather(
            *(
                timed(t, train_short if OVERLONG in t.data.prompt_text else train, f"t{i}")
                for i, t in enumerate(tasks)
            )
        )
        train_seconds = time.monotonic() - began
        plain = [t for t in tasks if not any(f"<{k}>" in t.data.prompt_text for k in EXTRA)]
        evaluated = await asyncio.gather(*(env.run_episode(t, eval_ctx) for t in plain))
        assert live.proxy.open_routes == 0
    assert await gone(marker) == []

    eval_reward = {_question(e): e.traces[0].reward for e in evaluated}
    assert all(e.ok for e in evaluated), [error_text(e) for e in evaluated if not e.ok]
    calls = tokens = 0
    branches: list[int] = []
    for episode in trained:
        label, trace = _label(episode), episode.traces[0]
        if label in ("fault500", "garbage"):
            # A provider error is the rollout's error, in train mode as in eval mode.
            assert not episode.ok and trace.rewards.get("nemo_gym") is None, label
            if label == "fault500":  # verifiers re-raises the provider's own error
                assert [e.status_code for e in trace.errors] == [500], error_text(episode)
            else:  # verifiers' 502 for an unreadable reply, relayed; our error names it
                assert "provider answered 502" in error_text(episode), error_text(episode)
            continue
        assert episode.ok, f"{_question(episode)[:60]}: {error_text(episode)}"
        if label == OVERLONG:
            # Refused before sampling (a 400 on the call); the agent got NeMo Gym's empty
            # `length` answer, ended its loop, and NeMo Gym verified: a reward, no error.
            assert [c.error.status_code for c in trace.calls if c.error] == [400]
            assert trace.info["nemo_gym"]["reward"] == trace.reward
            continue
        calls += len(trace.calls)
        tokens += _check_tokens(trace)
        branches.append(len(trace.branches))
        # NeMo Gym's reward is the trace's.
        assert trace.reward == trace.info["nemo_gym"]["reward"]
        if label == "length":
            assert [c.finish_reason for c in trace.calls] == ["length"]
            continue
        if label is None:
            assert trace.reward == eval_reward[_question(episode)], _question(episode)
        # One training sample, except where Qwen2.5's template drops past reasoning when it
        # re-renders the next prompt (documented in docs/training.md).
        expected = 2 if label is not None and "reasoning" in label else 1
        assert len(trace.branches) == expected, (label, _question(episode)[:60])
        if expected == 1:
            (branch,) = trace.branches
            assert sum(branch.sampled_mask) == sum(sum(n.mask) for n in branch.nodes if n.sampled)
        if label is not None and "parallel" in label:
            node = trace.nodes[trace.calls[0].node]
            assert len(node.message.tool_calls or []) == 2
    assert calls == tokens > len(trained)
    print(
        f"TRAIN-MODE {len(trained)} rollouts in {train_seconds:.1f} s "
        f"(slowest {max(timings.values()):.1f} s); calls with tokens {tokens}/{calls}; "
        f"branches per rollout {sorted(branches)}"
    )
    texts = {f"trace {e.traces[0].id}": json.dumps(e.traces[0].to_record()) for e in trained}
    texts |= {f"errors {i}": error_text(e) for i, e in enumerate(trained)}
    secret_watch.assert_absent(texts)


@pytest.mark.survey  # CI: the real model in eval mode (policies/test_local_model.py)
def test_eval_local_train_records_real_tokens_and_logprobs(tmp_path: Path) -> None:
    """`nemo-gym-env eval-local --train`: the packaged model on llama.cpp behind the generate
    adapter, verifiers' train client, one rollout. The model's wording is never asserted: only
    that every call recorded real ids and real (finite, varying) logprobs, that the rollout is
    one branch whose prompts extend each other, and that NeMo Gym's reward is on the trace."""
    tag, env = run_tag()  # inherited by every process the command starts
    outdir = tmp_path / "out"
    cmd = [
        script("nemo-gym-env"), "eval-local", ENVS[0],
        "--train", "-n", "1", "-c", "1", "-o", str(outdir),
    ]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.run(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.monotonic() - began
    log = proc.stdout.decode(errors="replace")
    # The shared stack's host outlives the command by its idle grace, then stops everything.
    survivors = processes_with_env(tag)
    assert wait_gone(survivors, SHARED_STACK_GONE_S), f"processes left behind: {survivors}"
    assert proc.returncode == 0, log[-6000:]
    (episode,) = read_episodes(outdir)
    assert episode["ok"], episode["errors"]
    (trace,) = episode["traces"]
    assert trace["rewards"]["nemo_gym"]["score"] == trace["info"]["nemo_gym"]["reward"]
    nodes, calls = trace["nodes"], trace["calls"]
    assert calls
    logprobs: list[float] = []
    for call in calls:
        node = nodes[call["node"]]
        assert node["token_ids"] and len(node["mask"]) == len(node["token_ids"])
        assert len(node["logprobs"]) == sum(node["mask"]) > 0
        logprobs += node["logprobs"]
    # Real logprobs: finite, at most 0, not one synthetic constant.
    assert all(-1e4 < lp <= 0 for lp in logprobs) and len(set(logprobs)) > 1
    # One branch: every call's assistant node lies on the path to the last one.
    leaves = set(range(len(nodes))) - {n.get("parent") for n in nodes} - {None}
    assert len(leaves) == 1, f"{len(leaves)} branches"
    summary = f"train mode: {len(calls)}/{len(calls)} model calls recorded token ids"
    assert summary in log, log[-3000:]
    print(
        f"EVAL-LOCAL-TRAIN 1 rollout, {len(calls)} calls, {len(logprobs)} sampled tokens, "
        f"reward {trace['info']['nemo_gym']['reward']}, {seconds:.0f} s"
    )


async def test_vf_eval_train_client_and_turn_limit_stop(tokenizer: Any, tmp_path: Path) -> None:
    """docs/training.md's command: `vf-eval nemo-gym-env --client.type train ...` against a
    vLLM-compatible server (the token server). With `--env.agent.max-turns 1` verifiers refuses
    the second call as in eval mode: the rollout stops, NeMo Gym verifies, the reward stays, and
    the one call made recorded its tokens."""
    tag, env = run_tag()
    out = tmp_path / "out"
    async with TokenServer(tokenizer) as server:
        cmd = vf_eval_command(
            "token-server", server.base_url, "VF_NEMOGYM_TEST_NO_KEY", 3, 1, 3, out,
            "--client.type", "train",
            "--client.renderer-model-name", str(tokenizer_dir(packaged_model_path())),
            "--client.renderer.name", "default", "--client.renderer.tool-parser", "qwen3",
            "--client.renderer.reasoning-parser", "think",
            "--env.taskset.nemo-env", ENVS[0], "--env.agent.max-turns", "1",
            "--env.taskset.stack-idle-grace", "0",
        )  # fmt: skip
        code, log = await run_command(cmd, env, timeout=600)
    assert code == 0, log[-3000:]
    assert await gone(tag) == []
    episodes = read_episodes(out)
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 3 and all(e["ok"] for e in episodes), [e["errors"] for e in episodes]
    for trace in traces:
        assert trace["stop_condition"] == "max_turns"
        assert trace["rewards"]["nemo_gym"]["score"] == trace["info"]["nemo_gym"]["reward"]
        (call,) = trace["calls"]  # the refused second call never reached the model
        node = trace["nodes"][call["node"]]
        assert len(node["logprobs"]) == sum(node["mask"]) > 0
        assert node["message"]["tool_calls"], "the first call was the tool call"
    assert len(server.calls) == 3
    written = [p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()]
    assert all("vf_nemogym_secret" not in text for text in [*written, log])
