"""A killed benchmark leaves none of its helper processes (fast tier: a scripted policy, no
stack): the shape of `benchmarks.soak`, a driver whose child (`start_child`, as the soak's
`--child` side) holds the scripted policy (`spawn_policy`, as every end-to-end benchmark does),
stopped by SIGTERM (whose default action runs no `finally`) or SIGKILL."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import pytest
from helpers.processes import REPO, gone, run_tag

from verifiers_nemogym.nemo.supervisor import alive, processes_with_env, signal_with_env

BENCHMARK = """
import asyncio, json, sys
from benchmarks.common import spawn_policy, start_child

async def driver():  # as soak's run_child: the side runs in a child of its own
    child = await start_child(sys.executable, "-c", sys.argv[1], sys.argv[1], "side",
                              stdout=asyncio.subprocess.PIPE)
    print((await child.stdout.readline()).decode().strip(), flush=True)
    await child.wait()

async def side():  # as soak's run_side: the policy first, then the work
    async with await spawn_policy() as policy:
        print(json.dumps({"side": __import__("os").getpid(), "policy": policy.pid}), flush=True)
        await asyncio.sleep(600)

asyncio.run(side() if sys.argv[2:] == ["side"] else driver())
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
async def test_a_killed_benchmark_leaves_no_helper(sig: signal.Signals) -> None:
    entry, env = run_tag()
    driver = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BENCHMARK, BENCHMARK, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert driver.stdout is not None
    try:
        started = json.loads(await asyncio.wait_for(driver.stdout.readline(), 60))
        assert alive(started["side"]) and alive(started["policy"])
        driver.send_signal(sig)
        assert await driver.wait() == -sig
        assert await gone(entry, 15) == [], f"outlived the benchmark killed by {sig.name}"
    finally:
        if driver.returncode is None:
            driver.kill()
            await driver.wait()
        signal_with_env(processes_with_env(entry), entry, signal.SIGKILL)
