"""prime-rl's process split, built from verifiers' own serve pieces (prime-rl itself cannot be
installed here): the taskset is loaded in one process (prime-rl's orchestrator / `uv run eval`
does `vf.load_taskset(config)` then `list(taskset)`), its tasks travel as JSON
(`task.data.model_dump(mode="json")`) to an env server started as its own process (verifiers'
`serve_env` with a worker pool, what prime-rl spawns per source), and rollouts are driven through
verifiers' `EnvClient` with the eval client and with the train client. Everything is real: NeMo
Gym, verifiers, the proxy; the models are the scripted policy and the token server.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import verifiers.v1 as vf
from helpers.env_servers import EnvServer, load_tasks, train_client
from helpers.evals import error_text
from helpers.processes import REPO, SHARED_STACK_GONE_S, gone, run_tag
from verifiers.v1.configs.client import EvalClientConfig

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.answer_key import AnswerKeyPolicy, load_answer_key
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer
from verifiers_nemogym.util import clean_env, find_uv

ENV = "example_single_tool_call"


def eval_client(policy: ScriptedPolicy) -> EvalClientConfig:
    return EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")


def check_scored(episodes: list[vf.Episode], n: int) -> None:
    assert len(episodes) == n
    assert [e.ok for e in episodes] == [True] * n, [error_text(e) for e in episodes][:2]
    assert [t.reward for e in episodes for t in e.traces] == [1.0] * n
    assert all("nemo_gym" in t.info for e in episodes for t in e.traces)


# CI runs it on the verifiers pre-release (prime-rl runs verifiers' dev versions); on the
# locked verifiers tests/survey.sh does (tests/run.sh says which CI tests show it there)
@pytest.mark.verifiers_dev
async def test_taskset_in_one_process_env_server_in_another_eval_and_train(
    policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """The orchestrator's tasks (JSON, from another process) run on a 2-worker env server with
    the eval client (NeMo Gym's rewards) and the train client (token ids on every call)."""
    tag, env = run_tag(SCRIPTED_KEY="unused", VF_NEMOGYM_TEST_NO_KEY="unused")
    taskset = {"id": "nemo-gym-env", "nemo_env": ENV, "start_timeout": 600}
    tasks = await load_tasks(sys.executable, taskset, env)
    assert len(tasks) == 5 and all(t["row"]["responses_create_params"] for t in tasks)
    server = EnvServer(sys.executable, taskset, env, tmp_path / "env-server.log")
    try:
        episodes = await asyncio.wait_for(server.run(eval_client(policy), "scripted", tasks), 900)
        check_scored(episodes, 5)
        assert len({c.session_id for c in policy.calls}) == 5  # each rollout its own calls
        async with TokenServer(packaged_tokenizer()) as tokens:
            train = train_client(tokens.base_url, "VF_NEMOGYM_TEST_NO_KEY")
            trained = await asyncio.wait_for(server.run(train, "token-server", tasks), 900)
        check_scored(trained, 5)
        for trace in (t for e in trained for t in e.traces):
            assert len(trace.calls) == 2  # call the tool, then answer
            for call in trace.calls:
                assert call.node is not None, call.error
                node = trace.nodes[call.node]
                assert len(node.token_ids) > 0 and len(node.logprobs) == sum(node.mask) > 0
    finally:
        await server.stop()
    assert server.proc.returncode is not None
    assert await gone(tag, SHARED_STACK_GONE_S) == []  # the stack left with its last user


@pytest.mark.survey  # CI: the env-server path (above), harness environments (test_harnesses)
async def test_a_coding_agent_harness_environment_through_the_env_server(
    nemo_venv_07: NeMoGymVenv, tmp_path: Path
) -> None:
    """prime-rl's split with a coding-agent CLI in the agent's seat (claude_code_math: Anthropic
    Messages through NeMo Gym's `policy_model`): tasks loaded in one process, rollouts on the
    env server's workers, NeMo Gym's rewards for a right (1.0) and a wrong (0.0) answer."""
    tag, env = run_tag(ANSWERS_KEY="unused")
    taskset = {
        "id": "nemo-gym-env",
        "nemo_env": "claude_code_math",
        "nemo_gym_version": "0.7.0",
        "python": str(nemo_venv_07.python),
        "allow_python_below_floor": True,
        "start_timeout": 900,
    }
    tasks = (await load_tasks(sys.executable, taskset, env))[:2]
    key = load_answer_key(Catalog(nemo_venv_07).env("claude_code_math").dataset())
    async with AnswerKeyPolicy(rows=key, wrong=frozenset({1})) as policy:
        server = EnvServer(sys.executable, taskset, env, tmp_path / "env-server.log")
        try:
            client = EvalClientConfig(base_url=policy.base_url, api_key_var="ANSWERS_KEY")
            episodes = await asyncio.wait_for(server.run(client, "policy", tasks), 900)
        finally:
            await server.stop()
    assert [e.ok for e in episodes] == [True, True], [error_text(e) for e in episodes]
    assert [t.reward for e in episodes for t in e.traces] == [1.0, 0.0]
    assert {c.dialect for c in policy.log} == {"messages"}
    assert len({c.session_id for c in policy.log}) == 2  # each rollout its own calls
    assert await gone(tag, SHARED_STACK_GONE_S) == []  # CLIs and stack left with the server


@pytest.mark.survey  # CI: a stack that cannot start, through the Python API (test_harnesses.py)
async def test_a_stack_that_cannot_start_fails_every_rollout_through_the_env_server(
    policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """A config NeMo Gym refuses: the env server's workers stay up and every rollout is an
    error carrying the stack's reason, in bounded time (verifiers 0.4.0's pool never notices a
    worker that died in `Env.start`, and its callers would wait forever); nothing is left."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "vf_broken_server:\n"
        "  resources_servers:\n"
        "    no_such_resources_server_impl:\n"
        "      entrypoint: app.py\n"
        "      domain: other\n"
    )
    tag, env = run_tag(SCRIPTED_KEY="unused")
    taskset = {
        "id": "nemo-gym-env",
        "nemo_env": ENV,
        "config_paths": [str(broken)],
        "start_timeout": 300,
    }
    tasks = (await load_tasks(sys.executable, taskset, env))[:3]
    server = EnvServer(sys.executable, taskset, env, tmp_path / "env-server.log")
    began = time.monotonic()
    try:
        episodes = await asyncio.wait_for(server.run(eval_client(policy), "scripted", tasks), 600)
    finally:
        await server.stop()
    assert time.monotonic() - began < 600
    assert policy.calls == []
    for episode in episodes:
        assert not episode.ok
        assert "nemo_gym" not in episode.traces[0].rewards
        text = error_text(episode)
        assert "the NeMo Gym stack did not start" in text, text
        assert "no_such_resources_server_impl" in text, text  # the stack's own reason
    assert await gone(tag, SHARED_STACK_GONE_S) == []


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python 3.12 virtual environment holding this package and the verifiers of the lock,
    as prime-rl's (or `uv run`'s) is: its `bin` leads PATH, its base interpreter is nowhere to
    be found but through its `pyvenv.cfg`."""
    base = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    pythons = sorted(base.glob("3.12*/bin/python3.12"))
    if not pythons:
        pytest.fail(f"no Python 3.12 under {base} to make the user's venv from")
    root = tmp_path_factory.mktemp("prime-rl-like")
    venv = root / "venv"
    uv = str(find_uv())
    clean = clean_env()
    subprocess.run(
        [uv, "venv", "-q", "--python", str(pythons[-1]), str(venv)], check=True, env=clean
    )
    reqs = root / "requirements.txt"
    subprocess.run(
        [uv, "export", "--frozen", "--no-hashes", "--no-dev", "--no-emit-workspace", "-o",
         str(reqs)], check=True, cwd=REPO, env=clean, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-r", str(reqs),
         str(REPO)], check=True, env=clean, timeout=900,
    )  # fmt: skip
    return venv


async def test_cold_cache_from_a_python_312_venv_whose_base_is_not_on_path(
    user_venv: Path, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """prime-rl's shape on a new machine: the loader and the env server run from a 3.12 venv,
    PATH holds that venv's `bin` and the system folders only, no pyenv folder is known, and the
    NeMo Gym cache is empty. The runtime is built from the venv's base interpreter, the stack
    starts (NeMo Gym's per-server `uv venv --python 3.12.x` finds it), and rollouts score."""
    cache = tmp_path / "cache"
    tag, env = run_tag(SCRIPTED_KEY="unused")
    env = {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "VF_NEMOGYM_PYTHON")}
    env |= {
        "PATH": f"{user_venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "PYENV_ROOT": str(tmp_path / "no-pyenv"),
        "VF_NEMOGYM_CACHE": str(cache),
    }
    python = str(user_venv / "bin" / "python")
    taskset = {"id": "nemo-gym-env", "nemo_env": ENV, "start_timeout": 900}
    tasks = await load_tasks(python, taskset, env)
    assert len(tasks) == 5
    assert not (cache / "runtimes").exists()  # loading built no runtime
    server = EnvServer(python, taskset, env, tmp_path / "env-server.log")
    try:
        episodes = await asyncio.wait_for(server.run(eval_client(policy), "scripted", tasks), 1500)
        check_scored(episodes, 5)
    finally:
        await server.stop()
    (runtime,) = (cache / "runtimes").glob("nemo-gym-*")
    recorded = Path(json.loads((runtime / "vf-nemogym-runtime.json").read_text())["python"])
    assert not (recorded.parent.parent / "pyvenv.cfg").exists(), recorded  # the base, not a venv
    assert await gone(tag, SHARED_STACK_GONE_S) == []
