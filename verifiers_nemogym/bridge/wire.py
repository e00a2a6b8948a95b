"""The model-call wire NeMo Gym's agents speak to `policy_model`, defined once.

Both servers that stand as `policy_model` use it: the per-process model proxy
(`bridge.proxy`) and the shared stack's front forwarder (`bridge.front`), which passes each call
on to the proxy owning it. A route NeMo Gym adds, a key or a limit changes here, for both.

Contract: a model call is either
- `POST /ng-rollout/<rollout id>/v1/<tail>` (NeMo Gym >= 0.7 with rollout correlation on, which
  is how its coding-agent CLIs call the policy): the rollout id is `rollout_id(route, secret)`,
  which routes and authenticates the call by its path alone, before the body is read; or
- `POST /v1/<tail>` whose JSON body's `metadata` carries `SECRET_KEY` and `ROUTE_KEY` (NeMo Gym
  forwards a row's metadata on every turn; agents cannot set headers), or the same as
  `Authorization: Bearer` and `ROUTE_HEADER` headers.
`<tail>` is `responses`, `chat/completions` or `messages` (Anthropic), streaming or not.
`GET /` answers NeMo Gym's readiness poll without credentials. Every refusal is a JSON error body
with a status NeMo Gym does not retry forever.
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import hmac
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

ROUTE_KEY = "vf_nemogym_route"
"""Metadata key (or `ROUTE_HEADER` header) carrying the per-rollout route id."""
SECRET_KEY = "vf_nemogym_secret"
"""Metadata key (or `Authorization: Bearer` header) carrying the proxy's secret."""
ROUTE_HEADER = "X-VF-NeMoGym-Route"
ROLLOUT_ID_KEY = "_ng_rollout_id"
"""Row key NeMo Gym (>= 0.7) reads as the rollout's id: with observability or token capture on,
its agents call the policy at `/ng-rollout/<id>/v1/...`. Tagged rows carry the route id there."""
ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""What NeMo Gym accepts as a rollout id (a path segment); every route id matches it."""
MAX_BODY_BYTES = 256 * 1024 * 1024
"""Largest model-call body accepted (long multi-turn prompts with tool outputs run to MBs)."""
FORWARDED_HEADERS = frozenset({"content-type", "authorization", ROUTE_HEADER.lower()})
"""Request headers the front passes on to the owning proxy (the rest are hop-by-hop)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def secret_digest(secret: str | bytes) -> bytes:
    """What a front keeps of a proxy's secret (never the secret itself); also the key of the
    proxy's rollout credentials (`rollout_id`), so a front can check them too."""
    return hashlib.sha256(secret.encode() if isinstance(secret, str) else secret).digest()


def rollout_id(route_id: str, proxy_secret: str) -> str:
    """NeMo Gym's rollout id for a route: `<route id>.<credential>`, the credential an HMAC of
    the route id under the proxy's secret digest. It rides in the path of every call NeMo Gym's
    agents (and the coding-agent CLIs they run) make for the rollout, which is all a CLI carries:
    the path alone routes and authenticates such a call, before its body is read."""
    return f"{route_id}.{_credential(route_id, secret_digest(proxy_secret))}"


def _credential(route_id: str, digest: bytes) -> str:
    return hmac.new(digest, route_id.encode(), hashlib.sha256).hexdigest()[:32]


def rollout_route(path_id: str, digest: bytes) -> str | None:
    """The route id of a path's rollout id if its credential is the one the proxy of `digest`
    gives (`rollout_id`), else None (compared in constant time)."""
    route_id, dot, credential = path_id.rpartition(".")
    if not dot or not route_id:
        return None
    return route_id if hmac.compare_digest(credential, _credential(route_id, digest)) else None


def route_metadata(route_id: str, proxy_secret: str) -> dict[str, str]:
    """The `metadata` entries that send a Responses body to one route of one proxy (also what
    a process other than the proxy's builds from the two values, e.g. the benchmarks)."""
    return {ROUTE_KEY: route_id, SECRET_KEY: proxy_secret}


def tag_row(row: dict[str, Any], route_id: str, proxy_secret: str) -> dict[str, Any]:
    """A copy of the NeMo Gym `row` whose model calls go to that route: the routing entries in
    `responses_create_params.metadata` (NeMo Gym forwards it on every model call), and the
    route's `rollout_id` as NeMo Gym's rollout id (its `/ng-rollout/<id>/v1/...` calls)."""
    params = row["responses_create_params"]
    metadata = {**(params.get("metadata") or {}), **route_metadata(route_id, proxy_secret)}
    tagged = {**row, "responses_create_params": {**params, "metadata": metadata}}
    tagged[ROLLOUT_ID_KEY] = rollout_id(route_id, proxy_secret)
    return tagged


def model_call_app(forward: Handler, *, max_body_bytes: int = MAX_BODY_BYTES) -> web.Application:
    """An aiohttp app answering NeMo Gym's readiness poll and sending every model-call route
    to `forward` (`request.match_info["tail"]`, and `["rollout_id"]` on the prefixed route)."""
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/", health)
    app.router.add_post("/v1/{tail:.*}", forward)
    app.router.add_post("/ng-rollout/{rollout_id}/v1/{tail:.*}", forward)
    return app


async def health(request: web.Request) -> web.Response:
    """NeMo Gym polls every server's `GET /` for readiness, without credentials."""
    return web.json_response({"status": "ok"})


_SECRET_IN_BODY = re.compile(rb'"' + SECRET_KEY.encode() + rb'"\s*:\s*"([A-Za-z0-9_-]{1,128})"')
_SECRETS_LOOKED_AT = 4
"""How many secret-shaped entries of one body are tried (a body may quote an earlier turn)."""


def claimed_secrets(request: web.Request, raw: bytes) -> list[bytes]:
    """The secrets a call claims, found WITHOUT parsing its body: the first few
    `"vf_nemogym_secret": "<token>"` entries of the raw bytes (the form NeMo Gym forwards the
    row's metadata in), then the bearer token if there is one (NeMo Gym's own clients may send
    a bearer of their own, so the body's entries come first). Secrets this package makes are
    URL-safe tokens, so nothing else (no escapes, no non-ASCII) is a secret. An unauthenticated
    caller therefore costs one bounded scan of bytes already read: no JSON parse, no objects
    per element, and no 500 for a malformed secret (it simply matches nothing)."""
    found = []
    for match in _SECRET_IN_BODY.finditer(raw):
        found.append(match.group(1))
        if len(found) == _SECRETS_LOOKED_AT:
            break
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        found.append(auth[7:].encode("utf-8", "surrogateescape"))
    return found


_ROUTE_IN_BODY = re.compile(rb'"' + ROUTE_KEY.encode() + rb'"\s*:\s*"([A-Za-z0-9._-]{1,128})"')


def claimed_route(request: web.Request, raw: bytes) -> str | None:
    """The route id a call names, found without parsing its body: the route header, the
    `/ng-rollout/<id>/` path segment, else the first `"vf_nemogym_route": "<id>"` entry."""
    if found := request.headers.get(ROUTE_HEADER) or request.match_info.get("rollout_id"):
        return found
    match = _ROUTE_IN_BODY.search(raw)
    return match.group(1).decode() if match else None


def is_secret(claimed: list[bytes], secret: bytes) -> bool:
    """Whether one of `claimed` is `secret` (compared in constant time)."""
    return any(hmac.compare_digest(c, secret) for c in claimed)


def json_error(status: int, message: str, kind: str) -> web.Response:
    """An OpenAI-style error body (`{"error": {"message", "type"}}`) with `status`."""
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def error_message(payload: Any) -> str:
    """The message of a parsed OpenAI-style error body (`{"error": {"message": ...}}`, or
    `{"error": "..."}`); "" if it has none."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        if error is not None:
            return str(error)
    return ""


def retry_after(headers: Any) -> float | None:
    """Seconds the answer asks to wait (`retry-after-ms`, or `Retry-After` in seconds or as an
    HTTP date), as the OpenAI SDK reads them; None if absent or unreadable."""
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(headers.get("retry-after-ms")) / 1000
        return seconds if math.isfinite(seconds) else None
    value = headers.get("retry-after")
    with contextlib.suppress(TypeError, ValueError):
        seconds = float(value)
        return seconds if math.isfinite(seconds) else None
    try:
        date = email.utils.parsedate_tz(value)
        return None if date is None else float(email.utils.mktime_tz(date) - time.time())
    except (TypeError, ValueError, OverflowError, OSError):
        return None
