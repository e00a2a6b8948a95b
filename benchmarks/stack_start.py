"""Figure 4: stack start, ours vs native `ng_run`, warm and cold, split into phases.

Each measurement runs in a fresh process (`python -m benchmarks.stack_start MODE [--cold]`,
printing one JSON line) so that no import or cache of an earlier one helps it. Warm: the runtime
and the per-server venvs exist. Cold: a temporary VF_NEMOGYM_CACHE, so the runtime venv and
the server venvs are created (uv's own download cache stays warm: no internet here).
Phases: `runtime` (ensure_venv), `cli` (ng_run imported), `ray` (ng_run's Ray connected or
started), `servers` (server venvs checked or built, servers imported and answering).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import ENV, bench_runtime, spawn_policy, start_child
from benchmarks.native import native_stack, timed_start
from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.stack import NeMoGymStack
from verifiers_nemogym.util import CACHE_ENV_VAR


async def measure(mode: str, cold: bool) -> dict[str, Any]:
    """Start and stop one stack in a fresh process; the phases in seconds."""
    cache = tempfile.mkdtemp(prefix="vfng-bench-cache-") if cold else None
    env = {**os.environ, **({CACHE_ENV_VAR: cache} if cache else {})}
    try:
        proc = await start_child(
            sys.executable, "-m", "benchmarks.stack_start", mode, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 1800)
        if proc.returncode != 0:
            raise RuntimeError(f"stack start ({mode}) failed:\n{err.decode()[-3000:]}")
        return json.loads(out.decode().strip().splitlines()[-1])
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)


async def _once(mode: str) -> dict[str, float]:
    began = time.monotonic()
    # Both sides on the release `common.VERSION_VAR` names (inherited from the parent).
    runtime = bench_runtime()
    phases = {"runtime": time.monotonic() - began}
    config_paths = Catalog(runtime).env(ENV).config_paths
    async with await spawn_policy() as policy:
        port = int(policy.info["port"])
        if mode == "native":
            stack = native_stack(runtime, config_paths, port)
        else:
            stack = NeMoGymStack(runtime, config_paths, policy_host="127.0.0.1", policy_port=port)
        try:
            phases.update(await timed_start(stack))
        finally:
            await stack.stop()
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description="one stack start, timed (see module doc)")
    parser.add_argument("mode", choices=["ours", "native"])
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_once(args.mode))), flush=True)


if __name__ == "__main__":
    main()
