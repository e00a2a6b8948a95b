"""Faults and load on a real NeMo Gym stack: nothing lost, nothing cross-routed, nothing left.

Each test counts every rollout (ok, or an error on its own trace), checks through the scripted
policy that no model call reached another rollout, and checks the process tree afterwards.
A provider's error answer (relayed by verifiers' interception with the provider's own status)
makes its rollout an error naming that status, never a reward. A 429, a 503 or a garbled answer
that clears up within the proxy's retries is a success with exactly the turns (and, in train
mode, the sampled tokens) of a rollout that saw no fault: the failed attempts left no node, only
their error records on `trace.calls`; one that does not clear up is the rollout's error after 3
attempts, counted where they arrive; a 400 after exactly one.
The models are the only doubles: `ScriptedPolicy` and the token server (train mode), with their
`[fault:MODE]` / `[fault:MODExN]` triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import verifiers.v1 as vf
from helpers.evals import error_text, model_context, run_timed, train_context, vf_eval_command
from helpers.processes import gone, run_command, run_tag, server_pid, until
from helpers.rows import write_rows
from helpers.stacks import HeldStack, hold_shared_stack
from verifiers.v1.types import content_text

import nemo_gym_env
from benchmarks.common import count_stack_programs
from verifiers_nemogym.env import NeMoGymEnv
from verifiers_nemogym.nemo import stack as stack_module
from verifiers_nemogym.nemo.supervisor import (
    MARKER_ENV_VAR,
    cwd_of,
    descendants,
    env_value,
    processes_with_env,
)
from verifiers_nemogym.net import free_port
from verifiers_nemogym.policies.scripted import ScriptedPolicy
from verifiers_nemogym.policies.token_server import TokenServer, packaged_tokenizer
from verifiers_nemogym.stack_access import PrivateStack

ENV = "example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"
STATUSES = [400, 401, 403, 404, 409, 422, 429, 500]
"""Provider error statuses, each answered every time by the scripted policy's `[fault:S]`."""
STATUS_RUN_TIMEOUT = 20
RETRY_RUN_TIMEOUT = 60
CLEAN = "weather in Rome?"
RECOVERS = {  # trigger -> failed attempts before the success
    "[fault:429x1]": 1,
    "[fault:503x2]": 2,
    "[fault:garbagex1]": 1,
}
FAILS = {"[fault:503]": (503, 3), "[fault:400]": (400, 1)}  # -> (status, attempts)


def first_user_text(prompt: Any) -> str:
    """The text of a task prompt's first user message (what `Call.prompt` reports)."""
    return next(content_text(m.content) for m in prompt if m.role == "user")


def no_cross_routing(policy: ScriptedPolicy, traces: list[vf.Trace]) -> None:
    """Every call the policy saw came from one rollout and carried that rollout's own task."""
    prompts: dict[str | None, set[str]] = defaultdict(set)
    for call in policy.calls:
        prompts[call.session_id].add(call.prompt)
    assert None not in prompts
    by_trace = {t.id: first_user_text(t.task.data.prompt) for t in traces}
    for session, seen in prompts.items():
        assert len(seen) == 1, f"session {session} saw calls of several tasks: {seen}"
        if session in by_trace:
            assert seen == {by_trace[session]}


async def run_all(
    env: NeMoGymEnv, ctx: vf.ModelContext, tasks: list[vf.Task], concurrency: int
) -> list[vf.Episode]:
    gate = asyncio.Semaphore(concurrency)

    async def one(task: vf.Task) -> vf.Episode:
        async with gate:
            return await env.run_episode(task, ctx)

    return list(await asyncio.gather(*(one(t) for t in tasks)))


def _committed(trace: vf.Trace) -> list[Any]:
    return [c for c in trace.calls if c.node is not None]


def check_retries(
    mode: str, by_text: dict[str, vf.Episode], durations: dict[str, float], sent: dict[str, int]
) -> None:
    """The retry outcomes of one mode's rollouts (RECOVERS, FAILS and CLEAN); `sent`: calls the
    model server saw per trigger."""
    clean = by_text[CLEAN].traces[0]
    assert by_text[CLEAN].ok and clean.reward == 1.0, error_text(by_text[CLEAN])
    turns = len(_committed(clean))
    assert turns == 2  # the tool call, then the answer
    for trigger, failed in RECOVERS.items():
        episode = by_text[f"{trigger} {CLEAN}"]
        trace = episode.traces[0]
        assert episode.ok and trace.reward == 1.0, (mode, trigger, error_text(episode))
        # Exactly the clean rollout's turns; each failed attempt left an error record, no node.
        assert len(_committed(trace)) == turns, (mode, trigger)
        assert len(trace.nodes) == len(clean.nodes), (mode, trigger)
        assert len([c for c in trace.calls if c.error is not None]) == failed, (mode, trigger)
        assert sent[trigger] == failed + (turns if mode == "eval" else 0), (mode, trigger, sent)
        if mode == "train":
            # One sample, with exactly the sampled tokens of the clean rollout: none twice.
            (branch,) = trace.branches
            (clean_branch,) = clean.branches
            assert sum(branch.sampled_mask) == sum(clean_branch.sampled_mask) > 0, trigger
    for trigger, (status, attempts) in FAILS.items():
        text = f"{trigger} {CLEAN}"
        episode = by_text[text]
        trace = episode.traces[0]
        assert not episode.ok and trace.rewards.get("nemo_gym") is None, (mode, trigger)
        assert [e.status_code for e in trace.errors] == [status], (mode, error_text(episode))
        assert sent[trigger] == attempts, (mode, trigger, sent)
        assert len(trace.calls) == attempts and not _committed(trace), (mode, trigger)
        # Ended by the retries running out (backoff at most 1.5 s), not by the deadline.
        assert durations[text] < RETRY_RUN_TIMEOUT / 3, (mode, trigger, durations[text])
        print(f"RETRIES {mode} {trigger}: {durations[text]:.1f} s: {error_text(episode)[:200]}")


@pytest.fixture(scope="class")
async def held() -> AsyncIterator[HeldStack]:
    """The shared stack for ENV, started once for the tests of a class (a lease held meanwhile);
    the stack and every process of it is gone after the last one (`hold_shared_stack`)."""
    async with hold_shared_stack(nemo_env=ENV) as held:
        yield held


class TestOnOneSharedStack:
    """Faults and load on one shared stack (`held`): each test's env attaches to it and leaves
    it."""

    async def test_model_faults_fail_only_their_own_rollouts(
        self,
        held: HeldStack,
        policy: ScriptedPolicy,
        tmp_path: Path,
        secret_watch: Any,
        caplog: pytest.LogCaptureFixture,
    ):
        caplog.set_level(logging.DEBUG)
        faults = ["[fault:500] a", "[fault:429] b", "[fault:garbage] c", "[fault:hang] d"]
        texts = [f"weather in city {i}?" for i in range(6)] + faults
        env = nemo_gym_env.load_environment(
            jsonl_path=str(write_rows(tmp_path / "rows.jsonl", texts)),
            task={"run_timeout": 20},
        )
        tasks = list(env.taskset)
        async with env.serving():
            assert held.owns(env)
            secret_watch.watch(env)
            eps = await run_all(env, model_context(policy), tasks, concurrency=16)
        assert len(eps) == len(texts)  # none lost
        by_text = {e.task.data.prompt_text: e for e in eps}
        for text in texts[:6]:
            assert by_text[text].ok and by_text[text].traces[0].reward == 1.0
        expected = {faults[0]: "500", faults[1]: "429", faults[2]: "malformed"}
        expected[faults[3]] = "did not return within 20 s"
        for text, reason in expected.items():
            episode = by_text[text]
            assert not episode.ok, f"{text} should be an error"
            assert episode.traces[0].rewards.get("nemo_gym") is None  # an error, not reward 0
            assert reason in error_text(episode), error_text(episode)
        no_cross_routing(policy, [t for e in eps for t in e.traces])
        # Neither the proxy's secret nor any rollout's reached a trace, an error or the log.
        seen = {f"trace {t.id}": json.dumps(t.to_record()) for e in eps for t in e.traces}
        seen |= {f"errors of {e.task.data.prompt_text}": error_text(e) for e in eps}
        secret_watch.assert_absent({**seen, "log": caplog.text})
        await held.released()

    async def test_rollout_deadline_cancels_run_and_late_calls_go_nowhere(
        self, held: HeldStack, policy: ScriptedPolicy, tmp_path: Path
    ):
        policy.hang_seconds = 6  # the upstream answers after the rollout's deadline has passed
        late_answer = asyncio.Event()
        scripted_reply = policy.reply

        def reply(body: dict[str, Any]) -> dict[str, Any]:  # the hung call is being answered
            if "[fault:hang]" in json.dumps(body.get("input")):
                late_answer.set()
            return scripted_reply(body)

        policy.reply = reply  # observe the model double, nothing more
        texts = ["[fault:hang] slow", "weather now?"]
        rows = str(write_rows(tmp_path / "r.jsonl", texts))
        config = {"taskset": {"id": "nemo-gym-env", "jsonl_path": rows}}
        env = vf.load_environment(
            vf.resolve_env_config({**config, "agent": {"timeout": {"rollout": 2}}})
        )
        slow, fast = list(env.taskset)
        async with env.serving():
            assert held.owns(env)
            live = env.taskset.config.task._live
            ctx = model_context(policy)
            timed_out = await env.run_episode(slow, ctx)
            assert live.proxy.open_routes == 0  # the route closed with the cancelled /run
            # The hung call's late answer is sent before the next rollout starts.
            await asyncio.wait_for(late_answer.wait(), timeout=policy.hang_seconds + 60)
            after = await env.run_episode(fast, ctx)
        trace = timed_out.traces[0]
        assert trace.stop_condition is not None or not timed_out.ok
        assert trace.rewards.get("nemo_gym") is None
        assert after.ok and after.traces[0].reward == 1.0
        no_cross_routing(policy, [trace, after.traces[0]])
        late = [c for c in policy.calls if c.session_id == trace.id]
        assert len(late) == 1  # the hung call only: nothing of it reached the endpoint afterwards
        await held.released()

    async def test_thousand_rollouts_256_in_flight(self, held: HeldStack, policy: ScriptedPolicy):
        env = nemo_gym_env.load_environment(nemo_env=ENV)
        tasks = list(env.taskset)
        async with env.serving():
            assert held.owns(env)
            eps = await run_all(env, model_context(policy), tasks * 200, concurrency=256)
            assert env.taskset.config.task._live.proxy.open_routes == 0
        assert len(eps) == 1000
        failed = [error_text(e) for e in eps if not e.ok]
        assert failed == [], failed[:3]
        traces = [t for e in eps for t in e.traces]
        assert len({t.id for t in traces}) == 1000
        assert all(t.reward == 1.0 for t in traces)
        sessions = {c.session_id for c in policy.calls}
        assert len(policy.calls) == 2000 and len(sessions) == 1000
        no_cross_routing(policy, traces)
        await held.released()

    async def test_fifty_megabyte_model_call_and_answer(
        self, held: HeldStack, policy: ScriptedPolicy, tmp_path: Path
    ):
        big = "weather? " + "x" * (50 * 1024 * 1024)
        texts = [big, "[fault:huge] tell me", "weather in paris?"]
        env = nemo_gym_env.load_environment(
            jsonl_path=str(write_rows(tmp_path / "big.jsonl", texts)), task={"run_timeout": 300}
        )
        async with env.serving():
            assert held.owns(env)
            eps = await run_all(env, model_context(policy), list(env.taskset), concurrency=3)
        assert len(eps) == 3
        # 50 MB each way through agent, proxy, interception and policy; every rollout ends ok with
        # NeMo Gym's reward (its verifier gives example_single_tool_call rollouts 1.0).
        for episode in eps:
            assert episode.ok, error_text(episode)
            assert episode.traces[0].reward == 1.0
            assert episode.traces[0].info["nemo_gym"]["reward"] == 1.0
        for episode in eps[:2]:  # the big prompt and the big answer are on the recorded trajectory
            assert len(episode.traces[0].model_dump_json()) > 50 * 1024 * 1024
        await held.released()

    async def test_every_provider_status_is_an_error_naming_it(
        self,
        held: HeldStack,
        policy: ScriptedPolicy,
        tmp_path: Path,
        secret_watch: Any,
        caplog: pytest.LogCaptureFixture,
    ):
        caplog.set_level(logging.DEBUG)
        faults = {status: f"[fault:{status}] weather {status}?" for status in STATUSES}
        texts = [*faults.values(), "[fault:hang] weather?", "weather in Rome?", "weather in Oslo?"]
        env = nemo_gym_env.load_environment(
            jsonl_path=str(write_rows(tmp_path / "rows.jsonl", texts)),
            task={"run_timeout": STATUS_RUN_TIMEOUT},
        )
        tasks = list(env.taskset)
        async with env.serving():
            assert held.owns(env)
            secret_watch.watch(env)
            live = env.taskset.config.task._live
            episodes, durations = await run_timed(env, tasks, model_context(policy))
            assert live.proxy.open_routes == 0
        assert len(episodes) == len(texts)  # none lost
        by_text = {e.task.data.prompt_text: e for e in episodes}
        for text in texts[-2:]:
            episode = by_text[text]
            assert episode.ok and episode.traces[0].reward == 1.0, error_text(episode)
        for status, text in faults.items():
            episode = by_text[text]
            trace = episode.traces[0]
            assert not episode.ok and not trace.ok, f"{status} must be an error"
            assert trace.rewards.get("nemo_gym") is None  # an error, not a reward
            # verifiers re-raises the provider's error it stashed for the call as the rollout's
            # real cause (our harness's AgentRunError, naming the same status, is its __cause__).
            assert [(e.type, e.status_code) for e in trace.errors] == [("ProviderError", status)]
            assert f"scripted fault {status}" in trace.errors[0].message, trace.errors[0].message
            print(f"PROVIDER-STATUS {status} ({durations[text]:.2f} s): {trace.errors[0].type}: ")
            print(f"    {trace.errors[0].message}")
            # Ended by the provider's answer, not by the rollout's deadline.
            assert durations[text] < STATUS_RUN_TIMEOUT / 2, durations[text]
            # The per-call record verifiers keeps on the trace agrees.
            assert any(c.error is not None and c.error.status_code == status for c in trace.calls)
        hung = by_text["[fault:hang] weather?"]
        assert not hung.ok and f"did not return within {STATUS_RUN_TIMEOUT} s" in error_text(hung)
        print(f"PROVIDER-STATUS hang: {hung.traces[0].errors[0].type}: {error_text(hung)}")
        seen = {f"trace {e.traces[0].id}": json.dumps(e.traces[0].to_record()) for e in episodes}
        seen |= {f"errors of {e.task.data.prompt_text}": error_text(e) for e in episodes}
        secret_watch.assert_absent({**seen, "log": caplog.text})
        assert len(secret_watch.secrets) == 1 + len(texts)  # the proxy's and one per rollout
        await held.released()

    async def test_transient_errors_are_retried_without_duplicating_turns_or_tokens(
        self, held: HeldStack, tmp_path: Path
    ):
        texts = [CLEAN, *(f"{t} {CLEAN}" for t in [*RECOVERS, *FAILS])]
        env = nemo_gym_env.load_environment(
            jsonl_path=str(write_rows(tmp_path / "rows.jsonl", texts)),
            task={"run_timeout": RETRY_RUN_TIMEOUT},
        )
        tasks = list(env.taskset)
        async with (
            ScriptedPolicy(retry_after="1") as policy,
            TokenServer(packaged_tokenizer()) as tokens,
            env.serving(),
        ):
            assert held.owns(env)
            live = env.taskset.config.task._live
            results: dict[str, tuple[dict[str, vf.Episode], dict[str, float]]] = {}
            contexts = (("eval", model_context(policy)), ("train", train_context(tokens.base_url)))
            for mode, ctx in contexts:
                episodes, durations = await run_timed(env, tasks, ctx)
                results[mode] = ({e.task.data.prompt_text: e for e in episodes}, durations)
            assert live.proxy.open_routes == 0
        triggers = [*RECOVERS, *FAILS]
        eval_sent = {t: sum(t in c.prompt for c in policy.calls) for t in triggers}
        # The token server records its fault answers by trigger (its successes are in `calls`).
        train_sent = {t: tokens.faults.count(t[len("[fault:") : -1]) for t in triggers}
        # Retries carry the SDK's marker, so verifiers would replay a turn it had committed.
        assert {c.retry_count for c in policy.calls} == {None, "1", "2"}
        check_retries("eval", *results["eval"], eval_sent)
        check_retries("train", *results["train"], train_sent)
        await held.released()


# CI kills the resources server; the agent is surveyed (the same report and failure path).
@pytest.mark.parametrize("victim", ["resources", pytest.param("agent", marks=pytest.mark.survey)])
async def test_killed_server_is_reported_and_fails_remaining_rollouts(
    policy: ScriptedPolicy, victim: str
):
    # A private stack: the test kills one of its servers (a shared one is covered in
    # test_shared_stack.py by the host's own death check).
    env = nemo_gym_env.load_environment(nemo_env=ENV, shared_stack=False)
    tasks = list(env.taskset)
    ctx = model_context(policy)
    async with env.serving():
        assert isinstance(env.stack, PrivateStack)
        stack = env.stack.process
        marker = f"{MARKER_ENV_VAR}={stack.marker}"
        first = await run_all(env, ctx, tasks, concurrency=5)
        assert all(e.ok for e in first)
        name = ENV if victim == "resources" else AGENT
        port = int(stack.servers[name].rsplit(":", 1)[1])
        os.kill(server_pid(port), signal.SIGKILL)
        live = env.taskset.config.task._live
        await until(lambda: live.failure is not None, 60, "the watchdog to notice")
        assert live.failure is not None and name in live.failure, live.failure
        later = await run_all(env, ctx, tasks, concurrency=5)
    assert len(later) == len(tasks) and not any(e.ok for e in later)
    assert all(live.failure in error_text(e) for e in later), [error_text(e) for e in later]
    assert await gone(marker) == []


_EVAL_OWNER = textwrap.dedent(
    """
    import asyncio, sys
    import nemo_gym_env

    async def main() -> None:
        env = nemo_gym_env.load_environment(nemo_env="example_single_tool_call", start_timeout=1)
        async with env.serving():
            # A failed start does not raise (it would kill an env-server worker): the env
            # keeps the reason and fails every rollout with it.
            if env.start_error is not None:
                print("ERROR", env.start_error, flush=True)
                sys.exit(3)

    asyncio.run(main())
    """
)


async def test_exception_inside_start_leaves_nothing():
    tag, env = run_tag()
    code, text = await run_command([sys.executable, "-c", _EVAL_OWNER], env, timeout=300)
    assert code == 3, text[-3000:]
    assert "ERROR the shared NeMo Gym stack host exited" in text, text[-3000:]
    assert "NeMo Gym stack not ready after 1 s" in text, text[-3000:]
    assert await gone(tag) == []


# CI sends Ctrl-C; SIGTERM (the same handler) is surveyed.
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.survey)]
)
async def test_signal_to_vf_eval_mid_run_leaves_nothing(
    policy: ScriptedPolicy, tmp_path: Path, sig: signal.Signals
):
    rows = write_rows(tmp_path / "rows.jsonl", [f"[fault:hang] {i}" for i in range(4)])
    tag, env = run_tag()
    cmd = vf_eval_command(
        "scripted", policy.base_url, None, 4, 2, 8, tmp_path / "out",
        "--env.taskset.jsonl-path", str(rows), "--env.taskset.stack-idle-grace", "0",
    )  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )

    def in_flight() -> bool:
        assert proc.returncode is None, "vf-eval exited before its rollouts started"
        return len(policy.calls) >= 8

    await until(in_flight, 300, "rollouts in flight", every=0.5)
    assert processes_with_env(tag)  # the stack is up under the eval
    proc.send_signal(sig)
    await asyncio.wait_for(proc.wait(), timeout=120)
    assert await gone(tag, seconds=60) == []


class RayletFreeze(threading.Thread):
    """Stops (SIGSTOP) the first raylet a stack of this process starts, so that Ray's node
    times out for real (Ray waits a fixed 30 s for the raylet to register with its GCS), and
    continues it once that start's ng_run has exited (its teardown then ends it). Records the
    frozen start's marker, Ray temp dir and workdir (the raylet's environment and cwd)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.done = threading.Event()
        self.frozen = threading.Event()
        self.marker = self.ray_tmpdir = self.workdir = ""

    def run(self) -> None:
        while not self.done.is_set():
            for pid in descendants(os.getpid()):
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                        self._freeze(pid)
                        return
            time.sleep(0.02)  # in a thread: the raylet must not register before it is stopped

    def _freeze(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        # Read once it has stopped: a SIGSTOP takes effect after its exec completes, and
        # /proc/<pid>/environ read while the exec is still under way is empty (a survey run's
        # frozen raylet once showed no marker).
        for _ in range(100):  # bounded: 2 s
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                    break
            time.sleep(0.02)
        self.marker = env_value(pid, MARKER_ENV_VAR) or ""
        self.ray_tmpdir = env_value(pid, "RAY_TMPDIR") or ""
        self.workdir = str(cwd_of(pid) or "")
        self.frozen.set()
        entry = f"{MARKER_ENV_VAR}={self.marker}"
        ends = time.monotonic() + 180
        while time.monotonic() < ends and not self.done.is_set():
            if count_stack_programs(entry)["ng_run"] == 0:
                break
            time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.mark.survey  # CI: a start failure tried again with a fresh stack (below)
async def test_ray_node_timeout_at_start_is_tried_again_with_a_fresh_stack(
    policy: ScriptedPolicy, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO)
    env = nemo_gym_env.load_environment(nemo_env=ENV, shared_stack=False)
    tasks = list(env.taskset)
    freeze = RayletFreeze()
    freeze.start()
    try:
        async with env.serving():
            assert env.start_error is None, env.start_error
            assert freeze.frozen.is_set(), "no raylet was seen to freeze"
            first = f"{MARKER_ENV_VAR}={freeze.marker}"
            assert freeze.marker and freeze.marker != env.stack_marker
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any("1/3 failed because Ray's node timed out" in w for w in warnings), warnings
            assert any("the machine's load" in w for w in warnings), warnings
            # Ray's timeout comes before NeMo Gym touches a server venv: a warm start stays warm.
            assert "warm start failed" not in caplog.text
            # Nothing of the frozen start is left: no process, no Ray temp dir, no workdir.
            assert processes_with_env(first) == []
            assert freeze.ray_tmpdir.startswith("/tmp/vfng-")
            assert not Path(freeze.ray_tmpdir).exists()
            assert Path(freeze.workdir).name.startswith("vf-nemogym-stack-")
            assert not Path(freeze.workdir).exists()
            eps = await run_all(env, model_context(policy), tasks, concurrency=5)
    finally:
        freeze.done.set()
        freeze.join(timeout=10)
    assert len(eps) == len(tasks) > 0
    assert all(e.ok and e.traces[0].reward == 1.0 for e in eps), [error_text(e) for e in eps]
    assert await gone(marker) == []


async def test_a_head_port_another_process_bound_first_is_tried_again_with_a_fresh_stack(
    policy: ScriptedPolicy, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
):
    """The race between choosing NeMo Gym's head port and ng_run binding it, forced: the port
    handed over the first time is one this test already listens on. NeMo Gym's head server then
    never listens and ng_run waits for it forever: the start must see that at once and try a
    fresh stack (before, it waited out its whole start timeout)."""
    caplog.set_level(logging.INFO)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    handed: list[int] = []

    def first_taken() -> int:
        handed.append(taken.getsockname()[1] if not handed else free_port())
        return handed[-1]

    monkeypatch.setattr(stack_module, "free_port", first_taken)
    env = nemo_gym_env.load_environment(nemo_env=ENV, shared_stack=False, start_timeout=240)
    tasks = list(env.taskset)[:2]
    try:
        async with env.serving():
            assert env.start_error is None, env.start_error
            warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(
                "1/3 failed because another process bound the head server's port" in w
                for w in warnings
            ), warnings
            assert len(handed) == 2 and handed[0] == taken.getsockname()[1] != handed[1]
            marker = f"{MARKER_ENV_VAR}={env.stack_marker}"
            eps = await run_all(env, model_context(policy), tasks, concurrency=2)
    finally:
        taken.close()
    assert len(eps) == len(tasks) == 2
    assert all(e.ok and e.traces[0].reward == 1.0 for e in eps), [error_text(e) for e in eps]
    assert await gone(marker) == []
