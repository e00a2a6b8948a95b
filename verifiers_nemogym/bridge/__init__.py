"""The bridge between NeMo Gym's agents and verifiers' rollout endpoints: the model proxy and
the wire objects it reads and writes. It knows neither side's internals, only their protocols."""
