"""The taskset's judge option, `--env.taskset.judge.*` (`NeMoGymJudgeConfig`): verifiers' judge
endpoint config, turned into the `Judge` a stack runs (`endpoint()`, which reads the key).

Kept apart from `judge/endpoint.py` so that processes that only run a judge (a shared stack's
host) do not import verifiers.
"""

from __future__ import annotations

import os
from typing import Literal, Self

import verifiers.v1 as vf
from pydantic import model_validator

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.judge.endpoint import Judge


class NeMoGymJudgeConfig(vf.JudgeConfig):
    """The judge NeMo Gym's LLM-judge environments grade with, under `--env.taskset.judge.*`:
    verifiers' judge endpoint (`base_url`, `model`, `api_key_var`, `headers`, `timeout`) plus
    which NeMo Gym adapter calls it. The key is read from `api_key_var` by the process that
    runs the stack and never reaches NeMo Gym (a relay holds it). Each field declared here is
    also a `--judge.*` flag (`cli/arguments.py`)."""

    base_url: str = vf.JudgeConfig.model_fields["base_url"].default
    """The judge's OpenAI-compatible base URL (verifiers' judge default unless set)."""
    model: str = vf.JudgeConfig.model_fields["model"].default
    """The judge model's name, as the endpoint knows it."""
    api_key_var: str = vf.JudgeConfig.model_fields["api_key_var"].default
    """The environment variable holding the judge's key ("" for a judge without one)."""

    api: Literal["chat", "responses"] = "chat"
    """How the judge is called: `chat` (any Chat Completions endpoint; NeMo Gym's Responses
    judge calls are converted) or `responses` (an OpenAI Responses endpoint)."""
    enable_optional: bool = False
    """Also turn on the judges NeMo Gym ships switched off (math_with_judge, polymath)."""

    @model_validator(mode="after")
    def _what_nemo_gym_decides(self) -> Self:
        # NeMo Gym's environments bring their own judge prompts and sampling settings.
        if self.prompt is not None or self.sampling != type(self.sampling)():
            raise ValueError(
                "env.taskset.judge: prompt and sampling are set by each NeMo Gym environment's "
                "judge calls; leave them unset"
            )
        if self.headers_from_env:
            raise ValueError("env.taskset.judge.headers_from_env is not supported; use headers")
        return self

    def endpoint(self) -> Judge:
        """The judge as the stack runs it, with its key (`key()`: ConfigError if unset)."""
        read = self.timeout.read
        return Judge(
            base_url=self.base_url,
            model=self.model,
            api=self.api,
            key_var=self.api_key_var,
            headers=dict(self.headers),
            enable_optional=self.enable_optional,
            timeout=read if read is not None else Judge.timeout,
            key=self.key(),
        )

    def key(self) -> str | None:
        """The judge's key from `api_key_var` (None when no variable is named). ConfigError
        when the named variable is not set."""
        if not self.api_key_var:
            return None
        key = os.environ.get(self.api_key_var)
        if not key:
            raise ConfigError(
                f"the judge's key variable ${self.api_key_var} is not set "
                "(--env.taskset.judge.api-key-var names it; empty for a judge without a key)"
            )
        return key
