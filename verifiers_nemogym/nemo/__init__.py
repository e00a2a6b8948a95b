"""The NeMo Gym side: its releases, runtime, files and process tree (docs/architecture.md,
"Modules"). Nothing here imports `nemo_gym`: NeMo Gym runs in its own venv and process tree.
"""
