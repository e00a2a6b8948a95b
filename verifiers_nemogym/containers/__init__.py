"""Container environments of NeMo Gym (swebench_pro, terminal_bench_2_1, the SWE family):
images built without a registry, hand-made tasks, and what runs them."""
