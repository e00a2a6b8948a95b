"""The judge NeMo Gym's LLM-judge environments grade with: who it is and its key
(`endpoint`), the relay NeMo Gym's judge calls go through (`relay`), and how a failed judge call
is charged to a rollout (`blame`). NeMo Gym's config idioms for judges stay with the other NeMo
Gym config code (`nemo/judges.py`); the test doubles with the other doubles (`policies/`)."""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "endpoint": ("Judge",),
    "config": ("NeMoGymJudgeConfig",),
    "relay": ("JudgeRelay",),
    "blame": ("JudgeFailure", "JudgeStatus"),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
