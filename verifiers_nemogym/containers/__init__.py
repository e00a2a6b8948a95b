"""NeMo Gym's container environments (SWE-bench-style and terminal tasks, agents inside the task's
container) on a stack this package starts.

Parts:
- `sandbox.py`: what merged NeMo Gym configs ask of sandboxes (providers, sandboxed servers,
  their resource requests, agents that call the model from a container, the images rows name)
  and the config a stack adds so that containers are labelled, isolated and routed;
- `docker.py`: the docker daemon as the `docker` provider uses it: checks before anything
  starts (daemon, CPUs and memory, images), the stack's internal network and its firewall, and
  the sweep of what a dead stack left;
- `door.py`: the one host service a container reaches, its rollout's model route;
- `images.py`, `tasks/`: task images built from Debian packages (no registry) and hand-made
  tasks.
"""
