"""NeMo Gym 0.7.0's config shapes for the sandbox tests: the docker provider config binding
`sandbox`, and servers naming it (two sandboxed benchmarks and their OpenCode agents) beside one
plain agent."""

from __future__ import annotations

from typing import Any

DOCKER: dict[str, Any] = {
    "sandbox": {
        "default_metadata": {"sandbox-api": "docker-cli"},
        "docker": {"create": {"use_init": True, "extra_run_args": ["--init"]}},
    }
}
SERVERS: dict[str, Any] = {
    "swepro": {"resources_servers": {"swebench_pro": {
        "entrypoint": "app.py", "image_repository": "local/swetask",
        "sandbox_provider": "sandbox",
        "sandbox_config": {"resources": {"cpu": 4, "memory_mib": 2048}}}}},
    "agent": {"responses_api_agents": {"opencode_sandboxed_agent": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox", "artifacts_dir": None,
        "resources_server": {"type": "resources_servers", "name": "swepro"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"}}}},
    "tb": {"resources_servers": {"terminal_bench_2_1": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox"}}},
    "tb_agent": {"responses_api_agents": {"opencode_sandboxed_agent": {
        "entrypoint": "app.py", "sandbox_provider": "sandbox",
        "resources_server": {"type": "resources_servers", "name": "tb"},
        "model_server": {"type": "responses_api_models", "name": "policy_model"}}}},
    "plain": {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}},
}  # fmt: skip
