"""Attaching by `stack_url` (nemo/attached.py) against a small real head server: an aiohttp app
serving a merged config the way NeMo Gym's head server does (`GET /global_config_dict_yaml`,
the YAML text as a JSON string). No NeMo Gym stack: the config is what is under test."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from aiohttp import web

from verifiers_nemogym.errors import ConfigError
from verifiers_nemogym.nemo.attached import describe_attached
from verifiers_nemogym.nemo.head import CONFIG_PATH
from verifiers_nemogym.net import serve_app

POLICY_PORT = 8500


def _config(agent_host: str = "127.0.0.1", policy_port: Any = POLICY_PORT) -> dict[str, Any]:
    return {
        "policy_model": {
            "responses_api_models": {
                "vf": {"entrypoint": "app.py", "host": "127.0.0.1", "port": policy_port}
            }
        },
        "a": {
            "responses_api_agents": {
                "simple_agent": {"entrypoint": "app.py", "host": agent_host, "port": 8123}
            }
        },
    }


@pytest.fixture
async def head() -> AsyncIterator[dict[str, Any]]:
    """A head server; set `state["config"]` to what it serves. `state["port"]` is its port."""
    state: dict[str, Any] = {"config": _config()}

    async def config(_request: web.Request) -> web.Response:
        return web.json_response(yaml.safe_dump(state["config"]))

    app = web.Application()
    app.router.add_get(CONFIG_PATH, config)
    runner, state["port"] = await serve_app(app)
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::"])
async def test_attached_wildcard_agent_host(head: dict[str, Any], wildcard: str) -> None:
    """A wildcard bind means "every address of the stack's machine": the agent is reached at
    the head server's host, never at the wildcard (which Linux sends to this machine)."""
    head["config"] = _config(agent_host=wildcard)
    attached = await describe_attached(f"http://localhost:{head['port']}", "127.0.0.1", 0)
    assert attached.agents == {"a": "http://localhost:8123"}
    assert attached.run_urls == {"a": "http://localhost:8123"}


@pytest.mark.parametrize("port", ["abc", 0, 70000, -1, True, 8.5, None])
async def test_attached_bad_policy_port_is_config_error(head: dict[str, Any], port: Any) -> None:
    head["config"] = _config(policy_port=port)
    with pytest.raises(ConfigError) as caught:
        await describe_attached(f"http://127.0.0.1:{head['port']}", "127.0.0.1", 0)
    assert "\n" not in str(caught.value)
    assert "policy_model" in str(caught.value)


async def test_attached_bad_agent_port_is_config_error(head: dict[str, Any]) -> None:
    head["config"] = _config()
    head["config"]["a"]["responses_api_agents"]["simple_agent"]["port"] = "http"
    with pytest.raises(ConfigError, match=r"agent 'a'.*no port"):
        await describe_attached(f"http://127.0.0.1:{head['port']}", "127.0.0.1", 0)


async def test_attached_string_port_still_accepted(head: dict[str, Any]) -> None:
    head["config"] = _config(policy_port=str(POLICY_PORT))
    attached = await describe_attached(f"http://127.0.0.1:{head['port']}", "127.0.0.1", 0)
    assert attached.policy_address == ("127.0.0.1", POLICY_PORT)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:hunter2hunter2@127.0.0.1:{port}",
        "http://hunter2hunter2@127.0.0.1:{port}",
        "hunter2hunter2@127.0.0.1:{port}",
    ],
)
async def test_stack_url_credentials_not_echoed(
    head: dict[str, Any], url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as caught:
        await describe_attached(url.format(port=head["port"]), "127.0.0.1", 0)
    assert "hunter2hunter2" not in str(caught.value)
    assert "hunter2hunter2" not in caplog.text
