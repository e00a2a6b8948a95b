"""A running NeMo Gym stack's head server: its merged config.

Contract: `await fetch_merged_config(head_url)` returns the merged config the head server at
`head_url` serves (`GET /global_config_dict_yaml`, the same for a stack started here and one
started elsewhere), parsed by nemo/catalog.py's `parse_config`. Every failure raises a one-line
StackError naming the head server: unreachable or too slow, a status other than 200, no config,
a config that is not YAML. The config holds secrets in clear text (API keys of other servers):
it is parsed, never logged, and errors never quote it.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from verifiers_nemogym.errors import ConfigError, StackError
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
            if response.status != 200:
                raise StackError(f"NeMo Gym head server {head_url} answered {response.status}")
            try:
                # NeMo Gym serves the YAML text as a JSON string.
                raw = await response.json(content_type=None)
            except ValueError:
                raw = None  # it answered, with something else: no config
    except (aiohttp.ClientError, TimeoutError) as e:
        raise StackError(
            f"NeMo Gym head server {head_url} is unreachable ({type(e).__name__}); "
            "is the stack running, and is its head server reachable from this machine?"
        ) from None
    if not isinstance(raw, str):
        raise StackError(f"NeMo Gym head server {head_url} returned no config")
    try:
        return parse_config(raw, where)
    except ConfigError as e:
        # The stack's own config is broken, not this env's: a stack failure. `parse_config`
        # names only the place and the YAML problem, never the text.
        raise StackError(f"NeMo Gym head server returned a malformed config: {e}") from None
