"""Benchmarks of verifiers-nemogym side by side with native NeMo Gym (`python -m benchmarks`).

Not tests: every figure is measured for us and for the native path in the same run, interleaved,
and reported as medians with their spread, because the machine is shared and noisy. See
`__main__.py` for the figures and `results/` for committed runs.
"""
