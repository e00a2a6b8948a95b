"""The NeMo Gym side: its releases and runtime (`release`, `venv`), its files (`catalog`, `judges`,
`harnesses`), its process tree (`stack`, `ng_log`, `supervisor`, `head`, `ray_cluster`,
`ray_probe`), its aggregate metrics without a stack (`aggregate_probe`) and a stack started
elsewhere, by URL (`remote`). The shared stack that leases one of these to many env processes is
`verifiers_nemogym.shared`.

Nothing here imports `nemo_gym`: NeMo Gym runs in its own venv and process tree.
"""
