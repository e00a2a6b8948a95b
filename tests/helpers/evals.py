"""Evaluations for the tests: vf-eval command lines and their traces, verifiers' model contexts
(eval and train), episodes run at once with their times, and what `nemo-gym-env list` printed.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.policies.scripted import ScriptedPolicy

if TYPE_CHECKING:
    import verifiers.v1 as vf

    from verifiers_nemogym.policies.replay import Recording
from helpers.processes import run_command, run_tag
from helpers.stacks import HeldStack


def script(name: str) -> str:
    """Path of a console script (`vf-eval`, `nemo-gym-env`) of the test interpreter's venv."""
    return str(Path(sys.executable).with_name(name))


def vf_eval_command(
    model: str, base_url: str, key_var: str | None, n: int, r: int, c: int, out: Path, *flags: str
) -> list[str]:
    """The `vf-eval nemo-gym-env` command line of the test venv: model `model` served at
    `base_url`, its key read from the variable `key_var` (None: no `--client.api-key-var`),
    `-n n -r r -c c`, nothing pushed, results under `out` (`read_episodes(out)`), then `flags`
    (`--env.*`, further `--client.*`) as given."""
    key = [] if key_var is None else ["--client.api-key-var", key_var]
    return [
        script("vf-eval"), "nemo-gym-env", "-m", model, "--client.base-url", base_url, *key,
        "-n", str(n), "-r", str(r), "-c", str(c), "--no-push", "-o", str(out), *flags,
    ]  # fmt: skip


async def eval_traces(
    cmd: list[str], out: Path, count: int, timeout: float = 900, **extra: str
) -> tuple[str, list[dict[str, Any]]]:
    """Run the vf-eval command line `cmd` (results under `out`) under a fresh `run_tag(**extra)`
    and check what it did: it exits 0 (else its log's tail), wrote `count` traces in all, and
    every episode is ok (else their errors). The tag, and the traces in file order."""
    tag, env = run_tag(**extra)
    code, log = await run_command(cmd, env, timeout)
    assert code == 0, log[-5000:]
    episodes = read_episodes(out)
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == count
    assert all(e["ok"] for e in episodes), [e["errors"] for e in episodes if not e["ok"]]
    return tag, traces


def read_episodes(outdir: Path) -> list[dict[str, Any]]:
    """The episodes of the one run `vf-eval -o outdir` wrote (`<run>/traces.jsonl`)."""
    (traces_file,) = outdir.glob("*/traces.jsonl")
    return [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]


def model_context(policy: ScriptedPolicy) -> vf.ModelContext:
    """The verifiers model context that sends a rollout's model calls to `policy`."""
    # Imported here: verifiers takes seconds to import, and the fast tier's inner sessions
    # (tests/test_tiers.py) load this module without needing it.
    import verifiers.v1 as vf
    from verifiers.v1.configs.client import EvalClientConfig

    client = EvalClientConfig(base_url=policy.base_url, api_key_var="SCRIPTED_KEY")
    return vf.ModelContext(model="scripted", client=client)


async def run_timed(
    env: Any, tasks: list[vf.Task], ctx: vf.ModelContext
) -> tuple[list[vf.Episode], dict[str, float]]:
    """Every task's episode at once, and each one's seconds by its prompt text."""
    durations: dict[str, float] = {}

    async def timed(task: vf.Task) -> vf.Episode:
        began = time.monotonic()
        try:
            return await env.run_episode(task, ctx)
        finally:
            durations[task.data.prompt_text] = time.monotonic() - began

    return list(await asyncio.gather(*(timed(t) for t in tasks))), durations


def recordings_of(catalog: Catalog, names: tuple[str, ...]) -> list[Recording]:
    """The recorded rollouts (`example_rollouts.jsonl`) of environments `names`, in order."""
    from verifiers_nemogym.policies.replay import load_recordings

    found: list[Recording] = []
    for name in names:
        found += load_recordings(catalog.env(name).example_rollouts, name)
    return found


def train_context(base_url: str) -> vf.ModelContext:
    """verifiers' real train client (token ids on every call) for a token server at `base_url`:
    Qwen2.5's tool-call format (Hermes) and `<think>` reasoning, parsed back by the renderer
    with the packaged GGUF's tokenizer."""
    import verifiers.v1 as vf
    from renderers.configs import DefaultRendererConfig
    from verifiers.v1.configs.client import TrainClientConfig

    from verifiers_nemogym.policies.gguf_tokenizer import tokenizer_dir
    from verifiers_nemogym.policies.local_model import packaged_model_path

    client = TrainClientConfig(
        base_url=base_url,
        api_key_var="VF_NEMOGYM_TEST_NO_KEY",
        renderer=DefaultRendererConfig(tool_parser="qwen3", reasoning_parser="think"),
        renderer_model_name=str(tokenizer_dir(packaged_model_path())),
    )
    return vf.ModelContext(model="token-server", client=client)


async def check_train_episodes(env: Any, held: HeldStack) -> None:
    """Run every task of `env` (not yet serving) once with verifiers' train client against the
    token server (the packaged tokenizer) and check: `env` attached to the held stack `held`
    and left it afterwards; every episode ok, with NeMo Gym's reward; every call of it with
    token ids, and logprobs for each token its mask keeps."""
    from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer

    async with TokenServer(packaged_tokenizer()) as tokens, env.serving():
        assert held.owns(env)
        ctx = train_context(tokens.base_url)
        episodes = await asyncio.gather(*(env.run_episode(t, ctx) for t in env.taskset))
    await held.released()
    for episode in episodes:
        check_trained(episode)


def check_trained(episode: vf.Episode) -> None:
    """A train-mode episode: ok, NeMo Gym's reward on each trace, and every model call of it
    with token ids, and logprobs for each token its mask keeps."""
    assert episode.ok, [t.errors for t in episode.traces]
    for trace in episode.traces:
        assert trace.calls and "nemo_gym" in trace.rewards
        for call in trace.calls:
            assert call.node is not None, call.error
            node = trace.nodes[call.node]
            assert len(node.token_ids) > 0 and len(node.logprobs) == sum(node.mask) > 0


def error_text(episode: vf.Episode) -> str:
    """Every error message of `episode` and its traces, joined."""
    messages = [e.message for e in episode.errors]
    messages += [e.message for t in episode.traces for e in t.errors]
    return " | ".join(messages)


SERVE_ENV_SCRIPT = (
    "import json, sys\n"
    "from verifiers.v1.serve.pool import serve_env\n"
    "serve_env(**json.loads(sys.argv[1]))\n"
)
"""`python -c SERVE_ENV_SCRIPT '<json kwargs>'`: verifiers' env-server worker pool in front of an
env, in a process of its own (what prime-rl's `env-server` runs)."""


PROVIDERS_HEADING = "\nsandbox providers NeMo Gym "
"""Where `nemo-gym-env list`'s sandbox providers' part begins, after the environments."""


@dataclass(frozen=True)
class ListSurvey:
    """What `nemo-gym-env list --resolve` printed: its count line and its table's rows (each
    split on " | ", the header dropped; column 2 is the agents, "-" when it does not resolve)."""

    resolvable: tuple[int, int]
    """Resolvable resources servers, resolvable `environments/` entries."""
    total: tuple[int, int]
    """All resources servers, all `environments/` entries."""
    rows: list[list[str]]

    @classmethod
    def read(cls, printed: str) -> ListSurvey:
        found = re.search(
            r"^resolvable: (\d+) of (\d+) resources_servers, (\d+) of (\d+) environments$",
            printed,
            re.MULTILINE,
        )
        assert found is not None, printed[:2000]
        rs, all_rs, env, all_env = map(int, found.groups())
        # The environments' table alone: `list` prints the sandbox providers' table after it.
        environments = printed[found.end() :].split(PROVIDERS_HEADING)[0]
        rows = [line.split(" | ") for line in environments.splitlines() if line.startswith("| ")]
        rows = rows[1:]
        survey = cls((rs, env), (all_rs, all_env), rows)
        assert len(rows) == sum(survey.total)
        assert len(survey.unresolved) == sum(survey.total) - sum(survey.resolvable)
        return survey

    @property
    def unresolved(self) -> list[list[str]]:
        return [row for row in self.rows if row[2] == "-"]
