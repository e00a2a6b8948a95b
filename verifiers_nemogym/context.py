"""RolloutContext: what `NeMoGymEnv.start()` hands to every rollout of its process (the model
proxy, where each agent's rollouts go, the HTTP client, the stack's judge and its death notice).

It rides on the shared task config, so it must survive the copies verifiers makes of task
objects: a deep copy returns the same handle (a running server cannot be copied). It also carries
the stack's death notice: once `fail()` is called, every rollout in flight or to come fails fast
with that message instead of waiting on a server that will never answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from verifiers_nemogym.bridge.proxy import NeMoGymModelProxy
from verifiers_nemogym.bridge.redact import NOTICE_LIMIT, cut
from verifiers_nemogym.judge.blame import JudgeStatus
from verifiers_nemogym.nemo.rewards import RewardRange
from verifiers_nemogym.util import Latch


@dataclass(eq=False)
class RolloutContext:
    """The model proxy, where each agent's rollouts go, and one HTTP client for `/run`."""

    proxy: NeMoGymModelProxy
    run_urls: dict[str, str]
    """Agent instance name -> base URL its rollouts' `POST /run` goes to (`catalog.run_targets`)."""
    http: aiohttp.ClientSession
    run_timeout: float
    """Seconds one `/run` may take (`--env.taskset.task.run-timeout`)."""
    runtime: dict[str, Any] = field(default_factory=dict)
    """`NeMoGymVenv.info` of the stack's runtime: release, Python, below-floor opt-in; each
    rollout copies it to `trace.info["nemo_gym_runtime"]`."""
    keep_ng_trajectory: bool = False
    """Keep NeMo Gym's trajectory records in traces (`--env.taskset.keep-ng-trajectory`)."""
    judge: JudgeStatus | None = None
    """The stack's judge (who it is, its recent failures), when it has one; each rollout copies
    who it is to `trace.info["nemo_gym_judge"]`, and is an error quoting a judge failure that
    is charged to it (`JudgeStatus.failure_for`)."""
    reward_range: RewardRange | None = None
    """The user's reward range (`--env.taskset.reward-range`), for every agent."""
    reward_ranges: dict[str, RewardRange] = field(default_factory=dict)
    """Agent instance -> the reward range NeMo Gym's manifests declare for it (used without
    `reward_range`). A reward outside its agent's range makes the rollout an error."""
    sandbox_health: Callable[[], Awaitable[str | None]] | None = None
    """Why the stack's remote sandbox provider cannot serve (one line naming it; None while it
    serves), when it has one (`containers.seam.sandbox_health`): asked once a rollout's `/run`
    fails, and put first in its error."""
    warned: set[str] = field(default_factory=set)
    """One-time warnings already logged in this process (e.g. row sampling fields)."""
    death: Latch = field(default_factory=Latch)
    """Set once the stack is unusable (a server died), with why."""

    @property
    def failure(self) -> str | None:
        """Why the stack is unusable, once it is."""
        return self.death.reason if self.death.is_set() else None

    def fail(self, reason: str) -> None:
        """Mark the stack dead: rollouts waiting on `/run` and all later ones fail with `reason`
        (the first one given)."""
        self.death.set(cut(reason, NOTICE_LIMIT))

    def __deepcopy__(self, memo: dict[int, Any]) -> RolloutContext:
        return self

    def __copy__(self) -> RolloutContext:
        return self
