"""Model servers for tests and local use: scripted (deterministic), replay (NeMo Gym's recorded
rollouts) and a local llama.cpp model. The only test doubles the project allows."""
