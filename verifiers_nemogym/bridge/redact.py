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

Cost (security review L4): one pass per live secret (CPython's substring search, about 1 ms per
MB each), so an unbounded text at many open routes is slow (0.2 s for 10 MB at 256 secrets;
`benchmarks/redaction.py`). Every caller quoting an outside text of unbounded length therefore
calls `cut`, which redacts only the part it keeps plus a margin. One regular expression of all
secrets, the obvious alternative, is 10 to 15 times slower in CPython's `re` (it has no
multi-string search), measured in the same benchmark.
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
