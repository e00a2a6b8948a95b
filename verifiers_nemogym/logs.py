"""Where this package's log records go when a command runs it: the one place that decides.

Under verifiers' CLIs and trainers that load the env module, `follow_verifiers_logging()` makes
`verifiers.v1` this package's parent logger (why, rather than copying verifiers' handlers:
docs/architecture.md, "Logging"); our own CLI calls `cli.logs.configure_cli_logging()`. Library
modules only create loggers; nothing else in the package touches handlers.
"""

from __future__ import annotations

import logging

PACKAGE_LOGGER = "verifiers_nemogym"
VERIFIERS_LOGGER = "verifiers.v1"


def follow_verifiers_logging() -> None:
    """Make `verifiers.v1` the parent of this package's logger (idempotent).

    Effect: our records reach `verifiers.v1`'s handlers and follow its level, as set at the time
    of logging. Under a verifiers CLI that is the console and the run's `eval.log` at the CLI's
    level (verifiers then stops propagation to the root logger, so nothing is printed twice).
    Without one, `verifiers.v1` has only its NullHandler and no level, so records propagate on
    to the root logger with the application's own settings, as they would without this call.
    """
    ours = logging.getLogger(PACKAGE_LOGGER)
    # `Logger.parent` is what both propagation and the effective level walk; the logging
    # manager only sets it when a logger is created, so ours keeps this parent from now on.
    ours.parent = logging.getLogger(VERIFIERS_LOGGER)
    ours.setLevel(ours.level)  # drops the effective levels cached along the old parent
