"""Who the judge is: `Judge`, an endpoint and its key (named by `judge/config.py`'s
`--env.taskset.judge.*`, or the `stack` commands' `--judge.*`).

Contract: a `Judge` carries its own key (`key`) and headers, which are secrets: never in its
repr, `public()`, `identity()` or `to_dict()`. They leave the process that read them only as
`secrets()`, which a shared stack's host gets on its stdin (`shared/protocol.py`), and reach the
judge only through the relay (`judge/relay.py`), never NeMo Gym's config, command lines or
environment.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Judge:
    """A judge endpoint: what NeMo Gym's judge calls reach, and (`public()`) what a trace
    records as the judge that graded it. `key_var` names the environment variable the key was
    read from ("" for a judge that needs none, e.g. the local model)."""

    base_url: str
    model: str
    api: Literal["chat", "responses"] = "chat"
    key_var: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra headers on every judge call; treated like the key (some providers put keys in
    headers)."""
    enable_optional: bool = False
    """Also turn on the judges NeMo Gym ships switched off (math_with_judge, polymath)."""
    timeout: float = 600.0
    """Seconds one judge call may take upstream."""
    key: str | None = field(default=None, repr=False, compare=False)
    """The judge's key (None: it takes none)."""

    def describe(self) -> str:
        return f"{self.model} at {self.base_url} ({self.api})"

    def public(self) -> dict[str, Any]:
        """What traces, logs and a shared stack's status may hold (no secret)."""
        return {"base_url": self.base_url, "model": self.model, "api": self.api}

    def identity(self) -> dict[str, Any]:
        """What makes two judges the same judge for a shared stack: the endpoint, digests of
        the key and headers (never their values), and which judges it turns on."""
        digest = hashlib.sha256(self.key.encode()).hexdigest()[:16] if self.key else "none"
        headers = json.dumps(self.headers, sort_keys=True).encode()
        return {
            **self.public(),
            "headers_sha256": hashlib.sha256(headers).hexdigest()[:16],
            "key_sha256": digest,
            "enable_optional": self.enable_optional,
        }

    def secret_values(self) -> list[str]:
        """The key and header values: what redaction must know."""
        return [*([self.key] if self.key else []), *self.headers.values()]

    def scrubbed(self, env: Mapping[str, str]) -> dict[str, str]:
        """A child's environment `env` without the variable holding the key: the one place a
        process that is not the relay's loses it (NeMo Gym's servers, a shared stack's host,
        which gets it on its stdin instead)."""
        return {
            name: value for name, value in env.items() if not self.key_var or name != self.key_var
        }

    def to_dict(self) -> dict[str, Any]:
        """Every field but the secrets (`secrets()` carries those)."""
        return {
            "base_url": self.base_url, "model": self.model, "api": self.api,
            "key_var": self.key_var, "enable_optional": self.enable_optional,
            "timeout": self.timeout,
        }  # fmt: skip

    def secrets(self) -> dict[str, Any]:
        """The key and headers, for a process that must hold them (passed on a pipe)."""
        return {"key": self.key, "headers": dict(self.headers)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], secrets: dict[str, Any] | None = None) -> Judge:
        """The judge of `to_dict()` and `secrets()` together."""
        secrets = secrets or {}
        key = secrets.get("key")
        return cls(
            **data,
            headers={str(k): str(v) for k, v in (secrets.get("headers") or {}).items()},
            key=key if isinstance(key, str) else None,
        )
