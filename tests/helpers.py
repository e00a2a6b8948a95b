"""Helpers shared by the tests (imported by conftest.py and by test modules as `helpers`).

Process checks read /proc through `verifiers_nemogym.nemo.supervisor` (`processes_with_env`, the
scan the stack itself uses): every process a stack or a local model server starts carries a
marker variable in its environment, and so does every descendant of a tagged process. Waits go
through `until` (async) and `wait_gone` (blocking), both the package's `util.poll_until`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.nemo.supervisor import MARKER_ENV_VAR as STACK_MARKER_VAR
from verifiers_nemogym.nemo.supervisor import alive, env_value, processes_with_env
from verifiers_nemogym.nemo.venv import ensure_venv
from verifiers_nemogym.policies.local_model import MARKER_ENV_VAR as MODEL_MARKER_VAR
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.shared import protocol
from verifiers_nemogym.util import poll_until, wait_until

if TYPE_CHECKING:
    import verifiers.v1 as vf

    from verifiers_nemogym.nemo.venv import NeMoGymVenv
    from verifiers_nemogym.policies.replay import Recording

REPO = Path(__file__).resolve().parent.parent
"""The repository root (wherever under tests/ the test that asks for it lives)."""
TEST_RUN_VAR = "VF_NEMOGYM_TEST_RUN"
"""Tag a test puts on a subprocess it starts; every descendant inherits it."""
SESSION_VAR = "VF_NEMOGYM_TEST_SESSION"
"""Tag of the whole pytest session, set in conftest: it finds what this session started among
the stacks other people run on the same machine."""


@dataclass
class Launches:
    """Markers of the stacks and model servers the current test started in this process
    (recorded by conftest's `launches` fixture)."""

    stacks: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


def run_tag(**extra: str) -> tuple[str, dict[str, str]]:
    """A fresh `VF_NEMOGYM_TEST_RUN=<hex>` entry, and this process's environment plus it (and
    plus `extra`, e.g. `SCRIPTED_KEY="unused"`)."""
    value = uuid.uuid4().hex
    return f"{TEST_RUN_VAR}={value}", {**os.environ, **extra, TEST_RUN_VAR: value}


async def run_command(
    cmd: list[str], env: dict[str, str], timeout: float = 900, *, stdout_only: bool = False
) -> tuple[int, str]:
    """Run `cmd` (a `vf-eval` or `nemo-gym-env` command line) with `env`; its exit code and
    output: stdout and stderr together, or with `stdout_only` stdout alone (results go to
    stdout, the CLI's logs to stderr). After `timeout` seconds it is killed (and reaped) and
    TimeoutError raised, so a hung command never outlives the test."""
    stderr = asyncio.subprocess.DEVNULL if stdout_only else asyncio.subprocess.STDOUT
    proc = await asyncio.create_subprocess_exec(
        *cmd, env=env, stdout=asyncio.subprocess.PIPE, stderr=stderr
    )
    try:
        output, _ = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


def launched_processes(entry: str) -> list[int]:
    """PIDs of live processes carrying `entry` that belong to a NeMo Gym stack or a local model
    server (their environment has the stack's or the model server's marker variable)."""
    return [
        pid
        for pid in processes_with_env(entry)
        if any(env_value(pid, name) is not None for name in (STACK_MARKER_VAR, MODEL_MARKER_VAR))
    ]


SHARED_STACK_GONE_S = 60.0
"""Bound on a shared stack's exit after its last user left: the idle grace (5 s by default)
plus the stack's teardown (NeMo Gym's own shutdown, then the supervisor's SIGTERM/SIGKILL)."""


async def until(probe: Callable[[], Any], seconds: float, what: str, every: float = 0.1) -> Any:
    """The tests' one poll: `probe` (a function or coroutine function) until it returns a
    truthy value, which is returned; an AssertionError naming `what` after `seconds`."""
    value = await poll_until(probe, time.monotonic() + seconds, every)
    assert value, f"not within {seconds:g} s: {what}"
    return value


async def gone(entry: str, seconds: float = SHARED_STACK_GONE_S) -> list[int]:
    """Wait (bounded) until no process carries `entry` (`NAME=value` in its environment);
    return the survivors."""
    await poll_until(lambda: not processes_with_env(entry), time.monotonic() + seconds, 0.5)
    return processes_with_env(entry)


@dataclass(frozen=True)
class HeldStack:
    """A shared stack held open by a lease of the test module's own (`hold_shared_stack`):
    its process `marker` and its `directory` (where the host's socket is)."""

    marker: str
    directory: Path

    def owns(self, env: Any) -> bool:
        """Whether `env` (inside `serving()`) attached to this stack."""
        return env.stack_marker == self.marker

    async def released(self) -> None:
        """Wait (bounded) until the holder's lease is the host's only one again: every env a
        test opened on the stack has left it, and the stack is still up."""

        async def alone() -> bool:
            return (await protocol.status(self.directory))["users"] == 1

        await until(alone, SHARED_STACK_GONE_S, "the test's envs to leave the held stack")


@contextlib.asynccontextmanager
async def hold_shared_stack(**options: Any) -> AsyncIterator[HeldStack]:
    """Start the shared stack `nemo_gym_env.load_environment(**options)` uses and hold it for
    the block, so several tests on the same config set attach to one stack instead of each
    starting its own (a stack start is the slow tier's main cost). The holder must start it
    (none may run before). Afterwards, the stack and every process of it is gone (bounded by
    `SHARED_STACK_GONE_S`): the no-orphan check of the tests that shared it."""
    import nemo_gym_env
    from verifiers_nemogym.stack_access import SharedStack

    env = nemo_gym_env.load_environment(**options)
    async with env.serving():
        stack = env.stack
        assert isinstance(stack, SharedStack), env.start_error
        assert stack.lease.started, "a shared stack for this config set already ran"
        held = HeldStack(stack.lease.marker, stack.lease.directory)
        yield held
    assert await gone(f"{STACK_MARKER_VAR}={held.marker}") == []


def wait_gone(pids: list[int] | int, seconds: float) -> bool:
    """Block (bounded) until every PID in `pids` has exited (zombies count as exited)."""
    pids = [pids] if isinstance(pids, int) else pids
    return wait_until(lambda: not any(map(alive, pids)), time.monotonic() + seconds, 0.2)


def server_pid(port: int) -> int:
    """PID of the process listening on 127.0.0.1:`port` (from /proc/net/tcp and fd links)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inode = fields[9]
    assert inode is not None, f"nothing listens on port {port}"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == f"socket:[{inode}]":
                    return int(proc.name)
        except OSError:
            continue
    raise AssertionError(f"no process owns the socket on port {port}")


def script(name: str) -> str:
    """Path of a console script (`vf-eval`, `nemo-gym-env`) of the test interpreter's venv."""
    return str(Path(sys.executable).with_name(name))


def runtime_flags(runtime: NeMoGymVenv) -> list[str]:
    """vf-eval flags choosing `runtime`'s NeMo Gym release and Python, with the opt-in to a
    Python below the release's floor where `runtime` is one."""
    flags = ["--env.taskset.nemo-gym-version", runtime.nemo_gym_version]
    flags += ["--env.taskset.python", str(runtime.python)]
    if runtime.below_floor:
        flags += ["--env.taskset.allow-python-below-floor", "true"]
    return flags


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


def stack_host_log(out: Path) -> str:
    """The text of the shared stack host's log named (`log: ...host.log`) in the eval log of
    the vf-eval run under `out`."""
    eval_log = next(out.glob("*/logs/latest/eval.log")).read_text()
    host_log = re.search(r"log: (\S+host\.log)", eval_log)
    assert host_log is not None, eval_log[-2000:]
    return Path(host_log.group(1)).read_text()


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
        assert episode.ok, [t.errors for t in episode.traces]
        for trace in episode.traces:
            assert trace.calls and "nemo_gym" in trace.rewards
            for call in trace.calls:
                assert call.node is not None, call.error
                node = trace.nodes[call.node]
                assert len(node.token_ids) > 0 and len(node.logprobs) == sum(node.mask) > 0


SINGLE_TOOL_ENV = "example_single_tool_call"
SINGLE_TOOL_AGENT = "example_single_tool_call_simple_agent"


@functools.cache
def example_tools() -> list[dict[str, Any]]:
    """The tool exactly as NeMo Gym's example rows of SINGLE_TOOL_ENV define it."""
    first = Catalog(ensure_venv()).env(SINGLE_TOOL_ENV).dataset().read_text().splitlines()[0]
    return json.loads(first)["responses_create_params"]["tools"]


def row(text: str) -> dict[str, Any]:
    params = {"input": [{"role": "user", "content": text}], "tools": example_tools()}
    return {
        "responses_create_params": params,
        "agent_ref": {"type": "responses_api_agents", "name": SINGLE_TOOL_AGENT},
    }


def write_rows(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps(row(t)) + "\n" for t in texts))
    return path


def error_text(episode: vf.Episode) -> str:
    """Every error message of `episode` and its traces, joined."""
    messages = [e.message for e in episode.errors]
    messages += [e.message for t in episode.traces for e in t.errors]
    return " | ".join(messages)


PLACEHOLDER_CONFIG = Path("/nonexistent/vf_external_model.yaml")
"""A policy placeholder config path for start commands that are built, never run."""


def unstarted_stack(venv: Any, configs: list[Path], timeout: float = 300) -> NeMoGymStack:
    """A `NeMoGymStack` for `configs` whose start command is read, never started."""
    return NeMoGymStack(
        venv, configs, policy_host="127.0.0.1", policy_port=9, start_timeout=timeout
    )


VERSIONS = ["0.4.0", "0.7.0-below-floor"]
"""Test ids of the NeMo Gym releases the end-to-end and conformance tests run on: 0.7.0 on a
Python below its declared floor (3.13.14; none here), with the package's explicit opt-in."""


SERVE_ENV_SCRIPT = (
    "import json, sys\n"
    "from verifiers.v1.serve.pool import serve_env\n"
    "serve_env(**json.loads(sys.argv[1]))\n"
)
"""`python -c SERVE_ENV_SCRIPT '<json kwargs>'`: verifiers' env-server worker pool in front of an
env, in a process of its own (what prime-rl's `env-server` runs)."""


_UNAUTHENTICATED_LOAD = r"""
import asyncio, json, sys
import aiohttp

mode, urls, callers, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
piece = b"x" * 65536

async def body():
    yield b'{"input": "'
    for _ in range(size // len(piece)):
        yield piece
    yield b'", "metadata": {"vf_nemogym_secret": "not-the-secret"}}'

async def call(http, url):
    try:
        async with http.post(url, data=body()) as r:
            await r.read()
            return r.status
    except aiohttp.ClientError as e:
        return repr(e)

async def head(url):
    # A request head of `size` bytes in 4 KB header lines, never finished: sent, then held
    # until the server hangs up (its answer, if any, is returned).
    host, port = url.split("/")[2].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = [f"X-Pad-{i}: {'y' * 4000}\r\n".encode() for i in range(size // 4016)]
    writer.write(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\n" + b"".join(lines))
    try:
        await writer.drain()
        answer = await reader.read(12)
        return answer.decode() or "closed"
    except ConnectionResetError:  # closed with bytes of ours unread: also a hang-up
        return "closed"
    except OSError as e:
        return repr(e)
    finally:
        writer.close()

async def main():
    if mode == "head":
        calls = [head(u) for u in urls for _ in range(callers)]
        print(json.dumps(await asyncio.gather(*calls)))
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        calls = [call(http, u) for u in urls for _ in range(callers)]
        print(json.dumps(await asyncio.gather(*calls)))

asyncio.run(main())
"""


async def unauthenticated_load(
    urls: list[str], callers: int, size: int, *, heads: bool = False, timeout: float = 900
) -> list[Any]:
    """From another process, `callers` concurrent callers without a credential to each of
    `urls` at once; each answer's status (or the client error's text), in `urls` order.

    Each caller streams a JSON body of about `size` bytes made as it is sent, with a wrong
    secret where NeMo Gym puts `metadata` (its end); `heads=True`: each sends a request head of
    about `size` bytes in 4 KB header lines and never finishes it, and reports the first bytes
    of the answer ("closed" when the server hangs up without one).
    """
    mode = "head" if heads else "body"
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _UNAUTHENTICATED_LOAD, mode, json.dumps(urls), str(callers),
        str(size), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(load.communicate(), timeout)
    finally:
        if load.returncode is None:
            load.kill()
            await load.wait()
    return list(json.loads(out))


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
        rows = [line.split(" | ") for line in printed.splitlines() if line.startswith("| ")][1:]
        survey = cls((rs, env), (all_rs, all_env), rows)
        assert len(rows) == sum(survey.total)
        assert len(survey.unresolved) == sum(survey.total) - sum(survey.resolvable)
        return survey

    @property
    def unresolved(self) -> list[list[str]]:
        return [row for row in self.rows if row[2] == "-"]
