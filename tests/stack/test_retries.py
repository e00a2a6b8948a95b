"""Transient provider errors on a real NeMo Gym stack through real verifiers, eval and train.

A 429, a 503 or a garbled answer that clears up within the proxy's retries is a success with
exactly the turns (and, in train mode, the sampled tokens) of a rollout that saw no fault: the
failed attempts left no node, only their error records on `trace.calls`. One that does not clear
up is the rollout's error after 3 attempts, counted where they arrive; a 400 after exactly one.
The models are the only doubles: the scripted policy (eval) and the token server (train), with
their `[fault:MODE]` / `[fault:MODExN]` triggers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import verifiers.v1 as vf
from helpers import error_text, gone, model_context, run_timed, write_rows
from renderers.configs import DefaultRendererConfig
from verifiers.v1.configs.client import TrainClientConfig

import nemo_gym_env
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
from verifiers_nemogym.policies.local_model import packaged_model_path
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer

RUN_TIMEOUT = 60
CLEAN = "weather in Rome?"
RECOVERS = {  # trigger -> failed attempts before the success
    "[fault:429x1]": 1,
    "[fault:503x2]": 2,
    "[fault:garbagex1]": 1,
}
FAILS = {"[fault:503]": (503, 3), "[fault:400]": (400, 1)}  # -> (status, attempts)


def _train_ctx(server: TokenServer) -> vf.ModelContext:
    client = TrainClientConfig(
        base_url=server.base_url,
        api_key_var="VF_NEMOGYM_TEST_NO_KEY",
        renderer=DefaultRendererConfig(tool_parser="qwen3", reasoning_parser="think"),
        renderer_model_name=str(tokenizer_dir(packaged_model_path())),
    )
    return vf.ModelContext(model="token-server", client=client)


def _committed(trace: vf.Trace) -> list[Any]:
    return [c for c in trace.calls if c.node is not None]


def _check(
    mode: str, by_text: dict[str, vf.Episode], durations: dict[str, float], sent: dict[str, int]
) -> None:
    """`sent`: calls the model server saw per trigger."""
    clean = by_text[CLEAN].traces[0]
    assert by_text[CLEAN].ok and clean.reward == 1.0, error_text(by_text[CLEAN])
    turns = len(_committed(clean))
    assert turns == 2  # the tool call, then the answer
    for trigger, failed in RECOVERS.items():
        episode = by_text[f"{trigger} {CLEAN}"]
        trace = episode.traces[0]
        assert episode.ok and trace.reward == 1.0, (mode, trigger, error_text(episode))
        # Exactly the clean rollout's turns; each failed attempt left an error record, no node.
        assert len(_committed(trace)) == turns, (mode, trigger)
        assert len(trace.nodes) == len(clean.nodes), (mode, trigger)
        assert len([c for c in trace.calls if c.error is not None]) == failed, (mode, trigger)
        assert sent[trigger] == failed + (turns if mode == "eval" else 0), (mode, trigger, sent)
        if mode == "train":
            # One sample, with exactly the sampled tokens of the clean rollout: none twice.
            (branch,) = trace.branches
            (clean_branch,) = clean.branches
            assert sum(branch.sampled_mask) == sum(clean_branch.sampled_mask) > 0, trigger
    for trigger, (status, attempts) in FAILS.items():
        text = f"{trigger} {CLEAN}"
        episode = by_text[text]
        trace = episode.traces[0]
        assert not episode.ok and trace.rewards.get("nemo_gym") is None, (mode, trigger)
        assert [e.status_code for e in trace.errors] == [status], (mode, error_text(episode))
        assert sent[trigger] == attempts, (mode, trigger, sent)
        assert len(trace.calls) == attempts and not _committed(trace), (mode, trigger)
        # Ended by the retries running out (backoff at most 1.5 s), not by the deadline.
        assert durations[text] < RUN_TIMEOUT / 3, (mode, trigger, durations[text])
        print(f"RETRIES {mode} {trigger}: {durations[text]:.1f} s: {error_text(episode)[:200]}")


async def test_transient_errors_are_retried_without_duplicating_turns_or_tokens(tmp_path: Path):
    texts = [CLEAN, *(f"{t} {CLEAN}" for t in [*RECOVERS, *FAILS])]
    env = nemo_gym_env.load_environment(
        jsonl_path=str(write_rows(tmp_path / "rows.jsonl", texts)),
        task={"run_timeout": RUN_TIMEOUT},
    )
    tasks = list(env.taskset)
    async with (
        ScriptedPolicy(retry_after="1") as policy,
        TokenServer(packaged_tokenizer()) as tokens,
        env.serving(),
    ):
        marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
        live = env.taskset.config.task._live
        results: dict[str, tuple[dict[str, vf.Episode], dict[str, float]]] = {}
        for mode, ctx in (("eval", model_context(policy)), ("train", _train_ctx(tokens))):
            episodes, durations = await run_timed(env, tasks, ctx)
            results[mode] = ({e.task.data.prompt_text: e for e in episodes}, durations)
        assert live.proxy.open_routes == 0
    assert await gone(marker) == []
    triggers = [*RECOVERS, *FAILS]
    eval_sent = {t: sum(t in c.prompt for c in policy.calls) for t in triggers}
    # The token server records its fault answers by trigger (its successes are in `calls`).
    train_sent = {t: tokens.faults.count(t[len("[fault:") : -1]) for t in triggers}
    # Retries carry the SDK's marker, so verifiers would replay a turn it had committed.
    assert {c.retry_count for c in policy.calls} == {None, "1", "2"}
    _check("eval", *results["eval"], eval_sent)
    _check("train", *results["train"], train_sent)
