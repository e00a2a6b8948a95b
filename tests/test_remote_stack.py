"""Attaching to a NeMo Gym stack started elsewhere by its head server URL (`stack_url`).

The stack is started by `NeMoGymStack` directly (as a user's own `ng_run` would be), with its
`policy_model` at an address the env's proxy then binds. Real NeMo Gym, real verifiers; the
model is the scripted policy.
"""

from __future__ import annotations

import asyncio

import pytest
import verifiers.v1 as vf
from aiohttp import web
from verifiers.v1.configs.client import EvalClientConfig

import nemo_gym_env
from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.net import free_port, serve_app
from verifiers_nemogym.policies.scripted import ScriptedPolicy

pytestmark = pytest.mark.stack

ENV = "example_single_tool_call"


async def test_attach_by_stack_url(nemo_venv: NeMoGymVenv, policy: ScriptedPolicy) -> None:
    # NeMo Gym waits for every server it lists, `policy_model` included, to answer HTTP before
    # the stack is ready; a user's own stack would have its model there. Hold the port with a
    # bare server during the start, then free it for the env's proxy.
    placeholder, policy_port = await serve_app(web.Application())
    stack = NeMoGymStack(
        nemo_venv,
        Catalog(nemo_venv).env(ENV).config_paths,
        policy_host="127.0.0.1",
        policy_port=policy_port,
        start_timeout=600,
    )
    try:
        await stack.start()
    finally:
        await placeholder.cleanup()
    try:
        # Unreachable head server: one line, nothing started.
        env = nemo_gym_env.load_environment(
            nemo_env=ENV, stack_url=f"http://127.0.0.1:{free_port()}"
        )
        with pytest.raises(StackError, match="unreachable") as caught:
            async with env.serving():
                pass
        assert "\n" not in str(caught.value) and env._proxy is None
        # A proxy port the stack's policy_model does not name: the config does not match.
        env = nemo_gym_env.load_environment(
            nemo_env=ENV, stack_url=stack.head_url, proxy_port=free_port()
        )
        with pytest.raises(ConfigError, match=f"policy_model at 127.0.0.1:{policy_port}"):
            async with env.serving():
                pass
        assert env._proxy is None
        # The matching address (port 0 takes the policy_model's): rollouts run on that stack.
        env = nemo_gym_env.load_environment(nemo_env=ENV, stack_url=stack.head_url)
        tasks = list(env.taskset)
        client = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")
        ctx = vf.ModelContext(model="scripted", client=client)
        async with env.serving():
            assert env._proxy is not None and env._proxy.port == policy_port
            assert env._lease is None and env._stack is None  # nothing of ours started
            eps = await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))
        assert [e.ok for e in eps] == [True] * len(tasks), [e.errors for e in eps]
        assert all(t.reward == 1.0 for e in eps for t in e.traces)
        assert len(policy.calls) == 2 * len(tasks)
        await stack.check_alive()  # the stack belongs to its starter: still up
    finally:
        await stack.stop()
