"""Model servers for tests and local use, the only test doubles the project allows
(docs/architecture.md, "Modules")."""

from typing import Any

from verifiers_nemogym.exports import exported, public

_EXPORTS = {
    "scripted": ("ScriptedPolicy",),
    "replay": ("ReplayPolicy",),
    "answer_key": ("AnswerKeyPolicy",),
    "fixer": ("FixerPolicy",),
    "judge": ("ScriptedJudge",),
    "replay_judge": ("ReplayJudge",),
    "local_model": ("LocalModelServer",),
    "token_server": ("TokenServer",),
    "server": ("ResponsesServer",),
}
"""Module -> the public names it defines, imported on first use (`exports`)."""
__all__ = public(_EXPORTS)


def __getattr__(name: str) -> Any:
    return exported(__name__, _EXPORTS, name)
