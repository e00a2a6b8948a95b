"""The one redaction of secrets in outside texts this package quotes.

NeMo Gym's agents echo request bodies in their error answers, and those bodies carry the model
proxy's secret (in the routing metadata); a provider or a server may quote anything it received.
Every text from outside that this package puts into an error, a trace or a log goes through
`redact` first. Secrets are registered by value while they are live: the proxy registers its own
secret from `start()` to `stop()`, and each route's bearer secret (verifiers' per-rollout secret)
while the route is open. Registering the same value twice needs two `forget` calls.
"""

from __future__ import annotations

import collections

REDACTED = "[redacted]"
"""What a secret is replaced with."""
MIN_SECRET_LENGTH = 8
"""Shorter values are not registered: replacing them would mangle ordinary text, and no secret
this package or verifiers makes is that short (they are 22 characters or more)."""

_live: collections.Counter[str] = collections.Counter()


def protect(secret: str) -> None:
    """Redact `secret` from every text `redact` sees until `forget(secret)`."""
    if len(secret) >= MIN_SECRET_LENGTH:
        _live[secret] += 1


def forget(secret: str) -> None:
    """Undo one `protect(secret)`."""
    if _live[secret] <= 1:
        _live.pop(secret, None)
    else:
        _live[secret] -= 1


def redact(text: str) -> str:
    """`text` with every live secret replaced by `REDACTED`."""
    # A snapshot: a log record may be formatted in another thread while routes open and close.
    for secret in tuple(_live):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
