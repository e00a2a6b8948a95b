"""The usage text of `nemo-gym-env` (its package docstring) names every command and sub-command
the parser has, and nothing else."""

from __future__ import annotations

import argparse
import re

import verifiers_nemogym.cli
from verifiers_nemogym.cli import _parser


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _commands(sub, f"{prefix}{name} ")
                found |= nested or {f"{prefix}{name}"}
    return found


def test_the_usage_docstring_lists_every_command() -> None:
    doc = verifiers_nemogym.cli.__doc__ or ""
    listed = set()
    for line in doc.splitlines():
        if match := re.match(r"nemo-gym-env ((?:[a-z][a-z-]* ?)+)", line):
            words = match.group(1).split()
            parser_commands = _commands(_parser())
            # The longest prefix of the line's words that is a command.
            for n in range(len(words), 0, -1):
                if " ".join(words[:n]) in parser_commands:
                    listed.add(" ".join(words[:n]))
                    break
            else:
                raise AssertionError(f"the usage names no command: {line}")
    assert listed == _commands(_parser())
