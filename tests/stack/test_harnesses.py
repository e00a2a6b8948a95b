"""NeMo Gym 0.7's coding-agent harness environments, end to end on the real chain: vf-eval (or
Python, or verifiers' env server) -> NeMoGymHarness -> NeMo Gym's environment server and agent
`/run` -> the real CLI from the npm registry -> the model proxy (routed by the rollout id in the
path) -> verifiers' interception -> the answer-key policy. Nothing is mocked but the model.

Rows are the environments' own example rows with each question made unique (a case tag), so
the policy's log tells which rollout every call carried; one row of each environment is
answered right (NeMo Gym's reward 1.0), one wrong (0.0).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from helpers.evals import check_train_episodes, eval_traces, model_context, script, vf_eval_command
from helpers.processes import gone, run_command, run_tag, until
from helpers.stacks import HeldStack, hold_shared_stack, runtime_flags, stack_host_log

import nemo_gym_env
from verifiers_nemogym.metrics import METRICS_FILE
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR, argv_of, processes_with_env
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.answer_key import AnswerKeyPolicy, AnswerRow

# Environment -> the dialect its CLI speaks (path suffix the policy saw), all streaming.
HARNESS = {
    "opencode_math": "chat",  # Chat Completions, direct (routed through policy_model by us)
    "codex_math": "responses",  # Responses, direct
    "claude_code_math": "messages",  # Anthropic Messages, through policy_model
    "cline_math": "chat",  # Chat Completions, through policy_model; needs the overrides below
}
CLASSIC = "math_with_judge"  # a classic `/run` environment (simple_agent), same kind of rows
# What makes cline_math run here, passed the way the package takes NeMo Gym overrides (a config
# path): the pinned cline 3.0.55 is not on the registry. (CLINE_NO_AUTO_UPDATE=1, the other half
# of the native recipe, is set by every stack that runs CLIs.)
CLINE_OVERRIDE = (
    "cline_math_agent:\n  responses_api_agents:\n    cline_agent:\n      cline_version: 3.0.57\n"
)
ROWS_PER_ENV = 2
BUN_UNPACKED = ".*-00000000.so"
"""What OpenCode (a bun executable) unpacks into $TMPDIR at a run and leaves there."""


def case_rows(catalog: Catalog, envs: list[str], path: Path) -> tuple[list[AnswerRow], list[str]]:
    """The first ROWS_PER_ENV example rows of each of `envs`, each question made unique, written
    to `path` (each naming its agent); the answer key in the same order, and each row's env."""
    key, owners, lines = [], [], []
    for env in envs:
        spec = catalog.env(env)
        for i, line in enumerate(spec.dataset().read_text().splitlines()[:ROWS_PER_ENV]):
            row = json.loads(line)
            tag = f" (case {env}-{i})"
            # The tag right after the question in the prompt (Reasoning Gym's prompts add their
            # answer-format instructions after it; the math rows' prompt is the question).
            prompt = row["responses_create_params"]["input"][0]
            question = row["question"]
            if question in prompt["content"]:
                prompt["content"] = prompt["content"].replace(question, question + tag, 1)
            else:
                prompt["content"] += tag
            row["question"] += tag
            row["agent_ref"] = {"type": "responses_api_agents", "name": spec.agent.name}
            lines.append(json.dumps(row))
            # Reasoning Gym's rows (the *_reasoning_gym twins) call the answer `answer`.
            key.append(AnswerRow(row["question"], row.get("expected_answer", row.get("answer"))))
            owners.append(env)
    path.write_text("\n".join(lines) + "\n")
    return key, owners


def wrong_rows(key: list[AnswerRow]) -> frozenset[int]:
    """Every second row of each environment is answered wrong."""
    return frozenset(range(1, len(key), ROWS_PER_ENV))


def _text(value: Any) -> str:
    """Every string inside a parsed JSON value, joined (questions hold backslashes, which a
    JSON dump would escape)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    return "\n".join(_text(v) for v in value) if isinstance(value, list) else ""


def row_of(trace: dict[str, Any], key: list[AnswerRow]) -> int:
    """The answer-key row a trace's task carries (the longest question it quotes)."""
    task = _text(trace["task"])
    return max(
        (i for i, row in enumerate(key) if row.question in task), key=lambda i: len(key[i].question)
    )


def check_every_call_reached_its_own_rollout(
    policy: AnswerKeyPolicy, traces: list[dict[str, Any]], key: list[AnswerRow]
) -> None:
    """Each call the policy got came through the interception session of the rollout whose row
    it quotes (no call cross-routed), and each rollout's trace holds every one of its calls."""
    by_session = {t["id"]: t for t in traces}
    calls = Counter()
    for call in policy.log:
        assert call.session_id in by_session, call  # every call came through verifiers
        calls[call.session_id] += 1
        trace = by_session[call.session_id]
        if call.row is not None:  # side calls (titles) quote no question
            assert call.row == row_of(trace, key), (call.row, trace["id"])
    for trace in traces:
        assert len(trace["calls"]) == calls[trace["id"]] > 0  # every turn in the trace


async def eval_scored(
    runtime: NeMoGymVenv, catalog: Catalog, envs: list[str], override: str, c: int, tmp_path: Path
) -> tuple[AnswerKeyPolicy, list[str], str]:
    """`case_rows` of `envs` through vf-eval at `-c c` on one shared stack (NeMo Gym 0.7.0 on
    `runtime`'s Python, `override` as a config path, results under `tmp_path / "out"`),
    checked: it exits 0, every rollout ok and NeMo Gym's reward of each (1.0 right, 0.0 for the
    `wrong_rows`), every call on its own rollout and in its trace. Returns the policy (its call
    log), each row's environment and the run's tag."""
    key, owners = case_rows(catalog, envs, tmp_path / "rows.jsonl")
    (tmp_path / "override.yaml").write_text(override)
    async with AnswerKeyPolicy(rows=key, wrong=wrong_rows(key)) as policy:
        cmd = vf_eval_command(
            "policy", policy.base_url, "ANSWERS_KEY", len(key), 1, c, tmp_path / "out",
            "--env.taskset.nemo-env", ",".join(envs),
            "--env.taskset.jsonl-path", str(tmp_path / "rows.jsonl"),
            "--env.taskset.config-paths", json.dumps([str(tmp_path / "override.yaml")]),
            "--env.taskset.stack-idle-grace", "0",
            *runtime_flags(runtime),
        )  # fmt: skip
        tag, traces = await eval_traces(cmd, tmp_path / "out", len(key), 1500, ANSWERS_KEY="unused")
    for trace in traces:
        row = row_of(trace, key)
        expected = 0.0 if row in wrong_rows(key) else 1.0
        assert trace["rewards"]["nemo_gym"]["score"] == expected, (owners[row], trace["errors"])
    check_every_call_reached_its_own_rollout(policy, traces, key)
    return policy, owners, tag


@pytest.fixture(scope="module")
def catalog_07(nemo_venv_07: NeMoGymVenv) -> Catalog:
    return Catalog(nemo_venv_07)


HELD_ENVS = ["opencode_math", "claude_code_math"]
"""The config set of the stack the Python API tests here share (`held`)."""


def _on_07(runtime: NeMoGymVenv) -> dict[str, Any]:
    """load_environment options choosing NeMo Gym 0.7.0 on `runtime`'s Python."""
    return {
        "nemo_gym_version": "0.7.0",
        "python": str(runtime.python),
        "allow_python_below_floor": True,
    }


@pytest.fixture(scope="module")
async def held(nemo_venv_07: NeMoGymVenv) -> AsyncIterator[HeldStack]:
    """One shared stack of HELD_ENVS for the tests that run rollouts in this process (a
    harness stack start is the costly part); no process of it is left afterwards."""
    async with hold_shared_stack(nemo_env=HELD_ENVS, **_on_07(nemo_venv_07)) as held:
        yield held


async def test_harness_environments_score_and_never_cross_route(
    nemo_venv_07: NeMoGymVenv, catalog_07: Catalog, tmp_path: Path
) -> None:
    """opencode_math, codex_math and claude_code_math as shipped, cline_math with its override,
    and a classic environment, mixed on one shared stack through vf-eval at -c 4: NeMo Gym's
    rewards (1.0 right, 0.0 wrong), each CLI's own dialect, streaming, every call on its own
    rollout and in its trace, and no process left afterwards (CLIs included), nor a file in the
    machine's temp folder (OpenCode unpacks a library into $TMPDIR at every run)."""
    # Only this file's tests run OpenCode on this machine (elsewhere it runs in containers).
    unpacked = set(Path(tempfile.gettempdir()).glob(BUN_UNPACKED))
    policy, owners, tag = await eval_scored(
        nemo_venv_07, catalog_07, [*HARNESS, CLASSIC], CLINE_OVERRIDE, 4, tmp_path
    )
    dialects = {(owners[c.row], c.dialect, c.stream) for c in policy.log if c.row is not None}
    for env_name, dialect in HARNESS.items():
        assert (env_name, dialect, True) in dialects, dialects
    assert (CLASSIC, "responses", False) in dialects
    # The shared stack's host logs its start, the CLI versions it runs included.
    assert "cline_math_agent (cline@3.0.57)" in stack_host_log(tmp_path / "out")
    assert await gone(tag) == []  # the shared stack, its CLIs and their children: all gone
    assert set(Path(tempfile.gettempdir()).glob(BUN_UNPACKED)) - unpacked == set()


TWINS = {
    "opencode_reasoning_gym": "chat",
    "codex_reasoning_gym": "responses",
    "claude_code_reasoning_gym": "messages",
}
"""The `*_reasoning_gym` twins of the harness environments: the same agents and CLIs on
Reasoning Gym rows (knights-and-knaves puzzles), scored by NeMo Gym's reasoning_gym server."""
# claude_code_reasoning_gym, as shipped, points the CLI at an Anthropic endpoint of its own
# (`${anthropic_base_url}`, `${anthropic_model_name}`, no model server): the override seats the
# policy as claude_code_math does (the `model_server` NeMo Gym's claude_code agent supports).
CLAUDE_TWIN_OVERRIDE = """claude_code_reasoning_gym_agent:
  responses_api_agents:
    claude_code_agent:
      model_server:
        type: responses_api_models
        name: policy_model
      model: ${policy_model_name}
      anthropic_api_key: EMPTY
      anthropic_base_url: null
"""


@pytest.mark.survey  # CI: the same CLIs on their math rows (above)
async def test_reasoning_gym_twins_score(
    nemo_venv_07: NeMoGymVenv, catalog_07: Catalog, tmp_path: Path
) -> None:
    """opencode and codex on Reasoning Gym rows as shipped, claude_code with the override above,
    through vf-eval on one shared stack: NeMo Gym's rewards (1.0 for the right answer, 0.0 for
    a wrong one), each CLI's own dialect, every call on its own rollout, no process left."""
    policy, owners, tag = await eval_scored(
        nemo_venv_07, catalog_07, list(TWINS), CLAUDE_TWIN_OVERRIDE, 3, tmp_path
    )
    dialects = {(owners[c.row], c.dialect) for c in policy.log if c.row is not None}
    assert set(TWINS.items()) <= dialects, dialects
    assert await gone(tag) == []
    # `metrics` on the run: the harness agents keep NeMo Gym's default aggregate, computed by
    # the runtime's own code with no stack; the same bytes the run's stack answered.
    (written,) = (tmp_path / "out").glob(f"*/{METRICS_FILE}")
    tag, env = run_tag()
    code, printed = await run_command(
        [script("nemo-gym-env"), "metrics", str(tmp_path / "out"), "--json"], env, stdout_only=True
    )
    assert code == 0 and printed == written.read_text(), printed[-3000:]
    code, log = await run_command([script("nemo-gym-env"), "metrics", str(tmp_path / "out")], env)
    assert code == 0, log[-3000:]
    assert "without a stack" in log and "starting a private NeMo Gym" not in log, log[-3000:]
    assert await gone(tag) == []


async def test_train_mode_records_token_ids_of_every_harness_call(
    nemo_venv_07: NeMoGymVenv, catalog_07: Catalog, held: HeldStack, tmp_path: Path
) -> None:
    """verifiers' train client on harness environments: opencode's streamed Chat Completions
    calls reach the train client as they are, claude_code's streamed Anthropic Messages calls
    are carried as Chat Completions; every call of every rollout has token ids."""
    case_rows(catalog_07, HELD_ENVS, tmp_path / "rows.jsonl")
    env = nemo_gym_env.load_environment(
        nemo_env=HELD_ENVS, jsonl_path=str(tmp_path / "rows.jsonl"), **_on_07(nemo_venv_07)
    )
    await check_train_episodes(env, held)


def _cli_processes(marker: str) -> list[int]:
    """Live processes of the stack `marker` that run a coding-agent CLI (or its node)."""
    return [
        pid
        for pid in processes_with_env(f"{MARKER_ENV_VAR}={marker}")
        if (argv := argv_of(pid))
        and (
            Path(argv[0]).name in ("opencode", ".opencode")
            or any("/npm/opencode-ai@" in arg for arg in argv[:2])
        )
    ]


DEADLINE = 60.0
"""The rollout deadline of the test below: its CLI has started and called the model well before
it (NeMo Gym's agent starts the CLI after preparing its workspace: under load a 20 s deadline
came first, and the CLI, started after the rollout was stopped, was left to fail on its closed
route)."""


async def test_a_rollout_deadline_stops_its_cli_and_ctrl_c_leaves_nothing(
    nemo_venv_07: NeMoGymVenv, catalog_07: Catalog, held: HeldStack, tmp_path: Path
) -> None:
    """A rollout whose model never answers hits its deadline: it is an error, and its CLI (which
    NeMo Gym's agent would leave running until its own 900 s timeout) is stopped at once. Then
    vf-eval interrupted (Ctrl-C) mid-rollout leaves no process at all, CLIs included."""
    key, _ = case_rows(catalog_07, ["opencode_math"], tmp_path / "rows.jsonl")
    async with AnswerKeyPolicy(rows=key, delay=600.0) as policy:
        # On the held stack (its config set has opencode_math; the rows are opencode_math's).
        env = nemo_gym_env.load_environment(
            nemo_env=HELD_ENVS,
            jsonl_path=str(tmp_path / "rows.jsonl"),
            task={"run_timeout": DEADLINE},
            **_on_07(nemo_venv_07),
        )
        task = next(iter(env.taskset))

        async with env.serving():
            assert held.owns(env)
            marker = held.marker
            rollout = asyncio.ensure_future(env.run_episode(task, model_context(policy)))
            # Until the CLI waits on the model (bounded by the deadline): the CLI runs.
            await until(lambda: policy.log or rollout.done(), DEADLINE + 30, "a model call")
            assert not rollout.done() and _cli_processes(marker)
            episode = await rollout
            assert not episode.ok
            deadline = f"did not return within {DEADLINE:.0f} s"
            assert deadline in json.dumps(episode.traces[0].errors[0].message)
            left = _cli_processes(marker)
            assert left == [], [argv_of(pid) for pid in left]  # stopped, the stack still up
        await held.released()

        # Ctrl-C: vf-eval interrupted while its rollouts' CLIs wait on the model.
        cmd = vf_eval_command(
            "policy", policy.base_url, "ANSWERS_KEY", 2, 1, 2, tmp_path / "out",
            "--env.taskset.nemo-env", "opencode_math",
            "--env.taskset.jsonl-path", str(tmp_path / "rows.jsonl"),
            "--env.taskset.stack-idle-grace", "0",
            *runtime_flags(nemo_venv_07),
        )  # fmt: skip
        tag, environ = run_tag(ANSWERS_KEY="unused")
        before = len(policy.log)
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=environ, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        for _ in range(600):  # bounded: until both rollouts' CLIs wait on the model
            if len(policy.log) >= before + 2:
                break
            await asyncio.sleep(0.5)
        assert len(policy.log) >= before + 2
        os.kill(proc.pid, signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 120)
        assert await gone(tag) == []


async def test_a_cli_that_cannot_install_fails_every_rollout_in_one_line(
    nemo_venv_07: NeMoGymVenv, tmp_path: Path
) -> None:
    """A CLI version the npm registry does not have: the stack does not start (nothing of NeMo
    Gym is spawned), and every rollout is an error whose one line names the install."""
    override = tmp_path / "codex.yaml"
    override.write_text(
        "codex_math_agent:\n  responses_api_agents:\n    codex_agent:\n"
        "      codex_version: 0.0.0-not-released\n"
    )
    env = nemo_gym_env.load_environment(
        nemo_env="codex_math",
        config_paths=[str(override)],
        shared_stack=False,
        nemo_gym_version="0.7.0",
        python=str(nemo_venv_07.python),
        allow_python_below_floor=True,
    )
    tasks = list(env.taskset)[:2]
    async with AnswerKeyPolicy() as policy, env.serving():
        episodes = [await env.run_episode(t, model_context(policy)) for t in tasks]
    assert policy.log == []
    for episode in episodes:
        assert not episode.ok
        message = episode.traces[0].errors[0].message
        assert "codex_agent: `npm install @openai/codex@0.0.0-not-released` failed" in message
        assert "No matching version found" in message
        assert "\n" not in message.strip()


def test_a_config_nemo_gym_cannot_merge_is_one_line_naming_the_key(
    nemo_venv_07: NeMoGymVenv, tmp_path: Path, launches: Any
) -> None:
    """A harness config reading a key nothing defines: refused at load, before anything starts,
    in one line naming the config and the key (NeMo Gym's own reason, not its advice)."""
    from verifiers_nemogym.errors import ConfigError

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "config_paths:\n  - environments/cline_math/config.yaml\n"
        "cline_math_agent:\n  responses_api_agents:\n    cline_agent:\n"
        "      model: ${some_missing_key}\n"
    )
    with pytest.raises(ConfigError) as caught:
        env = nemo_gym_env.load_environment(
            nemo_env="cline_math",
            config_paths=[str(bad)],
            nemo_gym_version="0.7.0",
            python=str(nemo_venv_07.python),
            allow_python_below_floor=True,
        )
        list(env.taskset)
    message = str(caught.value)
    assert "\n" not in message.strip(), message
    assert str(bad) in message and "'some_missing_key', which is not set" in message, message
    assert launches.stacks == []
