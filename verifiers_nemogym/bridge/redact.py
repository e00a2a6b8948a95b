"""The one redaction of secrets in outside texts this package quotes.

NeMo Gym's agents echo request bodies in their error answers, and those bodies carry the model
proxy's secret (in the routing metadata); a provider or a server may quote anything it received.
Every text from outside that this package puts into an error, a trace or a log goes through
`redact` first. Secrets are registered by value while they are live: the proxy registers its own
secret from `start()` to `stop()`, and each route's bearer secret (verifiers' per-rollout secret)
while the route is open. Registering the same value twice needs two `forget` calls. Secrets in
their wire form are redacted by pattern too, live or not, ours or another process's (a shared
stack's death notice can quote any user's row): the proxy-secret metadata entry and any
`Bearer` token. `cut` shortens a text without ever keeping part of a secret it cut through.
"""

from __future__ import annotations

import collections
import re

from verifiers_nemogym.bridge.wire import SECRET_KEY

REDACTED = "[redacted]"
"""What a secret is replaced with."""
MIN_SECRET_LENGTH = 8
"""Shorter values are not registered: replacing them would mangle ordinary text, and no secret
this package or verifiers makes is that short (they are 22 characters or more)."""

_live: collections.Counter[str] = collections.Counter()
_PATTERNS = (
    re.compile(rf'("{re.escape(SECRET_KEY)}"\s*:\s*")[^"]*(")'),
    re.compile(r"(Bearer\s+)[^\s\"',}]+()"),
)
_LONGEST_SECRET = 128
"""Longer than any secret this package or verifiers makes (43 characters)."""


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
    """`text` with every live secret, and every secret in its wire form, replaced by
    `REDACTED`."""
    # A snapshot: a log record may be formatted in another thread while routes open and close.
    for secret in tuple(_live):
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(rf"\g<1>{REDACTED}\g<2>", text)
    return text


def cut(text: str, limit: int, *, keep: str = "head") -> str:
    """`redact(text)` shortened to `limit` characters (its head, or with `keep="tail"` its
    end). Cut with a margin first, then redacted, then cut: a secret the cut would split is
    still recognised whole, and the redaction never runs over an unbounded text."""
    margin = limit + _LONGEST_SECRET
    rough = text[:margin] if keep == "head" else text[-margin:]
    clean = redact(rough)
    return clean[:limit] if keep == "head" else clean[-limit:]
