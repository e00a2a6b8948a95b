"""Model servers for tests and local use, the only test doubles the project allows: the Responses
server base (`server`), scripted (`scripted`, deterministic) and replay (`replay`, NeMo Gym's
recorded rollouts), the answer-key policy (`answer_key`, the harness environments' double), the
fixer (`fixer`, the container environments' double), the scripted and replay judges (`judge`,
`replay_judge`), train mode's model side (`token_server`, `llama_generate`, `gguf_tokenizer`) and
a local llama.cpp model (`local_model`)."""
