"""Check a Ray cluster before a stack joins it; run by `ray_cluster.check_cluster` as
`<NeMo Gym runtime python> -I ray_probe.py HOST:PORT` with the environment NeMo Gym's processes
will have. Talks to the cluster's GCS only (no driver, no job, nothing registered), prints one
JSON line: {"ok": true, "node_ip": ...} or {"ok": false, "kind": "auth" | "no_node" | "error",
"detail": ..., "node_ip": ..., "nodes": [...]}. Imports nothing of verifiers_nemogym (it runs
in the runtime venv).
"""

from __future__ import annotations

import json
import sys


def probe(address: str) -> dict[str, object]:
    # Ray is in the runtime venv only (never this package's environment).
    from ray._private import services  # type: ignore[import-not-found]
    from ray._raylet import GcsClient  # type: ignore[import-not-found]
    from ray.core.generated.gcs_pb2 import GcsNodeInfo  # type: ignore[import-not-found]
    from ray.exceptions import AuthenticationError  # type: ignore[import-not-found]

    try:
        client = GcsClient(address=address)
        nodes = client.get_all_node_info(timeout=10)
    except AuthenticationError as e:
        return {"ok": False, "kind": "auth", "detail": str(e).splitlines()[0][:200]}
    except Exception as e:  # whatever Ray raises, the answer names it
        return {"ok": False, "kind": "error", "detail": f"{type(e).__name__}: {e}"[:200]}
    alive = sorted({n.node_manager_address for n in nodes.values() if n.state == GcsNodeInfo.ALIVE})
    # The address Ray's drivers here will take as theirs (their raylet must be at it).
    node_ip = services.get_node_ip_address(address)
    if node_ip not in alive:
        return {"ok": False, "kind": "no_node", "node_ip": node_ip, "nodes": alive}
    return {"ok": True, "node_ip": node_ip, "nodes": alive}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])), flush=True)
