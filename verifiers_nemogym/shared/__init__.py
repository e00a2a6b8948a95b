"""The shared stack: one NeMo Gym stack per machine and config set, leased by every env process
that asks for it, here or on other hosts (docs/shared-stacks.md). NeMo Gym's own process tree,
which the host starts and stops, is `nemo/stack.py`'s; the front forwarder the stack calls as its
`policy_model` is wire (`bridge/front.py`).

- `protocol`: what a stack host and its clients both know: the stack folder's files, the host
  program's command line, `HostSpec`, the messages and the socket they travel on.
- `client`: the env-process side (stack key, lock, `Lease`, `attach_or_start`) and the
  `stack up/status/down` commands.
- `host`: the detached host program (`python -m verifiers_nemogym.shared.host`, `StackHost`):
  the stack, the front forwarder, the lease socket, the gate when asked.
- `gate`: the host's TLS listener for env processes on other hosts (`stack up --listen`).
- `link`: the env-process side of the gate (`describe_gate`, `GateTarget`, `GateLink`).
- `tls`: the gate's certificate and pin, access-token files, keepalive sockets.
"""
