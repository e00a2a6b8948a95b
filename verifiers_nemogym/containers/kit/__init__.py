"""The hand-made task kit: tasks for NeMo Gym 0.7.0's container environments, and their images.

Contract: `make_tasks(out_dir, envs=None, log=...)` builds each task's image
(`containers.images`, OpenCode baked in) and writes, under `out_dir` (for the environments
`envs`, default all of `ENVS`):
- `swebench_pro/rows.jsonl`: the `tinycalc` row (`kit.swebench_pro`), image
  `<SWEBENCH_PRO_REPOSITORY>:tinycalc-0001`;
- `terminal_bench_2_1/rows.jsonl` and the task folder `terminal_bench_2_1/tasks/wordstats/`
  (`kit.terminal_bench`), image `TERMINAL_BENCH_IMAGE`; the row's `task_folder` is absolute;
- `swe_next/rows.jsonl`: the `textkit` row (`kit.swe_next`), whose `image_ref` names its own
  image `SWE_NEXT_IMAGE` (built with Debian's pytest: its build needs the Debian mirror);
- for each environment `override.yaml` (the agent run: local images, resources cpu 1 / memory
  2048 MiB, `is_verifying_golden_patch: false`, OpenCode preinstalled, `opencode_version`,
  `opencode_max_context_window: 32768`) and `golden.yaml` (the same resources server verifying
  the rows' golden patch / solution, no agent; swe_next's golden client calls
  `swe_next_golden_patch_resources_server`, which its shipped config already sets to golden);
- `fixer_tasks.jsonl`: the `policies.fixer` table (`key`, `fix`, `wrong`, `name`) of every task.
It returns a `TaskKit` naming all of it, with the NeMo Gym config paths each environment composes
(relative to the nemo-gym install) before the override. It sets no `sandbox:` block: the docker
provider config and its network (the agent container must reach the model server) are the
caller's. Rebuilding reuses docker's cache; every file is rewritten.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from verifiers_nemogym.containers import images
from verifiers_nemogym.containers.kit import swe_next, swebench_pro, terminal_bench
from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.policies.fixer import FixTask

logger = logging.getLogger(__name__)

SWEBENCH_PRO_REPOSITORY = "vf-nemogym/swebench-pro"
TERMINAL_BENCH_IMAGE = "vf-nemogym/terminal-bench:wordstats"
SWE_NEXT_IMAGE = "vf-nemogym/swe-next:textkit-0001"
MAX_CONTEXT_WINDOW = 32768
RESOURCES = {"cpu": 1, "memory_mib": 2048, "disk_gib": 1}
"""What a 2-core machine grants (the shipped `cpu: 4` is refused by docker there)."""


@dataclass(frozen=True)
class KitTask:
    """One hand-made task as written by `make_tasks`."""

    env: str
    """NeMo Gym resources server (`resources_servers/<env>`)."""
    name: str
    agent: str
    """The agent instance NeMo Gym's pairing runs it with (`--env.taskset.agent`)."""
    image: str
    """The docker image its rows run in (built)."""
    rows: Path
    """JSONL rows."""
    config_paths: tuple[str, ...]
    """NeMo Gym's shipped configs for the OpenCode agent run (relative to the nemo-gym install),
    to be listed before `override`."""
    override: Path
    """The override YAML for the OpenCode agent run."""
    golden_config_paths: tuple[str, ...]
    """NeMo Gym's shipped configs for golden verification (no agent)."""
    golden: Path
    """The override YAML for golden verification (`is_verifying_golden_patch: true`)."""
    fix: FixTask
    golden_patch: str | None = None
    """The golden diff (swebench_pro); None where the golden fix is a script."""
    wrong_patch: str | None = None
    """A wrong diff for the same task (swebench_pro), graded 0.0."""


@dataclass(frozen=True)
class TaskKit:
    """What `make_tasks` built and wrote."""

    out_dir: Path
    tasks: tuple[KitTask, ...]
    fixer_tasks: Path
    """The fixer's task table (`policies.fixer.load_fix_tasks`)."""

    def task(self, env: str) -> KitTask:
        """The task of environment `env` (KeyError if none)."""
        for task in self.tasks:
            if task.env == env:
                return task
        raise KeyError(env)


def make_tasks(
    out_dir: Path,
    *,
    envs: Sequence[str] | None = None,
    opencode: str = images.DEFAULT_OPENCODE,
    log: logging.Logger = logger,
) -> TaskKit:
    """Build the images and write the files of the hand-made tasks (module contract) of
    environments `envs` (default: all of `ENVS`, in that order); ConfigError for an unknown one.
    `opencode`: the OpenCode version baked into the images and named in the overrides."""
    chosen = list(ENVS) if envs is None else list(dict.fromkeys(envs))
    unknown = [e for e in chosen if e not in ENVS]
    if unknown or not chosen:
        raise ConfigError(
            f"no hand-made task for {', '.join(unknown) or 'no environment'}; "
            f"choose from {', '.join(ENVS)}"
        )
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = tuple(ENVS[env](out_dir / env, opencode, log) for env in chosen)
    table = out_dir / "fixer_tasks.jsonl"
    _write_jsonl(table, [{"name": t.fix.name, "key": t.fix.key, "fix": t.fix.fix,
                          "wrong": t.fix.wrong} for t in tasks])  # fmt: skip
    log.info("wrote %d hand-made tasks under %s", len(tasks), out_dir)
    return TaskKit(out_dir, tasks, table)


def _swebench_pro(folder: Path, opencode: str, log: logging.Logger) -> KitTask:
    tag = swebench_pro.INSTANCE_ID
    image = images.task_image(
        f"{SWEBENCH_PRO_REPOSITORY}:{tag}", swebench_pro.REPO, opencode=opencode, log=log
    )
    return _kit_task(
        folder, "swebench_pro", image, swebench_pro.row(tag, images.image_base_commit(image)),
        FixTask(swebench_pro.PROBLEM, swebench_pro.FIX, swebench_pro.WRONG, swebench_pro.NAME),
        opencode=opencode,
        server={"image_repository": SWEBENCH_PRO_REPOSITORY, **_sandbox_resources()},
        override={"swebench_pro_opencode_resources_server": False},
        golden={"swebench_pro_resources_server": True},
        config_path="benchmarks/swebench/pro/opencode.yaml",
        golden_config_path="resources_servers/swebench_pro/configs/swebench_pro.yaml",
        golden_patch=swebench_pro.GOLDEN_PATCH, wrong_patch=swebench_pro.WRONG_PATCH,
    )  # fmt: skip


def _terminal_bench(folder: Path, opencode: str, log: logging.Logger) -> KitTask:
    image = images.task_image(TERMINAL_BENCH_IMAGE, terminal_bench.REPO, opencode=opencode, log=log)
    task_folder = folder / "tasks" / terminal_bench.NAME
    for name, text in terminal_bench.folder(image).items():
        path = task_folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if name.endswith(".sh") else 0o644)
    fix = FixTask(terminal_bench.INSTRUCTION, terminal_bench.FIX, terminal_bench.WRONG,
                  terminal_bench.NAME)  # fmt: skip
    return _kit_task(
        folder, "terminal_bench_2_1", image, terminal_bench.row(image, task_folder), fix,
        opencode=opencode,
        server=_sandbox_resources(),
        override={"terminal_bench_2_1_opencode_resources_server": False},
        golden={"terminal_bench_2_1_resources_server": True},
        config_path="benchmarks/terminal_bench_2_1/opencode.yaml",
        golden_config_path="resources_servers/terminal_bench_2_1/configs/terminal_bench_2_1.yaml",
    )  # fmt: skip


def _swe_next(folder: Path, opencode: str, log: logging.Logger) -> KitTask:
    image = images.task_image(
        SWE_NEXT_IMAGE, swe_next.REPO, opencode=opencode, workdir=swe_next.WORKDIR,
        setup=swe_next.SETUP, log=log,
    )  # fmt: skip
    # swe_next_opencode.yaml pairs the agent with swe_next_resources_server itself; it also
    # starts swe_next.yaml's golden-patch server, whose shipped `cpu: 4` a small host refuses.
    # swe_next.yaml defines both servers; its golden client calls the golden one.
    servers = ("swe_next_resources_server", "swe_next_golden_patch_resources_server")
    return _kit_task(
        folder, "swe_next", image, swe_next.row(image, images.image_base_commit(image)),
        FixTask(swe_next.PROBLEM, swe_next.FIX, swe_next.WRONG, swe_next.NAME),
        opencode=opencode,
        server=_sandbox_resources(),
        override={servers[0]: False, servers[1]: None},
        golden=dict.fromkeys(servers),
        config_path="resources_servers/swe_next/configs/swe_next_opencode.yaml",
        golden_config_path="resources_servers/swe_next/configs/swe_next.yaml",
        golden_patch=swe_next.GOLDEN_PATCH, wrong_patch=swe_next.WRONG_PATCH,
    )  # fmt: skip


def _kit_task(
    folder: Path, env: str, image: str, row: dict[str, Any], fix: FixTask, *, opencode: str,
    server: dict[str, Any], override: dict[str, bool | None], golden: dict[str, bool | None],
    config_path: str, golden_config_path: str,
    golden_patch: str | None = None, wrong_patch: str | None = None,
) -> KitTask:  # fmt: skip
    """Write environment `env`'s task files into `folder` (created) and name them: `rows.jsonl`
    (`row`, run in `image`); `override.yaml`, the OpenCode agent run (NeMo Gym config
    `config_path`): the resources servers `override` names, each `server`'s settings, then
    `<env>_opencode_sandboxed_agent` with OpenCode `opencode` preinstalled; `golden.yaml`, the
    golden verification (`golden_config_path`): the servers `golden` names, likewise. A server
    mapped to True or False gets `is_verifying_golden_patch` set so; to None, left as shipped.
    The task's name is `fix`'s."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = folder / "rows.jsonl"
    _write_jsonl(rows, [row])
    agent = f"{env}_opencode_sandboxed_agent"
    servers = {**_servers(env, server, override), agent: _agent(opencode)}
    return KitTask(
        env=env, agent=agent, name=fix.name, image=image, rows=rows,
        config_paths=(config_path,),
        override=_write_yaml(folder / "override.yaml", servers),
        golden_config_paths=(golden_config_path,),
        golden=_write_yaml(folder / "golden.yaml", _servers(env, server, golden)),
        fix=fix, golden_patch=golden_patch, wrong_patch=wrong_patch,
    )  # fmt: skip


def _servers(env: str, server: dict[str, Any], golden: dict[str, bool | None]) -> dict[str, Any]:
    """Config blocks setting `resources_servers.<env>` of each resources server `golden` names
    to a copy of `server`, with `is_verifying_golden_patch` its value where that is not None."""
    blocks = {}
    for name, verifying in golden.items():
        block = copy.deepcopy(server)
        if verifying is not None:
            block["is_verifying_golden_patch"] = verifying
        blocks[name] = {"resources_servers": {env: block}}
    return blocks


ENVS: dict[str, Callable[[Path, str, logging.Logger], KitTask]] = {
    "swebench_pro": _swebench_pro,
    "terminal_bench_2_1": _terminal_bench,
    "swe_next": _swe_next,
}
"""Environment -> the builder of its hand-made task (output folder, OpenCode version, log)."""


def _sandbox_resources() -> dict[str, Any]:
    return {
        "sandbox_config": {
            "ready_timeout_s": 300,
            "resources": dict(RESOURCES),
            "provider_options": {"resource_requests": dict(RESOURCES)},
        }
    }


def _agent(opencode: str) -> dict[str, Any]:
    return {
        "responses_api_agents": {
            "opencode_sandboxed_agent": {
                "preinstalled_opencode": True,
                "opencode_version": opencode,
                "opencode_max_context_window": MAX_CONTEXT_WINDOW,
            }
        }
    }


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _write_yaml(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
