"""`nemo-gym-env serve scripted|replay|tokens|answers|fixer`: one of the package's model
servers, until Ctrl-C.

Contract: `serve(policy)` starts `policy` (a `ScriptedPolicy`, `ReplayPolicy`, `AnswerKeyPolicy`,
`FixerPolicy` or `TokenServer`), writes one line naming its base URL to stdout, and serves until
SIGINT or SIGTERM; then it stops the server and returns. `replay_index(...)` loads the recordings
a replay server answers from; `answer_key_policy(...)` builds an answer-key server from rows;
`fixer_policy(...)` builds a fixer server from task tables.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.answer_key import AnswerKeyPolicy, AnswerRow, load_answer_key
from verifiers_nemogym.policies.fixer import FixerPolicy, FixTask, load_fix_tasks
from verifiers_nemogym.policies.replay import Recording, ReplayIndex, load_recordings
from verifiers_nemogym.policies.server import ResponsesServer
from verifiers_nemogym.policies.token_server import TokenServer


def replay_index(
    envs: list[str], files: list[Path], nemo_gym_version: str, python: str | None
) -> ReplayIndex:
    """The recorded rollouts of NeMo Gym environments `envs` (labelled by name) and of JSONL
    `files` (labelled by stem). Raises ConfigError for unknown environments or bad files."""
    recordings: list[Recording] = []
    if envs:
        catalog = Catalog(ensure_venv(nemo_gym_version, python))
        for name in envs:
            recordings += load_recordings(catalog.env(name).example_rollouts, name)
    for path in files:
        recordings += load_recordings(path)
    return ReplayIndex(recordings)


def answer_key_policy(
    envs: list[str],
    files: list[Path],
    wrong: str,
    port: int,
    nemo_gym_version: str | None,
    python: str | None,
) -> AnswerKeyPolicy:
    """An answer-key server (not started, no call log) on the example rows of NeMo Gym
    environments `envs`, then the rows of JSONL `files`, in that order; `wrong`: comma-separated
    0-based indices into those rows. Raises ConfigError for unknown environments, bad files or
    indices."""
    rows: list[AnswerRow] = []
    if envs:
        catalog = Catalog(ensure_venv(nemo_gym_version, python))
        for name in envs:
            rows += load_answer_key(catalog.env(name).dataset("example"))
    for path in files:
        rows += load_answer_key(path)
    try:
        chosen = frozenset(int(i) for i in wrong.split(",") if i.strip())
    except ValueError:
        raise ConfigError(f"--wrong {wrong!r}: give row indices, e.g. --wrong 1,3") from None
    return AnswerKeyPolicy(port=port, record=False, rows=rows, wrong=chosen)


def fixer_policy(files: list[Path], wrong: str, port: int) -> FixerPolicy:
    """A fixer server (not started, no call log) on the tasks of JSONL `files`, in order;
    `wrong`: comma-separated 0-based indices into those tasks. Raises ConfigError for bad files
    or indices."""
    tasks: list[FixTask] = []
    for path in files:
        tasks += load_fix_tasks(path)
    try:
        chosen = frozenset(int(i) for i in wrong.split(",") if i.strip())
    except ValueError:
        raise ConfigError(f"--wrong {wrong!r}: give task indices, e.g. --wrong 1,3") from None
    return FixerPolicy(port=port, record=False, tasks=tasks, wrong=chosen)


async def _serve(policy: ResponsesServer | TokenServer, what: str) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await policy.start()
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)  # aiohttp's strerror is long
        raise ConfigError(
            f"cannot listen on {policy.host}:{policy.port} ({reason}); "
            "choose another --port (0 picks a free one)"
        ) from None
    try:
        print(f"{what} on {policy.base_url}", flush=True)
        await stopped.wait()
    finally:
        await policy.stop()


def serve(policy: ResponsesServer | TokenServer, what: str) -> None:
    """Serve `policy` until SIGINT/SIGTERM; `what` names it in the line written to stdout.
    A port that cannot be bound raises ConfigError."""
    asyncio.run(_serve(policy, what))
