"""The NeMo Gym side: its releases and runtime (`release`, `venv`), its files (`catalog`,
`judges`), its servers (`stack`, `ng_log`, `supervisor`, `head`, `remote`), and the shared stack
(`lease`, the protocol; `attach`, its client side; `host`, the host program).

Nothing here imports `nemo_gym`: NeMo Gym runs in its own venv and process tree.
"""
