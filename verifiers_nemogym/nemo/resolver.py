"""NeMo Gym's own config merge (`gym env resolve`), run in the runtime: `run_resolver` returns the
YAML text of one config file as NeMo Gym merges it (includes, inheritance), or raises ConfigError
with NeMo Gym's reason in one line (`resolver_error`). It caches nothing (the catalog does)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.venv import NeMoGymVenv

RESOLVE_TIMEOUT = 300.0
"""Seconds one `gym env resolve` may take (~10 s on a loaded 2-core machine)."""


def run_resolver(venv: NeMoGymVenv, config_path: Path, placeholder: Path, work: Path) -> str:
    """`gym env resolve` of `config_path` with the `placeholder` policy config, run in `work`."""
    try:
        out = subprocess.run(
            [str(venv.bin("gym")), "env", "resolve", "--config", str(config_path),
             "--config", str(placeholder)],
            cwd=work,
            # The placeholder is no model adapter a resources server's `allowed_model_types`
            # may name, and NeMo Gym's resolver refuses such pairings; merging is about the
            # config's structure. Whether a stack waives the check is the stack's decision
            # (NeMoGymStack, with a warning).
            env={**venv.env(), "NEMO_GYM_ALLOW_UNSUPPORTED_PAIRING": "1"},
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"NeMo Gym could not merge {config_path} within {RESOLVE_TIMEOUT:.0f} s "
            "(`gym env resolve`)"
        ) from None
    if out.returncode != 0:
        # NeMo Gym prints some errors on stdout; the merged config never reached it here.
        reason = resolver_error(f"{out.stderr}\n{out.stdout}", out.returncode)
        raise ConfigError(f"NeMo Gym cannot merge {config_path}: {reason}")
    return out.stdout


def resolver_error(text: str, status: int) -> str:
    """The one-line reason of a failed `gym env resolve` (`text`: its stderr, then its stdout):
    its `Error: ...` paragraph (NeMo Gym wraps it over lines, then adds advice or dumps the
    config), with the servers that failed validation and why ("almost-servers", which NeMo
    Gym describes in a framed block); else its last line with words in it."""
    lines = [line.strip() for line in text.splitlines()]
    almost = []
    for i, line in enumerate(lines):
        if found := re.match(r"Almost-Server Detected: '([^']+)'", line):
            # Its first validation finding: "- ..." up to the next blank line.
            first = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("- ")), None)
            if first is not None:
                end = next((j for j in range(first, len(lines)) if not lines[j]), len(lines))
                finding = " ".join(lines[first:end]).removeprefix("- ")
                almost.append(f"{found.group(1)}: {finding}")
    for start, line in enumerate(lines):
        if line.startswith("Error:"):
            end = start + 1
            while end < len(lines) and lines[end] and not lines[end].endswith(":"):
                end += 1  # to a blank line, or the heading of what NeMo Gym prints next
            reason = " ".join(lines[start:end]).removeprefix("Error:").strip()
            if almost:
                reason += f" ({'; '.join(almost)})"
            return reason[:300]
    worded = [line for line in lines if re.search(r"\w", line)]
    return (worded[-1] if worded else f"exit {status}")[:300]
