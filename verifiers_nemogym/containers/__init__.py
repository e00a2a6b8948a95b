"""NeMo Gym's container environments (agents inside the task's container) on a stack this
package starts (docs/containers.md; each module's job: docs/architecture.md, "Modules").
"""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "sandbox": ("SandboxPlan", "sandbox_plan"),
    "docker": ("check_isolation",),
    "seam": ("StackSandboxes",),
    "kit": ("KitTask", "TaskKit", "make_tasks"),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
