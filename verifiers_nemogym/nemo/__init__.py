"""The NeMo Gym side: its venv (`venv`), its files (`catalog`), its servers (`stack`, `supervisor`).

Nothing here imports `nemo_gym`: NeMo Gym runs in its own venv and process tree.
"""
