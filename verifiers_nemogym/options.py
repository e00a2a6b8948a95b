"""The `--env.taskset.*` option table, generated from the config classes' attribute docstrings.

`docs/options.md` is `options_markdown()` (`nemo-gym-env options --markdown > docs/options.md`;
`tests/test_docs.py` checks they agree). The docstrings are read from the classes' source with
`ast` (the configs do not set pydantic's `use_attribute_docstrings`), verifiers' own fields from
verifiers' source.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `declared` serves the CLI's parser without pydantic
    from pydantic import BaseModel

REGENERATE = "uv run nemo-gym-env options --markdown > docs/options.md"


@dataclass(frozen=True)
class Option:
    """One config field as a user sets it."""

    key: str
    """Its TOML key below `env.taskset`, e.g. `task.run_timeout`."""
    flag: str
    """Its command-line flag, e.g. `--env.taskset.task.run-timeout`."""
    type: str
    """Its annotation as written in the source."""
    default: str
    """`repr` of its default (a default factory is called)."""
    doc: str
    """Its attribute docstring on one line ("" if it has none)."""
    owner: str
    """The module of the class that declares it."""


def declared(source: str, name: str | None = None) -> dict[str, tuple[str, str]]:
    """Field name -> (annotation source, attribute docstring on one line, "" if none) as the
    class `name` (default: the first class) in Python `source` declares them. Reads source
    only, so a caller that must not import a config's module (the CLI's parser, which does not
    import verifiers) can read the config's file."""
    tree = ast.parse(textwrap.dedent(source))
    found_class = (n for n in tree.body if isinstance(n, ast.ClassDef) and name in (None, n.name))
    body = next(found_class).body
    found: dict[str, tuple[str, str]] = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        doc = ""
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            doc = " ".join(inspect.cleandoc(after.value.value).split())
        found[node.target.id] = (ast.unparse(node.annotation), doc)
    return found


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The config class a field holds, and whether it may also be None (an optional section,
    which keeps a row of its own: its default says it is off)."""
    from pydantic import BaseModel

    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return annotation, False
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and len(typing.get_args(annotation)) == 2:
        inner, _ = _nested(args[0])
        return inner, inner is not None
    return None, False


def options(config: type[BaseModel] | None = None, prefix: str = "") -> list[Option]:
    """Every field of `config` (default: `NeMoGymTasksetConfig`), nested configs expanded in
    place of their own row, in the order: this package's fields, then verifiers'."""
    from pydantic import BaseModel

    if config is None:
        from verifiers_nemogym.taskset import NeMoGymTasksetConfig

        config = NeMoGymTasksetConfig
    found: dict[str, tuple[type, str, str]] = {}
    for cls in reversed(config.__mro__):  # a subclass's declaration wins
        if cls is BaseModel or not (inspect.isclass(cls) and issubclass(cls, BaseModel)):
            continue
        if "__annotations__" not in vars(cls):
            continue
        for name, (annotation, doc) in declared(inspect.getsource(cls)).items():
            found[name] = (cls, annotation, doc)
    ours: list[Option] = []
    theirs: list[Option] = []
    for name, field in config.model_fields.items():
        cls, annotation, doc = found[name]
        key = f"{prefix}{name}"
        nested, optional = _nested(field.annotation)
        if nested is not None:
            rows = options(nested, f"{key}.")
            ours.extend(o for o in rows if o.owner.startswith("verifiers_nemogym"))
            theirs.extend(o for o in rows if not o.owner.startswith("verifiers_nemogym"))
            if not optional:
                continue
        option = Option(
            key=key,
            flag="--env.taskset." + key.replace("_", "-"),
            type=annotation,
            default=repr(field.get_default(call_default_factory=True)),
            doc=doc,
            owner=cls.__module__,
        )
        (ours if cls.__module__.startswith("verifiers_nemogym") else theirs).append(option)
    ours.sort(key=lambda o: o.key.count("."))  # top-level fields first, each in source order
    theirs.sort(key=lambda o: o.key.count("."))
    return [*ours, *theirs]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(rows: list[Option]) -> list[str]:
    lines = ["| field | flag | type | default | meaning |", "|---|---|---|---|---|"]
    for o in rows:
        lines.append(
            f"| `{o.key}` | `{o.flag}` | `{_cell(o.type)}` | `{_cell(o.default)}` "
            f"| {_cell(o.doc)} |"
        )
    return lines


def options_markdown() -> str:
    """docs/options.md."""
    rows = options()
    ours = [o for o in rows if o.owner.startswith("verifiers_nemogym")]
    theirs = [o for o in rows if not o.owner.startswith("verifiers_nemogym")]
    lines = [
        "# Options (`--env.taskset.*`)",
        "",
        "<!-- Generated from the attribute docstrings of NeMoGymTasksetConfig and",
        "NeMoGymTaskConfig (verifiers_nemogym/taskset.py) and their verifiers bases; do not edit.",
        f"Regenerate: {REGENERATE}",
        "tests/test_docs.py fails when this file and the config disagree. -->",
        "",
        "Each field is a command-line flag of `uv run eval`, `vf-eval` and",
        "`nemo-gym-env eval-local -- ...`, and a TOML key of a `[[source]]` (or",
        "`[[orchestrator.train.source]]`) block, e.g. `env.taskset.nemo_env = "
        '"example_single_tool_call"`.',
        "`nemo_env` also takes a comma-separated string (`--env.taskset.nemo-env a,b`).",
        "",
        "## nemo-gym-env's options",
        "",
        *_table(ours),
        "",
        "## Inherited from verifiers",
        "",
        *_table(theirs),
        "",
        "verifiers' other flags apply as usual: `--env.agent.max-turns`,",
        "`--env.agent.timeout.rollout`, `--sampling.*`, `-n`/`-r`/`-c`.",
        "",
    ]
    return "\n".join(lines)


def options_text() -> str:
    """The same options for a terminal: flag, type, default, then the meaning indented."""
    lines: list[str] = []
    for o in options():
        lines.append(f"{o.flag}  ({o.type}, default {o.default})")
        lines.extend(textwrap.wrap(o.doc, 96, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)
