"""The bridge between NeMo Gym's agents and verifiers' rollout endpoints: the model proxy, the
shared stack's front forwarder, and the wire objects they read and write (Responses, Chat
Completions, redaction). It knows neither side's internals, only their protocols."""
