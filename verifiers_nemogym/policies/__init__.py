"""Model servers for tests and local use: scripted (deterministic), replay (NeMo Gym's recorded
rollouts), the scripted and replay judges, the token server (train mode's model side) and a local
llama.cpp model. The only test doubles the project allows (model servers)."""
