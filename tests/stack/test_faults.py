"""Faults and load on a real NeMo Gym stack: nothing lost, nothing cross-routed, nothing left.

Each test counts every rollout (ok, or an error on its own trace), checks through the scripted
policy that no model call reached another rollout, and checks the process tree afterwards.
The model is the only double: `ScriptedPolicy` with its `[fault:MODE]` triggers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
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
from helpers import (
    HeldStack,
    error_text,
    gone,
    hold_shared_stack,
    model_context,
    run_command,
    run_tag,
    script,
    server_pid,
    until,
    write_rows,
)
from verifiers.v1.types import content_text

import nemo_gym_env
from verifiers_nemogym.backends import PrivateStack
from verifiers_nemogym.env import NeMoGymEnv
from verifiers_nemogym.nemo.supervisor import (
    MARKER_ENV_VAR,
    count_stack_programs,
    cwd_of,
    descendants,
    env_value,
    processes_with_env,
)
from verifiers_nemogym.policies.scripted import ScriptedPolicy

ENV = "example_single_tool_call"
AGENT = "example_single_tool_call_simple_agent"


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


@pytest.mark.parametrize("victim", ["resources", "agent"])
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


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_signal_to_vf_eval_mid_run_leaves_nothing(
    policy: ScriptedPolicy, tmp_path: Path, sig: signal.Signals
):
    rows = write_rows(tmp_path / "rows.jsonl", [f"[fault:hang] {i}" for i in range(4)])
    tag, env = run_tag()
    cmd = [
        script("vf-eval"), "nemo-gym-env", "-m", "scripted",
        "--client.base-url", policy.base_url, "-n", "4", "-r", "2", "-c", "8", "--no-push",
        "-o", str(tmp_path / "out"), "--env.taskset.jsonl-path", str(rows),
    ]  # fmt: skip
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
