"""Errors a caller of verifiers-nemogym can handle, one class per failure.

Every message names what was wrong and where (file:line, env name, server name...).
"""

from __future__ import annotations


class NeMoGymError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(NeMoGymError, ValueError):
    """Bad user input: unknown environment, malformed row, unparsable YAML, bad option."""


class VenvSetupError(NeMoGymError):
    """The NeMo Gym venv (nemo-gym in its own uv venv) could not be found or created."""


class StackError(NeMoGymError):
    """The NeMo Gym server stack failed to start, died, or could not be reached."""


class AgentRunError(NeMoGymError):
    """One rollout failed inside NeMo Gym: its agent's `/run` returned no result, or a result
    NeMo Gym itself marks as no valid measurement (`mask_sample`: then `failure_kind` and
    `failure_reason` are NeMo Gym's, else None)."""

    def __init__(
        self, message: str, *, failure_kind: str | None = None, failure_reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.failure_kind = failure_kind
        self.failure_reason = failure_reason
