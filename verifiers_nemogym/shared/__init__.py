"""The shared stack: one NeMo Gym stack per machine and config set, leased by every env process
that asks for it, here or on other hosts (docs/shared-stacks.md; each module's job:
docs/architecture.md, "Modules").
"""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "client": ("HostInfo", "Lease", "attach_or_start"),
    "gate_client": ("GateLink", "GateTarget", "describe_gate"),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
