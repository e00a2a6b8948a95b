"""The real OpenSandbox server for the tests: `benchmarks/opensandbox_server.py`, which the
container benchmark starts too (one copy of how it is installed, configured and stopped)."""

from __future__ import annotations

from benchmarks.opensandbox_server import SANDBOX_LABEL, SERVER, OpenSandboxServer, server_venv

__all__ = ["SANDBOX_LABEL", "SERVER", "OpenSandboxServer", "server_venv"]
