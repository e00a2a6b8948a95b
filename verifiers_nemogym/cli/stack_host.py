"""The shared-stack host program: `python -m verifiers_nemogym.cli.stack_host --dir D --spec J`.

Started detached by `verifiers_nemogym.nemo.shared` (never by hand). It runs `StackHost` for the
stack folder D with the `HostSpec` J until the stack is idle past its timeout, told down, dead,
or the process gets SIGTERM/SIGINT; the stack is stopped in every case (and if this process is
SIGKILLed, the stack's supervisor tears it down). Logs go to stderr (the folder's host.log).
Exit status: 0 after a normal stop, 1 if the stack failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from verifiers_nemogym.errors import NeMoGymError
from verifiers_nemogym.nemo.shared import HostSpec, StackHost
from verifiers_nemogym.nemo.venv import ensure_venv


async def _run(directory: Path, spec: HostSpec) -> None:
    venv = await asyncio.to_thread(
        ensure_venv, spec.nemo_gym_version, spec.python, allow_below_floor=spec.below_floor
    )
    host = StackHost(venv, directory, spec)
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def on_signal() -> None:
        # Before the stack is up, cancel the start (NeMoGymStack.start cleans up on cancel);
        # afterwards, a normal stop.
        if host.stack is not None and host.stack.agents:
            host.request_stop("signal")
        else:
            task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal)
    await host.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        spec = HostSpec.from_json(args.spec)
    except (ValueError, TypeError) as e:
        print(f"stack_host: bad --spec: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run(args.dir, spec))
    except asyncio.CancelledError:
        return 1
    except NeMoGymError as e:
        print(f"stack_host: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
