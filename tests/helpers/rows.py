"""NeMo Gym rows for the tests: rows of the single-tool example environment with prompts of the
test's own.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from verifiers_nemogym.nemo.catalog import Catalog
from verifiers_nemogym.nemo.venv import ensure_venv

SINGLE_TOOL_ENV = "example_single_tool_call"


SINGLE_TOOL_AGENT = "example_single_tool_call_simple_agent"


@functools.cache
def example_tools() -> list[dict[str, Any]]:
    """The tool exactly as NeMo Gym's example rows of SINGLE_TOOL_ENV define it."""
    first = Catalog(ensure_venv()).env(SINGLE_TOOL_ENV).dataset().read_text().splitlines()[0]
    return json.loads(first)["responses_create_params"]["tools"]


def row(text: str) -> dict[str, Any]:
    params = {"input": [{"role": "user", "content": text}], "tools": example_tools()}
    return {
        "responses_create_params": params,
        "agent_ref": {"type": "responses_api_agents", "name": SINGLE_TOOL_AGENT},
    }


def write_rows(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps(row(t)) + "\n" for t in texts))
    return path
