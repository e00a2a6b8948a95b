"""Where this package's log records go when a command runs it: the one place that decides.

Two kinds of process run the package's code:
- verifiers' own CLIs (`vf-eval`, `vf-serve`...) and trainers that load the env module (prime-rl's
  env servers). verifiers' CLIs set up their handlers on the `verifiers.v1` logger
  (`verifiers.v1.utils.logging.setup_logging`: loguru to the console and to the run's
  `eval.log`) only AFTER they have imported the env module: `vf-eval` imports it while parsing
  its arguments (`narrow_config` -> `vf.env_config_type` -> `_import_plugin`) and calls
  `setup_logging` after that. A copy of verifiers' handlers taken at import time would therefore
  copy nothing. `follow_verifiers_logging()`, called by the env package when it is imported,
  makes `verifiers.v1` the parent logger of `verifiers_nemogym` instead, so every record of ours
  goes through whatever handlers and level `verifiers.v1` has when the record is logged.
- our own CLI (`nemo-gym-env ...`), which configures logging with
  `cli.logs.configure_cli_logging()`.

Library modules only create loggers (`logging.getLogger(__name__)`); nothing else in the
package touches handlers.
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
