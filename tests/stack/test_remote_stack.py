"""Attaching to a NeMo Gym stack started elsewhere by its head server URL (`stack_url`).

The stack is started by `NeMoGymStack` directly (as a user's own `ng_run` would be), with its
`policy_model` at an address the env's proxy then binds. Real NeMo Gym, real verifiers; the
model is the scripted policy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from helpers.evals import error_text, model_context

import nemo_gym_env
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import free_port, serve_app
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.stack_access import AttachedStack

ENV = "example_single_tool_call"


async def _start_elsewhere(venv: NeMoGymVenv, extra_configs: tuple[Path, ...] = ()) -> NeMoGymStack:
    """A started stack of ENV (plus `extra_configs`) as a user's own `ng_run` would be: its
    `policy_model` names a free 127.0.0.1 port, which the env's proxy binds on attaching.

    NeMo Gym waits for every server it lists, `policy_model` included, to answer HTTP before
    the stack is ready; a user's own stack would have its model there. The port is held by a
    bare server during the start, then freed for the env's proxy."""
    placeholder, policy_port = await serve_app(web.Application())
    stack = NeMoGymStack(
        venv,
        [*Catalog(venv).env(ENV).config_paths, *extra_configs],
        policy_host="127.0.0.1",
        policy_port=policy_port,
        start_timeout=600,
    )
    try:
        await stack.start()
    finally:
        await placeholder.cleanup()
    return stack


async def _start_error(env: Any, policy: ScriptedPolicy) -> str:
    """The error a rollout of `env` ends with when its start failed (a start raises nothing:
    that would kill verifiers' env-server worker), checked to be one line, with nothing of the
    env left and the model never called."""
    async with env.serving():
        episode = await env.run_episode(next(iter(env.taskset)), model_context(policy))
    assert not episode.ok and env._proxy is None and policy.calls == []
    text = error_text(episode)
    assert "\n" not in text, text
    return text


async def test_attach_by_stack_url(nemo_venv: NeMoGymVenv, policy: ScriptedPolicy) -> None:
    stack = await _start_elsewhere(nemo_venv)
    policy_port = stack.policy_port
    try:
        # Unreachable head server: one line, nothing started.
        env = nemo_gym_env.load_environment(
            nemo_env=ENV, stack_url=f"http://127.0.0.1:{free_port()}"
        )
        assert "is unreachable" in await _start_error(env, policy)
        # A proxy port the stack's policy_model does not name: the config does not match.
        env = nemo_gym_env.load_environment(
            nemo_env=ENV, stack_url=stack.head_url, proxy_port=free_port()
        )
        assert f"policy_model at 127.0.0.1:{policy_port}" in await _start_error(env, policy)
        # The matching address (port 0 takes the policy_model's): rollouts run on that stack.
        env = nemo_gym_env.load_environment(nemo_env=ENV, stack_url=stack.head_url)
        tasks = list(env.taskset)
        async with env.serving():
            assert env._proxy is not None and env._proxy.port == policy_port
            assert isinstance(env.stack, AttachedStack)  # nothing of ours started
            assert env.stack_marker is None
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
        assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps]
        assert all(t.reward == 1.0 for e in eps for t in e.traces)
        assert len(policy.calls) == 2 * len(tasks)
        await stack.check_alive()  # the stack belongs to its starter: still up
    finally:
        await stack.stop()


def _posts_to_run(stack: NeMoGymStack, server: str) -> int:
    """How many `POST /run` requests `server` of `stack` answered, from its uvicorn access log
    (NeMo Gym prefixes each server's lines with its name; on only with the access log)."""
    return stack.ng_log.server_tail(server, n=100_000).count('"POST /run ')


@pytest.mark.survey  # CI: attaching by stack_url (above)
async def test_attach_by_stack_url_on_07_posts_run_to_the_environment_server(
    nemo_venv_07: NeMoGymVenv, policy: ScriptedPolicy, tmp_path: Path
) -> None:
    """NeMo Gym 0.7 fronts each agent with an environment server, and its own rollout
    collection posts `/run` there (which relays to the agent). A stack attached by `stack_url`
    must be used the same way as one this package starts: every rollout through the front."""
    agent, front = f"{ENV}_simple_agent", f"{ENV}_environment_server"
    # NeMo Gym silences its servers' access logs unless asked: they are what shows, end to end,
    # which server each `/run` reached.
    access_log = tmp_path / "access_log.yaml"
    access_log.write_text("uvicorn_logging_show_200_ok: true\n")
    stack = await _start_elsewhere(nemo_venv_07, (access_log,))
    try:
        options: dict[str, Any] = {
            "nemo_gym_version": nemo_venv_07.nemo_gym_version,
            "python": str(nemo_venv_07.python),
            "allow_python_below_floor": nemo_venv_07.below_floor,
        }
        env = nemo_gym_env.load_environment(nemo_env=ENV, stack_url=stack.head_url, **options)
        tasks = list(env.taskset)
        async with env.serving():
            assert isinstance(env.stack, AttachedStack)  # nothing of ours started
            run_targets = dict(env.stack.run_urls)
            eps = await asyncio.gather(*(env.run_episode(t, model_context(policy)) for t in tasks))
        assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps]
        assert all(t.reward == 1.0 for e in eps for t in e.traces)
        # End to end: the environment server answered every rollout's `/run`; the agent got
        # each one once, relayed by it.
        assert (_posts_to_run(stack, front), _posts_to_run(stack, agent)) == (
            len(tasks),
            len(tasks),
        )
        # The mapping: the stack's own run targets, i.e. the front, not the agent.
        assert run_targets == stack.run_urls
        assert run_targets[agent] == stack.servers[front] != stack.agents[agent]
    finally:
        await stack.stop()
