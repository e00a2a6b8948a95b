"""RetryPolicy: the one statement of how the package retries a call that failed transiently.

Contract: `RetryPolicy()` is the OpenAI SDK's curve, followed by the model proxy and the judge
relay: at most `retries + 1` tries; before retry n (0-based) `base * 2**n` s, capped at `cap`,
less up to 25 % at random, or the `Retry-After` the answer asked for. Where the judge relay
differs, `judge/relay.py`'s `JUDGE_RETRY` says so and why.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """See the module contract."""

    retries: int = 2
    """Retries after the first attempt (the OpenAI SDK's default)."""
    base: float = 0.5
    """Seconds before the first retry; doubled for each later one."""
    cap: float = 8.0
    """Longest backoff between two attempts."""
    max_retry_after: float = 120.0
    """Longest `Retry-After` waited for as asked."""
    clamp_retry_after: bool = False
    """A longer `Retry-After`: False, the failure stands (no retry); True, wait
    `max_retry_after` and retry."""
    transient: frozenset[int] = frozenset({408, 429})
    """Statuses below 500 worth another attempt (every status >= 500 is)."""

    def is_transient(self, status: int) -> bool:
        return status in self.transient or status >= 500

    def backoff(self, retries_done: int) -> float:
        """Seconds before the next attempt when the answer asked for no particular wait."""
        delay = min(self.base * 2.0 ** min(retries_done, 60), self.cap)
        return delay * (1 - 0.25 * random.random())

    def delay(self, retries_done: int, retry_after: float | None = None) -> float | None:
        """Seconds before the next attempt after `retries_done` retries, honouring a positive
        `retry_after`; None when the policy does not retry (no retries left, or a `Retry-After`
        longer than `max_retry_after` that is not clamped)."""
        if retries_done >= self.retries:
            return None
        if retry_after is not None and retry_after > 0:
            if retry_after <= self.max_retry_after:
                return retry_after
            return self.max_retry_after if self.clamp_retry_after else None
        return self.backoff(retries_done)
