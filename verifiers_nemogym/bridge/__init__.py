"""The bridge between NeMo Gym's agents and verifiers' rollout endpoints: the model proxy, the
shared stack's front forwarder, and the wire objects they read and write (Responses, Chat
Completions, redaction). It knows neither side's internals, only their protocols."""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "proxy": ("NeMoGymModelProxy", "ProxyLimits", "Route"),
    "front": ("FrontForwarder", "FrontUser"),
    "wire": ("ConnectionGate",),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
