"""The provider seam (docs/containers.md, "Providers"): which provider a stack's configs get, a
provider the package has no module for (NeMo Gym's own, or a plug-in's registered through the
`nemo_gym.sandbox_providers` entry point) fails closed and says in one line what it cannot
promise, and a stack given no sandboxes factory refuses configs that start sandboxes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from helpers.sandboxes import SERVERS

from verifiers_nemogym.cli.list import providers_table
from verifiers_nemogym.containers.providers import provider_table
from verifiers_nemogym.containers.providers.docker import Docker
from verifiers_nemogym.containers.providers.opensandbox import OpenSandbox
from verifiers_nemogym.containers.providers.passthrough import ENTRY_POINT_GROUP, PassThrough
from verifiers_nemogym.containers.sandbox import CONTAINER_POLICY_INSTANCE, sandbox_plan
from verifiers_nemogym.containers.seam import CONFIG_NAME, StackSandboxes, provider_for
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.release import RELEASES
from verifiers_nemogym.nemo.sandboxes import Unprepared, sandbox_servers
from verifiers_nemogym.nemo.venv import NeMoGymVenv

DOCKER = {"sandbox": {"docker": {"create": {"use_init": True}}}}
BUILTIN = RELEASES["0.7.0"].sandbox_providers
PLUGIN = {"sandbox": {"vf_fake_plugin": {"root": "/tmp"}}}
"""A provider NeMo Gym 0.7.0 does not ship: what a plug-in's entry point would register."""
LOG = logging.getLogger("test_seam")


def test_each_plan_gets_its_provider() -> None:
    """docker's module for docker (with what runs beside it), OpenSandbox's alone, the
    pass-through for the rest; OpenSandbox mixed with another provider is one line."""
    choices = {
        "docker": [SERVERS, DOCKER],
        "opensandbox": [SERVERS, {"sandbox": {"opensandbox": {"connection": {}}}}],
        "apptainer": [SERVERS, {"sandbox": {"apptainer": {}}}],
        "plugin": [SERVERS, PLUGIN],
    }
    kinds = {}
    for name, configs in choices.items():
        plan = sandbox_plan(configs)
        assert plan is not None
        kinds[name] = type(provider_for(plan, "m", LOG, builtin=BUILTIN))
    assert kinds == {
        "docker": Docker, "opensandbox": OpenSandbox,
        "apptainer": PassThrough, "plugin": PassThrough,
    }  # fmt: skip
    mixed = sandbox_plan(
        [SERVERS, {"sandbox": {"opensandbox": {}}}, {"tb": {"resources_servers": {
            "terminal_bench_2_1": {"sandbox_provider": {"docker": {}}}}}}]
    )  # fmt: skip
    assert mixed is not None
    with pytest.raises(ConfigError, match="runs 'opensandbox' only alone"):
        provider_for(mixed, "m", LOG, builtin=BUILTIN)


async def test_a_plug_in_provider_is_refused_unless_opted_in_then_one_line_says_what_it_lacks(
    nemo_venv_07: NeMoGymVenv, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider only a NeMo Gym plug-in registers runs through the same contract: without
    the opt-in one line names it and the option, before anything is made; with it, the
    stack's config leaves NeMo Gym's provider as the user named it (no door, no label), and
    one warning names the plug-in's entry point group and what is not promised."""
    refused = StackSandboxes("m", "http://127.0.0.1:9", LOG)
    with pytest.raises(ConfigError) as caught:
        await refused.prepare([SERVERS, PLUGIN], nemo_venv_07, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "'vf_fake_plugin' sandbox provider's containers" in message
    assert "--env.taskset.allow-unisolated-containers true" in message, message
    assert list(tmp_path.iterdir()) == [] and refused.supervisor_args() == []

    caplog.set_level(logging.INFO, logger="test_seam")
    allowed = StackSandboxes("m", "http://127.0.0.1:9", LOG, allow_unisolated=True)
    path = await allowed.prepare([SERVERS, PLUGIN], nemo_venv_07, tmp_path)
    await allowed.stop()
    assert path == tmp_path / CONFIG_NAME and allowed.door is None
    assert allowed.supervisor_args() == []
    config = yaml.safe_load(path.read_text())
    assert CONTAINER_POLICY_INSTANCE not in config and "sandbox" not in config
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"'vf_fake_plugin' (a NeMo Gym plug-in's (entry point group {ENTRY_POINT_GROUP}))" in (
        warning
    )
    assert "run UNISOLATED" in warning, warning
    assert "does not isolate, label, route, bound or sweep them" in warning, warning
    own = sandbox_plan([SERVERS, {"sandbox": {"apptainer": {}}}])
    assert own is not None
    apptainer = provider_for(own, "m", LOG, builtin=BUILTIN)
    with pytest.raises(ConfigError, match="'apptainer' sandbox provider's containers"):
        await apptainer.check(own, allow_unisolated=False)
    await apptainer.check(own, allow_unisolated=True)
    assert "'apptainer' (NeMo Gym's own)" in apptainer.isolation()


def test_list_and_the_docs_print_the_same_provider_table(nemo_venv_07: NeMoGymVenv) -> None:
    """`nemo-gym-env list`'s provider table is docs/containers.md's, row for row, and names
    every provider the release ships."""
    printed = providers_table(nemo_venv_07).splitlines()
    docs = (Path(__file__).parents[2] / "docs" / "containers.md").read_text().splitlines()
    assert provider_table() == printed[2:]
    assert [line for line in provider_table() if line not in docs] == []
    for name in BUILTIN:
        assert f"`{name}`" in "\n".join(provider_table()), name


async def test_a_stack_given_no_sandboxes_factory_refuses_configs_that_start_sandboxes(
    tmp_path: Path,
) -> None:
    """`nemo/` knows no provider: a stack built without one refuses, in one line naming the
    servers, configs whose servers start sandboxes (named, or an agent's default provider),
    and passes the others."""
    default = {"term": {"responses_api_agents": {"anyterminal_agent": {"entrypoint": "app.py"}}}}
    found = sandbox_servers({**SERVERS, **default})
    assert sorted(found) == ["agent", "swepro", "tb", "tb_agent", "term"]
    plan = sandbox_plan([SERVERS, DOCKER, default])
    assert plan is not None
    assert sorted(sandbox_servers(plan.merged)) == sorted(s.instance for s in plan.servers)
    with pytest.raises(ConfigError) as caught:
        await Unprepared().prepare([SERVERS, DOCKER], None, tmp_path)  # type: ignore[arg-type]
    message = str(caught.value)
    assert "\n" not in message and "given no sandbox provider" in message, message
    assert all(server in message.split(" start ")[0] for server in ("agent", "swepro", "tb"))
    assert await Unprepared().prepare([{"plain": SERVERS["plain"]}], None, tmp_path) is None  # type: ignore[arg-type]
