"""Redaction's correctness on overlapping secrets, and the bound on what it is handed (L4)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from verifiers_nemogym.bridge import redact
from verifiers_nemogym.bridge.redact import NOTICE_LIMIT, REDACTED
from verifiers_nemogym.context import RolloutContext


@pytest.fixture
def protected() -> Iterator[list[str]]:
    """Secrets registered for the test (forgotten after it)."""
    registered: list[str] = []
    yield registered
    for secret in registered:
        redact.forget(secret)


def protect(registered: list[str], *values: str) -> None:
    for value in values:
        redact.protect(value)
        registered.append(value)


def test_overlapping_secrets_are_removed_whole(protected):
    # The end of one secret is the start of another, and a third lies inside their union:
    # replacing one at a time would leave the rest of whichever came second.
    protect(protected, "abcdefgh12", "gh12345678", "cdefgh1234")
    assert redact.redact("x abcdefgh12345678 y") == f"x {REDACTED} y"
    # A secret overlapping itself, and two occurrences side by side.
    protect(protected, "aaaaaaaa")
    assert redact.redact("-aaaaaaaaa-") == f"-{REDACTED}-"
    assert redact.redact("gh12345678gh12345678.") == f"{REDACTED}."


def test_the_set_of_secrets_follows_protect_and_forget(protected):
    secret = secrets.token_urlsafe(32)
    assert redact.redact(secret) == secret
    protect(protected, secret)
    protect(protected, secret)  # twice: needs two forgets
    assert redact.redact(f"<{secret}>") == f"<{REDACTED}>"
    redact.forget(secret)
    assert redact.redact(secret) == REDACTED
    redact.forget(secret)
    protected.clear()
    assert redact.redact(secret) == secret


def test_overlapping_secrets_straddling_a_cut_are_removed(protected):
    first, second = "S" * 4 + "0123456789abcdef", "0123456789abcdefTAIL9876"
    protect(protected, first, second)
    for offset in range(40):
        text = "x" * (100 - offset) + first + "TAIL9876" + "y" * 50
        kept = redact.cut(text, 100)
        assert len(kept) <= 100
        joined = first + "TAIL9876"
        assert not any(joined[i : i + 8] in kept for i in range(len(joined) - 7)), kept


def test_an_unbounded_death_notice_is_cut_before_it_is_kept(protected):
    """L4: a stack's death notice quoting a 10 MB log line, at 256 open routes, is redacted only
    as far as it is kept."""
    protect(protected, *(secrets.token_urlsafe(32) for _ in range(256)))
    live = RolloutContext(proxy=None, run_urls={}, http=None, run_timeout=1)  # type: ignore[arg-type]
    live.fail("server died; log tail:\n" + protected[7] + "x" * 10_000_000)
    assert live.failure is not None and len(live.failure) <= NOTICE_LIMIT
    assert live.failure.startswith(f"server died; log tail:\n{REDACTED}xxx")


def test_cut_keeps_no_part_of_a_live_secret_longer_than_the_default_margin() -> None:
    key = "sk-proj-" + "Q" * 180  # hosted providers' keys can be this long
    redact.protect(key)
    try:
        text = "x" * 90 + key + "y" * 1000
        assert "QQQQQQQQ" not in redact.cut(text, 100)
        assert "QQQQQQQQ" not in redact.cut("y" * 1000 + key + "x" * 90, 100, keep="tail")
    finally:
        redact.forget(key)
