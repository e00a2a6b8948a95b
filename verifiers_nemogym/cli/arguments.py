"""What more than one command takes: the `--judge.*` options (`stack up|down`, `metrics`), one
per field `NeMoGymJudgeConfig` declares itself, explained by its attribute docstring (so a field
added there is a flag here with no second copy), and `UsageError`, a command's complaint about
its arguments."""

from __future__ import annotations

import argparse
import ast
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.options import declared

if TYPE_CHECKING:
    from verifiers_nemogym.judge.endpoint import Judge


class UsageError(Exception):
    """Arguments argparse accepts but the command cannot run with: `main` reports it as
    argparse reports its own errors (usage, message, exit status 2)."""


@functools.cache
def _judge_fields() -> list[tuple[str, ast.expr, str]]:
    """(field, annotation, help text) of every field `NeMoGymJudgeConfig` declares itself, read
    from judge/config.py's source: importing it imports verifiers, which costs every command
    seconds (and `metrics` refuses a bad path before verifiers is imported)."""
    source = (Path(__file__).parents[1] / "judge" / "config.py").read_text(encoding="utf-8")
    return [
        (name, ast.parse(annotation, mode="eval").body, doc)
        for name, (annotation, doc) in declared(source, "NeMoGymJudgeConfig").items()
    ]


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    """`--judge.<field>` (dest `judge_<field>`) for each judge field: a `bool` field
    is a switch, a `Literal[...]` one takes its choices; unset, each is None (False for a
    switch)."""
    group = parser.add_argument_group(
        "judge", "the judge of a stack, named as vf-eval's --env.taskset.judge.* names it"
    )
    for name, annotation, doc in _judge_fields():
        flag, dest = "--judge." + name.replace("_", "-"), f"judge_{name}"
        text = doc.replace("%", "%%")  # argparse formats help with %
        if isinstance(annotation, ast.Name) and annotation.id == "bool":
            group.add_argument(flag, dest=dest, action="store_true", help=text)
        elif isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Literal":
            choices = ast.literal_eval(annotation.slice)
            group.add_argument(flag, dest=dest, choices=choices, help=text)
        else:
            group.add_argument(flag, dest=dest, default=None, help=text)


def judge_fields(args: argparse.Namespace) -> dict[str, Any] | None:
    """The `--judge.*` arguments given, as `--env.taskset.judge` fields (a switch only when on),
    or None when none was given."""
    given = {name: getattr(args, f"judge_{name}") for name, _, _ in _judge_fields()}
    chosen = {k: v for k, v in given.items() if v is not None and v is not False}
    return chosen or None


def judge_of(args: argparse.Namespace) -> Judge | None:
    """The judge the `--judge.*` arguments name, with its key (ConfigError when its key variable
    is not set), or None when none was given."""
    from verifiers_nemogym.judge.config import NeMoGymJudgeConfig

    fields = judge_fields(args)
    return None if fields is None else NeMoGymJudgeConfig(**fields).endpoint()
