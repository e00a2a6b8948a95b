"""A running NeMo Gym stack's head server: its merged config.

`await fetch_merged_config(head_url)` returns the config `GET /global_config_dict_yaml` serves,
parsed by `catalog.parse_config`; every failure is a one-line StackError naming the head server.
The config holds other servers' secrets in clear: it is parsed, never logged or quoted.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from verifiers_nemogym.errors import ConfigError, StackError
from verifiers_nemogym.nemo.answers import read_json_answer
from verifiers_nemogym.nemo.catalog import parse_config

CONFIG_PATH = "/global_config_dict_yaml"


async def fetch_merged_config(head_url: str, timeout: float = 15.0) -> dict[str, Any]:
    """See the module contract. `head_url` has no trailing slash; `timeout` bounds the request
    (seconds)."""
    where = f"{head_url}{CONFIG_PATH}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http,
            http.get(where) as response,
        ):
            status, text = response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError) as e:
        raise StackError(
            f"NeMo Gym head server {head_url} is unreachable ({type(e).__name__}); "
            "is the stack running, and is its head server reachable from this machine?"
        ) from None
    raw = read_json_answer(f"NeMo Gym head server {where}", status, text, StackError)
    if not isinstance(raw, str):  # NeMo Gym serves the YAML text as a JSON string
        raise StackError(f"NeMo Gym head server {head_url} returned no config")
    try:
        return parse_config(raw, where)
    except ConfigError as e:
        # The stack's own config is broken, not this env's: a stack failure. `parse_config`
        # names only the place and the YAML problem, never the text.
        raise StackError(f"NeMo Gym head server returned a malformed config: {e}") from None
