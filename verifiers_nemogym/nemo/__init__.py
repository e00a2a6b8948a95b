"""The NeMo Gym side: its releases, runtime, files and process tree (docs/architecture.md,
"Modules"). Nothing here imports `nemo_gym`: NeMo Gym runs in its own venv and process tree.
"""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "release": ("RELEASES", "Features", "features", "release_row"),
    "venv": ("NeMoGymVenv", "ensure_venv"),
    "answers": ("read_json_answer",),
    "judges": ("judge_refs",),
    "rewards": ("RewardRange",),
    "ray_cluster": ("RayCluster",),
    "catalog": ("Catalog", "EnvSpec", "merge_configs"),
    "stack": ("NeMoGymStack", "start_stack"),
    "attached": ("AttachedTarget", "describe_attached"),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
