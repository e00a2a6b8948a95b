"""`fake_plugin`: NeMo Gym's own docker provider under a name NeMo Gym does not ship, so a stack
runs it only through the `nemo_gym.sandbox_providers` entry point (a real provider: its
sandboxes are real docker containers).

Every container it creates carries `LABEL=1`, which nothing else sets: the test finds the
containers by it, so it knows this provider made them, and that none is left afterwards.
"""

from __future__ import annotations

from typing import Any

from nemo_gym.sandbox.providers.docker import DockerProvider

LABEL = "vf-nemogym-test.fake-plugin"


class FakePluginProvider(DockerProvider):
    name = "fake_plugin"

    def __init__(self, *, create: dict[str, Any] | None = None, **settings: Any) -> None:
        create = dict(create or {})
        extra = [str(arg) for arg in create.get("extra_run_args") or []]
        # Host network: a pass-through provider's sandboxes get no door (nemo-gym-env routes
        # only docker's and OpenSandbox's), so the agent inside reaches the model proxy where
        # NeMo Gym's servers do, on 127.0.0.1. A test double's choice, not a plug-in's.
        create["extra_run_args"] = [*extra, "--label", f"{LABEL}=1", "--network", "host"]
        super().__init__(create=create, **settings)
