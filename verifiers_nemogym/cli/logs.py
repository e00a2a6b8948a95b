"""Logging for `nemo-gym-env` commands (the library's policy is `verifiers_nemogym.logs`)."""

from __future__ import annotations

import logging


def configure_cli_logging(*, timestamps: bool = False) -> None:
    """Logging for `nemo-gym-env` commands: INFO and above to stderr (stdout carries results),
    with `HH:MM:SS` stamps if `timestamps`. Per-request access lines of httpx and aiohttp are
    kept at WARNING: one line per model call drowns the progress."""
    fmt = "%(asctime)s %(message)s" if timestamps else "%(message)s"
    logging.basicConfig(level=logging.INFO, format=fmt, datefmt="%H:%M:%S")
    for noisy in ("httpx", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
