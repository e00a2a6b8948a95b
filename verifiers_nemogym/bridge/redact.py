"""The one redaction of secrets in outside texts this package quotes.

Every text from outside that goes into an error, a trace or a log goes through `redact`: live
secrets registered by value (`protect`/`forget`, counted: two registrations need two `forget`s)
and, live or not, secrets in their wire form (the proxy-secret metadata entry, any `Bearer`
token). It costs one substring search per live secret, so a text of unbounded length goes through
`cut`, which redacts only what it keeps plus a margin (docs/reliability.md, "Secrets").
"""

from __future__ import annotations

import collections
import re
import threading

from verifiers_nemogym.bridge.wire import SECRET_KEY

REDACTED = "[redacted]"
"""What a secret is replaced with."""
NOTICE_LIMIT = 20_000
"""Characters of an outside notice (a stack's death notice, a start error with its log tails)
kept in errors and logs: enough for the log tails they quote, bounded for redaction's cost."""
MIN_SECRET_LENGTH = 8
"""Shorter values are not registered: replacing them would mangle ordinary text, and no secret
this package or verifiers makes is that short (they are 22 characters or more)."""

_live: collections.Counter[str] = collections.Counter()
_lock = threading.Lock()
_secrets: tuple[str, ...] = ()
"""The live secrets, rebuilt when their set changes: `redact` reads it without the lock (a log
record may be formatted in another thread while routes open and close)."""
_PATTERNS = (
    re.compile(rf'("{re.escape(SECRET_KEY)}"\s*:\s*")[^"]*(")'),
    re.compile(r"(Bearer\s+)[^\s\"',}]+()"),
)
_LONGEST_SECRET = 128
"""Longer than any secret this package or verifiers makes (43 characters); a longer live secret
(a judge's API key can be) widens `cut`'s margin to its length."""


def protect(secret: str) -> None:
    """Redact `secret` from every text `redact` sees until `forget(secret)`."""
    global _secrets
    if len(secret) >= MIN_SECRET_LENGTH:
        with _lock:
            _live[secret] += 1
            if _live[secret] == 1:
                _secrets = tuple(_live)


def forget(secret: str) -> None:
    """Undo one `protect(secret)`."""
    global _secrets
    with _lock:
        if _live[secret] <= 1:
            if _live.pop(secret, None) is not None:
                _secrets = tuple(_live)
        else:
            _live[secret] -= 1


def redact(text: str) -> str:
    """`text` with every live secret, and every secret in its wire form, replaced by
    `REDACTED`. Overlapping or adjacent occurrences of secrets become one `REDACTED`, so no
    part of any of them survives. Cost grows with len(text) x live secrets: quote an unbounded
    text through `cut`."""
    spans: list[tuple[int, int]] = []
    for secret in _secrets:
        start = text.find(secret)
        while start != -1:
            spans.append((start, start + len(secret)))
            # +1, not + len: an occurrence may overlap the previous one ("aaaa" in "aaaaa").
            start = text.find(secret, start + 1)
    if spans:
        text = _replace(text, spans)
    for pattern in _PATTERNS:
        text = pattern.sub(rf"\g<1>{REDACTED}\g<2>", text)
    return text


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each union of overlapping or touching `spans` replaced by `REDACTED`
    (replacing secret by secret would leave the rest of one that overlaps another)."""
    spans.sort()
    pieces: list[str] = []
    kept = 0  # end of the text already handled
    start, end = spans[0]
    for next_start, next_end in spans[1:]:
        if next_start <= end:
            end = max(end, next_end)
            continue
        pieces += [text[kept:start], REDACTED]
        kept, start, end = end, next_start, next_end
    pieces += [text[kept:start], REDACTED, text[end:]]
    return "".join(pieces)


def cut(text: str, limit: int, *, keep: str = "head") -> str:
    """`redact(text)` shortened to `limit` characters (its head, or with `keep="tail"` its
    end). Cut with a margin first, then redacted, then cut: a secret the cut would split is
    still recognised whole, and the redaction never runs over an unbounded text."""
    margin = limit + max((_LONGEST_SECRET, *map(len, _secrets)))
    rough = text[:margin] if keep == "head" else text[-margin:]
    clean = redact(rough)
    return clean[:limit] if keep == "head" else clean[-limit:]
