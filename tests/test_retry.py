"""`RetryPolicy`: the one retry curve (the OpenAI SDK's) and its `Retry-After` handling."""

from __future__ import annotations

import pytest

from verifiers_nemogym.retry import RetryPolicy


def test_the_backoff_doubles_from_base_up_to_the_cap_less_up_to_a_quarter() -> None:
    policy = RetryPolicy(retries=10)
    for n, full in enumerate([0.5, 1.0, 2.0, 4.0, 8.0, 8.0]):
        for _ in range(50):
            delay = policy.delay(n)
            assert delay is not None and 0.75 * full <= delay <= full


def test_no_delay_once_the_retries_are_spent() -> None:
    policy = RetryPolicy()
    assert policy.delay(1) is not None and policy.delay(2) is None


@pytest.mark.parametrize(
    ("clamp", "asked", "expected"),
    [(False, 3.0, 3.0), (False, 121.0, None), (True, 121.0, 120.0), (False, 0.0, "curve")],
)
def test_retry_after_is_waited_for_up_to_its_bound(
    clamp: bool, asked: float, expected: float | str | None
) -> None:
    delay = RetryPolicy(clamp_retry_after=clamp).delay(0, asked)
    if expected == "curve":
        assert delay is not None and 0.375 <= delay <= 0.5
    else:
        assert delay == expected


def test_transient_statuses() -> None:
    policy = RetryPolicy()
    assert [s for s in (400, 404, 408, 409, 429, 500, 503) if policy.is_transient(s)] == [
        408, 429, 500, 503,
    ]  # fmt: skip
