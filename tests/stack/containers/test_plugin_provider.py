"""A sandbox provider that a NeMo Gym plug-in registers through its `nemo_gym.sandbox_providers`
entry point runs a rollout, with no change to this package: the plug-in's package reaches the
servers' venvs through `sandbox_packages`, NeMo Gym's registry finds it there, and the stack
passes it through (`containers/providers/passthrough.py`).

The plug-in is `tests/stack/containers/fake_provider/`, a real provider in disguise: NeMo Gym's
own docker provider registered as `fake_plugin`, which labels its containers and runs them on
the host's network (the module says why). The task is the kit's swebench_pro `tinycalc`,
OpenCode in its container, the fixer policy making the right fix.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import yaml
from helpers.evals import model_context
from helpers.processes import gone

import nemo_gym_env
from verifiers_nemogym.containers import docker
from verifiers_nemogym.containers.kit import make_tasks
from verifiers_nemogym.containers.providers.passthrough import ENTRY_POINT_GROUP
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR
from verifiers_nemogym.nemo.venv import NeMoGymVenv
from verifiers_nemogym.policies.fixer import FixerPolicy

PLUGIN = Path(__file__).with_name("fake_provider")
LABEL = "vf-nemogym-test.fake-plugin"
"""The label the plug-in's provider puts on every container it creates
(`fake_nemo_gym_provider.LABEL`)."""


def plugin_containers(*args: str) -> list[str]:
    return docker.run_docker("ps", "-aq", "--filter", f"label={LABEL}", *args).split()


async def test_a_plugin_provider_registered_by_entry_point_runs_a_rollout(
    nemo_venv_07: NeMoGymVenv,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The plug-in's package given as `sandbox_packages` (a local package folder), its provider
    named by a config block as a NeMo Gym user names one, with the opt-in: one rollout scores
    NeMo Gym's 1.0 in a container that provider created (its label, the task's image), the
    stack's one warning names the provider and the entry point group, and afterwards no
    container of the provider and no process of the stack is left."""
    assert plugin_containers() == []  # a leftover would make the evidence below meaningless
    kit = make_tasks(tmp_path / "kit", envs=("swebench_pro",))
    task = kit.task("swebench_pro")
    provider = tmp_path / "fake_plugin.yaml"
    # The block NeMo Gym's agents reference (`sandbox_provider: sandbox`), naming the plug-in's
    # provider instead of one of NeMo Gym's own configs. Not empty: NeMo Gym 0.7.0's start
    # reads the first key below every top-level block's first key (IndexError on `{}`).
    block = {"fake_plugin": {"probe": {"deadline_s": 60}}}
    provider.write_text(yaml.safe_dump({"sandbox": block}))
    caplog.set_level(logging.INFO, logger="verifiers_nemogym")
    env = nemo_gym_env.load_environment(
        config_paths=[*task.config_paths, str(provider), str(task.override)],
        jsonl_path=str(task.rows),
        agent=task.agent,
        nemo_gym_version=nemo_venv_07.nemo_gym_version,
        python=str(nemo_venv_07.python),
        allow_python_below_floor=nemo_venv_07.below_floor,
        shared_stack=False,
        allow_unisolated_containers=True,
        sandbox_packages=[str(PLUGIN)],
    )
    since = time.time()
    try:
        async with FixerPolicy(tasks=[task.fix]) as policy, env.serving():
            assert env.start_error is None, env.start_error
            marker = env.stack_marker
            assert marker is not None
            episode = await env.run_episode(next(iter(env.taskset)), model_context(policy))
        assert episode.ok, [t.errors for t in episode.traces]
        assert episode.traces[0].reward == 1.0, episode.traces[0].rewards
        assert any(c.step == "fix" for c in policy.log), [c.step for c in policy.log]
        # The containers the rollout ran in were created by the plug-in's provider: only it
        # sets the label, and it ran the task's image.
        created = docker.run_docker(
            "events", "--since", f"{since:.0f}", "--until", f"{time.time() + 1:.0f}",
            "--filter", f"label={LABEL}=1", "--filter", "event=create",
            "--format", "{{json .Actor.Attributes}}",
        ).splitlines()  # fmt: skip
        images = {json.loads(line)["image"] for line in created}
        assert created and images <= {task.image}, created
        warned = [r.getMessage() for r in caplog.records if "run UNISOLATED" in r.getMessage()]
        assert warned and set(warned) == {warned[0]}, warned
        plugin = f"'fake_plugin' (a NeMo Gym plug-in's (entry point group {ENTRY_POINT_GROUP}))"
        assert plugin in warned[0], warned
        assert "and 1 package(s) of sandbox_packages" in caplog.text
        # NeMo Gym's provider removed its containers at the rollout's end; nothing else would.
        assert plugin_containers() == []
        assert await gone(f"{MARKER_ENV_VAR}={marker}") == []
    finally:
        if leftover := plugin_containers():  # no orphan, whatever failed above
            docker.run_docker("rm", "-f", *leftover)
