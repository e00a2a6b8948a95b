"""Redaction's cost (security review L4): `uv run python -m benchmarks.redaction [--repeats N]`.

Not one of the side-by-side figures of `python -m benchmarks` (there is no native counterpart):
a stand-alone measurement of `bridge.redact` on a 10 MB text at 256 live secrets (one per open
route), printing the median of `--repeats` runs of each way:

- `redact`: the package's redaction of the whole text (one substring search per secret);
- `alternation`: one compiled regular expression of all secrets, searched once (the fix the
  review proposed, kept here because it loses: CPython's `re` has no multi-string search, so
  it tries every secret at every position);
- `cut`: `redact.cut(text, 2000)`, what every caller quoting an unbounded text uses.

Measured on the 2-core development machine (2026-11-24, CPython 3.11.7), medians of 3:
redact 0.24 s, alternation 2.7 s (prose) to 3.5 s (base64-like text), cut 0.1 ms.
"""

from __future__ import annotations

import argparse
import re
import secrets
import statistics
import time
from collections.abc import Callable

from verifiers_nemogym.bridge import redact

TEXT_BYTES = 10_000_000
SECRETS = 256


def _median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    live = [secrets.token_urlsafe(32) for _ in range(SECRETS)]
    texts = {
        "prose": ("lorem ipsum dolor sit amet, " * (TEXT_BYTES // 28 + 1))[:TEXT_BYTES],
        "base64": secrets.token_urlsafe(TEXT_BYTES)[:TEXT_BYTES],
    }
    alternation = re.compile("|".join(re.escape(s) for s in sorted(live, key=len, reverse=True)))
    for secret in live:
        redact.protect(secret)
    try:
        for name, text in texts.items():
            figures = {
                "redact": _median_seconds(lambda t=text: redact.redact(t), args.repeats),
                "alternation": _median_seconds(lambda t=text: alternation.search(t), args.repeats),
                "cut": _median_seconds(lambda t=text: redact.cut(t, 2000), args.repeats),
            }
            shown = ", ".join(f"{way} {seconds:.4f} s" for way, seconds in figures.items())
            print(f"{TEXT_BYTES // 1_000_000} MB {name}, {SECRETS} live secrets: {shown}")
    finally:
        for secret in live:
            redact.forget(secret)


if __name__ == "__main__":
    main()
