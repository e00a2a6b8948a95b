"""Conformance: NeMo Gym's own recorded rollouts, replayed through nemo-gym-env, score as recorded.

`run_conformance` turns each recording back into its row and runs them all on one stack with
`ReplayPolicy` as the model; each reward is compared with the recorded one (exact float
equality), and a difference carries a reason (docs/conformance.md). Printing and the exit status
are the CLI's (`nemo-gym-env conformance`).
"""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "run": ("run_conformance", "run_in_stacks"),
    "report": ("format_report",),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
