"""Local model figures for docs/local-model.md: `uv run python benchmarks/local_model.py [-n 5]`.

Measures, on this machine: the packaged model's assembly (only when the cache has none), the
llama.cpp server's start (process start to `/health` OK, `--starts` times), and a real
`vf-eval nemo-gym-env` run of example_single_tool_call through the local model with one rollout
at a time (`-c 1`), so per-rollout times are not inflated by queueing. The server's resident
memory (RSS) is sampled every 0.2 s during the run. Prints one JSON object; the load average is
included because the machine is shared and the figures move with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from verifiers_nemogym.cli.eval_local import LocalEvalOptions, vf_eval_command
from verifiers_nemogym.policies.local_model import LocalModelServer, packaged_model_path


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=5, help="rollouts (rows of the example dataset)")
    parser.add_argument("--starts", type=int, default=3, help="server starts to time")
    args = parser.parse_args()
    report: dict[str, object] = {"cpus": os.cpu_count(), "load_before": os.getloadavg()}

    started = time.monotonic()
    packaged_model_path()
    report["model_ready_s"] = round(time.monotonic() - started, 2)

    starts = []
    for _ in range(args.starts):
        server = LocalModelServer()
        began = time.monotonic()
        server.start()
        starts.append(time.monotonic() - began)
        report["rss_idle_mb"] = server.rss_bytes() // 2**20
        server.stop()
    report["server_start_s"] = {"median": _median(starts), "all": [round(s, 2) for s in starts]}

    peak = 0
    with LocalModelServer() as server, tempfile.TemporaryDirectory() as out:
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.wait(0.2):
                peak = max(peak, server.rss_bytes())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        options = LocalEvalOptions(num_tasks=args.n, concurrency=1, output_dir=Path(out))
        cmd = vf_eval_command(options, server.model_name, server.base_url)
        began = time.monotonic()
        subprocess.run(
            cmd,
            env={**os.environ, "VF_NEMOGYM_LOCAL_KEY": "local"},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        report["vf_eval_wall_s"] = round(time.monotonic() - began, 1)
        done.set()
        sampler.join()
        (traces_file,) = Path(out).glob("*/traces.jsonl")
        traces = [
            t for line in traces_file.read_text().splitlines() for t in json.loads(line)["traces"]
        ]
    rollouts = [t["timing"]["agent"]["end"] - t["timing"]["agent"]["start"] for t in traces]
    calls = [c["time"]["end"] - c["time"]["start"] for t in traces for c in t["calls"]]
    report["rollout_s"] = {"median": _median(rollouts), "all": [round(r, 1) for r in rollouts]}
    report["model_call_s"] = {"median": _median(calls), "count": len(calls)}
    report["rewards"] = [t["rewards"].get("nemo_gym", {}).get("score") for t in traces]
    report["rss_peak_mb"] = peak // 2**20
    report["load_after"] = os.getloadavg()
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
